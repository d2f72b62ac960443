"""The KV a sequence holds on an instance: blocks of its own and cached prefix units.

A sequence's KV is in ``blocks`` blocks only it uses and in the prefix units
``units`` it shares through the instance's prefix cache (``shared_blocks``
blocks). These functions move that holding between a sequence, the block
manager and the prefix cache; none of them decides anything.
"""

from __future__ import annotations

from twin.serving.kvcache import BlockManager, PrefixCache
from twin.serving.prefixunits import cacheable
from twin.serving.sequence import Sequence


def hold(kv: BlockManager, seq: Sequence, blocks: int, units: list[int]) -> None:
    """``seq``'s KV is in ``blocks`` blocks and the cached prefix ``units`` of ``kv``'s instance."""
    seq.blocks = blocks
    seq.units = units
    seq.shared_blocks = len(units) * (seq.req.prefix_block_tokens // kv.block_size)


def release(kv: BlockManager, cache: PrefixCache | None, blocks: int, units: list[int]) -> None:
    """Give back ``blocks`` blocks and the cached prefix ``units``."""
    kv.release(blocks)
    if units:
        assert cache is not None
        cache.release(units)


def drop(kv: BlockManager, cache: PrefixCache | None, s: Sequence) -> None:
    """Give back everything ``s`` holds: its blocks, its cached units."""
    kv.release(s.blocks)
    s.blocks = 0
    if s.units:
        assert cache is not None
        cache.release(s.units)
        s.units = []
    s.shared_blocks = 0


def cache_prompt(kv: BlockManager, cache: PrefixCache, s: Sequence) -> None:
    """``s``'s prompt is computed: offer its whole units to the prefix cache."""
    unit_blocks = s.req.prefix_block_tokens // kv.block_size
    new = cacheable(s.req, kv.block_size)[len(s.units) :]
    # up to a unit another sequence cached: the chain continues from there
    n = cache.insert(new, unit_blocks)
    s.blocks -= n * unit_blocks
    s.shared_blocks += n * unit_blocks
    s.units += new[:n]
