"""The trace recorder and its Chrome trace-event export."""

from __future__ import annotations

import json
from dataclasses import dataclass

import helpers
import pytest
import simpy

import schedulers.colocated  # registers the built-ins when not installed
import schedulers.disagg  # noqa: F401
from twin.cli import main
from twin.net.flows import FlowSpec, Network
from twin.request import Request
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


def check_trace(doc: dict) -> dict[tuple[int, int], list[dict]]:  # noqa: C901
    """The Trace Event Format's rules as Perfetto's JSON importer reads them;
    returns the X events per (pid, tid) but the instances' lifetimes, which
    hold them (spans of one thread nest)."""
    assert doc["displayTimeUnit"] == "ms"
    by_thread: dict[tuple[int, int], list[dict]] = {}
    lifetimes: dict[tuple[int, int], list[dict]] = {}
    last_ts: dict[tuple, float] = {}  # per track: the last timestamp seen
    begun: dict[tuple, dict] = {}  # async slices open: (pid, cat, id, name) -> "b"
    async_ids: set[tuple] = set()
    flows: dict[tuple, dict] = {}  # flows started: (cat, id, name) -> "s"
    flow_ends: list[tuple[dict, dict]] = []
    for e in doc["traceEvents"]:
        ph = e["ph"]
        assert ph in {"X", "M", "i", "C", "b", "e", "s", "f"}, e
        if ph == "M":
            continue
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0, e
        if ph == "C":  # a counter: numeric args, its own track per (pid, name, arg)
            assert e["args"] and all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in e["args"].values()
            ), e
            tracks = [(e["pid"], e["name"], k) for k in e["args"]]
        elif ph in {"b", "e"}:
            tracks = [("async", e["pid"], e["cat"], e["id"])]
        else:
            tracks = [(e["pid"], e["tid"])]
        for track in tracks:
            assert e["ts"] >= last_ts.get(track, 0), (track, e)
            last_ts[track] = e["ts"]
        if ph == "X":
            assert e["dur"] >= 0
            into = lifetimes if e["cat"] == "lifetime" else by_thread
            into.setdefault((e["pid"], e["tid"]), []).append(e)
        elif ph == "b":
            key = (e["pid"], e["cat"], e["id"], e["name"])
            assert key not in async_ids, e  # ids unique
            async_ids.add(key)
            begun[key] = e
        elif ph == "e":
            b = begun.pop((e["pid"], e["cat"], e["id"], e["name"]))  # an e has its b
            assert b["ts"] <= e["ts"]
        elif ph == "s":
            key = (e["cat"], e["id"], e["name"])
            assert key not in flows, e
            flows[key] = e
        elif ph == "f":
            assert e["bp"] == "e"
            flow_ends.append((flows.pop((e["cat"], e["id"], e["name"])), e))
    assert begun == {}, begun  # every b has its e
    assert flows == {}, flows  # every flow start has its finish
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
    for s, f in flow_ends:  # both ends inside an iteration's slice, the start first
        assert s["ts"] <= f["ts"]
        for end in (s, f):
            assert enclosing(by_thread, end) is not None, end
    return by_thread


def enclosing(by_thread: dict, e: dict) -> dict | None:
    """The iteration slice of ``e``'s thread its timestamp falls in."""
    t = _ns(e["ts"])
    for x in by_thread.get((e["pid"], e["tid"]), ()):
        if _ns(x["ts"]) <= t < _ns(x["ts"]) + _ns(x["dur"]):
            return x
    return None


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
    begins = [e for e in doc["traceEvents"] if e["ph"] == "b"]
    assert len(begins) == 60 and not any(pid == 2 for pid, _ in by_thread)
    assert {(e["cat"], e["name"], e["pid"], e["tid"]) for e in begins} == {
        ("transfer", "P0 -> D1", 2, 1)
    }
    assert sorted(e["args"]["label"] for e in begins) == sorted(t.label for t in moved)
    assert all(e["args"]["bytes"] > 0 for e in begins)
    # one flow per hand-off, from the iteration that ended its prompt on P0
    # to the one that gave its first decode token on D1
    starts = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f"}
    assert len(starts) == len(ends) == 60 == len(rec.handoffs)
    for n, (rid, p, d) in enumerate(rec.handoffs, 1):
        assert starts[n]["name"] == ends[n]["name"] == f"kv {rid}"
        assert (starts[n]["tid"], ends[n]["tid"]) == (1, 2)
        assert rid in enclosing(by_thread, starts[n])["args"]["prefill_ids"]
        assert enclosing(by_thread, ends[n])["args"]["decode"] >= 1
        assert rid in rec.iterations[p].prefill_ids and rec.iterations[d].instance == 1
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
    assert any(e["ph"] == "b" and e["pid"] == 2 for e in doc["traceEvents"])
    assert any(e["ph"] == "C" for e in doc["traceEvents"])
    assert any(e["ph"] == "s" for e in doc["traceEvents"])
    assert main(["run", "--trace-out", str(tmp_path / "no" / "t.json")]) == 2
    assert "t.json': no folder" in capsys.readouterr().err


