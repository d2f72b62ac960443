"""One serving instance: a continuous-batching loop, one SimPy event per iteration.

The policy is vLLM's (v0 scheduler): prefill first, FCFS; a waiting request is
admitted only when the blocks for its whole prompt are free (less a small
watermark); running sequences grow a block at a time; when a decode step finds
no free block, the most recently admitted sequence is preempted and will be
recomputed (its prompt plus the tokens it had produced are prefilled again).
The queue's order and the preemption victim are the spec's queue policy's
(:mod:`twin.serving.queuepolicy`; FCFS by default).
With ``chunked_prefill`` the iteration carries every running decode first and
fills the rest of a token budget with prefill chunks (Sarathi-Serve style).

Per-iteration work does not grow with the batch: decode sequences are kept as
aggregates (count, sum of context lengths), and per-sequence events (a block
needed, the last token) sit in heaps keyed by the decode step at which they
happen. A decode step touches only the sequences that finish or need a block
in that step. The same bookkeeping lets a later change jump over a stretch of
decode steps in which nothing changes.

Pipeline parallelism (a :class:`~twin.perf.iteration.Pipelined` perf model of
``pp`` stages): the instance keeps up to ``pp`` micro-batches in flight, as
vLLM's virtual engines do. Its running sequences are partitioned into ``pp``
lanes, each with its own decode aggregate and its own loop; a lane's next
micro-batch starts once its previous one has left the last stage (a sequence
is in one micro-batch at a time) and the first stage is free, and its tokens
come out after the batch has passed every stage (each stage FIFO, held for the
time :meth:`~twin.perf.iteration.Pipelined.stage_times` gives). One SimPy event
per micro-batch. The waiting queue and the KV blocks are shared: a prompt joins
the lane whose micro-batch admits it and decodes there until it ends or is
preempted (then it waits again for any lane); a landed KV hand-off joins the
next lane to plan. ``max_num_seqs`` holds per lane, as per virtual engine.
NOTE: vLLM also gives each virtual engine 1/pp of the KV blocks; here they
are one pool. With ``pp > 1`` a stretch covers every lane's micro-batches at
once (:mod:`twin.serving.pipeforward`); with one stage, one batch's steps
(:mod:`twin.serving.fastforward`).
"""

from __future__ import annotations

import dataclasses
import heapq
import operator
from bisect import bisect_left
from collections.abc import Callable
from collections.abc import Sequence as Sequence_
from dataclasses import dataclass
from typing import Any, Protocol

import simpy

from twin._check import is_int
from twin._clock import at
from twin._declare import (
    BOOL,
    FRACTION,
    POSITIVE_INT,
    anything,
    choice,
    declared,
    interval,
    nbytes,
)
from twin.errors import SpecError
from twin.perf.iteration import (
    Batch,
    DecodeSteps,
    PerfModel,
    Pipelined,
    StageSteps,
    decode_steps,
    pipeline_stages,
    stage_steps,
)
from twin.request import Request
from twin.serving.fastforward import FastForward
from twin.serving.kvcache import BlockManager, PrefixCache, blocks_for, cacheable
from twin.serving.observer import Observer
from twin.serving.pipeforward import PipeForward
from twin.serving.queuepolicy import DEFAULT as DEFAULT_QUEUE_POLICY
from twin.serving.queuepolicy import SCHEMA as QUEUE_POLICY_SCHEMA
from twin.serving.queuepolicy import (
    PicksVictim,
    QueuePolicyChoice,
    parse_choice,
    waiting_queue,
)
from twin.serving.sequence import (
    DECODE,
    DONE,
    HANDOFF,
    INCOMING,
    LOST,
    PREFILL,
    WAITING,
    Sequence,
)

ROLES = ("mixed", "prefill", "decode")
_EMPTY = Batch()
# The decode bookkeeping of one pipeline lane; the engine's attributes of these
# names are those of the lane being planned or completed (see Engine._use_lane).
_LANE_STATE = ("decode_count", "decode_ctx_sum", "steps", "_finish_heap", "_alloc_heap",
               "_first_gap", "_gap_steps", "_gap_vals", "_last_decode_end")  # fmt: skip
