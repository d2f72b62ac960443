"""The simulation: builds a spec's cluster (:mod:`twin.sim.build`), runs it,
returns a Result. It is the cluster-operations protocol failures and scaling
act through (:class:`twin.sim.ops.ClusterOps`).

One :class:`Simulation` owns everything mutable of a run: the SimPy
environment, the engines, the scheduler instance and the random streams
(spawned from one ``numpy.random.SeedSequence(seed)``: ``workload`` and
``scheduler``). The same spec and inputs give byte-identical results.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from twin import _version
from twin._clock import arrival_at, at
from twin.errors import CapacityError, SpecError, TwinError
from twin.perf.iteration import PerfModel
from twin.perf.residuals import Residuals, read_residuals
from twin.request import Request
from twin.scheduler import FaultEvent, Reject, Route, decode_hook, event_hook
from twin.serving.cluster import Placement
from twin.serving.engine import Engine
from twin.serving.kvcache import blocks_for
from twin.serving.observer import InstanceInfo, Observer, broadcast
from twin.serving.sequence import DECODE, HANDOFF, INCOMING, LOST, PREFILL, Sequence
from twin.sim.build import build_cluster
from twin.sim.classmetrics import ByClass, class_slos, request_objectives
from twin.sim.control import ControlLoop, apply_plan
from twin.sim.faults import Faults
from twin.sim.fleet import ByModel, kv_limits, limits_for, model_weights, spec_policy, with_models
from twin.sim.intervals import attainment_scales, summary_intervals
from twin.sim.metrics import Metrics
from twin.sim.result import Result
from twin.sim.scaling import Scaler, ScalingKeys
from twin.sim.sessions import SessionDriver
from twin.sim.slowdown import slowdown_judge
from twin.sim.spec import ExperimentSpec, apply_overrides, load_spec, resolve_spec
from twin.sim.summary import (
    limit_warnings,
    run_warnings,
    saturation_warnings,
    trace_warnings,
)
from twin.sim.timeline import Timeline
from twin.sim.timeouts import ClientTimeouts
from twin.sim.trace import EventLog, TraceRecorder
from twin.workload.sessions import Sessions
from twin.workload.stream import file_sha256, iter_requests, trace_rates


class Simulation:
    """One run of one spec. ``requests`` replaces the spec's workload (tests and
    tools); ``on_row`` receives one dict per ended request; ``log`` collects an
    event trace ``(time, kind, instance, ...)`` when given (see
    :class:`twin.sim.trace.EventLog`); ``scheduler`` is a policy object to use
    instead of the spec's (an unregistered one, say); ``link_series_s`` keeps
    each link's bytes per time bucket of that width; ``trace`` (a
    :class:`twin.sim.trace.TraceRecorder`) records iteration and transfer spans;
    ``observers`` are told what happens as it happens
    (:class:`twin.serving.observer.Observer`); ``retention`` replaces a session
    workload's KV retention policy with one's own (an object with
    ``decide(session) -> (policy, ttl_s)``, :class:`twin.workload.sessions.Retention`);
    ``keep_requests`` keeps every
    request's row in the Result (``Result.requests``; memory grows with the
    run). An observer that wants every iteration (the log and the trace do)
    turns the engines' fast-forward off."""

    def __init__(
        self,
        spec: ExperimentSpec,
        *,
        requests: Iterable[Request] | None = None,
        on_row: Callable[[dict[str, Any]], None] | None = None,
        log: list[tuple] | None = None,
        perf: PerfModel | None = None,
        scheduler: Any | None = None,
        link_series_s: float | None = None,
        trace: TraceRecorder | None = None,
        observers: Iterable[Observer] = (),
        keep_requests: bool = False,
        retention: Any = None,
    ) -> None:
        self.spec = spec
        self._rows: list[dict[str, Any]] | None = [] if keep_requests else None
        if self._rows is not None:
            on_row = _tee(self._rows.append, on_row)
        self.env = simpy.Environment()
        seeds = np.random.SeedSequence(spec.seed).spawn(2)
        self.rng_workload = np.random.default_rng(seeds[0])
        self.rng_scheduler = np.random.default_rng(seeds[1])
        self._requests = requests
        self.observer = self._listeners(on_row, log, trace, observers, retention)
        self.scheduler = scheduler or spec_policy(spec)
        self._name = spec.scheduler if scheduler is None else type(scheduler).__name__
        self.cluster = build_cluster(
            spec, self.env, self.observer, self.scheduler, self.rng_scheduler,
            on_lost=self._lose, on_stranded=self._stranded, on_waiting=self._link_wait,
            perf=perf, link_series_s=link_series_s,
        )  # fmt: skip
        c = self.cluster
        self.engines, self.placements, self.view = c.engines, c.placements, c.view
        self.network, self.handoff, self.pools, self.tiers = c.network, c.handoff, c.pools, c.tiers
        self.capacity, self.perfs = c.capacity, c.perfs
        if trace is not None:
            trace.watch(self.engines)
        apply_plan(
            self.scheduler.setup(self.view), self.engines, spec.topology is not None,
            spec.scheduler,
        )  # fmt: skip
        self._arrived = 0
        self._stream_done = False
        self._stream_end: dict[str, float] = {}  # ran_out_s: when a trace ran out
        self.events = 0
        self._parked: list[Sequence] = []  # waiting for an instance to come back up
        self._link_timers: dict[int, int] = {}  # request id -> attempt whose link wait is timed
        self.faults = Faults(self, spec.events, spec.failures, spec.failure_seed, spec.seed,
                             spec.topology)  # fmt: skip
        self.scaler = Scaler(
            self, spec.scaling or ScalingKeys(), self._name, spec.groups, spec.topology,
            spec.gpus_per_node, model_weights(spec),
        )  # fmt: skip
        self.control = ControlLoop(
            self.env, self.scheduler, self._name, self.view, self.engines,
            spec.topology is not None, self.observer,
            arrivals_done=lambda: self._arrivals_done or self.settled(),
            all_ended=lambda: self.metrics.ended == self._arrived,
            on_roles=self._update_limits, scaler=self.scaler,
        )  # fmt: skip
        self._update_limits()
        self.observer.run_started(
            spec.name,
            [InstanceInfo(e.id, e.role, p.node, p.gpus)
             for e, p in zip(self.engines, self.placements, strict=True)],
            spec.topology,
        )  # fmt: skip

    def _listeners(
        self,
        on_row: Callable[[dict[str, Any]], None] | None,
        log: list[tuple] | None,
        trace: TraceRecorder | None,
        observers: Iterable[Observer],
        retention: Any,
    ) -> Observer:
        """Everything told of the run as it happens: the metrics (per class too),
        the client side (time-outs, sessions' next turns), the event log, the
        trace and the caller's observers, as one observer."""
        spec = self.spec
        timeout = spec.workload.timeout_s
        faults = bool(spec.events or spec.failures) or "retry" in spec.resolved or bool(timeout)
        self.residuals = spec_residuals(spec)
        scales = attainment_scales(self.residuals) if self.residuals is not None else None
        classes = spec.workload.classes
        slos = class_slos(spec.slo, classes) if classes else None
        self.objectives = request_objectives(spec.slo, classes)
        sd = slowdown_judge(spec.slo.slowdown, spec.perf, spec.model, spec.source, spec.base_dir)
        self.metrics = Metrics(
            spec.slo, on_row, spec.ttft_at, Timeline(spec.window_s), faults=faults,
            scales=scales or (), classes=slos, slowdown=sd,
        )  # fmt: skip
        subscribers: list[Observer] = [self.metrics]
        self.by_class = None
        if slos is not None:
            self.by_class = ByClass(classes, slos, spec.ttft_at, spec.window_s, faults)
            subscribers.append(self.by_class)
        self.by_model = ByModel(spec, faults)
        if spec.models:  # only then: a run of one model reads as before
            subscribers.append(self.by_model)
        self.timeouts = ClientTimeouts(self, timeout) if timeout is not None else None
        if self.timeouts is not None:
            subscribers.append(self.timeouts)
        if log is not None:
            subscribers.append(EventLog(log))
        if trace is not None:
            subscribers.append(trace)
        subscribers.extend(observers)
        self.sessions = None
        if isinstance(spec.workload.lengths, Sessions):
            self.sessions = SessionDriver(
                self.env, spec.workload.lengths, self._arrive_one, self._engine,
                retention if retention is not None else spec.engine.session_retention,
            )  # fmt: skip
            subscribers.append(self.sessions)
        return broadcast(subscribers)

    def add_instance(
        self, placement: Placement, role: str, tp: int, pp: int, ep: int, dp: int, model: str = ""
    ) -> Engine:
        """A new instance during the run (scaling), starting: built as the spec's
        are, in the state of the parts it runs on (it comes up failed on a
        failed node, say); ``model`` the model it serves, of several."""
        eng = self.cluster.add_instance(placement, role, tp, pp, ep, dp, starting=True, model=model)
        self.faults.placed(eng.id)
        return eng

    def instance_started(self, i: int) -> None:
        p, eng = self.placements[i], self.engines[i]
        self.observer.instance_up(self.env.now, i, InstanceInfo(i, eng.role, p.node, p.gpus))
        if i not in self.scaler.failed_starting:  # it serves: the waiting requests may go
            self._unpark()

    def instance_stopped(self, i: int) -> None:
        self.observer.instance_down(self.env.now, i)

    def capacity_changed(self) -> None:
        """Instances started or began draining: admission limits follow."""
        self._update_limits()

    @property
    def role_changes(self) -> list[tuple[float, int, str, str]]:
        """(time, instance, old role, new role), as the policy's moves took effect."""
        return self.control.role_changes

    @property
    def kv_bytes_fetched(self) -> float:
        return self.pools.bytes_fetched if self.pools is not None else 0.0

    def _update_limits(self) -> None:
        """Longest sequences that can always finish, even alone on an instance
        of their model (of the roles instances have now)."""
        self._limits = kv_limits(self.capacity, self.engines, self.view)

    # -- processes -------------------------------------------------------------------
    def _request_stream(self) -> Iterator[Request]:
        if self._requests is not None:
            return iter(self._requests)
        stream = iter_requests(self.spec.workload, self.rng_workload, self._stream_end)
        return with_models(stream, self.spec) if self.spec.models else stream

    def _engine(self, i: int) -> Engine:
        return self.engines[i]

    @property
    def _arrivals_done(self) -> bool:
        """Nothing more arrives: the stream is over and no session has a turn to send."""
        return self._stream_done and (self.sessions is None or self.sessions.live == 0)

    def arrive(self):  # a SimPy process
        """Feed requests in arrival order; route each one as it arrives."""
        env = self.env
        last = 0.0
        for req in self._request_stream():
            if req.arrival_s < last:
                raise SpecError(f"request {req.id}: arrival {req.arrival_s!r} s before {last!r} s")
            last = req.arrival_s
            if req.arrival_s > env.now:
                yield arrival_at(env, req.arrival_s)
            self._arrive_one(req)
        self._stream_done = True

    def _arrive_one(self, req: Request) -> None:
        """``req`` arrives now (from the stream, or a session's next turn)."""
        self._arrived += 1
        self.observer.request_arrived(self.env.now, req)
        admitted = self._admit(req)
        if admitted is not None:
            self._route(Sequence(admitted, self.env.now, self.objectives(admitted)))

    def _route(self, seq: Sequence) -> None:
        """Ask the policy where ``seq``'s next attempt runs, and send it there;
        while no instance can serve it, it waits for one to come back."""
        if seq.state == LOST:
            return  # its client gave up while it waited to be retried
        if self.timeouts is not None:
            self.timeouts.follow(seq)
        req = seq.req
        if not self._can_serve(req.model):
            self._parked.append(seq)
            deadline = req.arrival_s + self.spec.retry.deadline_s
            if deadline < float("inf"):
                at(self.env, deadline, lambda _ev: self._expire(seq))
            return
        decision = self.scheduler.route(req, self.view)
        if isinstance(decision, Reject):
            self.observer.request_ended(self.env.now, -1, req, None, "rejected", decision.reason)
            return
        if not isinstance(decision, Route):
            raise SpecError(
                f"scheduler {self.spec.scheduler!r}: route() returned {decision!r}; "
                "expected Route or Reject"
            )
        seq.attempt += 1
        seq.t_attempt = self.env.now
        self._dispatch(req, decision, seq)

    def _can_serve(self, model: str = "") -> bool:
        """An instance of ``model`` (or the only one) that prefills and one that decodes are up."""
        pre = dec = False
        for e, v in zip(self.engines, self.view.instances, strict=True):
            if e.up and e.state == "serving" and getattr(v, "model", "") in ("", model):
                pre = pre or e.role != "decode"
                dec = dec or e.role != "prefill"
        return pre and dec

    def _dispatch(self, req: Request, decision: Route, seq: Sequence | None = None) -> None:
        name = self.spec.scheduler
        p, d = decision.prefill, decision.decode
        n = len(self.engines)
        if not (isinstance(p, int) and 0 <= p < n) or not (
            d is None or isinstance(d, int) and 0 <= d < n
        ):
            raise SpecError(
                f"scheduler {name!r}: route for request {req.id} names {decision}; "
                f"instances are 0..{n - 1}"
            )
        for i in (p, d):
            if i is not None and not self.engines[i].up:
                raise SpecError(
                    f"scheduler {name!r}: request {req.id} routed to instance {i}, which is "
                    "down (InstanceView.up is False)"
                )
            if i is not None and self.engines[i].state != "serving":
                raise SpecError(
                    f"scheduler {name!r}: request {req.id} routed to instance {i}, which is "
                    f"{self.engines[i].state} (InstanceView.accepting is False)"
                )
        src = self.engines[p]
        if src.role == "decode":
            raise SpecError(
                f"scheduler {name!r}: request {req.id} routed to prefill on decode instance {p}"
            )
        if seq is None:
            seq = Sequence(req, self.env.now, self.objectives(req))
        if seq.generated + 1 >= req.output_tokens:
            pass  # done when the prompt (or a retry's recompute) is: its KV never moves
        elif d is not None and d != p:
            if self.engines[d].role == "prefill":
                raise SpecError(
                    f"scheduler {name!r}: request {req.id} routed to decode on prefill instance {d}"
                )
            if self.handoff is None:
                raise SpecError(
                    f"scheduler {name!r}: request {req.id} prefills on {p} and decodes on {d}; "
                    "moving KV needs a topology (cluster.topology)"
                )
            seq.handoff, seq.decode_instance = True, d
        elif d is None and src.role == "prefill":
            seq.handoff = True
        if decision.fetch_from is not None:
            if self.pools is None:
                raise SpecError(
                    f"scheduler {name!r}: request {req.id} fetches from node "
                    f"{decision.fetch_from!r}; the cluster has no KV pool (cluster.kv_pool)"
                )
            self.pools.fetch_then_submit(seq, src, decision.fetch_from, self._name)
        elif self.tiers is not None:
            self.tiers.submit(seq, src)  # after loading what its tiers hold
        else:
            src.submit(seq)

    def _admit(self, req: Request) -> Request | None:
        """The request to serve (``req``, or truncated to the context), or None
        when it ended here: longer than the context (``context_length``) or
        more KV than any instance holds (``exceeds_kv_capacity``, or an error)."""
        spec = self.spec
        limit = spec.part(req.model).max_model_len
        if limit is not None and req.prompt_tokens + req.output_tokens > limit:
            if spec.oversized != "truncate":
                self.observer.request_ended(
                    self.env.now, -1, req, None, "rejected", "context_length"
                )
                return None
            req = truncate(req, limit)
            self.metrics.truncated += 1
        bs = spec.engine.block_size
        need = blocks_for(req.prompt_tokens + req.output_tokens - 1, bs)
        max_prompt, max_blocks = limits_for(self._limits, req)
        if need <= max_blocks and blocks_for(req.prompt_tokens, bs) <= max_prompt:
            return req
        if spec.oversized != "error":
            self.observer.request_ended(
                self.env.now, -1, req, None, "rejected", "exceeds_kv_capacity"
            )
            return None
        holds = min(max_blocks, max_prompt)
        raise CapacityError(
            f"{spec.source}: request {req.id}: prompt {req.prompt_tokens} + output "
            f"{req.output_tokens} tokens need {need} KV blocks, but the smallest instance of "
            f"{spec.part(req.model).model.name} that would serve it holds {holds}; "
            "give instances more GPUs, or set engine.oversized: reject"
        )

    # -- failures --------------------------------------------------------------------
    def fail_instance(self, i: int) -> None:
        """Instance ``i`` fails now: what it held is lost, and so is every
        request bound to it elsewhere (KV on its way to it, or a prefill whose
        KV was to move there); each is retried or ends failed."""
        eng = self.engines[i]
        if eng.state == "starting":
            self.scaler.failed_while_starting(i)  # it comes up failed, unless repaired first
            return
        if not eng.up or eng.state == "stopped":
            return
        now = self.env.now
        lost = [(s, self.kv_tokens(s)) for s in eng.fail()]
        redirect = self.handoff is not None and self._can_redirect()
        for e in self.engines:
            if e is eng or not e.up:
                continue
            for s in e.held():
                if s.handoff and s.decode_instance == i and s.state != DECODE:
                    if redirect:  # its KV is still here: another decode instance takes it
                        assert self.handoff is not None
                        self.handoff.redirect(e, s)
                        continue
                    lost.append((s, self.kv_tokens(s)))
                    e.drop(s)
        self.observer.instance_down(now, i)
        for s, tokens in lost:
            s.state = LOST
            s.epoch += 1
            s.lost_tokens += tokens
            if self.handoff is not None:
                self.handoff.drop(s)
        for s, _ in lost:
            self._lose(s, i)
        if eng.state == "draining":  # nothing left to finish: its GPUs go
            self.scaler.stop(eng)
        self.scaler.recheck()

    def _can_redirect(self) -> bool:
        """Whether a hand-off bound for a failed decode instance can go to
        another: the policy picks decode instances, and one is up."""
        return decode_hook(self.scheduler) is not None and any(
            e.up and e.state == "serving" and e.role in ("decode", "mixed") for e in self.engines
        )

    def _link_wait(self, s: Sequence) -> None:
        """``s``'s transfer waits on a failed link: it waits at most until its
        retry deadline (one timer per attempt), then is given up."""
        deadline = s.req.arrival_s + self.spec.retry.deadline_s
        if math.isinf(deadline) or self._link_timers.get(s.req.id) == s.attempt:
            return
        self._link_timers[s.req.id] = s.attempt
        epoch = s.epoch
        at(self.env, max(deadline, self.env.now), lambda _ev: self._link_deadline(s, epoch))

    def fail_link(self, src: str, dst: str) -> None:
        assert self.network is not None
        self.network.fail_link(src, dst)

    def recover_link(self, src: str, dst: str) -> None:
        assert self.network is not None
        self.network.recover_link(src, dst)

    def scale_link(self, src: str, dst: str, factor: float) -> None:
        assert self.network is not None
        self.network.scale_link(src, dst, factor)

    def lose_host_memory(self, node: int) -> None:
        if self.pools is not None:
            self.pools.fail_node(node)  # the KV pool in its DRAM goes with it

    def fault_applied(self, event: FaultEvent) -> None:
        self.observer.fault_event(event.time_s, event)
        hook = event_hook(self.scheduler)
        if hook is not None:
            hook.on_event(event, self.view)

    def settled(self) -> bool:
        """Every request arrived has ended, or waits (parked) for an instance
        to come back, and no more arrive (but the next turns of those)."""
        held = sum(s.req.session is not None for s in self._parked)  # sessions waiting on them
        return (
            self._stream_done and self.metrics.ended + len(self._parked) == self._arrived
            and (self.sessions is None or self.sessions.live <= held)
        )  # fmt: skip

    def links_failed(self) -> None:
        """Links failed: the hand-offs they leave waiting wait at most until
        their requests' retry deadlines."""
        if self.handoff is None:
            return
        assert self.network is not None
        for e in self.engines:
            for s in e.held():
                t: Any = s.transfer
                t = getattr(t, "transfer", t)
                if t is not None and self.network.waits(t):
                    self._link_wait(s)

    def _link_deadline(self, s: Sequence, epoch: int) -> None:
        """The retry deadline of ``s`` whose transfer waited on a failed link:
        if it still waits (not repaired, landed or lost meanwhile), its flows
        are cancelled, the KV on both sides freed, and it is retried or ends
        failed (``link_down``)."""
        assert self.network is not None and self.handoff is not None
        if s.state == LOST or s.epoch != epoch:
            return
        t: Any = s.transfer
        t = getattr(t, "transfer", t)  # a layer-wise stream's flows
        if t is None or not self.network.waits(t):
            return
        e = self.engines[s.prefill_instance]
        s.lost_tokens += self.kv_tokens(s)
        e.drop(s)
        self.handoff.drop(s)
        s.state = LOST
        s.epoch += 1
        self._lose(s, e.id, "link_down")

    def recover_instance(self, i: int) -> None:
        """Instance ``i`` serves again, empty; the waiting requests are routed again."""
        eng = self.engines[i]
        self.scaler.repaired(i)
        if eng.up or eng.state != "serving":
            return  # up, still starting, or released
        eng.recover()
        self.observer.instance_up(self.env.now, i)
        self._unpark()

    def _unpark(self) -> None:
        """Route again the requests waiting for an instance (those not ended meanwhile)."""
        parked, self._parked = self._parked, []
        for s in (s for s in parked if s.state != LOST):
            self._route(s)

    @staticmethod
    def kv_tokens(s: Sequence) -> int:
        """Tokens whose KV ``s`` had computed (lost with its instance)."""
        if s.state == PREFILL:
            return s.prefilled
        if s.state in (HANDOFF, INCOMING, DECODE):
            return s.req.prompt_tokens + s.generated - 1
        return 0

    def _stranded(self, engine: Engine, s: Sequence) -> None:
        """A prefilled ``s`` that no live instance can decode: its KV is given
        up and it waits, as a new attempt, for a decode instance."""
        s.lost_tokens += self.kv_tokens(s)
        engine.drop(s)
        s.state = LOST
        s.epoch += 1
        self._lose(s, engine.id)

    def _end_stuck(self) -> None:
        """Nothing else can happen, and transfers wait on failed links no
        repair comes for: a hand-off's request ends failed (``link_down``), a
        KV-pool load is given up (the prefix is computed again)."""
        assert self.network is not None
        stuck = {t.id for t in self.network.stuck}
        if self.pools is not None:
            self.pools.give_up(stuck)
        if self.tiers is not None:
            self.tiers.give_up(stuck)
        for e in self.engines:
            for s in e.held():
                t = s.transfer
                t = getattr(t, "transfer", t)  # a layer-wise stream's flows
                if t is not None and getattr(t, "id", None) in stuck:
                    s.lost_tokens += self.kv_tokens(s)
                    e.drop(s)
                    assert self.handoff is not None
                    self.handoff.drop(s)
                    s.state = LOST
                    s.epoch += 1
                    seq = s.retry(self.env.now)
                    seq.lost_s += self.env.now - s.t_attempt
                    self.end_failed(seq, e.id, "link_down")
        for t in self.network.stuck:  # none of ours: stop them
            self.network.cancel(t)

    def _lose(self, old: Sequence, instance: int, why: str | None = None) -> None:
        """``old``'s attempt is over: retry per the policy, or end it failed
        (with ``why`` for the reason, when given, else the rule that stops it)."""
        now = self.env.now
        old.state = LOST
        seq = old.retry(now)
        seq.lost_s += now - old.t_attempt
        if self.timeouts is not None:
            self.timeouts.follow(seq)
        policy = self.spec.retry
        req = seq.req
        if seq.attempt >= policy.max_attempts:
            self.end_failed(seq, instance, why or "max_attempts")
            return
        when = now + policy.delay_s(seq.attempt)
        deadline = req.arrival_s + policy.deadline_s
        if when > deadline:
            self.end_failed(seq, instance, why or "retry_deadline")
            return
        at(self.env, when, lambda _ev: self._route(seq))

    def _expire(self, seq: Sequence) -> None:
        """The retry deadline of a request still waiting for an instance."""
        if any(s is seq for s in self._parked):
            self._parked.remove(seq)
            self.end_failed(seq, -1, "retry_deadline")

    def unpark(self, seq: Sequence) -> bool:
        """Take ``seq`` out of the requests waiting for an instance; whether it was there."""
        if any(s is seq for s in self._parked):
            self._parked.remove(seq)
            return True
        return False

    def drop_handoff(self, seq: Sequence) -> None:
        if self.handoff is not None:
            self.handoff.drop(seq)  # its transfer stops; a decode side's reservation is freed

    def end_failed(self, seq: Sequence, instance: int, reason: str) -> None:
        seq.state = LOST
        self.observer.request_ended(self.env.now, instance, seq.req, seq, "failed", reason)

    # -- running ---------------------------------------------------------------------
    def run(self) -> Result:  # noqa: C901
        env = self.env
        env.process(self.arrive())
        self.control.start()
        self.faults.start()
        events = 0
        step = env.step
        while True:
            try:
                while True:
                    step()
                    events += 1
            except simpy.core.EmptySchedule:
                pass
            if self.network is not None and self.network.stuck:
                self._end_stuck()
                continue
            if not self._parked:
                break
            # Nothing else can happen: no instance comes back for them.
            parked, self._parked = self._parked, []
            for s in parked:
                self.end_failed(s, -1, "no_instance_up")
        self.events = events
        self._check_conservation()
        summary = self.metrics.summary()
        summary["kv_bytes_transferred"] = self.handoff.bytes_moved if self.handoff else 0.0
        summary["kv_bytes_saved"] = self.handoff.bytes_saved if self.handoff else 0.0
        summary["kv_bytes_fetched"] = self.kv_bytes_fetched
        if (
            self.pools is not None
        ):  # GPU -> pool copies (only with a pool: runs without read as before)
            summary["kv_bytes_copied"] = self.pools.bytes_copied
            summary["kv_pool"] = self.pools.summary(self.metrics.prompt_tokens)  # per pool tier
        class_timelines = None
        if self.by_class is not None:  # only then: a run without classes reads as before
            summary["classes"] = self.by_class.summary()
            class_timelines = self.by_class.timeline_rows(self.metrics.last_end_s)
        if self.spec.models:
            summary["models"] = self.by_model.by_model(self)
        occupancy = None
        timeline = self.metrics.timeline_rows()
        if self.tiers is not None:
            summary["kv_tiers"] = self.tiers.summary(self.metrics.prompt_tokens)
            occupancy = self.tiers.occupancy(
                self.spec.window_s, self.metrics.last_end_s,
                [(r["start_s"], r["end_s"]) for r in timeline] or None,
            )  # fmt: skip
            for name, series in occupancy.items():  # per timeline window
                summary["kv_tiers"][name]["occupancy"] = {"window_s": self.spec.window_s, **series}
        if self.scaler.scaled or "scaling" in self.spec.resolved:  # given: gpu_seconds
            summary["gpu_seconds"] = self.scaler.gpu_seconds(self.metrics.last_end_s)
        links = self.network.link_stats() if self.network is not None else []
        if occupancy is not None and timeline:  # the same windows: up to the last end
            for name, series in occupancy.items():
                for row, mean in zip(timeline, series["mean_bytes"], strict=True):
                    row[f"{name}_bytes"] = mean
        if self.residuals is not None:  # only then: a run without reads as before
            att = self.metrics.scaled_attainment()
            summary["intervals"] = summary_intervals(
                summary, self.residuals, (att[0], att[1]) if att else None
            )
        faults = [e.at_s for e in self.spec.events if e.action in ("fail", "degrade")]
        warnings = [
            *run_warnings(summary),
            *limit_warnings(summary),
            *trace_warnings(self._stream_end.get("ran_out_s"), self.spec.workload.duration_s),
            *saturation_warnings(timeline, min(faults, default=None), self.spec.slo.target),
        ]
        if self.sessions is not None:
            summary["sessions"] = self.sessions.summary()
        if warnings:  # only then: a run that went as meant reads as before
            summary["warnings"] = warnings
        fault_log = self.faults.log() if self.spec.events or self.spec.failures else None
        return Result(
            self._header(), summary, self._instance_stats(), links, timeline, fault_log,
            request_rows=self._rows, class_timelines=class_timelines,
        )  # fmt: skip

    def _check_conservation(self) -> None:
        if self.metrics.ended != self._arrived:
            raise AssertionError(f"{self._arrived} requests arrived but {self.metrics.ended} ended")
        for e in self.engines:
            cached = e.cache.cached_blocks if e.cache is not None else 0
            idle = e.cache.evictable_blocks if e.cache is not None else 0
            if e.kv.free + cached != e.kv.total or idle != cached or e.holds_work():
                raise AssertionError(f"instance {e.id} ended with work or blocks held")

    def _header(self) -> dict[str, Any]:
        spec = self.spec
        sources = (
            {}
            if self._requests is not None
            else {p.name: file_sha256(p) for p in spec.workload.sources()}
        )
        # a trace replayed at its own times: its own rate and the rate replayed
        rates = trace_rates(self.spec.workload) if self._requests is None else None
        return {
            "tool": "pd-twin",
            "version": _version.__version__,
            "code_sha256": _version.code_sha256(),
            "spec": dict(spec.resolved),
            "spec_sha256": spec.sha256,
            "trace_sha256": sources,
            "profile_sha256": next((p.sha256 for p in self.perfs.values() if p.sha256), None),
            "perf_model": " + ".join(sorted(p.name for p in self.perfs.values())),
            "kv_blocks_per_instance": (
                self.engines[0].kv.total
                if len({e.kv.total for e in self.engines}) == 1
                else [e.kv.total for e in self.engines]
            ),
            **({"trace_rate_rps": rates} if rates else {}),
        }

    def _instance_stats(self) -> list[dict[str, Any]]:
        span = self.metrics.last_end_s
        return [
            {
                "id": e.id,
                "role": e.role,
                "node": v.node,
                "gpus": list(v.gpus),
                "kv_blocks": e.kv.total,
                "iterations": e.iterations,
                "busy_s": e.busy_s,
                "utilization": e.busy_s / span if span > 0 else 0.0,
                "preemptions": e.preemptions,
                "peak_kv_blocks": e.kv.peak_used,
            }
            for e, v in zip(self.engines, self.view.instances, strict=True)
        ]


