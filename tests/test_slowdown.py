"""Slowdown SLOs (slo.slowdown): percentiles of each request's latencies over its own
unloaded ones on a reference instance, as Splitwise (ISCA 2024, section VI-A) states its SLOs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import small_spec

from twin.errors import SpecError
from twin.perf.iteration import Batch
from twin.sim.simulation import Simulation
from twin.sim.slowdown import Slowdown, SlowdownJudge, slowdown_judge
from twin.studies import goodput

SPLITWISE = {"ttft": {"p50": 2, "p90": 3, "p99": 6}, "tbt": {"p50": 1.25, "p90": 1.5, "p99": 5},
             "e2e": {"p50": 1.25, "p90": 1.5, "p99": 5}}  # fmt: skip


class Flat:
    """A reference perf model: 1 ms a prompt token, 50 ms a decode step."""

    def iteration_time(self, batch: Batch) -> float:
        return 1e-3 * batch.prefill_tokens + 0.05 * batch.decode_count


def judge(**bounds: Any) -> SlowdownJudge:
    return SlowdownJudge(Slowdown(gpu="a100-80gb", tp=8, **bounds), Flat())


def test_unloaded_times_are_the_request_alone() -> None:
    j = judge(ttft=(("p50", 0.5, 2.0),))
    assert j.unloaded(1000, 11) == pytest.approx((1.0, 0.05, 1.0 + 0.05 * 10))


def test_each_bounded_percentile_is_judged() -> None:
    j = judge(ttft=(("p50", 0.5, 2.0), ("p99", 0.99, 6.0)), tbt=(("p90", 0.9, 1.5),))
    for k in range(10):  # TTFT slowdowns 1..10, TBT 1.0 (0.05 s a token)
        j.add(1000, 11, ttft=1.0 + k, tpot=0.05, e2e=2.0)
    s = j.summary()
    assert s["ttft"]["p50"] == pytest.approx(5.5) and s["ttft"]["p99"] > 6.0
    assert s["tbt"] == {"p90": pytest.approx(1.0)} and "e2e" not in s
    assert s["met"] is False  # TTFT P99 over 6
    k = judge(ttft=(("p50", 0.5, 2.0),))
    assert k.summary()["met"] is False  # nothing completed: nothing met
    k.add(1000, 1, ttft=1.5, tpot=None, e2e=1.5)  # one token: no TBT slowdown
    assert k.summary() == {"ttft": {"p50": pytest.approx(1.5)}, "met": True}


def _run(bounds: dict[str, Any], rate: float = 0.2) -> dict[str, Any]:
    slo = {"slowdown": {"gpu": "h100-sxm", "tp": 1, **bounds}}
    return Simulation(small_spec(rate=rate, requests=20, slo=slo)).run().summary


def test_alone_on_the_reference_instance_a_request_is_not_slowed() -> None:
    # the serving instances are the reference instance, the load light: every request's
    # TTFT is its unloaded one, its TBT within a few percent (its context grows)
    s = _run(SPLITWISE)["slowdown"]
    assert s["met"] is True
    assert s["ttft"]["p50"] == pytest.approx(1.0, rel=1e-6)
    assert 1.0 <= s["tbt"]["p99"] < 1.1 and 1.0 <= s["e2e"]["p99"] < 1.1
    assert _run({"tbt": {"p50": 0.9}})["slowdown"]["met"] is False


def test_spec_keys_are_checked_and_written_only_when_given() -> None:
    assert "slowdown" not in small_spec().resolved["slo"]
    spec = small_spec(slo={"slowdown": {"gpu": "a100-80gb", "tp": 8, **SPLITWISE}})
    assert spec.slo.slowdown is not None and spec.slo.slowdown.tbt[1] == ("p90", 0.9, 1.5)
    assert spec.resolved["slo"]["slowdown"]["ttft"] == SPLITWISE["ttft"]
    bad = [
        ({"tp": 8, "ttft": {"p50": 2}}, "slo.slowdown.gpu: missing"),
        ({"gpu": "a100-80gb"}, "bounds none of ttft, tbt, e2e"),
        ({"gpu": "a100-80gb", "ttft": {"median": 2}}, r"slo.slowdown.ttft: key 'median'"),
        ({"gpu": "a100-80gb", "ttft": {"p100": 2}}, r"key 'p100' must be a percentile"),
        ({"gpu": "a100-80gb", "tbt": {"p90": 0}}, r"slo.slowdown.tbt.p90: 0 must be a positive"),
        ({"gpu": "a100-80gb", "tp": 0, "tbt": {"p90": 1.5}}, r"slo.slowdown.tp"),
    ]
    for sd, match in bad:
        with pytest.raises(SpecError, match=match):
            small_spec(slo={"slowdown": sd})
    unknown = small_spec(slo={"slowdown": {"gpu": "a200", "tbt": {"p90": 1.5}}})
    with pytest.raises(SpecError, match=r"test.yaml: slo.slowdown.gpu: unknown gpu 'a200'"):
        slowdown_judge(unknown)


def test_goodput_counts_a_missed_slowdown_as_a_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    from twin.studies import sweep

    summaries = iter([
        {"slo_attainment": 1.0, "slowdown": {"met": False}},
        {"slo_attainment": 0.95, "slowdown": {"met": True}},
        {"slo_attainment": 0.95},
    ])  # fmt: skip
    monkeypatch.setattr(sweep, "run_spec", lambda *a: {"summary": next(summaries)})
    got = [goodput.probe_attainment({}, "x.yaml", ".") for _ in range(3)]
    assert got == [0.0, 0.95, 0.95]
    only_slowdown = small_spec(slo={"slowdown": {"gpu": "h100-sxm", "tbt": {"p90": 1.5}}})
    goodput.require_slo(only_slowdown, "x.yaml")  # a slowdown alone is an SLO
    with pytest.raises(SpecError, match="no ttft, tpot or slowdown given"):
        goodput.require_slo(small_spec(slo={}), "x.yaml")
    with pytest.raises(SpecError, match="no ttft or tpot given"):  # twin plan's searches
        goodput.require_slo(only_slowdown, "x.yaml", slowdown=False)


def test_twin_run_prints_the_slowdowns_and_refuses_a_bad_reference(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from twin.cli import main

    bounds = {"gpu": "h100-sxm", "ttft": {"p50": 2}, "tbt": {"p90": 0.5}}
    spec = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "cluster": {"instances": 1, "tp": 1},
            "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 0.2},
                         "max_requests": 10},
            "slo": {"slowdown": bounds}}  # fmt: skip
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(spec))
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "slowdown vs h100-sxm TP1 alone (MISSED): ttft p50 1.00/2, tbt p90 1." in out
    bounds["gpu"] = "a200"
    path.write_text(json.dumps(spec))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and "slo.slowdown.gpu: unknown gpu 'a200'" in err
