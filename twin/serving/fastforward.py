"""Fast-forward: one event for a stretch of decode steps in which nothing can change.

Between two events that change an engine's decode batch (an arrival, a KV
landing, a sequence finishing, a block running short) every decode step is
known in advance: the batch grows one token per sequence per step and the perf
model prices each step. :class:`FastForward` prices such a stretch in one call
(:func:`twin.perf.iteration.decode_steps`), waits for its end with one event,
and applies the steps in bulk (block allocations, inter-token gaps, counters)
exactly as stepping would; a change from outside cuts the stretch at the step
in progress. The results are bit-identical to stepping (``tests/test_engine.py``
holds the two side by side).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from functools import reduce
from itertools import accumulate
from operator import add, sub
from typing import TYPE_CHECKING

import simpy

from twin._clock import at
from twin.perf.iteration import Batch
from twin.serving.kvcache import blocks_for
from twin.serving.sequence import DECODE

if TYPE_CHECKING:
    from twin.serving.engine import Engine

MIN_STRETCH = 3  # steps; shorter stretches are stepped
MAX_STRETCH = 4096


class Stretch:
    """Decode steps covered by one event: step ``i`` runs ``dts[i]`` seconds and
    ends at ``ends[i]`` (it starts at the previous end, the first when the
    stretch is made). ``begun`` and ``ended`` count the steps applied so far;
    the first is planned (begun) before the stretch is made."""

    __slots__ = ("dts", "ends", "begun", "ended")

    def __init__(self, dts: list[float], ends: list[float]) -> None:
        self.dts = dts
        self.ends = ends
        self.begun = 1
        self.ended = 0


class FastForward:
    """The fast-forward of one engine: the stretch in progress, if any, the event
    that cuts it short, and the length the next stretch aims at."""

    __slots__ = ("engine", "stretch", "cap", "cut")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.stretch: Stretch | None = None
        self.cap = MAX_STRETCH
        self.cut: simpy.Event = engine.env.event()

    def interrupt(self) -> None:
        """A change from outside: end the stretch at the step in progress."""
        if self.stretch is not None:
            self.advance(self.engine.env.now, inclusive=False)
            if not self.cut.triggered:
                self.cut.succeed()

    def sync(self) -> None:
        """Bring the engine up to now inside a stretch, so that a reader sees
        what stepping would show at this instant."""
        if self.stretch is not None:
            self.advance(self.engine.env.now, inclusive=False)

    def plan(self, dt: float, batch: Batch) -> Stretch | None:
        """A stretch of the decode steps from the one just planned up to, not
        including, the next step in which a sequence finishes, when every block
        those steps need is free (so no preemption can happen) and it is long
        enough to be worth it. Arrivals, the only other change, cut it short."""
        eng = self.engine
        if eng._preempted:
            return None  # the preempted may be admitted again at the next step
        heap = eng._finish_heap
        while heap and (heap[0][2] != heap[0][3].epoch or heap[0][3].state != DECODE):
            heapq.heappop(heap)
        if not heap:
            return None
        first = eng.steps + 1
        last = min(heap[0][0] - 1, first + self.cap - 1)
        if last - first < MIN_STRETCH - 1:
            return None
        bs = eng.kv.block_size
        # Each sequence takes at most one block per block_size steps; count
        # exactly only when that bound does not fit.
        if eng.decode_count * ((last - first) // bs + 1) > eng.kv.free:
            need = 0
            for s in eng.running.values():
                if s.state == DECODE:
                    need += max(0, blocks_for(s.length_at(last), bs) - s.held_blocks)
            if need > eng.kv.free:
                return None
        count = batch.decode_count
        later = eng.decode_steps(count, batch.decode_context_sum + count, last - first)
        # the same float sums stepping makes: now + dt, then one step at a time
        ends = list(accumulate(later, initial=eng.env.now + dt))
        later.insert(0, dt)
        return Stretch(later, ends)

    def run(self, st: Stretch):  # noqa: ANN201 - part of the engine's serve process
        eng = self.engine
        env = eng.env
        self.stretch = st
        self.cut = env.event()
        yield env.any_of([at(env, st.ends[-1]), self.cut])
        if eng._ff is not self:
            return  # the engine failed: its state was reset
        if env.now < st.ends[-1]:
            # An arrival: run on to the end of the step in progress, then replan.
            yield at(env, st.ends[bisect_left(st.ends, env.now)])
            if eng._ff is not self:
                return
        self.advance(env.now, inclusive=True)
        # Steps computed past an arrival are wasted: aim the next stretch at
        # about twice the length arrivals have been leaving (only speed depends
        # on this, never a result).
        if st.ended < len(st.ends):
            self.cap = max(2 * MIN_STRETCH, st.ended + st.ended // 2 + 2)
        else:
            self.cap = min(MAX_STRETCH, 2 * self.cap)
        self.stretch = None

    def advance(self, now: float, *, inclusive: bool) -> None:
        """Apply the stretch's steps that stepping would have applied by ``now``:
        a step begins (takes its blocks) at its start and ends (tokens out) at
        its end. Events at ``now`` itself are applied only when ``inclusive``
        (same-time arrivals see the state before them, as when stepping).

        Steps are applied in bulk: nothing in a stretch can fail or finish, so
        only the totals, and the gaps in the order stepping pushes them, matter.
        """
        eng = self.engine
        st = self.stretch
        assert st is not None
        ends = st.ends
        begin_to = min(len(ends), bisect_left(ends, now) + 1)
        if begin_to > st.begun:
            self._allocate_through(eng.steps + 1 + (begin_to - 1 - st.ended))
            st.begun = begin_to
        end_to = bisect_right(ends, now) if inclusive else bisect_left(ends, now)
        if end_to <= st.ended:
            return
        if st.ended == 0:
            eng.iterations += 1
            eng.busy_s += st.dts[0]
            eng._complete_decode_step(ends[0])
            st.ended = 1
        k0 = st.ended
        if end_to <= k0:
            return
        n = end_to - k0
        step = eng.steps
        self._push_gaps(step + 1, list(map(sub, ends[k0:end_to], ends[k0 - 1 : end_to - 1])))
        step += n
        eng.busy_s = reduce(add, st.dts[k0:end_to], eng.busy_s)  # one step at a time
        eng.iterations += n
        eng.steps = step
        eng.decode_ctx_sum += eng.decode_count * n
        eng._last_decode_end = ends[end_to - 1]
        st.ended = end_to
        if len(eng._gap_steps) > 4096:
            eng._prune_gaps(step)

    def _push_gaps(self, step: int, gaps: list[float]) -> None:
        """Push the gaps of steps ``step, step + 1, ...`` onto the engine's monotone
        stack, leaving it as pushing them one by one would: what stays of them is
        the last largest, then the last largest of those after it, and so on."""
        eng = self.engine
        steps, vals = eng._gap_steps, eng._gap_vals
        top = max(gaps)
        while vals and vals[-1] <= top:
            vals.pop()
            steps.pop()
        lo, n = 0, len(gaps)
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

    def _allocate_through(self, last: int) -> None:
        """The blocks decode steps up to ``last`` take, all known to be free: each
        sequence due takes every block it needs by then at once."""
        eng = self.engine
        heap = eng._alloc_heap
        bs = eng.kv.block_size
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
        if taken:
            eng.kv.allocate(taken)
