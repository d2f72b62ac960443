"""Failures and degradation: the events: timeline, retries, and what is never lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import Linear

from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import ClusterView, FaultEvent, InstanceSnapshot
from twin.sim.simulation import Simulation
from twin.sim.spec import resolve_spec

WORKLOAD = {
    "lengths": {"prompt": {"dist": "fixed", "value": 100}, "output": {"dist": "fixed", "value": 8}},
    "arrival": {"process": "poisson", "rate": 10.0},
    "max_requests": 10,
}


def spec(**over):
    data = {"model": "llama-3.1-8b", "cluster": {"instances": 2}, "workload": WORKLOAD}
    data.update(over)
    return resolve_spec(data, "f.yaml", Path.cwd())


def split(**over):
    cluster = {
        "topology": "dgx-h100-ib400",
        "nodes": 2,
        "prefill": {"instances": 2, "tp": 4},
        "decode": {"instances": 2, "tp": 4},
    }
    over.setdefault("cluster", cluster)
    return spec(scheduler="disagg", **over)


def run(s, requests=None, perf=None, scheduler=None):
    rows: list[dict] = []
    sim = Simulation(s, requests=requests, on_row=rows.append, perf=perf, scheduler=scheduler)
    result = sim.run()
    return sim, result, {r["id"]: r for r in rows}


@pytest.mark.parametrize("ff", [True, False])
def test_a_request_whose_instance_fails_mid_decode_is_retried_elsewhere(ff):
    # Linear: prefill 10 ms + 0.1 ms/token, a decode step 10 ms + 1 ms/sequence.
    # Instance 0: the 100-token prompt ends at 0.02 (token 1); steps end at
    # 0.031 (token 2) and 0.042 (token 3); the one to 0.053 is cut by the
    # failure at 0.05. The retry goes to instance 1 at once and prefills the
    # prompt and the 3 tokens seen (103 tokens: 20.3 ms), producing token 4 at
    # 0.0703; tokens 5..11 take 7 steps of 11 ms: done at 0.1473.
    s = spec(
        events=[{"at": 0.05, "action": "fail", "instance": 0}],
        engine={"fast_forward": ff},
    )
    sim, result, rows = run(s, requests=[Request(0, 0.0, 100, 11)], perf=Linear())
    r = rows[0]
    assert r["status"] == "completed"
    assert r["instance"] == r["prefill_instance"] == 1
    assert r["scheduled_s"] == 0.0
    assert r["prefill_done_s"] == pytest.approx(0.02)
    assert r["first_token_s"] == pytest.approx(0.02)
    assert r["finish_s"] == pytest.approx(0.1473)
    assert r["ttft_s"] == pytest.approx(0.02)
    assert r["tpot_s"] == pytest.approx((0.1473 - 0.02) / 10)
    assert r["max_itl_s"] == pytest.approx(0.0703 - 0.042)  # the stall of the retry
    assert r["attempts"] == 2
    assert r["lost_tokens"] == 100 + 3 - 1  # the prompt's and tokens 1-2's KV
    assert r["time_lost_s"] == pytest.approx(0.05)
    assert result.summary["retries"] == 1
    assert result.summary["failed"] == 0
    assert sim.engines[0].up is False and sim.engines[0].kv.free == sim.engines[0].kv.total


def test_retries_are_bounded_by_attempts_backoff_and_deadline():
    reqs = [Request(0, 0.0, 100, 11)]
    fail0 = {"at": 0.05, "action": "fail", "instance": 0}
    fail1 = {"at": 0.06, "action": "fail", "instance": 1}
    _, res, rows = run(spec(events=[fail0], retry={"max_attempts": 1}), reqs, Linear())
    assert rows[0]["status"] == "failed" and rows[0]["reason"] == "max_attempts"
    assert res.summary["failed_by_reason"] == {"max_attempts": 1}
    # Both fail: the retry waits for a recovery (1 s), then runs on instance 0.
    ev = [fail0, fail1, {"at": 1.0, "action": "recover", "instance": 0}]
    _, _, rows = run(spec(events=ev), reqs, Linear())
    assert rows[0]["status"] == "completed" and rows[0]["instance"] == 0
    assert rows[0]["finish_s"] == pytest.approx(1.0 + 0.0203 + 0.077)
    # ... unless the deadline comes first.
    _, _, rows = run(spec(events=ev, retry={"deadline": "0.5 s"}), reqs, Linear())
    assert rows[0]["status"] == "failed" and rows[0]["reason"] == "retry_deadline"
    # Nothing ever comes back.
    _, res, rows = run(spec(events=[fail0, fail1]), reqs, Linear())
    assert rows[0]["reason"] == "no_instance_up" and res.summary["failed"] == 1
    # Backoff: 0.1 s before the retry.
    _, _, rows = run(spec(events=[fail0], retry={"backoff": "100 ms"}), reqs, Linear())
    assert rows[0]["finish_s"] == pytest.approx(0.15 + 0.0203 + 0.077)


def test_a_degraded_gpu_runs_its_iterations_slower():
    reqs = [Request(0, 0.0, 100, 1)]
    ev = [{"at": 0.0, "action": "degrade", "gpu": 0, "factor": 0.5}]
    _, _, rows = run(spec(events=ev, cluster={"instances": 1}), reqs, Linear())
    assert rows[0]["finish_s"] == pytest.approx(0.04)
    ev.append({"at": 0.0, "action": "restore", "gpu": 0})
    _, _, rows = run(spec(events=ev, cluster={"instances": 1}), reqs, Linear())
    assert rows[0]["finish_s"] == pytest.approx(0.02)


def test_a_degraded_link_reshares_its_flows():
    # One prompt's KV crosses n0 -> n1 on NIC 0's path; a tenth of the
    # bandwidth on that NIC's uplink makes the transfer about ten times longer.
    reqs = [Request(0, 0.0, 4000, 4)]
    one = {"instances": 1, "tp": 8}
    cluster = {"topology": "dgx-h100-ib400", "nodes": 2, "prefill": one, "decode": one}
    _, _, rows = run(split(cluster=cluster), reqs)
    ev = [{"at": 0.0, "action": "degrade", "link": f"n0.nic{k} -> switch", "factor": 0.1}
          for k in range(8)]  # fmt: skip
    _, _, slow_rows = run(split(cluster=cluster, events=ev), reqs)
    assert slow_rows[0]["transfer_s"] > 5 * rows[0]["transfer_s"]


def test_events_are_checked_with_their_key_and_value():
    bad = [
        ([{"at": 1, "action": "fail"}], "events[0]: give exactly one target"),
        ([{"at": 1, "action": "explode", "instance": 0}], "events[0].action"),
        ([{"at": 1, "action": "degrade", "gpu": 0}], "events[0].factor: missing"),
        ([{"at": 1, "action": "fail", "instance": 0, "factor": 0.5}], "events[0].factor"),
        ([{"at": 1, "action": "degrade", "gpu": 0, "factor": 2}], "events[0].factor"),
        ([{"action": "fail", "instance": 0}], "events[0].at: missing"),
        ([{"at": 1, "action": "fail", "link": "a"}], "events[0].link: 'a'; expected 'src -> dst'"),
        ([{"at": 1, "action": "fail", "instance": 0, "colour": 1}], "colour"),
        ("soon", "events: 'soon' must be a list"),
    ]
    for events, msg in bad:
        with pytest.raises(SpecError, match=msg.replace("[", r"\[").replace("]", r"\]")):
            spec(events=events)
    with pytest.raises(SpecError, match=r"events\[0\]\.instance: 5; instances are 0..1"):
        Simulation(spec(events=[{"at": 1, "action": "fail", "instance": 5}]))
    with pytest.raises(SpecError, match=r"events\[0\]\.link: 'a -> b'"):
        Simulation(split(events=[{"at": 1, "action": "degrade", "link": "a -> b", "factor": 0.5}]))
    with pytest.raises(SpecError, match=r"events\[0\]\.nic: 'n9.nic0' is not a NIC"):
        Simulation(split(events=[{"at": 1, "action": "fail", "nic": "n9.nic0"}]))
    with pytest.raises(SpecError, match=r"retry\.max_attempts"):
        spec(retry={"max_attempts": 0})


def test_a_spec_without_events_resolves_as_before():
    assert "events" not in spec().resolved and "retry" not in spec().resolved
    s = spec(events=[{"at": "1 s", "action": "fail", "node": 0}], retry={"max_attempts": 2})
    assert s.resolved["events"] == [{"at": "1 s", "action": "fail", "node": 0}]
    assert s.resolved["retry"]["max_attempts"] == 2


class Watching:
    """The disagg policy's routing, plus a record of the events it is told of."""

    def __init__(self):
        from schedulers.disagg import Disagg

        self.inner = Disagg()
        self.seen: list[tuple[FaultEvent, tuple[bool, ...]]] = []

    def setup(self, cluster):
        return self.inner.setup(cluster)

    def route(self, req, view):
        return self.inner.route(req, view)

    def pick_decode(self, req, view):
        return self.inner.pick_decode(req, view)

    def on_event(self, event, view):
        self.seen.append((event, tuple(i.up for i in view.instances)))


