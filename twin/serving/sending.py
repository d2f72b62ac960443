"""The sending side of a KV hand-off: a prefill instance's prompts whose KV waits to move.

A prompt computed for another instance stays in this one's blocks (state
HANDOFF) until the hand-off has moved its KV (:meth:`Sender.release`), the
decode instance picked turns out to be this one (:meth:`Sender.keep`), or its
decode side fails (:meth:`Sender.drop`). Blocks are freed only after the last
byte landed: this side never over-commits.
"""

from __future__ import annotations

from twin.serving import holding
from twin.serving.ports import EngineLike
from twin.serving.sequence import HANDOFF, INCOMING, PREFILL, Sequence


class Sender:
    """The prefill side of one engine: ``held`` maps a request id to its
    sequence and the blocks and cached prefix units its KV holds here."""

    __slots__ = ("engine", "held", "_handing")

    def __init__(self, engine: EngineLike) -> None:
        self.engine = engine
        self.held: dict[int, tuple[Sequence, int, list[int]]] = {}
        self._handing: Sequence | None = None  # the sequence hand_off is handing off

    def hand_off(self, s: Sequence) -> None:
        """``s``'s prompt is done and its KV is to move: hold it here and tell the hooks."""
        eng = self.engine
        del eng.running[s.req.id]
        self.held[s.req.id] = (s, s.blocks, s.units)
        s.blocks = 0
        s.units = []
        s.shared_blocks = 0
        s.state = HANDOFF
        s.epoch += 1
        eng.observer.prefilled(eng.env.now, eng.id, s.req)
        assert eng.hooks is not None, "a hand-off needs hooks"
        self._handing = s  # a keep() from the hook is at the iteration's end
        eng.hooks.on_prefilled(eng, s)
        self._handing = None

    def keep(self, seq: Sequence) -> None:
        """The decode instance picked for ``seq`` is this one, so its KV stays
        where it is; it decodes here from the next step, as a colocated request
        does (nothing moves, nothing is reserved). Picked as its prompt
        completes, it joins the batch at once, the iteration being over; picked
        later (its decode side failed), steps may be under way or the engine
        idle: it joins at the next step boundary, as a landed KV does."""
        eng = self.engine
        outside = seq is not self._handing
        if outside:
            eng.interrupt()
        _, blocks, units = self.held.pop(seq.req.id)
        holding.hold(eng.kv, seq, blocks, units)
        seq.handoff = False
        eng.running[seq.req.id] = seq
        if not outside:
            eng.batch.join(seq)
            return
        seq.state = INCOMING
        eng.landed.append(seq)
        eng.poke()

    def release(self, seq: Sequence) -> None:
        """``seq``'s KV has moved; free the blocks it held here."""
        eng = self.engine
        eng.interrupt()
        _, blocks, units = self.held.pop(seq.req.id)
        holding.release(eng.kv, eng.cache, blocks, units)
        eng.blocks_freed()

    def drop(self, seq: Sequence) -> None:
        """Give up ``seq`` here, whose decode side failed: queued, prefilling
        (a chunk in the iteration under way is wasted) or prefilled with its
        KV waiting to move; everything it holds is freed."""
        eng = self.engine
        rid = seq.req.id
        eng.interrupt()
        eng.queue_changes += 1
        if rid in self.held:
            _, blocks, units = self.held.pop(rid)
            holding.release(eng.kv, eng.cache, blocks, units)
        elif eng.running.get(rid) is seq:
            assert seq.state == PREFILL, f"request {rid} is {seq.state} on instance {eng.id}"
            del eng.running[rid]
            eng.prefilling.remove(seq)
            holding.drop(eng.kv, eng.cache, seq)
        else:
            eng.waiting.remove(seq)
            eng.waiting_moved(-seq.prefill_len)
        eng.blocks_freed()
