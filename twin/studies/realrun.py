"""Measured vLLM runs driven by inference-perf, read as a spec and the numbers to meet.

:func:`twin.studies.runs.read_run` reads one run: an inference-perf run folder (its vLLM arguments
``exp-config.yaml``, its profile ``profile.yaml`` or the resolved ``config.yaml``, the
lifecycle reports ``summary_lifecycle_metrics.json`` and ``stage_<N>_lifecycle_metrics.json``
and, when present, ``per_request_lifecycle_metrics.json``; the reports may sit in a
``results/`` folder or be flattened to ``results__*``), or a run of the layout of
``shared/data/realruns`` (a ``manifest.csv`` row, ``runs/<run>/``, ``traces/<key>.csv.gz``,
``actuals.csv``, ``models/*.json``). It gives a :class:`RealRun`: the spec that replays
it (the run's model on one instance of its GPU at its TP, colocated, with vLLM V1's
engine: block size 16, chunked prefill and prefix caching on, its ``max_num_seqs``,
``max_num_batched_tokens``, ``gpu_memory_utilization``, ``max_model_len``, and CPU KV
offload when the run states one; the workload is the run's per-request trace when it
has one, else the profile's ``shared_prefix`` workload at its stages' Poisson rates),
its load stages, and what was measured.

The replay of a trace sends each request at its send time with its recorded prompt
length and the profile's ``output_len`` as output: the server made exactly that many
tokens (``ignore_eos``), while the recorded output counts re-tokenise the streamed text
and read low. Its prefix hashes are those of the profile's workload, request ``n``
taking the ``n``-th prompt of the load generator's cycle (the traces repeat their
prompts with the cycle's period).

The metrics (:func:`twin_metrics`, :func:`score`) are those of
:mod:`twin.studies.runmetrics`, the published definitions, re-exported here.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twin import yamlio
from twin._io import open_text, read_text
from twin.errors import TwinError, UnknownNameError
from twin.perf.hfconfig import shapes_from_config
from twin.perf.llm import get_model
from twin.perf.vllm import VLLM_CLIENT_LATENCY_S
from twin.studies.runmetrics import METRICS, WHOLE, Score, score, stage_of, twin_metrics
from twin.workload.shared_prefix import VLLM_BLOCK_TOKENS

__all__ = ["METRICS", "WHOLE", "RealRun", "Score", "score", "stage_of", "twin_metrics"]

# GPU names of the measured data (shared/data/realruns/PROVENANCE.md: H100 = H100-80GB
# SXM; the campaign's other GPUs are A100-80GB and L40S) -> the GPU catalog's.
GPUS = {"H100": "h100-sxm", "A100": "a100-80gb", "L40S": "l40s"}

# What inference-perf ran in this campaign, where the profile asked for other groups:
# the 9 runs with a resolved config (runs/*/results__config.yaml) all show
# num_groups 10, num_prompts_per_group 10 and no multi-turn key (the load generator
# predated profile.yaml's key names and used its defaults), and their traces repeat
# their prompt lengths with period 100. The aggregate-only runs come from the same
# campaign and harness, so they are read the same way.
CAMPAIGN_LOADGEN = {"groups": 10, "users": 10, "multi_turn": False}

# vLLM's default --gpu-memory-utilization (vLLM engine arguments: 0.9).
VLLM_GPU_MEMORY_UTILIZATION = 0.9

# inference-perf's client time-out (its config's ``load.request_timeout``) when the
# config leaves it null: the aiohttp session then keeps aiohttp's default
# ClientTimeout, total = 5 min (inference-perf @7de5ef2,
# inference_perf/client/modelserver/openai_client.py; aiohttp's client reference).
# The four overloaded runs of shared/data/realruns agree: their failed requests end
# 300.0 to 301.0 s after their sends (aiohttp rounds a deadline over 5 s up to the
# next whole second of its loop's clock).
AIOHTTP_TOTAL_TIMEOUT_S = 300.0

# A run past saturation (PROVENANCE.md): more than 5% of requests failed or median
# TTFT over 10 s.
OVERLOAD_FAILED_SHARE = 0.05
OVERLOAD_MEDIAN_TTFT_S = 10.0


@dataclass(frozen=True)
class RealRun:
    """One measured run: its spec, load stages ``(rate req/s, duration s)``, measured
    metrics per stage index (-1 whole run, 0, 1, ...; metric -> seconds) and whether
    the server was past saturation."""

    key: str
    spec: dict[str, Any]
    stages: tuple[tuple[float, float], ...]
    actual: dict[int, dict[str, float]]
    overloaded: bool
    completed: int | None = None  # requests that succeeded in the run (None: not recorded)

    def output_means(self) -> dict[int, float]:
        """Per stage, the mean output length the measured ``itl_mean`` divides by:
        ``(E2E mean - TTFT mean) / itl_mean + 1`` (re-tokenised counts, as measured)."""
        out = {}
        for s, m in self.actual.items():
            if all(k in m for k in ("e2e_mean", "ttft_mean", "itl_mean")) and m["itl_mean"] > 0:
                out[s] = (m["e2e_mean"] - m["ttft_mean"]) / m["itl_mean"] + 1
        return out


# --------------------------------------------------------------------------- reading


_MANIFEST_COLUMNS = ("key", "model", "gpu", "tp", "max_num_seqs", "max_num_batched_tokens",
                     "system_prompt_len", "question_len", "output_len", "stages")  # fmt: skip


def _manifest(data: Path) -> dict[str, dict[str, str]]:
    path = data / "manifest.csv"
    with open_text(path, "manifest") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in _MANIFEST_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise TwinError(
                f"{path}: line 1: missing column(s) {', '.join(missing)}; expected at least "
                f"{', '.join(_MANIFEST_COLUMNS)}"
            )
        return {r["key"]: r for r in reader}


def _number(row: Mapping[str, str], key: str, where: str) -> float | None:
    raw = (row.get(key) or "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise TwinError(f"{where}: {key}: {raw!r} is not a number") from None


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _manifest_run(data: Path, row: Mapping[str, str], gpu: str | None) -> RealRun:
    key = row["key"]
    where = f"{data / 'manifest.csv'}: {key}"
    try:
        raw_stages = json.loads(row["stages"])
    except json.JSONDecodeError:
        raise TwinError(
            f"{where}: stages: {row['stages']!r} is not JSON [[rate, duration], ...]"
        ) from None
    stages = _stages(raw_stages, where)
    folder = data / "runs" / row["training_run"] if row.get("training_run") else None
    resolved = _read_profile(folder) if folder is not None and folder.is_dir() else None
    sp = _shared_prefix(resolved, where) if resolved is not None else None
    timeout = _client_timeout(resolved, where) if resolved is not None else None
    if sp is None:
        sp = {
            "system_prompt_len": _int(_number(row, "system_prompt_len", where)),
            "question_len": _int(_number(row, "question_len", where)),
            "output_len": _int(_number(row, "output_len", where)),
            **CAMPAIGN_LOADGEN,
        }
    gpu_name = gpu or GPUS.get(row["gpu"])
    if gpu_name is None:
        raise TwinError(f"{where}: gpu: {row['gpu']!r} unknown; expected one of {', '.join(GPUS)}")
    fp8 = row.get("precision", "").upper() == "FP8"
    model = _model(row["model"], (data / "models" / _config_name(row["model"]),), where, fp8)
    engine = {
        "max_num_seqs": _int(_number(row, "max_num_seqs", where)),
        "max_batched_tokens": _int(_number(row, "max_num_batched_tokens", where)),
        "gpu_memory_utilization": _number(row, "gpu_mem_util", where)
        or VLLM_GPU_MEMORY_UTILIZATION,
        "max_model_len": _int(_number(row, "max_model_len", where)),
    }
    offload = None
    if (row.get("cpu_offload") or "").strip().lower() in ("true", "1", "yes"):
        blocks = _number(row, "cpu_kv_blocks", where)
        if blocks:
            offload = blocks * VLLM_BLOCK_TOKENS * get_model(model, where).kv_bytes_per_token()
    trace = data / row["trace"] if row.get("trace") else None
    spec = replay_spec(key, model, gpu_name, _int(_number(row, "tp", where)) or 1, engine,
                       offload, _workload(stages, sp, trace, timeout))  # fmt: skip
    sent, failed = _number(row, "n_requests", where), _number(row, "n_failed", where)
    completed = _int(sent - failed) if sent is not None and failed is not None else None
    return RealRun(key, spec, stages, _actuals(data, key), row.get("overloaded") == "True",
                   completed)  # fmt: skip


def _actuals(data: Path, key: str) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    path = data / "actuals.csv"
    if not path.is_file():
        return out
    with open_text(path, "actuals") as fh:
        for r in csv.DictReader(fh):
            if r["key"] == key and r["metric_name"] in METRICS:
                out.setdefault(int(r["stage_index"]), {})[r["metric_name"]] = (
                    float(r["actual"]) / 1e3
                )
    return out


def _config_name(hf_id: str) -> str:
    """``org/name`` -> ``org__name.json`` (the realruns layout's ``models/``)."""
    return hf_id.replace("/", "__") + ".json"


def _stages(raw: object, where: str) -> tuple[tuple[float, float], ...]:
    out = []
    if isinstance(raw, list):
        for s in raw:
            if isinstance(s, Mapping):
                s = (s.get("rate"), s.get("duration"))
            if (
                isinstance(s, list | tuple)
                and len(s) == 2
                and all(isinstance(x, int | float) and x > 0 for x in s)
            ):
                out.append((float(s[0]), float(s[1])))
                continue
            raise TwinError(f"{where}: stages: {s!r} is not a (rate, duration) pair of numbers > 0")
    if not out:
        raise TwinError(f"{where}: stages: {raw!r}; expected a list of (rate, duration)")
    return tuple(out)


def _model(hf_id: str, configs: tuple[Path, ...], where: str, fp8: bool) -> str | dict[str, Any]:
    """The catalog name of ``hf_id`` (as given: the catalog resolves Hugging Face ids),
    else the inline mapping of the first of ``configs`` (its ``config.json``) that
    exists. An FP8 checkpoint always takes the inline form (8-bit weights)."""
    if not fp8:
        try:
            get_model(hf_id)
            return hf_id
        except UnknownNameError:
            pass
    path = next((p for p in configs if p.is_file()), None)
    if path is None:
        raise TwinError(
            f"{where}: model {hf_id!r} is not in the catalog and none of "
            f"{', '.join(str(p) for p in configs)} exists (its config.json)"
        )
    return model_mapping(json.loads(read_text(path, "config.json")), hf_id, str(path), fp8)


def model_mapping(
    config: Mapping[str, Any], name: str, where: str, fp8: bool = False
) -> dict[str, Any]:
    """The inline ``model:`` mapping of a run's ``config.json`` (``where`` names it
    in errors); ``fp8``: a checkpoint whose weights are stored in 8 bits (its
    activations and KV stay 16-bit)."""
    out = shapes_from_config(config, where, name)
    if fp8:
        out["weight_dtype_bytes"] = 1
    return out


# --------------------------------------------------------------------------- run folders

_REPORT_DIRS = ("results", ".")
_PREFIXES = ("", "results__")


def _find(folder: Path, name: str) -> Path | None:
    for d in _REPORT_DIRS:
        for prefix in _PREFIXES:
            p = folder / d / (prefix + name)
            if p.is_file():
                return p
    return None


def _is_run_folder(d: Path) -> bool:
    return d.is_dir() and (
        _find(d, "summary_lifecycle_metrics.json") is not None or (d / "profile.yaml").is_file()
    )


def _read_profile(folder: Path) -> dict[str, Any] | None:
    """The resolved config (what the load generator ran), else ``profile.yaml``."""
    for p in (_find(folder, "config.yaml"), folder / "profile.yaml"):
        if p is not None and p.is_file():
            doc = yamlio.load_text(read_text(p, "profile"), str(p))
            if isinstance(doc, Mapping):
                return dict(doc)
    return None


_SP_ALIASES = {
    "groups": ("num_groups", "num_unique_system_prompts"),
    "users": ("num_prompts_per_group", "num_users_per_system_prompt"),
}


def _shared_prefix(profile: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    data = profile.get("data") or {}
    if not isinstance(data, Mapping) or data.get("type") != "shared_prefix":
        return None
    sp = data.get("shared_prefix") or {}
    if not isinstance(sp, Mapping):
        raise TwinError(f"{where}: data.shared_prefix is not a mapping")
    out: dict[str, Any] = {}
    for ours, theirs in _SP_ALIASES.items():
        out[ours] = next((sp[k] for k in theirs if k in sp), 10)  # inference-perf's default: 10
    for k in ("system_prompt_len", "question_len", "output_len"):
        if not isinstance(sp.get(k), int):
            raise TwinError(f"{where}: data.shared_prefix.{k}: {sp.get(k)!r} is not an integer")
        out[k] = sp[k]
    out["multi_turn"] = bool(sp.get("enable_multi_turn_chat", False))
    return out


def _client_timeout(profile: Mapping[str, Any], where: str) -> float:
    """How long the load generator waited for a request (s): its config's
    ``load.request_timeout``, or aiohttp's default when that is null or left out."""
    load = profile.get("load") or {}
    value = load.get("request_timeout") if isinstance(load, Mapping) else None
    if value is None:
        return AIOHTTP_TOTAL_TIMEOUT_S
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise TwinError(f"{where}: load.request_timeout: {value!r} is not a number of seconds > 0")
    return float(value)


def _folder_run(folder: Path, gpu: str | None) -> RealRun:
    where = str(folder)
    exp = folder / "exp-config.yaml"
    if not exp.is_file():
        raise TwinError(f"{folder}: no exp-config.yaml (the vLLM arguments)")
    args = yamlio.load_text(read_text(exp, "vLLM arguments"), str(exp))
    profile = _read_profile(folder)
    if not isinstance(args, Mapping) or profile is None:
        raise TwinError(f"{folder}: exp-config.yaml or the profile is not a mapping")
    if gpu is None:
        raise TwinError(f"{folder}: the run's files do not name its GPU; give one (--gpu NAME)")
    for k in ("model", "max_num_seqs", "max_num_batched_tokens"):
        if k not in args:
            raise TwinError(f"{exp}: missing {k!r} (vLLM's argument; needed to replay the run)")
    load = profile.get("load") or {}
    stages = _stages(load.get("stages") if isinstance(load, Mapping) else None, f"{where}: load")
    sp = _shared_prefix(profile, where)
    if sp is None:
        raise TwinError(f"{where}: data.type is not shared_prefix; only that workload is read")
    engine = {
        "max_num_seqs": args["max_num_seqs"],
        "max_batched_tokens": args["max_num_batched_tokens"],
        "gpu_memory_utilization": args.get("gpu_memory_utilization", VLLM_GPU_MEMORY_UTILIZATION),
        "max_model_len": args.get("max_model_len"),
    }
    if args.get("block_size", VLLM_BLOCK_TOKENS) != VLLM_BLOCK_TOKENS:
        engine["block_size"] = args["block_size"]
    offload = float(args["kv_offloading_size"]) * 2**30 if args.get("kv_offloading_size") else None
    hf_id = str(args["model"])
    model = _model(hf_id, (folder / "config.json", folder / _config_name(hf_id)), where, False)
    trace = _find(folder, "per_request_lifecycle_metrics.json")
    workload = _workload(stages, sp, trace, _client_timeout(profile, where))
    spec = replay_spec(folder.name, model, gpu, int(args.get("tensor_parallelism", 1)), engine,
                       offload, workload)  # fmt: skip
    actual, overloaded, completed = _lifecycle(folder, len(stages))
    return RealRun(folder.name, spec, stages, actual, overloaded, completed)


def _lifecycle(folder: Path, stages: int) -> tuple[dict[int, dict[str, float]], bool, int | None]:
    """Measured per stage, whether past saturation, the requests that succeeded."""
    out: dict[int, dict[str, float]] = {}
    overloaded = False
    completed = None
    for s in (WHOLE, *range(stages)):
        name = (
            "summary_lifecycle_metrics.json" if s == WHOLE else f"stage_{s}_lifecycle_metrics.json"
        )
        p = _find(folder, name)
        if p is None:
            continue
        doc = json.loads(read_text(p, "lifecycle report"))
        ok = doc.get("successes") or {}
        lat = ok.get("latency") or {}
        e2e, ttft = lat.get("request_latency") or {}, lat.get("time_to_first_token") or {}
        if not e2e or not ttft:
            continue
        m = {f"e2e_{q}": e2e[q] for q in ("mean", "p90", "p99")}
        m.update({f"ttft_{q}": ttft[q] for q in ("mean", "p90", "p99")})
        out_mean = (ok.get("output_len") or {}).get("mean")
        if out_mean and out_mean > 1:
            m["itl_mean"] = (m["e2e_mean"] - m["ttft_mean"]) / (out_mean - 1)
        out[s] = m
        if s == WHOLE:
            n_ok = ok.get("count") or 0
            n_bad = (doc.get("failures") or {}).get("count") or 0
            overloaded = is_overloaded(n_bad, n_ok + n_bad, ttft.get("median", 0))
            completed = n_ok
    return out, overloaded, completed


def is_overloaded(failed: int, requests: int, median_ttft_s: float) -> bool:
    """Past saturation (PROVENANCE.md): more than 5% of the requests failed, or the
    median TTFT is over 10 s."""
    share = failed / requests if requests else 0.0
    return share > OVERLOAD_FAILED_SHARE or median_ttft_s > OVERLOAD_MEDIAN_TTFT_S


# --------------------------------------------------------------------------- the spec


def _workload(
    stages: tuple[tuple[float, float], ...],
    sp: dict[str, Any],
    trace: Path | None,
    timeout_s: float | None,
) -> dict[str, Any]:
    """An inference-perf run's workload: its per-request trace, else its profile."""
    workload: dict[str, Any]
    if trace is not None:
        workload = {
            "trace": str(trace.resolve()),
            "format": "inference-perf",
            "output_tokens": sp["output_len"],
            "prefixes": {"shared_prefix": dict(sp)},
        }
    else:
        rate0 = stages[0][0]
        workload = {
            "lengths": {"shared_prefix": dict(sp)},
            "arrival": {"process": "poisson", "rate": rate0},
            "duration": f"{sum(d for _, d in stages):g} s",
        }
        if len(stages) > 1:
            points, t = [], 0.0
            for rate, d in stages:
                points.append([f"{t:g} s", rate / rate0])
                t += d
            workload["rate_schedule"] = {"kind": "steps", "points": points}
    if timeout_s is not None:  # the load generator's: it gives up on a request then
        workload["timeout"] = f"{timeout_s:g} s"
    return workload


def replay_spec(
    key: str,
    model: str | dict[str, Any],
    gpu: str,
    tp: int,
    engine: dict[str, Any],
    offload_bytes: float | None,
    workload: dict[str, Any],
) -> dict[str, Any]:
    """The spec that replays a measured vLLM run: its model on one instance of its GPU
    at its TP, colocated, with vLLM V1's engine (``engine``: its arguments, None for
    vLLM's default) and the client's latency term; ``workload`` as the run sent it."""
    eng = {
        "block_size": VLLM_BLOCK_TOKENS,
        "chunked_prefill": True,
        "prefix_caching": True,
        "oversized": "reject",  # vLLM refuses a prompt past max_model_len (HTTP 400)
        **{k: v for k, v in engine.items() if v is not None},
    }
    spec: dict[str, Any] = {
        "name": key,
        "description": f"measured vLLM run {key}, replayed",
        "seed": 0,
        "model": model,
        "gpu": gpu,
        "cluster": {"instances": 1, "tp": tp},
        "engine": eng,
        "scheduler": {"name": "colocated"},
        "workload": workload,
        # what the load generator measured includes the client's and the API server's share
        "slo": {"client_latency": f"{VLLM_CLIENT_LATENCY_S * 1e3:g} ms"},
    }
    if offload_bytes:
        spec["kv_tiers"] = {"dram_bytes": f"{offload_bytes:.0f} B"}
    return spec
