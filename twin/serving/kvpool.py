"""A node's KV pool: prompt prefixes kept in host memory, and on SSD, for any instance.

Mooncake keeps the KV cache of past prompts in the CPU memory of every node,
and on the nodes' SSDs below it (its "Mooncake Store": the store pools the
GPU cluster's DRAM and SSD; Qin et al., arXiv 2407.00079v3, the abstract and
section 3, the architecture overview; FAST 2025, sections 3.1 and 3.2), so
that an instance anywhere can load a reusable prefix over the network
instead of computing it again.

Each node's pool is a chain of KV tiers (:class:`~twin.serving.tiers.TierChain`,
the machinery of ``kv_tiers``): a DRAM tier (``cluster.kv_pool``) and, with
``cluster.kv_pool_ssd``, an SSD tier below it. A tier holds prefix units (the
trace's hashes, 512 tokens each in the Mooncake trace) up to its capacity,
evicting the least recently used; what the DRAM tier evicts is written down
to the SSD (at the SSD's write bandwidth, after its writes before; readable
there once written), and what the SSD evicts is gone. The two are exclusive:
a unit is in one of them.

- Copying a prompt's KV from the GPU into its node's DRAM pool crosses the
  instance's PCIe links (every GPU its shard, at the effective host-copy
  rate of :func:`~twin.serving.tiers.host_copy_bytes_s`: the catalog's
  ``pcie_bytes_s`` less encoding and packet overhead, as the KV tiers' DRAM
  tier), one copy after another per instance; a unit can be
  loaded from the pool only once its copy has ended. The copy overlaps with
  serving (it does not hold the engine). Units the pool holds already (in
  DRAM or SSD) are not copied again; they become the most recently used.
- A fetch reads the prefix the pool holds: the units on its SSD first (one
  read at the SSD's read bandwidth, after that SSD's reads before, into the
  node's host memory), then the whole prefix goes to the instance: over the
  instance's PCIe links inside the node, else as flows on the network from
  the pool node's GPUs (one per shard), sharing links with hand-offs. The
  pool keeps what it serves.
- The router's estimate of a fetch (:meth:`KVPools.estimate_s`) prices it
  the same way on an idle SSD and network: the SSD's units (whole units, as
  read) at the SSD's latency and read bandwidth, then the prefix over PCIe or
  the network.

NOTE: a loaded prefix lands in a staging buffer before the prefill allocates
its blocks, so the load does not hold KV blocks while it travels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import simpy

from twin.errors import SpecError
from twin.net.flows import Network
from twin.net.shards import shard_flows
from twin.net.topology import Topology
from twin.perf.gpus import get_gpu
from twin.request import Request
from twin.serving.cluster import Placement
from twin.serving.engine import Engine
from twin.serving.prefixunits import cacheable
from twin.serving.sequence import Sequence as Seq
from twin.serving.tiers import Tier, TierChain, Writer, host_copy_bytes_s, tier_summary


@dataclass(frozen=True)
class PoolSSD:
    """An SSD below each node's DRAM pool (``cluster.kv_pool_ssd*``)."""

    capacity_bytes: float
    read_bps: float
    write_bps: float
    latency_s: float


