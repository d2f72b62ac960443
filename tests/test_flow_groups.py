"""Flow groups and re-sharing by connected component (twin.net.flows).

The shards of one transfer that start with the same size, cap and latency move
as one group; a change re-shares only the component of links and flows it
touches. Both must give exactly the rates of flow-by-flow max-min over every
flow in flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from twin.net.flows import Network
from twin.net.maxmin import _fill, max_min_rates
from twin.net.shards import shard_flows
from twin.net.topology import load_topology
from twin.net.transfer import FlowSpec


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    capacity: float  # bytes/s
    latency: float = 0.0

    @property
    def usable_bytes_s(self) -> float:
        return self.capacity

    @property
    def latency_s(self) -> float:
        return self.latency


def steps(env: simpy.Environment, check=None) -> int:
    n = 0
    while env.peek() < math.inf:
        env.step()
        n += 1
        if check is not None:
            check()
    return n


# -- groups ---------------------------------------------------------------------------


def rails(k: int, cap: float = 10.0, lat: float = 1e-3) -> list[tuple[Link, ...]]:
    """``k`` disjoint three-hop paths (one per NIC rail) a -> b."""
    return [
        (Link(f"a{i}", f"n{i}", cap, lat), Link(f"n{i}", f"m{i}", cap, lat),
         Link(f"m{i}", f"b{i}", cap, lat))
        for i in range(k)
    ]  # fmt: skip


def test_shards_on_parallel_rails_move_as_one_group_with_one_event():
    env = simpy.Environment()
    net = Network(env)
    t = net.start([FlowSpec(p, 20.0) for p in rails(8)])
    seen = []
    t.then(lambda tr: seen.append((env.now, tr)))
    assert net.groups() == [(0, tuple(range(8)))]
    assert list(net.rates().values()) == [10.0] * 8
    # alone on its links, the group's finish moves no other rate: one event,
    # the delivery of all eight shards (``done`` is an event only once asked for)
    assert steps(env) == 1
    assert t.end_s == 2.0 + 3e-3
    assert seen == [(t.end_s, t)]
    assert t.done.triggered and t.done.value is t
    assert net.bytes_delivered == 160.0
    stats = net.link_stats()
    assert len(stats) == 24 and all(s["bytes"] == 20.0 for s in stats)


def test_a_degraded_rail_splits_the_group_and_each_shard_gets_its_own_rate():
    env = simpy.Environment()
    net = Network(env)
    paths = rails(4)
    net.scale_link("n2", "m2", 0.25)  # rail 2 runs at 2.5 B/s
    t = net.start([FlowSpec(p, 20.0) for p in paths])
    assert net.groups() == [(0, (0,)), (0, (1,)), (0, (2,)), (0, (3,))]
    assert net.rates() == {(0, 0): 10.0, (0, 1): 10.0, (0, 2): 2.5, (0, 3): 10.0}
    env.run()
    assert t.end_s == pytest.approx(20.0 / 2.5 + 3e-3, rel=1e-12)


def test_a_group_that_shares_a_rail_with_another_transfer_parts_when_it_must():
    env = simpy.Environment()
    net = Network(env)
    paths = rails(2)
    a = net.start([FlowSpec(p, 30.0) for p in paths])
    assert net.groups() == [(0, (0, 1))]
    # a second transfer on rail 0 only: rail 0's shard of ``a`` halves, rail 1's does not
    b = net.start([FlowSpec(paths[0], 10.0)])
    assert net.rates() == {(0, 0): 5.0, (0, 1): 10.0, (1, 0): 5.0}
    assert net.groups() == [(0, (0,)), (0, (1,)), (1, (0,))]
    env.run()
    # b: 10 B at 5 B/s; a's rail 0: 10 B at 5, then 20 B at 10 B/s
    assert b.end_s == pytest.approx(2.0 + 3e-3)
    assert a.end_s == pytest.approx(4.0 + 3e-3)


def test_symmetric_contention_keeps_both_groups_whole():
    # two transfers on the same eight rails: each shard gets half of each rail
    env = simpy.Environment()
    net = Network(env)
    paths = rails(8)
    net.start([FlowSpec(p, 10.0) for p in paths])
    net.start([FlowSpec(p, 10.0) for p in paths])
    assert net.groups() == [(0, tuple(range(8))), (1, tuple(range(8)))]
    assert set(net.rates().values()) == {5.0}
    # the delivery planned by the first start while it was alone (stale once
    # the second halves the rates), the one finish event, a delivery per transfer
    assert steps(env) == 4


def test_a_tp8_hand_off_across_nodes_is_one_group():
    topo = load_topology("dgx-h100-ib400")
    flows = shard_flows(topo, tuple(range(8)), tuple(range(8, 16)), 8 * 49.1e9)
    env = simpy.Environment()
    net = Network(env)
    t = net.start(flows)
    assert net.groups() == [(0, tuple(range(8)))]
    # every shard at its NIC's usable 49.1 GB/s: one second plus four link latencies
    env.run()
    assert t.end_s == pytest.approx(1.0 + 4e-6, rel=1e-12)


def test_failing_the_link_under_one_shard_splits_it_off():
    env = simpy.Environment()
    net = Network(env)
    paths = rails(3)
    t = net.start([FlowSpec(p, 20.0) for p in paths])
    env.run(until=1.0)
    net.fail_link("n1", "m1")  # no reroute: rail 1's shard waits
    assert net.rates() == {(0, 0): 10.0, (0, 1): 0.0, (0, 2): 10.0}
    assert net.waits(t) and net.stuck == [t]
    env.run(until=3.0)
    net.recover_link("n1", "m1")
    env.run()
    assert t.end_s == pytest.approx(3.0 + 1.0 + 3e-3)


# -- incremental re-sharing equals the global computation -------------------------------

NODES = "abcdef"


@st.composite
def operations(draw):
    caps = {
        (s, d): draw(st.sampled_from([10.0, 20.0]) | st.floats(1.0, 50.0))
        for s in NODES
        for d in NODES
        if s != d
    }
    links = {k: Link(k[0], k[1], c, draw(st.sampled_from([0.0, 0.01]))) for k, c in caps.items()}

    def path():
        nodes = draw(st.lists(st.sampled_from(NODES), min_size=2, max_size=4, unique=True))
        return tuple(links[(u, v)] for u, v in zip(nodes, nodes[1:], strict=False))

    ops = []
    for _ in range(draw(st.integers(1, 10))):
        when = draw(st.sampled_from([0.0, 0.5]) | st.floats(0.0, 4.0))
        kind = draw(st.sampled_from(["start", "start", "start", "cap", "scale", "fail"]))
        if kind == "start":
            size = draw(st.sampled_from([5.0, 20.0]) | st.floats(0.1, 100.0))
            cap = draw(st.sampled_from([None, None, 4.0]))
            # shards of equal size (a group), sometimes one of another size
            flows = [FlowSpec(path(), size, cap) for _ in range(draw(st.integers(1, 4)))]
            if draw(st.booleans()):
                flows.append(FlowSpec(path(), size / 2, cap))
            ops.append((when, kind, flows))
        elif kind == "cap":
            ops.append((when, kind, draw(st.sampled_from([None, 2.0, 7.5]))))
        else:
            key = draw(st.sampled_from(sorted(caps)))
            ops.append((when, kind, (key, draw(st.sampled_from([0.25, 0.5, 1.0])))))
    return sorted(ops, key=lambda op: op[0])


@settings(max_examples=75, deadline=None)
@given(operations())
def test_incremental_re_sharing_equals_max_min_over_every_flow(ops):
    env = simpy.Environment()
    net = Network(env)
    started: list[list[FlowSpec]] = []
    transfers = []
    caps: dict[int, float | None] = {}  # transfer id -> cap set later
    factor: dict[tuple[str, str], float] = {}
    down: set[tuple[str, str]] = set()

    def check():
        rates = net.rates()
        specs = [started[tid][i] for tid, i in rates]
        paths = [[(ln.src, ln.dst) for ln in s.path] for s in specs]
        cap = [caps.get(tid, s.rate_cap_bytes_s) for (tid, _), s in zip(rates, specs, strict=True)]
        capacity = {
            (ln.src, ln.dst): 0.0
            if (ln.src, ln.dst) in down
            else ln.usable_bytes_s * factor.get((ln.src, ln.dst), 1.0)
            for s in specs
            for ln in s.path
        }
        want = max_min_rates(paths, cap, capacity)
        # to the last bits: re-sharing one component may sum its links' loads in
        # another order than the whole-network pass (one ulp seen)
        assert list(rates.values()) == pytest.approx(want, rel=1e-14, abs=0.0)
        # and, up to rounding, the same as filling all of them in one pass
        one, _ = _fill(paths, cap, capacity)
        assert list(rates.values()) == pytest.approx(one, rel=1e-9, abs=1e-12)

    def driver():
        for when, kind, arg in ops:
            yield env.timeout(when - env.now)
            if kind == "start":
                t = net.start(arg, "x")
                assert t.id == len(started)
                started.append(arg)
                transfers.append(t)
            elif kind == "cap" and transfers:
                t = transfers[len(transfers) // 2]
                t.set_cap(arg)  # the flows still sending take it
                caps[t.id] = arg
            elif kind == "scale":
                (key, f) = arg
                net.scale_link(*key, f)
                factor[key] = f
            elif kind == "fail":
                (key, f) = arg
                if f == 1.0 and key in down:
                    net.recover_link(*key)
                    down.discard(key)
                else:
                    net.fail_link(*key)
                    down.add(key)
            check()
        for key in sorted(down):  # let everything finish
            net.recover_link(*key)
        down.clear()
        check()

    env.process(driver())
    steps(env, check)
    assert net.bytes_delivered == pytest.approx(
        sum(f.size_bytes for flows in started for f in flows), rel=1e-12, abs=1e-9
    )


def test_components_are_filled_apart_and_in_one_pass_agree():
    # two components with the same bottleneck value: the same rates either way
    paths = [["x"], ["x"], ["y"], ["y", "z"]]
    caps = [None, 3.0, None, None]
    capacity = {"x": 10.0, "y": 8.0, "z": 2.0}
    assert max_min_rates(paths, caps, capacity) == [7.0, 3.0, 6.0, 2.0]
    assert _fill(paths, caps, capacity)[0] == [7.0, 3.0, 6.0, 2.0]
