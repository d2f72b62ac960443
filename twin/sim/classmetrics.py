"""A run's figures split by class of traffic (``workload.classes``).

:class:`ByClass` watches the requests as :class:`~twin.sim.metrics.Metrics`
does and hands each to the :class:`~twin.sim.metrics.Metrics` of its class,
judged against the class's SLO, with a timeline of its own: the same rules
(TTFT where a split deployment's ends, rejected and failed requests as
misses) give each class's attainment, latency percentiles and windows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import Objectives
from twin.serving.observer import Observer, Outcome
from twin.serving.sequence import Sequence
from twin.sim.metrics import SLO, Metrics
from twin.sim.timeline import TIMELINE_COLUMNS, Timeline
from twin.workload.classes import TrafficClass

# A class's timeline holds its requests' columns (the capacity is the run's).
CLASS_TIMELINE_COLUMNS = TIMELINE_COLUMNS[: TIMELINE_COLUMNS.index("finished") + 1]


def class_slos(slo: SLO, classes: tuple[TrafficClass, ...]) -> dict[str, SLO]:
    """Each class's SLO: its own ``ttft``, ``tpot`` and ``target``, the
    spec's ``slo:`` for those it leaves out."""
    out = {}
    for c in classes:
        out[c.name] = dataclasses.replace(
            slo,
            ttft_s=slo.ttft_s if c.ttft_s is None else c.ttft_s,
            tpot_s=slo.tpot_s if c.tpot_s is None else c.tpot_s,
            target=slo.target if c.target is None else c.target,
        )
    return out


def request_objectives(
    slo: SLO, classes: tuple[TrafficClass, ...]
) -> Callable[[Request], Objectives]:
    """Each request's TTFT and TPOT objectives, as a queue policy reads them
    (``Queued.slo``): its class's (:func:`class_slos`), the run's without classes."""
    run = Objectives(slo.ttft_s, slo.tpot_s)
    if not classes:
        return lambda req: run
    of = {name: Objectives(s.ttft_s, s.tpot_s) for name, s in class_slos(slo, classes).items()}
    # (a request of no class of the spec's is refused as it arrives: ByClass)
    return lambda req: of[req.traffic_class]


class ByClass(Observer):
    """The requests of each class folded into a :class:`Metrics` of their own."""

    key = "traffic_class"  # the request's attribute that names its part
    what = ("is of class", "workload.classes")  # how a miss names the two

    def __init__(
        self, classes: tuple[TrafficClass, ...], slos: Mapping[str, SLO], ttft_at: str,
        window_s: float, faults: bool = False,
    ) -> None:  # fmt: skip
        self.classes = classes
        self.of = {
            c.name: Metrics(slos[c.name], None, ttft_at, Timeline(window_s), faults=faults)
            for c in classes
        }

    def _metrics(self, req: Request) -> Metrics:
        name = getattr(req, self.key)
        m = self.of.get(name)
        if m is None:
            raise SpecError(
                f"request {req.id} {self.what[0]} {name!r}, not one of "
                f"{self.what[1]} ({', '.join(self.of)})"
            )
        return m

    def request_arrived(self, now: float, req: Request) -> None:
        self._metrics(req).request_arrived(now, req)

    def request_ended(
        self, now: float, instance: int, req: Request, seq: Sequence | None, outcome: Outcome,
        reason: str,
    ) -> None:  # fmt: skip
        self._metrics(req).request_ended(now, instance, req, seq, outcome, reason)

    def summary(self) -> dict[str, Any]:
        """Per class, in the spec's order: its priority and SLO, then the
        summary's request keys over its requests."""
        return {c.name: {"priority": c.priority, **figures(self.of[c.name])} for c in self.classes}

    def timeline_rows(self, end_s: float) -> dict[str, list[dict[str, Any]]]:
        """Each class's timeline rows up to the run's end ``end_s``, its requests' columns."""
        out = {}
        for name, m in self.of.items():
            rows = m.timeline.rows(end_s) if m.timeline is not None and m.ended else []
            out[name] = [{k: r[k] for k in CLASS_TIMELINE_COLUMNS} for r in rows]
        return out


_KEYS = (
    "requests", "completed", "rejected", "failed", "rejected_by_reason", "failed_by_reason",
    "slo_attainment", "ttft_attainment", "tpot_attainment", "ttft_s", "tpot_s", "e2e_s",
    "queue_s", "preemptions",
)  # fmt: skip


def figures(m: Metrics) -> dict[str, Any]:
    """What a part of a run reports of its requests: its SLO, then the
    summary's request keys over them."""
    s = m.summary()
    return {
        "slo": {"ttft_s": _finite(m.slo.ttft_s), "tpot_s": _finite(m.slo.tpot_s),
                "target": m.slo.target},
        **{k: s[k] for k in _KEYS if k in s},
    }  # fmt: skip


def _finite(x: float) -> float | None:
    return None if math.isinf(x) else x
