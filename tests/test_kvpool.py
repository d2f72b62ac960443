"""Mooncake's KV pool on the KV tiers' machinery: a node's DRAM pool and the
SSD below it, exact copy / write-down / fetch traces and conservation."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from twin.net.flows import Network
from twin.net.topology import load_topology
from twin.perf.gpus import get_gpu
from twin.request import Request
from twin.serving.cluster import Placement
from twin.serving.kvpool import KVPools, PoolSSD
from twin.serving.sequence import Sequence

K = 62_500  # KV bytes per token: a 16-token unit (one block) is 1 MB
MB = 1e6


class Instance:
    """What a pool sees of an engine: its id, what it caches, what it is given."""

    def __init__(self, env: simpy.Environment, i: int, cached: int = 0) -> None:
        self.env = env
        self.id = i
        self.cached = cached
        self.submitted: list[tuple[float, int, int]] = []  # (time, request, preloaded)

    def cached_prefix_tokens(self, req: Request) -> int:
        return self.cached

    def submit(self, seq: Sequence) -> None:
        self.submitted.append((self.env.now, seq.req.id, seq.preloaded_tokens))


TOPO = load_topology("dgx-h100-ib400", nodes=2)


def pools(dram_units: int, ssd_units: int | None):
    env = simpy.Environment()
    topo = TOPO
    # instance 0 on node 0's first 4 GPUs, instance 1 on node 1's
    placements = [Placement(0, 0, (0, 1, 2, 3)), Placement(1, 1, (8, 9, 10, 11))]
    ssd = None if ssd_units is None else PoolSSD(ssd_units * MB, 13e9, 6.6e9, 1e-4)
    p = KVPools(env, dram_units * MB, topo, placements, Network(env), K, 16, ssd)
    return env, topo, p, [Instance(env, 0), Instance(env, 1)]


def prompt(i: int, hashes: tuple[int, ...], at: float = 0.0) -> Sequence:
    return Sequence(Request(i, at, 16 * len(hashes), 1, hashes, 16), at)


def test_a_unit_goes_from_hbm_to_the_dram_pool_to_its_ssd_and_is_fetched_back():
    env, topo, p, (e0, e1) = pools(dram_units=2, ssd_units=10)
    dram, ssd = p.chains[0].tiers
    # instance 0's 4 GPUs, each its shard, at the H100's 64 GB/s PCIe less
    # 128b/130b encoding and 24 bytes a 256-byte packet: 230.46 GB/s
    assert get_gpu("h100-sxm").pcie_bytes_s == 64e9
    pcie = 4 * 64e9 * 128 / 130 * 256 / 280
    # at 0: A's 2 units (2 MB) are copied over instance 0's PCIe links
    p.keep_prompt(e0, prompt(0, (1, 2)))
    a_in = 2 * MB / pcie
    assert [dram.units[h][1] for h in (1, 2)] == pytest.approx([a_in] * 2)
    # B's copy goes after it; to make room A leaves DRAM for the SSD, written once
    # it is in DRAM: 100 us + 2 MB at 6.6 GB/s
    p.keep_prompt(e0, prompt(1, (3, 4)))
    assert [dram.units[h][1] for h in (3, 4)] == pytest.approx([2 * a_in] * 2)
    a_ssd = a_in + 1e-4 + 2 * MB / 6.6e9
    assert list(dram.units) == [3, 4] and list(ssd.units) == [1, 2]
    assert [ssd.units[h][1] for h in (1, 2)] == pytest.approx([a_ssd] * 2)
    assert p.bytes_copied == 4 * MB and ssd.bytes_written == 2 * MB
    # a router sees A once it is on the SSD, B once copied
    req_a = prompt(2, (1, 2)).req
    env.run(until=a_in)
    assert p.prefix(req_a) == {}
    env.run(until=a_ssd + 1e-9)
    assert p.prefix(req_a) == {0: 32}
    # at 1 s instance 1 (node 1) fetches A: the SSD reads its 2 units (100 us +
    # 2 MB at 13 GB/s) into node 0's host memory, then 31 tokens (the last is
    # computed) cross the network, a shard per GPU over its 400 Gb/s NIC
    env.run(until=1.0)
    p.fetch_then_submit(prompt(2, (1, 2), 1.0), e1, 0, "mooncake")
    staged = 1.0 + 1e-4 + 2 * MB / 13e9
    nbytes = 31 * K
    path = topo.path(0, 8)
    rate = min(link.capacity_bytes_s * link.efficiency for link in path)
    wire = topo.latency_s(path) + nbytes / 4 / rate
    env.run()
    assert e1.submitted == [(pytest.approx(staged + wire, rel=1e-9), 2, 31)]
    assert ssd.hit_tokens == 31 and ssd.bytes_read == 2 * MB and p.bytes_fetched == nbytes
    # the pool keeps what it serves, as the most recently used
    assert list(ssd.units) == [1, 2]
    # instance 0 (node 0) fetches B from DRAM: only its PCIe time
    t = env.now
    p.fetch_then_submit(prompt(3, (3, 4), t), e0, 0, "mooncake")
    env.run()
    assert e0.submitted == [(pytest.approx(t + 31 * K / pcie), 3, 31)]
    s = p.summary(100)
    assert s["dram"]["hit_tokens"] == 31 and s["ssd"]["hit_rate"] == 0.31
    assert s["ssd"]["final_bytes"] == 2 * MB and s["dram"]["bytes_written"] == 4 * MB


def test_a_prompt_the_pool_holds_already_is_not_copied_again():
    env, _, p, (e0, _) = pools(dram_units=2, ssd_units=10)
    p.keep_prompt(e0, prompt(0, (1, 2)))
    p.keep_prompt(e0, prompt(1, (3, 4)))  # A to the SSD
    p.keep_prompt(e0, prompt(2, (1, 2)))  # on the SSD: touched, not copied
    assert p.bytes_copied == 4 * MB
    assert list(p.chains[0].tiers[1].units) == [1, 2]


def test_a_failed_node_loses_its_dram_and_ssd_pool():
    env, _, p, (e0, _) = pools(dram_units=2, ssd_units=10)
    p.keep_prompt(e0, prompt(0, (1, 2)))
    p.keep_prompt(e0, prompt(1, (3, 4)))
    assert p.used_bytes(0) == 4 * MB
    p.fail_node(0)
    assert p.used_bytes(0) == 0 and all(not t.units for t in p.chains[0].tiers)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["keep", "fetch"]), st.integers(0, 1), st.integers(0, 7),
            st.integers(1, 4), st.floats(1e-6, 0.001),
        ),
        min_size=1, max_size=30,
    ),
    st.integers(1, 4), st.one_of(st.none(), st.integers(1, 6)),
)  # fmt: skip
def test_pool_blocks_are_conserved_across_its_tiers(ops, dram_units, ssd_units):
    env, _, p, engines = pools(dram_units, ssd_units)
    fetches = 0
    for i, (op, inst, first, n, gap) in enumerate(ops):
        env.run(until=env.now + gap)
        seq = prompt(i, tuple(range(first, first + n)), env.now)
        if op == "keep":
            p.keep_prompt(engines[inst], seq)
        elif p.prefix(seq.req):
            p.fetch_then_submit(seq, engines[inst], 0, "mooncake")
            fetches += 1
        for chain in p.chains:
            held = [set(t.units) for t in chain.tiers]
            assert not (len(held) == 2 and held[0] & held[1]), "a unit in DRAM and on SSD"
            for t in chain.tiers:
                assert t.used_blocks == sum(int(u[0]) for u in t.units.values())
                assert 0 <= t.used_blocks <= t.capacity_blocks
    env.run()
    # every fetch ends in its request's submission, with what it loaded
    done = sorted(s for e in engines for s in e.submitted)
    assert len(done) == fetches and all(pre % 16 in (0, 15) for _, _, pre in done)
    assert not any(p._loading.values())


def test_mooncake_fetches_from_the_pools_ssd_end_to_end_and_the_table_shows_it():
    from test_mooncake import spec as mooncake_spec

    from twin.sim.simulation import Simulation
    from twin.studies.compare import CompareResult

    cluster = {
        "topology": "dgx-h100-ib400", "nodes": 2, "kv_pool": "1 GiB", "kv_pool_ssd": "64 GiB",
        "prefill": {"instances": 2, "tp": 1}, "decode": {"instances": 2, "tp": 1},
    }  # fmt: skip
    # 16 units of Llama-3.1-8B's KV (64 MiB a 512-token unit) fit a node's DRAM
    # pool: twenty 8-unit prompts overflow it to the SSD, and each comes back
    # one unit longer
    reqs = []
    for turn in range(2):
        for chat in range(20):
            units = 8 + turn
            hashes = tuple(chat * 1000 + k for k in range(units))
            reqs.append(Request(len(reqs), 0.5 * len(reqs), units * 512, 4, hashes, 512))
    engine = {"prefix_caching": True, "gpu_memory_utilization": 0.3}
    s = mooncake_spec(cluster=cluster, engine=engine, slo={"ttft": "30 s", "tpot": "1 s"})
    result = Simulation(s, requests=reqs).run()
    pool = result.summary["kv_pool"]
    assert pool["dram"]["capacity_bytes"] == 2 * 2**30  # two nodes
    assert pool["ssd"]["bytes_written"] > 0 and pool["ssd"]["hit_tokens"] > 0
    assert pool["dram"]["bytes_written"] == result.summary["kv_bytes_copied"]
    header = {"version": "x", "name": "t", "model": "m", "seed": 0,
              "slo": {"ttft": None, "tpot": None}}  # fmt: skip
    table = CompareResult(header, {"pool": result}).format_table().splitlines()
    assert table[2].split()[-3:] == ["pool", "SSD", "%"]
    both = pool["dram"]["hit_rate"] + pool["ssd"]["hit_rate"]
    assert table[4].split()[-2:] == [f"{100 * both:.1f}", f"{100 * pool['ssd']['hit_rate']:.1f}"]


def hold(p: KVPools, node: int, dram: tuple[int, ...] = (), ssd: tuple[int, ...] = ()) -> None:
    """Put one-block units into ``node``'s DRAM and SSD pool, readable from 0 s."""
    for tier, hashes in zip(p.chains[node].tiers, (dram, ssd), strict=False):
        for h in hashes:
            tier.units[h] = [1, 0.0]
            tier.used_blocks += 1


