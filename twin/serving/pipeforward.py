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
that one ends; it is made ahead a part at a time, one event for each part. When
the stretch ends, the steps that ended are applied in bulk (blocks,
inter-token gaps, counters), in the order stepping applies them, and each lane
waits on an event of its own: a lane with a micro-batch still in flight
completes it at its end as stepping does, a lane out of the pipeline queues for
the first stage. A change from outside ends the stretch at that instant: the
micro-batches begun by then stay, and the lanes plan the next ones as stepping
does (a KV hand-off reserving blocks that are free past what the stretch takes
changes none of it, and leaves it going: :meth:`PipeForward.keeps`). The
steps take their blocks with no event, so under a sleeping tick that watches
the free blocks (:mod:`twin.sim.control`) a stretch keeps short of the watched
threshold, and stepping crosses it.

Results are bit-identical to stepping (``tests/test_pipeforward.py``), for
readers and changes at :data:`~twin._clock.ARRIVAL` priority at any instant. A
stretch is not made where the order of same-instant events would decide it
(a lane out of the pipeline at the very instant the first stage frees for the
lane whose turn it is, a micro-batch starting at the instant the stretch ends,
a later stage of zero time): stepping, whose event order decides such ties,
runs those micro-batches. NOTE: a change at ordinary priority (a KV landing, a
fault, a control tick) that falls on the very instant a micro-batch starts or
ends is taken as coming before it, where stepping's order depends on when the
two events were scheduled; single-stage fast-forward takes it the same way.
"""

from __future__ import annotations

from bisect import bisect_left
from functools import reduce
from operator import add, sub
from typing import Any

import simpy

from twin._clock import arm, at, cancel
from twin.serving.fastforward import take_blocks
from twin.serving.kvcache import blocks_for
from twin.serving.ports import EngineLike

# Micro-batches one stretch covers at most (it then ends as at a finish).
MAX_MICRO_BATCHES = 4096
# The micro-batches priced and scheduled ahead at once: twice what the last
# stretch had begun, at least this many; each time the schedule runs out while
# nothing has changed, twice as many again (one event each time). Pricing is
# cheap next to an event, and what is scheduled past a cut is lost.
MIN_AHEAD = 32


class PipeStretch:
    """Micro-batches covered by one stretch. Micro-batch ``j`` is lane
    ``order[j % len(order)]``'s, its ``j // len(order)``-th of the stretch, the
    step ``step0[p] + j // len(order)`` of its lane at position ``p``; it takes
    the first stage at ``starts[j]`` for ``firsts[j]`` seconds and leaves the
    last at ``ends[j]``; ``frees[j]`` is when each stage is done with it (kept
    past two stages; with two they are ``starts[j] + firsts[j]`` and ``ends[j]``).
    ``ended`` counts the micro-batches applied so far, ``taken[p]`` is the last
    step whose blocks position ``p``'s lane holds.

    The schedule is made ahead a part at a time: the recurrence's state (the
    next micro-batch ``j``, its position ``p``, round ``i`` and start ``s``,
    the stages' frees and each lane's time out) carries over, and ``event``
    fires at the next micro-batch's start to schedule more, or, once the
    micro-batch that ends the stretch (``end_at``, ending at ``end_s``) and
    those starting before its end are scheduled, at that end, to wake its
    lane, which completes it and goes on or settles the stretch
    (:meth:`PipeForward.went`). Once fired, ``event`` is None until the next
    is scheduled: a change meanwhile (a hand-off reserving the blocks a finish
    freed, as the lane completes its micro-batch) ends the stretch with no
    event to take off the queue. No lane waits on ``event``: each waits on its
    own ``wake`` event, scheduled when the stretch is settled: at its
    micro-batch in flight's end (``resume`` gives that end and its first-stage
    time), or, for a lane out and waiting, when the first stage frees, in the
    order the lanes came out (as they would have queued for it stepping)."""

    __slots__ = ("order", "lanes", "step0", "counts", "ctx0", "fin", "starts", "ends",
                 "firsts", "frees", "taken", "ended", "event", "wake", "resume", "settled",
                 "free", "out", "firsts_of", "laters_of", "j", "p", "i", "s", "end_at",
                 "end_s", "ahead", "room", "floor", "base", "begun_at")  # fmt: skip

    def __init__(
        self,
        order: list[int],
        step0: list[int],
        counts: list[int],
        ctx0: list[int],
        fin: list[int],
        free: list[float],
        out: list[float],
        now: float,
        end_at: int,
    ) -> None:
        self.order = order
        self.lanes = frozenset(order)
        self.step0 = step0
        self.counts = counts
        self.ctx0 = ctx0
        self.fin = fin
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.firsts: list[float] = []
        self.frees: list[list[float]] = []
        self.taken = [s - 1 for s in step0]
        self.taken[0] = step0[0]  # the first micro-batch was planned: its blocks are held
        self.ended = 0
        self.event: simpy.Event | None = None
        self.wake: dict[int, simpy.Event] = {}
        self.resume: dict[int, tuple[float, float]] = {}
        self.settled = False
        self.free = free
        self.out = out
        self.firsts_of: list[list[float]] = [[] for _ in order]
        self.laters_of: list[list[float]] = [[] for _ in order]
        self.j = self.p = self.i = 0
        self.s = now
        self.end_at = end_at
        self.end_s = float("inf")
        self.ahead = 0
        # free blocks past what the scheduled micro-batches take, and the
        # threshold a watching tick must not see crossed (see _blocks_free)
        self.room = 0
        self.floor: float | None = None
        # each lane's micro-batch (from 0) whose context sum is ctx0 (a finish
        # inside the stretch starts its lane's pricing again from there)
        self.base = [0] * len(order)
        # (an instant, micro-batches begun by then): a lane that went on at that
        # instant planned its next micro-batch then, before what followed
        self.begun_at = (-1.0, 0)


def _begun(st: PipeStretch, now: float) -> int:
    """The micro-batches of ``st`` begun by ``now``: those started before it (a
    start at ``now`` itself comes after what an arrival then sees), the first
    always, and one a lane planned at ``now`` as it went on."""
    begun = max(1, bisect_left(st.starts, now))
    at, then = st.begun_at
    return then if at == now and then > begun else begun


def _end_at(fin: list[int], n_lanes: int) -> int:
    """The micro-batch that ends a stretch: the first in which its lane finishes
    a sequence (``fin``: each position's, from 0), or reaches the cap."""
    rounds = MAX_MICRO_BATCHES // n_lanes
    return min(min(x, rounds) * n_lanes + p for p, x in enumerate(fin))


class PipeForward:
    """The fast-forward of one pipelined engine: the stretch in progress, if
    any, and the micro-batches the next stretch aims at."""

    __slots__ = ("engine", "stretch", "cap", "backoff", "skip")

    def __init__(self, engine: EngineLike) -> None:
        self.engine = engine
        self.stretch: PipeStretch | None = None
        self.cap = MIN_AHEAD
        # plans refused in a row (a tie, a block that may not be free) double the
        # attempts skipped before the next, up to 64 (stepping runs those
        # micro-batches, as a refusal leaves them: only the cost changes)
        self.backoff = 0
        self.skip = 0

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
        if st.event is not None:
            cancel(env, st.event)

    def watch_blocks(self, watch: Any) -> None:
        """From now a sleeping tick's ``watch`` is told of the free blocks: a
        stretch under way, which does not say when its micro-batches take
        them, ends here."""
        self.interrupt()

    def sync(self) -> None:
        """Bring the engine up to now inside a stretch (what stepping would show)."""
        st = self.stretch
        if st is not None:
            now = self.engine.env.now
            self._take(st, _begun(st, now))
            self._end(st, bisect_left(st.ends, now))

    def sync_blocks(self) -> None:
        """Take the blocks of the micro-batches begun by now, for a reader of the
        free blocks only."""
        st = self.stretch
        if st is not None:
            self._take(st, _begun(st, self.engine.env.now))

    def wait(self, st: PipeStretch, lane: int) -> simpy.Event:
        """The event ``lane`` waits on inside ``st`` (see :class:`PipeStretch`)."""
        ev = st.wake[lane] = self.engine.env.event()
        return ev

    def _ended(self, st: PipeStretch) -> None:
        """At the end of the micro-batch that ends ``st``: its lane completes it
        now, in its own loop, as stepping does (then :meth:`went`); the stretch
        stays under way meanwhile, with everything before it applied."""
        if self.stretch is not st:
            return
        st.event = None  # fired: none is scheduled until the lane goes on (went)
        eng = self.engine
        now = eng.env.now
        k = st.end_at
        lane = st.order[k % len(st.order)]
        if len(st.starts) >= MAX_MICRO_BATCHES or st.ends[k] != now or lane not in st.wake:
            self._settle(st, now)
            return
        self._take(st, len(st.starts))
        self._end(st, k)
        st.ended = k + 1  # its lane applies it
        st.resume[lane] = (now, st.firsts[k])
        eng.flight[lane] = (now, False)
        arm(eng.env, st.wake[lane], now)

    def went(self, st: PipeStretch, lane: int) -> bool:
        """``lane`` has just completed the micro-batch that ended ``st`` (its
        sequences that finish have ended). Where that changed nothing but its
        batch (nothing to admit, the lane still decoding), go on with the
        lane's new batch, the other lanes' schedule standing: True, and the
        lane waits in the stretch again. Otherwise end the stretch now: False,
        and the lane plans its next micro-batch at once, as stepping does."""
        if self.stretch is not st:
            return False  # what the finish set off ended it
        eng = self.engine
        now = eng.env.now
        n_lanes = len(st.order)
        k = st.end_at
        p = k % n_lanes
        if self._goes_on(st, k, p):
            nxt = k + n_lanes  # the lane's next micro-batch, planned now if it starts now
            if nxt < len(st.starts) and st.starts[nxt] == now:
                st.begun_at = (now, nxt + 1)
                self._take(st, nxt + 1)
            self._next_event(st)
            return True
        self._settle(st, now)
        return False

    def _goes_on(self, st: PipeStretch, k: int, p: int) -> bool:
        """Price position ``p``'s lane (the engine's) again from its batch after
        micro-batch ``k`` and schedule on; False where it cannot go on."""
        eng = self.engine
        n_lanes = len(st.order)
        if not self._nothing_to_admit():
            return False
        batch = eng.batch
        fin = batch.next_finish() if batch.count else None
        if fin is None:
            return False  # the lane has nothing left to decode
        nxt = k // n_lanes + 1  # the lane's next micro-batch, from 0
        st.fin[p] = fin - st.step0[p]
        st.counts[p] = batch.count
        st.ctx0[p] = batch.ctx_sum
        st.base[p] = nxt
        del st.firsts_of[p][nxt:], st.laters_of[p][nxt:]
        st.end_at = _end_at(st.fin, n_lanes)
        if st.end_at <= k:
            return False  # the cap
        if st.j == k + n_lanes:  # the schedule stopped before this lane's next
            st.p += 1
            if st.p == n_lanes:
                st.p = 0
                st.i += 1
            f0 = st.free[0]
            if st.out[st.p] >= f0:
                st.s = st.out[st.p]
            elif f0 in st.out:
                return False  # a lane out at the instant the first stage frees
            else:
                st.s = f0
        st.end_s = st.ends[st.end_at] if st.end_at < st.j else float("inf")
        if st.j > st.end_at and st.s == st.end_s:
            return False
        return self._ahead(st)

    # -- making a stretch ------------------------------------------------------------
    def plan(self, leader: int) -> bool:
        """Cover the decode-only micro-batch lane ``leader`` has just planned, and
        the micro-batches of every lane after it, with a stretch, when nothing
        can change in them: no prompt to prefill or admit, every other lane
        decoding (or idle), none finishing in a micro-batch already in flight,
        and every block the steps take free. True when a stretch was made."""
        if self.skip:
            self.skip -= 1
            return False
        eng = self.engine
        if eng.planner.preempted or not self._nothing_to_admit():
            return False
        now = eng.env.now
        # position 0: the leader, whose micro-batch starts now
        batch = eng.batch
        fin = batch.next_finish()
        if fin is None:
            return False
        lanes = [(0, leader, now, batch.steps + 1, batch.count, batch.ctx_sum, fin)]
        flight = eng.flight
        for lane in range(eng.pp):
            if lane == leader:
                continue
            other = eng.lanes[lane]
            count, ctx, steps = other.count, other.ctx_sum, other.steps
            fl = flight[lane]
            if count == 0:
                if fl is not None:
                    return False  # prompts only in flight: the batch changes
                continue  # idle: it waits for a change, which ends the stretch
            if fl is None:  # out, waiting for the first stage
                if any(s.landed and s.t_decode_start < 0 for s in other.joined):
                    return False
                out_at, first = now, steps + 1
            else:
                end, prompts = fl
                if prompts:
                    return False
                out_at, first, ctx = end, steps + 2, ctx + count
            fin = other.next_finish()
            if fin is None:
                return False
            lanes.append((eng.claim_no[lane], lane, out_at, first, count, ctx, fin))
        lanes[1:] = sorted(lanes[1:])  # the order they took the first stage last
        order = [x[1] for x in lanes]
        ready = [x[2] for x in lanes]
        step0 = [x[3] for x in lanes]
        last = [x[6] - x[3] for x in lanes]  # each lane's finishing micro-batch, from 0
        if min(last) < 1 or any(b < a for a, b in zip(ready[1:], ready[2:], strict=False)):
            return False
        st = PipeStretch(order, step0, [x[4] for x in lanes], [x[5] for x in lanes],
                         last, list(eng.stage_free), ready, now,
                         _end_at(last, len(order)))  # fmt: skip
        st.ahead = self.cap
        if not self._ahead(st):
            self.backoff = min(64, 2 * self.backoff or 1)
            self.skip = self.backoff
            return False
        self.backoff = 0
        self.stretch = st
        self._next_event(st)
        return True

    def _next_event(self, st: PipeStretch) -> None:
        env = self.engine.env
        if st.j < st.end_at + len(st.order) and st.s < st.end_s:  # more to schedule
            st.event = at(env, st.s, lambda _: self._more(st))
        else:
            st.event = at(env, st.end_s, lambda _: self._ended(st))

    def _more(self, st: PipeStretch) -> None:
        """At the start of the next micro-batch not yet scheduled: schedule more
        (twice as many as the last time), or, where a tie or a block that may
        not be free stops it, end the stretch here (stepping goes on from now)."""
        if self.stretch is not st:
            return
        st.event = None  # fired
        st.ahead = min(MAX_MICRO_BATCHES, 2 * st.ahead)
        if self._ahead(st):
            self._next_event(st)
        else:
            self._settle(st, self.engine.env.now)

    def _ahead(self, st: PipeStretch) -> bool:
        """Price and schedule ``st.ahead`` more micro-batches (fewer at the
        stretch's end), every block they take being free; False (and nothing
        scheduled) where a tie, a non-positive stage time or a block that may
        not be free leaves them to stepping."""
        n_lanes = len(st.order)
        limit = min(st.j + st.ahead, st.end_at + n_lanes)
        price = self.engine.stage_steps
        assert price is not None
        for p in range(n_lanes):
            have = len(st.firsts_of[p])
            want = min((limit - 1 - p) // n_lanes + 1, st.fin[p] + 1)  # no lane passes its finish
            if want > have:
                ctx = st.ctx0[p] + st.counts[p] * (have - st.base[p])
                a, b = price(st.counts[p], ctx, want - have)
                if not (min(a) > 0.0 and min(b) > 0.0):
                    return False
                st.firsts_of[p] += a
                st.laters_of[p] += b
        n0 = len(st.starts)
        saved = (st.j, st.p, st.i, st.s, list(st.free), list(st.out), st.end_s)
        if self._schedule(st, limit) and self._blocks_free(st):
            return True
        st.j, st.p, st.i, st.s, st.free, st.out, st.end_s = saved
        del st.starts[n0:], st.ends[n0:], st.firsts[n0:], st.frees[n0:]
        return False

    def _schedule(self, st: PipeStretch, limit: int) -> bool:
        """Run stepping's recurrence over the lanes in turn, from where it was
        left, up to micro-batch ``limit`` (or the stretch's end): the starts,
        ends, first-stage times and stage frees; False where a tie (see the
        module) leaves them to stepping."""
        free = st.free
        stages = range(1, len(free))
        keep_frees = len(free) > 2
        n_lanes = len(st.order)
        out = st.out
        firsts_of, laters_of = st.firsts_of, st.laters_of
        starts, ends, firsts, frees = st.starts, st.ends, st.firsts, st.frees
        end_at = st.end_at
        last = end_at + n_lanes
        end_s = st.end_s
        j, p, i, s = st.j, st.p, st.i, st.s
        while j < limit:
            a_list = firsts_of[p]
            if i >= len(a_list):
                return False  # not priced this far (cannot happen: see _ahead)
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
            out[p] = t
            if j == end_at:
                end_s = t
            j += 1
            if j == last:
                break  # the stretch's last lane would start again, after its end
            p += 1
            if p == n_lanes:
                p = 0
                i += 1
            r = out[p]
            f0 = free[0]
            if r >= f0:
                s = r
            else:
                s = f0  # it waits for the first stage
                if f0 in out:  # another lane out at that very instant: stepping's order decides
                    return False
            if j > end_at:
                if s > end_s:
                    break  # starts after the stretch's end: not in it
                if s == end_s:
                    return False
        st.j, st.p, st.i, st.s, st.end_s = j, p, i, s, end_s
        return True

    def _nothing_to_admit(self) -> bool:
        """Whether no lane has a prompt to compute before a change: none being
        computed, no KV landed to join, and the head of the queue, if any, not
        admissible: the running limit is reached, or (no prefix cache) its
        blocks are not free, and the stretch only takes more."""
        eng = self.engine
        if eng.prefilling or eng.landed:
            return False
        if not eng.waiting:
            return True
        if eng.running_requests >= eng.config.max_num_seqs * eng.pp:
            return True
        if eng.cache is not None:
            return False
        kv = eng.kv
        return not kv.can_admit(blocks_for(eng.waiting[0].prefill_len, kv.block_size))

    def _blocks_free(self, st: PipeStretch) -> bool:
        """Whether every block the micro-batches scheduled so far take is free
        (so no preemption can happen in them)."""
        eng = self.engine
        kv = eng.kv
        bs = kv.block_size
        n = len(st.starts)
        n_lanes = len(st.order)
        lasts = []
        bound = 0
        for p, lane in enumerate(st.order):
            last = st.step0[p] + (n - 1 - p) // n_lanes  # its last micro-batch's step
            lasts.append((lane, last))
            bound += st.counts[p] * ((last - st.taken[p]) // bs + 1)
        # a sleeping tick watching the free blocks (see twin.sim.control) is told
        # at each allocation; the stretch takes its blocks with no event, so it
        # keeps short of the threshold (free blocks only fall in a stretch)
        watch = kv.watch
        at_most = getattr(watch, "free_at_most", None)
        if at_most is not None and watch.free_was:
            at_most = None  # at or under it: only a release, at an event, can cross back
        st.floor = at_most
        if bound <= kv.free and (at_most is None or kv.free - bound > at_most):
            st.room = kv.free - bound
            return True
        need = sum(eng.lanes[lane].blocks_to(last) for lane, last in lasts)
        st.room = kv.free - need
        return need <= kv.free and (at_most is None or kv.free - need > at_most)

    def keeps(self, blocks: int) -> bool:
        """Whether a stretch under way can go on while ``blocks`` more are taken
        now from outside (a KV hand-off reserving them): they are free past what
        its micro-batches take, short of a watched threshold, and (no prefix
        cache) nothing else changes; they are counted off its room."""
        st = self.stretch
        if st is None or self.engine.cache is not None or blocks > st.room:
            return False
        if st.floor is not None and st.room - blocks <= st.floor:
            return False
        st.room -= blocks
        return True

    # -- applying it -----------------------------------------------------------------
    def _take(self, st: PipeStretch, begun: int) -> None:
        """Take the blocks of the first ``begun`` micro-batches."""
        eng = self.engine
        n_lanes = len(st.order)
        for p, lane in enumerate(st.order):
            if p >= begun:
                break
            step = st.step0[p] + (begun - 1 - p) // n_lanes
            if step > st.taken[p]:
                take_blocks(eng, eng.lanes[lane], step)
                st.taken[p] = step

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
        for p, lane in enumerate(st.order):
            j = k0 + (p - k0) % n_lanes  # this lane's first micro-batch not applied
            if j >= end_to:
                continue
            out = ends[j:end_to:n_lanes]
            batch = eng.lanes[lane]
            if j < n_lanes and batch.fresh:
                # its first step as stepping completes it (sequences that joined
                # measure their first gap in it)
                batch.step(out[0], eng.finish)
                del out[0]
                if not out:
                    continue
            gaps = [out[0] - batch.last_end]
            gaps += map(sub, out[1:], out[:-1])
            batch.run_steps(gaps, out[-1])
        st.ended = end_to

    def _settle(self, st: PipeStretch, now: float) -> None:
        """End ``st`` at ``now``: apply what has ended, take the blocks of what
        has begun, leave the stages as its last begun micro-batch left them, and
        wake each lane waiting (see :class:`PipeStretch`)."""
        eng = self.engine
        begun = _begun(st, now)
        self._take(st, begun)
        self._end(st, bisect_left(st.ends, now))
        j = begun - 1
        eng.stage_free[:] = st.frees[j] if st.frees else (st.starts[j] + st.firsts[j], st.ends[j])
        n_lanes = len(st.order)
        lasts = []
        for p, lane in enumerate(st.order[:begun]):
            j = p + (begun - 1 - p) // n_lanes * n_lanes  # its last begun micro-batch
            lasts.append((j, lane))
            if j >= st.ended:  # still in flight
                st.resume[lane] = (st.ends[j], st.firsts[j])
                eng.flight[lane] = (st.ends[j], False)
        for _, lane in sorted(lasts):  # the order they took the first stage
            eng.claims += 1
            eng.claim_no[lane] = eng.claims
        env = eng.env
        out = sorted((eng.claim_no[lane], lane) for lane in st.wake if lane not in st.resume)
        free0 = eng.stage_free[0]
        for _, lane in out:  # out and waiting for the first stage, in the order they came out
            arm(env, st.wake[lane], free0 if free0 > now else now)
        for lane, (end, _) in st.resume.items():
            if lane in st.wake:
                arm(env, st.wake[lane], end)
        st.settled = True
        self.stretch = None
        # the next stretch is scheduled ahead about as far as this one ran (and
        # twice as far each time that runs out)
        self.cap = min(MAX_MICRO_BATCHES, max(MIN_AHEAD, 2 * begun))
