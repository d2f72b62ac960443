"""The trace recorder and its Chrome trace-event export."""

from __future__ import annotations

import json
from dataclasses import dataclass

import helpers
import pytest
import simpy

import schedulers.colocated  # noqa: F401 - registers the built-ins when not installed
import schedulers.disagg  # noqa: F401
from twin.cli import main
from twin.net.flows import FlowSpec, Network
from twin.sim.simulation import Simulation
from twin.sim.trace import TraceRecorder, TransferSpan, chrome_trace, write_chrome_trace


def colocated_spec(**over):
    return helpers.small_spec(rate=6.0, requests=60, **over)


def split_spec():
    return colocated_spec(
        cluster={
            "topology": "dgx-h100-ib400",
            "nodes": 2,
            "prefill": {"instances": 1, "tp": 8},
            "decode": {"instances": 1, "tp": 8},
        },
        scheduler="disagg",
    )


def traced(spec, log=None):
    rec = TraceRecorder()
    result = Simulation(spec, trace=rec, log=log).run()
    return rec, result


def _ns(us: float) -> int:
    return round(us * 1000)


def check_trace(doc: dict) -> dict[tuple[int, int], list[dict]]:
    """The format's promises; returns the X events per (pid, tid) but the
    instances' lifetimes, which hold them (spans of one thread nest)."""
    assert doc["displayTimeUnit"] == "ms"
    by_thread: dict[tuple[int, int], list[dict]] = {}
    lifetimes: dict[tuple[int, int], list[dict]] = {}
    for e in doc["traceEvents"]:
        assert e["ph"] in {"X", "M", "i"}
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0
            into = lifetimes if e["cat"] == "lifetime" else by_thread
            into.setdefault((e["pid"], e["tid"]), []).append(e)
    for events in [*by_thread.values(), *lifetimes.values()]:
        for a, b in zip(events, events[1:], strict=False):
            assert _ns(a["ts"]) + _ns(a["dur"]) <= _ns(b["ts"]), (a, b)
    for key, events in by_thread.items():
        if key[0] != 1:
            continue
        for e in events:  # each iteration within one of its instance's lifetimes
            assert any(
                _ns(life["ts"]) <= _ns(e["ts"])
                and _ns(e["ts"]) + _ns(e["dur"]) <= _ns(life["ts"]) + _ns(life["dur"])
                for life in lifetimes[key]
            ), e
    return by_thread


def names(doc: dict) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] in {"process_name", "thread_name"}
    }


def test_a_colocated_run_gives_one_ordered_track_per_instance():
    rec, result = traced(colocated_spec())
    # tracing steps every decode, and changes no result
    assert result.summary == Simulation(colocated_spec()).run().summary
    doc = json.loads(json.dumps(chrome_trace(rec)))
    by_thread = check_trace(doc)
    assert names(doc) == {
        (1, 0): "instances",
        (1, 1): "M0 mixed, node 0",
        (1, 2): "M1 mixed, node 0",
    }
    assert set(by_thread) == {(1, 1), (1, 2)}
    lives = [(e["tid"], e["ts"]) for e in doc["traceEvents"] if e.get("cat") == "lifetime"]
    assert lives == [(1, 0), (2, 0)]  # each up from the start to the run's end
    for inst in result.instance_rows:
        spans = [s for s in rec.iterations if s.instance == inst["id"]]
        assert len(spans) == len(by_thread[(1, inst["id"] + 1)]) == inst["iterations"]
        assert sum(s.dt_s for s in spans) == pytest.approx(inst["busy_s"], rel=1e-12)
    kinds = {e["name"] for events in by_thread.values() for e in events}
    assert kinds <= {"prefill", "decode", "mixed"} and {"prefill", "decode"} <= kinds
    prefilled = sorted(i for s in rec.iterations for i in s.prefill_ids)
    assert prefilled == list(range(60))  # each prompt once: no preemption, no chunking
    assert rec.transfers == []


