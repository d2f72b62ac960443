"""The decode batch of one engine (of one pipeline lane): the only owner of its state.

Per-step work does not grow with the batch: the decoding sequences are kept
as aggregates (their count and the sum of their context lengths at the next
step), and per-sequence events (a block needed, the last token) sit in heaps
keyed by the decode step at which they happen. A step touches only the
sequences that finish or need a block in it. Each sequence's largest
inter-token gap comes from a monotone stack of the steps' gaps, folded into
the sequence when it leaves. The engine steps the batch one step at a time
(:meth:`DecodeBatch.step`); a fast-forward applies a stretch of steps in which
nothing changes in one call (:meth:`DecodeBatch.run_steps`), with the same
results. Decoding speculatively (:mod:`twin.serving.speculative`), each
step verifies drafted tokens and emits one or more tokens per sequence, drawn
when it joins the batch; what it adds to the context sum at each step to come
is kept per step.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Sequence_

from twin.serving.kvcache import blocks_for
from twin.serving.sequence import DECODE, Sequence
from twin.serving.speculative import Speculation, blocks_step

# The gap stack is cut back to the running sequences' steps past this length.
MAX_GAPS = 4096


class DecodeBatch:
    """The sequences of one lane that decode, one token each per step.

    ``count`` and ``ctx_sum`` are the batch's size and the sum of its
    sequences' lengths at the next step (what the perf model prices),
    ``steps`` the steps completed, ``last_end`` when the last one ended (-1:
    none yet) and ``joined`` the sequences that joined since the last step
    (their first gap is measured in the next); ``spec`` is the instance's
    speculative decoding, if any."""

    __slots__ = ("lane", "block_size", "spec", "count", "ctx_sum", "steps", "last_end", "joined",
                 "_finish", "_alloc", "_gap_steps", "_gap_vals", "_spec_delta")  # fmt: skip

    def __init__(self, block_size: int, lane: int = 0, spec: Speculation | None = None) -> None:
        self.lane = lane
        self.block_size = block_size
        self.spec = spec
        self.count = 0
        self.ctx_sum = 0  # sum of length_at(next step) over the decoding sequences
        self.steps = 0
        self.last_end = -1.0
        self.joined: list[Sequence] = []
        # (step, request id, epoch, sequence): an entry whose epoch is not the
        # sequence's, or whose sequence no longer decodes, is stale
        self._finish: list[tuple[int, int, int, Sequence]] = []  # its last token
        self._alloc: list[tuple[int, int, int, Sequence]] = []  # its next block
        self._gap_steps: list[int] = []  # monotone stack: step numbers, increasing
        self._gap_vals: list[float] = []  # ... their gaps, decreasing
        # speculative: what the batch adds to ctx_sum at each step to come
        self._spec_delta: dict[int, int] = {}

    # -- membership ------------------------------------------------------------------
    def join(self, s: Sequence) -> None:
        """``s`` decodes from the next step."""
        step = self.steps + 1
        s.state = DECODE
        s.lane = self.lane
        s.d_join = step
        s.g_join = s.generated
        self.count += 1
        self.ctx_sum += s.length_at(step)
        self.joined.append(s)
        if self.spec is not None:
            self._schedule(s, step)
            return
        rid = s.req.id
        finish_at = step + s.req.output_tokens - s.generated - 1
        heapq.heappush(self._finish, (finish_at, rid, s.epoch, s))
        need_at = step + max(0, s.held_blocks * self.block_size + 1 - s.length_at(step))
        heapq.heappush(self._alloc, (need_at, rid, s.epoch, s))

    def settle(self, s: Sequence) -> None:
        """Bring ``s``'s tokens and largest gap up to the last step that ended."""
        self._close_gaps(s)
        s.generated = s.g_join + s.decoded(self.steps + 1 - s.d_join)

    def leave(self, s: Sequence) -> None:
        """``s`` stops decoding before the next step (it is preempted, or given up)."""
        step = self.steps + 1
        self.settle(s)
        self.count -= 1
        self.ctx_sum -= s.length_at(step)
        if s.emit is not None:
            self._unschedule(s, step)

    def members(self) -> Iterator[Sequence]:
        """The sequences decoding (in no particular order)."""
        for _, _, epoch, s in self._finish:
            if epoch == s.epoch and s.state == DECODE:
                yield s

    # -- what the steps ahead bring ----------------------------------------------------
    def next_finish(self) -> int | None:
        """The step in which the next sequence finishes (None: none decodes)."""
        heap = self._finish
        while heap and (heap[0][2] != heap[0][3].epoch or heap[0][3].state != DECODE):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def needing_block(self, step: int) -> Iterator[Sequence]:
        """The sequences whose token in ``step`` needs a block more; the caller
        gives each its block, or takes it out of the batch, before the next."""
        heap = self._alloc
        bs = self.block_size
        while heap and heap[0][0] <= step:
            _, rid, epoch, s = heapq.heappop(heap)
            if epoch != s.epoch or s.state != DECODE:
                continue
            yield s
            if s.state != DECODE:
                continue
            # it got its block: the next is due a block later (speculative: the
            # step may emit more tokens than a block holds)
            need_at = (
                step + bs
                if s.emit is None
                else blocks_step(s.emit, step, s.d_join, s.prefill_len, s.held_blocks * bs)
            )
            heapq.heappush(heap, (need_at, rid, s.epoch, s))

    def take_blocks(self, last: int) -> int:
        """Give each sequence every block its steps up to ``last`` need, at once
        (all known to be free); the number taken."""
        heap = self._alloc
        bs = self.block_size
        taken = 0
        while heap and heap[0][0] <= last:
            need_at, rid, epoch, s = heap[0]
            if epoch != s.epoch or s.state != DECODE:
                heapq.heappop(heap)
                continue
            k = (last - need_at) // bs + 1
            s.blocks += k
            taken += k
            heapq.heapreplace(heap, (need_at + k * bs, rid, epoch, s))
        return taken

    def blocks_to(self, last: int) -> int:
        """Blocks the sequences decoding take up to step ``last``, beyond those they hold."""
        bs = self.block_size
        held = (blocks_for(s.length_at(last), bs) - s.held_blocks for s in self.members())
        return sum(max(0, n) for n in held)

    def blocks_needed(self, first: int, last: int, joining: Sequence_[Sequence], free: int) -> int:
        """Blocks the steps ``first`` to ``last`` take: of the decoding sequences,
        and of ``joining``, which join at ``first``. Each takes at most one block
        per block_size steps; counted exactly only when that bound is more than
        ``free``."""
        bs = self.block_size
        need = (self.count + len(joining)) * ((last - first) // bs + 1)
        if need <= free:
            return need
        return self.blocks_to(last) + sum(joiner_need(s, last - first, bs) for s in joining)

    # -- steps ending ----------------------------------------------------------------
    @property
    def fresh(self) -> bool:
        """Whether the next step must end on its own (:meth:`step`): sequences
        that joined measure their first gap in it, or no step has ended yet."""
        return bool(self.joined) or self.last_end < 0.0

    def step(self, now: float, finish: Callable[[Sequence, float], None]) -> None:
        """The next step ended at ``now``: each sequence that finishes in it is
        handed to ``finish``, out of the batch."""
        self.steps += 1
        step = self.steps
        if self.last_end >= 0.0:
            self._push_gap(step, now - self.last_end)
        self.last_end = now
        for s in self.joined:
            if s.state == DECODE and s.d_join == step:
                s.mark("t_first_decode", now)
                gap = now - s.t_last_token
                if s.landed:
                    first_after_landing(s, now)
                elif gap > s.max_gap:
                    s.max_gap = gap
        self.joined.clear()
        if self.spec is None:
            self.ctx_sum += self.count
        else:
            self.ctx_sum += self._spec_delta.pop(step, 0)
        heap = self._finish
        while heap and heap[0][0] <= step:
            _, _, epoch, s = heapq.heappop(heap)
            if epoch != s.epoch or s.state != DECODE:
                continue
            self._close_gaps(s)
            self.count -= 1
            self.ctx_sum -= s.length_at(step + 1)
            s.generated = s.req.output_tokens
            finish(s, now)

    def run_steps(self, gaps: list[float], last_end: float) -> None:
        """Steps with these ``gaps`` (the first since :attr:`last_end`) ended,
        the last at ``last_end``; nothing joined, finished or ran short in them."""
        n = len(gaps)
        self._push_gaps(self.steps + 1, gaps)
        self.steps += n
        self.ctx_sum += self.count * n
        self.last_end = last_end
        if len(self._gap_steps) > MAX_GAPS:
            self._prune_gaps(self.steps)

    # -- speculative decoding --------------------------------------------------------
    def _schedule(self, s: Sequence, step: int) -> None:
        """``s`` joins at ``step`` on a speculative instance: its tokens per step
        are drawn now, which fixes its last step, the steps at which it needs a
        block, and what it adds to the context sum at each step."""
        assert self.spec is not None
        emit = self.spec.schedule(s.req.id, s.generated, s.req.output_tokens - s.generated)
        s.emit = emit
        delta = self._spec_delta
        for j in range(1, len(emit)):
            at_step = step + j - 1
            delta[at_step] = delta.get(at_step, 0) + emit[j] - emit[j - 1]
        rid = s.req.id
        heapq.heappush(self._finish, (step + len(emit) - 2, rid, s.epoch, s))
        tokens = s.held_blocks * self.block_size
        need_at = blocks_step(emit, step, step, s.prefill_len, tokens)
        heapq.heappush(self._alloc, (need_at, rid, s.epoch, s))

    def _unschedule(self, s: Sequence, step: int) -> None:
        """``s`` leaves before ``step`` runs: take back what it would have added
        to the context sum from ``step`` on."""
        emit = s.emit
        assert emit is not None
        delta = self._spec_delta
        for j in range(step - s.d_join + 1, len(emit)):
            at_step = s.d_join + j - 1
            left = delta[at_step] - (emit[j] - emit[j - 1])
            if left:
                delta[at_step] = left
            else:
                del delta[at_step]
        s.emit = None

    # -- inter-token gaps ------------------------------------------------------------
    def largest_gaps(self) -> list[float]:
        """The gaps still on the stack, decreasing (what a leaver may take)."""
        return list(self._gap_vals)

    def _push_gap(self, step: int, gap: float) -> None:
        steps, vals = self._gap_steps, self._gap_vals
        while vals and vals[-1] <= gap:
            vals.pop()
            steps.pop()
        steps.append(step)
        vals.append(gap)
        if len(steps) > MAX_GAPS:
            self._prune_gaps(step)

    def _push_gaps(self, step: int, gaps: list[float]) -> None:
        """Push the gaps of steps ``step, step + 1, ...``, leaving the stack as
        pushing them one by one would: what stays of them is the last largest,
        then the last largest of those after it, and so on."""
        steps, vals = self._gap_steps, self._gap_vals
        top = max(gaps)
        while vals and vals[-1] <= top:
            vals.pop()
            steps.pop()
        n = len(gaps)
        if gaps[-1] == top:  # the last is the largest: it is all that stays
            steps.append(step + n - 1)
            vals.append(top)
            return
        lo = 0
        for _ in range(8):  # in a stretch gaps mostly grow: one or two rounds
            rest = gaps[lo:]
            top = max(rest)
            lo += len(rest) - rest[::-1].index(top)  # past the last occurrence
            steps.append(step + lo - 1)
            vals.append(top)
            if lo == n:
                return
        for k in range(lo, n):  # falling gaps: one at a time
            gap = gaps[k]
            while vals and vals[-1] <= gap:
                vals.pop()
                steps.pop()
            steps.append(step + k)
            vals.append(gap)

    def _prune_gaps(self, step: int) -> None:
        """Drop gaps from before every decoding sequence's first step."""
        oldest = min((s.d_join for s in self.members()), default=step)
        cut = bisect_left(self._gap_steps, oldest + 1)
        del self._gap_steps[:cut]
        del self._gap_vals[:cut]

    def _close_gaps(self, s: Sequence) -> None:
        """Fold the largest gap between two of ``s``'s steps into ``s.max_gap``."""
        i = bisect_left(self._gap_steps, s.d_join + 1)
        if i < len(self._gap_vals) and self._gap_vals[i] > s.max_gap:
            s.max_gap = self._gap_vals[i]
        if self.steps >= s.d_join:
            s.t_last_token = self.last_end


def joiner_need(s: Sequence, steps: int, block_size: int) -> int:
    """Blocks ``s``, joining a batch, takes in its first ``steps + 1`` decode
    steps, beyond those it holds (its length in the first is ``prefill_len + 1``)."""
    return max(0, blocks_for(s.prefill_len + 1 + steps, block_size) - s.held_blocks)


def first_after_landing(s: Sequence, now: float) -> None:
    """The first token produced after ``s``'s KV landed (token 2, or a
    recompute's). The gap since token 1 spans the hand-off and the gap since
    this side took it up does not; which one the client sees as an
    inter-token gap depends on where TTFT ends (the metrics decide)."""
    s.landed = False
    # the largest over its landings (a retry may move it again)
    s.landing_gap = max(s.landing_gap, now - s.t_last_token)
    s.decode_gap = max(s.decode_gap, now - (s.t_decode_start if s.t_decode_start >= 0 else now))
