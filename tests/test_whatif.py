"""What a transfer started now would get (twin.net.whatif), against the transfer that then runs."""

from __future__ import annotations

import math

import pytest
import simpy
from test_network import Link, run_at

from twin.net.flows import FlowSpec, Network
from twin.net.shards import shard_flows
from twin.net.topology import load_topology
from twin.net.whatif import share_now

GB = 1e9


def _spine_net(k: int, size: float = 1e15):
    """``k`` long flows from their own sources over one spine link of 100 GB/s:
    each is held there at 100/k GB/s."""
    env = simpy.Environment()
    net = Network(env)
    spine = Link("leaf0", "leaf1", 100 * GB, latency=2e-6)
    for i in range(k):
        up = Link(f"g{i}", "leaf0", 400 * GB, latency=1e-6)
        net.start([FlowSpec((up, spine), size)], f"bg{i}")
    return env, net, spine


def test_a_new_flow_on_a_full_link_gets_its_fair_share_exactly():
    env, net, spine = _spine_net(3)
    new = FlowSpec((Link("h", "leaf0", 400 * GB, latency=1e-6), spine), 4 * GB)
    got = {}

    def probe_then_start():
        got["share"] = share_now(net, [new])
        got["t"] = net.start([new], "kv")

    run_at(env, 1.0, probe_then_start)
    env.run(until=10.0)
    share, t = got["share"], got["t"]
    assert share.rate_bytes_s == 100 * GB / 4  # fair share with the 3 flows held there
    assert share.bottleneck.src == "leaf0" and share.bottleneck.dst == "leaf1"
    assert share.bottleneck.flows == 3 and share.bottleneck.utilisation == pytest.approx(1.0)
    assert t.end_s - t.start_s == pytest.approx(share.time_s, rel=1e-12)
    assert share.time_s == pytest.approx(3e-6 + 4 * GB / (25 * GB), rel=1e-12)


def test_an_idle_path_is_the_network_s_own_idle_time():
    env = simpy.Environment()
    net = Network(env)
    path = (Link("a", "b", 50 * GB, 0.9, 5e-6), Link("b", "c", 20 * GB, 1.0, 1e-6))
    spec = FlowSpec(path, 3 * GB)
    share = share_now(net, [spec])
    assert share.time_s == net.idle_time_s([spec])
    assert share.bottleneck.dst == "c" and share.utilisation == 0.0


def test_a_link_with_room_gives_the_room_a_capped_flow_leaves():
    env = simpy.Environment()
    net = Network(env)
    link = Link("a", "b", 100 * GB)
    net.start([FlowSpec((link,), 1e15, rate_cap_bytes_s=10 * GB)], "capped")
    share = share_now(net, [FlowSpec((link,), GB)])
    # max-min: the newcomer takes what the capped flow leaves, 90 GB/s
    assert share.rate_bytes_s == pytest.approx(90 * GB)


def test_a_flow_held_elsewhere_makes_the_estimate_a_lower_bound_and_its_error_is_known():
    """The one case the estimate is not exact: a current flow held below its
    fair share by another link (here its cap) leaves more than the fair share;
    the estimate then lies below the rate the transfer gets, never above."""
    env = simpy.Environment()
    net = Network(env)
    link = Link("a", "b", 100 * GB)
    net.start([FlowSpec((link,), 1e15, rate_cap_bytes_s=10 * GB)], "capped")
    net.start([FlowSpec((link,), 1e15)], "free")  # 10 + 90
    new = FlowSpec((link,), 10 * GB)
    share = share_now(net, [new])
    t = net.start([new], "kv")
    env.run(until=5.0)
    # offered: max(100 - 100, 100 / 3) = 33.3; max-min gives the newcomer
    # and the free flow 45 each beside the capped one's 10
    actual = t.end_s - t.start_s
    assert share.rate_bytes_s == pytest.approx(100 * GB / 3)
    assert actual == pytest.approx(10 * GB / (45 * GB))
    assert share.time_s > actual
    assert share.time_s / actual - 1 == pytest.approx(0.35)


