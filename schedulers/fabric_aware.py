"""Topology-aware pairing: prefill and decode chosen together, by queue and hand-off cost.

The router that NVIDIA Dynamo's and llm-d's trackers ask for (KV-transfer
aware pairing, rail-aligned P/D placement): for every (prefill, decode) pair
it estimates the request's time to its last token as

- the prefill side's queue (``estimate_queue_s``) and the prefill of what its
  prefix cache lacks (``estimate_prefill_s``),
- plus the hand-off from that prefill instance to that decode instance at the
  current link loads (``ClusterView.handoff_estimate``: the bytes the decode
  side lacks, at the max-min rate the network would give them now, and the
  fixed costs),
- plus ``expected_output_tokens`` decode steps on the decode side with this
  request added (``estimate_decode_s``; contexts taken as the prompt plus half
  the expected output, as Mooncake's conductor reckons them),

and takes the lowest; among equal costs, a rail-aligned pair (each flow
between nodes through NICs of the same number) first, then the lowest ids.
A decode instance whose free KV blocks cannot hold the prompt goes after
those that can (its hand-off would wait for blocks).

With ``decide: prefill_end`` (the default) the prefill instance is taken from
the best pair at arrival and the decode instance is chosen again when the
prompt is done (``pick_decode``), on the link loads of that moment;
``decide: arrival`` pins both at arrival.

Without a fabric (no topology: KV moves at no cost) the hand-off term is 0
and the pairing is by queue and decode load alone.

Parameters, with their defaults: ``expected_output_tokens: 256`` (what the
router assumes of every request's output: a real router does not know it, so
no cost here reads ``req.output_tokens``, which only says whether a prefill
instance need be remembered for ``pick_decode``; Mooncake's conductor assumes
the same), ``decide: prefill_end``, ``handoff_weight: 1`` (what a second of
hand-off weighs against a second of queue or decode; 0 leaves the fabric out
and pairs by queue and decode load alone, the same router blind to the
network, against which the bundled ``fabric-aware`` experiment measures what
the hand-off term buys).

NOTE: the estimate prices the hand-off as if it started now; a request
queued behind others on its prefill instance hands off later, on the loads
of then.
"""

from __future__ import annotations

import math
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
    is_int,
    register,
    require_split,
)

DECIDE = ("prefill_end", "arrival")


@register("fabric-aware")
@dataclass
class FabricAware(Scheduler, PicksDecode):
    """Topology-aware P/D pairing: prefill queue + hand-off at current link loads + decode load."""

    expected_output_tokens: int = 256
    decide: str = "prefill_end"
    handoff_weight: float = 1.0
    _prefill_of: dict[int, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        n = self.expected_output_tokens
        if not is_int(n) or n < 1:
            raise ValueError(f"expected_output_tokens: {n!r} must be an integer >= 1")
        if self.decide not in DECIDE:
            raise ValueError(f"decide: {self.decide!r}; expected one of {', '.join(DECIDE)}")
        w = self.handoff_weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0.0 <= w < math.inf:
            raise ValueError(f"handoff_weight: {w!r} must be a number >= 0")

    def setup(self, cluster: ClusterView) -> Plan:
        require_split(cluster, "fabric-aware")
        self._prefill_of.clear()
        return Plan()

    def route(self, req: Request, view: ClusterView) -> Route | Reject:
        decodes = view.of_role("decode")
        best = None
        for p in view.of_role("prefill"):
            cached = min(p.cached_prefix_tokens(req), req.prompt_tokens - 1)
            ttft = p.estimate_queue_s() + p.estimate_prefill_s(req.prompt_tokens - cached, cached)
            for d in decodes:
                key = self._pair_key(req, view, p.id, d, ttft)
                if best is None or key < best:
                    best = key
        assert best is not None  # setup checked both roles; of_role keeps the up ones
        p_id, d_id = best[-2], best[-1]
        if self.decide == "arrival":
            return Route(p_id, d_id)
        if req.output_tokens > 1:  # a one-token output never moves: nothing to keep
            self._prefill_of[req.id] = p_id
        return Route(p_id)

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        p = self._prefill_of.pop(req.id, None)
        decodes = view.of_role("decode")
        if p is None:  # not routed here (a retry after a failure): by decode load alone
            return min(decodes, key=lambda d: (self._decode_key(req, d), d.id)).id
        return min(self._pair_key(req, view, p, d, 0.0) for d in decodes)[-1]

    def _pair_key(
        self, req: Request, view: ClusterView, p: int, d: InstanceView, ttft: float
    ) -> tuple[bool, float, bool, int, int]:
        """Sort key of pair (``p``, ``d``): no room for the prompt on ``d``
        last, then the estimated time, then rail-aligned first, then ids."""
        est = view.handoff_estimate(p, d.id, req) if self.handoff_weight > 0 else None
        handoff_s = self.handoff_weight * est.total_s if est is not None else 0.0
        aligned = est.rail_aligned if est is not None else True
        no_room, decode_s = self._decode_key(req, d)
        return (no_room, ttft + handoff_s + decode_s, not aligned, p, d.id)

    def _decode_key(self, req: Request, d: InstanceView) -> tuple[bool, float]:
        """Whether ``d`` lacks the blocks for the prompt now, and the time of
        ``expected_output_tokens`` steps there with this request added."""
        need = -(-req.prompt_tokens // d.block_size)
        batch = d.running_requests + d.queue_requests + 1
        context = req.prompt_tokens + self.expected_output_tokens // 2
        step_s = d.estimate_decode_s(batch, batch * context)
        return d.free_blocks < need, self.expected_output_tokens * step_s