def wire_s(topo, inst: int, tokens: int) -> float:
    """The prefix's way to instance ``inst`` from node 0's host memory, by hand."""
    if inst == 0:  # inside node 0: its 4 GPUs' PCIe links at the payload share
        return tokens * K / (4 * 64e9 * 128 / 130 * 256 / 280)
    path = topo.path(0, 8)  # a shard per GPU, each over its own NIC
    rate = min(link.capacity_bytes_s * link.efficiency for link in path)
    return topo.latency_s(path) + tokens * K / 4 / rate


@pytest.mark.parametrize(
    "dram, ssd", [((1, 2, 3, 4), ()), ((), (1, 2, 3, 4)), ((1, 3), (2, 4))],
    ids=["dram", "ssd", "mixed"],
)  # fmt: skip
@pytest.mark.parametrize("inst", [0, 1], ids=["same-node", "other-node"])
def test_the_fetch_estimate_is_the_fetch_time(dram, ssd, inst):
    env, topo, p, engines = pools(dram_units=10, ssd_units=10)
    hold(p, 0, dram, ssd)
    seq = prompt(0, (1, 2, 3, 4))
    req = seq.req
    tokens = min(p.prefix(req)[0], req.prompt_tokens - 1)  # 63: the last is computed
    estimate = p.estimate_s(inst, 0, tokens, req)
    # the SSD reads its units whole (1 MB each) after its 100 us, then 63 tokens travel
    ssd_s = 1e-4 + len(ssd) * MB / 13e9 if ssd else 0.0
    assert estimate == pytest.approx(ssd_s + wire_s(topo, inst, tokens), rel=1e-12)
    # priced as if all were in DRAM, without the request
    assert p.estimate_s(inst, 0, tokens) == pytest.approx(wire_s(topo, inst, tokens), rel=1e-12)
    p.fetch_then_submit(seq, engines[inst], 0, "mooncake")
    env.run()
    [(at, _, loaded)] = engines[inst].submitted
    assert loaded == tokens
    if inst == 0:
        assert at == estimate  # the same sums: exact
    else:
        assert at == pytest.approx(estimate, rel=1e-12)  # the network's flows, to rounding


