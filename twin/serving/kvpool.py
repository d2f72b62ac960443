"""A node's DRAM KV pool: prompt prefixes kept in host memory for any instance.

Mooncake keeps the KV cache of past prompts in the CPU memory of every node
(its "Mooncake Store"), so that an instance anywhere can load a reusable
prefix over the network instead of computing it again. A pool holds prefix
units (the trace's hashes, 512 tokens each in the Mooncake trace) up to a
byte capacity, evicting the least recently used.

NOTE: copying a prompt's KV from GPU to host memory is taken as free and
instant (it overlaps with serving in the real system), and a loaded prefix
lands in a staging buffer before the prefill allocates its blocks, so the
load does not hold KV blocks while it travels.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from twin.serving.kvcache import leading_run


class KVPool:
    """LRU set of prefix units on one node, ``capacity_bytes`` in all."""

    __slots__ = ("node", "capacity_bytes", "used_bytes", "units")

    def __init__(self, node: int, capacity_bytes: float) -> None:
        self.node = node
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0.0
        self.units: OrderedDict[int, float] = OrderedDict()  # hash -> bytes

    def match(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes``, from the first, are here."""
        return leading_run(hashes, self.units)

    def touch(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            self.units.move_to_end(h)

    def insert(self, hashes: Sequence[int], unit_bytes: float) -> None:
        """Keep ``hashes`` (a prompt's leading units), evicting the least
        recently used units when full; a unit larger than the pool is skipped."""
        if unit_bytes > self.capacity_bytes:
            return
        units = self.units
        for h in hashes:
            if h in units:
                units.move_to_end(h)
                continue
            while self.used_bytes + unit_bytes > self.capacity_bytes:
                _, b = units.popitem(last=False)
                self.used_bytes -= b
            units[h] = unit_bytes
            self.used_bytes += unit_bytes
