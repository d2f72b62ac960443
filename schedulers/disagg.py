"""Plain disaggregated serving: prefill and decode on separate instances.

The prefill/decode instance counts are fixed by the spec
(``cluster.prefill`` and ``cluster.decode``). Each request goes to the
prefill instance with the least queued prompt work (queued prompt tokens,
then running requests, then id); when its prompt is done, the decode
instance with the fewest requests (running plus queued), then the most free
KV blocks, then the lowest id, takes it. With ``decode_at: arrival`` the decode
instance is chosen when the request arrives instead, as a router that pins
both ends up front does.

It is the mechanism without a research policy on top: the baseline the
research schedulers are measured against, and the simplest way to use the
KV hand-off.
"""

from __future__ import annotations

from dataclasses import dataclass

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

DECODE_AT = ("prefill_end", "arrival")


@register("disagg")
@dataclass
class Disagg(Scheduler, PicksDecode):
    """Disaggregated baseline: least-loaded prefill, least-loaded decode, fixed P:D."""

    decode_at: str = "prefill_end"

    def __post_init__(self) -> None:
        if self.decode_at not in DECODE_AT:
            raise ValueError(
                f"decode_at: {self.decode_at!r}; expected one of {', '.join(DECODE_AT)}"
            )

    def setup(self, cluster: ClusterView) -> Plan:
        require_split(cluster, "disagg")
        return Plan()

    def route(self, req: Request, view: ClusterView) -> Route | Reject:
        p = min(
            view.of_role("prefill"),
            key=lambda i: (i.queue_tokens, i.queue_requests + i.running_requests, i.id),
        )
        if self.decode_at == "arrival":
            return Route(p.id, self._least_loaded_decode(view).id)
        return Route(p.id)

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        return self._least_loaded_decode(view).id

    @staticmethod
    def _least_loaded_decode(view: ClusterView) -> InstanceView:
        return min(
            view.of_role("decode"),
            key=lambda i: (i.running_requests + i.queue_requests, -i.free_blocks, i.id),
        )