def test_overlapping_transfers_on_one_pair_are_async_slices_with_their_own_ids():
    rec = TraceRecorder()
    for label, a, b in (("kv 0", 0.0, 2.0), ("kv 1", 1.0, 3.0), ("kv 2", 2.0, 4.0)):
        rec.transfers.append(TransferSpan(label, "P0", "D1", a, b, 10.0, 1))
    doc = chrome_trace(rec)
    check_trace(doc)
    assert names(doc)[(2, 1)] == "P0 -> D1" and (2, 2) not in names(doc)
    got = [(e["ph"], e["id"], e["ts"], e.get("args", {}).get("label"))
           for e in doc["traceEvents"] if e["ph"] in "be"]  # fmt: skip
    assert got == [
        ("b", 1, 0, "kv 0"), ("b", 2, 1000000, "kv 1"), ("e", 1, 2000000, None),
        ("b", 3, 2000000, "kv 2"), ("e", 2, 3000000, None), ("e", 3, 4000000, None),
    ]  # fmt: skip


def tiny(spec_data, requests):
    """A run of ``requests`` on the round-number perf model of test_engine."""
    from pathlib import Path

    from test_engine import Linear

    from twin.sim.spec import resolve_spec

    fixed = {"prompt": {"dist": "fixed", "value": 100}, "output": {"dist": "fixed", "value": 8}}
    data = {"model": "llama-3.1-8b", "workload": {"lengths": fixed, "max_requests": 1,
            "arrival": {"process": "poisson", "rate": 1.0}}, **spec_data}  # fmt: skip
    rec = TraceRecorder()
    rows: list[dict] = []
    spec = resolve_spec(data, "t.yaml", Path.cwd())
    Simulation(spec, requests=requests, perf=Linear(), trace=rec, on_row=rows.append).run()
    return rec, {r["id"]: r for r in rows}


def counters(doc: dict) -> dict[tuple[str, str], list[tuple[float, int]]]:
    out: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "C":
            ((k, v),) = e["args"].items()
            out.setdefault((e["name"], k), []).append((e["ts"], v))
    return out


def test_counters_of_a_tiny_colocated_run_change_when_and_as_they_should():
    # 10 ms + 0.1 ms per prompt token + 1 ms per decode sequence; 16-token
    # blocks, so a 100-token prompt takes 7 (its 3 tokens fit in them).
    # R0 (100 + 3) arrives at 0 and computes its prompt to 20 ms; R1
    # (100 + 2) arrives at 5 ms and waits (queued 1) until R0's prompt is
    # done; without chunking R1's prompt runs alone, 20 to 40 ms (14 blocks,
    # 2 running); one step of both, 40 to 52 ms (12 ms), ends R1; R0's last
    # step, 52 to 63 ms, ends R0.
    rec, rows = tiny({"cluster": {"instances": 1}},
                     [Request(0, 0.0, 100, 3), Request(1, 0.005, 100, 2)])  # fmt: skip
    assert rows[1]["finish_s"] == pytest.approx(0.052) and rows[0]["finish_s"] == 0.063
    doc = chrome_trace(rec)
    check_trace(doc)
    assert counters(doc) == {
        ("M0", "kv blocks"): [(0, 7), (20000, 14), (52000, 7), (63000, 0)],
        ("M0", "queued"): [(0, 0), (5000, 1), (20000, 0)],
        ("M0", "running"): [(0, 1), (20000, 2), (52000, 1), (63000, 0)],
    }
    assert [e for e in doc["traceEvents"] if e["ph"] in "sfbe"] == []  # nothing moves


