"""KV tiers below HBM: host DRAM and local NVMe under each instance's prefix cache.

Production stacks keep KV below HBM (NVIDIA Dynamo's KV block manager, llm-d,
LMCache): a prefix unit evicted from the GPU's prefix cache is written down to
host DRAM, and one evicted from DRAM to a local SSD; a later request whose
prompt starts with units held below is served by loading them back instead of
computing them again. Here each instance has its own chain of tiers under its
:class:`~twin.serving.kvcache.PrefixCache` (``kv_tiers:`` in a spec).

- A tier holds whole prefix units (the trace's hashes) up to its capacity, in
  blocks of the instance's KV; it evicts least recently used first (the only
  policy, ``eviction: lru``), and what it evicts goes one tier down (off the
  last tier it is gone).
- A remote store (``kv_tiers.remote``) on a node of the topology is the last
  tier of every instance, one store shared by all: its writes and reads are
  transfers on the network (:class:`RemoteStore`), sharing links with
  hand-offs; it keeps what it serves.
- Tiers are exclusive: a unit is in at most one tier of an instance (HBM, DRAM
  or SSD; the shared remote store aside). A unit the prefix cache keeps again
  (computed or reloaded) leaves the lower tiers; a reloaded unit leaves its
  tier when the load starts.
- A write down is one transfer per batch of units evicted together, at the
  tier's write bandwidth, after the tier's writes before it (one writer per
  tier): a unit can be read from the tier only once its write has ended.
  A read back is one transfer per request and tier, at the tier's read
  bandwidth, after the reads from that tier before it, so loads compete.
  The request is submitted to its instance when its loads have ended, with
  the loaded tokens counted as cached (``Sequence.preloaded_tokens``).

The HBM blocks of an evicted unit stay held until the write that takes it
into the first tier below has ended (:class:`~twin.serving.kvcache.PrefixCache`,
``writing_blocks``): a busy writer delays the eviction, and an admission that
needs those blocks waits for the write (one event at its end). NOTE: two
exceptions free them at once: a decode step's next block (the step cannot
wait), and a write straight to the remote store (without local tiers; the
NIC reads the unit from a host staging copy).
An SSD read lands in host memory before it crosses PCIe; the SSD's read
bandwidth (13 GB/s) is below the host link's, so it alone is charged.

No SimPy event is spent on writes (their end times are kept with the units);
each request's reload is one timeout.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import simpy

from twin._declare import BANDWIDTH, NONNEG_INT, choice, declared, nbytes, seconds, section
from twin.net.flows import Network
from twin.net.shards import shard_flows
from twin.net.topology import Topology
from twin.serving.prefixunits import cacheable

# Share of a PCIe link's rate a bulk copy gets: the catalog gives the raw rate
# per direction (Gen5 x16: 32 GT/s x 16 lanes = 64 GB/s); 128b/130b encoding
# leaves 128/130 of it, and each transaction packet of the usual 256-byte
# maximum payload carries about 24 bytes of header, sequence number, LCRC and
# framing (PCI Express Base Specification 5.0), 256/280 of the rest: about
# 90%, 57.6 GB/s for Gen5 x16.
PCIE_PAYLOAD_EFFICIENCY = 128 / 130 * 256 / 280


def host_copy_bytes_s(pcie_bytes_s: float, gpus: int = 1) -> float:
    """Bytes/s a bulk copy between HBM and host memory moves over ``gpus``
    GPUs' host links together, each GPU copying its shard: the GPU catalog's
    raw rate per direction and GPU (``pcie_bytes_s``) at the payload share
    of a PCIe link (``PCIE_PAYLOAD_EFFICIENCY``). The one host-copy rate of
    the KV tiers' DRAM tier and of a KV pool's copies and loads inside a node."""
    return pcie_bytes_s * gpus * PCIE_PAYLOAD_EFFICIENCY


EVICTIONS = ("lru",)
TIER_NAMES = ("hbm", "dram", "ssd", "remote")


@dataclass(frozen=True)
class RemoteKeys:
    """A KV store on one node of the topology (``kv_tiers.remote:``), shared
    by every instance, below their local tiers; reads and writes are flows
    on the network."""

    capacity_bytes: float = declared(
        None, nbytes(positive=True), "KV the store holds in all", key="capacity",
        required="give the store's size, e.g. capacity: 10 TB",
    )  # fmt: skip
    node: int = declared(
        None, NONNEG_INT, "the topology node that holds the store (no instance on it)",
        required="give the node of the topology that holds the store, e.g. node: 4",
    )  # fmt: skip
    # The flows pay their path's link latencies; the store's own software (its
    # lookup and the start of the transfer) is not modelled beyond that: 0.
    latency_s: float = declared(
        "0 s", seconds(positive=False), "fixed time before each transfer", key="latency"
    )


@dataclass(frozen=True)
class TierKeys:
    """The KV tiers below each instance's HBM prefix cache (``kv_tiers:``);
    needs ``engine.prefix_caching``. A tier without a capacity is left out."""

    dram_bytes: float | None = declared(
        None, nbytes(positive=True), "host-memory KV per instance (null: no DRAM tier)",
        key="dram", nullable=True,
    )  # fmt: skip
    # null: the GPU catalog's host link per direction (pcie_bytes_s, e.g. PCIe
    # Gen5 x16 for an H100 SXM) times the instance's GPUs, each copying its
    # shard, at the payload share of the link (PCIE_PAYLOAD_EFFICIENCY).
    dram_bandwidth: float | None = declared(
        None, BANDWIDTH, "HBM <-> host copies per instance (null: the GPUs' PCIe links)",
        nullable=True,
    )  # fmt: skip
    # A DMA's set-up (microseconds) is far below a unit's copy time (a 512-token
    # unit of Llama-3-8B's KV, 64 MiB, takes about 1 ms at 55 GB/s): taken as 0.
    dram_latency_s: float = declared(
        "0 s", seconds(positive=False), "fixed time of one DRAM transfer", key="dram_latency"
    )
    ssd_bytes: float | None = declared(
        None, nbytes(positive=True), "local NVMe KV per instance (null: no SSD tier)",
        key="ssd", nullable=True,
    )  # fmt: skip
    # Samsung PM1743 (PCIe 5.0 x4 enterprise NVMe), Samsung's announced figures:
    # 13,000 MB/s sequential read, 6,600 MB/s sequential write (AnandTech,
    # "Samsung Announces First PCIe 5.0 Enterprise SSD: PM1743", 2021-12-23).
    ssd_read_bandwidth: float = declared("13 GB/s", BANDWIDTH, "NVMe reads per instance")
    ssd_write_bandwidth: float = declared("6.6 GB/s", BANDWIDTH, "NVMe writes per instance")
    # NAND flash reads take tens of microseconds (TLC page read) plus the NVMe
    # stack; 100 us is the round figure used for an enterprise NVMe 4 KiB read
    # (the PM1743's announcement gives none).
    ssd_latency_s: float = declared(
        "100 us", seconds(positive=False), "fixed time of one SSD transfer", key="ssd_latency"
    )
    remote: Any = declared(
        None, section(RemoteKeys), "a KV store on a node, over the network (null: none)",
        nullable=True,
    )  # fmt: skip
    eviction: str = declared("lru", choice(*EVICTIONS), "which unit a full tier gives up: lru")


class Tier:
    """One tier of one instance: LRU units up to ``capacity_blocks``, and the
    times its writer and its reader are busy until."""

    __slots__ = (
        "name", "capacity_blocks", "read_bps", "write_bps", "latency_s", "units",
        "used_blocks", "peak_blocks", "write_free_s", "read_free_s",
        "bytes_read", "bytes_written", "hit_tokens", "samples", "store",
    )  # fmt: skip

    def __init__(
        self, name: str, capacity_blocks: int, read_bps: float, write_bps: float, latency_s: float
    ) -> None:
        self.name = name
        self.capacity_blocks = capacity_blocks
        self.read_bps = read_bps
        self.write_bps = write_bps
        self.latency_s = latency_s
        self.units: OrderedDict[int, list[float]] = OrderedDict()  # hash -> [blocks, ready_s]
        self.used_blocks = 0
        self.peak_blocks = 0
        self.write_free_s = 0.0
        self.read_free_s = 0.0
        self.bytes_read = 0.0
        self.bytes_written = 0.0
        self.hit_tokens = 0
        self.samples: list[tuple[float, int]] = []  # (time, used blocks) at each change
        self.store: RemoteStore | None = None  # the remote tier: its place on the network


class RemoteStore:
    """Where the remote tier sits: ``node``'s GPUs as the far end of its
    flows on ``network`` (one per shard, as a hand-off's)."""

    __slots__ = ("network", "topology", "node", "gpus")

    def __init__(self, network: Network, topology: Topology, node: int) -> None:
        self.network = network
        self.topology = topology
        self.node = node
        self.gpus = topology.gpus_of_node(node)

    def flows(self, gpus: Sequence[int], nbytes: float, *, read: bool) -> list[Any]:
        far = self.gpus[: len(gpus)]
        src, dst = (far, gpus) if read else (gpus, far)
        return shard_flows(self.topology, src, dst, nbytes)


class Writer:
    """A path writes into a tier cross when it is not the tier's own: its rate
    (bytes/s) and when its writes so far end (a KV pool's copies cross the
    copying instance's PCIe links, one copy after another per instance)."""

    __slots__ = ("bps", "free_s")

    def __init__(self, bps: float) -> None:
        self.bps = bps
        self.free_s = 0.0


class TierChain:
    """The tiers below one instance's prefix cache, top first (DRAM, then SSD);
    or, as a node's KV pool (:mod:`twin.serving.kvpool`), its DRAM and SSD."""

    __slots__ = ("env", "tiers", "block_bytes", "gpus")

    def __init__(
        self, env: simpy.Environment, tiers: Sequence[Tier], block_bytes: float,
        gpus: Sequence[int] = (),
    ) -> None:  # fmt: skip
        self.env = env
        self.tiers = list(tiers)
        self.block_bytes = block_bytes
        self.gpus = tuple(gpus)  # the instance's GPUs: the near end of a remote tier's flows

    def lose_all(self) -> None:
        """What every tier holds is gone (the host they are on failed); each
        comes back empty."""
        for tier in self.tiers:
            tier.units.clear()
            tier.used_blocks = 0
            self._note(tier)

    def _note(self, tier: Tier) -> None:
        if tier.used_blocks > tier.peak_blocks:
            tier.peak_blocks = tier.used_blocks
        s = tier.samples
        now = self.env.now
        if s and s[-1][0] == now:
            s[-1] = (now, tier.used_blocks)
        else:
            s.append((now, tier.used_blocks))

    def write_down(
        self, units: Sequence[tuple[int, int]], level: int = 0, via: Writer | None = None
    ) -> float:
        """``units`` ((hash, blocks), least recently used first) leave the tier
        above ``level``: one write of them all into tier ``level`` (through
        ``via`` when given, else at the tier's write bandwidth after its
        writes before), which gives up its least recently used units (down a
        tier) to make room. Returns when the write has taken them all (now
        when none is written: off the last tier, too large for the tier,
        held already, or sent to the remote store, which copies them from
        host memory)."""
        now = self.env.now
        if level >= len(self.tiers) or not units:
            return now
        tier = self.tiers[level]
        if tier.store is not None:
            self._write_remote(tier, units, now)
            return now
        keep = [(h, b) for h, b in units if b <= tier.capacity_blocks and h not in tier.units]
        if not keep:
            return now
        need = sum(b for _, b in keep)
        down: list[tuple[int, int]] = []
        latest = 0.0  # the latest write still under way among those going down
        passed = False  # some of ``units`` pass by, down with the tier's own
        while need > tier.capacity_blocks:  # more than the tier holds: the oldest pass by
            h, b = keep.pop(0)
            need -= b
            down.append((h, b))
            passed = True
        while tier.used_blocks + need > tier.capacity_blocks:
            old, (held, ready) = tier.units.popitem(last=False)
            tier.used_blocks -= int(held)
            down.append((old, int(held)))
            latest = max(latest, ready)
        nbytes = need * self.block_bytes
        if via is None:
            start = max(now, tier.write_free_s)
            end = start + tier.latency_s + nbytes / tier.write_bps
            tier.write_free_s = end
        else:
            start = max(now, via.free_s)
            end = start + tier.latency_s + nbytes / via.bps
            via.free_s = end
        tier.bytes_written += nbytes
        for h, b in keep:
            tier.units[h] = [b, end]
        tier.used_blocks += need
        self._note(tier)
        if down:
            below = self._write_below(down, level + 1, latest)
            if passed:
                end = max(end, below)
        return end

    def _write_below(self, units: list[tuple[int, int]], level: int, ready: float) -> float:
        """As :meth:`write_down`, for units that can leave only once written (``ready``)."""
        if level >= len(self.tiers):
            return self.env.now
        tier = self.tiers[level]
        if tier.store is not None:
            self._write_remote(tier, units, ready)
            return self.env.now
        if ready > tier.write_free_s:
            tier.write_free_s = ready
        return self.write_down(units, level)

    def _write_remote(self, tier: Tier, units: Sequence[tuple[int, int]], ready: float) -> None:
        """Units leave this instance for the shared store ``tier``: those it
        holds already are only touched; the others are one transfer on the
        network, starting once they are all readable above (``ready``), and
        readable in the store when it ends. Off the store, units are gone."""
        assert tier.store is not None
        now = self.env.now
        keep = []
        for h, b in units:
            if h in tier.units:
                tier.units.move_to_end(h)
            elif b <= tier.capacity_blocks:
                keep.append((h, b))
        need = sum(b for _, b in keep)
        while need > tier.capacity_blocks:
            need -= keep.pop(0)[1]
        if not keep:
            return
        while tier.used_blocks + need > tier.capacity_blocks:
            _, (held, _ready) = tier.units.popitem(last=False)
            tier.used_blocks -= int(held)
        marks = []
        for h, b in keep:
            mark = [b, math.inf]  # readable when the write ends
            tier.units[h] = mark
            marks.append(mark)
        tier.used_blocks += need
        nbytes = need * self.block_bytes
        tier.bytes_written += nbytes
        self._note(tier)
        flows = tier.store.flows(self.gpus, nbytes, read=False)
        delay = max(0.0, ready - now) + tier.latency_s
        if not flows:  # no path to cross: readable once ready
            for mark in marks:
                mark[1] = now + delay
            return

        def written(_t: object) -> None:
            for mark in marks:
                mark[1] = self.env.now

        tier.store.network.start(flows, "kv write", delay_s=delay).then(written)

    def discard(self, h: int) -> None:
        """Unit ``h`` is in the prefix cache again: it leaves the lower tiers."""
        for tier in self.tiers:
            if tier.store is not None:
                return  # the shared store keeps it for the other instances
            u = tier.units.pop(h, None)
            if u is not None:
                tier.used_blocks -= int(u[0])
                self._note(tier)
                return

    def run(self, hashes: Sequence[int]) -> list[int]:
        """For each of ``hashes`` in order while it is readable in a lower
        tier now, that tier's index (the leading run below HBM)."""
        now = self.env.now
        out = []
        for h in hashes:
            for i, tier in enumerate(self.tiers):
                u = tier.units.get(h)
                if u is not None and u[1] <= now:
                    out.append(i)
                    break
            else:
                break
        return out

    def load(
        self,
        hashes: Sequence[int],
        where: Sequence[int],
        tokens: Sequence[int],
        *,
        keep: bool = False,
    ) -> tuple[float, Any]:
        """Take ``hashes`` (found in tiers ``where``, ``tokens`` each) out of
        their tiers (with ``keep``, as a shared pool does, they stay, as most
        recently used) and read them back: one read per tier, after that
        tier's reads before it; from the remote store (which keeps them) one
        transfer on the network. Returns when the last local read ends, and
        the remote read's transfer (None without one)."""
        now = self.env.now
        per = [0] * len(self.tiers)
        per_tokens = [0] * len(self.tiers)
        for h, i, n in zip(hashes, where, tokens, strict=True):
            tier = self.tiers[i]
            if keep or tier.store is not None:
                b = int(tier.units[h][0])
                tier.units.move_to_end(h)
            else:
                b = int(tier.units.pop(h)[0])
                tier.used_blocks -= b
            per[i] += b
            per_tokens[i] += n
        done = now
        transfer = None
        for i, blocks in enumerate(per):
            if not blocks:
                continue
            tier = self.tiers[i]
            nbytes = blocks * self.block_bytes
            if tier.store is not None:
                tier.bytes_read += nbytes
                tier.hit_tokens += per_tokens[i]
                flows = tier.store.flows(self.gpus, nbytes, read=True)
                if flows:
                    transfer = tier.store.network.start(flows, "kv read", delay_s=tier.latency_s)
                else:
                    done = max(done, now + tier.latency_s)
                continue
            start = max(now, tier.read_free_s)
            end = start + tier.latency_s + nbytes / tier.read_bps
            tier.read_free_s = end
            tier.bytes_read += nbytes
            tier.hit_tokens += per_tokens[i]
            self._note(tier)
            done = max(done, end)
        return done, transfer


class KVTiers:
    """Every instance's tier chain, and the reloads before a request is submitted."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.chains: dict[int, TierChain] = {}
        self._reads: dict[
            int, tuple[Any, int, Any, Any]
        ] = {}  # remote reads under way, by transfer

    def add(self, instance: int, chain: TierChain) -> None:
        self.chains[instance] = chain

    def prefix_by_tier(self, engine: Any, req: Any) -> dict[str, int]:
        """Prompt tokens of ``req`` the instance would reuse from each tier
        (HBM first, then the run continuing below), as a router keeping KV
        events would estimate them."""
        out = dict.fromkeys(TIER_NAMES, 0)
        cache = engine.cache
        if cache is None:
            return out
        hashes = engine.cacheable(req)
        n = cache.match(hashes)
        unit = req.prefix_block_tokens
        out["hbm"] = n * unit
        chain = self.chains.get(engine.id)
        if chain is not None:
            for i in chain.run(hashes[n:]):
                out[chain.tiers[i].name] += unit
        return out

    def submit(self, seq: Any, engine: Any) -> None:
        """Submit ``seq`` to ``engine`` once the prefix units its lower tiers
        hold (after those in HBM) are loaded back; at once when there are none."""
        chain = self.chains.get(engine.id)
        cache = engine.cache
        if chain is None or cache is None or not engine.up:
            engine.submit(seq)
            return
        req = seq.req
        hashes = cacheable(req, engine.kv.block_size)
        n = cache.match(hashes)
        where = chain.run(hashes[n:])
        if not where:
            engine.submit(seq)
            return
        unit = req.prefix_block_tokens
        limit = req.prompt_tokens - 1  # a prefill always computes the last token
        tokens = []
        for k in range(len(where)):
            tokens.append(max(0, min(unit, limit - (n + k) * unit)))
        while tokens and tokens[-1] == 0:
            tokens.pop()
        where = where[: len(tokens)]
        if not where:
            engine.submit(seq)
            return
        loaded = hashes[n : n + len(where)]
        now = self.env.now
        done, transfer = chain.load(loaded, where, tokens)
        by = dict.fromkeys(TIER_NAMES[1:], 0)
        for t, i in zip(tokens, where, strict=True):
            by[chain.tiers[i].name] += t
        seq.tier_tokens = (by["dram"], by["ssd"], by["remote"])
        seq.preloaded_tokens = n * unit + sum(tokens)
        seq.kv_load_s = done - now
        waiting = [2 if transfer is not None else 1]

        def landed(_ev: object) -> None:
            waiting[0] -= 1
            if waiting[0] == 0:
                if transfer is not None:
                    seq.kv_load_s = max(seq.kv_load_s, self.env.now - now)
                engine.submit(seq)

        self.env.timeout(done - now).callbacks.append(landed)
        if transfer is not None:
            store = chain.tiers[-1].store
            assert store is not None  # only the remote tier reads over the network
            self._reads[transfer.id] = (seq, n * unit, (store.network, transfer), landed)
            transfer.then(lambda t: landed(self._reads.pop(t.id, None)))

    def give_up(self, transfers: set[int]) -> None:
        """Give up the remote-store reads moving as ``transfers`` (ids; they
        wait on failed links): their requests go on with only what HBM holds
        (what they loaded from the other tiers is computed again)."""
        for tid in sorted(set(self._reads) & transfers):
            seq, hbm, (network, transfer), landed = self._reads.pop(tid)
            network.cancel(transfer)
            seq.preloaded_tokens = hbm
            seq.tier_tokens = (0, 0, 0)
            landed(None)

    def _named(self, name: str) -> list[Tier]:
        """The tiers called ``name``, each once (the remote store is every chain's)."""
        out: list[Tier] = []
        for c in self.chains.values():
            for t in c.tiers:
                if t.name == name and not any(t is u for u in out):
                    out.append(t)
        return out

    def occupancy(
        self, window_s: float, end_s: float, windows: Sequence[tuple[float, float]] | None = None
    ) -> dict[str, dict[str, list[float]]]:
        """Per tier (DRAM, SSD), the bytes it holds summed over instances, per
        window ``[k window_s, (k+1) window_s)`` up to ``end_s`` (the last one
        ends there, as the timeline's), or per ``(start, end)`` of ``windows``
        (one after the other from 0 to ``end_s``: the timeline's rows):
        ``mean_bytes`` (averaged over the window's time) and ``peak_bytes``
        (the most held at any instant of it)."""
        if windows is None:
            n = max(1, math.ceil(end_s / window_s))
            windows = [(k * window_s, end_s if k == n - 1 else (k + 1) * window_s)
                       for k in range(n)]  # fmt: skip
        n = len(windows)
        out: dict[str, dict[str, list[float]]] = {}
        for name in TIER_NAMES[1:]:
            tiers = self._named(name)
            if not tiers:
                continue
            block_bytes = next(iter(self.chains.values())).block_bytes
            steps: list[tuple[float, int]] = []  # (time, change in blocks)
            for t in tiers:
                held = 0
                for at, used in t.samples:
                    steps.append((at, used - held))
                    held = used
            steps.sort(key=lambda s: s[0])  # stable: instances in order at one time
            area = [0.0] * n
            peak = [0] * n
            level, since, i = 0, 0.0, 0
            for k, (start, end) in enumerate(windows):
                peak[k] = level
                while i < len(steps) and (steps[i][0] < end or (k == n - 1 and steps[i][0] <= end)):
                    at = steps[i][0]
                    area[k] += level * (at - since)
                    while i < len(steps) and steps[i][0] == at:  # one instant: all at once
                        level += steps[i][1]
                        i += 1
                    since = at
                    peak[k] = max(peak[k], level)
                area[k] += level * (end - since)
                since = end
                dur = end - start
                area[k] = area[k] / dur if dur > 0 else float(level)
            out[name] = {
                "mean_bytes": [a * block_bytes for a in area],
                "peak_bytes": [p * block_bytes for p in peak],
            }
        return out

    def summary(self, prompt_tokens: int) -> dict[str, Any]:
        """Per tier (DRAM, SSD): tokens served from it, their share of
        ``prompt_tokens``, bytes read and written, peak and final occupancy."""
        out: dict[str, Any] = {}
        for name in TIER_NAMES[1:]:
            tiers = self._named(name)
            if not tiers:
                continue
            block_bytes = next(iter(self.chains.values())).block_bytes
            out[name] = tier_summary(tiers, prompt_tokens, block_bytes, "peak_instance_bytes")
        return out


def tier_summary(
    tiers: Sequence[Tier], prompt_tokens: int, block_bytes: float, peak_key: str
) -> dict[str, Any]:
    """One summary entry for the tiers of one name (one per instance or node): hit
    tokens and their share of ``prompt_tokens``, bytes read and written, capacity, the
    fullest one's peak (under ``peak_key``) and what all hold at the end."""
    hit = sum(t.hit_tokens for t in tiers)
    return {
        "hit_tokens": hit,
        "hit_rate": hit / prompt_tokens if prompt_tokens else None,
        "bytes_read": sum(t.bytes_read for t in tiers),
        "bytes_written": sum(t.bytes_written for t in tiers),
        "capacity_bytes": sum(t.capacity_blocks for t in tiers) * block_bytes,
        peak_key: max(t.peak_blocks for t in tiers) * block_bytes,
        "final_bytes": sum(t.used_blocks for t in tiers) * block_bytes,
    }


def build_chain(
    env: simpy.Environment,
    keys: TierKeys,
    *,
    block_bytes: float,
    pcie_bytes_s: float,
    gpus: Sequence[int] = (),
    remote: Tier | None = None,
) -> TierChain:
    """The tier chain ``keys`` gives one instance on ``gpus`` whose blocks are
    ``block_bytes`` each and whose host links carry ``pcie_bytes_s`` in all
    (raw); ``remote``, the cluster's store tier, goes last."""
    tiers = []
    if keys.dram_bytes is not None:
        bw = keys.dram_bandwidth
        if bw is None:
            bw = host_copy_bytes_s(pcie_bytes_s)
        tiers.append(Tier("dram", int(keys.dram_bytes // block_bytes), bw, bw, keys.dram_latency_s))
    if keys.ssd_bytes is not None:
        tiers.append(
            Tier(
                "ssd",
                int(keys.ssd_bytes // block_bytes),
                keys.ssd_read_bandwidth,
                keys.ssd_write_bandwidth,
                keys.ssd_latency_s,
            )  # fmt: skip
        )
    if remote is not None:
        tiers.append(remote)
    return TierChain(env, tiers, block_bytes, gpus)


def build_remote(
    keys: RemoteKeys, *, block_bytes: float, network: Network, topology: Topology
) -> Tier:
    """The remote store tier of ``keys`` on ``topology``, shared by every
    instance (blocks of ``block_bytes``); its bandwidths are the network's
    (its node checked as the spec resolved: ``twin.sim.layout``)."""
    tier = Tier("remote", int(keys.capacity_bytes // block_bytes), math.inf, math.inf,
                keys.latency_s)  # fmt: skip
    tier.store = RemoteStore(network, topology, keys.node)
    return tier