def _tee(
    keep: Callable[[dict[str, Any]], None], then: Callable[[dict[str, Any]], None] | None
) -> Callable[[dict[str, Any]], None]:
    """An ``on_row`` that gives each row to ``keep`` and then to ``then``."""
    if then is None:
        return keep

    def both(row: dict[str, Any]) -> None:
        keep(row)
        then(row)

    return both


def spec_residuals(spec: ExperimentSpec) -> Residuals | None:
    """The residual table ``perf.residuals`` names, or ``None`` (no intervals)."""
    perf = spec.perf
    if not isinstance(perf, Mapping) or perf.get("residuals") is None:
        return None
    return read_residuals(perf["residuals"], f"{spec.source}: perf.residuals", spec.base_dir)


def truncate(req: Request, limit: int) -> Request:
    """``req`` cut to ``limit`` tokens of prompt plus output, as vLLM's
    ``truncate_prompt_tokens`` does: the prompt keeps its last ``limit - 1`` tokens at most,
    and the output is capped so that prompt + output <= limit (at least one token). NOTE:
    cutting the prompt's head shifts every block boundary, so a truncated prompt keeps no
    prefix hashes (it shares no cached prefix); one cut only in its output keeps them."""
    prompt = min(req.prompt_tokens, limit - 1)
    output = min(req.output_tokens, limit - prompt)
    if prompt == req.prompt_tokens:
        return dataclasses.replace(req, output_tokens=output)
    return dataclasses.replace(
        req, prompt_tokens=prompt, output_tokens=output, prefix_hashes=(), prefix_block_tokens=0
    )