def test_a_tiny_split_run_links_prefill_transfer_and_decode():
    # As above on a prefill and a decode instance (TP4 each, one node): R0's
    # prompt 0 to 20 ms on P0, R1's 20 to 40 ms. The KV moves over NVLink
    # when each prompt is done and lands in the blocks D1 reserved; P0 frees
    # its 7 blocks as it lands; D1 decodes each request from then on.
    rec, rows = tiny(
        {"scheduler": "disagg", "cluster": {"topology": "dgx-h100-ib400", "nodes": 2,
         "prefill": {"instances": 1, "tp": 4}, "decode": {"instances": 1, "tp": 4}}},
        [Request(0, 0.0, 100, 3), Request(1, 0.005, 100, 2)],
    )  # fmt: skip
    doc = chrome_trace(rec)
    by_thread = check_trace(doc)
    us = [round(r["prefill_done_s"] + r["transfer_s"], 9) * 1e6 for r in (rows[0], rows[1])]
    land0, land1 = (round(x, 3) for x in us)
    # each transfer starts after the hand-off's fixed costs (twin.serving.handoff)
    sent = [round(t.start_s * 1e9) / 1000 for t in rec.transfers]
    assert [t.label for t in rec.transfers] == ["kv 0", "kv 1"]
    assert 20000 < sent[0] < land0 and 40000 < sent[1] < land1
    got = counters(doc)
    assert got[("P0", "queued")] == [(0, 0), (5000, 1), (20000, 0)]
    assert got[("P0", "running")] == [(0, 1), (40000, 0)]  # R1 admitted as R0 left
    assert got[("P0", "kv blocks")] == [(0, 7), (20000, 14), (land0, 7), (land1, 0)]
    # D1's reservations show as the first transfer starts; each request runs from its landing
    assert got[("D1", "kv blocks")][:2] == [(0, 0), (round(sent[0], 3), 14)]
    assert got[("D1", "running")][:3] == [(0, 0), (land0, 1), (land1, 2)]
    assert got[("D1", "queued")] == [(0, 0)]
    begins = [(e["id"], e["ts"], e["args"]["label"]) for e in doc["traceEvents"] if e["ph"] == "b"]
    assert begins == [(1, round(sent[0], 3), "kv 0"), (2, round(sent[1], 3), "kv 1")]
    flows = [(e["ph"], e["id"], e["name"], e["tid"], enclosing(by_thread, e)["ts"])
             for e in doc["traceEvents"] if e["ph"] in "sf"]  # fmt: skip
    # R0 decodes at once on idle D1, steps of 11 ms; R1 lands during R0's
    # second step and joins at the next step boundary
    assert land0 + 11000 < land1 < land0 + 22000
    assert sorted(flows) == [
        ("f", 1, "kv 0", 2, land0), ("f", 2, "kv 1", 2, round(land0 + 22000, 3)),
        ("s", 1, "kv 0", 1, 0), ("s", 2, "kv 1", 1, 20000),
    ]  # fmt: skip


def test_a_pipelines_overlapping_micro_batches_take_further_lanes_of_its_instance():
    # with pp = 2 a micro-batch enters the pipeline while the one before is in
    # its second stage: their slices overlap, so they cannot share a thread
    spec = colocated_spec(cluster={"instances": 1, "tp": 2, "pp": 2})
    rec, result = traced(spec)
    doc = json.loads(json.dumps(chrome_trace(rec)))
    by_thread = check_trace(doc)  # every thread's slices nest, lanes' included
    assert names(doc) == {(1, 0): "instances", (1, 1): "M0 mixed, node 0",
                          (1, 2): "M0 mixed, node 0 #2"}  # fmt: skip
    assert len(by_thread[(1, 1)]) + len(by_thread[(1, 2)]) == result.instance_rows[0]["iterations"]
    assert by_thread[(1, 2)]  # the second lane is used
    lives = [e["tid"] for e in doc["traceEvents"] if e.get("cat") == "lifetime"]
    assert lives == [1, 2]  # the lifetime on each lane
