"""An SLA planner after NVIDIA Dynamo's (docs: "SLA-based Planner",
docs/architecture/sla_planner.md, and "Planner Design"): every
``adjustment_interval`` it observes the interval's load (request rate, mean
prompt and output lengths), predicts the next interval's, and sizes the
prefill pool to meet the TTFT target and the decode pool to meet the ITL
(TPOT) target, within a GPU budget and min/max per pool; then it scales with
:class:`AddInstance` and :class:`RemoveInstance`.

Sizing, from the perf model's estimates on an instance of the pool (what
Dynamo reads from its pre-deployment profile):

- prefill: an instance prefills ``b`` prompts of the predicted length in
  ``estimate_prefill_s(b x isl)``; its capacity is the most tokens per second
  over the batches that still end within the TTFT target (one prompt when
  none does); the pool needs ``ceil(rate x isl / (capacity x utilization))``.
- decode: the largest batch whose step, at the mean context ``isl + osl/2``,
  stays within the ITL target (and whose KV fits the instance); an instance
  then completes ``batch / (osl x step)`` requests per second; the pool needs
  ``ceil(rate / (that x utilization))``.

``utilization`` (default 0.7) is the share of that capacity a pool is sized
to run at: the headroom queueing needs to keep latencies within target. At
0.7 an M/D/1 queue's mean wait is rho / (2 (1 - rho)) = 1.2 service times
(the Pollaczek-Khinchine formula, Kleinrock, *Queueing Systems* vol. 1,
section 5.6); a chosen value, not a fitted one.

Predictors: ``constant`` (next = last), ``moving-average`` (mean of the last
``window`` intervals) and ``seasonal`` (the interval one ``period`` ago, the
last one until a period has passed). Dynamo's ARIMA and Prophet predictors
and its correction factors (observed / expected latency) are not modelled.

Without a split (only mixed instances) it sizes one pool to the larger of
the two needs. Routing is DistServe's (shortest-queue prefill, least-loaded
decode), or least-loaded on mixed instances. Added instances take the shape
(TP, PP) of the pool's first instance; removed ones are the newest idle-most.
The budget ``max_gpus`` defaults to the GPUs the cluster starts with, and
may not be below them; ``adjustment_interval`` is at least 100 ms
(``MIN_ADJUSTMENT_INTERVAL_S``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from schedulers.colocated import Colocated
from schedulers.distserve import DistServe
from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import (
    Action,
    AddInstance,
    ClusterView,
    InstanceView,
    PicksDecode,
    Plan,
    Reject,
    RemoveInstance,
    Route,
    Scheduler,
    Ticks,
    duration_s,
    is_int,
    register,
)

PREDICTORS = ("constant", "moving-average", "seasonal")
MAX_PREFILL_BATCH = 64  # prompts per prefill batch tried when sizing the pool
MAX_DECODE_BATCH = 4096  # sequences per decode step tried when sizing the pool
# The shortest adjustment_interval taken (an argued bound, not a sourced one).
# Dynamo's planner averages each interval's TTFT, ITL, request count and
# lengths from Prometheus ("Planner Design", step 1); an interval shorter than
# an engine step under load (10-100 ms in the measured profiles of
# ../shared/data/profiles) holds 0 or 1 requests, so the pools are sized on
# noise, while the ticks (about 0.2 ms of CPU each here) cost more than the
# simulation: twin run of a 2 min split at 20 req/s took 1.9 s at 100 ms and
# 4.1 s at 10 ms on the development machine; 1 us would take hours.
MIN_ADJUSTMENT_INTERVAL_S = 0.1


@register("sla-planner")
@dataclass
class SlaPlanner(Scheduler, PicksDecode, Ticks):
    """Dynamo-like SLA planner: predicts each interval's load, sizes pools to TTFT/ITL."""

    adjustment_interval: float | str = 30.0
    predictor: str = "constant"
    window: int = 3
    period: float | str | None = None
    max_gpus: int | None = None
    min_prefill: int = 1
    max_prefill: int = 64
    min_decode: int = 1
    max_decode: int = 64
    utilization: float = 0.7
    tick_s: float = field(default=30.0, init=False)
    _history: deque[tuple[float, float, float]] = field(
        default_factory=deque, init=False, repr=False
    )
    _count: int = field(default=0, init=False, repr=False)
    _isl: int = field(default=0, init=False, repr=False)
    _osl: int = field(default=0, init=False, repr=False)
    _seen: set[int] = field(default_factory=set, init=False, repr=False)
    _budget: int = field(default=0, init=False, repr=False)
    _split: bool = field(default=True, init=False, repr=False)
    _router: DistServe = field(default_factory=DistServe, init=False, repr=False)
    _mixed: Colocated = field(default_factory=Colocated, init=False, repr=False)
    _period_s: float = field(default=0.0, init=False, repr=False)
    decisions: list[tuple[float, int, int]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.tick_s = duration_s(self.adjustment_interval, "adjustment_interval", positive=True)
        if self.tick_s < MIN_ADJUSTMENT_INTERVAL_S:
            raise ValueError(
                f"adjustment_interval: {self.adjustment_interval!r} is below "
                f"{MIN_ADJUSTMENT_INTERVAL_S * 1e3:g} ms, shorter than an engine step: "
                "the planner would size its pools on intervals that see no request"
            )
        if self.predictor not in PREDICTORS:
            raise ValueError(
                f"predictor: {self.predictor!r}; expected one of {', '.join(PREDICTORS)}"
            )
        if self.predictor == "seasonal":
            if self.period is None:
                raise ValueError("period: the seasonal predictor needs a period (e.g. '20 min')")
            self._period_s = duration_s(self.period, "period", positive=True)
        for key in ("window", "min_prefill", "max_prefill", "min_decode", "max_decode"):
            v = getattr(self, key)
            if not is_int(v) or v < (0 if key.startswith("min") else 1):
                raise ValueError(f"{key}: {v!r} must be a positive integer")
        if self.min_prefill > self.max_prefill or self.min_decode > self.max_decode:
            raise ValueError("min_prefill: each pool's min must be <= its max")
        if not isinstance(self.utilization, int | float) or not 0 < self.utilization <= 1:
            raise ValueError(f"utilization: {self.utilization!r} must be in (0, 1]")
        if self.max_gpus is not None and (not is_int(self.max_gpus) or self.max_gpus <= 0):
            raise ValueError(f"max_gpus: {self.max_gpus!r} must be a positive integer")

    # -- routing -----------------------------------------------------------------------
    def setup(self, cluster: ClusterView) -> Plan:
        roles = {i.role for i in cluster.instances}
        self._split = bool(roles - {"mixed"})
        if self._split:
            self._router.setup(cluster)
        else:
            self._mixed.setup(cluster)
        start = sum(len(i.gpus) for i in cluster.instances)
        if self.max_gpus is not None and self.max_gpus < start:
            raise SpecError(
                f"scheduler.max_gpus: {self.max_gpus} is below the {start} GPUs the cluster "
                "starts with; raise it or start with fewer instances"
            )
        self._budget = self.max_gpus or start
        self._history.clear()
        self._seen.clear()
        self._count = self._isl = self._osl = 0
        self.decisions.clear()
        return Plan()

    def route(self, req: Request, view: ClusterView) -> Route | Reject:
        if req.id not in self._seen:  # a retry is not new load
            self._seen.add(req.id)
            self._count += 1
            self._isl += req.prompt_tokens
            self._osl += req.output_tokens
        return self._router.route(req, view) if self._split else self._mixed.route(req, view)

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        return self._router.pick_decode(req, view)

    # -- planning ----------------------------------------------------------------------
    def predict(self) -> tuple[float, float, float]:
        """(rate req/s, mean prompt, mean output) of the next interval."""
        h = self._history
        if self.predictor == "moving-average":
            last = list(h)[-self.window :]
            seen = [x for x in last if x[0] > 0] or last
            return (
                sum(x[0] for x in last) / len(last),
                sum(x[1] for x in seen) / len(seen),
                sum(x[2] for x in seen) / len(seen),
            )
        if self.predictor == "seasonal":
            back = round(self._period_s / self.tick_s)
            if back >= 1 and len(h) >= back:
                return h[-back]  # the next interval is one period after this one
        return h[-1]

    def tick(self, view: ClusterView) -> list[Action]:
        n, dt = self._count, self.tick_s
        isl = self._isl / n if n else 0.0
        osl = self._osl / n if n else 0.0
        self._history.append((n / dt, isl, osl))
        keep = max(self.window, round(self._period_s / dt) + 1 if self._period_s else 1)
        while len(self._history) > keep:
            self._history.popleft()
        self._count = self._isl = self._osl = 0
        rate, isl, osl = self.predict()
        if self._split:
            want_p, want_d = self.size(view, rate, isl, osl)
            plan = self._fit(view, {"prefill": want_p, "decode": want_d})
        else:
            p, d = self.size(view, rate, isl, osl, split=False)
            plan = self._fit(view, {"mixed": max(p, d)})
        if self._split:
            self.decisions.append((view.now, plan["prefill"], plan["decode"]))
        else:
            self.decisions.append((view.now, plan["mixed"], plan["mixed"]))
        return self._actions(view, plan)

    def size(self, view: ClusterView, rate: float, isl: float, osl: float, *,
             split: bool = True) -> tuple[int, int]:  # fmt: skip
        """Instances the prefill and decode pools need for the predicted load."""
        if rate <= 0 or isl <= 0:
            return (0, 0)
        pre = _first(view, "prefill" if split else "mixed")
        dec = _first(view, "decode" if split else "mixed")
        if pre is None or dec is None:
            return (0, 0)
        ttft, itl = view.slo.ttft_s, view.slo.tpot_s
        tokens = max(round(isl), 1)
        best = tokens / pre.estimate_prefill_s(tokens)
        for b in range(2, MAX_PREFILL_BATCH + 1):
            if b * tokens > pre_budget(pre):
                break
            t = pre.estimate_prefill_s(b * tokens)
            if t > ttft:
                break
            best = max(best, b * tokens / t)
        need_p = math.ceil(rate * isl / (best * self.utilization))
        out = max(osl, 1.0)
        ctx = round(isl + out / 2)
        fits = max(dec.total_blocks * dec.block_size // max(round(isl + out), 1), 1)
        lo, hi = 1, min(MAX_DECODE_BATCH, fits)
        while lo < hi:  # the largest batch whose step is within the ITL target
            mid = (lo + hi + 1) // 2
            if dec.estimate_decode_s(mid, mid * ctx) <= itl:
                lo = mid
            else:
                hi = mid - 1
        step = dec.estimate_decode_s(lo, lo * ctx)
        need_d = math.ceil(rate / (lo / (out * step) * self.utilization))
        return (need_p, need_d)

    def _bounds(self, role: str) -> tuple[int, int]:
        if role == "prefill":
            return (max(self.min_prefill, 1), self.max_prefill)
        if role == "decode":
            return (max(self.min_decode, 1), self.max_decode)
        return (max(self.min_prefill, self.min_decode, 1), min(self.max_prefill, self.max_decode))

    def _fit(self, view: ClusterView, want: dict[str, int]) -> dict[str, int]:
        """``want`` clamped to each pool's bounds, then cut to the GPU budget
        (the pool furthest above its minimum gives first)."""
        size = {r: _shape_gpus(view, r) for r in want}
        plan = {r: min(max(n, self._bounds(r)[0]), self._bounds(r)[1]) for r, n in want.items()}
        # instances that cannot be removed now (failed ones) still hold GPUs
        fixed = sum(len(i.gpus) for i in view.in_state("serving", "draining") if not i.up)
        while sum(plan[r] * size[r] for r in plan) + fixed > self._budget:
            r = max(plan, key=lambda r: (plan[r] - self._bounds(r)[0], r))
            if plan[r] <= self._bounds(r)[0]:
                break
            plan[r] -= 1
        return plan

    def _actions(self, view: ClusterView, plan: dict[str, int]) -> list[Action]:
        out: list[Action] = []
        draining = sum(len(i.gpus) for i in view.in_state("draining"))
        used = sum(len(i.gpus) for i in view.in_state("serving", "starting")) + draining
        for role, want in plan.items():
            live = [i for i in view.in_state("serving", "starting") if i.role == role
                    and (i.up or i.state == "starting")]  # fmt: skip
            if len(live) > want:
                serving = sorted(
                    (i for i in live if i.state == "serving"),
                    key=lambda i: (i.running_requests + i.queue_requests, -i.id),
                )
                # one instance of the pool keeps serving while the others start
                cut = min(len(live) - want, len(serving) - 1)
                for i in serving[: max(cut, 0)]:
                    out.append(RemoveInstance(i.id))
            elif len(live) < want:
                shape = _first(view, role, any_state=True)
                assert shape is not None
                gpus = len(shape.gpus)
                for _ in range(want - len(live)):
                    if used + gpus > self._budget:
                        break  # draining instances still hold their GPUs
                    tp = getattr(shape, "tp", None) or gpus
                    out.append(AddInstance(role, tp=tp, pp=1))  # type: ignore[arg-type]
                    used += gpus
        return out


def _first(view: ClusterView, role: str, *, any_state: bool = False) -> InstanceView | None:
    """The pool's first instance that serves (or, with ``any_state``, any one)."""
    for i in view.instances:
        if i.role == role and (any_state or (i.up and i.state == "serving")):
            return i
    return None


def pre_budget(i: InstanceView) -> int:
    """Prompt tokens a prefill batch of ``i`` may hold: its queued tokens' bound
    is not visible to a view, so the KV it holds bounds it."""
    return i.total_blocks * i.block_size


def _shape_gpus(view: ClusterView, role: str) -> int:
    i = _first(view, role, any_state=True)
    return len(i.gpus) if i is not None else 1
