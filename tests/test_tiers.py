"""KV tiers below HBM: exact eviction and reload traces, and conservation under Hypothesis."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from twin._clock import Arrival
from twin.perf.iteration import Batch
from twin.request import Request
from twin.serving.engine import Engine, EngineConfig
from twin.serving.kvcache import BlockManager
from twin.serving.observer import Observer
from twin.serving.sequence import Sequence
from twin.serving.tiers import KVTiers, Tier, TierChain

MB = 1e6


class Linear:
    """10 ms + 0.1 ms per prefill token + 1 ms per decoding sequence."""

    name = "linear"
    sha256 = None

    def __init__(self) -> None:
        self.check = None

    def iteration_time(self, b: Batch) -> float:
        if self.check is not None:
            self.check()
        return 0.01 + 1e-4 * b.prefill_tokens + 1e-3 * b.decode_count


class Done(Observer):
    def __init__(self) -> None:
        self.done: list[Sequence] = []

    def request_ended(self, now, instance, req, seq, status, reason) -> None:
        self.done.append(seq)


def run(reqs, *, hbm_blocks, tiers, check=None, setup=None):
    """One instance (16-token blocks, one block per prefix unit) whose prefix
    cache has ``tiers`` ((name, blocks, read B/s, write B/s, latency s)) below,
    1 MB per block; requests are submitted through the tiers."""
    env = simpy.Environment()
    perf = Linear()
    obs = Done()
    cfg = EngineConfig(prefix_caching=True, watermark=0.0)
    chain = TierChain(env, [Tier(*t) for t in tiers], MB)
    eng = Engine(env, 0, perf, BlockManager(hbm_blocks, 16), cfg, obs, tiers=chain)
    kvt = KVTiers(env)
    kvt.add(0, chain)
    if check is not None:
        perf.check = lambda: check(eng, chain)
    if setup is not None:
        setup(chain)

    def arrive():
        for r in reqs:
            if r.arrival_s > env.now:
                yield Arrival(env, r.arrival_s - env.now)
            kvt.submit(Sequence(r, env.now), eng)

    env.process(arrive())
    env.run()
    return eng, chain, {s.req.id: s for s in obs.done}


A = (1, 2, 3, 4)
B = (5, 6, 7, 8)


def test_an_evicted_prefix_goes_to_dram_and_comes_back_on_the_next_request():
    # HBM holds 4 blocks: r1 evicts r0's 4 units to DRAM (1 ms a block at 1 GB/s),
    # r2 has r0's prefix and loads it back before it is admitted.
    reqs = [Request(0, 0.0, 64, 1, A, 16), Request(1, 0.1, 64, 1, B, 16),
            Request(2, 0.2, 64, 1, A, 16)]  # fmt: skip
    eng, chain, done = run(reqs, hbm_blocks=4, tiers=[("dram", 8, 1e9, 1e9, 0.0)])
    dram = chain.tiers[0]
    r0, r1, r2 = done[0], done[1], done[2]
    assert r0.t_prefill_done == pytest.approx(0.01 + 64e-4)  # 16.4 ms, nothing cached
    # r1's admission evicted A (4 blocks): one write, 0.100 -> 0.104 s; A's HBM
    # blocks are held until it ends, so r1 waits for them
    assert r1.t_scheduled == pytest.approx(0.104) and r1.cached_tokens == 0
    # r2 at 0.2: A is in DRAM (written by 0.104); 63 tokens (the last is computed)
    # of 4 blocks come back in one read of 4 MB at 1 GB/s: 0.200 -> 0.204 s
    assert r2.kv_load_s == pytest.approx(0.004)
    assert r2.tier_tokens == (63, 0, 0)
    assert r2.cached_tokens == 63
    # r2's admission evicted B to DRAM: the write starts at 0.204 (the writer is
    # free) and r2 is admitted when it ends, at 0.208
    assert r2.t_scheduled == pytest.approx(0.208)
    # its prefill computes one token: 10 ms + 0.1 ms
    assert r2.t_prefill_done == pytest.approx(0.208 + 0.0101)
    assert list(dram.units) == list(B)
    assert dram.units[5][1] == pytest.approx(0.208)
    assert dram.bytes_written == 8 * MB and dram.bytes_read == 4 * MB
    assert dram.hit_tokens == 63
    # A is back in HBM only: the tiers are exclusive
    assert set(eng.cache.units) == set(A) and not set(A) & set(dram.units)


def test_an_admission_that_needs_evicted_blocks_waits_for_a_busy_writer():
    # DRAM's writer is busy until 20 ms with an earlier 20 MB write. r1 at 17 ms
    # needs A's 4 HBM blocks: they are written after it, 20 -> 24 ms, and held
    # until then, so r1 is admitted at 24 ms (21 ms with an idle writer)
    reqs = [Request(0, 0.0, 64, 1, A, 16), Request(1, 0.017, 64, 1, B, 16)]
    seen = []

    def busy(chain):
        chain.write_down([(99, 20)])

    def held(eng, chain):  # before every iteration
        seen.append((chain.env.now, eng.kv.free, eng.cache.writing_blocks))

    eng, chain, done = run(reqs, hbm_blocks=4, tiers=[("dram", 30, 1e9, 1e9, 0.0)],
                           setup=busy, check=held)  # fmt: skip
    r0, r1 = done[0], done[1]
    assert r0.t_prefill_done == pytest.approx(0.0164)
    assert chain.tiers[0].units[1][1] == pytest.approx(0.024)
    assert r1.t_scheduled == pytest.approx(0.024)
    assert r1.t_prefill_done == pytest.approx(0.024 + 0.0164)
    # two iterations, r0's and r1's: nothing polls while the blocks are held
    assert [t for t, _, _ in seen] == pytest.approx([0.0, 0.024])
    assert seen[1][1:] == (0, 0)  # r1's 4 blocks taken, none held any more
    assert eng.kv.free + eng.cache.cached_blocks == 4 and eng.cache.writing_blocks == 0


def test_a_prefix_still_being_written_is_not_read_and_a_busy_writer_delays_it():
    env = simpy.Environment()
    dram = Tier("dram", 10, 2e9, 1e9, 0.0)
    chain = TierChain(env, [dram], MB)
    chain.write_down([(1, 2), (2, 2)])  # 4 MB at 1 GB/s: 0 -> 4 ms
    chain.write_down([(3, 1)])  # behind it: 4 -> 5 ms
    assert [dram.units[h][1] for h in (1, 2, 3)] == pytest.approx([0.004, 0.004, 0.005])
    assert chain.run([1, 2, 3]) == []  # nothing readable yet
    env.run(until=0.0045)
    assert chain.run([1, 2, 3]) == [0, 0]
    # two loads at once compete for the tier's reads: 2 MB at 2 GB/s each, in turn
    first, none = chain.load([1], [0], [16])
    second, _ = chain.load([2], [0], [16])
    assert none is None  # no remote read
    assert first == pytest.approx(0.0045 + 0.001) and second == pytest.approx(0.0045 + 0.002)


def test_a_full_dram_tier_writes_its_oldest_units_down_to_ssd():
    env = simpy.Environment()
    dram = Tier("dram", 2, 1e9, 1e9, 0.0)
    ssd = Tier("ssd", 10, 13e9, 6.6e9, 1e-4)
    chain = TierChain(env, [dram, ssd], MB)
    chain.write_down([(1, 1), (2, 1)])  # DRAM: 0 -> 2 ms
    chain.write_down([(3, 1), (4, 1)])  # DRAM: 2 -> 4 ms; 1 and 2 go to the SSD
    assert list(dram.units) == [3, 4] and list(ssd.units) == [1, 2]
    # the SSD write waits for 1 and 2 to be in DRAM (2 ms), then 100 us + 2 MB at 6.6 GB/s
    assert ssd.units[1][1] == pytest.approx(0.002 + 1e-4 + 2 * MB / 6.6e9)
    assert dram.used_blocks == 2 and ssd.used_blocks == 2
    env.run(until=1.0)
    assert chain.run([1, 2, 3, 5]) == [1, 1, 0]  # 1, 2 in the SSD, 3 in DRAM, 5 nowhere


def _conserved(eng, chain):
    held = [set(eng.cache.units)] + [set(t.units) for t in chain.tiers]
    for i in range(len(held)):
        for j in range(i + 1, len(held)):
            assert not held[i] & held[j], "a unit in two tiers of one instance"
    for t in chain.tiers:
        assert t.used_blocks == sum(int(u[0]) for u in t.units.values())
        assert 0 <= t.used_blocks <= t.capacity_blocks
    assert (
        eng.kv.free + eng.cache.cached_blocks + eng.cache.writing_blocks
        + sum(s.blocks for s in eng.running.values())
        == eng.kv.total
    )  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 0.05), st.integers(1, 4), st.integers(1, 4),
            st.lists(st.integers(0, 5), min_size=6, max_size=6),
        ),
        min_size=1, max_size=25,
    ),
    st.integers(6, 14), st.integers(0, 6), st.integers(0, 6),
)  # fmt: skip
def test_blocks_are_conserved_across_tiers(items, hbm, dram_blocks, ssd_blocks):
    # every request fits alone: at most 64 prompt + 3 more tokens, 5 of the >= 6 blocks
    t = 0.0
    reqs = []
    for i, (gap, units, out, hashes) in enumerate(items):
        t += gap
        # hashes name a prefix: build chains so that equal hashes share a start
        chain = tuple(hash(tuple(hashes[: k + 1])) & 0xFFFF for k in range(units))
        reqs.append(Request(i, t, 16 * units, out, chain, 16))
    tiers = []
    if dram_blocks:
        tiers.append(("dram", dram_blocks, 1e9, 1e9, 0.0))
    if ssd_blocks:
        tiers.append(("ssd", ssd_blocks, 13e9, 6.6e9, 1e-4))
    eng, chain, done = run(reqs, hbm_blocks=hbm, tiers=tiers, check=_conserved)
    _conserved(eng, chain)
    assert len(done) == len(reqs)


def test_a_prompts_copy_into_the_kv_pool_takes_its_pcie_time():
    from pathlib import Path

    from twin.perf.gpus import get_gpu
    from twin.sim.simulation import Simulation
    from twin.sim.spec import resolve_spec

    data = {
        "model": "llama-3.1-8b",
        "cluster": {
            "topology": "dgx-h100-ib400", "nodes": 2, "kv_pool": "64 GiB",
            "prefill": {"instances": 1, "tp": 4}, "decode": {"instances": 1, "tp": 4},
        },
        "engine": {"prefix_caching": True},
        "scheduler": {"name": "mooncake", "early_rejection": "off"},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 1},
    }  # fmt: skip
    spec = resolve_spec(data, "pool.yaml", Path.cwd())
    rows: list[dict] = []
    reqs = [
        Request(0, 0.0, 2048, 4, (1, 2, 3, 4), 512),
        Request(1, 0.0, 2048, 4, (5, 6, 7, 8), 512),
    ]
    sim = Simulation(spec, requests=reqs, on_row=rows.append)
    summary = sim.run().summary
    assert sim.pools is not None
    chain = next(c for c in sim.pools.chains if c.tiers[0].units)
    pool = chain.tiers[0]
    unit = 512 * spec.model.kv_bytes_per_token()
    # the instance's 4 GPUs, each its shard, at the H100's 64 GB/s PCIe less
    # 128b/130b encoding and 24 bytes a 256-byte packet (as the DRAM tier's)
    assert get_gpu("h100-sxm").pcie_bytes_s == 64e9
    pcie = 4 * 64e9 * 128 / 130 * 256 / 280
    # both prompts end in one iteration; the copies go one after the other
    done = {r["id"]: r["prefill_done_s"] for r in rows}
    assert done[0] == done[1]
    first = done[0] + 4 * unit / pcie
    assert [pool.units[h][1] for h in (1, 2, 3, 4)] == pytest.approx([first] * 4)
    assert [pool.units[h][1] for h in (5, 6, 7, 8)] == pytest.approx([first + 4 * unit / pcie] * 4)
    assert summary["kv_bytes_copied"] == 8 * unit


def _tier_spec(**tiers):
    from pathlib import Path

    from twin.sim.spec import resolve_spec

    data = {
        "model": "llama-3.1-8b",
        "cluster": {"instances": 1},
        # some 15,000 tokens of KV: three and a half 4,096-token prompts
        "engine": {"prefix_caching": True, "gpu_memory_utilization": 0.235},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 1},
    }  # fmt: skip
    if tiers:
        data["kv_tiers"] = tiers
    return resolve_spec(data, "tiers.yaml", Path.cwd())


def test_a_run_reports_hits_per_tier_in_its_summary_and_rows():
    from twin.sim.simulation import Simulation

    prompts = [tuple(100 * c + k for k in range(8)) for c in range(5)]
    # five distinct 4,096-token prompts, then the first again: its prefix was evicted
    reqs = [Request(i, float(i), 4096, 2, prompts[i % 5], 512) for i in range(6)]
    rows: list[dict] = []
    s = Simulation(_tier_spec(dram="64 GB"), requests=reqs, on_row=rows.append).run().summary
    last = next(r for r in rows if r["id"] == 5)
    assert last["dram_hit_tokens"] == 4095 and last["hbm_hit_tokens"] == 0
    assert last["ssd_hit_tokens"] == 0 and last["pool_hit_tokens"] == 0
    # 4,095 tokens of 128 KiB at the H100's PCIe (the GPU catalog's pcie_bytes_s,
    # 64 GB/s, less encoding and packet overhead: 57.6 GB/s)
    from twin.perf.gpus import get_gpu
    from twin.serving.tiers import PCIE_PAYLOAD_EFFICIENCY

    assert get_gpu("h100-sxm").pcie_bytes_s * PCIE_PAYLOAD_EFFICIENCY == pytest.approx(
        57.6e9, rel=1e-3
    )

    kv_token = 131072
    units = 8 * 512 * kv_token  # whole units move: 8 of 512 tokens
    assert last["kv_load_s"] == pytest.approx(units / 57.6e9, rel=1e-3)
    assert s["kv_tiers"]["dram"]["hit_tokens"] == 4095
    assert s["kv_tiers"]["dram"]["bytes_read"] == units
    assert s["kv_tiers"]["dram"]["hit_rate"] == pytest.approx(4095 / (6 * 4096))
    assert "ssd" not in s["kv_tiers"]
    # HBM only: the same request computes its prompt again, and no kv_tiers key
    rows.clear()
    s = Simulation(_tier_spec(), requests=reqs, on_row=rows.append).run().summary
    last = next(r for r in rows if r["id"] == 5)
    assert last["dram_hit_tokens"] == 0 and last["hbm_hit_tokens"] == 0 and "kv_tiers" not in s


def test_kv_tiers_need_the_prefix_cache():
    from pathlib import Path

    from twin.errors import SpecError
    from twin.sim.spec import resolve_spec

    data = {"model": "llama-3.1-8b", "kv_tiers": {"dram": "1 GB"},
            "workload": {"lengths": "azure-conv", "max_requests": 1,
                         "arrival": {"process": "poisson", "rate": 1}}}  # fmt: skip
    with pytest.raises(SpecError, match="kv_tiers: .* set engine.prefix_caching: true"):
        resolve_spec(data, "t.yaml", Path.cwd())
    data["engine"] = {"prefix_caching": True}
    data["kv_tiers"] = {"dram": "1 GB", "ssd_read_bandwidth": "fast"}
    with pytest.raises(SpecError, match="kv_tiers.ssd_read_bandwidth"):
        resolve_spec(data, "t.yaml", Path.cwd())


def test_occupancy_over_time_per_tier_by_window():
    # the first test's run: A (4 blocks) is written to DRAM at 0.100, leaves it
    # when r2 loads it at 0.200, and r2's admission at 0.204 writes B (4 blocks)
    reqs = [Request(0, 0.0, 64, 1, A, 16), Request(1, 0.1, 64, 1, B, 16),
            Request(2, 0.2, 64, 1, A, 16)]  # fmt: skip
    eng, chain, done = run(reqs, hbm_blocks=4, tiers=[("dram", 8, 1e9, 1e9, 0.0)])
    kvt = KVTiers(chain.env)
    kvt.add(0, chain)
    end = done[2].t_finish
    occ = kvt.occupancy(0.05, end)["dram"]
    # windows [0, .05) [.05, .1) [.1, .15) [.15, .2) [.2, end]
    assert len(occ["mean_bytes"]) == 5 and end > 0.204
    assert occ["mean_bytes"][:4] == pytest.approx([0.0, 0.0, 4 * MB, 4 * MB])
    assert occ["peak_bytes"] == pytest.approx([0.0, 0.0, 4 * MB, 4 * MB, 4 * MB])
    # the last: 0 from 0.200 to 0.204, then 4 blocks to the end
    last = 4 * MB * (end - 0.204) / (end - 0.2)
    assert occ["mean_bytes"][4] == pytest.approx(last)
    # two instances add up; a change at a window's edge counts in the next one
    env = simpy.Environment()
    chains = [TierChain(env, [Tier("dram", 8, 1e9, 1e9, 0.0)], MB) for _ in range(2)]
    kvt = KVTiers(env)
    for i, c in enumerate(chains):
        kvt.add(i, c)
    chains[0].write_down([(1, 2)])  # at 0: 2 blocks on instance 0
    env.run(until=1.0)
    chains[1].write_down([(2, 3)])  # at 1: 3 more on instance 1
    env.run(until=1.5)
    chains[0].discard(1)  # at 1.5: instance 0's leave
    occ = kvt.occupancy(1.0, 2.0)["dram"]
    assert occ["mean_bytes"] == pytest.approx([2 * MB, (5 * 0.5 + 3 * 0.5) * MB])
    assert occ["peak_bytes"] == pytest.approx([2 * MB, 5 * MB])
    assert kvt.occupancy(1.0, 2.0).keys() == {"dram"}


def test_a_run_with_tiers_reports_occupancy_in_its_summary_and_timeline(tmp_path):
    from twin.sim.simulation import Simulation
    from twin.sim.timeline import write_timeline_csv

    prompts = [tuple(100 * c + k for k in range(8)) for c in range(5)]
    reqs = [Request(i, float(i), 4096, 2, prompts[i % 5], 512) for i in range(6)]
    res = Simulation(_tier_spec(dram="64 GB"), requests=reqs).run()
    occ = res.summary["kv_tiers"]["dram"]["occupancy"]
    assert occ["window_s"] == 10.0  # the timeline's default window
    # one window (the run ends near 5 s); its peak is the tier's peak
    assert len(occ["mean_bytes"]) == len(res.timeline_rows) == 1
    assert occ["peak_bytes"][0] == res.summary["kv_tiers"]["dram"]["peak_instance_bytes"] > 0
    assert res.timeline_rows[0]["dram_bytes"] == occ["mean_bytes"][0]
    path = write_timeline_csv(res.timeline_rows, tmp_path / "t.csv")
    header = path.read_text().splitlines()[0].split(",")
    assert header[-1] == "dram_bytes" and "ssd_bytes" not in header
    # HBM only: the timeline keeps its columns
    res = Simulation(_tier_spec(), requests=reqs).run()
    assert "dram_bytes" not in res.timeline_rows[0]


def _remote_chain(capacity_blocks=16):
    """Instance 0 on GPU 0 of a 2-node DGX H100 topology; the store on node 1."""
    from twin.net.flows import Network
    from twin.net.topology import load_topology
    from twin.serving.tiers import RemoteStore

    env = simpy.Environment()
    topo = load_topology("dgx-h100-ib400", nodes=2)
    net = Network(env)
    remote = Tier("remote", capacity_blocks, 0.0, 0.0, 0.0)
    remote.store = RemoteStore(net, topo, 1)
    return env, topo, net, TierChain(env, [remote], MB, gpus=(0,)), remote


def test_a_remote_store_read_takes_its_bytes_over_the_bottleneck_and_shares_links():
    from twin.net.shards import shard_flows

    env, topo, net, chain, remote = _remote_chain()
    path = topo.path(8, 0)  # the store's node 1 (GPU 8) to GPU 0
    # by hand: one ConnectX-7 port, 400 Gb/s at RDMA efficiency 0.982, is the bottleneck
    bw = 400e9 / 8 * 0.982
    assert topo.bottleneck_bytes_s(path) == pytest.approx(bw)
    lat = topo.latency_s(path)
    chain.write_down([(1, 4), (2, 4)])  # one 8 MB write over the network
    assert remote.units[1][1] == float("inf")  # not readable while it travels
    env.run()
    written = env.now
    assert written == pytest.approx(topo.latency_s(topo.path(0, 8)) + 8 * MB / bw)
    assert chain.run([1, 2]) == [0, 0] and remote.bytes_written == 8 * MB
    # an idle path: 4 MB in latency + bytes / bottleneck
    done, t = chain.load([1], [0], [16])
    assert done == env.now and t is not None
    env.run()
    assert env.now - written == pytest.approx(lat + 4 * MB / bw)
    assert remote.bytes_read == 4 * MB and 1 in remote.units  # the store keeps it
    # the same read while a 4 MB hand-off from node 1 to GPU 0 crosses the same
    # links: they share the port half and half, and both end at 2 x 4 MB / bw
    start = env.now
    _, t = chain.load([2], [0], [16])
    handoff = net.start(shard_flows(topo, [8], [0], 4 * MB), "handoff")
    env.run()
    assert t.end_s - start == pytest.approx(lat + 8 * MB / bw)
    assert handoff.end_s == pytest.approx(t.end_s)


def test_a_full_remote_store_drops_its_oldest_units_and_a_request_waits_for_its_read():
    env, topo, net, chain, remote = _remote_chain(capacity_blocks=4)
    chain.write_down([(1, 2), (2, 2)])
    chain.write_down([(3, 2)])  # 1 leaves the store: off the last tier it is gone
    assert list(remote.units) == [2, 3] and remote.used_blocks == 4
    chain.discard(2)  # an instance computing 2 again leaves it in the shared store
    assert 2 in remote.units
    env.run()
    kvt = KVTiers(env)
    kvt.add(0, chain)
    assert kvt.occupancy(1.0, env.now)["remote"]["peak_bytes"] == [4 * MB]


def _remote_spec(remote, nodes=2):
    from pathlib import Path

    from twin.sim.spec import resolve_spec

    data = {
        "model": "llama-3.1-8b",
        "cluster": {"topology": "dgx-h100-ib400", "nodes": nodes, "instances": 1},
        "engine": {"prefix_caching": True, "gpu_memory_utilization": 0.235},
        "kv_tiers": {"remote": remote},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 1},
    }  # fmt: skip
    return resolve_spec(data, "remote.yaml", Path.cwd())


def test_a_run_reloads_an_evicted_prefix_from_the_remote_store_over_the_network():
    from twin.sim.simulation import Simulation

    prompts = [tuple(100 * c + k for k in range(8)) for c in range(5)]
    reqs = [Request(i, float(i), 4096, 2, prompts[i % 5], 512) for i in range(6)]
    rows: list[dict] = []
    sim = Simulation(_remote_spec({"capacity": "1 TB", "node": 1}), requests=reqs,
                     on_row=rows.append)  # fmt: skip
    s = sim.run().summary
    last = next(r for r in rows if r["id"] == 5)
    assert last["pool_hit_tokens"] == 4095 and last["hbm_hit_tokens"] == 0
    assert last["dram_hit_tokens"] == 0
    topo = sim.spec.topology
    path = topo.path(8, 0)
    units = 8 * 512 * 131072  # whole units move: 8 of 512 tokens of 128 KiB
    bw = 400e9 / 8 * 0.982  # one ConnectX-7 port, as above
    assert last["kv_load_s"] == pytest.approx(topo.latency_s(path) + units / bw)
    remote = s["kv_tiers"]["remote"]
    assert remote["hit_tokens"] == 4095 and remote["bytes_read"] == units
    assert s["kv_bytes_transferred"] == 0  # colocated: no hand-off; the network moved the store's


def test_a_remote_store_is_checked():
    from twin.errors import SpecError

    with pytest.raises(SpecError, match=r"kv_tiers.remote.capacity: missing"):
        _remote_spec({"node": 1})
    with pytest.raises(SpecError, match=r"kv_tiers.remote: unknown key 'size'"):
        _remote_spec({"size": "1 TB", "node": 1})
    from twin.sim.simulation import Simulation

    with pytest.raises(SpecError, match=r"kv_tiers.remote: node 0 holds an instance"):
        Simulation(_remote_spec({"capacity": "1 TB", "node": 0}), requests=[])
    with pytest.raises(SpecError, match=r"kv_tiers.remote: node 5: the topology has nodes 0..1"):
        Simulation(_remote_spec({"capacity": "1 TB", "node": 5}), requests=[])


def test_a_remote_read_stuck_on_a_failed_link_is_given_up_and_the_prompt_computed():
    env, topo, net, chain, remote = _remote_chain()
    obs = Done()
    eng = Engine(env, 0, Linear(), BlockManager(4, 16),
                 EngineConfig(prefix_caching=True, watermark=0.0), obs, tiers=chain)  # fmt: skip
    kvt = KVTiers(env)
    kvt.add(0, chain)
    chain.write_down([(h, 1) for h in A])
    env.run()
    link = topo.path(8, 0)[-1]
    net.fail_link(link.src, link.dst)
    kvt.submit(Sequence(Request(0, env.now, 64, 1, A, 16), env.now), eng)
    (tid,) = kvt._reads
    env.run()
    assert not obs.done  # the read waits on the failed link
    kvt.give_up({tid})
    env.run()
    (seq,) = obs.done
    assert seq.cached_tokens == 0 and seq.tier_tokens == (0, 0, 0)


def test_the_compare_table_shows_the_remote_stores_share_when_a_run_has_one():
    from twin.sim.simulation import Simulation
    from twin.studies.compare import CompareResult

    prompts = [tuple(100 * c + k for k in range(8)) for c in range(5)]
    reqs = [Request(i, float(i), 4096, 2, prompts[i % 5], 512) for i in range(6)]
    store = Simulation(_remote_spec({"capacity": "1 TB", "node": 1}), requests=reqs).run()
    dram = Simulation(_tier_spec(dram="64 GB"), requests=reqs).run()
    header = {"version": "x", "name": "t", "model": "m", "seed": 0,
              "slo": {"ttft": None, "tpot": None}}  # fmt: skip
    table = CompareResult(header, {"store": store, "dram": dram}).format_table().splitlines()
    assert table[2].split()[-1] == "%" and "store %" in table[2]
    # 4,095 of the 6 x 4,096 prompt tokens came from the store
    assert table[4].split()[-1] == f"{100 * 4095 / (6 * 4096):.1f}"
    assert table[5].split()[-1] == "-"
    assert "store %" not in CompareResult(header, {"dram": dram}).format_table()


def test_a_decode_reservation_waits_for_blocks_being_written_down(monkeypatch):
    from pathlib import Path

    import twin.serving.receiving as receiving_mod
    from twin.sim.simulation import Simulation
    from twin.sim.spec import resolve_spec

    waited = []
    reserve = receiving_mod.Receiver.reserve

    def watched(self, seq):
        ok = reserve(self, seq)
        eng = self.engine
        if not ok and eng.cache is not None and eng.cache.writing_blocks:
            waited.append(eng.env.now)
        return ok

    monkeypatch.setattr(receiving_mod.Receiver, "reserve", watched)
    data = {
        "model": "llama-3.1-8b",
        "cluster": {"topology": "dgx-h100-ib400", "nodes": 1,
                    "prefill": {"instances": 1, "tp": 1}, "decode": {"instances": 1, "tp": 1}},
        "engine": {"prefix_caching": True, "gpu_memory_utilization": 0.235},
        # a slow writer: 1 GB/s, 64 ms a 512-token unit
        "kv_tiers": {"dram": "64 GB", "dram_bandwidth": "1 GB/s"},
        "scheduler": "disagg",
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 1},
    }  # fmt: skip
    spec = resolve_spec(data, "split.yaml", Path.cwd())
    prompts = [tuple(100 * c + k for k in range(8)) for c in range(5)]
    reqs = [Request(i, 0.3 * i, 4096, 2, prompts[i % 5], 512) for i in range(12)]
    s = Simulation(spec, requests=reqs).run().summary  # its conservation check included
    assert s["completed"] == 12
    assert waited  # the decode side's KV waited for evicted blocks to be written
    assert s["kv_tiers"]["dram"]["bytes_written"] > 0


def test_a_write_down_under_way_when_the_instance_fails_frees_nothing_of_its_new_life():
    # r1 at 0.1 evicts r0's 4 units: one write, 0.100 -> 0.104 s, their blocks held
    # until it ends. The instance fails at 0.102 and is back, empty, at 0.103: the
    # write's end must not release the old life's blocks into the new KV.
    reqs = [Request(0, 0.0, 64, 1, A, 16), Request(1, 0.1, 64, 1, B, 16)]
    engine, seen = [], []

    def setup(chain):
        def crash():
            yield chain.env.timeout(0.102)
            eng = engine[0]
            seen.append((eng.cache.writing_blocks, eng.kv.free))
            eng.fail()
            yield chain.env.timeout(0.001)
            eng.recover()

        chain.env.process(crash())

    def first(eng, chain):  # before every iteration; the first is at 0
        engine[:] = [eng]

    eng, chain, done = run(reqs, hbm_blocks=4, tiers=[("dram", 8, 1e9, 1e9, 0.0)],
                           setup=setup, check=first)  # fmt: skip
    assert seen == [(4, 0)]  # A's 4 blocks held for the write, none free
    assert list(done) == [0]  # r1, still waiting for those blocks, went with the old life
    assert chain.tiers[0].units[1][1] == pytest.approx(0.104)  # the write itself goes on
    assert eng.cache.writing_blocks == 0
    assert eng.kv.free == eng.kv.total == 4  # the new life's blocks, all free


def test_units_that_pass_a_small_dram_by_hold_their_blocks_until_the_ssd_has_them():
    # DRAM holds 2 blocks: of A's 4 units, evicted at 0.1 by r1, the 2 oldest pass
    # it by, straight to the SSD (2 MB at 0.5 GB/s: 0.100 -> 0.104 s), the other 2
    # go to DRAM (2 MB at 1 GB/s: 0.100 -> 0.102 s). r1 waits for the later end.
    reqs = [Request(0, 0.0, 64, 1, A, 16), Request(1, 0.1, 64, 1, B, 16)]
    tiers = [("dram", 2, 1e9, 1e9, 0.0), ("ssd", 10, 1e9, 0.5e9, 0.0)]
    eng, chain, done = run(reqs, hbm_blocks=4, tiers=tiers)
    dram, ssd = chain.tiers
    assert list(ssd.units) == [1, 2] and list(dram.units) == [3, 4]
    assert ssd.units[1][1] == pytest.approx(0.104) and dram.units[3][1] == pytest.approx(0.102)
    assert done[1].t_scheduled == pytest.approx(0.104)