_lane_state = operator.attrgetter(*_LANE_STATE)
# A request no instance can ever hold: stop the run, or reject it; ``truncate``
# also shortens a request longer than the context instead of rejecting it.
OVERSIZED = ("error", "reject", "truncate")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Batching and memory policy of one instance (the spec's ``engine:``).

    ``max_batched_tokens`` caps the prefill tokens of one iteration (without
    chunking a single longer prompt still runs, alone) or, with
    ``chunked_prefill``, all tokens of one iteration (decodes count one each).
    ``watermark`` is the share of blocks kept back from new admissions.
    ``prefix_caching`` keeps finished prompts' KV for reuse by later requests
    with the same leading prefix hashes (see :class:`~twin.serving.kvcache.PrefixCache`).
    ``fast_forward`` lets the engine cover a stretch of decode steps in which
    nothing can change with one event (see :mod:`twin.serving.fastforward`); the results are
    those of stepping. The memory terms size the KV cache
    (:func:`~twin.serving.kvcache.kv_capacity_blocks`); ``oversized`` says what
    becomes of a request that can never fit. ``max_model_len`` (tokens, prompt
    plus output) lowers the model's context (``None``: the model's own); a
    longer request is rejected (``context_length``, as vLLM refuses it), or
    with ``oversized: truncate`` served truncated (:func:`twin.sim.simulation.truncate`).

    Each field is declared once, with its YAML key, default and help; the
    spec reader, the JSON Schema and the README check all read it from here.
    """

    block_size: int = declared(16, POSITIVE_INT, "tokens per KV block")
    max_num_seqs: int = declared(
        256, POSITIVE_INT, "running sequences per instance (per micro-batch lane with pp > 1)"
    )
    max_batched_tokens: int = declared(
        8192, POSITIVE_INT, "prefill tokens per iteration (2048 with chunked_prefill)",
        nullable=True,
    )  # fmt: skip
    chunked_prefill: bool = declared(
        False, BOOL, "decodes first, prompt chunks fill the token budget"
    )
    watermark: float = declared(
        0.01, interval(0, 1, hi_open=True), "share of KV blocks kept back from new admissions"
    )
    gpu_memory_utilization: float = declared(
        0.9, FRACTION, "share of each GPU's memory the instance may use"
    )
    activation_reserve_bytes: float = declared(
        "2 GiB", nbytes(), "per GPU, besides weights and KV", key="activation_reserve"
    )
    oversized: str = declared(
        "error", choice(*OVERSIZED),
        "a request that can never fit: error | reject | truncate (see max_model_len)",
    )  # fmt: skip
    fast_forward: bool = declared(
        True, BOOL, "cover quiet decode stretches with one event (same results)"
    )
    prefix_caching: bool = declared(
        False, BOOL, "keep prompts' KV for requests with the same leading prefix hashes"
    )
    max_model_len: int | None = declared(
        None, POSITIVE_INT, "longest prompt + output in tokens (null: the model's context)",
        nullable=True,
    )  # fmt: skip
    queue_policy: QueuePolicyChoice = declared(
        DEFAULT_QUEUE_POLICY, anything(QUEUE_POLICY_SCHEMA, parse_choice),
        "the order prompts are admitted in: fcfs | priority | shortest-prompt-first, "
        "or {name, ...parameters} (twin.serving.queuepolicy)",
        keep=True,
    )  # fmt: skip

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_batched_tokens"):
            v = getattr(self, name)
            if not is_int(v) or v <= 0:
                raise SpecError(f"engine.{name}: {v!r} must be a positive integer")
        if not 0.0 <= self.watermark < 1.0:
            raise SpecError(f"engine.watermark: {self.watermark!r} must be in [0, 1)")


_Stages = tuple[list[float], list[float]]


def _slowed(times: _Stages, speed: float) -> _Stages:
    """Stage times at ``speed`` x the perf model's rate."""
    return [a / speed for a in times[0]], [b / speed for b in times[1]]


class EngineHooks(Protocol):
    """What an engine tells the KV hand-off of a disaggregated cluster."""

    def on_prefill_start(self, engine: Engine, seq: Sequence, dt: float) -> None:
        """The iteration that completes ``seq``'s prompt starts; it lasts ``dt`` s."""

    def on_prefilled(self, engine: Engine, seq: Sequence) -> None:
        """``seq``'s prompt is done; its KV waits here (state HANDOFF)."""

    def on_blocks_freed(self, engine: Engine) -> None:
        """Blocks came free on ``engine``: pending reservations may fit now."""


