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
run in HBM, then its continuation in host DRAM and on SSD, see
:mod:`twin.serving.tiers`): a block in HBM costs nothing to reuse; one in a
lower tier costs ``dram_weight`` or ``ssd_weight`` of a block computed, its
load time against its prefill time. The defaults take Llama-3-8B on an H100
(KV 128 KiB per token; prefill about 16 GFLOP per token at about 600 TFLOP/s,
some 27 us): a load at 55 GB/s over PCIe Gen5 x16 takes 2.4 us a token (0.1),
one at the PM1743 SSD's 13 GB/s 10 us (0.4).

Parameters, with their defaults: ``overlap_score_weight: 1.0`` (Dynamo's),
``dram_weight: 0.1``, ``ssd_weight: 0.4``.

Colocated clusters: the candidates are the mixed instances. Split clusters:
the prefill instance is chosen by this cost, the decode instance (``pick_decode``,
once the prefill is done) by potential active blocks alone, ties to the
lowest id.

NOTE: the potential active blocks are read from the view as the instance's
used KV blocks plus its queued prompt tokens in blocks; with prefix caching
the used blocks include cached prefixes no request holds, which Dynamo's
router (tracking its own requests' blocks) does not count.
"""

from __future__ import annotations

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


def _by_tier(inst: InstanceView, req: Request) -> dict[str, int]:
    """Prompt tokens of ``req`` ``inst`` would reuse from each tier."""
    tiers = getattr(inst, "cached_prefix_by_tier", None)
    if tiers is None:
        return {"hbm": inst.cached_prefix_tokens(req), "dram": 0, "ssd": 0}
    return dict(tiers(req))


@register("kv-router")
@dataclass
class KVRouter(Scheduler, PicksDecode):
    """Dynamo-style KV router: prefill blocks x overlap weight + active blocks, lowest wins."""

    overlap_score_weight: float = 1.0
    dram_weight: float = 0.1
    ssd_weight: float = 0.4

    def __post_init__(self) -> None:
        for name in ("overlap_score_weight", "dram_weight", "ssd_weight"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"{name}: {v!r} must be a number >= 0")
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
        new = left - hbm - dram - ssd
        return (new + self.dram_weight * dram + self.ssd_weight * ssd) / inst.block_size

    @staticmethod
    def active_blocks(inst: InstanceView, req: Request) -> float:
        """Blocks ``inst`` would hold for its requests with ``req`` added."""
        bs = inst.block_size
        used = inst.total_blocks - inst.free_blocks
        return used + (inst.queue_tokens + req.prompt_tokens) / bs

    def cost(self, inst: InstanceView, req: Request) -> float:
        return self.overlap_score_weight * self.prefill_blocks(inst, req) + self.active_blocks(
            inst, req
        )

    def route(self, req: Request, view: ClusterView) -> Route | Reject:
        split = bool(view.of_role("prefill"))
        candidates = view.of_role("prefill") if split else view.of_role("mixed")
        best = min(candidates, key=lambda i: (self.cost(i, req), i.id))
        return Route(best.id) if split else Route(best.id, best.id)

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        decodes = view.of_role("decode")
        return min(decodes, key=lambda i: (self.active_blocks(i, req), i.id)).id
