"""Colocated serving, the vLLM-like baseline: N identical instances, each runs
both prefill and decode of the requests it is given.

Routing is round-robin, or least-loaded: the instance with the fewest
outstanding requests (waiting plus running), ties to the lowest id, which is
what a load-balancing proxy in front of vLLM replicas does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import ClusterView, Plan, Reject, Route, Scheduler, register

ROUTINGS = ("least_loaded", "round_robin")


@register("colocated")
@dataclass
class Colocated(Scheduler):
    """vLLM-like baseline: every instance prefills and decodes; round-robin or least-loaded."""

    routing: str = "least_loaded"
    _next: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing: {self.routing!r}; expected one of {', '.join(ROUTINGS)}")

    def setup(self, cluster: ClusterView) -> Plan:
        split = sorted({i.role for i in cluster.instances} - {"mixed"})
        if split:
            raise SpecError(
                f"scheduler 'colocated' serves each request on one instance, but the cluster "
                f"has {' and '.join(split)} instances; use a disaggregated policy such as "
                "'disagg', or give cluster.instances"
            )
        return Plan()

    def route(self, req: Request, view: ClusterView) -> Route | Reject:
        instances = view.up()
        if self.routing == "round_robin":
            inst = instances[self._next % len(instances)]
            self._next += 1
            return Route(inst.id, inst.id)
        # min by (load, id), in one pass: the id is read only on a tie
        best = instances[0]
        low = best.queue_requests + best.running_requests
        for i in instances[1:]:
            load = i.queue_requests + i.running_requests
            if load < low or load == low and i.id < best.id:
                best, low = i, load
        best_id = best.id
        return Route(best_id, best_id)
