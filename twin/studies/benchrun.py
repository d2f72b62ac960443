"""Measured vLLM runs driven by ``vllm bench serve`` or AIPerf, read as a
:class:`~twin.studies.realrun.RealRun` (the spec that replays the run, its one load
stage, what was measured), so that ``twin validate run`` and ``twin calibrate --runs``
take them as they take inference-perf's runs.

The files (field names and units: :mod:`twin.workload.benchfiles`) name the model
(vLLM: ``model_id``; AIPerf: ``input_config.endpoint.model_names`` of
``profile_export_aiperf.json`` beside the records) but neither the GPU (``--gpu``,
as for an inference-perf folder) nor the server's arguments: a ``vllm bench serve
--metadata`` key ``tensor_parallel_size`` (or ``tp``), ``max_num_seqs``,
``max_num_batched_tokens``, ``gpu_memory_utilization``, ``max_model_len`` is read
when given; otherwise the twin's vLLM defaults apply and ``--set cluster.tp=N``
gives the TP. The model is a catalog name (Hugging Face ids resolve) or the
``config.json`` beside the file.

The requests and what the client saw are read by :mod:`twin.workload.measured`
(AIPerf's ``profile_export.jsonl``, or its artifact folder; ``vllm bench serve
--save-result --save-detailed`` JSON, whose ``start_times`` give the sends): the
successful requests are replayed at their send times (trace formats ``aiperf`` and
``vllm-bench``), and measured over them are the published metrics
(:mod:`twin.studies.runmetrics`, the code of the twin's side), each request's E2E its
TTFT + TPOT x (output - 1) (both tools define TPOT so). The run is one load stage at
its mean send rate. Past saturation by PROVENANCE.md's rule (more than 5% failed or
median TTFT over 10 s). The client's time-out: AIPerf's
``input_config.endpoint.timeout_seconds``, else its default, 600 s
(``EndpointDefaults.TIMEOUT``, aiperf @ db4f639, ``aiperf/common/config/
config_defaults.py``; the summary leaves out a key left at its default); vLLM's 6 h
(``aiohttp.ClientTimeout(total=6 * 60 * 60)``, vllm/benchmarks/serve.py @ def9ce8). A
vLLM run sent all at once (``request_rate: inf``) or under ``--max-concurrency`` (a
closed loop of clients) is refused: the replay is an open stream of sends.

NOTE: the failed requests of such a file carry no send time, so they are not
replayed; a run with many is past saturation and is not a calibration target.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twin._io import open_text, read_text
from twin.errors import TraceError, TwinError
from twin.studies.realrun import (
    GPUS,
    RealRun,
    _config_name,
    _model,
    is_overloaded,
    replay_spec,
)
from twin.studies.runmetrics import twin_metrics
from twin.workload.measured import read_measured

AIPERF_FILE = "profile_export.jsonl"
TRACE_FORMATS = {"aiperf": "aiperf", "vllm": "vllm-bench"}  # twin.workload.traces' names
AIPERF_SUMMARY = "profile_export_aiperf.json"
AIPERF_TIMEOUT_S = 600.0  # EndpointDefaults.TIMEOUT (aiperf @ db4f639)
VLLM_BENCH_TIMEOUT_S = 6 * 60 * 60.0  # aiohttp.ClientTimeout(total=6 * 60 * 60), serve.py
# vllm bench serve --metadata keys read as the server's arguments -> the spec's engine key
_ENGINE_KEYS = {
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_batched_tokens",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "max_model_len": "max_model_len",
}


def bench_file(path: Path) -> str | None:
    """``aiperf`` or ``vllm`` when ``path`` is such a run (AIPerf's records or their
    folder; a vLLM result JSON), else None."""
    if path.is_dir():
        return "aiperf" if (path / AIPERF_FILE).is_file() else None
    if path.name.endswith(AIPERF_FILE):
        return "aiperf"
    if path.suffix == ".json" and path.is_file():
        try:
            with open_text(path) as f:
                head = f.read(4096)
        except TwinError:
            return None
        if head.lstrip().startswith("{") and '"model_id"' in head:
            return "vllm"
    return None


def read_bench_run(path: Path, kind: str, gpu: str | None) -> RealRun:
    """The run at ``path`` (``kind`` from :func:`bench_file`; see the module)."""
    if gpu is None:
        raise TwinError(f"{path}: the run's files do not name its GPU; give one (--gpu NAME)")
    gpu = GPUS.get(gpu, gpu)
    records = path / AIPERF_FILE if path.is_dir() else path
    try:
        run = read_measured(records, kind)
    except TraceError as e:
        raise TwinError(str(e)) from None
    if kind == "aiperf":
        model, tp, engine, timeout = _aiperf_config(records)
    else:
        model, tp, engine, timeout = _vllm_config(records)
    reqs = run.requests
    span = reqs[-1].send_s
    stages = ((len(reqs) / span if span > 0 else 1.0, max(span, 1.0)),)
    rows = [
        {"status": "completed", "arrival_s": r.send_s, "ttft_s": r.ttft_s,
         "e2e_s": r.ttft_s + (r.tpot_s or 0.0) * (r.output_tokens - 1),
         "output_tokens": r.output_tokens}
        for r in reqs
    ]  # fmt: skip
    workload = {"trace": str(records.resolve()), "format": TRACE_FORMATS[kind],
                "timeout": f"{timeout:g} s"}  # fmt: skip
    key = records.parent.name if kind == "aiperf" else records.stem
    spec = replay_spec(key, model, gpu, tp, engine, None, workload)
    ttfts = sorted(r.ttft_s for r in reqs)
    n = len(reqs) + run.failed
    return RealRun(key, spec, stages, twin_metrics(rows, stages),
                   is_overloaded(run.failed, n, ttfts[len(ttfts) // 2]), len(reqs))  # fmt: skip


def _number(raw: Any, key: str, where: str, *, integer: bool) -> Any:
    """A ``--metadata`` value (a string, as vLLM saves it): a number > 0 (an integer)."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not value > 0 or (integer and value != int(value)):
        kind = "an integer > 0" if integer else "a number > 0"
        raise TwinError(f"{where}: {key}: {raw!r} is not {kind}")
    return int(value) if integer else value


