"""A trace's own rate, replaying it at a rate given in requests/s, and the
warnings of runs shaped by something other than the question they ask (a
trace that ran out, a system overloaded before its failure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import schedulers.colocated  # noqa: F401 - registers the built-in when not installed
from twin.cli import main
from twin.sim.simulation import run


def trace(tmp_path: Path, rows: int, gap_s: float = 0.5) -> Path:
    """An Azure-format trace of ``rows`` short requests, ``gap_s`` apart."""
    path = tmp_path / "t.csv"
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(rows):
        t = i * gap_s
        lines.append(f"2023-11-16 18:{15 + int(t // 60):02d}:{t % 60:010.7f},{100 + i},5")
    path.write_text("\n".join(lines) + "\n")
    return path


def spec(tmp_path: Path, rows: int = 11, **workload) -> dict:
    return {
        "model": "llama-3.1-8b",
        "cluster": {"instances": 1, "tp": 1},
        "workload": {"trace": str(trace(tmp_path, rows)), "format": "azure", **workload},
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }


def test_rate_replays_a_trace_at_that_many_requests_per_second(tmp_path):
    result = run(spec(tmp_path, rate=8))
    assert result.header["trace_rate_rps"] == pytest.approx({"own": 2.0, "replayed": 8.0})
    arrivals = sorted(r["arrival_s"] for r in result.request_rows)
    assert arrivals[-1] == pytest.approx(10 * 0.125)  # 11 requests, 0.125 s apart
    same = run(spec(tmp_path, rate_scale=4.0))
    assert sorted(r["arrival_s"] for r in same.request_rows) == pytest.approx(arrivals)


def test_the_summary_prints_a_traces_own_rate(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec(tmp_path, rate_scale=2.0)))
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "trace: its own rate 2 req/s, replayed at 4 req/s" in out


def test_twin_spec_prints_a_traces_own_rate_and_the_rate_replayed(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec(tmp_path, rate=8)))
    assert main(["spec", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["trace_rate_rps"] == pytest.approx({"own": 2.0, "replayed": 8.0})
    ran = run(spec(tmp_path, rate=8)).header["trace_rate_rps"]
    assert doc["trace_rate_rps"] == pytest.approx(ran)
    poisson = spec(tmp_path, arrival={"process": "poisson", "rate": 3})
    path.write_text(yaml.safe_dump(poisson))
    assert main(["spec", str(path)]) == 0
    assert "trace_rate_rps" not in json.loads(capsys.readouterr().out)  # no rate of its own


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        (
            {"rate": 4, "rate_scale": 2.0},
            "workload: rate 4 and rate_scale 2.0: give rate (requests/s) or rate_scale (x the "
            "trace's), not both; a null removes one (--set workload.rate_scale=null)",
        ),
        ({"rate": 0}, "workload: rate(=0) must be a number > 0"),
        (
            {"rate": 4, "arrival": {"process": "poisson", "rate": 1}},
            "rate replays a timed trace at that rate",
        ),
    ],
)
def test_bad_rates_are_one_line(tmp_path, capsys, workload, message):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec(tmp_path, **workload)))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and err.count("\n") == 1 and message in err, err


def test_a_trace_that_runs_out_before_the_duration_is_a_warning(tmp_path):
    short = run(spec(tmp_path, duration="60 s"))  # 11 requests over 5 s
    assert short.summary["warnings"] == [
        "the trace ran out at 5.0 s, before workload.duration 60 s: nothing arrived after it "
        "(repeat: true loops the trace; a higher rate ends it sooner)"
    ]
    assert "warnings" not in run(spec(tmp_path, duration="3 s")).summary  # cut by duration
    assert "warnings" not in run(spec(tmp_path)).summary  # no duration asked for


def test_a_system_saturated_before_its_failure_is_a_warning(tmp_path):
    def failing(rate_scale: float) -> dict:
        s = spec(tmp_path, rows=400, rate_scale=rate_scale)
        s["cluster"] = {"instances": 2, "tp": 1}
        s["slo"] = {"ttft": "20 ms", "tpot": "50 ms"}
        s["events"] = [{"at": "150 s", "action": "fail", "instance": 0}]
        return s

    calm = run(failing(1.0))
    assert "warnings" not in calm.summary, calm.summary.get("warnings")
    loaded = run(failing(1.0), overrides=["slo.ttft=1 ms"])  # nothing can meet 1 ms
    (line,) = loaded.summary["warnings"]
    assert line.startswith("the system missed its SLO target before the first failure at 150 s")
    assert json.dumps(line)


def test_a_run_some_of_whose_requests_a_limit_rejects_says_so_in_one_line(tmp_path):
    s = spec(tmp_path)
    s["engine"] = {"max_model_len": 109}  # prompts of 100 + i tokens and 5 outputs
    result = run(s)
    assert result.summary["rejected_by_reason"] == {"context_length": 6}
    assert result.summary["warnings"] == [
        "a limit shaped this run: 6 of the 11 requests (54.5%) are longer than the context "
        "(engine.max_model_len or the model's) and were rejected, so SLO attainment cannot "
        "exceed 45.5%"
    ]