def test_policies_see_health_and_are_told_of_events():
    ev = [{"at": 0.5, "action": "fail", "node": 0}, {"at": 1.0, "action": "recover", "node": 0}]
    w = Watching()
    _, res, _ = run(split(events=ev), scheduler=w)
    assert [(e.action, e.target, e.name, e.instances) for e, _ in w.seen] == [
        ("fail", "node", 0, (0, 1)),
        ("recover", "node", 0, (0, 1)),
    ]
    assert [up for _, up in w.seen] == [(False, False, True, True), (True, True, True, True)]
    assert res.summary["completed"] + res.summary["failed"] == res.summary["requests"]
    view = ClusterView([InstanceSnapshot(0), InstanceSnapshot(1, up=False)])
    assert [i.id for i in view.of_role("mixed")] == [0] and [i.id for i in view.up()] == [0]


class Stubborn:
    """Routes everything to instance 0, up or not."""

    def setup(self, cluster):
        from twin.scheduler import Plan

        return Plan()

    def route(self, req, view):
        from twin.scheduler import Route

        return Route(0, 0)


def test_routing_to_a_dead_instance_is_an_error():
    ev = [{"at": 0.0, "action": "fail", "instance": 0}]
    with pytest.raises(SpecError, match="routed to instance 0, which is down"):
        run(spec(events=ev), scheduler=Stubborn())


