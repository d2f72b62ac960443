"""The flow-level network: analytic transfer times, max-min sharing, caps, invariants."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from twin.errors import SpecError
from twin.net.flows import Network
from twin.net.maxmin import max_min_rates
from twin.net.transfer import ABS_DONE, FlowSpec


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    capacity: float  # bytes/s
    efficiency: float = 1.0
    latency: float = 0.0

    @property
    def usable_bytes_s(self) -> float:
        return self.capacity * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency


def run_at(env: simpy.Environment, when: float, fn) -> None:
    """Call ``fn()`` from a SimPy process at time ``when``."""

    def proc():
        yield env.timeout(when - env.now)
        fn()

    env.process(proc())


def ends(transfers) -> list[float]:
    return [t.end_s for t in transfers]


# -- one flow -----------------------------------------------------------------------


def test_one_flow_idle_path_is_latency_plus_size_over_usable():
    env = simpy.Environment()
    net = Network(env)
    a = Link("gpu0", "nic0", 450e9, 0.9, 1e-6)
    b = Link("nic0", "nic1", 50e9, 0.93, 5e-6)
    c = Link("nic1", "gpu1", 450e9, 0.9, 1e-6)
    spec = FlowSpec((a, b, c), 3.7e9)
    t = net.start([spec], "kv")
    env.run()
    expect = 7e-6 + 3.7e9 / (50e9 * 0.93)
    assert t.end_s == pytest.approx(expect, rel=1e-12)
    assert net.idle_time_s([spec]) == pytest.approx(expect, rel=1e-12)
    assert t.done.triggered and t.done.value is t
    assert net.bytes_delivered == 3.7e9
    assert net.bytes_sent == pytest.approx(3.7e9, rel=1e-12)


def test_start_later_and_cap_below_bottleneck():
    env = simpy.Environment()
    net = Network(env)
    link = Link("a", "b", 100.0, 0.5, 0.25)
    spec = FlowSpec((link,), 60.0, rate_cap_bytes_s=20.0)
    out = []
    run_at(env, 2.0, lambda: out.append(net.start([spec])))
    env.run()
    assert out[0].start_s == 2.0
    assert out[0].end_s == pytest.approx(2.0 + 0.25 + 60.0 / 20.0, rel=1e-12)
    assert net.idle_time_s([spec]) == pytest.approx(0.25 + 3.0, rel=1e-12)


def test_zero_size_flow_takes_the_latency_and_empty_transfer_is_instant():
    env = simpy.Environment()
    net = Network(env)
    a, b = Link("a", "b", 10.0, latency=0.5), Link("b", "c", 10.0, latency=0.25)
    t0 = net.start([FlowSpec((a, b), 0.0)])
    t1 = net.start([])
    assert t1.done.triggered and t1.end_s == 0.0
    env.run()
    assert t0.end_s == 0.75
    assert net.link_stats() == []  # no link carried bytes


def test_local_flow_without_links():
    env = simpy.Environment()
    net = Network(env)
    t0 = net.start([FlowSpec((), 100.0)])
    t1 = net.start([FlowSpec((), 100.0, rate_cap_bytes_s=50.0)])
    env.run()
    assert t0.end_s == 0.0
    assert t1.end_s == pytest.approx(2.0, rel=1e-12)
    assert net.bytes_sent == pytest.approx(200.0)


# -- sharing ------------------------------------------------------------------------


def test_two_equal_flows_share_a_bottleneck_in_half():
    env = simpy.Environment()
    net = Network(env)
    lat = 1e-3
    link = Link("a", "b", 8e9, 1.0, lat)
    ts = [net.start([FlowSpec((link,), 1e9)]) for _ in range(2)]
    assert list(net.rates().values()) == [4e9, 4e9]
    env.run()
    for t in ts:
        assert t.end_s == pytest.approx(lat + 2 * 1e9 / 8e9, rel=1e-12)


def test_unequal_flows_small_one_finishes_then_large_speeds_up():
    env = simpy.Environment()
    net = Network(env)
    bw, lat, small, large = 10.0, 0.5, 30.0, 100.0
    link = Link("a", "b", bw, 1.0, lat)
    ts = net.start([FlowSpec((link,), small)]), net.start([FlowSpec((link,), large)])
    env.run()
    t_small = 2 * small / bw
    assert ts[0].end_s == pytest.approx(t_small + lat, rel=1e-12)
    assert ts[1].end_s == pytest.approx(t_small + (large - small) / bw + lat, rel=1e-12)
    (s,) = net.link_stats()
    assert s["bytes"] == pytest.approx(small + large, rel=1e-12)
    assert s["busy_s"] == pytest.approx((small + large) / bw, rel=1e-12)
    assert s["peak_rate_bytes_s"] == bw
    # span is [0, last end]; the tail latency leaves the link idle
    assert s["utilization"] == pytest.approx(13.0 / 13.5, rel=1e-12)


def test_a_later_flow_slows_an_earlier_one_whose_first_event_goes_stale():
    env = simpy.Environment()
    net = Network(env)
    link = Link("a", "b", 10.0)
    first = net.start([FlowSpec((link,), 100.0)])  # alone: would end at 10
    later = []
    run_at(env, 4.0, lambda: later.append(net.start([FlowSpec((link,), 20.0)])))
    env.run()
    # 40 B by t=4; then 5 B/s each: the second ends at 8, the first has 40 left at 10 B/s
    assert later[0].end_s == pytest.approx(8.0, rel=1e-12)
    assert first.end_s == pytest.approx(12.0, rel=1e-12)


def test_a_delayed_start_asked_while_a_lone_flow_sends_shares_with_it():
    # The lone flow is kept out of the per-link index; a delayed start on its
    # link must still see the link busy (no delivery planned as if idle).
    env = simpy.Environment()
    net = Network(env)
    link = Link("a", "b", 10.0)
    first = net.start([FlowSpec((link,), 100.0)])  # alone: would end at 10
    second = net.start([FlowSpec((link,), 100.0)], delay_s=1.0)
    env.run()
    # 10 B by t=1; then 5 B/s each: the first's 90 take 18 s (t=19), the
    # second has 10 left then, alone at 10 B/s (t=20)
    assert first.end_s == 19.0
    assert second.end_s == 20.0
    (stats,) = net.link_stats()
    assert stats["bytes"] == pytest.approx(200.0, rel=1e-12)
    assert stats["busy_s"] == pytest.approx(20.0, rel=1e-12)


def test_degrading_and_failing_a_lone_flows_link_re_shares_it():
    env = simpy.Environment()
    net = Network(env)
    a, b = Link("a", "b", 10.0), Link("b", "c", 20.0)
    t = net.start([FlowSpec((a, b), 100.0)])  # alone at 10 B/s: would end at 10
    run_at(env, 2.0, lambda: net.scale_link("a", "b", 0.5))  # 20 B sent; 80 at 5 B/s
    run_at(env, 6.0, lambda: net.fail_link("b", "c"))  # 60 left, stalled (no reroute)
    run_at(env, 9.0, lambda: net.recover_link("b", "c"))  # 12 s more at 5 B/s
    env.run()
    assert t.end_s == pytest.approx(21.0, rel=1e-12)
    by = {(s["src"], s["dst"]): s for s in net.link_stats()}
    assert by["a", "b"]["busy_s"] == pytest.approx(18.0, rel=1e-12)  # not while stalled
    assert by["b", "c"]["bytes"] == pytest.approx(100.0, rel=1e-12)


def test_a_lone_flow_on_a_failing_link_takes_the_other_path():
    env = simpy.Environment()
    a, b = Link("a", "b", 10.0), Link("b", "c", 20.0)
    other = (Link("a", "x", 4.0), Link("x", "c", 4.0))
    net = Network(env, reroute=lambda first, last, down: other if ("b", "c") in down else None)
    t = net.start([FlowSpec((a, b), 100.0)])  # alone at 10 B/s: would end at 10
    run_at(env, 2.0, lambda: net.fail_link("b", "c"))  # 80 left, at 4 B/s on the other
    env.run()
    assert t.end_s == pytest.approx(22.0, rel=1e-12)
    by = {(s["src"], s["dst"]): s["bytes"] for s in net.link_stats()}
    assert by["a", "x"] == pytest.approx(80.0, rel=1e-12)


# -- a flow leaves no load on the links it leaves --------------------------------------
# Each link's reported bytes are those that crossed it: a flow moved off a failed
# link, cancelled or done adds nothing to its old links as time goes on
# (link_stats asked well after the last byte, at 40 s).

TWO_PATHS = {
    "direct": (Link("a", "b", 10.0), Link("b", "c", 20.0)),
    "around": (Link("a", "x", 4.0), Link("x", "c", 4.0)),
}


def two_path_network(series_bucket_s: float | None = None) -> tuple[simpy.Environment, Network]:
    env = simpy.Environment()
    around = TWO_PATHS["around"]
    net = Network(
        env,
        series_bucket_s=series_bucket_s,
        reroute=lambda first, last, down: around if ("b", "c") in down else None,
    )
    return env, net


def stats_by_link(net: Network) -> dict[tuple[str, str], dict]:
    return {(s["src"], s["dst"]): s for s in net.link_stats()}


@pytest.mark.parametrize("bucket", [None, 1.0])
def test_a_flow_rerouted_off_a_failed_link_leaves_its_old_links_what_crossed_them(bucket):
    env, net = two_path_network(bucket)
    t = net.start([FlowSpec(TWO_PATHS["direct"], 100.0)])  # alone at 10 B/s
    run_at(env, 2.0, lambda: net.fail_link("b", "c"))  # 20 B crossed; 80 at 4 B/s
    env.run(until=40.0)
    assert t.end_s == 22.0
    by = stats_by_link(net)
    assert {k: s["bytes"] for k, s in by.items()} == {
        ("a", "b"): 20.0, ("b", "c"): 20.0, ("a", "x"): 80.0, ("x", "c"): 80.0,
    }  # fmt: skip
    assert {k: s["busy_s"] for k, s in by.items()} == {
        ("a", "b"): 2.0, ("b", "c"): 2.0, ("a", "x"): 20.0, ("x", "c"): 20.0,
    }  # fmt: skip
    assert sum(s["bytes"] for s in by.values()) == 100.0 * 2  # its size x 2 hops
    assert by["a", "b"]["utilization"] == 20.0 / (10.0 * 22.0)
    if bucket is not None:
        assert by["a", "b"]["series"] == [[0.0, 10.0, 1.0], [1.0, 10.0, 1.0]]
        for s in by.values():
            assert sum(b for _, b, _ in s["series"]) == s["bytes"]


def test_a_flow_moving_off_a_shared_link_gives_its_share_back():
    # g on a->b->c and h on a->b split a->b (10 B/s) in half; g moves off at 2 s
    env, net = two_path_network()
    g = net.start([FlowSpec(TWO_PATHS["direct"], 100.0)])
    h = net.start([FlowSpec(TWO_PATHS["direct"][:1], 100.0)])
    seen = []
    run_at(env, 2.0, lambda: net.fail_link("b", "c"))  # 10 B each sent
    run_at(env, 3.0, lambda: seen.append(net.rates()))
    env.run(until=40.0)
    assert seen == [{(0, 0): 4.0, (1, 0): 10.0}]  # h alone on a->b now
    assert (g.end_s, h.end_s) == (2.0 + 90.0 / 4.0, 2.0 + 90.0 / 10.0)
    by = stats_by_link(net)
    assert by["a", "b"]["bytes"] == 110.0 and by["a", "b"]["busy_s"] == 11.0
    assert by["b", "c"]["bytes"] == 10.0 and by["b", "c"]["busy_s"] == 2.0
    assert by["a", "x"]["bytes"] == 90.0 == by["x", "c"]["bytes"]


def test_a_group_member_moved_off_a_failed_rail_leaves_its_rail_what_crossed_it():
    # two shards on rails 0 and 1 move as one group; rail 0 fails at 2 s
    env = simpy.Environment()
    rail = [(Link(f"a{i}", f"s{i}", 10.0), Link(f"s{i}", f"c{i}", 10.0)) for i in (0, 1)]
    around = (Link("a0", "x", 4.0), Link("x", "c0", 4.0))
    net = Network(env, reroute=lambda first, last, down: around if ("s0", "c0") in down else None)
    t = net.start([FlowSpec(rail[0], 100.0), FlowSpec(rail[1], 100.0)])
    assert net.groups() == [(0, (0, 1))]
    run_at(env, 2.0, lambda: net.fail_link("s0", "c0"))
    env.run(until=40.0)
    assert t.end_s == 22.0
    assert {k: s["bytes"] for k, s in stats_by_link(net).items()} == {
        ("a0", "s0"): 20.0, ("s0", "c0"): 20.0, ("a0", "x"): 80.0, ("x", "c0"): 80.0,
        ("a1", "s1"): 100.0, ("s1", "c1"): 100.0,
    }  # fmt: skip
    assert stats_by_link(net)["a0", "s0"]["busy_s"] == 2.0


def test_a_cancelled_flow_leaves_its_links_what_crossed_them():
    env, net = two_path_network()
    t = net.start([FlowSpec(TWO_PATHS["direct"], 100.0)])
    run_at(env, 3.0, lambda: net.cancel(t))
    env.run(until=40.0)
    by = stats_by_link(net)
    assert [by[k]["bytes"] for k in [("a", "b"), ("b", "c")]] == [30.0, 30.0]
    assert [by[k]["busy_s"] for k in [("a", "b"), ("b", "c")]] == [3.0, 3.0]


def test_textbook_max_min_three_levels():
    # chain x -A-> y -B-> z -C-> w
    A, B, C = Link("x", "y", 6.0), Link("y", "z", 10.0), Link("z", "w", 4.0)
    env = simpy.Environment()
    net = Network(env)
    paths = [(A, B), (A,), (B, C), (C,), (B,)]
    for p in paths:
        net.start([FlowSpec(p, 1000.0)])
    # C fills first at 2 each; then A at 3 each; B's last flow takes the 5 left
    assert list(net.rates().values()) == pytest.approx([3.0, 3.0, 2.0, 2.0, 5.0], rel=1e-12)
    assert net.max_link_load_ratio == pytest.approx(1.0, rel=1e-12)
    # a cap on the last flow leaves B short of full
    env = simpy.Environment()
    net = Network(env)
    for i, p in enumerate(paths):
        net.start([FlowSpec(p, 1000.0, rate_cap_bytes_s=4.0 if i == 4 else None)])
    assert list(net.rates().values()) == pytest.approx([3.0, 3.0, 2.0, 2.0, 4.0], rel=1e-12)


def test_near_ties_and_caps_just_below_a_share_are_exact():
    # B's share (5.025) is within 1% of A's (5); a cap just below the link rate binds
    A, B = Link("x", "y", 10.0), Link("u", "v", 10.05)
    env = simpy.Environment()
    net = Network(env)
    for p in [(A,), (A,), (B,), (B,)]:
        net.start([FlowSpec(p, 100.0)])
    net.start([FlowSpec((Link("p", "q", 10.0),), 100.0, rate_cap_bytes_s=9.99)])
    assert list(net.rates().values()) == pytest.approx([5.0, 5.0, 5.025, 5.025, 9.99], rel=1e-12)


def test_max_min_rates_pure():
    rates = max_min_rates(
        [("A", "B"), ("A",), ("B", "C"), ("C",)],
        [None, None, None, None],
        {"A": 10.0, "B": 4.0, "C": 10.0},
    )
    assert rates == pytest.approx([2.0, 8.0, 2.0, 8.0], rel=1e-12)
    assert max_min_rates([(), ("A",)], [None, 0.0], {"A": 1.0}) == [float("inf"), 0.0]


def test_flows_of_one_transfer_share_too():
    env = simpy.Environment()
    net = Network(env)
    a, b = Link("g0", "sw", 10.0), Link("g1", "sw", 10.0)
    up = Link("sw", "h", 15.0)
    t = net.start([FlowSpec((a, up), 30.0), FlowSpec((b, up), 60.0)])
    env.run()
    # 7.5 each until the first has 30 at t=4; then the second runs at 10 for 30 more
    assert t.end_s == pytest.approx(4.0 + 3.0, rel=1e-12)
    assert t.size_bytes == 90.0
    stats = {(s["src"], s["dst"]): s for s in net.link_stats()}
    assert list(stats) == [("g0", "sw"), ("g1", "sw"), ("sw", "h")]
    assert stats["g0", "sw"]["busy_s"] == pytest.approx(4.0, rel=1e-12)
    assert stats["g1", "sw"]["busy_s"] == pytest.approx(7.0, rel=1e-12)
    assert stats["g1", "sw"]["peak_rate_bytes_s"] == 10.0
    assert stats["sw", "h"]["peak_rate_bytes_s"] == 15.0
    assert stats["sw", "h"]["utilization"] == pytest.approx(90.0 / (15.0 * 7.0), rel=1e-12)


# -- caps and layer-wise streaming ---------------------------------------------------


def test_set_cap_mid_transfer_matches_hand_computation():
    env = simpy.Environment()
    net = Network(env)
    size, bw, r, T, lat = 1000.0, 100.0, 10.0, 30.0, 0.01
    link = Link("p", "d", bw, 1.0, lat)
    t = net.start([FlowSpec((link,), size, rate_cap_bytes_s=r)])
    assert list(net.rates().values()) == [r]
    run_at(env, T, lambda: t.set_cap(None))
    env.run()
    assert t.end_s == pytest.approx(T + (size - r * T) / bw + lat, rel=1e-12)


def test_zero_cap_stalls_until_lifted():
    env = simpy.Environment()
    net = Network(env)
    link = Link("p", "d", 10.0)
    t = net.start([FlowSpec((link,), 50.0, rate_cap_bytes_s=0.0)])
    run_at(env, 3.0, lambda: t.set_cap(25.0))
    env.run()
    assert t.end_s == pytest.approx(3.0 + 5.0, rel=1e-12)  # link (10) binds, not the cap


def test_layer_wise_residual_is_small_when_link_outruns_production():
    # KV produced at a steady rate during a prefill of Tp seconds; the link is
    # 4x faster, so streaming keeps up and only the latency shows afterwards.
    kv, Tp, lat = 2e9, 0.2, 2e-5
    r = kv / Tp
    link = Link("prefill", "decode", 4 * r, 1.0, lat)
    env = simpy.Environment()
    net = Network(env)
    t = net.start([FlowSpec((link,), kv, rate_cap_bytes_s=r * 0.98)])
    run_at(env, Tp, lambda: t.set_cap(None))
    env.run()
    residual = t.end_s - Tp
    whole = kv / (4 * r) + lat  # sending everything after prefill
    assert residual == pytest.approx(0.02 * kv / (4 * r) + lat, rel=1e-9)
    assert residual < 0.05 * whole


def test_layer_wise_when_link_is_the_bottleneck_cap_does_not_bind():
    kv, Tp = 1000.0, 1.0
    link = Link("p", "d", 250.0)
    env = simpy.Environment()
    net = Network(env)
    t = net.start([FlowSpec((link,), kv, rate_cap_bytes_s=kv / Tp)])
    run_at(env, Tp, lambda: t.set_cap(None))
    env.run()
    assert t.end_s == pytest.approx(kv / 250.0, rel=1e-12)


# -- validation ----------------------------------------------------------------------


def test_validation_errors_name_the_value():
    a, b = Link("a", "b", 10.0), Link("c", "d", 10.0)
    with pytest.raises(SpecError, match=r"size_bytes=-1\.0"):
        FlowSpec((a,), -1.0)
    with pytest.raises(SpecError, match=r"size_bytes=nan"):
        FlowSpec((a,), float("nan"))
    with pytest.raises(SpecError, match=r"rate_cap_bytes_s=-5"):
        FlowSpec((a,), 1.0, rate_cap_bytes_s=-5)
    with pytest.raises(SpecError, match=r"link 0 \(a -> b\) ends at 'b' but link 1 \(c -> d\)"):
        FlowSpec((a, b), 1.0)
    with pytest.raises(SpecError, match=r"link a -> b: usable capacity 0\.0"):
        FlowSpec((Link("a", "b", 10.0, 0.0),), 1.0)
    with pytest.raises(SpecError, match=r"link a -> b: latency_s=-1"):
        FlowSpec((Link("a", "b", 10.0, 1.0, -1),), 1.0)
    env = simpy.Environment()
    net = Network(env)
    t = net.start([FlowSpec((a,), 1.0)])
    with pytest.raises(SpecError, match=r"transfer 0 .*rate_cap_bytes_s=-1"):
        t.set_cap(-1.0)
    with pytest.raises(SpecError, match=r"link a -> b: usable capacity 20\.0.*already has 10\.0"):
        net.start([FlowSpec((Link("a", "b", 20.0),), 1.0)])


# -- invariants ----------------------------------------------------------------------

NODES = "abcde"


@st.composite
def scenarios(draw):
    # a few round capacities and caps, so that ties and near-ties are common
    caps = {
        (s, d): draw(st.sampled_from([10.0, 10.05, 20.0]) | st.floats(1.0, 100.0))
        for s in NODES
        for d in NODES
        if s != d
    }
    lats = {k: draw(st.sampled_from([0.0, 0.001, 0.1])) for k in caps}
    links = {k: Link(k[0], k[1], c, 0.9, lats[k]) for k, c in caps.items()}

    def path():
        nodes = draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True))
        return tuple(links[(u, v)] for u, v in zip(nodes, nodes[1:], strict=False))

    transfers = []
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0.0, 5.0))
        flows = [
            FlowSpec(
                path(),
                draw(st.sampled_from([0.0, 1e-7]) | st.floats(0.0, 500.0)),
                draw(st.sampled_from([None, 0.0, 4.5, 8.8, 9.0]) | st.floats(0.5, 50.0)),
            )
            for _ in range(draw(st.integers(0, 3)))
        ]
        # a zero cap stalls a flow until a later cap lifts it
        stalled = any(f.rate_cap_bytes_s == 0.0 for f in flows)
        when = st.floats(0.0, 5.0)
        later = st.none() | st.floats(0.5, 80.0)
        recap = draw(st.tuples(when, later) if stalled else st.none() | st.tuples(when, later))
        transfers.append((at, flows, recap))
    return sorted(transfers, key=lambda x: x[0])


def loosest(spec: FlowSpec, cap: float | None) -> FlowSpec:
    """``spec`` with the looser of its cap and ``cap``."""
    c = spec.rate_cap_bytes_s
    return FlowSpec(spec.path, spec.size_bytes, None if c is None or cap is None else max(c, cap))


@settings(max_examples=75, deadline=None)
@given(scenarios())
def test_invariants(scenario):  # noqa: C901
    env = simpy.Environment()
    net = Network(env)
    started = []  # (transfer, flows)
    recapped: dict[int, float | None] = {}  # transfer id -> cap set later
    fired: dict[int, list[float]] = {}
    clock = []

    def check_rates():
        load: dict[tuple[str, str], float] = {}
        usable = {}
        for (tid, i), r in net.rates().items():
            assert r >= 0.0
            spec = started[tid][1][i]
            cap = recapped[tid] if tid in recapped else spec.rate_cap_bytes_s
            if cap is not None:
                assert r <= cap * (1 + 1e-12)
            for link in spec.path:
                k = (link.src, link.dst)
                load[k] = load.get(k, 0.0) + r
                usable[k] = link.usable_bytes_s
        for k, v in load.items():
            assert v <= usable[k] * (1 + 1e-9)
        # max-min fairness: every flow is at its cap, or crosses a full link on
        # which no flow gets more than it does
        top: dict[tuple[str, str], float] = {}
        for (tid, i), r in net.rates().items():
            for link in started[tid][1][i].path:
                k = (link.src, link.dst)
                top[k] = max(top.get(k, 0.0), r)
        for (tid, i), r in net.rates().items():
            spec = started[tid][1][i]
            cap = recapped[tid] if tid in recapped else spec.rate_cap_bytes_s
            at_cap = cap is not None and r >= cap * (1 - 1e-9)
            keys = [(link.src, link.dst) for link in spec.path]
            held = any(load[k] >= usable[k] * (1 - 1e-9) and r >= top[k] * (1 - 1e-9) for k in keys)
            assert at_cap or held, (tid, i, r)

    def on_done(ev):
        clock.append(env.now)
        fired.setdefault(ev.value.id, []).append(env.now)

    def recap(t, cap):
        t.set_cap(cap)
        recapped[t.id] = cap
        check_rates()

    def driver():
        for at, flows, rc in scenario:
            yield env.timeout(at - env.now)
            t = net.start(flows, "x")
            assert t.id == len(started)
            started.append((t, flows))
            t.done.callbacks.append(on_done)
            check_rates()
            if rc is not None:
                when, cap = rc
                run_at(env, env.now + when, lambda t=t, c=cap: recap(t, c))

    env.process(driver())
    env.run()
    assert net.max_link_load_ratio <= 1 + 1e-9
    assert clock == sorted(clock)
    total = sum(f.size_bytes for _, flows in started for f in flows)
    assert net.bytes_delivered == pytest.approx(total, rel=1e-12, abs=1e-12)
    assert net.bytes_sent == pytest.approx(net.bytes_delivered, rel=1e-6, abs=1e-5)
    for t, flows in started:
        assert fired[t.id] == [t.end_s]  # done once, at end_s
        if t.id in recapped:
            flows = [loosest(f, recapped[t.id]) for f in flows]
        # a flow is done once under ABS_DONE bytes remain (twin/net/flows.py)
        flows = [
            FlowSpec(f.path, max(0.0, f.size_bytes - ABS_DONE), f.rate_cap_bytes_s) for f in flows
        ]
        floor = net.idle_time_s(flows)
        assert t.end_s - t.start_s >= floor * (1 - 1e-9) - 1e-12
    links = net.link_stats()
    assert [(s["src"], s["dst"]) for s in links] == sorted((s["src"], s["dst"]) for s in links)
    for s in links:
        assert 0.0 < s["utilization"] <= 1 + 1e-9
        assert s["peak_rate_bytes_s"] <= s["usable_bytes_s"] * (1 + 1e-9)
    # bytes are conserved on every link: each flow's whole size crossed each
    # link of its path, so the links together carry sum(size x hops)
    crossed: dict[tuple[str, str], float] = {}
    for _, flows in started:
        for f in flows:
            for link in f.path:
                k = (link.src, link.dst)
                crossed[k] = crossed.get(k, 0.0) + f.size_bytes
    got = {(s["src"], s["dst"]): s["bytes"] for s in links}
    assert got.keys() <= crossed.keys()
    for k, b in crossed.items():
        assert got.get(k, 0.0) == pytest.approx(b, rel=1e-9, abs=1e-4), k  # (ABS_DONE each)
    hops = sum(f.size_bytes * len(f.path) for _, flows in started for f in flows)
    assert sum(got.values()) == pytest.approx(hops, rel=1e-9, abs=1e-3)
    # and nothing more crosses them once every flow is done
    env.run(until=env.now + 10.0)
    assert net.link_stats() == links


@st.composite
def reroutes(draw):
    """Transfers on the two paths a->b->c and a->x->c (capacities drawn) and
    on a->b alone, while b->c fails and is perhaps repaired."""
    cap = st.sampled_from([4.0, 10.0, 20.0]) | st.floats(1.0, 50.0)
    ends = [("a", "b"), ("b", "c"), ("a", "x"), ("x", "c")]
    links = {k: Link(k[0], k[1], draw(cap)) for k in ends}
    paths = {
        "direct": (links["a", "b"], links["b", "c"]),
        "around": (links["a", "x"], links["x", "c"]),
        "first": (links["a", "b"],),
    }
    transfers = []
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 10.0))
        kinds = draw(st.lists(st.sampled_from(["direct", "first"]), min_size=1, max_size=3))
        size = draw(st.sampled_from([50.0, 100.0]) | st.floats(1.0, 300.0))
        transfers.append((at, [FlowSpec(paths[k], size) for k in kinds]))
    fail = draw(st.floats(0.0, 10.0))
    repair = draw(st.none() | st.floats(0.0, 10.0))
    return paths, sorted(transfers, key=lambda x: x[0]), fail, repair


@settings(max_examples=40, deadline=None)
@given(reroutes())
def test_a_failing_link_moves_flows_and_their_bytes_are_conserved(case):
    paths, transfers, fail, repair = case
    env = simpy.Environment()
    net = Network(
        env, reroute=lambda first, last, down: paths["around"] if ("b", "c") in down else None
    )
    run_at(env, fail, lambda: net.fail_link("b", "c"))
    if repair is not None:
        run_at(env, fail + repair, lambda: net.recover_link("b", "c"))
    started = []

    def driver():
        for at, flows in transfers:
            yield env.timeout(at - env.now)
            started.append(net.start(flows))

    env.process(driver())
    env.run()
    env.run(until=env.now + 10.0)  # nothing more crosses a link once all are done
    assert all(t.end_s is not None for t in started)
    got = {k: s["bytes"] for k, s in stats_by_link(net).items()}

    def on(src, dst):
        return got.get((src, dst), 0.0)

    through = sum(f.size_bytes for _, flows in transfers for f in flows if len(f.path) == 2)
    first = sum(f.size_bytes for _, flows in transfers for f in flows if len(f.path) == 1)
    # each a->c flow crosses either b or x with every byte, then on to c
    assert on("b", "c") + on("a", "x") == pytest.approx(through, rel=1e-9, abs=1e-4)
    assert on("a", "b") == pytest.approx(on("b", "c") + first, rel=1e-9, abs=1e-4)
    assert on("x", "c") == pytest.approx(on("a", "x"), rel=1e-9, abs=1e-4)
    for s in net.link_stats():
        assert s["busy_s"] * s["usable_bytes_s"] >= s["bytes"] * (1 - 1e-9)
        assert s["utilization"] <= 1 + 1e-9


def test_events_stay_linear_in_flows_and_stale_ones_do_nothing():
    # Each start re-shares and arms a new completion event; the events armed
    # before it go stale and must not re-arm more (nor move bytes twice).
    env = simpy.Environment()
    net = Network(env)
    link = Link("a", "b", 1e9, 1.0, 1e-6)
    n = 40
    ts = []

    def driver():
        for _ in range(n):
            ts.append(net.start([FlowSpec((link,), 1e9)]))
            yield env.timeout(0.01)

    env.process(driver())
    steps = 0
    while env.peek() < float("inf"):
        env.step()
        steps += 1
    # per flow: a driver timeout, the event armed at its start (stale by the
    # next re-share, but SimPy cannot cancel it), the one armed at a completion
    # and a delivery (``done`` is an event only once asked for); plus the
    # driver's start, less the last flow's completion: it finishes alone, so
    # only its delivery, planned when it was left alone, is an event
    assert steps == 4 * n
    assert net.bytes_sent == pytest.approx(n * 1e9, rel=1e-9)
    # processor sharing on one link: all started by 0.39, every byte at 1 GB/s
    assert max(t.end_s for t in ts) == pytest.approx(n * 1.0 + 1e-6, rel=1e-12)


def test_link_bytes_over_time_fill_the_buckets_they_cover():
    env = simpy.Environment()
    net = Network(env, series_bucket_s=1.0)
    link = Link("a", "b", 100.0)
    # 200 bytes at 100 B/s from t=0.5: busy over [0.5, 2.5)
    run_at(env, 0.5, lambda: net.start([FlowSpec((link,), 200.0)]))
    env.run()
    (stats,) = net.link_stats()
    assert stats["series"] == [
        [0.0, pytest.approx(50.0), pytest.approx(0.5)],
        [1.0, pytest.approx(100.0), pytest.approx(1.0)],
        [2.0, pytest.approx(50.0), pytest.approx(0.5)],
    ]
    assert sum(b for _, b, _ in stats["series"]) == pytest.approx(stats["bytes"])
    with pytest.raises(SpecError, match="must be > 0"):
        Network(env, series_bucket_s=0.0)
