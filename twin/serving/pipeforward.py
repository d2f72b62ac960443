"""Fast-forward for pipelined instances: one event for a stretch of micro-batches.

An instance of ``pp`` stages keeps up to ``pp`` micro-batches in flight, one per
lane (see :mod:`twin.serving.engine`). While nothing changes (no arrival, no KV
landing, no sequence finishing, every block the steps need free) each lane
decodes a fixed batch, and the lanes take the first stage in the order they
left the last one, each once its previous micro-batch is out and the stage is
free: the order repeats, and every micro-batch's start and end follow from the
stage times by the recurrence stepping runs (start = max(out, first stage
free); each stage taken in turn). :class:`PipeForward` runs that recurrence for
every lane at once, with each lane's stage times priced in one call
(:func:`twin.perf.iteration.stage_steps`), up to the first micro-batch in which a
sequence finishes (or a cap), and takes in the micro-batches that start before
that one ends. The lanes wait for its end on one event. The steps that ended
are then applied in bulk (blocks, inter-token gaps, counters), in the order
stepping applies them; each lane's last micro-batch, still in flight, is
completed by the lane as stepping completes it. A change from outside ends the
stretch at that instant: the micro-batches begun by then stay, and the lanes
plan the next ones as stepping does.

Results are bit-identical to stepping (``tests/test_pipeforward.py``). A
stretch is not made where the order of same-instant events would decide it
(a lane out of the pipeline at the very instant the first stage frees for the
lane before it, a micro-batch starting at the instant the stretch ends, a
later stage of zero time): stepping, whose event order decides such ties, runs
those micro-batches.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from functools import reduce
from operator import add, sub
from typing import TYPE_CHECKING

import simpy

from twin._clock import arm, at, cancel
from twin.serving.fastforward import push_gaps, take_blocks
from twin.serving.kvcache import blocks_for
from twin.serving.sequence import DECODE

if TYPE_CHECKING:
    from twin.serving.engine import Engine

# Micro-batches one stretch covers at most; after a cut, at most this many or
# four times the cut one's (pricing is cheap next to an event, and a stretch
# that ends short of its next finish costs a few more events).
MAX_MICRO_BATCHES = 4096
CUT_MICRO_BATCHES = 128


class PipeStretch:
    """Micro-batches covered by one event. Micro-batch ``j`` is lane
    ``order[j % len(order)]``'s, its ``j // len(order)``-th of the stretch, the
    step ``step0[p] + j // len(order)`` of its lane at position ``p``; it takes
    the first stage at ``starts[j]`` for ``firsts[j]`` seconds and leaves the
    last at ``ends[j]``; ``frees[j]`` is when each stage is done with it.
    ``begun`` (blocks taken) and ``ended`` (applied) count micro-batches so far,
    ``taken[p]`` the last step whose blocks position ``p``'s lane holds.
    ``event`` fires at the end of the micro-batch that ends the stretch (no
    lane waits on it: it settles the stretch); each lane waits on its own
    ``wake`` event, scheduled when the stretch is settled: at its micro-batch
    still in flight's end (``resume`` gives that end and its first-stage time),
    or, for a lane out and waiting, when the first stage frees, in the order
    the lanes came out (as they would have queued for it stepping)."""

    __slots__ = ("order", "lanes", "step0", "starts", "ends", "firsts", "frees",
                 "taken", "ended", "event", "wake", "resume", "settled")  # fmt: skip

    def __init__(
        self,
        order: list[int],
        step0: list[int],
        starts: list[float],
        ends: list[float],
        firsts: list[float],
        frees: list[list[float]],
    ) -> None:
        self.order = order
        self.lanes = frozenset(order)
        self.step0 = step0
        self.starts = starts
        self.ends = ends
        self.firsts = firsts
        self.frees = frees
        self.taken = [s - 1 for s in step0]
        self.taken[0] = step0[0]  # the first micro-batch was planned: its blocks are held
        self.ended = 0
        self.event: simpy.Event | None = None
        self.wake: dict[int, simpy.Event] = {}
        self.resume: dict[int, tuple[float, float]] = {}
        self.settled = False


def _next_finish(heap: list) -> int | None:
    """The step of the next valid entry of a lane's finish heap (stale ones dropped)."""
    while heap and (heap[0][2] != heap[0][3].epoch or heap[0][3].state != DECODE):
        heapq.heappop(heap)
    return heap[0][0] if heap else None