def test_asking_changes_nothing():
    """A run that asks at every instant gives the same transfers, to the bit."""

    def run(ask: bool) -> list[float | None]:
        env, net, spine = _spine_net(2, size=30 * GB)
        new = FlowSpec((Link("h", "leaf0", 400 * GB), spine), 7 * GB)
        out = []
        for at in (0.1, 0.5, 0.9):
            run_at(env, at, lambda: out.append(net.start([new], "kv")))
            if ask:
                for dt in (0.0, 0.05, 0.3):
                    run_at(env, at + dt, lambda: share_now(net, [new]))
        env.run()
        return [t.end_s for t in out] + [net.bytes_sent]

    assert run(True) == run(False)


def test_a_kv_hand_off_over_an_oversubscribed_spine_is_priced_as_it_then_moves():
    """A loaded fabric: node 0 sends KV to node 2 over a leaf uplink 8:1
    oversubscribed; a hand-off node 1 -> node 3 shares that uplink. The
    estimate is taken before it starts and checked against the transfer."""
    topo = load_topology(
        {"node": {"gpu": "h100-sxm", "gpus": 8,
                  "nics": {"count": 8, "kind": "infiniband", "bandwidth": "400 Gbps"}},
         "nodes": 4,
         "fabric": {"kind": "leaf-spine", "nodes_per_leaf": 2, "oversubscription": 8}}
    )  # fmt: skip
    env = simpy.Environment()
    net = Network(env)
    g = topo.gpus_of_node
    net.start(shard_flows(topo, g(0), g(2), 1e15), "background")
    flows = shard_flows(topo, g(1), g(3), 8 * GB)
    got = {}

    def probe_then_start():
        got["share"] = share_now(net, flows)
        got["t"] = net.start(flows, "kv")

    run_at(env, 0.5, probe_then_start)
    env.run(until=20.0)
    share, t = got["share"], got["t"]
    uplink = share.bottleneck
    assert (uplink.src, uplink.dst) == ("leaf0", "spine") and uplink.flows == 8
    assert uplink.utilisation == pytest.approx(1.0)
    # 16 flows on the uplink: each gets 1/16 of it
    assert share.rate_bytes_s == pytest.approx(uplink.usable_bytes_s / 16, rel=1e-12)
    assert t.end_s - t.start_s == pytest.approx(share.time_s, rel=1e-12)
    assert not math.isinf(share.time_s)


def test_the_flow_counts_follow_groups_that_split_move_and_end():
    """Each link's count of flows (what the estimate reads) is the number of
    flows sending on it, through a group split by a degraded rail, a flow
    moved off a failed link, and the ends of all."""
    env = simpy.Environment()
    net = Network(env)
    rail0 = (Link("g0", "s", 100 * GB), Link("s", "h0", 100 * GB))
    rail1 = (Link("g1", "s", 100 * GB), Link("s", "h1", 100 * GB))
    around = (Link("g1", "t", 100 * GB), Link("t", "h1", 100 * GB))
    net.reroute = lambda first, last, down: around if ("s", "h1") in down else None
    links = [*rail0, *rail1, *around]
    seen = []

    def count():
        seen.append([n for _, _, n in net.link_loads(links)])

    # two transfers of one flow per rail: each moves as one group
    for label in ("a", "b"):
        net.start([FlowSpec(rail0, 50 * GB), FlowSpec(rail1, 50 * GB)], label)
    run_at(env, 0.1, count)
    run_at(env, 0.2, lambda: net.scale_link("g0", "s", 0.5))  # the groups split
    run_at(env, 0.3, count)
    run_at(env, 0.4, lambda: net.fail_link("s", "h1"))  # rail 1's flows go around
    run_at(env, 0.5, count)
    env.run()
    count()
    assert seen == [
        [2, 2, 2, 2, 0, 0],
        [2, 2, 2, 2, 0, 0],
        [2, 2, 0, 0, 2, 2],
        [0, 0, 0, 0, 0, 0],
    ]
