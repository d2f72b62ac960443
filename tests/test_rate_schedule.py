"""``workload.rate_schedule``: the multiplier m(t) on the arrival rate, applied by time
warping (t = M^-1(u)); window counts, hand-warped traces, M and M^-1, errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twin.cli import main
from twin.errors import SpecError
from twin.request import Request
from twin.workload.schedule import Bursts, Diurnal, Piecewise, parse_rate_schedule
from twin.workload.stream import WorkloadSpec, iter_requests

FIXED = {"prompt": {"dist": "fixed", "value": 8}, "output": {"dist": "fixed", "value": 2}}


def run(m: dict, seed: int = 0, base_dir: Path | None = None) -> list[Request]:
    spec = WorkloadSpec.from_mapping(m, "w", base_dir)
    return list(iter_requests(spec, np.random.default_rng(seed)))


def times(reqs: list[Request]) -> list[float]:
    return [r.arrival_s for r in reqs]


def splitwise(tmp_path: Path, arrivals: list[float]) -> Path:
    rows = [f"{i},2,0,{t},1,{100 + i},{1 + i}" for i, t in enumerate(arrivals)]
    head = "request_id,request_type,application_id,arrival_timestamp,batch_size,"
    path = tmp_path / "tiny.csv"
    path.write_text(head + "prompt_size,token_size\n" + "\n".join(rows) + "\n")
    return path


# -- Poisson: the count in each window is Poisson with mean rate x integral of m ---------
SCHEDULES = {
    "steps": {"kind": "steps", "points": [[0, 1.0], ["10 s", 3.0], ["20 s", 0.0], ["25 s", 0.5]]},
    "linear": {"kind": "linear", "points": [[0, 0.0], ["20 s", 2.0], ["40 s", 0.5]]},
    "diurnal": {"kind": "diurnal", "period": "20 s", "min": 0.0, "max": 2.0, "peak": "5 s"},
    "bursts": {"kind": "bursts", "on": "3 s", "off": "5 s", "high": 4.0, "low": 0.25},
}


def _integral(rate, a: float, b: float) -> float:
    """The integral of ``rate`` over [a, b] by the midpoint rule on 20,000 cells
    (not the schedule's own M)."""
    edges = np.linspace(a, b, 20_001)
    mid = 0.5 * (edges[1:] + edges[:-1])
    return float(np.sum(rate(mid)) * (b - a) / 20_000)


@pytest.mark.parametrize("kind", list(SCHEDULES))
def test_poisson_counts_per_window_follow_the_integral_of_the_rate(kind):
    base = 200.0  # req/s; 40 s gives ~8,000 to 16,000 arrivals
    m = {"lengths": FIXED, "arrival": {"process": "poisson", "rate": base}, "duration": "40 s",
         "rate_schedule": SCHEDULES[kind]}  # fmt: skip
    t = np.array(times(run(m, seed=3)))
    assert t.max() < 40 and np.all(np.diff(t) >= 0)
    rate = parse_rate_schedule(SCHEDULES[kind], "w").rate
    edges = np.arange(0.0, 40.5, 2.0)
    # bursts switch at 3 s and 8 s: 1 s windows keep each window inside one level
    if kind == "bursts":
        edges = np.arange(0.0, 40.5, 1.0)
    counts = np.histogram(t, bins=edges)[0]
    for a, b, n in zip(edges[:-1], edges[1:], counts, strict=True):
        mean = base * _integral(rate, a, b)
        # Poisson: sd = sqrt(mean); 5 sd, plus the midpoint rule's error
        assert abs(n - mean) <= 5 * math.sqrt(mean) + 1e-3 * mean + 1e-9, (kind, a, b, n, mean)
    if kind == "steps":  # nothing arrives while m = 0
        assert not np.any((t >= 20) & (t < 25))


def test_poisson_counts_are_poisson_across_seeds():
    """Warped Poisson is Poisson: over seeds, a window's count has variance = mean."""
    m = {"lengths": FIXED, "arrival": {"process": "poisson", "rate": 10.0}, "duration": "10 s",
         "rate_schedule": {"kind": "linear", "points": [[0, 0.5], ["8 s", 2.5]]}}  # fmt: skip
    spec = WorkloadSpec.from_mapping(m, "w")
    counts = np.array([
        sum(4 <= r.arrival_s < 10 for r in iter_requests(spec, np.random.default_rng(s)))
        for s in range(200)
    ])  # fmt: skip
    # m = 0.5 + t / 4 on [0, 8), then 2.5: its integral over [4, 10) is 2 x 4 + 2.5 x 2 = 13
    mean = 10.0 * 13
    assert counts.mean() == pytest.approx(mean, rel=0.03)  # sd of the mean: 0.6 %
    # the sample variance / mean has sd sqrt(2 / 199) = 0.1: 3 sd
    assert counts.var(ddof=1) / counts.mean() == pytest.approx(1.0, abs=0.3)


def test_gamma_gaps_keep_their_cv_in_warped_time():
    """Gamma arrivals: the gaps of M(t) (base-rate time) are the base process's."""
    sched = {"kind": "diurnal", "period": "60 s", "min": 0.2, "max": 1.8}
    m = {"lengths": FIXED, "arrival": {"process": "gamma", "rate": 50.0, "cv": 2.0},
         "max_requests": 50_000, "rate_schedule": sched}  # fmt: skip
    t = np.array(times(run(m, seed=5)))
    u = parse_rate_schedule(sched, "w").cumulative(t)
    g = np.diff(np.concatenate(([0.0], u)))
    assert 1 / g.mean() == pytest.approx(50.0, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(2.0, rel=0.05)
    plain = {k: v for k, v in m.items() if k != "rate_schedule"}
    assert np.allclose(u, times(run(plain, seed=5)), rtol=1e-9, atol=1e-9)


# -- traces: exact warped times by hand ----------------------------------------------------
def test_a_trace_is_warped_through_steps_by_hand(tmp_path):
    path = splitwise(tmp_path, [0, 1, 3, 6, 10])
    sched = {"kind": "steps", "points": [[0, 1.0], ["2 s", 2.0], ["4 s", 0.5]]}
    # M(t) = t on [0, 2), 2 + 2 (t - 2) on [2, 4) (M(4) = 6), 6 + (t - 4) / 2 after
    reqs = run({"trace": str(path), "rate_schedule": sched})
    assert times(reqs) == [0.0, 1.0, 2.5, 4.0, 12.0]
    assert [r.prompt_tokens for r in reqs] == [100, 101, 102, 103, 104]  # order kept
    # rate_scale first: u = t / 2 = 0, 0.5, 1.5, 3, 5 -> 0, 0.5, 1.5, 2.5, 3.5
    reqs = run({"trace": str(path), "rate_scale": 2.0, "rate_schedule": sched})
    assert times(reqs) == [0.0, 0.5, 1.5, 2.5, 3.5]
    # duration is on the warped clock: 12.0 is cut, 4.0 kept
    reqs = run({"trace": str(path), "rate_schedule": sched, "duration": "5 s"})
    assert times(reqs) == [0.0, 1.0, 2.5, 4.0]


def test_a_trace_is_warped_through_a_linear_ramp_by_hand(tmp_path):
    path = splitwise(tmp_path, [0, 1.25, 3, 8, 14])
    sched = {"kind": "linear", "points": [[0, 1.0], ["4 s", 3.0]]}
    # m = 1 + t / 2 on [0, 4): M = t + t^2 / 4, M^-1(u) = 2 sqrt(1 + u) - 2; M(4) = 8;
    # then m = 3: M^-1(u) = 4 + (u - 8) / 3
    assert times(run({"trace": str(path), "rate_schedule": sched})) == pytest.approx(
        [0.0, 1.0, 2.0, 4.0, 6.0], abs=1e-12
    )


def test_skip_comes_before_the_schedule_and_zero_windows_hold_arrivals(tmp_path):
    path = splitwise(tmp_path, [5, 6, 7, 8, 9])
    sched = {"kind": "steps", "points": [[0, 1.0], ["2 s", 0.0], ["5 s", 1.0]]}
    # skip 1: 6, 7, 8, 9 -> 0, 1, 2, 3; M = t, then flat at 2 over [2, 5), then 2 + (t - 5)
    reqs = run({"trace": str(path), "skip": 1, "rate_schedule": sched})
    assert times(reqs) == [0.0, 1.0, 5.0, 6.0]  # u = 2 waits for the end of the 0 window
    assert [r.prompt_tokens for r in reqs] == [101, 102, 103, 104]


def test_a_schedule_ending_at_zero_ends_the_stream():
    sched = {"kind": "linear", "points": [[0, 1.0], ["3 s", 0.0]]}  # M(inf) = 1.5
    reqs = run({"lengths": FIXED, "arrival": {"process": "poisson", "rate": 20.0},
                "max_requests": 10_000, "rate_schedule": sched})  # fmt: skip
    assert 0 < len(reqs) < 100 and all(r.arrival_s < 3 for r in reqs)


def test_no_schedule_or_a_constant_one_changes_nothing_and_lengths_never_move():
    m = {"lengths": "azure-conv", "arrival": {"process": "gamma", "rate": 8.0, "cv": 1.5},
         "max_requests": 5000}  # fmt: skip
    plain = run(m, seed=7)
    assert run({**m, "rate_schedule": None}, seed=7) == plain
    assert run({**m, "rate_schedule": {"kind": "steps", "points": [[0, 1]]}}, seed=7) == plain
    peak = run({**m, "rate_schedule": SCHEDULES["bursts"]}, seed=7)
    assert [(r.prompt_tokens, r.output_tokens) for r in peak] == [
        (r.prompt_tokens, r.output_tokens) for r in plain
    ]
    assert times(peak) != times(plain)


# -- M and M^-1 ----------------------------------------------------------------------------
_MULT = st.one_of(st.just(0.0), st.floats(0.01, 100.0))


@st.composite
def schedules(draw):
    kind = draw(st.sampled_from(["steps", "linear", "diurnal", "bursts"]))
    if kind in ("steps", "linear"):
        gaps = draw(st.lists(st.floats(0.01, 1000.0), min_size=0, max_size=6))
        ts = tuple(float(x) for x in np.concatenate(([0.0], np.cumsum(gaps))))
        vs = draw(st.lists(_MULT, min_size=len(ts), max_size=len(ts)))
        if not any(v > 0 for v in vs):
            vs[-1] = 1.0
        return Piecewise(kind, ts, tuple(vs))
    if kind == "diurnal":
        hi = draw(st.floats(0.01, 100.0))
        lo = draw(st.floats(0.0, 1.0)) * hi
        return Diurnal(draw(st.floats(1.0, 1e5)), lo, hi, draw(st.floats(0.0, 1e5)))
    hi, lo = draw(_MULT), draw(_MULT)
    if hi == lo == 0:
        hi = 2.0
    return Bursts(draw(st.floats(0.01, 1000.0)), draw(st.floats(0.01, 1000.0)), hi, lo)


@settings(max_examples=300, deadline=None)
@given(schedules(), st.lists(st.floats(0.0, 1e5), min_size=1, max_size=20))
def test_cumulative_and_inverse_undo_each_other(sched, ts):
    t = np.array(ts)
    big = np.max(np.abs(sched.cumulative(np.array([0.0, 1e5, 2e5])))) + 1.0
    u = sched.cumulative(t)
    assert np.all(np.diff(sched.cumulative(np.sort(t))) >= -1e-9 * big)  # non-decreasing
    back = sched.inverse(u)
    finite = np.isfinite(back)
    # M(M^-1(u)) = u wherever M^-1(u) is finite (it is not only past a schedule's end at 0)
    assert np.allclose(sched.cumulative(back[finite]), u[finite], rtol=1e-9, atol=1e-9 * big)
    # M^-1(M(t)) = t where m > 0 on [t, t + d] (M rises right after t; on a flat stretch
    # of M it is either end, as rounding of u falls)
    m = sched.rate(t)
    after = sched.rate(t + 1e-6 * (1 + t))
    floor = 0.05 * max(m.max(), 1e-300)
    live = finite & (m > floor) & (after > floor)
    assert np.allclose(back[live], t[live], rtol=1e-7, atol=2e-6 * big / np.maximum(m[live], 1))


def test_diurnal_cumulative_is_the_closed_form_by_hand():
    d = Diurnal(period_s=24 * 3600.0, low=0.3, high=1.0, peak_s=14 * 3600.0)
    assert float(d.rate(14 * 3600.0)) == pytest.approx(1.0)
    assert float(d.rate(2 * 3600.0)) == pytest.approx(0.3)
    # one period integrates to the mean (0.65) x 24 h; half a period from the trough: 0.65 x 12 h
    assert float(d.cumulative(24 * 3600.0)) == pytest.approx(0.65 * 24 * 3600)
    half = d.cumulative(14 * 3600.0) - d.cumulative(2 * 3600.0)
    assert float(half) == pytest.approx(0.65 * 12 * 3600)
    assert float(d.inverse(d.cumulative(20 * 3600.0))) == pytest.approx(20 * 3600.0, abs=1e-6)


# -- errors --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sched", "message"),
    [
        ({"kind": "steps", "points": [[0, 1], ["10 s", 2], ["5 s", 1]]},
         "w.rate_schedule.points[2]: time 5.0 s is not after the previous point's 10.0 s"),
        ({"kind": "linear", "points": [[0, 1], ["1 min", -2]]},
         "w.rate_schedule.points[1] multiplier: -2 must be a number >= 0"),
        ({"kind": "steps", "points": [[0, 0], ["1 min", 0]]},
         "w.rate_schedule: every multiplier is 0: no request would ever arrive"),
        ({"kind": "bursts", "on": "1 s", "off": "1 s", "high": 0, "low": 0},
         "w.rate_schedule: high and low are both 0"),
        ({"kind": "sine", "period": "1 h"},
         "w.rate_schedule.kind: 'sine' unknown; expected one of steps, linear, diurnal, bursts"),
        ({"points": [[0, 1]]}, "w.rate_schedule.kind: missing; expected one of steps"),
        ({"kind": "steps", "points": [["1 s", 1]]},
         "w.rate_schedule.points[0]: the first point is at 1.0 s; it must be at 0 s"),
        ({"kind": "steps", "points": [[0, 1, 2]]},
         "w.rate_schedule.points[0]: [0, 1, 2] is not a [time, multiplier] pair"),
        ({"kind": "steps", "points": [["soon", 1]]},
         "w.rate_schedule.points[0] time: 'soon' is not a duration"),
        ({"kind": "steps", "points": []}, "w.rate_schedule.points: [] is not a list of"),
        ({"kind": "diurnal", "period": "1 h", "min": 2, "max": 1},
         "w.rate_schedule.min: 2.0 must be >= 0 and <= max (1.0)"),
        ({"kind": "diurnal", "period": "0 s", "min": 0, "max": 1},
         "w.rate_schedule.period: '0 s' must be > 0"),
        ({"kind": "bursts", "on": "30 s", "off": "90 s"},
         "w.rate_schedule: missing 'high'"),
        ({"kind": "bursts", "on": "30 s", "off": "90 s", "high": 2, "peak": 1},
         "w.rate_schedule: unknown key 'peak'"),
        ("2x", "w.rate_schedule: '2x' is not a mapping; expected {kind: steps | linear"),
    ],
)  # fmt: skip
def test_bad_schedules_name_the_key_and_value(sched, message):
    with pytest.raises(SpecError) as e:
        run({"lengths": FIXED, "arrival": {"process": "poisson", "rate": 1.0},
             "max_requests": 5, "rate_schedule": sched})  # fmt: skip
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_a_bad_schedule_on_the_command_line_is_one_line_and_exit_2(capsys):
    bad = "workload.rate_schedule={kind: steps, points: [[0 s, 1.0], [10 s, -2]]}"
    assert main(["spec", "quickstart", "--set", bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: quickstart.yaml: workload.rate_schedule.points[1]")
    assert err.count("\n") == 1
