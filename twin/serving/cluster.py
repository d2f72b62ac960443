"""Nodes, GPUs and the serving instances placed on them.

With a topology, every instance's GPUs lie in one node (its TP x PP group
talks over NVLink or PCIe) and the instance runs with that node's GPU type;
the KV of a split deployment then travels over the topology's paths between
the instances' GPUs. Without one, a node is a box of ``gpus_per_node``
identical GPUs and placement only labels instances (no KV moves).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from twin.errors import SpecError, UnknownNameError
from twin.perf.iteration import Batch
from twin.request import Request
from twin.serving.engine import Engine
from twin.serving.queuecost import QueueCost
from twin.serving.tiers import KVTiers


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one instance runs: its node and its global GPU indices."""

    instance: int
    node: int
    gpus: tuple[int, ...]


def place_instances(count: int, gpus_per_instance: int, gpus_per_node: int = 8) -> list[Placement]:
    """Pack ``count`` instances of ``gpus_per_instance`` GPUs onto nodes in order."""
    if count <= 0:
        raise SpecError(f"cluster.instances: {count!r} must be a positive integer")
    out = []
    gpu = 0
    for i in range(count):
        if (
            gpus_per_instance <= gpus_per_node
            and gpu % gpus_per_node + gpus_per_instance > gpus_per_node
        ):
            gpu += gpus_per_node - gpu % gpus_per_node  # start on a fresh node
        gpus = tuple(range(gpu, gpu + gpus_per_instance))
        out.append(Placement(i, gpu // gpus_per_node, gpus))
        gpu += gpus_per_instance
    return out


def place_on_topology(
    topology: Any,
    sizes: Sequence[int],
    order: Sequence[int],
    where: str = "cluster",
    templates: Sequence[str | None] | None = None,
    roles: Sequence[str] | None = None,
    span: Sequence[bool] | None = None,
) -> list[Placement]:
    """Place instance ``i`` (``sizes[i]`` GPUs) on ``topology``, taking instances
    in ``order``: each goes to the first node with enough free GPUs, on its
    lowest free ones. An instance never spans nodes.

    ``templates[i]``, when given and not None, names the node template
    (:meth:`Topology.template_of`) instance ``i`` must go to; those instances
    are placed first, in ``order``, so that the others cannot take their
    nodes. ``roles[i]`` names the instance's group in messages
    (``<where>.<role>.template``). ``span[i]`` true lets instance ``i`` (an
    expert-parallel one) take several whole free nodes when it needs more GPUs
    than one node has; its ``node`` is the first."""
    n = len(sizes)
    spans = list(span) if span is not None else [False] * n
    pinned = list(templates) if templates is not None else [None] * n
    role = list(roles) if roles is not None else ["instance"] * n
    free = {k: list(topology.gpus_of_node(k)) for k in range(topology.num_nodes)}
    largest = max(len(g) for g in free.values())
    placed: dict[int, Placement] = {}
    for i in [i for i in order if pinned[i] is not None] + [i for i in order if pinned[i] is None]:
        need, t = sizes[i], pinned[i]
        nodes = sorted(free) if t is None else [
            k for k in sorted(free) if topology.template_of(k) == t
        ]  # fmt: skip
        if t is not None and not nodes:
            raise UnknownNameError(
                "node template", t, topology.templates, where=f"{where}.{role[i]}.template"
            )
        if need > largest and spans[i]:
            whole = [k for k in nodes if len(free[k]) == len(topology.gpus_of_node(k))]
            taken: list[int] = []
            for k in whole:
                if len(taken) >= need:
                    break
                take = free[k][: need - len(taken)]
                taken += take
                del free[k][: len(take)]
            if len(taken) < need:
                raise SpecError(
                    f"{where}.{role[i]}: instance {i} needs {need} GPUs on whole free nodes;"
                    f" topology {topology.name!r} has too few left (raise cluster.nodes)"
                )
            placed[i] = Placement(i, topology.node_of(taken[0]), tuple(taken))
            continue
        if t is None and need > largest:
            raise SpecError(
                f"{where}: instance {i} needs {need} GPUs in one node; nodes of "
                f"{topology.name!r} have at most {largest}"
            )
        node = next((k for k in nodes if len(free[k]) >= need), None)
        if node is None and t is not None:
            same = [j for j in range(n) if pinned[j] == t and role[j] == role[i]]
            per = sorted({len(topology.gpus_of_node(k)) for k in nodes})
            shared = sum(1 for j in range(n) if pinned[j] == t) > len(same)
            raise SpecError(
                f"{where}.{role[i]}.template: {len(same)} {role[i]} instances of {need} GPUs "
                f"({need * len(same)} in all) do not fit on template {t!r}: topology "
                f"{topology.name!r} has {len(nodes)} node(s) of it with "
                f"{'/'.join(str(x) for x in per)} GPUs each"
                + (", shared with the other groups on it" if shared else "")
            )
        if node is None:
            total = sum(sizes)
            have = sum(len(topology.gpus_of_node(k)) for k in range(topology.num_nodes))
            raise SpecError(
                f"{where}: {n} instances need {total} GPUs in node-sized groups; "
                f"topology {topology.name!r} has {have} GPUs in {topology.num_nodes} nodes "
                "(raise cluster.nodes)"
            )
        gpus = tuple(free[node][:need])
        del free[node][:need]
        placed[i] = Placement(i, node, gpus)
    return [placed[i] for i in range(n)]


def placement_order(roles: Sequence[str], how: str) -> list[int]:
    """``packed``: instances in id order; ``interleaved``: prefill and decode
    instances alternate (P0, D0, P1, D1, ...) so that pairs share a node."""
    ids = list(range(len(roles)))
    if how == "packed":
        return ids
    pre = [i for i in ids if roles[i] == "prefill"]
    dec = [i for i in ids if roles[i] == "decode"]
    rest = [i for i in ids if roles[i] not in ("prefill", "decode")]
    out: list[int] = []
    for k in range(max(len(pre), len(dec))):
        out += pre[k : k + 1] + dec[k : k + 1]
    return out + rest


class EngineView:
    """The live, read-only :class:`twin.scheduler.InstanceView` of an engine."""

    __slots__ = ("_engine", "_placement", "_fetch", "_tiers", "_cost", "model")

    def __init__(
        self,
        engine: Engine,
        placement: Placement,
        fetch: Callable[[int, int, int, Request | None], float] | None = None,
        tiers: KVTiers | None = None,
        model: str = "",
    ) -> None:
        self._engine = engine
        self._placement = placement
        self._fetch = fetch  # (instance, node, tokens, request) -> seconds
        self._tiers = tiers
        self._cost = QueueCost()  # the queue estimate, kept as requests join
        self.model = model  # the model it serves on a cluster of several ("": the only one)

    @property
    def role(self) -> str:
        return self._engine.role

    @property
    def id(self) -> int:
        return self._engine.id

    @property
    def node(self) -> int:
        return self._placement.node

    @property
    def gpus(self) -> tuple[int, ...]:
        return self._placement.gpus

    @property
    def block_size(self) -> int:
        return self._engine.kv.block_size

    @property
    def total_blocks(self) -> int:
        return self._engine.kv.total

    @property
    def free_blocks(self) -> int:
        e = self._engine
        e.sync_blocks()  # the blocks of the steps under way; nothing else is read
        return e.kv.free

    @property
    def cached_idle_blocks(self) -> int:
        """KV blocks only the prefix cache holds (no sequence uses them):
        evictable, so vLLM's KV-cache usage counts them free."""
        self._engine.sync()
        cache = self._engine.cache
        return cache.evictable_blocks if cache is not None else 0

    @property
    def queue_requests(self) -> int:
        return len(self._engine.waiting)

    @property
    def queue_tokens(self) -> int:
        return self._engine.waiting_tokens

    @property
    def running_requests(self) -> int:
        return self._engine.running_requests

    @property
    def up(self) -> bool:
        return self._engine.up

    @property
    def state(self) -> str:
        return self._engine.state

    @property
    def accepting(self) -> bool:
        return self._engine.up and self._engine.state == "serving"

    def estimate_prefill_s(self, tokens: int, cached: int = 0) -> float:
        spec = self._engine.spec
        timed = self._engine.perf.iteration_time if spec is None else spec.iteration_time
        return timed(Batch(((max(tokens, 1), cached),)))

    def estimate_decode_s(self, count: int, context_sum: int) -> float:
        if count <= 0:
            return 0.0
        batch = Batch((), count, context_sum)
        spec = self._engine.spec
        if spec is None:
            return self._engine.perf.iteration_time(batch)
        return spec.iteration_time(batch) / spec.config.mean_emitted

    def estimate_queue_s(self) -> float:
        return self._cost.estimate_s(self._engine)

    def cached_prefix_tokens(self, req: Request) -> int:
        return self._engine.cached_prefix_tokens(req)

    def cached_prefix_by_tier(self, req: Request) -> dict[str, int]:
        e = self._engine
        if self._tiers is None:
            return {"hbm": e.cached_prefix_tokens(req), "dram": 0, "ssd": 0}
        return self._tiers.prefix_by_tier(e, req)

    def estimate_fetch_s(self, node: int, tokens: int, req: Request | None = None) -> float:
        if self._fetch is None or tokens <= 0:
            return 0.0
        return self._fetch(self._engine.id, node, tokens, req)
