"""Planning one iteration of an engine: what it computes, as a named record
(:class:`~twin.serving.ports.Plan`).

The policy is vLLM's (v0 scheduler): prefill first; a waiting request is
admitted, in the order of the engine's queue policy, only when the blocks for
its whole prompt are free (less a small watermark); running sequences grow a
block at a time; when a decode step finds no free block, a decoding sequence
(the most recently admitted, or the queue policy's victim) is preempted and
will be recomputed (its prompt plus the tokens it had produced are prefilled
again); with classes of traffic the victim is of the lowest class running
(:mod:`twin.workload.classes`). With ``chunked_prefill`` the iteration
carries every running decode first and fills the rest of a token budget with
prefill chunks (Sarathi-Serve style).
"""

from __future__ import annotations

from collections.abc import Sequence as Sequence_

from twin.errors import SpecError
from twin.perf.iteration import Batch
from twin.serving import holding
from twin.serving.kvcache import blocks_for
from twin.serving.ports import Chunks, EngineLike, Plan
from twin.serving.queuepolicy import PicksVictim
from twin.serving.sequence import DECODE, PREFILL, WAITING, Sequence

_EMPTY = Batch()


class Planner:
    """Plans the iterations of one engine (of the lane it is planning):
    admission from its queue, prompt chunks, the blocks of the next decode
    step and preemption. ``preempted`` says whether the last plan preempted."""

    __slots__ = ("engine", "preempted", "_pick_victim")

    def __init__(self, engine: EngineLike) -> None:
        self.engine = engine
        self.preempted = False
        policy = engine.queue_policy
        self._pick_victim = policy.victim if isinstance(policy, PicksVictim) else None

    def plan(self) -> Plan:
        """This iteration: sequences landed join the decode batch, then decodes
        and prompts share it as the engine's configuration says."""
        eng = self.engine
        cfg = eng.config
        batch = eng.batch
        self.preempted = False
        if eng.landed:
            for seq in eng.landed:
                batch.join(seq)
            eng.landed.clear()
        if cfg.chunked_prefill:
            decoding = self._prepare_decode()
            # a verifying decode takes its k + 1 tokens of the budget (vLLM V1
            # schedules a request's draft tokens with it)
            width = 1 if eng.spec is None else eng.spec.k + 1
            budget = cfg.max_batched_tokens - batch.count * width
            chunks = self._take_chunks(budget, chunked=True)
        else:
            chunks = self._take_chunks(cfg.max_batched_tokens, chunked=False)
            decoding = False
            if not chunks:
                decoding = self._prepare_decode()
        if chunks or decoding and batch.joined:
            self.note_decode_start(chunks, decoding, eng.env.now)
        if not chunks:
            return Plan(None if decoding else _EMPTY, chunks, decoding)
        prefill = tuple((n, s.prefilled) for s, n in chunks)
        if decoding:
            return Plan(Batch(prefill, batch.count, batch.ctx_sum), chunks, True)
        return Plan(Batch(prefill), chunks, False)

    def note_decode_start(self, chunks: Chunks, decoding: bool, now: float) -> None:
        """A landed sequence's first iteration here that produces a token starts
        at ``now`` (a stretch notes it for the step it joins in)."""
        for s, n in chunks:  # landed, then preempted (or retried) before its first decode step
            if s.landed and not s.handoff and s.prefilled + n >= s.prefill_len:
                s.mark("t_decode_start", now)
        if decoding:
            batch = self.engine.batch
            step = batch.steps + 1
            for s in batch.joined:
                if s.landed and s.state == DECODE and s.d_join == step:
                    s.mark("t_decode_start", now)

    def _take_chunks(self, budget: int, *, chunked: bool) -> Chunks:
        """Prefill work for this iteration: continue partial prompts, then admit from
        the head of the queue (its policy's order) while the head fits."""
        eng = self.engine
        chunks: Chunks = []
        if not eng.prefilling and not eng.waiting:
            return chunks
        lane = eng.lane
        seats = eng.config.max_num_seqs - eng.batch.count  # in this lane
        for s in eng.prefilling:
            if s.lane != lane:  # in another lane's micro-batch
                continue
            seats -= 1
            if budget <= 0:
                return chunks
            n = min(s.prefill_len - s.prefilled, budget)
            chunks.append((s, n))
            budget -= n
        kv = eng.kv
        cache = eng.cache
        now = eng.env.now
        pp = eng.pp
        limit = eng.config.max_num_seqs * pp
        waiting = eng.waiting
        while waiting and eng.running_requests < limit and (pp == 1 or seats > 0):
            s = waiting[0]
            hits: Sequence_[int] = ()
            if cache is not None:
                hits = s.req.prefix_hashes[: cache.match(eng.cacheable(s.req))]
            unit = s.req.prefix_block_tokens
            cached = min(max(len(hits) * unit, s.preloaded_tokens), s.prefill_len - 1)
            need = s.prefill_len - cached
            if budget <= 0 or (not chunked and chunks and need > budget):
                break
            shared = len(hits) * (unit // kv.block_size)
            need_blocks = blocks_for(s.prefill_len, kv.block_size) - shared
            if not self.fits(hits, need_blocks) or not self.make_room(hits, need_blocks):
                break  # (evicted blocks still being written: tried again when they are)
            waiting.popleft()
            eng.queue_changes += 1
            eng.waiting_moved(-s.prefill_len)
            kv.allocate(need_blocks)
            s.blocks = need_blocks
            s.units = list(hits)
            s.shared_blocks = shared
            s.prefilled = cached
            if s.mark("t_scheduled", now):
                s.cached_tokens = cached
            s.state = PREFILL
            s.lane = lane
            seats -= 1
            eng.running[s.req.id] = s
            eng.prefilling.append(s)
            n = min(need, budget) if chunked else need
            chunks.append((s, n))
            budget -= n
        return chunks

    def fits(self, hits: Sequence_[int], need: int) -> bool:
        """Whether ``need`` blocks more (beside the cached units ``hits``, which
        they share) fit above the watermark: free, being written down, or held
        only by the prefix cache and evictable."""
        kv, cache = self.engine.kv, self.engine.cache
        if cache is None:
            return kv.can_admit(need)
        spare = kv.free + cache.writing_blocks + cache.evictable_blocks - cache.idle_blocks(hits)
        return spare - need >= kv.watermark

    def make_room(self, hits: Sequence_[int], need: int) -> bool:
        """After :meth:`fits`: hold ``hits`` and evict for ``need`` free blocks;
        False (``hits`` let go again) while some of them are still being
        written down."""
        cache = self.engine.cache
        if cache is None:
            return True
        cache.acquire(hits)
        cache.evict(need)
        if self.engine.kv.free < need:
            cache.release(hits)
            return False
        return True

    def _prepare_decode(self) -> bool:
        """Give every decoding sequence the block its next token needs, preempting
        the most recently admitted sequences when memory runs out."""
        eng = self.engine
        batch = eng.batch
        if batch.count == 0:
            return False
        kv = eng.kv
        for s in batch.needing_block(batch.steps + 1):
            while kv.free == 0:
                if eng.cache is not None and eng.cache.evictable_blocks:
                    eng.cache.evict(1, hold=False)  # the step cannot wait for a writer
                    continue
                self._preempt(self._victim())
                if s.state != DECODE:
                    break
            if s.state != DECODE:
                continue
            kv.allocate(1)
            s.blocks += 1
        return batch.count > 0

    def _victim(self) -> Sequence:
        """The decoding request to preempt: of the lowest class of traffic
        among them (the largest priority), then the queue policy's choice
        among those, else the most recently admitted."""
        eng = self.engine
        lane = eng.lane
        first = next(iter(eng.running.values()), None)
        classes = first is not None and first.req.traffic_class != ""
        if self._pick_victim is not None or classes:
            running = [s for s in eng.running.values() if s.state == DECODE and s.lane == lane]
            if not running:
                raise AssertionError("no decoding sequence to preempt")
            if classes:
                lowest = max(s.req.priority for s in running)
                running = [s for s in running if s.req.priority == lowest]
            if self._pick_victim is None:
                return running[-1]
            victim = self._pick_victim(running)
            if not any(s is victim for s in running):
                raise SpecError(
                    f"queue policy {eng.queue_policy!r}: victim() returned {victim!r}, "
                    "not one of the running requests it was given"
                )
            return victim  # type: ignore[return-value]  # one of ours, just checked
        for s in reversed(eng.running.values()):
            if s.state == DECODE and s.lane == lane:
                return s
        raise AssertionError("no decoding sequence to preempt")

    def _preempt(self, s: Sequence) -> None:
        """Free ``s``'s blocks and queue it for recomputation, at the front
        (of the requests its queue policy ranks equal)."""
        eng = self.engine
        eng.batch.leave(s)
        del eng.running[s.req.id]
        holding.drop(eng.kv, eng.cache, s)
        s.epoch += 1
        s.state = WAITING
        s.preemptions += 1
        eng.preemptions += 1
        self.preempted = True
        s.prefill_len = s.req.prompt_tokens + s.generated
        s.prefilled = 0
        eng.queue_changes += 1
        eng.waiting.appendleft(s)
        eng.waiting_moved(s.prefill_len)
        eng.observer.preempted(eng.env.now, eng.id, s.req)