def run(
    spec: str | Path | Mapping[str, Any] | ExperimentSpec = "quickstart",
    *,
    overrides: Iterable[str] = (),
    **options: Any,
) -> Result:
    """Run one experiment and return its :class:`Result`.

    ``spec`` is a YAML path, a bundled experiment's name, a mapping of the same
    keys as a spec file (``{"model": "llama-3.1-8b", "workload": {...}}``; paths
    in it are relative to the current folder), or an already loaded spec.
    ``overrides`` are ``key.path=value`` strings, as ``twin run --set`` takes;
    ``options`` go to :class:`Simulation` (``on_row``, ``trace``, ``observers``,
    ``requests``, ...). The result keeps every request's row for
    ``Result.requests`` unless ``keep_requests=False`` (for runs too long to
    hold in memory)."""
    overrides = tuple(overrides)
    options.setdefault("keep_requests", True)
    if isinstance(spec, ExperimentSpec):
        if overrides:
            raise TwinError("overrides apply to a spec being loaded, not to a loaded one")
        loaded = spec
    elif isinstance(spec, Mapping):
        data = copy.deepcopy(dict(spec))
        apply_overrides(data, overrides)
        loaded = resolve_spec(data, "<spec>", Path.cwd())
    else:
        loaded = load_spec(str(spec), overrides)
    return Simulation(loaded, **options).run()