class Engine:
    """A serving instance. ``submit`` hands it a request; what happens is reported
    to ``observer`` (a sequence's end among it, once, when its last token is out);
    ``hooks`` are the hand-off's (split serving), and ``on_prompt`` is called as
    each prompt is computed (a KV pool keeps it). All are given at construction."""

    def __init__(
        self,
        env: simpy.Environment,
        instance_id: int,
        perf: PerfModel,
        blocks: BlockManager,
        config: EngineConfig,
        observer: Observer,
        *,
        role: str = "mixed",
        hooks: EngineHooks | None = None,
        on_prompt: Callable[[Engine, Sequence], None] | None = None,
    ) -> None:
        if role not in ROLES:
            raise SpecError(
                f"instance {instance_id}: role {role!r}; expected one of {', '.join(ROLES)}"
            )
        self.env = env
        self.id = instance_id
        self.role = role
        self.hooks = hooks
        # prefill side: sequences whose KV waits to move -> the blocks they hold
        self.handoff: dict[int, tuple[Sequence, int, list[int]]] = {}
        self._landed: list[Sequence] = []  # decode side: KV arrived, not yet joined
        # decode side: request id -> (blocks its KV lands in, the cached prefix
        # units it shares here instead, which do not move)
        self.reserved: dict[int, tuple[int, list[int]]] = {}
        self.perf = perf
        self.kv = blocks
        self.cache = PrefixCache(blocks) if config.prefix_caching else None
        if self.cache is not None:
            self.cache.on_freed = self._written_down
        self.config = config
        self.observer = observer
        self._iter_observer = observer if observer.wants_iterations else None
        self.on_prompt = on_prompt
        # the queue, in the order of the spec's queue policy (a deque: FCFS)
        self.queue_policy = config.queue_policy.build()
        self.waiting = waiting_queue(self.queue_policy)
        self._pick_victim = (
            self.queue_policy.victim if isinstance(self.queue_policy, PicksVictim) else None
        )
        self.waiting_tokens = 0
        # bumped by every change to the queue and the prompts being computed but
        # a request joining the queue's back (what a queue estimate may keep)
        self.queue_changes = 0
        # Every admitted sequence, in admission order (the last is the first victim).
        self.running: dict[int, Sequence] = {}
        self.prefilling: list[Sequence] = []  # admitted, prompt not fully computed
        self.decode_count = 0
        self.decode_ctx_sum = 0  # sum of length_at(next step) over decoding sequences
        self.steps = 0  # decode steps completed
        self._finish_heap: list[tuple[int, int, int, Sequence]] = []
        self._alloc_heap: list[tuple[int, int, int, Sequence]] = []
        self._first_gap: list[Sequence] = []  # joined decode; gap measured at their first step
        self._gap_steps: list[int] = []  # monotone stack: step numbers, increasing
        self._gap_vals: list[float] = []  # ... their gaps, decreasing
        self._last_decode_end = -1.0
        self._wake: simpy.Event | None = None
        self.pp = pipeline_stages(perf)
        # pp > 1: the other lanes' decode state (_LANE_STATE order), the lane in
        # use, and when each pipeline stage is done with the micro-batches given it
        self._lane = 0
        self._lanes: list[list] = [[0, 0, 0, [], [], [], [], [], -1.0] for _ in range(self.pp)]
        self._stage_free = [0.0] * self.pp
        # ... and, for their fast-forward, each lane's micro-batch in flight (its
        # end, and whether it carries prompts) and the order the lanes last took
        # the first stage in (a count at each take)
        self._flight: list[tuple[float, bool] | None] = [None] * self.pp
        self._claim_no = [0] * self.pp
        self._claims = 0
        ff = config.fast_forward and self._iter_observer is None
        self._ff = FastForward(self) if ff and self.pp == 1 else None
        self._pf = PipeForward(self) if ff and self.pp > 1 else None
        self._preempted = False  # a preemption happened while planning this step
        self._handing: Sequence | None = None  # the sequence _hand_off is handing off
        self.iterations = 0
        self.busy_s = 0.0
        self.preemptions = 0
        # Failures: whether the instance serves, its life (bumped by each
        # failure: a loop of an earlier life stops), its speed (a throttled GPU
        # runs each iteration 1/speed as long), and who takes a sequence handed
        # to it while it is down.
        self.up = True
        self.life = 0
        self.speed = 1.0
        self._price_at(1.0)
        self.on_lost: Callable[[Sequence], None] | None = None
        # Scaling: starting | serving | draining | stopped (twin.scheduler.
        # INSTANCE_STATES), and who is told when a draining instance may be empty.
        self.state = "serving"
        self.on_idle: Callable[[Engine], None] | None = None
        # told of changes to the queue, role and health (twin.sim.control: a
        # sleeping tick's watch)
        self.watch: Any = None
        self._start_loops()

    def _start_loops(self) -> None:
        # each loop serves this life only (a failure and recovery at the same
        # instant, before the loop first runs, must not leave two serving)
        if self.pp == 1:
            self.process = self.env.process(self.serve(self.life))
        else:
            for lane in range(self.pp):
                self.process = self.env.process(self._serve_lane(lane, self.life))

    # -- what a router may look at -------------------------------------------------
    @property
    def running_requests(self) -> int:
        """Admitted sequences, and KV hand-offs this instance has reserved blocks for."""
        return len(self.running) + len(self.reserved)

    def decode_load(self) -> tuple[int, int]:
        """The decodes a prompt's iteration carries here: their count and context
        sum (pipelined, those of the lane with the most, the first of equals)."""
        if self.pp == 1:
            return self.decode_count, self.decode_ctx_sum
        lanes = [
            list(_lane_state(self)) if k == self._lane else self._lanes[k] for k in range(self.pp)
        ]
        best = max(lanes, key=lambda state: state[0])
        return best[0], best[1]

    # -- what the control loop changes ------------------------------------------------
    def set_role(self, role: str) -> None:
        """Serve as ``role`` from now on (what the router sends here follows it)."""
        if role not in ROLES:
            raise SpecError(
                f"instance {self.id}: role {role!r}; expected one of {', '.join(ROLES)}"
            )
        self.role = role
        if self.watch is not None:
            self.watch.changed(self)

    def set_limits(
        self, *, max_batched_tokens: int | None = None, max_num_seqs: int | None = None
    ) -> None:
        """Per-instance batching limits a policy's setup gives."""
        cfg = self.config
        self.config = dataclasses.replace(
            cfg,
            max_batched_tokens=max_batched_tokens or cfg.max_batched_tokens,
            max_num_seqs=max_num_seqs or cfg.max_num_seqs,
        )

    # -- failures --------------------------------------------------------------------
    def set_speed(self, speed: float) -> None:
        """Run at ``speed`` x the perf model's rate from the next iteration
        (the one in progress keeps its length); 1 is nominal."""
        self._interrupt()
        self.speed = speed
        self._price_at(speed)

    def _price_at(self, speed: float) -> None:
        """Seconds one iteration of a batch takes here at ``speed``: the perf
        model's own methods at speed 1 (no wrapper on the hot path); of a
        stretch of decode-only steps of one batch, in one call; and, pipelined,
        the stage times of such micro-batches of one lane."""
        timed = self.perf.iteration_time
        self.iteration_time: Callable[[Batch], float] = (
            timed if speed == 1.0 else (lambda batch: timed(batch) / speed)
        )
        steps = decode_steps(self.perf)
        self.decode_steps: DecodeSteps = (
            steps if speed == 1.0 else (lambda c, x, n: [d / speed for d in steps(c, x, n)])
        )
        staged = stage_steps(self.perf) if self.pp > 1 else None
        self.stage_steps: StageSteps | None = (
            staged
            if staged is None or speed == 1.0
            else (lambda c, x, n: _slowed(staged(c, x, n), speed))
        )

    def held(self) -> list[Sequence]:
        """Every sequence this instance holds: queued, admitted (any phase) and
        prefilled with its KV waiting here to move, in that order."""
        return (
            list(self.waiting)
            + list(self.running.values())
            + [s for s, _, _ in self.handoff.values()]
        )

    def fail(self) -> list[Sequence]:
        """The instance fails now: everything it holds is gone. Returns the
        sequences it held (see :meth:`held`), their produced-token counts and
        last-token times brought up to the last step that ended; the KV
        reserved here for incoming hand-offs is dropped with the rest. The
        iteration in progress never ends; the instance comes back empty
        (:meth:`recover`)."""
        self._interrupt()  # a stretch ends where the step in progress would have
        for lane in range(self.pp):
            self._use_lane(lane)
            for s in self.running.values():
                if s.state == DECODE and s.lane == lane:
                    self._close_gaps(s)
                    s.generated = s.g_join + (self.steps + 1 - s.d_join)
        lost = self.held()
        self.up = False
        if self.watch is not None:
            self.watch.changed(self)
        self.life += 1
        self._wake = None  # the loops of this life wait for it: they never wake
        self.queue_changes += 1
        self.waiting.clear()
        self.waiting_tokens = 0
        self.running.clear()
        self.prefilling.clear()
        self.handoff.clear()
        self._landed.clear()
        self.reserved.clear()
        fresh = [0, 0, 0, [], [], [], [], [], -1.0]
        for a, v in zip(_LANE_STATE, fresh, strict=True):
            setattr(self, a, v)
        self._lane = 0
        self._lanes = [[0, 0, 0, [], [], [], [], [], -1.0] for _ in range(self.pp)]
        self._stage_free = [0.0] * self.pp
        self._flight = [None] * self.pp
        self._claim_no = [0] * self.pp
        old = self.kv
        self.kv = BlockManager(old.total, old.block_size, old.watermark)
        self.kv.peak_used = old.peak_used
        if self.cache is not None:
            self.cache.on_freed = None  # its writes under way release blocks of the old life
            self.cache = PrefixCache(self.kv, self.cache.tiers)  # the tiers below stay
            self.cache.on_freed = self._written_down
        if self._ff is not None:
            self._ff = FastForward(self)
        if self._pf is not None:
            self._pf = PipeForward(self)
        return lost

    def recover(self) -> None:
        """The instance serves again, empty, from now."""
        self.up = True
        if self.watch is not None:
            self.watch.changed(self)
        self._start_loops()

    def drop(self, seq: Sequence) -> None:
        """Give up ``seq`` here, whose decode side failed: queued, prefilling
        (a chunk in the iteration under way is wasted) or prefilled with its
        KV waiting to move; everything it holds is freed."""
        rid = seq.req.id
        self._interrupt()
        self.queue_changes += 1
        if rid in self.handoff:
            _, blocks, units = self.handoff.pop(rid)
            self.kv.release(blocks)
            if units:
                assert self.cache is not None
                self.cache.release(units)
        elif self.running.get(rid) is seq:
            assert seq.state == PREFILL, f"request {rid} is {seq.state} on instance {self.id}"
            del self.running[rid]
            self.prefilling.remove(seq)
            self._drop_blocks(seq)
        else:
            self.waiting.remove(seq)
            self._waiting_moved(-seq.prefill_len)
        self._blocks_freed()

    def unreserve(self, seq: Sequence) -> None:
        """Decode side: give back the blocks reserved for ``seq``'s KV (its
        prefill side failed)."""
        self._interrupt()
        blocks, units = self.reserved.pop(seq.req.id)
        self.kv.release(blocks)
        if units:
            assert self.cache is not None
            self.cache.release(units)
        self._blocks_freed()

    # -- input -----------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        if seq.state == LOST:
            return  # its client gave up while its prefix was loading (twin.serving.abandon)
        if not self.up:  # it failed while the request was on its way (a KV-pool load)
            assert self.on_lost is not None
            self.on_lost(seq)
            return
        seq.instance = self.id
        seq.prefill_instance = self.id
        seq.mark("t_arrival", self.env.now)
        if self._ff is not None:
            self._ff.cut()
        elif self._pf is not None:
            self._pf.interrupt()
        self.waiting.append(seq)
        self._waiting_moved(seq.prefill_len)
        self.observer.request_queued(self.env.now, self.id, seq.req)
        self._poke()

    def _waiting_moved(self, tokens: int) -> None:
        """The queue's prompt tokens moved by ``tokens``; a sleeping tick's watch is told."""
        self.waiting_tokens += tokens
        if self.watch is not None:
            self.watch.queue(self)

    def reserve(self, seq: Sequence) -> bool:
        """Decode side: take the blocks ``seq``'s KV will land in, if they are
        free (less the watermark) and a running slot is open. They stay
        reserved (counted as running) until :meth:`receive`.

        With prefix caching, the leading prefix units of ``seq`` this
        instance holds are shared instead (held from now, so they cannot be
        evicted before the KV lands) and only the rest is reserved and moved;
        at least the prompt's last token always moves, as a prefill always
        computes it."""
        self.sync_blocks()
        kv = self.kv
        if self.running_requests >= self.config.max_num_seqs * self.pp:
            return False
        cache = self.cache
        hits: Sequence_[int] = ()
        if cache is not None:
            hashes = self.cacheable(seq.req)
            unit = seq.req.prefix_block_tokens
            hits = hashes[: min(cache.match(hashes), (seq.prefill_len - 1) // unit)] if unit else ()
        shared = len(hits) * (seq.req.prefix_block_tokens // kv.block_size)
        need = blocks_for(seq.prefill_len, kv.block_size) - shared
        if not self._fits(hits, need):
            return False
        ff, pf = self._ff, self._pf
        # a stretch may go on (nothing joins it) if its steps still find their blocks
        kept = ff.keeps(need) if ff is not None else pf is not None and pf.keeps(need)
        if not kept:
            self._interrupt()
        if not self._make_room(hits, need):
            return False  # the rest is being written down: tried again when it is
        kv.allocate(need)
        if kept and ff is not None and kv.watch is not None:
            kv.watch.stretch(self, ff.stretch)  # its steps now cross a threshold sooner
        self.reserved[seq.req.id] = (need, list(hits))
        return True

    def _fits(self, hits: Sequence_[int], need: int) -> bool:
        """Whether ``need`` blocks more (beside the cached units ``hits``, which
        they share) fit above the watermark: free, being written down, or held
        only by the prefix cache and evictable."""
        kv, cache = self.kv, self.cache
        if cache is None:
            return kv.can_admit(need)
        spare = kv.free + cache.writing_blocks + cache.evictable_blocks - cache.idle_blocks(hits)
        return spare - need >= kv.watermark

    def _make_room(self, hits: Sequence_[int], need: int) -> bool:
        """After :meth:`_fits`: hold ``hits`` and evict for ``need`` free blocks;
        False (``hits`` let go again) while some of them are still being
        written down."""
        cache = self.cache
        if cache is None:
            return True
        cache.acquire(hits)
        cache.evict(need)
        if self.kv.free < need:
            cache.release(hits)
            return False
        return True

    def reserved_prefix_tokens(self, seq: Sequence) -> int:
        """Decode side: prompt tokens of reserved ``seq`` whose KV is cached here
        (they do not move)."""
        return len(self.reserved[seq.req.id][1]) * seq.req.prefix_block_tokens

    def receive(self, seq: Sequence) -> None:
        """Decode side: ``seq``'s KV has landed in its reserved blocks; it
        decodes from the next step. With prefix caching, its whole prefix
        units are kept for later requests (as a prefill instance keeps the
        prompts it computes). A decode stretch under way takes it in where
        it can (:meth:`FastForward.lands`); otherwise it ends here."""
        ff = self._ff
        if ff is None or ff.stretch is None or self.cache is not None:
            self._interrupt()
            ff = None  # nothing takes it in: it joins at the next step boundary
        blocks, units = self.reserved.pop(seq.req.id)
        seq.blocks = blocks
        seq.units = units
        seq.shared_blocks = len(units) * (seq.req.prefix_block_tokens // self.kv.block_size)
        if self.cache is not None:
            self._cache_prompt(seq)
        seq.instance = self.id
        seq.handoff = False  # a recompute after a preemption happens here
        seq.state = INCOMING
        seq.epoch += 1
        self.running[seq.req.id] = seq
        if ff is None or not ff.lands(seq):
            if ff is not None:
                self._interrupt()
            self._landed.append(seq)  # joins at the next step boundary
        self._poke()

    def keep(self, seq: Sequence) -> None:
        """Prefill side: the decode instance picked for ``seq`` is this one, so
        its KV stays where it is; it decodes here from the next step, as a
        colocated request does (nothing moves, nothing is reserved). Picked as
        its prompt completes, it joins the batch at once, the iteration being
        over; picked later (its decode side failed), steps may be under way or
        the engine idle: it joins at the next step boundary, as a landed KV does."""
        outside = seq is not self._handing
        if outside:
            self._interrupt()
        _, blocks, units = self.handoff.pop(seq.req.id)
        seq.blocks = blocks
        seq.units = units
        seq.shared_blocks = len(units) * (seq.req.prefix_block_tokens // self.kv.block_size)
        seq.handoff = False
        self.running[seq.req.id] = seq
        if not outside:
            self._join_decode(seq)
            return
        seq.state = INCOMING
        self._landed.append(seq)
        self._poke()

    def release(self, seq: Sequence) -> None:
        """Prefill side: ``seq``'s KV has moved; free the blocks it held here."""
        self._interrupt()
        _, blocks, units = self.handoff.pop(seq.req.id)
        self.kv.release(blocks)
        if units:
            assert self.cache is not None
            self.cache.release(units)
        self._blocks_freed()

    def _written_down(self, blocks: int) -> None:
        """The write down of evicted prefix units has ended: their ``blocks``
        are free (and an admission waiting for them goes on)."""
        self._interrupt()
        self.kv.release(blocks)
        self._blocks_freed()

    def _interrupt(self) -> None:
        """A change from outside: end a fast-forwarded stretch at the step in progress."""
        if self._ff is not None:
            self._ff.interrupt()
        elif self._pf is not None:
            self._pf.interrupt()

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _blocks_freed(self) -> None:
        if self.waiting:
            self._poke()
        if self.hooks is not None:
            self.hooks.on_blocks_freed(self)
        if self.on_idle is not None:
            self.on_idle(self)

    def holds_work(self) -> bool:
        """Whether anything is queued, admitted, waiting to move or reserved here."""
        return bool(self.waiting or self.running or self.handoff or self._landed or self.reserved)

    def sync(self) -> None:
        """Bring the state up to now inside a fast-forwarded stretch, so that a
        reader sees what stepping would show at this instant."""
        if self._ff is not None:
            self._ff.sync()
        elif self._pf is not None:
            self._pf.sync()

    def sync_blocks(self) -> None:
        """:meth:`sync` for a reader of the free blocks only: the blocks the
        decode steps under way have taken (the steps that ended are applied later)."""
        if self._ff is not None:
            self._ff.sync_blocks()
        elif self._pf is not None:
            self._pf.sync_blocks()

    def watch_blocks(self, watch: Any) -> None:
        """From now ``watch`` (a sleeping tick's) is told of the free blocks: of a
        decode stretch under way, whose steps take them with no event; a
        pipelined stretch, which does not say when, ends here, and so does one
        whose steps evict prefix units (their blocks' taking is not timed)."""
        self.kv.watch = watch
        ff = self._ff
        if ff is not None and ff.stretch is not None:
            if self.cache is not None and self.cache.tiers is None:
                ff.interrupt()
            else:
                watch.stretch(self, ff.stretch)
        if self._pf is not None:
            self._pf.interrupt()

    # -- the loop --------------------------------------------------------------------
    def serve(self, life: int):  # noqa: ANN201 - a SimPy process
        """Form a batch, run it for the time the perf model gives, apply it;
        repeat, for as long as the instance's ``life`` lasts."""
        env = self.env
        if self.life != life:
            return  # it failed again before this loop first ran
        while True:
            batch, chunks, decoding = self._plan()
            if batch is None:  # decode only
                ff = self._ff
                if ff is not None:
                    stretch = ff.plan()
                    if stretch is not None:
                        if not stretch.dts[0] > 0.0:
                            self._bad_time(stretch.dts[0])
                        yield from ff.run(stretch)
                        if self.life != life:
                            return  # it failed during the stretch
                        continue
                batch = Batch((), self.decode_count, self.decode_ctx_sum)
            elif not chunks:  # an empty batch
                self._wake = env.event()
                yield self._wake
                self._wake = None
                if self.life != life:
                    return
                continue
            dt = self.iteration_time(batch)
            if not dt > 0.0:
                self._bad_time(dt)
            obs = self._iter_observer
            if obs is not None or chunks and self.hooks is not None:
                self._started(batch, chunks, dt)
            if chunks and self._ff is not None:  # prompts completing here may head a stretch
                stretch = self._ff.plan_head(chunks, dt, decoding)
                if stretch is not None:
                    yield from self._ff.run(stretch)
                    if self.life != life:
                        return
                    continue
            yield env.timeout(dt)
            if self.life != life:
                return  # it failed during the iteration: its work is lost
            self.iterations += 1
            self.busy_s += dt
            if obs is not None:
                obs.iteration_ended(env.now, self.id)
            self._complete(chunks, decoding)

    def _bad_time(self, dt: float) -> None:
        raise SpecError(f"perf model {self.perf.name!r} gave iteration time {dt!r} <= 0")

    def _serve_lane(self, lane: int, life: int):  # noqa: ANN201 - a SimPy process
        """One pipeline lane (``pp > 1``): wait for the first stage, form a
        micro-batch of this lane's work, let it pass every stage, apply it; repeat.
        Inside a fast-forwarded stretch (:mod:`twin.serving.pipeforward`) the lane
        waits until the stretch ends and its own event fires: it then completes
        the micro-batch it has in flight, or queues for the first stage."""
        env = self.env
        perf = self.perf
        assert isinstance(perf, Pipelined)
        free = self._stage_free
        pf = self._pf
        if self.life != life:
            return  # it failed again before this loop first ran
        while True:
            st = pf.stretch if pf is not None else None
            if st is not None:
                assert pf is not None
                if lane not in st.lanes:
                    # An idle lane woken at the instant another planned a stretch:
                    # stepping would queue it for the first stage and plan (nothing,
                    # unless a change comes first); end the stretch, stepping goes on.
                    pf.interrupt()
                    continue
                yield pf.wait(st, lane)
                if self.life != life:
                    return
                del st.wake[lane]
                resumed = st.resume.pop(lane, None)
                if resumed is not None:  # its micro-batch in flight has just ended
                    self._flight[lane] = None
                    self._use_lane(lane)
                    self.iterations += 1
                    self.busy_s += resumed[1]
                    self._complete([], True)
                    if not st.settled and pf.went(st, lane):
                        continue  # the stretch goes on with this lane's new batch
                continue
            if free[0] > env.now:  # the first stage holds the micro-batch before
                yield at(env, free[0])
                if self.life != life:
                    return
                continue
            self._use_lane(lane)
            planned, chunks, decoding = self._plan()
            batch = planned or Batch((), self.decode_count, self.decode_ctx_sum)
            if batch.is_empty:
                yield self._idle()
                if self.life != life:
                    return
                continue
            if planned is None and pf is not None and pf.plan(lane):
                continue  # a stretch covers it: wait in it with the other lanes
            first, later = perf.stage_times(batch)
            if self.speed != 1.0:
                first, later = first / self.speed, later / self.speed
            if not first > 0.0 or not later >= 0.0:
                raise SpecError(
                    f"perf model {perf.name!r} gave stage times {(first, later)!r}; "
                    "expected the first > 0 and the later >= 0"
                )
            t = env.now + first
            free[0] = t
            for k in range(1, self.pp):  # each stage takes the micro-batches in order
                t = (t if t > free[k] else free[k]) + later
                free[k] = t
            dt = t - env.now  # this micro-batch's latency through the pipeline
            obs = self._iter_observer
            if pf is not None:
                self._claims += 1
                self._claim_no[lane] = self._claims
                self._flight[lane] = (t, bool(chunks))
            self._started(batch, chunks, dt)
            yield at(env, t)
            if self.life != life:
                return
            self._flight[lane] = None
            self._use_lane(lane)
            self.iterations += 1
            self.busy_s += first  # the time the pipeline's entrance was taken
            if obs is not None:
                obs.iteration_ended(env.now, self.id)
            self._complete(chunks, decoding)

    def _idle(self) -> simpy.Event:
        """The event a lane with nothing to do waits on (shared by the lanes)."""
        if self._wake is None or self._wake.triggered:
            self._wake = self.env.event()
        return self._wake

    def _started(self, batch: Batch, chunks: list[tuple[Sequence, int]], dt: float) -> None:
        """Tell the iteration observer and the hand-off hooks that an iteration
        of ``batch`` (prefill ``chunks``) lasting ``dt`` starts now."""
        obs = self._iter_observer
        if obs is not None:
            obs.iteration_started(
                self.env.now, self.id, dt, tuple(s.req.id for s, _ in chunks), batch
            )
        if self.hooks is not None:
            for seq, n in chunks:
                if seq.handoff and seq.prefilled + n >= seq.prefill_len:
                    self.hooks.on_prefill_start(self, seq, dt)
                    if not seq.handoff:  # to decode here after all: its KV stays
                        self._note_decode_start([(seq, n)], False)

    def _use_lane(self, lane: int) -> None:
        """Make ``lane``'s decode bookkeeping the engine's (``pp > 1``)."""
        if lane == self._lane:
            return
        state = vars(self)  # plain attributes: one C-level read and one update
        self._lanes[self._lane] = list(_lane_state(self))
        state.update(zip(_LANE_STATE, self._lanes[lane], strict=True))
        self._lane = lane

    # -- planning --------------------------------------------------------------------
    def _plan(self) -> tuple[Batch | None, list[tuple[Sequence, int]], bool]:
        """This iteration's batch, its prefill chunks and whether it decodes. A
        decode-only batch is None: it is the decode aggregate, and a stretch
        prices it without building it."""
        cfg = self.config
        self._preempted = False
        if self._landed:
            for seq in self._landed:
                self._join_decode(seq)
            self._landed.clear()
        if cfg.chunked_prefill:
            decoding = self._prepare_decode()
            budget = cfg.max_batched_tokens - self.decode_count
            chunks = self._take_chunks(budget, chunked=True)
        else:
            chunks = self._take_chunks(cfg.max_batched_tokens, chunked=False)
            decoding = False
            if not chunks:
                decoding = self._prepare_decode()
        if chunks or decoding and self._first_gap:
            self._note_decode_start(chunks, decoding)
        if not chunks:
            return (None if decoding else _EMPTY), chunks, decoding
        prefill = tuple((n, s.prefilled) for s, n in chunks)
        if decoding:
            return Batch(prefill, self.decode_count, self.decode_ctx_sum), chunks, True
        return Batch(prefill), chunks, False

    def _note_decode_start(
        self, chunks: list[tuple[Sequence, int]], decoding: bool, now: float | None = None
    ) -> None:
        """A landed sequence's first iteration here that produces a token starts
        now (or at ``now``: a stretch notes it for the step it joins in)."""
        if now is None:
            now = self.env.now
        for s, n in chunks:  # landed, then preempted (or retried) before its first decode step
            if s.landed and not s.handoff and s.prefilled + n >= s.prefill_len:
                s.mark("t_decode_start", now)
        if decoding:
            step = self.steps + 1
            for s in self._first_gap:
                if s.landed and s.state == DECODE and s.d_join == step:
                    s.mark("t_decode_start", now)

    def _take_chunks(self, budget: int, *, chunked: bool) -> list[tuple[Sequence, int]]:
        """Prefill work for this iteration: continue partial prompts, then admit from
        the head of the queue (its policy's order) while the head fits."""
        chunks: list[tuple[Sequence, int]] = []
        if not self.prefilling and not self.waiting:
            return chunks
        lane = self._lane
        seats = self.config.max_num_seqs - self.decode_count  # in this lane
        for s in self.prefilling:
            if s.lane != lane:  # in another lane's micro-batch
                continue
            seats -= 1
            if budget <= 0:
                return chunks
            n = min(s.prefill_len - s.prefilled, budget)
            chunks.append((s, n))
            budget -= n
        kv = self.kv
        cache = self.cache
        now = self.env.now
        limit = self.config.max_num_seqs * self.pp
        while self.waiting and self.running_requests < limit and (self.pp == 1 or seats > 0):
            s = self.waiting[0]
            hits: Sequence_[int] = ()
            if cache is not None:
                hits = s.req.prefix_hashes[: cache.match(self._cacheable(s))]
            unit = s.req.prefix_block_tokens
            cached = min(max(len(hits) * unit, s.preloaded_tokens), s.prefill_len - 1)
            need = s.prefill_len - cached
            if budget <= 0 or (not chunked and chunks and need > budget):
                break
            shared = len(hits) * (unit // kv.block_size)
            need_blocks = blocks_for(s.prefill_len, kv.block_size) - shared
            if not self._fits(hits, need_blocks) or not self._make_room(hits, need_blocks):
                break  # (evicted blocks still being written: tried again when they are)
            self.waiting.popleft()
            self.queue_changes += 1
            self._waiting_moved(-s.prefill_len)
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
            self.running[s.req.id] = s
            self.prefilling.append(s)
            n = min(need, budget) if chunked else need
            chunks.append((s, n))
            budget -= n
        return chunks

    def _cacheable(self, s: Sequence) -> tuple[int, ...]:
        return self.cacheable(s.req)

    def cacheable(self, req: Request) -> tuple[int, ...]:
        """The prefix hashes of ``req`` whose blocks are whole units of its prompt."""
        return cacheable(req, self.kv.block_size)

    def cached_prefix_tokens(self, req: Request) -> int:
        """Prompt tokens of ``req`` whose KV this instance's prefix cache holds."""
        if self.cache is None:
            return 0
        self.sync_blocks()  # the units a stretch under way has evicted by now
        return self.cache.match(self.cacheable(req)) * req.prefix_block_tokens

    def _cache_prompt(self, s: Sequence) -> None:
        """The prompt is computed: offer its whole units to the prefix cache."""
        cache = self.cache
        assert cache is not None
        unit_blocks = s.req.prefix_block_tokens // self.kv.block_size
        new = self._cacheable(s)[len(s.units) :]
        # up to a unit another sequence cached: the chain continues from there
        n = cache.insert(new, unit_blocks)
        s.blocks -= n * unit_blocks
        s.shared_blocks += n * unit_blocks
        s.units += new[:n]

    def _drop_blocks(self, s: Sequence) -> None:
        """Give back everything ``s`` holds here: its blocks, its cached units."""
        self.kv.release(s.blocks)
        s.blocks = 0
        if s.units:
            assert self.cache is not None
            self.cache.release(s.units)
            s.units = []
        s.shared_blocks = 0

    def _prepare_decode(self) -> bool:
        """Give every decoding sequence the block its next token needs, preempting
        the most recently admitted sequences when memory runs out."""
        if self.decode_count == 0:
            return False
        step = self.steps + 1
        heap = self._alloc_heap
        kv = self.kv
        while heap and heap[0][0] <= step:
            _, _, epoch, s = heapq.heappop(heap)
            if epoch != s.epoch or s.state != DECODE:
                continue
            while kv.free == 0:
                if self.cache is not None and self.cache.evictable_blocks:
                    self.cache.evict(1, hold=False)  # the step cannot wait for a writer
                    continue
                self._preempt(self._victim())
                if s.state != DECODE:
                    break
            if s.state != DECODE:
                continue
            kv.allocate(1)
            s.blocks += 1
            bs = kv.block_size
            heapq.heappush(heap, (step + bs, s.req.id, s.epoch, s))
        return self.decode_count > 0

    def _victim(self) -> Sequence:
        if self._pick_victim is not None:
            lane = self._lane
            running = [s for s in self.running.values() if s.state == DECODE and s.lane == lane]
            victim = self._pick_victim(running)
            if not any(s is victim for s in running):
                raise SpecError(
                    f"queue policy {self.queue_policy!r}: victim() returned {victim!r}, "
                    "not one of the running requests it was given"
                )
            return victim  # type: ignore[return-value]  # one of ours, just checked
        for s in reversed(self.running.values()):
            if s.state == DECODE and s.lane == self._lane:
                return s
        raise AssertionError("no decoding sequence to preempt")

    def _preempt(self, s: Sequence) -> None:
        """Free ``s``'s blocks and queue it for recomputation, at the front
        (of the requests its queue policy ranks equal)."""
        step = self.steps + 1
        self._close_gaps(s)
        s.generated = s.g_join + (step - s.d_join)
        self.decode_count -= 1
        self.decode_ctx_sum -= s.length_at(step)
        del self.running[s.req.id]
        self._drop_blocks(s)
        s.epoch += 1
        s.state = WAITING
        s.preemptions += 1
        self.preemptions += 1
        self._preempted = True
        s.prefill_len = s.req.prompt_tokens + s.generated
        s.prefilled = 0
        self.queue_changes += 1
        self.waiting.appendleft(s)
        self._waiting_moved(s.prefill_len)
        self.observer.preempted(self.env.now, self.id, s.req)

    # -- applying an iteration -------------------------------------------------------
    def _complete(
        self, chunks: list[tuple[Sequence, int]], decoded: bool, now: float | None = None
    ) -> None:
        """Apply the iteration that has just ended (at ``now``, by default the
        present; a stretch applies its prompts' step later, at the instant it ended)."""
        if now is None:
            now = self.env.now
        if decoded:
            self._complete_decode_step(now)
        if chunks:
            self.queue_changes += 1  # the prompts computed moved on
        for s, n in chunks:
            if s.state == LOST:  # dropped during the iteration (its decode side failed)
                continue
            s.prefilled += n
            if s.prefilled < s.prefill_len:
                continue
            self.prefilling.remove(s)
            if self.cache is not None:
                self._cache_prompt(s)
            if self.on_prompt is not None:
                self.on_prompt(self, s)
            s.mark("t_prefill_done", now)  # a recompute (preempted, retried) keeps the first
            s.generated += 1
            if not s.mark("t_first_token", now):  # a recompute's token: a gap before it
                if s.landed and not s.handoff:  # where it stays (not for a new hand-off)
                    self._first_after_landing(s, now)
                elif s.moves and s.t_decode_start < 0.0:  # before a decode side took it up
                    s.landing_gap = max(s.landing_gap, now - s.t_last_token)
                elif now - s.t_last_token > s.max_gap:
                    s.max_gap = now - s.t_last_token  # the stall of a recompute
            s.t_last_token = now
            if s.generated >= s.req.output_tokens:
                self._finish(s, now)
            elif s.handoff:
                self._hand_off(s)
            else:
                self._join_decode(s)

    @staticmethod
    def _first_after_landing(s: Sequence, now: float) -> None:
        """The first token produced here after ``s``'s KV landed (token 2, or a
        recompute's). The gap since token 1 spans the hand-off and the gap since
        this side took it up does not; which one the client sees as an
        inter-token gap depends on where TTFT ends (the metrics decide)."""
        s.landed = False
        # the largest over its landings (a retry may move it again)
        s.landing_gap = max(s.landing_gap, now - s.t_last_token)
        s.decode_gap = max(s.decode_gap, now - (s.t_decode_start if s.t_decode_start >= 0 else now))

    def _hand_off(self, s: Sequence) -> None:
        del self.running[s.req.id]
        self.handoff[s.req.id] = (s, s.blocks, s.units)
        s.blocks = 0
        s.units = []
        s.shared_blocks = 0
        s.state = HANDOFF
        s.epoch += 1
        self.observer.prefilled(self.env.now, self.id, s.req)
        assert self.hooks is not None, "a hand-off needs hooks"
        self._handing = s  # a keep() from the hook is at the iteration's end
        self.hooks.on_prefilled(self, s)
        self._handing = None

    def _complete_decode_step(self, now: float) -> None:
        self.steps += 1
        step = self.steps
        if self._last_decode_end >= 0.0:
            self._push_gap(step, now - self._last_decode_end)
        self._last_decode_end = now
        for s in self._first_gap:
            if s.state == DECODE and s.d_join == step:
                s.mark("t_first_decode", now)
                gap = now - s.t_last_token
                if s.landed:
                    self._first_after_landing(s, now)
                elif gap > s.max_gap:
                    s.max_gap = gap
        self._first_gap.clear()
        self.decode_ctx_sum += self.decode_count
        heap = self._finish_heap
        while heap and heap[0][0] <= step:
            _, _, epoch, s = heapq.heappop(heap)
            if epoch != s.epoch or s.state != DECODE:
                continue
            self._close_gaps(s)
            self.decode_count -= 1
            self.decode_ctx_sum -= s.length_at(step + 1)
            s.generated = s.req.output_tokens
            self._finish(s, now)

    def _join_decode(self, s: Sequence) -> None:
        step = self.steps + 1
        s.state = DECODE
        s.lane = self._lane
        s.d_join = step
        s.g_join = s.generated
        self.decode_count += 1
        self.decode_ctx_sum += s.length_at(step)
        self._first_gap.append(s)
        rid = s.req.id
        heapq.heappush(
            self._finish_heap, (step + s.req.output_tokens - s.generated - 1, rid, s.epoch, s)
        )
        need_at = step + max(0, s.held_blocks * self.kv.block_size + 1 - s.length_at(step))
        heapq.heappush(self._alloc_heap, (need_at, rid, s.epoch, s))

    def _finish(self, s: Sequence, now: float) -> None:
        s.state = DONE
        s.mark("t_finish", now)
        s.t_last_token = now
        del self.running[s.req.id]
        self._drop_blocks(s)
        s.epoch += 1
        self.observer.request_ended(now, self.id, s.req, s, "completed", "")
        if self.hooks is not None:
            self.hooks.on_blocks_freed(self)
        if self.on_idle is not None:
            self.on_idle(self)

    # -- inter-token gaps ------------------------------------------------------------
    def _push_gap(self, step: int, gap: float) -> None:
        steps, vals = self._gap_steps, self._gap_vals
        while vals and vals[-1] <= gap:
            vals.pop()
            steps.pop()
        steps.append(step)
        vals.append(gap)
        if len(steps) > 4096:
            self._prune_gaps(step)

    def _prune_gaps(self, step: int) -> None:
        """Drop gaps from before every running sequence's first decode step."""
        lane = self._lane
        oldest = min(
            (s.d_join for s in self.running.values() if s.state == DECODE and s.lane == lane),
            default=step,
        )
        cut = bisect_left(self._gap_steps, oldest + 1)
        del self._gap_steps[:cut]
        del self._gap_vals[:cut]

    def _close_gaps(self, s: Sequence) -> None:
        """Fold the largest gap between two of ``s``'s decode steps into ``s.max_gap``."""
        i = bisect_left(self._gap_steps, s.d_join + 1)
        if i < len(self._gap_vals) and self._gap_vals[i] > s.max_gap:
            s.max_gap = self._gap_vals[i]
        if self.steps >= s.d_join:
            s.t_last_token = self._last_decode_end