class KVPools:
    """The pools of one cluster, one per node, and the loads from them.

    Engines hand every computed prompt to :meth:`keep_prompt`; the router's
    view reads :meth:`prefix` (which node holds how many of a request's prompt
    tokens) and :meth:`estimate_s`; a route with ``fetch_from`` goes through
    :meth:`fetch_then_submit`, which loads the prefix (over PCIe inside the
    node, else as flows over the network) and then submits the request.
    """

    def __init__(
        self,
        env: simpy.Environment,
        capacity_bytes: float,
        topology: Topology,
        placements: Sequence[Placement],
        network: Network,
        kv_bytes_per_token: int,
        block_size: int,
        ssd: PoolSSD | None = None,
    ) -> None:
        self.env = env
        # A pool counts whole KV blocks of the full model (not a TP shard).
        self.block_bytes = float(block_size * kv_bytes_per_token)
        self.chains: list[TierChain] = []
        for _ in range(topology.num_nodes):
            # DRAM: written through the copying instance's PCIe (a Writer), read by
            # the fetch's own path (PCIe or the network), so no bandwidth of its own
            tiers = [Tier("dram", int(capacity_bytes // self.block_bytes), math.inf, math.inf, 0.0)]
            if ssd is not None:
                tiers.append(
                    Tier("ssd", int(ssd.capacity_bytes // self.block_bytes), ssd.read_bps,
                         ssd.write_bps, ssd.latency_s)
                )  # fmt: skip
            self.chains.append(TierChain(env, tiers, self.block_bytes))
        self.topology = topology
        self.placements = placements
        self.network = network
        self.kv_bytes_per_token = kv_bytes_per_token
        self.block_size = block_size
        self.bytes_fetched = 0.0
        self.bytes_copied = 0.0  # GPU -> pool copies
        self._writers: dict[int, Writer] = {}  # instance -> its PCIe links' copies
        self._rates: dict[tuple[int, int], tuple[float, float]] = {}
        # Loads under way, by the node whose pool they read: [seq, engine,
        # transfer or None (inside the node), whether the load is given up].
        self._loading: dict[int, list[list]] = {}

    def give_up(self, transfers: set[int]) -> None:
        """Give up the loads moving as ``transfers`` (ids; they wait on failed
        links): their requests are submitted without the prefix."""
        for loads in self._loading.values():
            for load in list(loads):
                seq, engine, transfer, _ = load
                if transfer is not None and transfer.id in transfers:
                    load[3] = True
                    loads.remove(load)
                    self.network.cancel(transfer)
                    engine.submit(seq)

    def fail_node(self, node: int) -> None:
        """``node`` failed: its pool's contents are gone, in DRAM and on SSD (it
        comes back empty), and the loads from it under way are given up:
        their requests are submitted without the prefix, which is computed again."""
        self.chains[node].lose_all()
        for load in self._loading.pop(node, []):
            seq, engine, transfer, _ = load
            load[3] = True
            if transfer is not None:
                self.network.cancel(transfer)
            engine.submit(seq)

    def used_bytes(self, node: int) -> float:
        """What ``node``'s pool holds, DRAM and SSD together."""
        return sum(t.used_blocks for t in self.chains[node].tiers) * self.block_bytes

    def keep_prompt(self, engine: Engine, seq: Seq) -> None:
        """An engine computed ``seq``'s prompt: its node's pool keeps the prefix."""
        hashes = cacheable(seq.req, self.block_size)
        if not hashes:
            return
        unit_blocks = seq.req.prefix_block_tokens // self.block_size
        node = self.placements[engine.id].node
        chain = self.chains[node]
        new = []
        for h in hashes:
            for tier in chain.tiers:
                if h in tier.units:
                    tier.units.move_to_end(h)  # held already: the most recently used
                    break
            else:
                new.append((h, unit_blocks))
        dram = chain.tiers[0]
        if not new or unit_blocks > dram.capacity_blocks:
            return
        # one copy of the new units over the instance's PCIe links, after its earlier ones
        writer = self._writers.get(engine.id)
        if writer is None:
            writer = self._writers[engine.id] = Writer(self._rate(engine.id, node)[1])
        before = dram.bytes_written
        chain.write_down(new, 0, via=writer)
        self.bytes_copied += dram.bytes_written - before

    def prefix(self, req: Request) -> dict[int, int]:
        """Node -> prompt tokens of ``req`` whose KV that node's pool holds
        (readable now, in DRAM or SSD)."""
        hashes = cacheable(req, self.block_size)
        out = {}
        for node, chain in enumerate(self.chains):
            n = len(chain.run(hashes))
            if n:
                out[node] = n * req.prefix_block_tokens
        return out

    def _rate(self, instance: int, node: int) -> tuple[float, float]:
        """(latency s, bytes/s) of loading KV from ``node``'s pool to ``instance``
        on an idle network: over PCIe inside the node (every GPU of the instance
        in parallel), else from the pool node's NICs as flows, one per shard."""
        key = (instance, node)
        if key not in self._rates:
            topo = self.topology
            gpus = self.placements[instance].gpus
            if node == self.placements[instance].node:
                pcie = get_gpu(topo.gpu_type(gpus[0])).pcie_bytes_s
                self._rates[key] = (0.0, host_copy_bytes_s(pcie, len(gpus)))
            else:
                src = topo.gpus_of_node(node)[: len(gpus)]
                probe = 1e9
                env = simpy.Environment()
                t = Network(env).start(shard_flows(topo, src, gpus, probe))
                env.run()
                assert t.end_s is not None
                lat = max(topo.latency_s(topo.path(a, b)) for a, b in zip(src, gpus, strict=False))
                self._rates[key] = (lat, probe / max(t.end_s - lat, 1e-12))
        return self._rates[key]

    def estimate_s(
        self, instance: int, node: int, tokens: int, req: Request | None = None
    ) -> float:
        """Time to load the first ``tokens`` prompt tokens' KV from ``node``'s
        pool to ``instance`` on an idle network and SSD, as
        :meth:`fetch_then_submit` takes it: with ``req``, the units of its
        prompt that the pool holds on its SSD are read first (the SSD's
        latency, then their blocks at its read bandwidth), then the
        ``tokens`` cross PCIe or the network; without ``req``, as if all were
        in DRAM."""
        lat, rate = self._rate(instance, node)
        staged = 0.0
        if req is not None and tokens > 0:
            staged = self._ssd_read_s(req, node, tokens)
        return staged + lat + tokens * self.kv_bytes_per_token / rate

    def _ssd_read_s(self, req: Request, node: int, tokens: int) -> float:
        """An idle SSD's read of the units holding ``req``'s first ``tokens``
        prompt tokens that ``node``'s pool keeps there (0 with none)."""
        chain = self.chains[node]
        if len(chain.tiers) < 2:
            return 0.0
        hashes = cacheable(req, self.block_size)
        units = -(-tokens // req.prefix_block_tokens)  # the units the tokens reach into
        ssd = chain.tiers[1]
        blocks = 0
        for h, i in zip(hashes, chain.run(hashes)[:units], strict=False):
            if i == 1:
                blocks += int(ssd.units[h][0])
        if not blocks:
            return 0.0
        return ssd.latency_s + blocks * self.block_bytes / ssd.read_bps

    def fetch_then_submit(self, seq: Seq, engine: Engine, node: int, policy: str) -> None:
        """Load the prefix of ``seq`` that ``node``'s pool holds to ``engine``, then
        submit it there (at once when the engine holds at least as much)."""
        if not 0 <= node < len(self.chains):
            raise SpecError(
                f"scheduler {policy!r}: request {seq.req.id} fetches from node {node!r}; "
                f"nodes are 0..{len(self.chains) - 1}"
            )
        req = seq.req
        hashes = cacheable(req, self.block_size)
        chain = self.chains[node]
        where = chain.run(hashes)
        unit = req.prefix_block_tokens
        tokens = min(len(where) * unit, req.prompt_tokens - 1)
        if tokens <= engine.cached_prefix_tokens(req):
            engine.submit(seq)  # nothing to load that the instance does not hold
            return
        per_unit = [max(0, min(unit, tokens - k * unit)) for k in range(len(where))]
        while per_unit and per_unit[-1] == 0:
            per_unit.pop()
        where = where[: len(per_unit)]
        # the SSD's units are read into host memory first (the DRAM tier costs nothing)
        now = self.env.now
        staged, _ = chain.load(hashes[: len(where)], where, per_unit, keep=True)
        nbytes = tokens * self.kv_bytes_per_token
        self.bytes_fetched += nbytes
        inst = engine.id
        load: list[Any] = [seq, engine, None, False]

        def landed(_done: object) -> None:
            if load[3]:
                return  # given up: the pool's node failed
            self._loading[node].remove(load)
            seq.preloaded_tokens = tokens
            engine.submit(seq)

        self._loading.setdefault(node, []).append(load)
        wait = staged - now
        if node == self.placements[inst].node:
            lat, rate = self._rate(inst, node)
            self.env.timeout(wait + lat + nbytes / rate).callbacks.append(landed)
        else:
            src = self.topology.gpus_of_node(node)[: len(self.placements[inst].gpus)]
            flows = shard_flows(self.topology, src, self.placements[inst].gpus, nbytes)
            if wait > 0.0:
                load[2] = self.network.start(flows, label=f"fetch {req.id}", delay_s=wait)
            else:
                load[2] = self.network.start(flows, label=f"fetch {req.id}")
            load[2].then(landed)

    def summary(self, prompt_tokens: int) -> dict[str, Any]:
        """Per pool tier (DRAM, SSD), over all nodes: prompt tokens fetched from
        it, their share of ``prompt_tokens``, bytes read and written, capacity,
        the fullest node's peak and what all hold at the end."""
        out: dict[str, Any] = {}
        for i, name in enumerate(t.name for t in self.chains[0].tiers):
            tiers = [c.tiers[i] for c in self.chains]
            out[name] = tier_summary(tiers, prompt_tokens, self.block_bytes, "peak_node_bytes")
        return out
