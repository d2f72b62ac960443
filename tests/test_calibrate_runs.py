"""`twin calibrate --runs`: the vllm preset's free terms fitted to measured runs, and the
preset replaying traced runs within the targets (E2E and ITL mean within 10%)."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from twin import yamlio
from twin.cli import main
from twin.perf.build import build_perf_model
from twin.perf.gpus import get_gpu
from twin.perf.llm import get_model
from twin.perf.roofline import Roofline
from twin.studies.calibrate_runs import PRIOR, Replayer, _loss, fit, free_terms, perf_block
from twin.studies.runs import read_run
from twin.studies.validate_realrun import replay

SMALL = "20260217-162547-llama-2-7b-tp1-roleplay"  # one stage, TP 1
TP2 = "20260218-150304-codellama-34b-tp2-general"  # two stages, TP 2


@pytest.fixture(scope="module")
def realruns(shared_data: Path) -> Path:
    data = shared_data / "realruns"
    if not (data / "manifest.csv").is_file():
        pytest.skip(f"{data}: no realruns data (manifest.csv)")
    return data


def test_fit_on_two_traced_runs_lowers_the_error_and_writes_a_perf_block(realruns):
    runs = [read_run(realruns / SMALL), read_run(realruns / TP2)]
    assert free_terms(runs) == ("overhead_s", "layer_overhead_s", "hop_overhead_s",
                                "client_latency_s")  # fmt: skip
    rep = Replayer(stage_requests=80)
    start = _loss(rep, runs, {k: PRIOR[k] for k in free_terms(runs)})
    f = fit(runs, ("overhead_s", "layer_overhead_s"), replayer=rep)
    assert f.loss < start  # the fit moved the terms and the error fell
    assert set(f.terms) == {"overhead_s", "layer_overhead_s"}
    block = yamlio.load(yamlio_dump(f.terms))["perf"]
    r = build_perf_model(block, get_model("llama-2-7b"), get_gpu("h100-sxm"), 1)
    assert isinstance(r, Roofline) and r.engine == "vllm"
    assert r.overhead_s == pytest.approx(f.terms["overhead_s"], rel=1e-3)
    assert r.layer_overhead_s == pytest.approx(f.terms["layer_overhead_s"], rel=1e-3)


def yamlio_dump(terms: dict[str, float]) -> str:
    from twin.studies.calibrate_runs import perf_yaml

    return perf_yaml(terms)


def test_perf_block_units() -> None:
    b = perf_block({"overhead_s": 1.5e-3, "moe_efficiency": 0.71428})
    assert b == {"kind": "roofline", "engine": "vllm", "overhead": "1500 us",
                 "moe_efficiency": 0.7143}  # fmt: skip


def _one_run_folder(realruns: Path, tmp_path: Path, key: str) -> Path:
    """A realruns-style folder holding only ``key`` (links to the data, no copy)."""
    d = tmp_path / "runs"
    d.mkdir()
    with (realruns / "manifest.csv").open() as f:
        rows = list(csv.DictReader(f))
    with (d / "manifest.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(r for r in rows if r["key"] == key)
    for name in ("runs", "traces", "models", "actuals.csv"):
        (d / name).symlink_to(realruns / name)
    return d


def test_calibrate_runs_command_writes_the_block(realruns, tmp_path, capsys):
    folder = _one_run_folder(realruns, tmp_path, SMALL)
    out = tmp_path / "perf.yaml"
    args = ["calibrate", "--runs", str(folder), "--stage-requests", "40", "--fit", "overhead_s",
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert SMALL in printed and "perf:" in printed
    block = yamlio.load(out.read_text())["perf"]
    assert block["kind"] == "roofline" and block["engine"] == "vllm" and "overhead" in block


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fit", "mfu"], "--fit: 'mfu'; expected some of overhead_s"),
        (["--stage-requests", "0"], "--stage-requests: 0 must be >= 1"),
    ],
)
def test_calibrate_runs_bad_input_is_one_line(realruns, tmp_path, capsys, args, message):
    folder = _one_run_folder(realruns, tmp_path, SMALL)
    assert main(["calibrate", "--runs", str(folder), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("twin: error:") and message in err and "\n" not in err


def _stage_errors(realruns: Path, key: str, n: int) -> dict[str, float]:
    s = replay(read_run(realruns / key), stage_requests=n)
    stages = sorted({st for st, _ in s.scores if st >= 0})
    return {m: statistics.fmean(s.scores[(st, m)].mape for st in stages)
            for m in ("e2e_mean", "itl_mean", "ttft_mean")}  # fmt: skip


@pytest.mark.parametrize("key", [SMALL, TP2])
def test_the_default_preset_replays_traced_runs_within_the_targets(realruns, key):
    # nothing fitted per run: the shipped vllm preset, the run's model, GPU, TP and limits;
    # the first 300 requests sent in each load stage
    e = _stage_errors(realruns, key, 300)
    assert e["e2e_mean"] <= 10.0 and e["itl_mean"] <= 10.0, e


@pytest.mark.parametrize("key", [SMALL, TP2])
def test_ttft_within_its_target(realruns, key):
    # the shipped client latency (slo.client_latency of a replayed run) included
    assert _stage_errors(realruns, key, 300)["ttft_mean"] <= 25.0


def test_the_client_term_is_fitted_on_ttft_and_moves_no_step(realruns):
    runs = [read_run(realruns / SMALL)]
    rep = Replayer(stage_requests=80)
    f = fit(runs, ("client_latency_s",), replayer=rep)
    assert set(rep.cache) == {(SMALL, ())}  # one replay: the term shifts its figures only
    assert 0.005 < f.terms["client_latency_s"] < 0.03
    base = rep.errors(runs[0], {"client_latency_s": 0.0})
    assert f.errors[SMALL]["ttft_mean"] < base["ttft_mean"] / 2
    assert f.errors[SMALL]["itl_mean"] == pytest.approx(base["itl_mean"])
    c = f.terms["client_latency_s"]  # solved exactly: no nearby value does better
    for d in (0.98, 1.02):
        near = rep.errors(runs[0], {"client_latency_s": c * d})["ttft_mean"]
        assert f.errors[SMALL]["ttft_mean"] <= near + 1e-9
    text = yamlio.load(yamlio_dump(f.terms))
    assert text["slo"]["client_latency"].endswith(" ms") and "client_latency" not in text["perf"]


def test_a_replayed_run_carries_the_shipped_client_latency(realruns):
    from twin.perf.vllm import VLLM_CLIENT_LATENCY_S

    spec = read_run(realruns / SMALL).spec
    assert spec["slo"]["client_latency"] == f"{VLLM_CLIENT_LATENCY_S * 1e3:g} ms"
