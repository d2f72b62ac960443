"""A timeline keeps only the windows in which something happened: a long span
(a retry's backoff of years, a GPU slowed a billion-fold, windows of a
nanosecond) costs what happened in it, and a stretch of windows in which
nothing happened gives the rows every window of it would."""

from __future__ import annotations

import signal
from contextlib import contextmanager

import helpers
import pytest

import schedulers.colocated  # noqa: F401 - registers the built-ins when not installed
from twin.serving.observer import InstanceInfo
from twin.sim import timeline as tl
from twin.sim.simulation import Simulation
from twin.sim.timeline import Timeline


@contextmanager
def within(seconds: int):
    """Fail, rather than run on, past ``seconds`` of wall time."""

    def late(_signum, _frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def two_requests(window_s: float, queued_until: float) -> list[dict]:
    """r0 arrives at 0.2 and is served at once; r1 arrives at 0.5 and waits
    for its prefill until ``queued_until``; one instance of 2 GPUs."""
    t = Timeline(window_s)
    t.start([InstanceInfo(0, "mixed", 0, (0, 1))])
    t.arrived(0.2)
    t.arrived(0.5)
    t.completed(0.2, 0.9, ttft=0.2, tpot=0.01, met=True, scheduled=0.3, landed=-1.0,
                decode_start=-1.0)  # fmt: skip
    end = queued_until + 0.2
    t.completed(0.5, end, ttft=end - 0.5, tpot=0.01, met=False, scheduled=queued_until,
                landed=-1.0, decode_start=-1.0)  # fmt: skip
    return t.rows(end)


QUIET = {"arrived": 0, "completed": 0, "rejected": 0, "failed": 0, "slo_met": 0,
         "slo_attainment": None, "ttft_p50_s": None, "ttft_p99_s": None, "tpot_p50_s": None,
         "tpot_p99_s": None, "finished": 0, "queued": 1.0, "decode_queued": 0.0,
         "instances_mixed": 1.0, "instances_prefill": 0.0, "instances_decode": 0.0,
         "gpus_up": 2.0, "transfer_p50_s": None}  # fmt: skip


def test_a_short_quiet_stretch_keeps_a_row_per_window():
    rows = two_requests(1.0, 60.5)
    assert [r["start_s"] for r in rows] == [float(k) for k in range(61)]
    for k, r in enumerate(rows[1:60], 1):
        assert r == {"start_s": float(k), "end_s": k + 1.0, **QUIET}


def test_a_long_quiet_stretch_is_one_row_with_each_windows_figures():
    rows = two_requests(1.0, 1e6 + 0.5)
    assert [(r["start_s"], r["end_s"]) for r in rows] == [
        (0.0, 1.0), (1.0, 1e6), (1e6, 1e6 + 0.7)
    ]  # fmt: skip
    assert rows[1] == {"start_s": 1.0, "end_s": 1e6, **QUIET}
    assert rows[0]["arrived"] == 2 and rows[0]["queued"] == pytest.approx(0.1 + 0.5)
    assert rows[2]["finished"] == 1 and rows[2]["queued"] == pytest.approx(0.5 / 0.7)


def test_the_long_stretch_row_is_what_its_windows_would_show(monkeypatch):
    short = two_requests(1.0, 400.5)
    monkeypatch.setattr(tl, "GAP_ROWS", 10**9)
    every = two_requests(1.0, 400.5)
    assert len(short) == 3 and len(every) == 401
    assert every[0] == short[0] and every[-1] == short[-1]
    for r in every[1:-1]:
        assert {**r, "start_s": 1.0, "end_s": 400.0} == short[1]


@pytest.mark.parametrize("window_s", [1e-9, 10.0])
def test_a_span_of_a_billion_seconds_costs_what_happened_in_it(window_s):
    with within(20):
        rows = two_requests(window_s, 1e9)
    assert len(rows) <= 2 * tl.GAP_ROWS + 5
    assert sum(r["arrived"] for r in rows) == 2 and sum(r["finished"] for r in rows) == 2
    assert rows[0]["start_s"] == 0.0 and rows[-1]["end_s"] == 1e9 + 0.2


FAIL = [{"at": "0.5 s", "action": "fail", "instance": 0},
        {"at": "0.6 s", "action": "recover", "instance": 0}]  # fmt: skip


@pytest.mark.parametrize(
    "over",
    [
        {"events": FAIL, "retry": {"max_attempts": 2, "backoff": "1e9 s"}},
        {"events": [{"at": "0.5 s", "action": "degrade", "gpu": 0, "factor": 1e-9}]},
        {"output": {"window": "1 ns"}},
    ],
    ids=["backoff-1e9-s", "gpu-1e-9-speed", "window-1-ns"],
)
def test_a_run_with_a_huge_span_of_windows_finishes_fast_and_small(over):
    spec = helpers.small_spec(rate=20.0, requests=40, **over)
    with within(60):
        result = Simulation(spec).run()
    rows = result.timeline_rows
    windows = (rows[-1]["end_s"] - rows[0]["start_s"]) / spec.window_s
    assert windows > 1e6  # the span, in windows
    assert len(rows) < 200 * (tl.GAP_ROWS + 1)
    assert sum(r["arrived"] for r in rows) == 40
    assert sum(r["finished"] for r in rows) == 40
    assert all(a["end_s"] == b["start_s"] for a, b in zip(rows, rows[1:], strict=False))