def _engine(meta: Mapping[str, Any], where: str) -> tuple[int, dict[str, Any]]:
    """TP and engine arguments from ``--metadata`` keys (TP 1 when not given)."""
    key = "tensor_parallel_size" if "tensor_parallel_size" in meta else "tp"
    tp = _number(meta[key], key, where, integer=True) if meta.get(key) is not None else 1
    engine = {
        ours: _number(meta[theirs], theirs, where, integer=ours != "gpu_memory_utilization")
        for theirs, ours in _ENGINE_KEYS.items()
        if meta.get(theirs) is not None
    }
    return tp, engine


def _model_of(hf_id: str, path: Path, where: str) -> str | dict[str, Any]:
    return _model(hf_id, (path.parent / "config.json", path.parent / _config_name(hf_id)),
                  where, False)  # fmt: skip


def _aiperf_config(records: Path) -> tuple[str | dict[str, Any], int, dict[str, Any], float]:
    """Model, TP, engine arguments and client time-out of an AIPerf run (its summary)."""
    summary = records.parent / AIPERF_SUMMARY
    if not summary.is_file():
        raise TwinError(f"{records.parent}: no {AIPERF_SUMMARY} beside {records.name} "
                        "(it names the model)")  # fmt: skip
    try:
        doc = json.loads(read_text(summary, "AIPerf summary"))
    except json.JSONDecodeError as e:
        raise TwinError(f"{summary}: not JSON ({e.msg} at line {e.lineno})") from None
    config = doc.get("input_config") if isinstance(doc, Mapping) else None
    endpoint = config.get("endpoint") if isinstance(config, Mapping) else None
    if not isinstance(endpoint, Mapping):
        raise TwinError(f"{summary}: input_config.endpoint: missing; expected AIPerf's summary")
    names = endpoint.get("model_names")
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise TwinError(f"{summary}: input_config.endpoint.model_names: {names!r}; "
                        "expected a list of model names")  # fmt: skip
    timeout = endpoint.get("timeout_seconds", AIPERF_TIMEOUT_S)
    value = _number(timeout, "timeout_seconds", f"{summary}: input_config.endpoint",
                    integer=False)  # fmt: skip
    return _model_of(names[0], summary, str(summary)), 1, {}, value


def _vllm_config(path: Path) -> tuple[str | dict[str, Any], int, dict[str, Any], float]:
    """Model, TP, engine arguments (``--metadata``) of a vLLM result; refuses a run the
    twin's open arrivals cannot replay."""
    where = str(path)
    doc = json.loads(read_text(path, "vLLM benchmark result"))
    if doc.get("request_rate") in ("inf", None) or doc.get("max_concurrency") is not None:
        key = "max_concurrency" if doc.get("max_concurrency") is not None else "request_rate"
        raise TwinError(
            f"{where}: {key}: {doc.get(key)!r}; the twin replays requests at their send times "
            "as an open stream: a closed loop of clients (--max-concurrency) or a burst at "
            "once (--request-rate inf) would not wait on the server as they did"
        )
    model_id = doc.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise TwinError(f"{where}: model_id: {model_id!r}; expected the served model's name")
    tp, engine = _engine(doc, where)
    return _model_of(model_id, path, where), tp, engine, VLLM_BENCH_TIMEOUT_S
