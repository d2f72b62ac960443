"""Readers of real benchmark results (vLLM, AIPerf) on the synthetic fixtures, the KS
distance, and `twin validate run` replaying a fixture the twin reproduces exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from twin.cli import main
from twin.errors import TwinError
from twin.studies.validate_run import ks_distance, stats, validate_run
from twin.workload.measured import detect, read_aiperf, read_measured, read_vllm

FIX = Path(__file__).parent / "fixtures"
SPEC = str(FIX / "validate-run.yaml")
VLLM = FIX / "vllm-bench-serve.synthetic.json"
AIPERF = FIX / "aiperf-profile_export.synthetic.jsonl"


def test_fixtures_say_they_are_synthetic():
    assert json.loads(VLLM.read_text())["label"].startswith("SYNTHETIC")
    lines = [json.loads(line) for line in AIPERF.read_text().splitlines()]
    assert all(rec["note"].startswith("SYNTHETIC") for rec in lines)


def test_vllm_reader_on_the_fixture():
    doc = json.loads(VLLM.read_text())
    run = read_vllm(VLLM)
    assert detect(VLLM) == "vllm" and run.format == "vllm"
    ok = [i for i, e in enumerate(doc["errors"]) if not e]
    assert len(run.requests) == len(ok) == 24 and run.failed == 2
    t0 = doc["start_times"][ok[0]]
    for r, i in zip(run.requests, ok, strict=True):
        assert r.send_s == doc["start_times"][i] - t0
        assert (r.prompt_tokens, r.output_tokens) == (doc["input_lens"][i], doc["output_lens"][i])
        assert r.ttft_s == doc["ttfts"][i]
        n = doc["output_lens"][i]
        if n > 1:
            assert r.tpot_s == math.fsum(doc["itls"][i]) / (n - 1)
            assert r.max_itl_s == max(doc["itls"][i])
        else:
            assert r.tpot_s is None and r.max_itl_s is None
    assert run.requests[0].send_s == 0.0
    assert sum(r.tpot_s is None for r in run.requests) == 1


def test_aiperf_reader_matches_the_same_requests():
    a, v = read_aiperf(AIPERF), read_vllm(VLLM)
    assert detect(AIPERF) == "aiperf" and a.failed == 2
    assert [(r.send_s, r.prompt_tokens, r.output_tokens) for r in a.requests] == [
        (r.send_s, r.prompt_tokens, r.output_tokens) for r in v.requests
    ]
    for x, y in zip(a.requests, v.requests, strict=True):
        assert x.ttft_s == pytest.approx(y.ttft_s, rel=1e-12)
        assert (x.tpot_s is None) == (y.tpot_s is None)
        if x.tpot_s is not None:
            assert x.tpot_s == pytest.approx(y.tpot_s, rel=1e-12)
            assert x.max_itl_s == pytest.approx(y.max_itl_s, rel=1e-12)


def _aiperf_line(start_ns: int, phase: str = "profiling", unit: str = "ns", **err) -> str:
    k = {"ns": 1e6, "ms": 1.0}[unit]
    rec = {"metadata": {"request_start_ns": start_ns, "benchmark_phase": phase},
           "metrics": {"input_sequence_length": {"value": 100, "unit": "tokens"},
                       "output_sequence_length": {"value": 3, "unit": "tokens"},
                       "time_to_first_token": {"value": 20 * k, "unit": unit},
                       "inter_token_latency": {"value": 5 * k, "unit": unit},
                       "inter_chunk_latency": {"value": [4 * k, 6 * k], "unit": unit}},
           "error": err or None}  # fmt: skip
    return json.dumps(rec)


def test_aiperf_units_phases_and_errors(tmp_path):
    p = tmp_path / "profile_export.jsonl"
    lines = [
        _aiperf_line(10**18 - 5 * 10**8, phase="warmup"),  # skipped
        _aiperf_line(10**18 + 2_500_000_000, unit="ms"),
        _aiperf_line(10**18),
        _aiperf_line(10**18 + 10**9, code=500, type="X", message="boom"),
    ]
    p.write_text("\n".join(lines) + "\n\n")
    run = read_measured(p)
    assert run.format == "aiperf" and run.failed == 1
    assert [r.send_s for r in run.requests] == [0.0, 2.5]
    for r in run.requests:
        assert r.ttft_s == pytest.approx(0.020) and r.tpot_s == pytest.approx(0.005)
        assert r.max_itl_s == pytest.approx(0.006)


@pytest.mark.parametrize(
    "doc, msg",
    [
        ({"date": "x", "completed": 3, "mean_ttft_ms": 1.0}, "--save-detailed"),
        ({"input_lens": [1, 2], "output_lens": [1], "ttfts": [1, 1], "itls": [[], []],
          "start_times": [0, 1]}, "output_lens: expected a list of 2"),
        ({"input_lens": [1], "output_lens": [2], "ttfts": [-1.0], "itls": [[0.1]],
          "start_times": [0]}, "ttfts"),
    ],
)  # fmt: skip
def test_vllm_reader_refuses_bad_files(tmp_path, capsys, doc, msg):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(TwinError, match=msg.replace("-", "\\-")):
        read_vllm(p)
    assert main(["validate", "run", SPEC, "--against", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and str(p) in err and err.count("\n") == 1


def test_ks_distance_analytical():
    assert ks_distance([1, 2, 3], [3, 2, 1]) == 0.0
    assert ks_distance([1, 2], [3, 4]) == 1.0
    assert ks_distance([1, 2, 3, 4], [3, 4, 5, 6]) == 0.5
    assert ks_distance([1.0], [1.0, 2.0]) == 0.5
    from scipy.stats import ks_2samp

    a, b = [0.1, 0.5, 0.7, 0.9, 1.3], [0.2, 0.5, 0.6, 1.1]
    assert ks_distance(a, b) == pytest.approx(ks_2samp(a, b).statistic, abs=1e-15)


def test_stats_percentiles():
    s = stats([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s == {"mean": 3.0, "p50": 3.0, "p90": 4.6, "p99": pytest.approx(4.96)}


@pytest.mark.parametrize("fixture", [VLLM, AIPERF])
def test_validate_run_replays_the_fixture_exactly(fixture):
    c = validate_run(SPEC, str(fixture))
    assert (c.replayed, c.failed_in_run, c.not_completed) == (24, 2, 0)
    assert [m.metric for m in c.metrics] == ["ttft", "tpot", "itl"]
    assert [m.count for m in c.metrics] == [24, 23, 23]
    for m in c.metrics:
        for s, e in m.rel_error.items():
            assert abs(e) < 1e-9, (m.metric, s, e)
        # equal up to float rounding: the CDFs differ at most by one step
        assert m.ks <= 1 / m.count + 1e-12
    if fixture == VLLM:  # send times and TTFTs are exact: the same floats
        assert c.metrics[0].ks == 0.0


def test_validate_run_sees_a_slower_deployment(capsys):
    rc = main(["validate", "run", SPEC, "--against", str(VLLM), "--set", "perf.mbu=0.4",
               "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["replayed"] == 24 and doc["results_sha256"]
    tpot = doc["metrics"]["tpot"]
    assert tpot["rel_error"]["mean"] > 0.3 and tpot["ks"] > 0.5


def test_validate_run_text_report(capsys):
    assert main(["validate", "run", SPEC, "--against", str(AIPERF)]) == 0
    out = capsys.readouterr().out
    assert "24 requests replayed" in out and "2 failed in the run" in out
    for word in ("TTFT", "TPOT", "ITL", "p99", "KS"):
        assert word in out


def test_validate_run_needs_spec_and_results(capsys):
    assert main(["validate", "run", SPEC]) == 2
    assert "--against" in capsys.readouterr().err
