"""Overlapping faults compose: a part is up only when it and what it depends on
are, its speed is the product of the degradations in force, and a repair of
one part never heals another (DESIGN.md, Faults)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import Linear
from test_faults import Watching, run, spec, split

from twin.request import Request
from twin.sim.health import Health
from twin.sim.simulation import Simulation

NIC = "n0.nic0"
UP = ("n0.nic0", "switch")  # one of the NIC's four directed links
NIC_LINKS = [("n0.gpu0", NIC), ("switch", NIC), (NIC, "n0.gpu0"), (NIC, "switch")]


class Recording(Watching):
    """The disagg policy, recording after each event the instances' (up,
    speed) and the network's failed links and their factors."""

    def __init__(self):
        super().__init__()
        self.sim: Simulation | None = None
        self.states: list[tuple[list[tuple[bool, float]], set, dict]] = []

    def on_event(self, event, view):
        assert self.sim is not None
        net = self.sim.network
        self.states.append((
            [(e.up, e.speed) for e in self.sim.engines],
            set(net._faults.down) if net else set(),
            dict(net._faults.factors) if net else {},
        ))  # fmt: skip


def recorded(s):
    rec = Recording()
    sim = Simulation(s, scheduler=rec)
    rec.sim = sim
    result = sim.run()
    return rec.states, result, sim


def test_a_nic_recovered_leaves_a_link_that_failed_on_its_own_down():
    ev = [
        {"at": 0.1, "action": "fail", "link": "n0.nic0 -> switch"},
        {"at": 0.2, "action": "fail", "nic": NIC},
        {"at": 0.3, "action": "recover", "nic": NIC},
        {"at": 0.4, "action": "recover", "link": "n0.nic0 -> switch"},
    ]
    states, _, _ = recorded(split(events=ev))
    downs = [down & set(NIC_LINKS) for _, down, _ in states]
    assert downs == [{UP}, set(NIC_LINKS), {UP}, set()]


def test_a_nic_restored_leaves_a_links_own_degradation_and_they_multiply():
    ev = [
        {"at": 0.1, "action": "degrade", "link": "n0.nic0 -> switch", "factor": 0.5},
        {"at": 0.2, "action": "degrade", "nic": NIC, "factor": 0.4},
        {"at": 0.3, "action": "restore", "nic": NIC},
    ]
    states, _, _ = recorded(split(events=ev))
    assert [f.get(UP) for _, _, f in states] == [0.5, pytest.approx(0.2), 0.5]
    assert [f.get((NIC, "n0.gpu0")) for _, _, f in states] == [None, 0.4, None]


def test_a_node_restored_leaves_a_gpus_own_degradation():
    # Linear: a 100-token prompt takes 20 ms at full speed. GPU 0 at 0.5 and
    # its node at 0.8 together: 0.4 (50 ms); the node restored: 0.5 (40 ms).
    reqs = [Request(0, 0.0, 100, 1)]
    gpu = {"at": 0.0, "action": "degrade", "gpu": 0, "factor": 0.5}
    node = {"at": 0.0, "action": "degrade", "node": 0, "factor": 0.8}
    restore = {"at": 0.0, "action": "restore", "node": 0}
    one = {"instances": 1}
    _, _, rows = run(spec(events=[gpu, node], cluster=one), reqs, Linear())
    assert rows[0]["finish_s"] == pytest.approx(0.05)
    sim, _, rows = run(spec(events=[gpu, node, restore], cluster=one), reqs, Linear())
    assert rows[0]["finish_s"] == pytest.approx(0.04)
    assert sim.engines[0].speed == 0.5


def test_an_instance_recovered_on_a_node_still_down_stays_down():
    # The request's instance fails with its node at 0.05; instance 0's own
    # recovery at 0.1 does not bring it back while the node is down: the
    # retry waits for the node (1 s), then prefills 103 tokens (20.3 ms) and
    # decodes 7 more (77 ms), as when both instances fail on their own.
    reqs = [Request(0, 0.0, 100, 11)]
    ev = [
        {"at": 0.05, "action": "fail", "node": 0},
        {"at": 0.1, "action": "recover", "instance": 0},
        {"at": 1.0, "action": "recover", "node": 0},
    ]
    sim, res, rows = run(spec(events=ev), reqs, Linear())
    assert rows[0]["status"] == "completed" and rows[0]["attempts"] == 2
    assert rows[0]["finish_s"] == pytest.approx(1.0 + 0.0203 + 0.077)
    log = res.to_dict()["fault_log"]
    assert [e["instances"] for e in log] == [[0, 1], [], [0, 1]]  # the instances it changed


def test_health_keeps_each_parts_own_state():
    h = Health()
    h.apply("fail", ("node", 0))
    h.apply("fail", ("gpu", 1))
    h.apply("recover", ("node", 0))
    assert not h.up([("node", 0), ("gpu", 1)]) and h.up([("node", 0), ("gpu", 0)])
    h.apply("degrade", ("gpu", 1), 0.5)
    h.apply("degrade", ("node", 0), 0.5)
    h.apply("degrade", ("node", 0), 0.8)  # a later degrade of a part replaces its own
    assert h.factor([("gpu", 1), ("node", 0)]) == pytest.approx(0.4)
    h.apply("restore", ("node", 0))
    assert h.factor([("gpu", 1), ("node", 0)]) == 0.5


