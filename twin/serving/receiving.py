"""The receiving side of a KV hand-off: a decode instance's blocks for KV on its way.

The decode side takes the blocks a request's KV will land in before a byte
moves (:meth:`Receiver.reserve`); once the KV has landed the request decodes
from the next step (:meth:`Receiver.receive`). With prefix caching, the
leading prefix units the instance already holds are shared instead of moved.
"""

from __future__ import annotations

from collections.abc import Sequence as Sequence_

from twin.serving import holding
from twin.serving.kvcache import blocks_for
from twin.serving.ports import EngineLike
from twin.serving.sequence import INCOMING, Sequence


class Receiver:
    """The decode side of one engine: ``reserved`` maps a request id to the
    blocks its KV lands in and the cached prefix units it shares here
    instead, which do not move."""

    __slots__ = ("engine", "reserved")

    def __init__(self, engine: EngineLike) -> None:
        self.engine = engine
        self.reserved: dict[int, tuple[int, list[int]]] = {}

    def reserve(self, seq: Sequence) -> bool:
        """Take the blocks ``seq``'s KV will land in, if they are free (less
        the watermark) and a running slot is open. They stay reserved (counted
        as running) until :meth:`receive`.

        With prefix caching, the leading prefix units of ``seq`` this
        instance holds are shared instead (held from now, so they cannot be
        evicted before the KV lands) and only the rest is reserved and moved;
        at least the prompt's last token always moves, as a prefill always
        computes it."""
        eng = self.engine
        eng.sync_blocks()
        kv = eng.kv
        if eng.running_requests >= eng.config.max_num_seqs * eng.pp:
            return False
        cache = eng.cache
        hits: Sequence_[int] = ()
        if cache is not None:
            hashes = eng.cacheable(seq.req)
            unit = seq.req.prefix_block_tokens
            hits = hashes[: min(cache.match(hashes), (seq.prefill_len - 1) // unit)] if unit else ()
        shared = len(hits) * (seq.req.prefix_block_tokens // kv.block_size)
        need = blocks_for(seq.prefill_len, kv.block_size) - shared
        if not eng.planner.fits(hits, need):
            return False
        ff, pf = eng.ff, eng.pf
        # a stretch may go on (nothing joins it) if its steps still find their blocks
        kept = ff.keeps(need) if ff is not None else pf is not None and pf.keeps(need)
        if not kept:
            eng.interrupt()
        if not eng.planner.make_room(hits, need):
            return False  # the rest is being written down: tried again when it is
        kv.allocate(need)
        if kept and ff is not None and kv.watch is not None:
            kv.watch.stretch(eng, ff.stretch)  # its steps now cross a threshold sooner
        self.reserved[seq.req.id] = (need, list(hits))
        return True

    def unreserve(self, seq: Sequence) -> None:
        """Give back the blocks reserved for ``seq``'s KV (its prefill side failed)."""
        eng = self.engine
        eng.interrupt()
        blocks, units = self.reserved.pop(seq.req.id)
        holding.release(eng.kv, eng.cache, blocks, units)
        eng.blocks_freed()

    def prefix_tokens(self, seq: Sequence) -> int:
        """Prompt tokens of reserved ``seq`` whose KV is cached here (they do not move)."""
        return len(self.reserved[seq.req.id][1]) * seq.req.prefix_block_tokens

    def receive(self, seq: Sequence) -> None:
        """``seq``'s KV has landed in its reserved blocks; it decodes from the
        next step. With prefix caching, its whole prefix units are kept for
        later requests (as a prefill instance keeps the prompts it computes).
        A decode stretch under way takes it in where it can
        (:meth:`~twin.serving.fastforward.FastForward.lands`); otherwise it ends here."""
        eng = self.engine
        ff = eng.ff
        if ff is None or ff.stretch is None or eng.cache is not None:
            eng.interrupt()
            ff = None  # nothing takes it in: it joins at the next step boundary
        blocks, units = self.reserved.pop(seq.req.id)
        holding.hold(eng.kv, seq, blocks, units)
        if eng.cache is not None:
            holding.cache_prompt(eng.kv, eng.cache, seq)
        seq.instance = eng.id
        seq.handoff = False  # a recompute after a preemption happens here
        seq.state = INCOMING
        seq.epoch += 1
        eng.running[seq.req.id] = seq
        if ff is None or not ff.lands(seq):
            if ff is not None:
                eng.interrupt()
            eng.landed.append(seq)  # joins at the next step boundary
        eng.poke()
