"""DistServe's runtime (Zhong et al., OSDI 2024, arXiv 2401.09670, section 4.3).

Requests arrive at one controller and go to the prefill instance with the
shortest queue (queued prompt tokens, then queued requests, then id); when a
prompt is done, the least-loaded decode instance (running plus queued
requests, then most free KV blocks, then id) takes it. Each engine serves its
queue first come, first served (the engine's own policy). The KV moves in
pull mode (section 4.3, "Combat burstiness": the decode instance fetches the
KV once it has room, so the prefill instance's memory is the queue); that is
``transfer: {handoff: pull}`` in the spec, which ``twin plan`` writes.

``pair: node`` keeps each hand-off inside the prefill instance's node when
that node has a decode instance, as the low node-affinity placement
(section 4.2, Algorithm 2) needs: the KV then moves over NVLink only.

The planner that picks parallelism, instance counts and placement
(sections 4.1 and 4.2) lives in :mod:`twin.studies.planner` and ``twin plan``.

NOTE: section 4.3's batching refinements (prefill batches of about L_m
tokens to even out pipeline stages, periodic replanning) are not modelled;
the engine batches as vLLM does, and PP here never overlaps micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    require_split,
)

PAIRS = ("any", "node")


@register("distserve")
@dataclass
class DistServe(Scheduler, PicksDecode):
    """DistServe runtime: FCFS, shortest-queue prefill, least-loaded decode, pull KV."""

    pair: str = "any"
    _prefill_node: dict[int, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.pair not in PAIRS:
            raise ValueError(f"pair: {self.pair!r}; expected one of {', '.join(PAIRS)}")

    def setup(self, cluster: ClusterView) -> Plan:
        require_split(cluster, "distserve", " (`twin plan SPEC` suggests both)")
        self._prefill_node.clear()
        return Plan()

    def route(self, req: Request, view: ClusterView) -> Route | Reject:
        p = min(view.of_role("prefill"), key=lambda i: (i.queue_tokens, i.queue_requests, i.id))
        if self.pair == "node" and req.output_tokens > 1:  # one-token outputs never move
            self._prefill_node[req.id] = p.node
        return Route(p.id)

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        decodes = view.of_role("decode")
        node = self._prefill_node.pop(req.id, None)
        if node is not None:
            local = tuple(i for i in decodes if i.node == node)
            decodes = local or decodes
        return least_loaded(decodes).id


def least_loaded(decodes: tuple[InstanceView, ...]) -> InstanceView:
    """Fewest requests (running plus queued), then most free blocks, then lowest id."""
    return min(decodes, key=lambda i: (i.running_requests + i.queue_requests, -i.free_blocks, i.id))
