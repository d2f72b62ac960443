"""Client time-outs (``workload.timeout``): a request not finished T after it was
sent is given up wherever it is; its work stops, its KV is freed at that instant,
and it ends once, failed with reason ``timeout``. Exact traces of tiny scenarios
(queued, prefilling, decoding, in a KV hand-off, waiting for an instance, waiting
to be retried), and fast-forward against stepping with time-outs inside stretches.
The random feature space (tests/test_every_feature.py) and the whole-run identity
(tests/test_fastforward.py) draw time-outs too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_engine import Linear, largest_relative_difference

from twin.errors import SpecError
from twin.request import Request
from twin.sim.simulation import Simulation
from twin.sim.spec import resolve_spec

_LINES = {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1}, "max_requests": 1}


def _spec(timeout: str | float | None, **over: Any):
    workload = dict(_LINES) | ({"timeout": timeout} if timeout is not None else {})
    data: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "cluster": {"instances": 1, "tp": 1},
        "workload": workload,
    }
    data.update(over)
    return resolve_spec(data, "timeouts.yaml", Path.cwd())


def _run(spec, reqs, **kw):
    log: list[tuple] = []
    rows: list[dict] = []
    sim = Simulation(spec, requests=reqs, perf=Linear(), log=log, on_row=rows.append, **kw)
    result = sim.run()
    return sim, result, log, {r["id"]: r for r in rows}


def _freed(sim: Simulation) -> None:
    for e in sim.engines:
        cached = e.cache.cached_blocks if e.cache is not None else 0
        assert e.kv.free + cached == e.kv.total and not e.holds_work(), e.id


def test_time_outs_while_decoding_queued_and_prefilling_exact_trace():
    """One instance, one sequence at a time (Linear: 10 ms + 0.1 ms a prompt
    token + 1 ms a decode). r0 is decoding at 100 ms (its 8th token is out, the
    step under way runs on without it); r1, queued behind it, gives up at 105 ms;
    r2's 3,000-token prompt (310 ms) is cut at 300 ms, its chunk wasted."""
    reqs = [Request(0, 0.0, 100, 50), Request(1, 0.005, 50, 2), Request(2, 0.2, 3000, 5)]
    sim, result, log, rows = _run(_spec("100 ms", engine={"max_num_seqs": 1}), reqs)
    decode = [(round(0.02 + 0.011 * k, 9), "iteration", 0, (), 1) for k in range(8)]
    assert log == [
        (0, "arrive", -1, 0),
        (0, "iteration", 0, (0,), 0),  # r0's prompt: 10 + 10 ms
        (0.005, "arrive", -1, 1),
        *decode,  # r0 alone (max_num_seqs 1): 11 ms a step, the 8th from 97 ms
        (0.1, "fail", 0, 0),  # decoding: gone from the step under way on
        (0.105, "fail", 0, 1),  # still queued
        (0.2, "arrive", -1, 2),
        (0.2, "iteration", 0, (2,), 0),
        (0.3, "fail", 0, 2),  # prefilling: the iteration ends with nothing to apply
    ]
    assert [rows[i]["reason"] for i in range(3)] == ["timeout"] * 3
    # r0's KV: its prompt and the 8 tokens out by then, less the one not yet fed back
    assert rows[0]["lost_tokens"] == 100 + 8 - 1
    assert rows[1]["lost_tokens"] == rows[2]["lost_tokens"] == 0  # its chunk never ended
    assert rows[0]["time_lost_s"] == pytest.approx(0.1)
    assert result.summary["failed_by_reason"] == {"timeout": 3}
    assert result.summary["completed"] == 0 and result.summary["requests"] == 3
    _freed(sim)


def test_a_request_done_before_its_time_out_is_left_alone():
    """A time-out later than every request's end changes nothing but the spec."""
    reqs = [Request(0, 0.0, 100, 50), Request(1, 0.005, 50, 2), Request(2, 0.2, 3000, 5)]
    over = {"engine": {"max_num_seqs": 1}}
    _, without, log0, rows0 = _run(_spec(None, **over), reqs)
    _, late, log1, rows1 = _run(_spec("10 s", **over), reqs)
    assert log1 == log0 and rows1 == rows0
    assert late.summary["failed"] == 0 and late.summary["completed"] == 3
    assert late.summary["e2e_s"] == without.summary["e2e_s"]


def _split(timeout: float | None):
    return _spec(
        timeout,
        cluster={"topology": "dgx-h100-ib400", "nodes": 2, "tp": 1, "prefill": 1, "decode": 1,
                 "placement": "interleaved"},
        scheduler="disagg",
    )  # fmt: skip