# A fault timeline over the split cluster of test_faults (P0 P1 on node 0,
# D0 D1 on node 1, TP4 each): every kind of target, overlapping freely.
_LINKS = ["n0.nic0 -> switch", "switch -> n0.nic0", "n0.gpu0 -> n0.nic0", "n0.nic1 -> switch"]
_TARGET = st.one_of(
    st.tuples(st.just("instance"), st.integers(0, 3)),
    st.tuples(st.just("node"), st.integers(0, 1)),
    st.tuples(st.just("gpu"), st.sampled_from([0, 1, 4, 8, 12, 15])),
    st.tuples(st.just("nic"), st.sampled_from(["n0.nic0", "n0.nic1"])),
    st.tuples(st.just("link"), st.sampled_from(_LINKS)),
)
_EVENT = st.tuples(
    st.integers(0, 40).map(lambda k: k * 0.01),
    st.sampled_from(["fail", "recover", "degrade", "restore"]),
    _TARGET,
    st.sampled_from([0.25, 0.5, 0.8]),
)


def _derived(events, placements):
    """The rule, worked from the events as written (no code of the twin's):
    per part its last fail/recover and degrade/restore; an instance up when
    it, its GPUs and their nodes are, at its own factor times its slowest
    GPU's (the GPU's times its node's); a link up when it and its NIC ends
    are, at the product of their factors."""
    down: dict = {}
    factor: dict = {}
    out = []
    for _, action, target, name, f in events:
        if action in ("fail", "recover"):
            down[target, name] = action == "fail"
        else:
            factor[target, name] = f if action == "degrade" else 1.0
        inst = []
        for i, gpus in enumerate(placements):
            parts = [("instance", i)] + [p for g in gpus for p in (("gpu", g), ("node", g // 8))]
            slowest = min(factor.get(("gpu", g), 1.0) * factor.get(("node", g // 8), 1.0)
                          for g in gpus)  # fmt: skip
            inst.append((not any(down.get(p) for p in parts),
                         factor.get(("instance", i), 1.0) * slowest))  # fmt: skip
        links = {}
        for src, dst in NIC_LINKS + [("n0.nic1", "switch"), ("switch", "n0.nic1")]:
            parts = [("link", f"{src} -> {dst}")] + [("nic", v) for v in (src, dst) if "nic" in v]
            links[src, dst] = (not any(down.get(p) for p in parts),
                               math.prod(factor.get(p, 1.0) for p in parts))  # fmt: skip
        out.append((inst, links))
    return out


@settings(max_examples=12, deadline=None)
@given(st.lists(_EVENT, min_size=1, max_size=12))
def test_overlapping_fault_timelines_give_the_derived_state_after_every_event(events):
    ev = []
    for t, action, (target, name), f in events:
        e = {"at": t, "action": action, target: name}
        if action == "degrade":
            e["factor"] = f
        ev.append(e)
    s = split(events=ev, workload={
        "lengths": {"prompt": {"dist": "fixed", "value": 500},
                    "output": {"dist": "fixed", "value": 50}},
        "arrival": {"process": "poisson", "rate": 50.0}, "max_requests": 20,
    })  # fmt: skip
    states, result, sim = recorded(s)
    order = sorted(range(len(ev)), key=lambda k: (ev[k]["at"], k))  # time, then list order
    written = []
    for k in order:
        t, action, (target, name), f = events[k]
        written.append((t, action, target, name, f))
    placements = [[4 * i + k for k in range(4)] for i in range(4)]  # packed, TP4 each
    assert placements == [list(p.gpus) for p in sim.placements]
    expected = _derived(written, placements)
    assert len(states) == len(ev)  # every event took effect
    for (inst, down, factors), (want_inst, want_links) in zip(states, expected, strict=True):
        assert [up for up, _ in inst] == [up for up, _ in want_inst]
        assert [sp for _, sp in inst] == pytest.approx([sp for _, sp in want_inst])
        for key, (up, f) in want_links.items():
            assert (key not in down) == up, key
            assert factors.get(key, 1.0) == pytest.approx(f), key
    summ = result.summary
    assert summ["completed"] + summ["rejected"] + summ["failed"] == summ["requests"] == 20


def test_an_instance_added_on_a_failed_and_degraded_node_takes_on_its_state():
    # Node 0 (GPUs 0-2) fails and is degraded to 0.5 at 0.5 s; the tick at
    # 1 s adds instance 1 on GPU 1 of it. It comes up (at ~7 s) down, and
    # serves from the node's repair at 60 s, at half speed.
    from test_scaling import Scripted
    from test_scaling import spec as scaling_spec

    from twin.scheduler import AddInstance

    s = scaling_spec(
        cluster={"instances": 1, "tp": 1, "gpus_per_node": 3},
        events=[{"at": "0.5 s", "action": "fail", "node": 0},
                {"at": "0.5 s", "action": "degrade", "node": 0, "factor": 0.5},
                {"at": "60 s", "action": "recover", "node": 0}],
    )  # fmt: skip
    reqs = [Request(0, 0.0, 256, 8), Request(1, 70.0, 256, 8)]
    sim, result, _ = run(s, reqs, scheduler=Scripted({1: [AddInstance("mixed")]}))
    assert [(i, t < 60.0) for _, t, i in sim.scaler.started] == [(1, True)]
    assert sim.placements[1].gpus == (1,)
    assert sim.engines[1].life == 1  # down as it came up, on the failed node
    assert sim.engines[1].speed == 0.5
    assert result.summary["completed"] + result.summary["failed"] == 2
    assert sim.engines[1].iterations > 0  # it serves request 1, after the repair
