"""A node's DRAM KV pool: prompt prefixes kept in host memory for any instance.

Mooncake keeps the KV cache of past prompts in the CPU memory of every node
(its "Mooncake Store"), so that an instance anywhere can load a reusable
prefix over the network instead of computing it again. A pool holds prefix
units (the trace's hashes, 512 tokens each in the Mooncake trace) up to a
byte capacity, evicting the least recently used.

Copying a prompt's KV from the GPU to its node's pool is not free: it
crosses the instance's PCIe links (every GPU its shard, at the catalog's
``pcie_bytes_s``), one copy after another per instance, as the KV tiers'
writes do (:mod:`twin.serving.tiers`); a unit can be loaded from the pool only
once its copy has ended. The copy overlaps with serving (it does not hold the
engine). NOTE: a loaded prefix lands in a staging buffer before the prefill
allocates its blocks, so the load does not hold KV blocks while it travels.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import simpy

from twin.errors import SpecError
from twin.net.flows import Network
from twin.net.topology import Topology
from twin.perf.gpus import get_gpu
from twin.request import Request
from twin.serving.cluster import Placement
from twin.serving.engine import Engine
from twin.serving.handoff import shard_flows
from twin.serving.kvcache import cacheable, leading_run
from twin.serving.sequence import Sequence as Seq


class KVPool:
    """LRU set of prefix units on one node, ``capacity_bytes`` in all."""

    __slots__ = ("node", "capacity_bytes", "used_bytes", "units", "ready")

    def __init__(self, node: int, capacity_bytes: float) -> None:
        self.node = node
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0.0
        self.units: OrderedDict[int, float] = OrderedDict()  # hash -> bytes
        self.ready: dict[int, float] = {}  # hash -> when its copy into the pool ends

    def match(self, hashes: Sequence[int], now: float = float("inf")) -> int:
        """How many of ``hashes``, from the first, are here (copied in by ``now``)."""
        n = leading_run(hashes, self.units)
        ready = self.ready
        for i in range(n):
            if ready.get(hashes[i], 0.0) > now:
                return i
        return n

    def touch(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            self.units.move_to_end(h)

    def insert(self, hashes: Sequence[int], unit_bytes: float, ready_s: float = 0.0) -> None:
        """Keep ``hashes`` (a prompt's leading units), readable from ``ready_s``,
        evicting the least recently used units when full; a unit larger than
        the pool is skipped."""
        if unit_bytes > self.capacity_bytes:
            return
        units = self.units
        for h in hashes:
            if h in units:
                units.move_to_end(h)
                continue
            while self.used_bytes + unit_bytes > self.capacity_bytes:
                old, b = units.popitem(last=False)
                self.ready.pop(old, None)
                self.used_bytes -= b
            units[h] = unit_bytes
            self.used_bytes += unit_bytes
            if ready_s > 0.0:
                self.ready[h] = ready_s


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
    ) -> None:
        self.env = env
        self.pools = [KVPool(n, capacity_bytes) for n in range(topology.num_nodes)]
        self.topology = topology
        self.placements = placements
        self.network = network
        self.kv_bytes_per_token = kv_bytes_per_token
        self.block_size = block_size
        self.bytes_fetched = 0.0
        self.bytes_copied = 0.0  # GPU -> pool copies
        self._copy_free: dict[int, float] = {}  # instance -> when its copies so far end
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
        """``node`` failed: its pool's contents are gone (it comes back empty),
        and the loads from it under way are given up: their requests are
        submitted without the prefix, which is computed again."""
        pool = self.pools[node]
        pool.units.clear()
        pool.ready.clear()
        pool.used_bytes = 0.0
        for load in self._loading.pop(node, []):
            seq, engine, transfer, _ = load
            load[3] = True
            if transfer is not None:
                self.network.cancel(transfer)
            engine.submit(seq)

    def keep_prompt(self, engine: Engine, seq: Seq) -> None:
        """An engine computed ``seq``'s prompt: its node's pool keeps the prefix."""
        hashes = cacheable(seq.req, self.block_size)
        if not hashes:
            return
        unit_bytes = seq.req.prefix_block_tokens * self.kv_bytes_per_token
        node = self.placements[engine.id].node
        pool = self.pools[node]
        new = sum(1 for h in hashes if h not in pool.units)
        if not new or unit_bytes > pool.capacity_bytes:
            pool.insert(hashes, unit_bytes)
            return
        # one copy of the new units over the instance's PCIe links, after its earlier ones
        _, rate = self._rate(engine.id, node)
        start = max(self.env.now, self._copy_free.get(engine.id, 0.0))
        end = start + new * unit_bytes / rate
        self._copy_free[engine.id] = end
        self.bytes_copied += new * unit_bytes
        pool.insert(hashes, unit_bytes, end)

    def prefix(self, req: Request) -> dict[int, int]:
        """Node -> prompt tokens of ``req`` whose KV that node's pool holds."""
        hashes = cacheable(req, self.block_size)
        out = {}
        now = self.env.now
        for pool in self.pools:
            n = pool.match(hashes, now)
            if n:
                out[pool.node] = n * req.prefix_block_tokens
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
                self._rates[key] = (0.0, pcie * len(gpus))
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

    def estimate_s(self, instance: int, node: int, tokens: int) -> float:
        """Time to load ``tokens`` tokens' KV from ``node``'s pool to ``instance``,
        on an idle network."""
        lat, rate = self._rate(instance, node)
        return lat + tokens * self.kv_bytes_per_token / rate

    def fetch_then_submit(self, seq: Seq, engine: Engine, node: int, policy: str) -> None:
        """Load the prefix of ``seq`` that ``node``'s pool holds to ``engine``, then
        submit it there (at once when the engine holds at least as much)."""
        if not 0 <= node < len(self.pools):
            raise SpecError(
                f"scheduler {policy!r}: request {seq.req.id} fetches from node {node!r}; "
                f"nodes are 0..{len(self.pools) - 1}"
            )
        req = seq.req
        hashes = cacheable(req, self.block_size)
        pool = self.pools[node]
        n = pool.match(hashes, self.env.now)
        tokens = min(n * req.prefix_block_tokens, req.prompt_tokens - 1)
        if tokens <= engine.cached_prefix_tokens(req):
            engine.submit(seq)  # nothing to load that the instance does not hold
            return
        pool.touch(hashes[:n])
        nbytes = tokens * self.kv_bytes_per_token
        self.bytes_fetched += nbytes
        inst = engine.id
        load: list = [seq, engine, None, False]

        def landed(_done: object) -> None:
            if load[3]:
                return  # given up: the pool's node failed
            self._loading[node].remove(load)
            seq.preloaded_tokens = tokens
            engine.submit(seq)

        self._loading.setdefault(node, []).append(load)
        if node == self.placements[inst].node:
            lat, rate = self._rate(inst, node)
            self.env.timeout(lat + nbytes / rate).callbacks.append(landed)
        else:
            src = self.topology.gpus_of_node(node)[: len(self.placements[inst].gpus)]
            flows = shard_flows(self.topology, src, self.placements[inst].gpus, nbytes)
            load[2] = self.network.start(flows, label=f"fetch {req.id}")
            load[2].then(landed)
