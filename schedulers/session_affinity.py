"""Session affinity: a session's turns go where its earlier turns went.

A session's turn ``t + 1`` begins with turn ``t``'s prompt, whose KV the
instance that served turn ``t`` may still hold (its prefix cache). Sending the
turn back there turns that prompt into a hit; sending it anywhere else
recomputes it. llm-d's inference scheduler does this with its session
affinity scorer (``llm-d/llm-d-inference-scheduler``, docs "Session Affinity
in LLM-D Inference Scheduler": a session token, kept in a cookie, sends a
client's later requests to the pod that served it, for their cached prefixes).

Turn 0 of a session, a request outside any session, and a turn whose
instance is down or not accepting go to the least loaded instance (waiting
plus running requests, ties to the lowest id), as the ``colocated`` policy's
``least_loaded``. ``max_extra_load`` bounds the stickiness: a turn leaves its
instance when that instance's load exceeds the least loaded one's by more
than this many requests (unbounded by default: always sticky, as llm-d's
scorer on its own). On a split cluster the prefill instance is sticky (its
prefix cache holds the session's prompt) and the decode instance is the
least loaded (``disagg``'s choice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import (
    ClusterView,
    InstanceView,
    PicksDecode,
    Plan,
    Reject,
    Route,
    Scheduler,
    register,
)


def _load(i: InstanceView) -> int:
    return i.queue_requests + i.running_requests


@register("session-affinity")
@dataclass
class SessionAffinity(Scheduler, PicksDecode):
    """Each turn of a session to the instance of its previous turn; least loaded otherwise."""

    max_extra_load: float = math.inf
    _pinned: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _split: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        v = self.max_extra_load
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ValueError(f"max_extra_load: {v!r} must be a number >= 0")

    def setup(self, cluster: ClusterView) -> Plan:
        roles = {i.role for i in cluster.instances}
        self._split = "mixed" not in roles
        if (
            self._split
            and not {"prefill", "decode"} <= roles
            or "mixed" in roles
            and len(roles) > 1
        ):
            raise SpecError(
                "scheduler 'session-affinity' routes a colocated cluster, or a split one with "
                f"prefill and decode instances; this one has {' and '.join(sorted(roles))}"
            )
        return Plan()

    def route(self, req: Request, view: ClusterView) -> Route | Reject:
        candidates = view.of_role("prefill") if self._split else view.up()
        least = min(candidates, key=lambda i: (_load(i), i.id))
        pick = least
        s = req.session
        if s is not None and s.turn > 0:
            pinned = self._pinned.get(s.index)
            for i in candidates:
                if i.id == pinned and _load(i) - _load(least) <= self.max_extra_load:
                    pick = i
                    break
        if s is not None:
            if s.last:
                self._pinned.pop(s.index, None)
            else:
                self._pinned[s.index] = pick.id
        if self._split:
            return Route(pick.id)
        return Route(pick.id, pick.id)

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        return min(
            view.of_role("decode"),
            key=lambda i: (_load(i), -i.free_blocks, i.id),
        ).id