class PipeForward:
    """The fast-forward of one pipelined engine: the stretch in progress, if
    any, and the micro-batches the next stretch aims at."""

    __slots__ = ("engine", "stretch", "cap")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.stretch: PipeStretch | None = None
        self.cap = MAX_MICRO_BATCHES

    # -- what the engine's readers and changes call ----------------------------------
    def interrupt(self) -> None:
        """A change from outside: end the stretch now. The micro-batches begun
        by now stay (those in flight are completed by their lanes); the lanes
        plan the rest as stepping does."""
        st = self.stretch
        if st is None:
            return
        env = self.engine.env
        self._settle(st, env.now)
        assert st.event is not None
        cancel(env, st.event)

    def sync(self) -> None:
        """Bring the engine up to now inside a stretch (what stepping would show)."""
        st = self.stretch
        if st is not None:
            now = self.engine.env.now
            self._take(st, max(1, bisect_left(st.starts, now)))
            self._end(st, bisect_left(st.ends, now))

    def sync_blocks(self) -> None:
        """Take the blocks of the micro-batches begun by now, for a reader of the
        free blocks only."""
        st = self.stretch
        if st is not None:
            self._take(st, max(1, bisect_left(st.starts, self.engine.env.now)))

    def wait(self, st: PipeStretch, lane: int) -> simpy.Event:
        """The event ``lane`` waits on inside ``st`` (see :class:`PipeStretch`)."""
        ev = st.wake[lane] = self.engine.env.event()
        return ev

    def _ended(self, st: PipeStretch) -> None:
        if self.stretch is st:
            self._settle(st, self.engine.env.now)

    # -- making a stretch ------------------------------------------------------------
    def plan(self, leader: int) -> bool:
        """Cover the decode-only micro-batch lane ``leader`` has just planned, and
        the micro-batches of every lane after it, with a stretch, when nothing
        can change in them: no prompt to prefill or admit, every other lane
        decoding (or idle), none finishing in a micro-batch already in flight,
        and every block the steps take free. True when a stretch was made."""
        eng = self.engine
        if eng._preempted or eng.kv.watch is not None or eng.prefilling or eng._landed:
            return False
        if eng.waiting and not self._nothing_admits():
            return False
        now = eng.env.now
        # position 0: the leader, whose micro-batch starts now
        fin = _next_finish(eng._finish_heap)
        if fin is None:
            return False
        lanes = [(0, leader, now, eng.steps + 1, eng.decode_count, eng.decode_ctx_sum, fin)]
        flight = eng._flight
        for lane in range(eng.pp):
            if lane == leader:
                continue
            count, ctx, steps, finish_heap, _, first_gap = eng._lanes[lane][:6]
            fl = flight[lane]
            if count == 0:
                if fl is not None:
                    return False  # prompts only in flight: the batch changes
                continue  # idle: it waits for a change, which ends the stretch
            if fl is None:  # out, waiting for the first stage
                if any(s.landed and s.t_decode_start < 0 for s in first_gap):
                    return False
                out_at, step0 = now, steps + 1
            else:
                end, _, prompts = fl
                if prompts:
                    return False
                out_at, step0, ctx = end, steps + 2, ctx + count
            fin = _next_finish(finish_heap)
            if fin is None:
                return False
            lanes.append((eng._claim_no[lane], lane, out_at, step0, count, ctx, fin))
        lanes[1:] = sorted(lanes[1:])  # the order they took the first stage last
        order = [x[1] for x in lanes]
        ready = [x[2] for x in lanes]
        step0 = [x[3] for x in lanes]
        last = [x[6] - x[3] for x in lanes]  # each lane's finishing micro-batch, from 0
        if min(last) < 1 or any(b < a for a, b in zip(ready[1:], ready[2:], strict=False)):
            return False
        n_lanes = len(order)
        rounds = max(2, self.cap // n_lanes)
        stop = [min(x, rounds) for x in last]
        need = min(stop) + 2  # micro-batches any lane can have before the end is out
        price = eng.stage_steps
        assert price is not None
        priced = [price(x[4], x[5], min(x[6] - x[3] + 1, need)) for x in lanes]
        times = self._schedule(now, ready, priced, stop)
        if times is None:
            return False
        starts, ends, firsts, frees = times
        if not self._blocks_free(order, step0, len(starts)):
            return False
        st = PipeStretch(order, step0, starts, ends, firsts, frees)
        st.event = at(eng.env, ends[self._stop_index(stop, n_lanes)], lambda _: self._ended(st))
        self.stretch = st
        return True

    @staticmethod
    def _stop_index(stop: list[int], n_lanes: int) -> int:
        """The micro-batch that ends the stretch: the first whose lane stops there."""
        return min(s * n_lanes + p for p, s in enumerate(stop))

    def _schedule(
        self,
        now: float,
        ready: list[float],
        priced: list[tuple[list[float], list[float]]],
        stop: list[int],
    ) -> tuple[list[float], list[float], list[float], list[list[float]]] | None:
        """Run stepping's recurrence over the lanes in turn: the starts, ends,
        first-stage times and (past two stages) stage frees of the stretch's
        micro-batches, or None where a tie (see the module) or a non-positive
        stage time leaves them to stepping."""
        if not all(min(a) > 0.0 and min(b) > 0.0 for a, b in priced):
            return None
        free = list(self.engine._stage_free)
        stages = range(1, len(free))
        keep_frees = len(free) > 2  # two stages: the frees are the start + first and the end
        n_lanes = len(ready)
        ready = list(ready)
        firsts_of = [a for a, _ in priced]
        laters_of = [b for _, b in priced]
        starts: list[float] = []
        ends: list[float] = []
        firsts: list[float] = []
        frees: list[list[float]] = []
        end_at = self._stop_index(stop, n_lanes)
        last = end_at + n_lanes  # the stretch's last lane starts again after its end
        stretch_end = float("inf")
        j = p = i = 0
        s = now
        while True:
            a_list = firsts_of[p]
            if i >= len(a_list):
                return None  # not priced this far (cannot happen: see plan)
            a = a_list[i]
            b = laters_of[p][i]
            t = s + a
            free[0] = t
            for k in stages:  # each stage takes the micro-batches in order
                t = (t if t > free[k] else free[k]) + b
                free[k] = t
            starts.append(s)
            ends.append(t)
            firsts.append(a)
            if keep_frees:
                frees.append(list(free))
            ready[p] = t
            if j == end_at:
                stretch_end = t
            j += 1
            if j == last:
                break
            p += 1
            if p == n_lanes:
                p = 0
                i += 1
            r = ready[p]
            f0 = free[0]
            if r >= f0:
                s = r
            else:
                s = f0  # it waits for the first stage
                q = p + 1 if p + 1 < n_lanes else 0
                if q != p and ready[q] == f0:
                    return None  # the next lane out at that very instant
            if j > end_at:
                if s > stretch_end:
                    break
                if s == stretch_end:
                    return None
        return starts, ends, firsts, frees

    def _nothing_admits(self) -> bool:
        """Whether no lane can admit the head of the queue before a change: the
        running limit is reached, or (no prefix cache) its blocks are not free,
        and the stretch only takes more."""
        eng = self.engine
        if eng.running_requests >= eng.config.max_num_seqs * eng.pp:
            return True
        if eng.cache is not None:
            return False
        kv = eng.kv
        return not kv.can_admit(blocks_for(eng.waiting[0].prefill_len, kv.block_size))

    def _blocks_free(self, order: list[int], step0: list[int], n: int) -> bool:
        """Whether every block the stretch's ``n`` micro-batches take is free (so
        no preemption can happen in it)."""
        eng = self.engine
        kv = eng.kv
        bs = kv.block_size
        n_lanes = len(order)
        lasts = {}
        bound = 0
        for p, lane in enumerate(order):
            k = (n - 1 - p) // n_lanes + 1  # this lane's micro-batches
            lasts[lane] = step0[p] + k - 1
            count = eng.decode_count if lane == eng._lane else eng._lanes[lane][0]
            bound += count * (k // bs + 1)
        if bound <= kv.free:
            return True
        need = 0
        for s in eng.running.values():
            if s.state == DECODE:
                need += max(0, blocks_for(s.length_at(lasts[s.lane]), bs) - s.held_blocks)
        return need <= kv.free

    # -- applying it -----------------------------------------------------------------
    def _take(self, st: PipeStretch, begun: int) -> None:
        """Take the blocks of the first ``begun`` micro-batches."""
        eng = self.engine
        n_lanes = len(st.order)
        lane0 = eng._lane
        for p, lane in enumerate(st.order):
            if p >= begun:
                break
            step = st.step0[p] + (begun - 1 - p) // n_lanes
            if step > st.taken[p]:
                eng._use_lane(lane)
                take_blocks(eng, step)
                st.taken[p] = step
        eng._use_lane(lane0)

    def _end(self, st: PipeStretch, end_to: int) -> None:
        """Apply the micro-batches before ``end_to`` that have not been, in bulk:
        the counters in the order they ended, each lane's steps and gaps in its
        own order (nothing in them finishes or fails)."""
        k0 = st.ended
        if end_to <= k0:
            return
        eng = self.engine
        eng.busy_s = reduce(add, st.firsts[k0:end_to], eng.busy_s)  # in the order they end
        eng.iterations += end_to - k0
        n_lanes = len(st.order)
        ends = st.ends
        lane0 = eng._lane
        for p, lane in enumerate(st.order):
            j = k0 + (p - k0) % n_lanes  # this lane's first micro-batch not applied
            if j >= end_to:
                continue
            out = ends[j:end_to:n_lanes]
            eng._use_lane(lane)
            if j < n_lanes and (eng._first_gap or eng._last_decode_end < 0.0):
                # its first step as stepping completes it (sequences that joined
                # measure their first gap in it)
                eng._complete_decode_step(out[0])
                del out[0]
                if not out:
                    continue
            gaps = [out[0] - eng._last_decode_end]
            gaps += map(sub, out[1:], out[:-1])
            n = len(out)
            push_gaps(eng, eng.steps + 1, gaps)
            eng.steps += n
            eng.decode_ctx_sum += eng.decode_count * n
            eng._last_decode_end = out[-1]
            if len(eng._gap_steps) > 4096:
                eng._prune_gaps(eng.steps)
        eng._use_lane(lane0)
        st.ended = end_to

    def _settle(self, st: PipeStretch, now: float) -> None:
        """End ``st`` at ``now``: apply what has ended, take the blocks of what
        has begun, leave the stages as its last begun micro-batch left them, and
        wake each lane waiting (see :class:`PipeStretch`)."""
        eng = self.engine
        begun = max(1, bisect_left(st.starts, now))
        self._take(st, begun)
        self._end(st, bisect_left(st.ends, now))
        j = begun - 1
        eng._stage_free[:] = st.frees[j] if st.frees else (st.starts[j] + st.firsts[j], st.ends[j])
        n_lanes = len(st.order)
        lasts = []
        for p, lane in enumerate(st.order[:begun]):
            j = p + (begun - 1 - p) // n_lanes * n_lanes  # its last begun micro-batch
            lasts.append((j, lane))
            if j >= st.ended:  # still in flight
                st.resume[lane] = (st.ends[j], st.firsts[j])
                eng._flight[lane] = (st.ends[j], st.firsts[j], False)
        for _, lane in sorted(lasts):  # the order they took the first stage
            eng._claims += 1
            eng._claim_no[lane] = eng._claims
        env = eng.env
        out = sorted((eng._claim_no[lane], lane) for lane in st.wake if lane not in st.resume)
        free0 = eng._stage_free[0]
        for _, lane in out:  # out and waiting for the first stage, in the order they came out
            arm(env, st.wake[lane], free0 if free0 > now else now)
        for lane, (end, _) in st.resume.items():
            if lane in st.wake:
                arm(env, st.wake[lane], end)
        st.settled = True
        self.stretch = None
        if begun < len(st.starts):
            self.cap = max(CUT_MICRO_BATCHES, 4 * begun)
        else:
            self.cap = min(MAX_MICRO_BATCHES, 2 * self.cap)
