"""A run of several models on one cluster (``models:``, :mod:`twin.sim.fleetspec`).

Each request names its model (``Request.model``), drawn by the models'
shares from a stream of its own (spawned from the seed beside the workload's
and the scheduler's, so the arrivals and lengths stay what they are), or,
when no model gives a share, read from the trace's ``model`` column. Each
model has a policy of its own over a view of its own instances
(:class:`ModelView`: the cluster as a one-model policy knows it, its SLO the
model's), as llm-d's gateway routes by the request's ``model`` to that
model's pool and its endpoint picker. :class:`Fleet` is the run's policy:
it asks the model's policy to route an arrival and to pick the decode
instance of its hand-off, and refuses a decision that names another model's
instance (KV never moves between models). A policy's setup, ticks and fault
hooks see its model's view alone. :class:`ByModel` folds each model's
requests into figures of its own, judged against the model's SLO, with the
GPU-seconds its instances held.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import (
    AddInstance,
    ClusterView,
    FaultEvent,
    InstanceView,
    Objectives,
    Plan,
    Route,
    build_scheduler,
    decode_hook,
    event_hook,
    tick_hook,
)
from twin.sim.classmetrics import ByClass, figures
from twin.sim.fleetspec import MODEL_NAMES
from twin.sim.metrics import Metrics
from twin.sim.timeline import Timeline
from twin.workload.columns import request_labels

MODEL_STREAM = 2
"""The child of the seed's SeedSequence that draws each request's model (0
and 1 are the workload's and the scheduler's)."""


def with_models(requests: Iterator[Request], spec: Any) -> Iterator[Request]:
    """``requests`` of ``spec`` (a spec of several models), each naming its
    model: drawn by the models' shares at its arrival (each share times its
    model's ``rate_schedule`` then), or the trace's ``model`` column when the
    models give no share."""
    parts, wl = spec.models, spec.workload
    names = [p.name for p in parts]
    if parts[0].share is None:
        index = {n: k for k, n in enumerate(names)}
        labels = request_labels(wl.trace, wl.format, MODEL_NAMES, index, wl.repeat, wl.skip)
        for req, k in zip(requests, labels):  # noqa: B905 (the labels run on past the last)
            yield dataclasses.replace(req, model=names[k])
        return
    shares = np.array([p.share for p in parts])
    timed = [(k, p.schedule) for k, p in enumerate(parts) if p.schedule is not None]
    rng = np.random.default_rng(np.random.SeedSequence(spec.seed).spawn(MODEL_STREAM + 1)[-1])
    for req in requests:
        w = shares
        if timed:
            w = shares.copy()
            for k, schedule in timed:
                w[k] *= float(schedule.rate(req.arrival_s))
        cum = np.cumsum(w)
        k = min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(names) - 1)
        yield dataclasses.replace(req, model=names[k])


def model_weights(spec: Any) -> dict[str, float]:
    """The weight bytes an instance of each model loads (by name; "" with one)."""
    if not spec.models:
        return {"": spec.model.weight_bytes}
    return {p.name: p.spec.model.weight_bytes for p in spec.models}


def model_of(instance: InstanceView) -> str:
    """The model ``instance`` serves ("" on a cluster of one, or a view without it)."""
    return getattr(instance, "model", "")


def kv_limits(
    capacity: Sequence[int], engines: Sequence[Any], view: ClusterView
) -> dict[str, tuple[int, int]]:
    """Per model (by name; "" with one): the most KV blocks a prompt, and a
    whole sequence, may need to always finish, even alone on an instance:
    the least ``capacity`` of its live (serving or starting) instances that
    prefill, and that decode (0 while it has none)."""
    out = {model_of(v): (math.inf, math.inf) for v in view.instances}
    for c, e, v in zip(capacity, engines, view.instances, strict=True):
        if e.state in ("serving", "starting"):
            prompt, whole = out[model_of(v)]
            out[model_of(v)] = (
                min(prompt, c) if e.role != "decode" else prompt,
                min(whole, c) if e.role != "prefill" else whole,
            )
    return {m: (_finite(p), _finite(w)) for m, (p, w) in out.items()}


def _finite(blocks: float) -> int:
    return 0 if math.isinf(blocks) else int(blocks)


def limits_for(limits: dict[str, tuple[int, int]], req: Request) -> tuple[int, int]:
    """``req``'s model's limits of :func:`kv_limits` (one model: the only ones)."""
    got = limits.get(req.model)
    if got is not None:
        return got
    if set(limits) == {""}:
        return limits[""]
    raise SpecError(f"request {req.id} names model {req.model!r}, not one of {', '.join(limits)}")


class ModelView(ClusterView):
    """The instances of one model of ``base`` (a cluster's view) with that
    model's objectives: what the model's policy sees. Ids are the cluster's;
    ``view[i]`` of another model's instance is an IndexError."""

    __slots__ = ("_base", "_model", "_mine", "_seen")

    def __init__(self, base: ClusterView, model: str, slo: Objectives):
        # the base's clock, pools, stream and fabric; the instances are the model's
        self._base, self._model = base, model
        self._mine: tuple[InstanceView, ...] = ()
        self._seen = -1  # the cluster's instances when _mine was made
        self.fabric, self._now, self._pools, self.rng = base.fabric, base._now, None, base.rng
        self.slo = slo

    @property
    def instances(self) -> tuple[InstanceView, ...]:  # type: ignore[override]
        base = self._base.instances
        if len(base) != self._seen:  # the cluster grew (scaling)
            self._mine = tuple(i for i in base if model_of(i) == self._model)
            self._seen = len(base)
        return self._mine

    def owns(self, instance_id: object) -> bool:
        """Whether ``instance_id`` is an instance of this model."""
        base = self._base
        return (
            isinstance(instance_id, int)
            and 0 <= instance_id < len(base)
            and model_of(base[instance_id]) == self._model
        )

    def grow(self, instance: InstanceView) -> None:
        raise AssertionError("a model's view follows its cluster's; grow the cluster's")

    def __getitem__(self, instance_id: int) -> InstanceView:
        if not self.owns(instance_id):
            raise IndexError(f"instance {instance_id} is not one of model {self._model!r}'s")
        return self._base[instance_id]

    def __len__(self) -> int:
        return len(self.instances)


class Fleet:
    """The policy of a run of several models: each model's own policy over
    its :class:`ModelView` (``make``: each made by it, not by the spec)."""

    def __init__(self, spec: Any, make: Callable[[], Any] | None = None) -> None:
        self.parts = spec.models
        self.groups = spec.groups
        self.budget: int | None = spec.gpu_budget
        self.policies = {
            p.name: make() if make is not None else build_scheduler(
                p.spec.scheduler, p.spec.scheduler_params, where=f"{p.spec.source}: scheduler"
            )
            for p in self.parts
        }  # fmt: skip
        self.views: dict[str, ModelView] = {}
        self._slos = {p.name: Objectives(p.spec.slo.ttft_s, p.spec.slo.tpot_s) for p in self.parts}

    def _view(self, model: str, req: Request | None = None) -> ModelView:
        v = self.views.get(model)
        if v is None:
            which = f"request {req.id} names model {model!r}" if req else f"model {model!r}"
            raise SpecError(f"{which}; the cluster serves {', '.join(self.policies)} (models:)")
        return v

    def _own(self, model: str, instance: object, what: str) -> None:
        if instance is not None and not self.views[model].owns(instance):
            raise SpecError(
                f"scheduler {self.parts_name(model)!r} of model {model!r}: {what} names "
                f"instance {instance!r}, which is not one of the model's"
            )

    def parts_name(self, model: str) -> str:
        return next(p.spec.scheduler for p in self.parts if p.name == model)

    def setup(self, cluster: ClusterView) -> Plan:
        roles: dict[int, Any] = {}
        tokens: dict[int, int] = {}
        seqs: dict[int, int] = {}
        for name, policy in self.policies.items():
            view = self.views[name] = ModelView(cluster, name, self._slos[name])
            plan = policy.setup(view)
            for i in (*plan.roles, *plan.max_batched_tokens, *plan.max_num_seqs):
                self._own(name, i, "setup()'s plan")
            roles.update(plan.roles)
            tokens.update(plan.max_batched_tokens)
            seqs.update(plan.max_num_seqs)
        return Plan(roles, tokens, seqs)

    def route(self, req: Request, view: ClusterView) -> Any:
        decision = self.policies[req.model].route(req, self._view(req.model, req))
        if isinstance(decision, Route):
            self._own(req.model, decision.prefill, f"route() for request {req.id}")
            self._own(req.model, decision.decode, f"route() for request {req.id}")
        return decision

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        hook = decode_hook(self.policies[req.model])
        if hook is None:
            raise SpecError(
                f"scheduler {self.parts_name(req.model)!r} of model {req.model!r}: route() "
                "left the decode instance open but the policy has no pick_decode()"
            )
        d = hook.pick_decode(req, self._view(req.model, req))
        self._own(req.model, d, f"pick_decode() for request {req.id}")
        return d

    def on_event(self, event: FaultEvent, view: ClusterView) -> None:
        for name, policy in self.policies.items():
            hook = event_hook(policy)
            if hook is not None:
                hook.on_event(event, self.views[name])


class TickingFleet(Fleet):
    """A :class:`Fleet` some of whose policies tick: it ticks at the shortest
    of their periods and ticks each policy when its own period has passed.

    With a GPU budget (``gpu_budget``) it is the arbiter of the GPUs the
    models share: the instances a tick adds are granted, those of the model
    under the most pressure first (queued and running requests per GPU it
    holds), while the GPUs held by every instance not yet stopped (starting
    and draining ones included) stay within the budget; the others are
    refused for this tick (the policy asks again at its next). A model's
    instances drain and release their GPUs before another's may start on
    them, each paying its own model's weights and warm-up."""

    def __init__(self, spec: Any, make: Callable[[], Any] | None = None) -> None:
        super().__init__(spec, make)
        self._ticks = {
            name: hook for name, p in self.policies.items()
            if (hook := tick_hook(p, self.parts_name(name))) is not None
        }  # fmt: skip
        self.tick_s = min(h.tick_s for h in self._ticks.values())
        self._due = dict.fromkeys(self._ticks, 0.0)
        self.refused: list[tuple[float, str, int]] = []  # (time, model, GPUs) not granted

    def tick(self, view: ClusterView) -> list[Any]:
        out: list[Any] = []
        asks: list[tuple[str, AddInstance]] = []
        now = view.now
        for name, hook in self._ticks.items():
            if now < self._due[name] - 1e-9 * max(1.0, now):
                continue
            self._due[name] = now + hook.tick_s
            for action in hook.tick(self.views[name]):
                if isinstance(action, AddInstance):
                    asks.append((name, dataclasses.replace(action, model=name)))
                    continue
                self._own(name, getattr(action, "instance", None), "tick()")
                out.append(action)
        return out + self._grant(view, asks)

    def _grant(self, view: ClusterView, asks: list[tuple[str, AddInstance]]) -> list[Any]:
        if self.budget is None or not asks:
            return [a for _, a in asks]
        held = sum(len(i.gpus) for i in view.in_state("serving", "starting", "draining"))
        pressure = {name: _pressure(self.views[name]) for name, _ in asks}
        order = sorted(range(len(asks)), key=lambda k: (-pressure[asks[k][0]], k))
        granted = []
        for k in order:
            name, a = asks[k]
            gpus = self._gpus(name, a)
            if held + gpus > self.budget:
                self.refused.append((view.now, name, gpus))
                continue
            held += gpus
            granted.append(k)
        return [asks[k][1] for k in sorted(granted)]

    def _gpus(self, model: str, a: AddInstance) -> int:
        """GPUs the instance ``a`` adds holds: its TP x PP, or its pool's
        expert-parallel layout (as the scaler places it)."""
        group = next((g for g in self.groups if g.model == model and g.role == a.role), None)
        return group.gpus if group is not None and group.ep > 1 else a.tp * a.pp


def _pressure(view: ClusterView) -> float:
    """Queued and running requests per GPU the model's live instances hold."""
    live = view.in_state("serving", "starting")
    gpus = sum(len(i.gpus) for i in live)
    work = sum(i.queue_requests + i.running_requests for i in live)
    return work / gpus if gpus else math.inf


def spec_policy(spec: Any, make: Callable[[], Any] | None = None) -> Any:
    """The policy of a run of ``spec``: its scheduler, or with several
    models a :class:`Fleet` of theirs (``make``: each model's policy made by
    it instead of from the spec)."""
    if not spec.models:
        where = f"{spec.source}: scheduler"
        return build_scheduler(spec.scheduler, spec.scheduler_params, where=where)
    plain = Fleet(spec, make)
    if any(tick_hook(p, name) for name, p in plain.policies.items()):
        return TickingFleet(spec, make)
    return plain


class ByModel(ByClass):
    """The requests of each model folded into a :class:`Metrics` of their
    own, judged against the model's SLO."""

    key = "model"
    what = ("names model", "models:")

    def __init__(self, spec: Any, faults: bool) -> None:
        self.classes = ()
        self.parts = spec.models
        self.groups = spec.groups
        self.of = {
            p.name: Metrics(p.spec.slo, None, spec.ttft_at, Timeline(spec.window_s), faults=faults)
            for p in self.parts
        }

    def by_model(self, run: Any) -> dict[str, Any]:
        """Per model of ``run`` (a Simulation that has run), in the spec's
        order: its model, share, instances and GPUs at the start, the
        GPU-seconds its instances held up to the last request's end (from
        the scaler's allocations), its SLO and the summary's request keys
        over its requests."""
        models = [model_of(i) for i in run.view.instances]
        end_s, scaler = run.metrics.last_end_s, run.scaler
        out = {}
        for p in self.parts:
            held = sum(
                gpus * max(0.0, min(end_s, end_s if to is None else to) - start)
                for i, (start, to, gpus) in scaler.alloc.items() if models[i] == p.name
            )  # fmt: skip
            first = [g for g in self.groups if g.model == p.name]
            out[p.name] = {
                "model": p.spec.model.name,
                "share": p.share,
                "instances": sum(g.count for g in first),
                "gpus": sum(g.count * g.gpus for g in first),
                "gpu_seconds": held,
                **figures(self.of[p.name]),
            }
        return out
