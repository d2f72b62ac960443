"""Mooncake's conductor: KV-cache-centric routing with early rejection.

Follows Mooncake (Qin et al., "Mooncake: A KVCache-centric Disaggregated
Architecture for LLM Serving", arXiv 2407.00079v3, whose section numbers are
given here; the FAST 2025 paper, "Mooncake: Trading More Storage for Less
Computation", has the scheduling as its section 4 (4.1 prefill global
scheduling, 4.2 cache load balancing) and early rejection only in its
section 2.1 and Algorithm 1, with no overload section):

- Section 6, KVCache-centric scheduling (6.1, prefill global scheduling, the
  conductor's Algorithm 1; 6.2, cache load balancing): for every prefill
  instance, estimate the request's TTFT as the instance's queue time, plus
  the prefill of the tokens it cannot reuse, plus, when a node's DRAM KV pool
  holds a longer prefix than the instance's own cache, the time to load that
  prefix (the part on the pool's SSD read first, at the SSD's latency and read
  bandwidth; then over PCIe or the network); take the minimum. The queue time is the
  instance's ``estimate_queue_s()``: its waiting prompts priced as the
  iterations its engine batches them into (a prefill's cost grows faster than
  its length, so pricing the whole queue as one prefill would overstate a
  long queue severalfold). The prefix then travels from the pool
  (``Route.fetch_from``) and the prefill computes only the rest. The decode
  instance is the one whose predicted time between tokens, with this request
  added, is lowest among those its KV is predicted to fit on.
- Section 7, overload-oriented scheduling: requests are rejected at arrival,
  before any prefill work is spent on them, when they would break the SLO
  (7.2): the TTFT estimate is past the TTFT objective, or the decode instance
  would, with this request, step slower than the TPOT objective or hold more
  KV than it has. Judged on the decode load seen now, this lets in requests
  whose prompts reach decode together with the many already in prefill, and
  turns away requests that would find decode drained; prefill and decode load
  then swing against each other (7.3). So the load is predicted for the moment
  the request would reach decode (7.4): the requests this conductor sent that
  will have joined by then are added, and the share of the running ones that
  will have finished is taken away, assuming each decode lasts a uniform time
  (``expected_output_tokens`` at the current step time), as the paper's
  system-level prediction does.

Parameters, with their defaults:

- ``early_rejection: predicted``, the paper's prediction-based early
  rejection (7.4); ``arrival`` judges on the load seen now (7.2), ``off``
  never rejects.
- ``expected_output_tokens: 256``, the output length the conductor assumes
  for every request, for the decode's uniform duration (7.4) and the KV a
  request will hold; a real conductor does not know a request's output
  length, so this one never reads ``req.output_tokens``.
- ``min_fetch_tokens: 512``, the longest-prefix gain that makes fetching from
  a pool worth it. The paper's rule (6.2, Algorithm 1) compares the ratio of
  the best remote prefix to the local one with a threshold it tunes by hand
  and does not give; this one asks for an absolute gain of one 512-token
  block, the block of the trace's ``hash_ids`` (section 4).

The cluster needs prefill and decode instances; the KV pool is
``cluster.kv_pool`` (without it, only each instance's own prefix cache,
``engine.prefix_caching``, is reused).
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
    is_int,
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
    # decode instance -> (time, KV tokens) of each request sent there, expected to join then
    _joining: dict[int, list[tuple[float, int]]] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.early_rejection not in EARLY_REJECTION:
            raise ValueError(
                f"early_rejection: {self.early_rejection!r}; "
                f"expected one of {', '.join(EARLY_REJECTION)}"
            )
        for name in ("expected_output_tokens", "min_fetch_tokens"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
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
                reuse, fetch, fetch_s = pooled, node, p.estimate_fetch_s(node, pooled, req)
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

    def predicted_load(
        self, d: InstanceView, req: Request, now: float, ahead_s: float
    ) -> tuple[float, float]:
        """(requests, KV tokens) ``d`` is expected to hold ``ahead_s`` from now,
        when ``req`` would reach it, ``req`` included (at its prompt plus
        ``expected_output_tokens``). With ``early_rejection: predicted``: what
        ``d`` holds now, less the share of it that will have finished by then,
        plus what this conductor sent there that will have joined by then;
        otherwise what ``d`` holds now."""
        running = d.running_requests + d.queue_requests
        held = (d.total_blocks - d.free_blocks) * d.block_size
        need = req.prompt_tokens + self.expected_output_tokens
        if self.early_rejection != "predicted":
            return running + 1, held + need
        arrive_by = now + ahead_s
        soon = [tokens for t, tokens in self._joining.get(d.id, ()) if now < t <= arrive_by]
        decode_s = self.expected_output_tokens * self._step_s(d, max(running, 1), req)
        stay = 1.0 - min(1.0, ahead_s / decode_s) if decode_s > 0 else 1.0
        return running * stay + len(soon) + 1, held * stay + sum(soon) + need

    def decode_choice(
        self, req: Request, view: ClusterView, ahead_s: float
    ) -> tuple[float, bool, InstanceView]:
        """(predicted time between tokens, whether the request's KV is predicted
        to fit, instance) of the best decode instance: the lowest time between
        tokens among those it fits on, else among all."""
        now = view.now
        options = []
        for d in view.of_role("decode"):
            batch, tokens = self.predicted_load(d, req, now, ahead_s)
            fits = tokens <= d.total_blocks * d.block_size
            options.append((self._step_s(d, max(round(batch), 1), req), fits, d))
        return min(options, key=lambda o: (not o[1], o[0], -o[2].free_blocks, o[2].id))

    # -- the hooks -------------------------------------------------------------------
    def route(self, req: Request, view: ClusterView) -> Route | Reject:
        ttft, p, fetch = self.prefill_choice(req, view)
        tbt, fits, d = self.decode_choice(req, view, ttft)
        if self.early_rejection != "off":
            if ttft > view.slo.ttft_s:
                return Reject("predicted_ttft")
            if tbt > view.slo.tpot_s or not fits:
                return Reject("predicted_decode_overload")
        now = view.now
        joining = [(t, n) for t, n in self._joining.get(d.id, []) if t > now]
        joining.append((now + ttft, req.prompt_tokens + self.expected_output_tokens))
        self._joining[d.id] = joining
        return Route(p, d.id, fetch_from=fetch)

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        return self.decode_choice(req, view, 0.0)[2].id
