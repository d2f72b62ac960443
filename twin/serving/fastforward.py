"""Fast-forward: one event for a stretch of decode steps of one batch.

Between two events that change an engine's decode batch (an arrival, a KV
landing, a sequence finishing, a block running short) every decode step is
known in advance: the batch grows one token per sequence per step and the perf
model prices each step. :class:`FastForward` prices such a stretch in one call
(:func:`twin.perf.iteration.decode_steps`), up to and including the next step in
which a sequence finishes, waits for its end with one event, and applies the
steps in bulk (block allocations, inter-token gaps, counters) exactly as
stepping would, the last step (where the batch changes) as stepping does. A
change from outside cuts the stretch at the step in progress: the same event is
moved forward to that step's end (:func:`twin._clock.move`), so a stretch costs
one event whether it runs to its end or not. Two changes need no cut: the step
that completes the prompts joining the batch may head the stretch
(:meth:`FastForward.plan_head`), and a KV landing mid-stretch joins the batch
at the next step inside it, the steps from there priced again
(:meth:`FastForward.lands`). The results are bit-identical to stepping
(``tests/test_engine.py`` and ``tests/test_fastforward.py`` hold the two side by
side).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from functools import reduce
from itertools import accumulate
from operator import add, sub
from typing import TYPE_CHECKING, Any

import simpy

from twin._clock import at, move
from twin.serving.decodebatch import DecodeBatch, joiner_need
from twin.serving.ports import EngineLike
from twin.serving.sequence import PREFILL

if TYPE_CHECKING:
    from twin.serving.sequence import Sequence

MIN_STRETCH = 2  # steps; a single step is stepped
MAX_STRETCH = 4096
# After a cut the next stretch is priced at most this far, or four times the
# steps the cut one ran: pricing is cheap next to an event, and a stretch that
# ends short of its next finish costs one more event.
CUT_STRETCH = 128


class Stretch:
    """Decode steps covered by one event: step ``i`` runs ``dts[i]`` seconds and
    ends at ``ends[i]`` (it starts at the previous end, the first when the
    stretch is made). ``begun`` and ``ended`` count the steps applied so far;
    the first is planned (begun) before the stretch is made. ``stop`` is the
    number of steps it runs (fewer than planned once cut), ``event`` the one
    event that fires at the end of step ``stop - 1``. ``room`` is a lower bound
    on the blocks still free once every step has taken its own: blocks taken
    from outside within it (:meth:`FastForward.keeps`) leave the steps as they are.

    A stretch may be headed by a step that completes prompts (``head``, its
    prefill chunks, every one completing in it; with chunked prefill the
    batch's decodes ride along, ``mixed``): step 0 is that step, the steps of
    the batch they join start at ``first`` = 1, and the prompts join as step 0
    ends.
    Sequences whose KV landed during step ``join - 1`` (``joining``) join the
    batch at step ``join`` (0: none), as stepping joins them when it plans
    that step; the steps from there are priced with them."""

    __slots__ = (
        "dts", "ends", "begun", "ended", "stop", "event", "room", "head", "mixed", "first",
        "join", "joining",
    )  # fmt: skip

    def __init__(
        self,
        dts: list[float],
        ends: list[float],
        room: int,
        head: list[tuple[Sequence, int]] | None = None,
        mixed: bool = False,
    ) -> None:
        self.dts = dts
        self.ends = ends
        self.begun = 1
        self.ended = 0
        self.stop = len(ends)
        self.event: simpy.Event | None = None
        self.room = room
        self.head = head
        self.mixed = mixed
        self.first = 0 if head is None else 1
        self.join = 0
        self.joining: list[Sequence] = []


class FastForward:
    """The fast-forward of one engine: the stretch in progress, if any, and the
    length the next stretch aims at."""

    __slots__ = ("engine", "stretch", "cap")

    def __init__(self, engine: EngineLike) -> None:
        self.engine = engine
        self.stretch: Stretch | None = None
        self.cap = MAX_STRETCH

    def interrupt(self) -> None:
        """A change from outside: end the stretch at the step in progress."""
        st = self.stretch
        if st is None:
            return
        env = self.engine.env
        ends = st.ends
        k = bisect_left(ends, env.now)  # the step in progress (or ending now)
        stop = st.stop
        # advance(now, inclusive=False), with the one bisection
        self._begin(k + 1 if k < stop else stop)
        self._end(k if k < stop else stop)
        if k + 1 < stop:
            self._shorten(st, k)

    def _shorten(self, st: Stretch, k: int) -> None:
        """End ``st`` with its step ``k``: its one event moves to that step's
        end; sequences landed to join it later join at the next step the
        engine plans, as stepping joins them."""
        st.stop = k + 1
        assert st.event is not None
        move(self.engine.env, st.event, st.ends[k])
        if st.join > k:
            self.engine.landed[:0] = st.joining
            st.join = 0
            st.joining = []

    def lands(self, seq: Sequence) -> bool:
        """Whether the stretch under way takes in ``seq``, whose KV has landed
        now (its blocks held, itself running): it joins the batch at the step
        after the one in progress, as stepping joins it, and the steps from
        there are priced again with it (up to its own finish, if sooner), when
        the blocks they take are free past what the stretch's steps take (its
        room). Landed in the stretch's last step, it joins as the engine plans
        the next, outside the stretch. False: the stretch must end (the
        engine interrupts it)."""
        st = self.stretch
        eng = self.engine
        if st is None or st.ended < st.first or eng.cache is not None:
            return False
        now = eng.env.now
        k = bisect_left(st.ends, now)  # the step in progress (or ending now)
        if k >= st.stop - 1:
            eng.landed.append(seq)  # the stretch ends with this step
            return True
        j = k + 1
        if st.join and st.join != j:
            self.advance(now, inclusive=False)  # the earlier join is behind: apply it
        left = seq.req.output_tokens - seq.generated - 1  # its finish: `left` steps after j
        last = min(st.stop - 1, j + left)
        need = joiner_need(seq, last - j, eng.kv.block_size)
        if need > st.room:
            return False
        st.room -= need
        st.join = j
        st.joining.append(seq)
        count = eng.batch.count
        ctx = eng.batch.ctx_sum + count * (j - st.ended)
        for s in st.joining:
            count += 1
            ctx += s.prefill_len + 1  # its length_at(the step it joins in)
        dts = eng.decode_steps(count, ctx, last - j + 1)
        ends = list(accumulate(dts, initial=st.ends[j - 1]))
        del ends[0]
        st.dts = st.dts[:j] + dts
        st.ends = st.ends[:j] + ends
        st.stop = last + 1
        assert st.event is not None
        move(eng.env, st.event, ends[-1])
        if eng.kv.watch is not None:
            eng.kv.watch.stretch(eng, st)  # its steps are others now
        return True

    def keeps(self, blocks: int) -> bool:
        """Whether the stretch under way can go on while ``blocks`` more are
        taken now from outside (a KV hand-off reserving them): with no prefix
        cache, they are free past what its steps take, so no step runs short
        and nothing it decides changes (what waits to be admitted needs blocks
        or a seat, and has fewer of both); they are counted off its room. A
        tick watching the blocks is told of the stretch again once they are
        taken (:meth:`~twin.serving.receiving.Receiver.reserve`)."""
        st = self.stretch
        if st is None or blocks > st.room or self.engine.cache is not None:
            return False
        st.room -= blocks
        return True

    def cut(self) -> None:
        """A change from outside that reads none of the decode state (a prompt
        joins the queue): end the stretch at the step in progress, as
        :meth:`interrupt` does, but leave its steps to be applied when the state
        is read (:meth:`sync`) or the step ends, in one go instead of two. With
        a tick's watch on the blocks, their taking is timed: interrupt then."""
        st = self.stretch
        if st is None:
            return
        env = self.engine.env
        if self.engine.kv.watch is not None:
            self.interrupt()
            return
        k = bisect_left(st.ends, env.now)  # the step in progress (or ending now)
        if k + 1 < st.stop:
            self._shorten(st, k)

    def watch_blocks(self, watch: Any) -> None:
        """From now ``watch`` (a sleeping tick's) is told of the free blocks,
        which the steps of a stretch under way take with no event; a stretch
        whose steps evict prefix units ends here (their taking is not timed)."""
        st = self.stretch
        if st is not None:
            cache = self.engine.cache
            if cache is not None and cache.tiers is None:
                self.interrupt()
            else:
                watch.stretch(self.engine, st)

    def sync(self) -> None:
        """Bring the engine up to now inside a stretch, so that a reader sees
        what stepping would show at this instant."""
        if self.stretch is not None:
            self.advance(self.engine.env.now, inclusive=False)

    def sync_blocks(self) -> None:
        """Take the blocks of the steps begun by now, as :meth:`sync` does, for a
        reader of the free blocks only: the steps that have ended are applied
        later, with the next that end (:meth:`_end` applies them in bulk, with
        the same results in one go as in several)."""
        st = self.stretch
        if st is not None:
            self._begin(min(st.stop, bisect_left(st.ends, self.engine.env.now) + 1))

    def plan(self) -> Stretch | None:
        """A stretch of the decode steps from the one just planned up to and
        including the next step in which a sequence finishes, when every block
        those steps need is free (so no preemption can happen) and it is longer
        than one step. Arrivals, the only other change, cut it short. The
        first step, the one just planned, is priced with the rest."""
        eng = self.engine
        if eng.planner.preempted:
            return None  # the preempted may be admitted again at the next step
        batch = eng.batch
        finish = batch.next_finish()
        if finish is None:
            return None
        first = batch.steps + 1
        last = min(finish, first + self.cap - 1)
        if last - first < MIN_STRETCH - 1:
            return None
        free = _room(eng)
        need = batch.blocks_needed(first, last, (), free)
        if need > free:
            return None
        dts = eng.decode_steps(batch.count, batch.ctx_sum, last - first + 1)
        # the same float sums stepping makes: now + dt, then one step at a time
        ends = list(accumulate(dts, initial=eng.env.now))
        del ends[0]
        return Stretch(dts, ends, free - need)

    def plan_head(
        self, chunks: list[tuple[Sequence, int]], dt: float, mixed: bool
    ) -> Stretch | None:
        """A stretch headed by the step just planned (prompt ``chunks``, and the
        batch's decodes if ``mixed``, lasting ``dt``), then the decode steps of
        the batch the prompts join up to and including the next step in which
        a sequence finishes, when stepping would run exactly those: every
        prompt completes in the step, none finishes there or moves away, no
        decode finishes there, nothing else waits to be admitted when it ends
        (the next step's budget could take it), and every block the decode
        steps need is free. Nothing outside reads the prompts' completion
        before the stretch applies it: no prompt hook nor tier below the
        prefix cache sees it, and a reader (of the prefix cache too) syncs
        first. Saves the event of the prompts' step."""
        eng = self.engine
        if eng.planner.preempted or eng.waiting or eng.on_prompt is not None:
            return None
        if eng.cache is not None and eng.cache.tiers is not None:
            return None  # the prompts' units would leave the tiers below unseen
        if len(eng.prefilling) != len(chunks):
            return None
        joined = 0
        new_ctx = 0
        batch = eng.batch
        first = batch.steps + 1 + mixed  # the decode step after the head
        end = first + self.cap - 2  # the stretch's length is capped head included
        for s, n in chunks:
            if s.prefilled + n < s.prefill_len or s.handoff or s.landed:
                return None
            if s.state != PREFILL:
                return None
            left = s.req.output_tokens - s.generated - 1  # tokens after the prompt's
            if left <= 0:
                return None  # it finishes in the step (an event stepping shows then)
            # _join_decode at the step's end: it finishes at decode step first + left - 1
            if first + left - 1 < end:
                end = first + left - 1
            joined += 1
            new_ctx += s.prefill_len + 1  # its length_at(first)
        for s in batch.joined:
            if s.landed:
                return None  # its decode start is noted as the next step is planned
        finish = batch.next_finish()
        if finish is not None and finish < end:
            end = finish
        if end < first:
            return None  # a sequence finishes in the head or none is left to decode
        count = batch.count + joined
        free = _room(eng)
        need = batch.blocks_needed(first, end, [s for s, _ in chunks], free)
        if need > free:
            return None
        ctx = batch.ctx_sum + (batch.count if mixed else 0) + new_ctx
        dts = [dt]
        dts += eng.decode_steps(count, ctx, end - first + 1)
        ends = list(accumulate(dts, initial=eng.env.now))
        del ends[0]
        return Stretch(dts, ends, free - need, chunks, mixed)

    def run(self, st: Stretch):  # part of the engine's serve process
        eng = self.engine
        env = eng.env
        self.stretch = st
        st.event = at(env, st.ends[-1])
        if eng.kv.watch is not None:  # its blocks are taken as time passes
            eng.kv.watch.stretch(eng, st)
        yield st.event
        if eng.ff is not self:
            return  # the engine failed or stopped: its life ended
        last = len(st.ends) - 1
        if st.stop <= last:
            # Cut by a change at the step in progress, which has just ended. Steps
            # priced past it were wasted: bound the next stretch's pricing by the
            # length changes have been leaving (only speed depends on this).
            self.advance(env.now, inclusive=True)
            self.stretch = None
            self.cap = max(CUT_STRETCH, 4 * st.stop)
            return
        self._begin(len(st.ends))
        self._end(last)
        self.stretch = None
        self.cap = min(MAX_STRETCH, 2 * self.cap)
        # The last step, in which the batch changes, as stepping completes it.
        eng.iterations += 1
        eng.busy_s += st.dts[last]
        eng.batch.step(env.now, eng.finish)

    def advance(self, now: float, *, inclusive: bool) -> None:
        """Apply the stretch's steps that stepping would have applied by ``now``:
        a step begins (takes its blocks) at its start and ends (tokens out) at
        its end. Events at ``now`` itself are applied only when ``inclusive``
        (same-time arrivals see the state before them, as when stepping)."""
        st = self.stretch
        assert st is not None
        ends = st.ends
        self._begin(min(st.stop, bisect_left(ends, now) + 1))
        end_to = bisect_right(ends, now) if inclusive else bisect_left(ends, now)
        self._end(min(st.stop, end_to))

    def _begin(self, begin_to: int) -> None:
        """Begin the stretch's steps before ``begin_to``: take their blocks."""
        st = self.stretch
        assert st is not None
        if begin_to > st.begun:
            if st.ended < st.first:  # the prompts join the batch before its first step
                self._end(st.first)
            if st.join and begin_to > st.join:  # the landed join before their first step
                self._end(st.join)
            eng = self.engine
            take_blocks(eng, eng.batch, eng.batch.steps + 1 + (begin_to - 1 - st.ended))
            st.begun = begin_to

    def _end(self, end_to: int) -> None:
        """End the stretch's steps before ``end_to``, in bulk: nothing in them can
        fail or finish, so only the totals, and the gaps in the order stepping
        pushes them, matter."""
        eng = self.engine
        st = self.stretch
        assert st is not None
        if end_to <= st.ended:
            return
        j = st.join
        if j and end_to >= j:
            # Up to the step the landed join in, then they join as stepping plans it.
            st.join = 0
            if j > st.ended:
                self._end(j)
            for s in st.joining:
                eng.batch.join(s)
            eng.planner.note_decode_start([], True, st.ends[j - 1])
            st.joining = []
            if end_to == j:
                return
        ends = st.ends
        k0 = st.ended
        if k0 < st.first:
            # The prompts' step as stepping completes it: they join the batch.
            assert st.head is not None
            eng.iterations += 1
            eng.busy_s += st.dts[0]
            eng.complete(st.head, st.mixed, ends[0])
            st.ended = k0 = 1
            if end_to <= 1:
                return
        batch = eng.batch
        if k0 > st.first and not batch.joined:
            gaps = list(map(sub, ends[k0:end_to], ends[k0 - 1 : end_to - 1]))
        elif batch.fresh:
            # The first decode step as stepping completes it: sequences that
            # joined the batch measure their first gap in it.
            eng.iterations += 1
            eng.busy_s += st.dts[k0]
            batch.step(ends[k0], eng.finish)
            st.ended = k0 = k0 + 1
            if end_to <= k0:
                return
            gaps = list(map(sub, ends[k0:end_to], ends[k0 - 1 : end_to - 1]))
        else:  # nothing joined: the first decode step is one more of the bulk
            gaps = [ends[k0] - batch.last_end]
            gaps += map(sub, ends[k0 + 1 : end_to], ends[k0 : end_to - 1])
        batch.run_steps(gaps, ends[end_to - 1])
        eng.busy_s = reduce(add, st.dts[k0:end_to], eng.busy_s)  # one step at a time
        eng.iterations += end_to - k0
        st.ended = end_to


def _room(eng: EngineLike) -> int:
    """Blocks a stretch's steps may take: the free ones and, with a prefix
    cache, those it holds idle, evicted as the steps take them
    (:func:`take_blocks`); not those with tiers below the cache (stepping
    writes each step's evictions down in a write of its own) nor under a
    tick's watch on the free blocks (it times their taking, not the
    evictions)."""
    free = eng.kv.free
    cache = eng.cache
    if cache is None or cache.tiers is not None or eng.kv.watch is not None:
        return free
    return free + cache.evictable_blocks


def take_blocks(eng: EngineLike, batch: DecodeBatch, last: int) -> None:
    """The blocks ``batch``'s steps up to ``last`` take on ``eng``, all known to
    be free: each sequence due takes every block it needs by then at once."""
    taken = batch.take_blocks(last)
    if taken:
        kv = eng.kv
        if taken > kv.free:
            # Stepping evicts idle prefix units, least recently used first, each
            # time a step finds no block free: in all, the shortest run of them
            # that covers what the free blocks lack, as one eviction here (no
            # use or release of a unit falls inside a stretch). It ran full then.
            assert eng.cache is not None
            eng.cache.evict(taken, hold=False)
            kv.peak_used = kv.total
        kv.allocate(taken)
