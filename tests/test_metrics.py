from __future__ import annotations

import numpy as np
import pytest
from helpers import small_spec
from hypothesis import given
from hypothesis import strategies as st

from twin.request import Request
from twin.sim.metrics import Distribution
from twin.sim.simulation import Simulation


@given(st.lists(st.floats(min_value=0.0, max_value=1e4, allow_nan=False), min_size=1, max_size=200))
def test_exact_mode_matches_numpy(xs):
    d = Distribution()
    for x in xs:
        d.add(x)
    s = d.summary()
    assert s["mean"] == pytest.approx(float(np.mean(xs)), rel=1e-9, abs=1e-9)
    assert s["p90"] == pytest.approx(float(np.quantile(xs, 0.9)))
    assert s["max"] == max(xs)


def test_folded_mode_keeps_quantiles_within_a_fraction_of_a_percent():
    rng = np.random.default_rng(1)
    xs = rng.lognormal(0.0, 1.5, 50_000)
    d = Distribution(exact_limit=1000)
    for x in xs:
        d.add(float(x))
    assert d._exact is None  # memory no longer grows with the count
    for q in (0.5, 0.9, 0.99):
        assert d.quantile(q) == pytest.approx(float(np.quantile(xs, q)), rel=2e-3)
    assert d.summary()["mean"] == pytest.approx(float(xs.mean()), rel=1e-12)


def test_empty_distribution_reports_none():
    assert Distribution().summary() == {
        "mean": None,
        "p50": None,
        "p90": None,
        "p99": None,
        "max": None,
    }


@pytest.mark.parametrize("limit", [1000, 10])
def test_merged_distributions_are_one_distribution(limit):
    rng = np.random.default_rng(2)
    xs = rng.lognormal(0.0, 1.0, 300)
    a, b, whole = Distribution(limit), Distribution(limit), Distribution(limit)
    for i, x in enumerate(xs):
        (a if i % 3 else b).add(float(x))
        whole.add(float(x))
    a.merge(b)
    assert (a.count, a.min, a.max) == (whole.count, whole.min, whole.max)
    assert a.total == pytest.approx(whole.total, rel=1e-12)
    for q in (0.5, 0.99):
        assert a.quantile(q) == whole.quantile(q)


@pytest.mark.parametrize("n", [1, 2, 3, 80, 1024, 1025, 1026, 5001])
@pytest.mark.parametrize("kind", ["ties", "spread", "inf"])
def test_quantiles_are_numpys_to_the_last_bit_short_or_long(n, kind):
    """Up to 1,024 values a quantile is taken in plain Python, past that from
    two order statistics numpy selects: both give numpy.quantile's bits (ties,
    zeros, an infinity)."""
    rng = np.random.default_rng(n)
    if kind == "ties":
        xs = rng.integers(0, 4, n).astype(float)
    elif kind == "spread":
        xs = rng.exponential(0.3, n)
    else:
        xs = rng.choice([0.0, 0.25, np.inf], n)
    d = Distribution()
    for x in xs.tolist():
        d.add(x)
    for q in (0.0, 0.01, 0.5, 0.9, 0.99, 1.0, 1 / 3):
        with np.errstate(invalid="ignore"):  # inf - inf in numpy's interpolation
            want = float(np.quantile(xs, q))
            got = d.quantile(q)
        assert (got == want and str(got) == str(want)) or (got != got and want != want)


def test_preemptions_of_requests_that_end_failed_count_in_the_summary():
    # Two small-memory instances preempt long outputs; instance 0 fails at
    # 3 s with no retry, so requests it had preempted end failed (4
    # preemptions among them). Every preemption counts once in the summary,
    # in the per-request rows and in the instance counters alike.
    reqs = [Request(i, 0.02 * i, 200 + 37 * (i % 13), 150 + 23 * (i % 11)) for i in range(60)]
    spec = small_spec(
        engine={"gpu_memory_utilization": 0.22}, cluster={"instances": 2, "tp": 1},
        events=[{"at": 3.0, "action": "fail", "instance": 0}], retry={"max_attempts": 1},
        perf={"kind": "roofline", "engine": "distserve"},  # the counts below are its steps'
    )  # fmt: skip
    rows: list[dict] = []
    result = Simulation(spec, requests=reqs, on_row=rows.append).run()
    failed = [r for r in rows if r["status"] == "failed"]
    assert failed and sum(r["preemptions"] for r in failed) > 0
    per_request = sum(r["preemptions"] for r in rows)
    assert result.summary["preemptions"] == per_request == 17
    assert per_request == sum(i["preemptions"] for i in result.instance_rows)