_EVENT = st.tuples(
    st.floats(0.0, 3.0, allow_nan=False),
    st.sampled_from(["fail", "recover", "degrade", "restore"]),
    st.sampled_from(["instance", "node", "gpu", "nic"]),
    st.integers(0, 15),
    st.sampled_from([0.25, 0.5]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(_EVENT, max_size=6),
    mode=st.sampled_from(["serialized", "layerwise"]),
    handoff=st.sampled_from(["push", "pull"]),
    attempts=st.integers(1, 3),
    colocated=st.booleans(),
)
def test_random_fault_timelines_lose_nothing_and_repeat_exactly(
    events, mode, handoff, attempts, colocated
):
    if mode == "layerwise":
        handoff = "push"
    ev = []
    for t, action, target, k, f in events:
        if target == "nic" and colocated:
            target = "instance"
        if target == "nic":
            k = f"n{k // 8}.nic{k % 8}"
        elif target == "instance":
            k = k % (2 if colocated else 4)
        elif target == "node":
            k = k % (1 if colocated else 2)
        elif target == "gpu":
            k = k % (2 if colocated else 16)
        e = {"at": round(t, 3), "action": action, target: k}
        if action == "degrade":
            e["factor"] = f
        ev.append(e)
    workload = {
        "lengths": "azure-conv",
        "arrival": {"process": "poisson", "rate": 30.0},
        "max_requests": 40,
    }
    over = {"events": ev, "retry": {"max_attempts": attempts}, "workload": workload}
    if colocated:
        s = spec(**over)
    else:
        s = split(transfer={"mode": mode, "handoff": handoff}, **over)
    outs = []
    for _ in range(2):
        sim, res, rows = run(s)  # the run checks conservation and that all blocks are free
        summ = res.summary
        assert summ["completed"] + summ["rejected"] + summ["failed"] == summ["requests"] == 40
        assert len(rows) == 40
        for r in rows.values():
            assert r["status"] in ("completed", "rejected", "failed")
            if r["status"] == "completed":
                assert 0 <= r["queue_s"] <= r["ttft_s"] <= r["e2e_s"]
                assert r["attempts"] >= 1 and r["time_lost_s"] >= 0
        for e in sim.engines:
            assert e.kv.free + (e.cache.cached_blocks if e.cache else 0) == e.kv.total
        if sim.network is not None:
            assert sim.network.max_link_load_ratio <= 1 + 1e-9
            assert sim.network._in_flight == 0 and not sim.network._flows
        outs.append(json.dumps(res.to_dict() | {"rows": rows}, sort_keys=True, default=str))
    assert outs[0] == outs[1]


def test_a_retry_left_with_its_last_token_ends_on_the_prefill_side():
    # Token 3 of 3 is under way on the decode side when it fails: the retry's
    # recompute (prompt + 2 tokens) produces it, so nothing is handed off again.
    reqs = [Request(0, 0.0, 100, 3)]
    _, _, rows = run(split(), reqs, Linear())
    t3 = rows[0]["finish_s"]
    ev = [{"at": t3 - 0.005, "action": "fail", "instance": rows[0]["decode_instance"]}]
    sim, _, rows = run(split(events=ev), reqs, Linear())
    r = rows[0]
    assert r["status"] == "completed" and r["attempts"] == 2
    assert sim.engines[r["instance"]].role == "prefill"
    assert r["finish_s"] == pytest.approx(t3 - 0.005 + 0.01 + 0.0102)


def test_random_failures_have_their_own_stream():
    random = [{"component": "instance", "mtbf": "0.3 s", "repair": "0.1 s"}]

    def rows_of(**failures):
        s = spec(failures={"random": random, **failures}, workload=WORKLOAD | {"max_requests": 40})
        _, res, rows = run(s)
        return res.summary, rows

    plain = run(spec(workload=WORKLOAD | {"max_requests": 40}))[2]
    a, rows_a = rows_of()
    b, rows_b = rows_of(seed=11)
    assert a["retries"] > 0 and b["retries"] > 0
    assert rows_of() == (a, rows_a)  # the same seeds, the same run
    assert (a["retries"], a["lost_tokens"]) != (b["retries"], b["lost_tokens"])
    for rows in (rows_a, rows_b):  # failures never move an arrival or a length
        assert {i: (r["arrival_s"], r["prompt_tokens"], r["output_tokens"])
                for i, r in rows.items()} == {
            i: (r["arrival_s"], r["prompt_tokens"], r["output_tokens"]) for i, r in plain.items()
        }  # fmt: skip
    with pytest.raises(SpecError, match=r"failures\.random\[0\]\.mtbf: missing"):
        spec(failures={"random": [{"component": "node", "repair": "1 s"}]})


@pytest.mark.parametrize("component", ["nic", "link"])
def test_random_nic_and_link_failures_repeat_exactly_and_lose_nothing(component):
    random = [{"component": component, "mtbf": "0.5 s", "repair": "50 ms",
               "repair_dist": "fixed"}]  # fmt: skip
    s = split(failures={"random": random}, workload=WORKLOAD | {"max_requests": 60})
    sim, res, rows = run(s)
    log = sim.faults.log()
    fails = [e for e in log if e["action"] == "fail"]
    assert fails and all(e["target"] == ("link" if component == "link" else "nic") for e in log)
    if component == "link":  # a cable fails both ways at once
        names = {(e["time_s"], e["name"]) for e in fails}
        for t, name in names:
            u, _, v = name.partition(" -> ")
            assert (t, f"{v} -> {u}") in names
    # every failure is repaired 50 ms later
    for e in fails:
        assert any(r["action"] == "recover" and r["name"] == e["name"]
                   and r["time_s"] == pytest.approx(e["time_s"] + 0.05) for r in log)  # fmt: skip
    assert res.summary["completed"] + res.summary["rejected"] + res.summary["failed"] == 60
    assert all(e.kv.free == e.kv.total for e in sim.engines)
    again = run(split(failures={"random": random}, workload=WORKLOAD | {"max_requests": 60}))
    assert again[2] == rows and again[0].faults.log() == log
    with pytest.raises(SpecError, match=r"failures\.random\[0\]\.component: 'nic' needs"):
        Simulation(spec(failures={"random": [{"component": "nic", "mtbf": "1 s",
                                                "repair": "1 s"}]}))  # fmt: skip


def test_a_failed_nodes_kv_pool_is_gone():
    from test_mooncake import conversation
    from test_mooncake import spec as mooncake_spec

    reqs = conversation(40)
    ev = [{"at": 0.6, "action": "fail", "node": 0}, {"at": 1.0, "action": "recover", "node": 0}]
    sim = Simulation(mooncake_spec(events=ev), requests=reqs)
    pools = sim.pools
    assert pools is not None
    seen = []
    orig = pools.fail_node

    def fail_node(node):
        before = pools.used_bytes(node)
        orig(node)
        seen.append((node, before > 0, pools.used_bytes(node), node in pools._loading))

    pools.fail_node = fail_node
    s = sim.run().summary
    assert seen == [(0, True, 0.0, False)]
    assert s["completed"] + s["rejected"] + s["failed"] == 40


ONE_EACH = {
    "topology": "dgx-h100-ib400",
    "nodes": 2,
    "prefill": {"instances": 1, "tp": 8},
    "decode": {"instances": 1, "tp": 8},
}


def _link_bytes(result, src, dst):
    return next(
        (ln["bytes"] for ln in result.link_rows if (ln["src"], ln["dst"]) == (src, dst)), 0.0
    )


def test_a_transfer_is_rerouted_when_its_link_fails():
    # Each of the 8 shards leaves node 0 through its GPU's own NIC. NIC 0's
    # uplink fails as the transfer starts: shard 0 moves over NVLink to GPU 1
    # and out through NIC 1, which it shares with shard 1 (half rate each).
    reqs = [Request(0, 0.0, 4000, 4)]
    _, base, rows = run(split(cluster=ONE_EACH), reqs)
    t0 = rows[0]["prefill_done_s"]
    ev = [{"at": t0, "action": "fail", "link": "n0.nic0 -> switch"}]
    _, res, moved = run(split(cluster=ONE_EACH, events=ev), reqs)
    assert moved[0]["status"] == "completed" and moved[0]["attempts"] == 1
    assert _link_bytes(res, "n0.nic0", "switch") == 0.0
    share = _link_bytes(base, "n0.nic1", "switch")
    assert _link_bytes(res, "n0.nic1", "switch") == pytest.approx(2 * share)
    # NIC 1 carries two shards: the bytes take twice as long (the fixed costs
    # stay), and shard 0's detour over NVLink adds its latency.
    busy = next(ln["busy_s"] for ln in base.link_rows if ln["src"] == "n0.nic1")
    topo = split(cluster=ONE_EACH).topology
    detour = topo.latency_s(topo.path(0, 8, nic=1)) - topo.latency_s(topo.path(0, 8))
    assert detour > 0
    extra = moved[0]["transfer_s"] - rows[0]["transfer_s"]
    assert extra == pytest.approx(busy + detour, rel=1e-9)
    assert res.summary["kv_bytes_transferred"] == base.summary["kv_bytes_transferred"]


def test_a_transfer_with_no_other_path_waits_for_the_repair_or_fails():
    reqs = [Request(0, 0.0, 4000, 4)]
    nic_down = [{"at": 0.0, "action": "fail", "nic": f"n0.nic{k}"} for k in range(8)]
    up = [{"at": 2.0, "action": "recover", "nic": f"n0.nic{k}"} for k in range(8)]
    _, _, rows = run(split(cluster=ONE_EACH, events=nic_down + up), reqs)
    assert rows[0]["status"] == "completed" and rows[0]["first_token_s"] > 2.0
    sim, res, rows = run(split(cluster=ONE_EACH, events=nic_down), reqs)
    assert rows[0]["status"] == "failed" and rows[0]["reason"] == "link_down"
    assert res.summary["failed_by_reason"] == {"link_down": 1}
    assert all(e.kv.free == e.kv.total for e in sim.engines)


def test_a_transfer_waiting_on_a_failed_link_ends_at_the_retry_deadline():
    # Every NIC of node 0 is down from 0 s: the KV cannot leave. With a 1 s
    # deadline the wait ends at 0 + 1 s (the attempt ran 1 s); a retry would
    # start 0.1 s later, past the deadline, so the request fails link_down.
    reqs = [Request(0, 0.0, 4000, 4)]
    nic_down = [{"at": 0.0, "action": "fail", "nic": f"n0.nic{k}"} for k in range(8)]
    retry = {"deadline": "1 s", "backoff": "100 ms"}
    sim, res, rows = run(split(cluster=ONE_EACH, events=nic_down, retry=retry), reqs)
    r = rows[0]
    assert r["status"] == "failed" and r["reason"] == "link_down"
    assert r["attempts"] == 1 and r["lost_tokens"] == 4000
    assert r["time_lost_s"] == 1.0
    assert sim.network.stuck == [] and sim.network.bytes_delivered == 0.0
    assert all(e.kv.free == e.kv.total and not e.reserved for e in sim.engines)
    # Without a backoff a retry may start at the deadline itself: it prefills
    # again, its transfer waits past the deadline and is given up at once.
    _, _, rows = run(split(cluster=ONE_EACH, events=nic_down, retry={"deadline": "1 s"}), reqs)
    assert rows[0]["reason"] == "link_down" and rows[0]["attempts"] == 2
    # The repair at 0.5 s comes first: the KV moves then, the timer is ignored.
    up = [{"at": 0.5, "action": "recover", "nic": f"n0.nic{k}"} for k in range(8)]
    _, base, b = run(split(cluster=ONE_EACH), reqs)
    _, _, rows = run(split(cluster=ONE_EACH, events=nic_down + up, retry=retry), reqs)
    r = rows[0]
    assert r["status"] == "completed" and r["attempts"] == 1
    # The fixed costs were paid before the flows started to wait; the bytes
    # leave at the repair and take the idle-network time, and the first token
    # comes as they land.
    b0 = b[0]
    moved = b0["transfer_s"] - b0["handoff_descriptors_s"] - b0["handoff_router_s"]
    assert b0["first_token_s"] == pytest.approx(b0["prefill_done_s"] + b0["transfer_s"])
    assert r["first_token_s"] == pytest.approx(0.5 + moved, rel=1e-9)


def test_a_link_failing_under_a_transfer_starts_its_deadline():
    # The NICs fail while the KV is moving: the same 1 s bound applies.
    reqs = [Request(0, 0.0, 4000, 4)]
    _, _, b = run(split(cluster=ONE_EACH), reqs)
    t = b[0]["prefill_done_s"] + b[0]["transfer_s"] / 2
    down = [{"at": t, "action": "fail", "nic": f"n0.nic{k}"} for k in range(8)]
    retry = {"deadline": "1 s", "backoff": "100 ms"}
    sim, _, rows = run(split(cluster=ONE_EACH, events=down, retry=retry), reqs)
    assert rows[0]["reason"] == "link_down" and rows[0]["time_lost_s"] == 1.0
    assert all(e.kv.free == e.kv.total for e in sim.engines)


@pytest.mark.parametrize("handoff", ["push", "pull"])
def test_a_decode_instance_failing_mid_transfer_hands_the_kv_to_another(handoff):
    # Instance 0 prefills, instance 2 was to decode. Instance 2 fails 3 ms into
    # the hand-off: the KV, still on instance 0, goes to instance 3 from then,
    # as a new hand-off on an idle network: it lands 3 ms later than before.
    reqs = [Request(0, 0.0, 4000, 4)]
    _, base, b = run(split(transfer={"handoff": handoff}), reqs)
    assert b[0]["prefill_instance"] == 0 and b[0]["instance"] == 2
    t = b[0]["prefill_done_s"] + 0.003
    ev = [{"at": t, "action": "fail", "instance": 2}]
    sim, res, rows = run(split(transfer={"handoff": handoff}, events=ev), reqs)
    r = rows[0]
    assert r["status"] == "completed" and r["instance"] == 3 and r["prefill_instance"] == 0
    assert r["attempts"] == 1 and r["lost_tokens"] == 0 and r["time_lost_s"] == 0.0
    assert r["prefill_done_s"] == b[0]["prefill_done_s"]
    assert r["first_token_s"] == pytest.approx(b[0]["first_token_s"] + 0.003, rel=1e-9)
    assert [i["iterations"] for i in res.instance_rows][:2] == [
        i["iterations"] for i in base.instance_rows
    ][:2]  # no second prefill
    assert res.summary["retries"] == 0
    assert all(e.kv.free == e.kv.total for e in sim.engines)


def test_with_no_other_decode_instance_the_request_goes_back_to_route():
    # One decode instance: when it fails mid-transfer the KV has nowhere to
    # go; the attempt is lost and the retry prefills again after the repair.
    reqs = [Request(0, 0.0, 4000, 4)]
    _, _, b = run(split(cluster=ONE_EACH), reqs)
    t = b[0]["prefill_done_s"] + 0.003
    ev = [
        {"at": t, "action": "fail", "instance": 1},
        {"at": 1.0, "action": "recover", "instance": 1},
    ]
    sim, res, rows = run(split(cluster=ONE_EACH, events=ev), reqs)
    r = rows[0]
    assert r["status"] == "completed" and r["attempts"] == 2
    assert r["lost_tokens"] == 4000 and r["time_lost_s"] == pytest.approx(t)
    assert [i["iterations"] for i in res.instance_rows][0] == 2  # prefilled twice
    assert all(e.kv.free == e.kv.total for e in sim.engines)


def test_the_bundled_node_failure_costs_attainment_and_loses_nothing():
    from twin.sim.simulation import run as run_spec

    over = ["workload.max_requests=1400"]
    hit = run_spec("node-failure", overrides=over).summary
    calm = run_spec("node-failure", overrides=[*over, "events=[]"]).summary
    assert hit["failed"] == 0 and hit["retries"] > 0
    assert hit["completed"] == calm["completed"]
    assert hit["slo_attainment"] < calm["slo_attainment"] - 0.05


@pytest.mark.parametrize("name", ["colocated", "disagg", "distserve", "splitwise", "mooncake"])
def test_every_bundled_policy_keeps_the_contract_through_failures(name):
    from twin.testing import check_scheduler

    assert check_scheduler(name, seeds=(0,), faults=True) in ("colocated", "split", "both")


def test_the_trace_shows_failures_repairs_and_instance_lifetimes():
    # The scenario of the mid-decode failure above: instance 0 fails at 0.05
    # (its iteration from 0.042 is cut there) and is back at 0.08; the retry
    # ends on instance 1 at 0.1473, the last moment recorded.
    from twin.sim.trace import TraceRecorder, chrome_trace

    s = spec(events=[
        {"at": 0.05, "action": "fail", "instance": 0},
        {"at": 0.08, "action": "recover", "instance": 0},
    ])  # fmt: skip
    rec = TraceRecorder()
    Simulation(s, requests=[Request(0, 0.0, 100, 11)], perf=Linear(), trace=rec).run()
    events = chrome_trace(rec)["traceEvents"]
    spans = [(e["tid"], e["ts"], e["dur"]) for e in events if e.get("cat") == "lifetime"]
    assert spans == [(1, 0, 50000), (1, 80000, 67300), (2, 0, 147300)]
    instants = [(e["tid"], e["ts"], e["cat"], e["name"]) for e in events if e["ph"] == "i"]
    assert instants == [
        (1, 50000, "event", "down"),
        (1, 50000, "fault", "fail instance 0"),
        (1, 80000, "event", "up"),
        (1, 80000, "fault", "recover instance 0"),
    ]
    iters = [(e["ts"], e["dur"]) for e in events if e.get("cat") == "iteration" and e["tid"] == 1]
    assert iters[-1] == (42000, 8000)  # cut short by the failure
    # each thread's spans nest: every iteration lies within a lifetime
    for e in events:
        if e.get("cat") == "iteration":
            assert any(
                t == e["tid"] and a <= e["ts"] and e["ts"] + e["dur"] <= a + d for t, a, d in spans
            )


def test_the_result_logs_faults_as_they_took_effect_and_the_trace_marks_a_link():
    from twin.sim.trace import TraceRecorder, chrome_trace

    s = split(events=[
        {"at": 0.1, "action": "degrade", "nic": "n0.nic0", "factor": 0.25},
        {"at": 0.2, "action": "restore", "nic": "n0.nic0"},
        {"at": 0.3, "action": "fail", "node": 1},
    ])  # fmt: skip
    rec = TraceRecorder()
    result = Simulation(s, trace=rec).run()
    log = result.to_dict()["fault_log"]
    assert [(e["time_s"], e["action"], e["target"], e["name"]) for e in log] == [
        (0.1, "degrade", "nic", "n0.nic0"),
        (0.2, "restore", "nic", "n0.nic0"),
        (0.3, "fail", "node", 1),
    ]
    assert log[0]["factor"] == 0.25 and "factor" not in log[1]
    assert log[0]["instances"] == [] and log[2]["instances"] == [2, 3]  # node 1: D2, D3
    faults = [(e["ts"], e["s"], e["tid"], e["name"]) for e in chrome_trace(rec)["traceEvents"]
              if e.get("cat") == "fault"]  # fmt: skip
    assert faults == [
        (100000, "g", 0, "degrade nic n0.nic0 x0.25"),
        (200000, "g", 0, "restore nic n0.nic0"),
        (300000, "t", 3, "fail node 1"),
        (300000, "t", 4, "fail node 1"),
    ]
    # without events or failures, no fault_log: such results keep their bytes
    assert "fault_log" not in Simulation(split()).run().to_dict()


def test_random_failures_reach_the_fault_log():
    s = spec(failures={"seed": 3, "random": [{"component": "instance", "mtbf": 0.2, "repair": 0.05,
                                               "repair_dist": "fixed"}]})  # fmt: skip
    log = Simulation(s).run().to_dict()["fault_log"]
    assert log and {e["action"] for e in log} <= {"fail", "recover"}
    fails = [e for e in log if e["action"] == "fail"]
    for f in fails:  # each repaired exactly 0.05 s later, unless the run ended first
        back = [e for e in log if e["action"] == "recover" and e["name"] == f["name"]
                and e["time_s"] > f["time_s"]]  # fmt: skip
        assert not back or back[0]["time_s"] == pytest.approx(f["time_s"] + 0.05)


def test_random_failures_end_when_every_request_left_waits_for_an_instance():
    # A node down for good and random NIC failures: the waiting requests can
    # only end failed, and the NIC failures (which bring no instance back)
    # stop, so the run ends (it ran for ever before).
    s = resolve_spec(
        {"model": "llama-3.1-8b", "cluster": {"topology": "dgx-h100-ib400", "nodes": 1,
                                               "instances": 1},
         "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 20},
                      "max_requests": 20},
         "events": [{"at": "0.5 s", "action": "fail", "node": 0}],
         "failures": {"random": [{"component": "nic", "mtbf": "3 s", "repair": "0.4 s"}]}},
        "t.yaml", Path.cwd(),
    )  # fmt: skip
    sim, res, rows = run(s)
    ended = res.summary["completed"] + res.summary["failed"]
    assert ended == 20 and res.summary["failed"] > 0
    assert {r["reason"] for r in rows.values() if r["status"] == "failed"} == {"no_instance_up"}


def test_requests_waiting_for_a_randomly_failed_instance_wait_for_its_repair():
    # One instance whose random failures are repaired: requests that wait for
    # it are served after the repair, not failed as if nothing could come back.
    random = [{"component": "instance", "mtbf": "0.3 s", "repair": "0.1 s"}]
    s = spec(cluster={"instances": 1}, failures={"random": random},
             workload=WORKLOAD | {"max_requests": 40}, retry={"max_attempts": 100})  # fmt: skip
    sim, res, rows = run(s)
    assert res.summary["retries"] > 0
    assert res.summary["completed"] == 40 - res.summary["rejected"]
