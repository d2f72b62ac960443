"""Paged KV-cache memory of one serving instance.

Memory is counted in blocks of ``block_size`` tokens (vLLM's paged attention):
a sequence of ``n`` tokens holds ``ceil(n / block_size)`` blocks. The manager
only counts; which physical block holds what does not change any timing.
"""

from __future__ import annotations

from twin.errors import CapacityError


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

    __slots__ = ("total", "free", "watermark", "block_size", "peak_used")

    def __init__(self, total: int, block_size: int, watermark: int = 0) -> None:
        if total <= 0:
            raise CapacityError(f"KV capacity (={total} blocks) must be > 0")
        if block_size <= 0:
            raise CapacityError(f"block_size (={block_size}) must be > 0")
        self.total = total
        self.free = total
        self.block_size = block_size
        self.watermark = min(watermark, total - 1)
        self.peak_used = 0

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

    def release(self, blocks: int) -> None:
        if self.free + blocks > self.total:
            raise AssertionError(f"release({blocks}) would exceed capacity {self.total}")
        self.free += blocks