def test_a_time_out_during_the_hand_off_stops_the_transfer_and_frees_both_sides():
    """An 8,000-token prompt prefills for 810 ms; its 1 GB of KV crosses NVLink
    (360 GB/s) from 810 ms to about 814 ms. Given up at 812 ms, the transfer
    stops where it is, neither side holds a block and the decode side never
    runs it."""
    reqs = [Request(0, 0.0, 8000, 20)]
    _, whole, _, rows = _run(_split(None), reqs)
    assert rows[0]["status"] == "completed"
    start, end = 0.81, rows[0]["first_token_s"]  # ttft_at decode: the landing
    assert start < 0.812 < end
    sim, cut, log, rows = _run(_split(0.812), reqs)
    assert log == [
        (0, "arrive", -1, 0),
        (0, "iteration", 0, (0,), 0),
        (0.81, "handoff", 0, 0),
        (0.812, "fail", 0, 0),  # ended on its prefill instance, which held its KV
    ]
    assert rows[0]["reason"] == "timeout" and rows[0]["lost_tokens"] == 8000
    moved = {(r["src"], r["dst"]): r["bytes"] for r in cut.to_dict()["links"]}
    full = {(r["src"], r["dst"]): r["bytes"] for r in whole.to_dict()["links"]}
    assert moved.keys() == full.keys()
    for k, b in moved.items():  # the flows stopped at 2 of their 4 ms
        assert 0 < b < 0.6 * full[k], k
    _freed(sim)
    assert sim.handoff is not None and not any(sim.handoff.pending)


def _failed_under(repair: str, backoff: str):
    """r0 decoding and r1 queued on the one instance, which fails at 50 ms and
    is repaired at ``repair``; a retry waits ``backoff``; time-outs of 300 ms."""
    reqs = [Request(0, 0.0, 100, 50), Request(1, 0.005, 50, 2)]
    events = [{"at": "50 ms", "action": "fail", "instance": 0},
              {"at": repair, "action": "recover", "instance": 0}]  # fmt: skip
    retry = {"max_attempts": 3, "backoff": backoff}
    return _run(_spec("300 ms", engine={"max_num_seqs": 1}, events=events, retry=retry), reqs)


def test_a_time_out_while_waiting_for_an_instance_or_a_retry():
    """The only instance fails at 50 ms under r0 (decoding) and r1 (queued) and
    is repaired at 1 s. r0 waits 400 ms to be retried and gives up at 300 ms,
    before its retry; r1 (retried at once) finds no instance up, waits for one,
    and gives up at 305 ms. Both end once, at their time-outs, on no instance."""
    sim, result, log, rows = _failed_under("1 s", "0 s")
    ends = [e for e in log if e[1] == "fail"]
    assert ends == [(0.3, "fail", -1, 0), (0.305, "fail", -1, 1)]
    assert {rows[i]["reason"] for i in (0, 1)} == {"timeout"}
    # its one attempt (a retry that finds no instance up is not one) held 3 tokens
    assert rows[0]["attempts"] == 1 and rows[0]["lost_tokens"] == 100 + 3 - 1
    _freed(sim)

    sim, result, log, rows = _failed_under("60 ms", "400 ms")
    assert log == [
        (0, "arrive", -1, 0),
        (0, "iteration", 0, (0,), 0),
        (0.005, "arrive", -1, 1),
        (0.02, "iteration", 0, (), 1),
        (0.031, "iteration", 0, (), 1),
        (0.042, "iteration", 0, (), 1),
        (0.3, "fail", -1, 0),  # both waited to be retried at 450 ms
        (0.305, "fail", -1, 1),
    ]
    assert result.summary["failed_by_reason"] == {"timeout": 2}
    _freed(sim)


def _long_decodes(ff: bool, timeout: float | None):
    """Four requests decoding together for hundreds of steps, a time-out
    falling inside the stretches fast-forward makes."""
    reqs = [Request(i, 0.3 * i, 200 + 50 * i, 400 - 60 * i) for i in range(4)]
    spec = _spec(timeout, engine={"fast_forward": ff, "chunked_prefill": True})
    rows: list[dict] = []
    sim = Simulation(spec, requests=reqs, perf=Linear(per_context=1e-6), on_row=rows.append)
    res = sim.run().to_dict()
    del res["header"]  # names fast_forward
    return {"result": res, "rows": sorted(rows, key=lambda r: r["id"])}, sim.events


@pytest.mark.parametrize("timeout", [0.5, 1.2345, 3.0, 4.4, 5.5])
def test_a_time_out_inside_a_stretch_is_where_the_stretch_stops(timeout):
    """Time-outs that fall mid-step inside fast-forwarded stretches give, to
    the last bit, what stepping gives, in fewer events."""
    stepped, n_stepped = _long_decodes(False, timeout)
    jumped, n_jumped = _long_decodes(True, timeout)
    worst, where = largest_relative_difference(jumped, stepped)
    assert worst == 0.0, f"largest relative difference {worst:.3g} at {where}"
    assert jumped == stepped
    assert n_jumped < n_stepped / 5
    assert any(r["reason"] == "timeout" for r in stepped["rows"])


@pytest.mark.parametrize("value", ["-1 s", 0, "soon"])
def test_a_bad_time_out_is_refused_naming_the_key(value):
    with pytest.raises(SpecError, match=r"timeouts.yaml: workload.timeout") as e:
        _spec(value)
    assert repr(value) in str(e.value) or str(value) in str(e.value)
