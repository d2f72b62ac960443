"""KV-aware routing: reuse weighed against load, from where the KV already is.

Modelled on NVIDIA Dynamo's KV router (docs.nvidia.com/dynamo, "KV Router" and
"Router Design"): for each candidate worker it adds the blocks the request
would have to prefill there (its prompt less the blocks that worker already
holds, ``overlap`` blocks) times ``overlap_score_weight`` (Dynamo's
``--kv-overlap-score-weight``, default 1.0) to the worker's potential active
blocks (the KV blocks it holds for its requests plus this request's), and
picks the lowest cost; with Dynamo's default router temperature 0.0 the pick
is deterministic. llm-d's inference scheduler scores the same two sides, a
prefix-cache scorer against queue and KV-utilization scorers (its default
profile weighs the prefix-cache scorer 3 to the queue scorer's 2, Red Hat
OpenShift AI 3.4, "Configuring scheduler settings"); the block-count cost
here is Dynamo's.

Reuse comes from a tier (``InstanceView.cached_prefix_by_tier``: the leading
run in HBM, then its continuation in host DRAM, on SSD and in a remote
store, see :mod:`twin.serving.tiers`): a block in HBM costs nothing to reuse;
one in a lower tier costs ``dram_weight``, ``ssd_weight`` or ``remote_weight``
of a block computed, its load time against its prefill time. The defaults
take Llama-3-8B on an H100 (KV 128 KiB per token; prefill about 16 GFLOP per
token at about 600 TFLOP/s, some 27 us): a load at 55 GB/s over PCIe Gen5 x16
takes 2.4 us a token (0.1), one at the PM1743 SSD's 13 GB/s 10 us (0.4), and
one from the remote store, a flow from the store's node over the GPU's own
400 Gb/s ConnectX-7 NIC at its RDMA efficiency 0.982 (49 GB/s, the
dgx-h100-ib400 topology; the store's latency is 0 by default and the path's
link latencies, microseconds a transfer of a whole unit, add under 0.01 us a
token), 2.7 us (0.1). On a NIC of 200 Gb/s shared by two GPUs (the
h100-roce-4x200 topology, 12 GB/s a GPU) the same reckoning gives 0.4.

Parameters, with their defaults: ``overlap_score_weight: 1.0`` (Dynamo's),
``dram_weight: 0.1``, ``ssd_weight: 0.4``, ``remote_weight: 0.1``.

``mode: llm-d`` scores instead as llm-d's inference scheduler (the Gateway
API Inference Extension's endpoint picker, ``kubernetes-sigs/
gateway-api-inference-extension``, pkg/epp/scheduling/framework/plugins)
does with its default profile, each scorer's score in [0, 1], the weighted
sum highest wins (``max-score-picker``):

- ``prefix-cache-scorer``: the share of the prompt's blocks the instance
  holds as its leading run (here from any tier, as KV events report them;
  the scorer weighs no load time);
- ``queue-scorer``: ``(max - q) / (max - min)`` of the waiting requests ``q``
  over the candidates, 1 for all when they are equal;
- ``kv-cache-utilization-scorer``: 1 - the share of KV blocks in use, as
  vLLM's KV-cache usage metric counts it: a block only the prefix cache holds
  is free (vLLM keeps it in its free queue until it is taken).

The weights are ``prefix_weight: 3``, ``queue_weight: 2`` and
``kv_utilization_weight: 2``, those of the default-plugins.yaml of the
extension's InferencePool Helm chart, which llm-d's inference-scheduling
guide deploys (guides/inference-scheduling; the same 3 and 2 in Red Hat
OpenShift AI 3.4, "Configuring scheduler settings"). The picker breaks ties
at random; here they go to the lowest id. On a split cluster the prefill
instance is chosen by the three, the decode instance by the queue and KV
utilization scorers alone.

Colocated clusters: the candidates are the mixed instances. Split clusters:
the prefill instance is chosen by this cost, the decode instance (``pick_decode``,
once the prefill is done) by potential active blocks alone, ties to the
lowest id.

The potential active blocks are read from the view as the blocks the
instance's requests hold (its used KV blocks less ``cached_idle_blocks``,
those only the prefix cache keeps) plus its queued prompt tokens in blocks:
Dynamo's router counts the blocks of its active requests, added when one is
routed and taken off when it completes, and keeps the cached blocks apart in
its indexer of KV events (docs.nvidia.com/dynamo, "Router Design", "Block
Tracking Mechanisms").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    is_int,
    register,
)

MODES = ("dynamo", "llm-d")
WEIGHTS = ("overlap_score_weight", "dram_weight", "ssd_weight", "remote_weight", "prefix_weight",
           "queue_weight", "kv_utilization_weight")  # fmt: skip


def _by_tier(inst: InstanceView, req: Request) -> dict[str, int]:
    """Prompt tokens of ``req`` ``inst`` would reuse from each tier."""
    tiers = getattr(inst, "cached_prefix_by_tier", None)
    if tiers is None:
        return {"hbm": inst.cached_prefix_tokens(req), "dram": 0, "ssd": 0}
    return dict(tiers(req))


@register("kv-router")
@dataclass
class KVRouter(Scheduler, PicksDecode):
    """KV-aware router: Dynamo's block cost, or llm-d's weighted scorers (mode: llm-d).

    Dynamo: prefill blocks x overlap weight + active blocks, the lowest wins;
    llm-d: its prefix, queue and KV-utilization scorers, the highest wins."""

    overlap_score_weight: float = 1.0
    dram_weight: float = 0.1
    ssd_weight: float = 0.4
    remote_weight: float = 0.1
    mode: str = "dynamo"
    prefix_weight: float = 3.0
    queue_weight: float = 2.0
    kv_utilization_weight: float = 2.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r}; expected one of {', '.join(MODES)}")
        for name in WEIGHTS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise ValueError(f"{name}: {v!r} must be a finite number >= 0")
            if is_int(v):
                setattr(self, name, float(v))

    def setup(self, cluster: ClusterView) -> Plan:
        roles = {i.role for i in cluster.instances}
        if "mixed" in roles and roles - {"mixed"}:
            raise SpecError(
                "scheduler 'kv-router' routes a colocated or a split cluster, but this one "
                f"has {' and '.join(sorted(roles))} instances"
            )
        if roles - {"mixed"} and not ({"prefill", "decode"} <= roles):
            raise SpecError(
                "scheduler 'kv-router' needs prefill and decode instances on a split cluster; "
                "give cluster.prefill and cluster.decode"
            )
        return Plan()

    def prefill_blocks(self, inst: InstanceView, req: Request) -> float:
        """Blocks ``req`` would prefill on ``inst``, a reused block from a lower
        tier counted at its tier's weight."""
        by = _by_tier(inst, req)
        left = req.prompt_tokens
        hbm = min(by.get("hbm", 0), left)
        dram = min(by.get("dram", 0), left - hbm)
        ssd = min(by.get("ssd", 0), left - hbm - dram)
        remote = min(by.get("remote", 0), left - hbm - dram - ssd)
        new = left - hbm - dram - ssd - remote
        lower = self.dram_weight * dram + self.ssd_weight * ssd + self.remote_weight * remote
        return (new + lower) / inst.block_size

    @staticmethod
    def active_blocks(inst: InstanceView, req: Request) -> float:
        """Blocks ``inst`` would hold for its requests with ``req`` added: the
        blocks in use less those only the prefix cache holds, as Dynamo counts
        active blocks (a cached block no request holds is not among them)."""
        bs = inst.block_size
        used = inst.total_blocks - inst.free_blocks - getattr(inst, "cached_idle_blocks", 0)
        return used + (inst.queue_tokens + req.prompt_tokens) / bs

    def cost(self, inst: InstanceView, req: Request) -> float:
        return self.overlap_score_weight * self.prefill_blocks(inst, req) + self.active_blocks(
            inst, req
        )

    # -- llm-d's scorers ---------------------------------------------------------------
    @staticmethod
    def prefix_score(inst: InstanceView, req: Request) -> float:
        """llm-d's prefix-cache scorer: the share of ``req``'s prompt ``inst`` holds."""
        if req.prompt_tokens <= 0:
            return 0.0
        held = sum(_by_tier(inst, req).values())
        return min(held, req.prompt_tokens) / req.prompt_tokens

    @staticmethod
    def queue_scores(candidates: list[InstanceView]) -> dict[int, float]:
        """llm-d's queue scorer: waiting requests min-max normalised over
        ``candidates``, the shortest queue 1; all 1 when the queues are equal."""
        queues = [i.queue_requests for i in candidates]
        lo, hi = min(queues), max(queues)
        if hi == lo:
            return {i.id: 1.0 for i in candidates}
        return {i.id: (hi - i.queue_requests) / (hi - lo) for i in candidates}

    @staticmethod
    def kv_score(inst: InstanceView) -> float:
        """llm-d's KV-cache utilization scorer: 1 - the share of blocks in use,
        as vLLM's KV-cache usage counts them (the free blocks and those only
        the prefix cache holds are not in use: vLLM keeps them in its free
        queue, evicted when taken; v1 block_pool, ``get_usage``)."""
        if not inst.total_blocks:
            return 0.0
        free = inst.free_blocks + getattr(inst, "cached_idle_blocks", 0)
        return free / inst.total_blocks

    def scores(
        self, candidates: list[InstanceView], req: Request, *, prefix: bool = True
    ) -> dict[int, float]:
        """Instance id -> llm-d's weighted score of each of ``candidates``."""
        queue = self.queue_scores(candidates)
        out = {}
        for i in candidates:
            score = self.queue_weight * queue[i.id] + self.kv_utilization_weight * self.kv_score(i)
            if prefix:
                score += self.prefix_weight * self.prefix_score(i, req)
            out[i.id] = score
        return out

    @staticmethod
    def _best(scores: dict[int, float]) -> int:
        return min(scores, key=lambda i: (-scores[i], i))

    # -- the hooks -------------------------------------------------------------------
    def route(self, req: Request, view: ClusterView) -> Route | Reject:
        split = bool(view.of_role("prefill"))
        candidates = view.of_role("prefill") if split else view.of_role("mixed")
        if self.mode == "llm-d":
            pick = self._best(self.scores(list(candidates), req))
        else:
            pick = min(candidates, key=lambda i: (self.cost(i, req), i.id)).id
        return Route(pick) if split else Route(pick, pick)

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        decodes = view.of_role("decode")
        if self.mode == "llm-d":
            return self._best(self.scores(list(decodes), req, prefix=False))
        return min(decodes, key=lambda i: (self.active_blocks(i, req), i.id)).id