def test_mooncake_computes_locally_instead_of_fetching_a_prefix_from_the_ssd():
    import schedulers.mooncake  # noqa: F401 - registers the policy when not installed
    from twin.scheduler import ClusterView, InstanceSnapshot, Objectives, Route, build_scheduler

    class Priced:
        """A hand-built prefill view whose fetch estimate is the pool's."""

        def __init__(self, snap: InstanceSnapshot, pools: KVPools) -> None:
            self._snap, self._pools = snap, pools

        def __getattr__(self, name: str):
            return getattr(self._snap, name)

        def estimate_fetch_s(self, node: int, tokens: int, req: Request | None = None) -> float:
            return self._pools.estimate_s(self._snap.id, node, tokens, req)

    # 9 units asked for; node 0's pool holds the first 8 (128 tokens), instance
    # 0 (on node 0) the first 7 in HBM behind a 0.4 ms queue, instance 1 (node 1)
    # none: it would fetch the 8 units over the network (about 45 us from DRAM,
    # 0.7 ms more from the SSD: 100 us + 8 MB at 13 GB/s); 1 us a computed token
    req = Request(0, 0.0, 9 * 16, 4, tuple(range(1, 10)), 16)
    policy = build_scheduler("mooncake", {"min_fetch_tokens": 32})
    chosen = {}
    for where in ("dram", "ssd"):
        env, topo, p, _ = pools(dram_units=10, ssd_units=10)
        hold(p, 0, **{where: tuple(range(1, 9))})
        cheap = {"prefill_s_per_token": 1e-6}
        views = [
            Priced(InstanceSnapshot(0, role="prefill", node=0, queue_s=4e-4,
                                    cached_hashes=frozenset(range(1, 8)), **cheap), p),
            Priced(InstanceSnapshot(1, role="prefill", node=1, **cheap), p),
            InstanceSnapshot(2, role="decode"),
        ]  # fmt: skip
        view = ClusterView(views, 0.0, Objectives(10.0, 1.0), p.prefix)
        ttft, _, _ = policy.prefill_choice(req, view)
        fetch = wire_s(topo, 1, 128) + (1e-4 + 8 * MB / 13e9 if where == "ssd" else 0.0)
        assert ttft == pytest.approx(min(4e-4 + 32e-6, fetch + 16e-6), rel=1e-9)
        chosen[where] = policy.route(req, view)
    assert chosen == {"dram": Route(1, 2, fetch_from=0), "ssd": Route(0, 2)}
