"""Paged KV-cache memory of one serving instance.

Memory is counted in blocks of ``block_size`` tokens (vLLM's paged attention):
a sequence of ``n`` tokens holds ``ceil(n / block_size)`` blocks. The manager
only counts; which physical block holds what does not change any timing.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING, Any

from twin.errors import CapacityError

if TYPE_CHECKING:
    from twin.serving.tiers import TierChain


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens: ``ceil(tokens / block_size)``."""
    return -(-tokens // block_size)


def kv_capacity_blocks(
    *,
    gpu_memory_bytes: float,
    memory_utilization: float,
    weight_bytes: float,
    activation_reserve_bytes: float,
    kv_bytes_per_token: float,
    tp: int,
    pp: int,
    block_size: int,
) -> int:
    """Blocks of KV an instance of ``tp x pp`` GPUs holds.

    Each GPU keeps ``memory x utilization - weights / (tp*pp) - reserve`` bytes
    for KV, and a token's KV is spread evenly over the ``tp*pp`` GPUs (TP shards
    the heads, PP the layers). Raises :class:`CapacityError` when the weights
    and reserve leave no room, naming the numbers so the fix is evident.
    """
    gpus = tp * pp
    per_gpu = gpu_memory_bytes * memory_utilization - weight_bytes / gpus - activation_reserve_bytes
    if per_gpu <= 0:
        raise CapacityError(
            f"no memory left for the KV cache: each of the {gpus} GPUs has "
            f"{gpu_memory_bytes * memory_utilization / 2**30:.1f} GiB usable, the weights take "
            f"{weight_bytes / gpus / 2**30:.1f} GiB and the activation reserve "
            f"{activation_reserve_bytes / 2**30:.1f} GiB; raise tp/pp or use a larger GPU"
        )
    per_token_per_gpu = kv_bytes_per_token / gpus
    return int(per_gpu // (per_token_per_gpu * block_size))


class BlockManager:
    """Counts free and used KV blocks; never goes negative nor above capacity.

    ``watermark`` blocks are kept back from new admissions (not from running
    sequences), as vLLM does, so that running sequences can grow a little
    before anything must be preempted.
    """

    __slots__ = ("total", "free", "watermark", "block_size", "peak_used", "watch")

    def __init__(self, total: int, block_size: int, watermark: int = 0, peak_used: int = 0) -> None:
        if total <= 0:
            raise CapacityError(f"KV capacity (={total} blocks) must be > 0")
        if block_size <= 0:
            raise CapacityError(f"block_size (={block_size}) must be > 0")
        self.total = total
        self.free = total
        self.block_size = block_size
        self.watermark = min(watermark, total - 1)
        self.peak_used = peak_used  # an instance's peak, kept over a failure's new blocks
        # told of every change of free (twin.sim.control: a sleeping tick's watch)
        self.watch: Any = None

    @property
    def used(self) -> int:
        return self.total - self.free

    def can_admit(self, blocks: int) -> bool:
        """Whether a new sequence needing ``blocks`` may start now."""
        return self.free - blocks >= self.watermark

    def allocate(self, blocks: int) -> None:
        if blocks > self.free:
            raise AssertionError(f"allocate({blocks}) with only {self.free} free blocks")
        self.free -= blocks
        used = self.total - self.free
        if used > self.peak_used:
            self.peak_used = used
        if self.watch is not None:
            self.watch.free(self)

    def release(self, blocks: int) -> None:
        if self.free + blocks > self.total:
            raise AssertionError(f"release({blocks}) would exceed capacity {self.total}")
        self.free += blocks
        if self.watch is not None:
            self.watch.free(self)


def leading_run(hashes: Sequence[int], held: Container[int]) -> int:
    """How many of ``hashes``, from the first, are in ``held``: a prefix unit is
    reusable only when every unit before it is too."""
    found = list(map(held.__contains__, hashes))  # one pass in C, then the first miss
    try:
        return found.index(False)
    except ValueError:
        return len(found)


class PrefixCache:
    """Prompt KV kept on an instance for reuse (vLLM's automatic prefix caching).

    The unit is one prefix hash of the trace (Mooncake's ``hash_ids``: 512
    tokens, a whole number of KV blocks): a hash names a block of a prompt
    *and* everything before it, so a request reuses the longest leading run of
    its hashes present here. A unit is held by the sequences using it
    (``refs``); when none does it stays cached, evictable, least recently used
    first. Cached units occupy blocks of the :class:`BlockManager` (not free);
    evicting one releases them. With tiers below, an evicted unit's blocks
    stay held (``writing_blocks``, neither free nor evictable) until its
    write down has ended: one event per write, at its end, hands them to
    ``on_freed(blocks)`` (the engine, which releases them, so that an
    admission waiting for them goes on). ``evict(..., hold=False)`` frees
    them at once (a decode step's next block, which cannot wait).

    Cost: a hash per block. Each unit carries the stamp of its last use (a
    counter bumped by every insert and acquire). The units a release lets go
    idle enter the heap ``_idle`` as runs of rising stamps (one entry per
    run, keyed by the stamp of its next unit; a sequence's units rise, so a
    release is mostly one run): eviction takes units off the run at the top
    while they come before every other run's next, so the least recently
    used idle unit goes first, in O(1) per unit and O(log runs) per run,
    without looking at the units held. A unit used again (or evicted) since
    its run was queued is stale there and skipped; the runs are rebuilt from
    the idle units when the units queued outnumber twice the cache.
    """

    __slots__ = (
        "kv", "units", "cached_blocks", "evictable_blocks", "tiers", "writing_blocks",
        "on_freed", "_idle", "_in_runs", "_clock", "changes",
    )  # fmt: skip

    def __init__(
        self,
        kv: BlockManager,
        tiers: TierChain | None = None,
        on_freed: Callable[[int], None] | None = None,
    ) -> None:
        self.kv = kv
        # the tiers below (twin.serving.tiers): evicted units are written down
        # to them, and a unit kept here again leaves them
        self.tiers = tiers
        # hash -> [refs, blocks, stamp of last use (-1 once evicted), hash]
        self.units: dict[int, list[int]] = {}
        # heap of runs of units no one holds: (stamp of the next, its index, run);
        # a run holds (stamp when queued, unit) in rising stamps
        self._idle: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
        self._in_runs = 0  # entries of the runs not yet taken off
        self._clock = 0  # stamps of use: insert and acquire bump it
        self.cached_blocks = 0
        self.evictable_blocks = 0
        self.writing_blocks = 0  # evicted, held until their write down ends
        # releases blocks held for a write, once it has ended
        self.on_freed: Callable[[int], None] | None = on_freed
        self.changes = 0  # units kept or evicted so far (what a match may have read)

    def forget_writes(self) -> None:
        """The instance failed: the writes under way end without releasing
        their blocks (they were of the life that ended)."""
        self.on_freed = None

    def match(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes``, from the first, are cached."""
        return leading_run(hashes, self.units)

    def idle_blocks(self, hashes: Sequence[int]) -> int:
        """Blocks of the cached ``hashes`` that no sequence holds (evictable)."""
        if not self.evictable_blocks:
            return 0
        n = 0
        for u in map(self.units.__getitem__, hashes):
            if not u[0]:
                n += u[1]
        return n

    def acquire(self, hashes: Sequence[int]) -> None:
        units = self.units
        clock = self._clock
        idle = 0
        for u in map(units.__getitem__, hashes):
            refs = u[0]
            if not refs:
                idle += u[1]  # its heap entry goes stale: the stamp moves on
            u[0] = refs + 1
            clock += 1
            u[2] = clock
        self._clock = clock
        self.evictable_blocks -= idle

    def release(self, hashes: Sequence[int]) -> None:
        units = self.units
        idle = self._idle
        freed = 0
        run: list[tuple[int, list[int]]] = []
        last = -1
        append = run.append
        for u in map(units.__getitem__, hashes):
            refs = u[0] - 1
            u[0] = refs
            if not refs:
                freed += u[1]
                stamp = u[2]
                if stamp < last:  # out of order: the run ends before it
                    heapq.heappush(idle, (run[0][0], 0, run))
                    self._in_runs += len(run)
                    run = []
                    append = run.append
                append((stamp, u))
                last = stamp
        if run:
            heapq.heappush(idle, (run[0][0], 0, run))
            self._in_runs += len(run)
        self.evictable_blocks += freed
        if self._in_runs > 2 * len(units) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        """The idle units as one run, without the stale entries."""
        run = sorted((u[2], u) for u in self.units.values() if u[0] == 0)
        self._idle = [(run[0][0], 0, run)] if run else []
        self._in_runs = len(run)

    def insert(self, hashes: Sequence[int], blocks: int) -> int:
        """Keep the units ``hashes`` a sequence computed (and gives up),
        ``blocks`` each, held by that sequence, up to the first already cached
        (another sequence's, kept instead); how many were kept."""
        units = self.units
        tiers = self.tiers
        clock = self._clock
        for h in hashes:
            if h in units:
                break
            if tiers is not None:
                tiers.discard(h)
            clock += 1
            units[h] = [1, blocks, clock, h]
        n = clock - self._clock
        self._clock = clock
        self.cached_blocks += n * blocks
        self.changes += n
        return n

    def evict(self, free_target: int, *, hold: bool = True) -> None:
        """Evict idle units, least recently used first, until ``free_target``
        blocks are free (counting those held for a write under way) or
        nothing idle is left. With tiers below, the units are written down in
        one write, and their blocks are released when it ends (at once
        without ``hold``)."""
        units = self.units
        kv = self.kv
        tiers = self.tiers
        held = hold and tiers is not None
        if (
            kv.free + (self.writing_blocks if held else 0) >= free_target
            or not self.evictable_blocks
        ):
            return
        gone: list[tuple[int, int]] = []
        # the blocks this batch frees: held until written, or released at once
        freed = 0
        short = free_target - kv.free - (self.writing_blocks if held else 0)
        idle = self._idle
        while idle and freed < short:
            _, i, run = idle[0]  # the run at the top stays there while it is taken from
            m = len(idle)
            after = idle[1][0] if m > 1 else -1  # the next run's first stamp: a child's
            if m > 2 and idle[2][0] < after:
                after = idle[2][0]
            first, n = i, len(run)
            while i < n:
                stamp, u = run[i]
                if 0 <= after < stamp:
                    break  # another run's unit was used before this one
                i += 1
                if u[0] or u[2] != stamp:
                    continue  # stale: used again (or evicted) since it went idle
                u[2] = -1
                del units[u[3]]
                self.changes += 1
                freed += u[1]
                if tiers is not None:
                    gone.append((u[3], u[1]))
                if freed >= short:
                    break
            self._in_runs -= i - first
            if i < n:
                heapq.heapreplace(idle, (run[i][0], i, run))
            else:
                heapq.heappop(idle)
        self._gone(gone, freed, held)

    def let_go(
        self, hashes: Sequence[int], *, write_down: bool, stamps: Sequence[int] | None = None
    ) -> int:
        """Evict now the idle units among ``hashes`` (a retention policy's,
        :mod:`twin.sim.sessions`), least recently used first as ``evict``
        would take them: with ``write_down`` they are written to the tiers
        below (their blocks held until written), else their blocks are freed
        at once. With ``stamps`` (of :meth:`stamps`), a unit used again since
        is kept. Returns the blocks let go."""
        units = self.units
        gone: list[tuple[int, int]] = []
        freed = 0
        for k, h in enumerate(hashes):
            u = units.get(h)
            if u is None or u[0] or stamps is not None and u[2] != stamps[k]:
                continue
            u[2] = -1  # its queued run entry goes stale
            del units[h]
            self.changes += 1
            freed += u[1]
            gone.append((h, u[1]))
        if freed:
            held = write_down and self.tiers is not None
            self._gone(gone if held else [], freed, held)
        return freed

    def stamps(self, hashes: Sequence[int]) -> list[int]:
        """The last-use stamps of ``hashes`` (-1 for one not cached)."""
        units = self.units
        return [units[h][2] if h in units else -1 for h in hashes]

    def _gone(self, gone: list[tuple[int, int]], freed: int, held: bool) -> None:
        """``freed`` blocks of evicted units left the cache: released now, or
        (``held``) once their write down to the tiers, of ``gone``, has ended."""
        kv = self.kv
        tiers = self.tiers
        self.cached_blocks -= freed
        self.evictable_blocks -= freed
        pending = freed if held else 0
        if not held:
            kv.release(freed)
        if tiers is None or not gone:
            return
        taken = tiers.write_down(gone)  # one write of the batch
        if not pending:
            return
        now = tiers.env.now
        if taken <= now:
            kv.release(pending)
            return
        self.writing_blocks += pending

        def written(_ev: object) -> None:
            self.writing_blocks -= pending
            if self.on_freed is not None:
                self.on_freed(pending)  # the engine releases them (and goes on)
            else:
                kv.release(pending)

        tiers.env.timeout(taken - now).callbacks.append(written)
