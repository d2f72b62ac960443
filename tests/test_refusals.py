"""Inputs once taken in silence: each is now one clean error line, or, where
the run is legitimate but degenerate, a warning the summary states."""

from __future__ import annotations

import gc
import math
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from helpers import small_spec

import schedulers.kv_router  # registers kv-router
import schedulers.sla_planner  # noqa: F401 - registers sla-planner
from twin.cli import main
from twin.errors import SpecError
from twin.perf.build import build_perf_model
from twin.perf.gpus import get_gpu
from twin.perf.iteration import Batch
from twin.perf.llm import get_model
from twin.perf.profile import GRIDS, TINY, table_text
from twin.perf.roofline import Roofline
from twin.sim.simulation import Simulation, run

INLINE = {"name": "t", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16,
          "intermediate": 128, "vocab": 256, "params": 100_000}  # fmt: skip


def spec(**over: Any) -> Any:
    """Two colocated Llama-3.1-8B instances, 20 synthetic requests (helpers.small_spec)."""
    return small_spec(requests=20, **over)


def _one_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc = main(list(args))
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("twin: error: ") and err.count("\n") == 1, err
    return err


# -- item: silent acceptances ---------------------------------------------------------------
def test_skip_past_the_end_of_the_trace_is_an_error(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:4{i}.0,100,10\n" for i in range(3))
    )
    s = spec(workload={"trace": str(trace), "skip": 5})
    with pytest.raises(SpecError, match=r"workload.skip: 5 is past the end .* holds 3 requests"):
        Simulation(s).run()
    assert run(spec(workload={"trace": str(trace), "skip": 2})).summary["requests"] == 1
    (tmp_path / "s.yaml").write_text(
        "model: llama-3.1-8b\ncluster: {instances: 1, tp: 1}\nworkload: {trace: t.csv, skip: 3}\n"
    )
    assert "workload.skip: 3" in _one_line(capsys, "run", str(tmp_path / "s.yaml"))


def test_sla_planner_budget_below_its_starting_gpus_is_an_error():
    s = spec(scheduler={"name": "sla-planner", "max_gpus": 1})
    with pytest.raises(SpecError, match=r"max_gpus: 1 is below the 2 GPUs the cluster starts"):
        Simulation(s)
    Simulation(spec(scheduler={"name": "sla-planner", "max_gpus": 2}))


def test_an_inline_model_with_weight_dtype_bytes_0_is_an_error():
    with pytest.raises(SpecError, match=r"weight_dtype_bytes: 0; expected 1, 2 or 4"):
        get_model({**INLINE, "weight_dtype_bytes": 0}, "s.yaml: model")
    two = get_model({**INLINE, "weight_dtype_bytes": 2})
    assert get_model(INLINE).weight_bytes == two.weight_bytes


@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0])
def test_kv_router_weights_must_be_finite(value):
    with pytest.raises(SpecError, match=r"scheduler.overlap_score_weight: .* finite number >= 0"):
        spec(scheduler={"name": "kv-router", "overlap_score_weight": value})


