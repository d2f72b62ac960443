"""One serving instance: a continuous-batching loop, one SimPy event per iteration.

Each iteration is planned by :mod:`twin.serving.plan` (vLLM's v0 scheduler:
prefill first, in the order of the spec's queue policy; preemption by
recomputation when a decode step finds no free block; chunked prefill as
Sarathi-Serve), its decodes kept by :mod:`twin.serving.decodebatch` (work per
step that does not grow with the batch), and a stretch of decode steps in
which nothing changes is covered by one event (:mod:`twin.serving.fastforward`;
pipelined, every lane's micro-batches at once, :mod:`twin.serving.pipeforward`).
With pipeline parallelism (a :class:`~twin.perf.iteration.Pipelined` perf
model of ``pp`` stages) each of ``pp`` lanes runs its own loop
(:mod:`twin.serving.lanes`). Decoding speculatively
(:mod:`twin.serving.speculative`), each decode step verifies drafted tokens
and emits one or more tokens per sequence. The instance's faults (:mod:`twin.serving.faults`)
and the two sides of a KV hand-off (:mod:`twin.serving.sending`,
:mod:`twin.serving.receiving`) are collaborators of their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import simpy

from twin.errors import SpecError
from twin.perf.iteration import (
    Batch,
    DecodeSteps,
    PerfModel,
    StageSteps,
    pipeline_stages,
)
from twin.request import Request
from twin.serving import holding
from twin.serving.config import EngineConfig
from twin.serving.decodebatch import DecodeBatch, first_after_landing
from twin.serving.fastforward import FastForward
from twin.serving.faults import Faults
from twin.serving.kvcache import BlockManager, PrefixCache
from twin.serving.lanes import serve, serve_lane
from twin.serving.observer import Observer
from twin.serving.pipeforward import PipeForward
from twin.serving.plan import Planner
from twin.serving.ports import EngineHooks
from twin.serving.prefixunits import cacheable
from twin.serving.queuepolicy import (
    waiting_queue,
)
from twin.serving.receiving import Receiver
from twin.serving.sending import Sender
from twin.serving.sequence import (
    DONE,
    LOST,
    Sequence,
)
from twin.serving.speculative import Speculation

if TYPE_CHECKING:
    from twin.serving.tiers import TierChain  # the tiers a prefix cache writes down to

ROLES = ("mixed", "prefill", "decode")


def _check_role(instance_id: int, role: str) -> None:
    if role not in ROLES:
        raise SpecError(
            f"instance {instance_id}: role {role!r}; expected one of {', '.join(ROLES)}"
        )


class Engine:
    """A serving instance. ``submit`` hands it a request; what happens is reported
    to ``observer`` (a sequence's end among it, once, when its last token is out);
    ``hooks`` are the hand-off's (split serving), ``on_prompt`` is called as
    each prompt is computed (a KV pool keeps it), ``tiers`` are the KV tiers
    below its prefix cache (twin.serving.tiers), ``on_lost`` takes a sequence
    handed to it while it is down, and ``starting`` makes it an instance added
    during the run, down until :meth:`started`. All are given at construction."""

    # the prices of an iteration, of decode steps, of stage times (Faults.price_at)
    iteration_time: Callable[[Batch], float]
    decode_steps: DecodeSteps
    stage_steps: StageSteps | None

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
        speculation: Speculation | None = None,
        tiers: TierChain | None = None,
        on_lost: Callable[[Sequence], None] | None = None,
        starting: bool = False,
    ) -> None:
        _check_role(instance_id, role)
        self.env = env
        self.id = instance_id
        self.role = role
        self.hooks = hooks
        # the two sides of a KV hand-off; KV waiting to move, blocks reserved for KV coming
        self.sender = Sender(self)
        self.handoff = self.sender.held
        self.receiver = Receiver(self)
        self.reserved = self.receiver.reserved
        self.landed: list[Sequence] = []  # KV landed or kept here, joining at the next step
        self.perf = perf
        self.spec = speculation  # speculative decoding (twin.serving.speculative)
        self.kv = blocks
        self.cache = (
            PrefixCache(blocks, tiers, on_freed=self.written_down)
            if config.prefix_caching
            else None
        )
        self.config = config
        self.observer = observer
        self.iteration_observer = observer if observer.wants_iterations else None
        self.on_prompt = on_prompt
        # the queue, in the order of the spec's queue policy (a deque: FCFS)
        self.queue_policy = config.queue_policy.build()
        self.waiting = waiting_queue(self.queue_policy)
        self.waiting_tokens = 0
        # bumped by every change to the queue and the prompts being computed but
        # a request joining the queue's back (what a queue estimate may keep)
        self.queue_changes = 0
        # Every admitted sequence, in admission order (the last is the first victim).
        self.running: dict[int, Sequence] = {}
        self.prefilling: list[Sequence] = []  # admitted, prompt not fully computed
        self._wake: simpy.Event | None = None
        self.pp = pipeline_stages(perf)
        if speculation is not None and self.pp > 1:
            raise SpecError(
                f"instance {instance_id}: engine.speculative with pp={self.pp}; speculative "
                "decoding runs on one pipeline stage (as in vLLM)"
            )
        # each lane's decode batch (one but with pp > 1), the lane being planned or
        # completed and its batch, when each pipeline stage is done with its micro-batches
        self.lanes = [DecodeBatch(blocks.block_size, k, speculation) for k in range(self.pp)]
        self.lane = 0
        self.batch = self.lanes[0]
        self.stage_free = [0.0] * self.pp
        # ... and, for their fast-forward, each lane's micro-batch in flight (its end, whether
        # it carries prompts) and the order the lanes last took the first stage (a count)
        self.flight: list[tuple[float, bool] | None] = [None] * self.pp
        self.claim_no = [0] * self.pp
        self.claims = 0
        # a speculative instance steps (its contexts do not grow one token a step)
        ff = config.fast_forward and self.iteration_observer is None and speculation is None
        self.ff = FastForward(self) if ff and self.pp == 1 else None
        self.pf = PipeForward(self) if ff and self.pp > 1 else None
        self.planner = Planner(self)
        self.iterations = 0
        self.busy_s = 0.0
        self.preemptions = 0
        # Failures (twin.serving.faults): whether it serves, its life (a loop of an earlier
        # life stops), its speed, and who takes a sequence handed to it while it is down.
        self.up = not starting
        self.life = 0
        self.speed = 1.0
        self.faults = Faults(self)
        self.faults.price_at(1.0)
        self.on_lost = on_lost
        # Scaling: starting | serving | draining | stopped (twin.scheduler.
        # INSTANCE_STATES), and who is told when a draining instance may be empty.
        self.state = "starting" if starting else "serving"
        self.on_idle: Callable[[Engine], None] | None = None
        # told of changes to the queue, role and health (a sleeping tick's: twin.sim.control)
        self.watch: Any = None
        self.start_loops()

    def start_loops(self) -> None:
        # each loop serves this life only (a failure and recovery at the same
        # instant, before the loop first runs, must not leave two serving)
        if self.pp == 1:
            self.process = self.env.process(serve(self, self.ff, self.life))
        else:
            for lane in range(self.pp):
                self.process = self.env.process(serve_lane(self, self.pf, lane, self.life))

    # -- what a router may look at -------------------------------------------------
    @property
    def running_requests(self) -> int:
        """Admitted sequences, and KV hand-offs this instance has reserved blocks for."""
        return len(self.running) + len(self.reserved)

    def decode_load(self) -> tuple[int, int]:
        """The decodes a prompt's iteration carries here: their count and context
        sum (pipelined, those of the lane with the most, the first of equals)."""
        best = max(self.lanes, key=lambda b: b.count)
        return best.count, best.ctx_sum

    # -- what the control loop changes ------------------------------------------------
    def set_role(self, role: str) -> None:
        """Serve as ``role`` from now on (what the router sends here follows it)."""
        _check_role(self.id, role)
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

    # -- failures ----------------------------------------------------------------------
    def set_speed(self, speed: float) -> None:
        """See :meth:`Faults.set_speed`."""
        self.faults.set_speed(speed)

    def fail(self) -> list[Sequence]:
        """See :meth:`Faults.fail`."""
        return self.faults.fail()

    def recover(self) -> None:
        """See :meth:`Faults.recover`."""
        self.faults.recover()

    # -- scaling: starting -> serving -> draining -> stopped ---------------------------
    def started(self) -> None:
        """An instance added during the run is done starting: it serves from now."""
        assert self.state == "starting"
        self.up = True
        self.state = "serving"

    def drain(self, on_idle: Callable[[Engine], None]) -> None:
        """Take nothing new, finish what it holds; ``on_idle`` is told each time
        it may be empty."""
        self.state = "draining"
        self.on_idle = on_idle

    def stop(self) -> None:
        """Its GPUs are released now: it serves nothing again, and the loops of
        its life wait on nothing that comes."""
        self.interrupt()  # the steps that ended by now stay, as stepping has them
        self.state = "stopped"
        self.on_idle = None
        self.up = False
        self.stop_loops()

    def stop_loops(self) -> None:
        """End this life: its loops wait for an event that never comes, and the
        fast-forward starts afresh, so that the step in progress of a stretch
        never ends (as the iteration in progress of stepping never does)."""
        self.life += 1
        self._wake = None
        if self.ff is not None:
            self.ff = FastForward(self)
        if self.pf is not None:
            self.pf = PipeForward(self)

    def held(self) -> list[Sequence]:
        """Every sequence this instance holds: queued, admitted (any phase) and
        prefilled with its KV waiting here to move, in that order."""
        return [*self.waiting, *self.running.values(), *(s for s, _, _ in self.handoff.values())]

    def drop(self, seq: Sequence) -> None:
        """See :meth:`Sender.drop`."""
        self.sender.drop(seq)

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
        if self.ff is not None:
            self.ff.cut()
        elif self.pf is not None:
            self.pf.interrupt()
        self.waiting.append(seq)
        self.waiting_moved(seq.prefill_len)
        self.observer.request_queued(self.env.now, self.id, seq.req)
        self.poke()

    def waiting_moved(self, tokens: int) -> None:
        """The queue's prompt tokens moved by ``tokens``; a sleeping tick's watch is told."""
        self.waiting_tokens += tokens
        if self.watch is not None:
            self.watch.queue(self)

    def written_down(self, blocks: int) -> None:
        """The write down of evicted prefix units has ended: their ``blocks``
        are free (and an admission waiting for them goes on)."""
        self.interrupt()
        self.kv.release(blocks)
        self.blocks_freed()

    def interrupt(self) -> None:
        """A change from outside: end a fast-forwarded stretch at the step in progress."""
        forward = self.ff or self.pf
        if forward is not None:
            forward.interrupt()

    def poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def blocks_freed(self) -> None:
        if self.waiting:
            self.poke()
        if self.hooks is not None:
            self.hooks.on_blocks_freed(self)
        if self.on_idle is not None:
            self.on_idle(self)

    def holds_work(self) -> bool:
        """Whether anything is queued, admitted, waiting to move or reserved here."""
        return bool(self.waiting or self.running or self.handoff or self.landed or self.reserved)

    def sync(self) -> None:
        """Bring the state up to now inside a fast-forwarded stretch, so that a
        reader sees what stepping would show at this instant."""
        forward = self.ff or self.pf
        if forward is not None:
            forward.sync()

    def sync_blocks(self) -> None:
        """:meth:`sync` for a reader of the free blocks only: the blocks the
        decode steps under way have taken (the steps that ended are applied later)."""
        forward = self.ff or self.pf
        if forward is not None:
            forward.sync_blocks()

    def watch_changes(self, watch: Any) -> None:
        """From now ``watch`` (a sleeping tick's) is told of changes to the
        queue, role and health (:meth:`watch_blocks`: and of free blocks)."""
        self.watch = watch

    def unwatch(self) -> None:
        """No watch is told anything from now."""
        self.watch = None
        self.kv.watch = None

    def watch_blocks(self, watch: Any) -> None:
        """From now ``watch`` (a sleeping tick's) is told of the free blocks: of a
        decode stretch under way, whose steps take them with no event; a
        pipelined stretch, which does not say when, ends here, and so does one
        whose steps evict prefix units (their blocks' taking is not timed)."""
        self.kv.watch = watch
        forward = self.ff or self.pf
        if forward is not None:
            forward.watch_blocks(watch)

    # -- the loops (twin.serving.lanes) ------------------------------------------------
    def idle(self) -> simpy.Event:
        """The event a lane with nothing to do waits on (shared by the lanes)."""
        if self._wake is None or self._wake.triggered:
            self._wake = self.env.event()
        return self._wake

    def iteration_starts(self, batch: Batch, chunks: list[tuple[Sequence, int]], dt: float) -> None:
        """Tell the iteration observer and the hand-off hooks that an iteration
        of ``batch`` (prefill ``chunks``) lasting ``dt`` starts now."""
        obs = self.iteration_observer
        if obs is not None:
            obs.iteration_started(
                self.env.now, self.id, dt, tuple(s.req.id for s, _ in chunks), batch
            )
        if self.hooks is not None:
            for seq, n in chunks:
                if seq.handoff and seq.prefilled + n >= seq.prefill_len:
                    self.hooks.on_prefill_start(self, seq, dt)
                    if not seq.handoff:  # to decode here after all: its KV stays
                        self.planner.note_decode_start([(seq, n)], False, self.env.now)

    def use_lane(self, lane: int) -> None:
        """Make ``lane``'s decode bookkeeping the engine's (``pp > 1``)."""
        self.lane = lane
        self.batch = self.lanes[lane]

    # -- the prefix cache --------------------------------------------------------------
    def cacheable(self, req: Request) -> tuple[int, ...]:
        """The prefix hashes of ``req`` whose blocks are whole units of its prompt."""
        return cacheable(req, self.kv.block_size)

    def cached_prefix_tokens(self, req: Request) -> int:
        """Prompt tokens of ``req`` whose KV this instance's prefix cache holds."""
        if self.cache is None:
            return 0
        self.sync_blocks()  # the units a stretch under way has evicted by now
        return self.cache.match(self.cacheable(req)) * req.prefix_block_tokens

    # -- applying an iteration -------------------------------------------------------
    def complete(
        self, chunks: list[tuple[Sequence, int]], decoded: bool, now: float | None = None
    ) -> None:
        """Apply the iteration that has just ended (at ``now``, by default the
        present; a stretch applies its prompts' step later, at the instant it ended)."""
        if now is None:
            now = self.env.now
        if decoded:
            self.batch.step(now, self.finish)
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
                holding.cache_prompt(self.kv, self.cache, s)
            if self.on_prompt is not None:
                self.on_prompt(self, s)
            s.mark("t_prefill_done", now)  # a recompute (preempted, retried) keeps the first
            s.generated += 1
            if not s.mark("t_first_token", now):  # a recompute's token: a gap before it
                if s.landed and not s.handoff:  # where it stays (not for a new hand-off)
                    first_after_landing(s, now)
                elif s.moves and s.t_decode_start < 0.0:  # before a decode side took it up
                    s.landing_gap = max(s.landing_gap, now - s.t_last_token)
                elif now - s.t_last_token > s.max_gap:
                    s.max_gap = now - s.t_last_token  # the stall of a recompute
            s.t_last_token = now
            if s.generated >= s.req.output_tokens:
                self.finish(s, now)
            elif s.handoff:
                self.sender.hand_off(s)
            else:
                self.batch.join(s)

    def finish(self, s: Sequence, now: float) -> None:
        s.state = DONE
        s.mark("t_finish", now)
        s.t_last_token = now
        del self.running[s.req.id]
        holding.drop(self.kv, self.cache, s)
        s.epoch += 1
        self.observer.request_ended(now, self.id, s.req, s, "completed", "")
        if self.hooks is not None:
            self.hooks.on_blocks_freed(self)
        if self.on_idle is not None:
            self.on_idle(self)