def test_a_split_run_shows_each_kv_transfer_on_the_pair_track():
    rec, result = traced(split_spec())
    doc = chrome_trace(rec)
    by_thread = check_trace(doc)
    assert names(doc)[(2, 0)] == "links"
    assert names(doc)[(2, 1)] == "P0 -> D1"
    moved = [t for t in rec.transfers if t.label.startswith("kv ")]
    assert len(moved) == 60  # every request's KV moves once
    assert {(t.src, t.dst, t.flows) for t in moved} == {("P0", "D1", 8)}
    assert sum(t.size_bytes for t in moved) == pytest.approx(result.summary["kv_bytes_transferred"])
    link_events = [e for (pid, _), evs in by_thread.items() if pid == 2 for e in evs]
    assert len(link_events) == 60
    assert all(e["cat"] == "transfer" and e["args"]["bytes"] > 0 for e in link_events)
    # a transfer starts after its prompt's prefill starts and ends before its first decode
    first_prefill = {}
    for s in rec.iterations:
        for i in s.prefill_ids:
            first_prefill.setdefault(i, s.start_s)
    for t in moved:
        assert t.start_s >= first_prefill[int(t.label.split()[1])]


def test_same_run_same_bytes(tmp_path):
    a, _ = traced(split_spec())
    b, _ = traced(split_spec())
    pa = write_chrome_trace(a, tmp_path / "a.json")
    pb = write_chrome_trace(b, tmp_path / "b.json")
    assert pa.read_bytes() == pb.read_bytes()
    json.loads(pa.read_text())  # valid JSON


def test_the_log_still_fills_beside_the_trace():
    log_alone: list = []
    Simulation(colocated_spec(), log=log_alone).run()
    log_traced: list = []
    rec, _ = traced(colocated_spec(), log=log_traced)
    assert log_traced == log_alone
    its = [e for e in log_alone if e[1] == "iteration"]
    assert [(round(s.start_s, 9), s.instance) for s in rec.iterations] == [
        (e[0], e[2]) for e in its
    ]


def test_a_recorder_records_one_run():
    rec, _ = traced(colocated_spec())
    with pytest.raises(Exception, match="one simulation"):
        Simulation(colocated_spec(), trace=rec)


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    usable_bytes_s: float = 1e9
    latency_s: float = 1e-6


def test_the_network_tells_its_observer_when_a_transfer_starts_and_is_done():
    seen = []

    class Rec:
        def transfer_started(self, now, t):
            seen.append(("start", now, t.label, t.flow_ends))

        def transfer_ended(self, now, t):
            seen.append(("end", now, t.label, t.end_s, t.flow_ends, t.size_bytes))

    env = simpy.Environment()
    net = Network(env, observer=Rec())
    ab, bc = Link("a", "b"), Link("b", "c")
    net.start([FlowSpec((ab, bc), 1e6), FlowSpec((), 5.0)], label="kv 1")
    env.run()
    end = pytest.approx(1e-3 + 2e-6)
    assert seen == [
        ("start", 0.0, "kv 1", (("a", "c"),)),
        ("end", end, "kv 1", end, (("a", "c"),), 1e6 + 5.0),
    ]


def test_twin_run_trace_out(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["run", "disagg", "--set", "workload.max_requests=20", "--set",
                 "model=llama-3.1-8b", "-q", "--trace-out", str(out)]) == 0  # fmt: skip
    doc = json.loads(out.read_text())
    check_trace(doc)
    assert any(e["ph"] == "X" and e["pid"] == 2 for e in doc["traceEvents"])
    assert main(["run", "--trace-out", str(tmp_path / "no" / "t.json")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_overlapping_transfers_on_one_pair_take_further_lanes():
    rec = TraceRecorder()
    for label, a, b in (("kv 0", 0.0, 2.0), ("kv 1", 1.0, 3.0), ("kv 2", 2.0, 4.0)):
        rec.transfers.append(TransferSpan(label, "P0", "D1", a, b, 10.0, 1))
    doc = chrome_trace(rec)
    by_thread = check_trace(doc)
    assert names(doc)[(2, 1)] == "P0 -> D1" and names(doc)[(2, 2)] == "P0 -> D1 #2"
    assert [e["name"] for e in by_thread[(2, 1)]] == ["kv 0", "kv 2"]
    assert [e["name"] for e in by_thread[(2, 2)]] == ["kv 1"]