def test_kv_router_inf_from_yaml_is_refused(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(
        "model: llama-3.1-8b\ncluster: {instances: 1, tp: 1}\n"
        "scheduler: {name: kv-router, overlap_score_weight: .inf}\n"
        "workload: {lengths: azure-conv, arrival: {process: poisson, rate: 1}, max_requests: 5}\n"
    )
    assert "overlap_score_weight: inf" in _one_line(capsys, "spec", str(tmp_path / "s.yaml"))


def test_a_token_budget_below_the_context_needs_chunked_prefill():
    with pytest.raises(SpecError, match=r"max_batched_tokens: 1 is below max_model_len 131,072"):
        spec(engine={"max_batched_tokens": 1})
    with pytest.raises(SpecError, match=r"max_batched_tokens: 512 is below max_model_len 1,024"):
        spec(engine={"max_batched_tokens": 512, "max_model_len": 1024})
    # what vLLM starts with: chunked prefill, or a budget that holds the context
    spec(engine={"max_batched_tokens": 1, "chunked_prefill": True})
    spec(engine={"max_batched_tokens": 1024, "max_model_len": 1024})


def test_sla_planner_interval_has_a_floor():
    with pytest.raises(SpecError, match=r"adjustment_interval: '1 us' is below 100 ms"):
        spec(scheduler={"name": "sla-planner", "adjustment_interval": "1 us"})
    spec(scheduler={"name": "sla-planner", "adjustment_interval": "100 ms"})


def test_every_request_beyond_the_context_is_warned_in_summary_and_stderr(capsys):
    r = run(spec(engine={"max_model_len": 16}))
    (w,) = r.summary["warnings"]
    assert w.startswith("no request completed: every one of the 20 requests is longer than")
    assert "warnings" not in run(spec()).summary  # a run that went as meant reads as before
    assert main(["run", "quickstart", "--set", "engine.max_model_len=16",
                 "--set", "workload.max_requests=20"]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    assert "\nwarning: no request completed: every one of the 20 requests" in out
    assert err.startswith("twin: warning: no request completed: every one of the 20 requests")


# -- item: profile, perf.path, build ----------------------------------------------------------
@pytest.mark.parametrize(
    "args, msg",
    [(["--tp", "3"], "--tp 3"), (["--layers", "5"], "--layers 5"),
     (["--dtype", "int4"], "--dtype 'int4'"), (["--warmup", "-1"], "--warmup -1")],
)  # fmt: skip
def test_profile_argument_errors_come_before_a_missing_torch(monkeypatch, capsys, tmp_path,
                                                             args, msg):  # fmt: skip
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails: not installed
    out = str(tmp_path / "t.csv")
    err = _one_line(capsys, "profile", "tiny", *args, "--device", "cpu", "--out", out)
    assert msg in err and "PyTorch" not in err
    err = _one_line(capsys, "profile", "tiny", "--device", "cpu", "--out", out)
    assert "needs PyTorch" in err


def _table(folder: Path) -> Path:
    r = Roofline(TINY, get_gpu("h100"), 1)
    grid = GRIDS["tiny"]
    rows = [("prefill", b, p, 0, r.iteration_time(Batch(prefill=((p, 0),) * b)))
            for b, p in grid.prefill_points()]  # fmt: skip
    rows += [("decode", b, 1, c, r.iteration_time(Batch(decode_count=b, decode_context_sum=b * c)))
             for b, c in grid.decode_points()]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.csv").write_text(table_text(rows))
    return folder / "tiny.csv"


def test_perf_path_takes_a_data_path_as_workload_trace_does(tmp_path, monkeypatch):
    table = _table(tmp_path / "data" / "profiles")
    monkeypatch.setenv("TWIN_DATA", str(tmp_path / "data"))
    perf = {"kind": "profile", "path": "data:profiles/tiny.csv"}
    model = build_perf_model(perf, TINY, get_gpu("h100"), 1, where="s.yaml: perf")
    same = build_perf_model({**perf, "path": str(table)}, TINY, get_gpu("h100"), 1)
    assert model.sha256 == same.sha256
    with pytest.raises(SpecError, match=r"s.yaml: perf.path: 'data:profiles/none.csv': no such"):
        build_perf_model({**perf, "path": "data:profiles/none.csv"}, TINY, get_gpu("h100"), 1,
                         where="s.yaml: perf")  # fmt: skip


def test_reading_a_profile_table_leaves_no_file_open(tmp_path):
    table = _table(tmp_path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        build_perf_model({"kind": "profile", "path": str(table)}, TINY, get_gpu("h100"), 1)
        gc.collect()
    assert [w for w in seen if issubclass(w.category, ResourceWarning)] == []


def test_run_warnings_name_what_ended_the_requests():
    from twin.sim.summary import run_warnings

    base = {"requests": 10, "completed": 0, "rejected_by_reason": {}}
    assert run_warnings({**base, "requests": 0}) == [
        "no request arrived: the workload ended before its first request"
    ]
    assert run_warnings({**base, "completed": 1}) == []
    mixed = {**base, "rejected_by_reason": {"context_length": 4},
             "failed_by_reason": {"max_attempts": 6}}  # fmt: skip
    assert run_warnings(mixed) == [
        "no request completed: of 10 requests, context_length 4, failed: max_attempts 6"
    ]
    kv = {**base, "rejected_by_reason": {"exceeds_kv_capacity": 10}}
    assert run_warnings(kv) == [
        "no request completed: every one of the 10 requests is more KV than an instance holds"
    ]
