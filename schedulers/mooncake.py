"""Mooncake's conductor: KV-cache-centric routing with early rejection.

Follows Mooncake (Qin et al., FAST 2025; arXiv 2407.00079; section numbers of
the arXiv version):

- Section 6, KVCache-centric scheduling (6.1, prefill global scheduling, the
  conductor's Algorithm 1; 6.2, cache load balancing): for every prefill
  instance, estimate the request's TTFT as the instance's queue time, plus
  the prefill of the tokens it cannot reuse, plus, when a node's DRAM KV pool
  holds a longer prefix than the instance's own cache, the time to load that
  prefix over the network; take the minimum. The queue time is the
  instance's ``estimate_queue_s()``: its waiting prompts priced as the
  iterations its engine batches them into (a prefill's cost grows faster
  than its length, so pricing the whole queue as one prefill would overstate
  a long queue severalfold). The prefix then travels from the pool
  (``Route.fetch_from``) and the prefill computes only the rest. The decode instance is the one
  whose predicted time between tokens, with this request added, is lowest.
- Section 7, overload-oriented scheduling (7.2, early rejection; 7.4,
  early rejection based on prediction): requests are rejected at arrival,
  before any prefill work is spent on them, when they would break the SLO.
  ``early_rejection``: ``off``; ``arrival``, on the TTFT estimate and the
  decode load seen now; ``predicted`` (the paper's prediction-based early
  rejection), on the decode load predicted for the moment the request would
  reach decode: requests the conductor sent that will have joined by then
  are added, and the running ones that will have finished are taken away,
  assuming each decode lasts a uniform time (``expected_output_tokens`` at
  the current step time), as the paper's system-level prediction does.

A real conductor does not know a request's output length, so this one never
reads ``req.output_tokens``. The cluster needs prefill and decode instances;
the KV pool is ``cluster.kv_pool`` (without it, only each instance's own
prefix cache, ``engine.prefix_caching``, is reused).
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

EARLY_REJECTION = ("off", "arrival", "predicted")


@register("mooncake")
@dataclass
class Mooncake(Scheduler, PicksDecode):
    """Mooncake: cache-aware TTFT-minimizing prefill choice, load-aware decode, early rejection."""

    early_rejection: str = "predicted"
    expected_output_tokens: int = 256
    min_fetch_tokens: int = 512
    # decode instance -> times at which requests sent there are expected to join it
    _joining: dict[int, list[float]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.early_rejection is False:  # YAML 1.1 reads a bare `off` as false
            self.early_rejection = "off"
        if self.early_rejection not in EARLY_REJECTION:
            raise ValueError(
                f"early_rejection: {self.early_rejection!r}; "
                f"expected one of {', '.join(EARLY_REJECTION)}"
            )
        for name in ("expected_output_tokens", "min_fetch_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: {v!r} must be a positive integer")

    def setup(self, cluster: ClusterView) -> Plan:
        require_split(cluster, "mooncake")
        return Plan()

    # -- prefill ---------------------------------------------------------------------
    def prefill_choice(self, req: Request, view: ClusterView) -> tuple[float, int, int | None]:
        """(estimated TTFT up to the end of the prefill, instance, pool node to fetch from)."""
        pools = view.pool_prefix_tokens(req)
        node, pooled = max(pools.items(), key=lambda kv: (kv[1], -kv[0]), default=(None, 0))
        pooled = min(pooled, req.prompt_tokens - 1)
        best: tuple[float, int, int | None] | None = None
        for p in view.of_role("prefill"):
            own = min(p.cached_prefix_tokens(req), req.prompt_tokens - 1)
            reuse, fetch_s, fetch = own, 0.0, None
            if node is not None and pooled >= own + self.min_fetch_tokens:
                reuse, fetch, fetch_s = pooled, node, p.estimate_fetch_s(node, pooled)
            queue_s = p.estimate_queue_s()
            ttft = fetch_s + queue_s + p.estimate_prefill_s(req.prompt_tokens - reuse, reuse)
            if best is None or (ttft, p.id) < (best[0], best[1]):
                best = (ttft, p.id, fetch)
        assert best is not None
        return best

    # -- decode ----------------------------------------------------------------------
    def _step_s(self, d: InstanceView, batch: int, req: Request) -> float:
        context = req.prompt_tokens + self.expected_output_tokens // 2
        return d.estimate_decode_s(batch, batch * context)

    def predicted_batch(self, d: InstanceView, req: Request, now: float, ahead_s: float) -> float:
        """Requests ``d`` is expected to decode ``ahead_s`` from now, this one included."""
        running = d.running_requests + d.queue_requests
        if self.early_rejection != "predicted":
            return running + 1
        joining = self._joining.get(d.id, [])
        arrive_by = now + ahead_s
        soon = sum(1 for t in joining if now < t <= arrive_by)
        decode_s = self.expected_output_tokens * self._step_s(d, max(running, 1), req)
        finished = running * min(1.0, ahead_s / decode_s) if decode_s > 0 else 0.0
        return running - finished + soon + 1

    def decode_choice(
        self, req: Request, view: ClusterView, ahead_s: float
    ) -> tuple[float, InstanceView]:
        """(predicted time between tokens, instance) of the best decode instance."""
        now = view.now
        return min(
            (
                (self._step_s(d, round(self.predicted_batch(d, req, now, ahead_s)), req), d)
                for d in view.of_role("decode")
            ),
            key=lambda td: (td[0], -td[1].free_blocks, td[1].id),
        )

    # -- the hooks -------------------------------------------------------------------
    def route(self, req: Request, view: ClusterView) -> Route | Reject:
        ttft, p, fetch = self.prefill_choice(req, view)
        tbt, d = self.decode_choice(req, view, ttft)
        if self.early_rejection != "off":
            if ttft > view.slo.ttft_s:
                return Reject("predicted_ttft")
            if tbt > view.slo.tpot_s:
                return Reject("predicted_decode_overload")
        now = view.now
        joining = [t for t in self._joining.get(d.id, []) if t > now]
        joining.append(now + ttft)
        self._joining[d.id] = joining
        return Route(p, d.id, fetch_from=fetch)

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        return self.decode_choice(req, view, 0.0)[1].id
