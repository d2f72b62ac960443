"""Nodes, GPUs and the serving instances placed on them.

NOTE: until topologies arrive, a node is a box of ``gpus_per_node`` identical
GPUs and instances fill nodes in order (an instance's TP x PP group never
straddles a node when it fits in one). Placement only labels instances here;
nothing in the timing depends on it yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from twin.engine import Engine
from twin.errors import SpecError
from twin.perf import Batch


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


class EngineView:
    """The live, read-only :class:`twin.scheduler.InstanceView` of an engine."""

    __slots__ = ("_engine", "_placement", "role")

    def __init__(self, engine: Engine, placement: Placement, role: str) -> None:
        self._engine = engine
        self._placement = placement
        self.role = role

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
        self._engine.sync()
        return self._engine.kv.free

    @property
    def queue_requests(self) -> int:
        return len(self._engine.waiting)

    @property
    def queue_tokens(self) -> int:
        return self._engine.waiting_tokens

    @property
    def running_requests(self) -> int:
        return len(self._engine.running)

    def estimate_prefill_s(self, tokens: int) -> float:
        return self._engine.perf.iteration_time(Batch(((tokens, 0),)))
