"""Scaling: instances a policy adds and removes as the run goes.

A ``tick`` may return :class:`~twin.scheduler.AddInstance` and
:class:`~twin.scheduler.RemoveInstance`. An added instance is placed on free
GPUs of one node (a topology's nodes, or nodes of ``cluster.gpus_per_node``
GPUs without one), built as the spec's instances are, and pays a start-up
cost before it serves: its weights loaded at a modelled bandwidth (from
storage, or from a serving peer over the topology's path) plus a warm-up.
An instance added to a pool whose instances are expert-parallel (its
``cluster`` group has ``ep`` above 1) keeps the pool's layout: the
group's ``ep`` and ``dp`` with its ``tp`` and ``pp``, on ``dp x tp x pp``
GPUs (whole free nodes when that is more than a node holds). The action's
``tp`` and ``pp`` must then be the group's, or give its GPUs in all
(``tp x pp = dp x tp x pp``, as a policy that sees an instance's GPUs only
asks for one like it). A removed instance drains: it takes nothing new, finishes what it holds
(queued prompts included), then releases its GPUs.

GPU-seconds count every instance's GPUs from its allocation (0, or when it
was added: start-up included) to its release or the run's end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from twin._check import is_int
from twin._declare import BANDWIDTH, choice, declared, seconds
from twin.errors import SpecError
from twin.scheduler import ROLES, AddInstance, RemoveInstance
from twin.serving.cluster import Placement
from twin.serving.engine import Engine

if TYPE_CHECKING:
    from twin.sim.ops import ClusterOps


@dataclass(frozen=True)
class ScalingKeys:
    """The start-up cost of an instance a policy adds (``scaling:``)."""

    weights_from: str = declared(
        "storage", choice("storage", "network"),
        "storage: weights read at storage_bandwidth; network: from a serving peer "
        "instance over the topology's path (storage without a peer or a topology)",
    )  # fmt: skip
    # ServerlessLLM (Fu et al., OSDI 2024, section 2): a 130 GB checkpoint takes
    # about 26 s to fetch at 5 GB/s, their figure for a server's model download.
    storage_bandwidth: float = declared(
        "5 GB/s", BANDWIDTH, "bytes/s an instance reads its weights at from storage"
    )
    # vLLM's engine init after loading weights, with torch.compile cached: "init
    # engine (profile, create kv cache, warmup model) took 34.11 seconds", 17 s
    # of it CUDA graph capture (vllm-project/vllm issue 20264, Llama 3.2 log).
    warmup_s: float = declared(
        "34 s", seconds(positive=False), "engine init after the weights: profiling, "
        "KV cache, CUDA graph capture", key="warmup",
    )  # fmt: skip


class Scaler:
    """Carries out policy ``name``'s :class:`AddInstance` and
    :class:`RemoveInstance` on a cluster (``ops``), and keeps the
    GPU-seconds; ``groups`` are the spec's instance groups (an added
    instance keeps its pool's expert-parallel layout), ``topology`` its
    topology (None: nodes of ``gpus_per_node`` GPUs), ``weight_bytes`` what
    a new instance of each model loads before it serves (by model name; ""
    the only model)."""

    def __init__(
        self, ops: ClusterOps, keys: ScalingKeys, name: str, groups: Sequence[Any],
        topology: Any, gpus_per_node: int, weight_bytes: Mapping[str, float],
    ) -> None:  # fmt: skip
        self.ops = ops
        self.keys = keys
        self.name = name
        self.groups = groups
        self.topology = topology
        self.gpus_per_node = gpus_per_node
        self.weight_bytes = weight_bytes
        # instance -> [allocated at, released at or None, GPUs]
        self.alloc: dict[int, list[Any]] = {
            p.instance: [0.0, None, len(p.gpus)] for p in ops.placements
        }
        self.scaled = False  # a policy added or removed an instance
        self.started: list[tuple[float, float, int]] = []  # (asked, serving, instance)
        self.released: list[tuple[float, float, int]] = []  # (asked, released, instance)
        self._drain_asked: dict[int, float] = {}
        self.failed_starting: set[int] = set()  # failed (their node, say) while starting
        # instance -> the model it serves ("" the only one): the spec's, in group order
        self.model_of = dict(enumerate(g.model for g in groups for _ in range(g.count)))

    def failed_while_starting(self, i: int) -> None:
        """Instance ``i`` failed while starting: it comes up failed (unless
        repaired first)."""
        self.failed_starting.add(i)

    def repaired(self, i: int) -> None:
        """Instance ``i`` was repaired: it comes up serving, when still starting."""
        self.failed_starting.discard(i)

    # -- GPU-seconds -------------------------------------------------------------------
    def gpu_seconds(self, end_s: float) -> float:
        """GPUs allocated, integrated from 0 to ``end_s``."""
        total = 0.0
        for start, stop, gpus in self.alloc.values():
            stop = end_s if stop is None else min(stop, end_s)
            total += gpus * max(0.0, stop - start)
        return total

    # -- adding ------------------------------------------------------------------------
    def _free_gpus(self) -> dict[int, list[int]]:
        """Node -> its free GPUs (not held by an instance that is not stopped)."""
        ops = self.ops
        held = {g for e, p in zip(ops.engines, ops.placements, strict=True)
                if e.state != "stopped" for g in p.gpus}  # fmt: skip
        topo = self.topology
        if topo is not None:
            return {
                k: [g for g in topo.gpus_of_node(k) if g not in held] for k in range(topo.num_nodes)
            }
        per = self.gpus_per_node
        top = max(held, default=-1)
        nodes = (top + 1) // per + 2  # the nodes in use and a fresh one
        return {
            k: [g for g in range(k * per, (k + 1) * per) if g not in held] for k in range(nodes)
        }

    def _layout(self, a: AddInstance) -> tuple[int, int, int, int]:
        """``(tp, pp, ep, dp)`` of the instance ``a`` adds: the pool's
        expert-parallel layout when its group has one, else ``a``'s TP x PP."""
        group = next((g for g in self.groups if g.role == a.role and g.model == a.model), None)
        if group is None or group.ep == 1:
            return a.tp, a.pp, 1, 1
        if (a.tp, a.pp) != (group.tp, group.pp) and a.tp * a.pp != group.gpus:
            raise SpecError(
                f"scheduler {self.name!r}: {a} does not fit the {a.role} pool's layout EP{group.ep}"
                f" (DP{group.dp} x TP{group.tp} x PP{group.pp}, {group.gpus} GPUs); give its"
                f" tp={group.tp}, pp={group.pp} or tp x pp = {group.gpus}"
            )
        return group.tp, group.pp, group.ep, group.dp

    def _place(self, a: AddInstance, need: int, span: bool = False) -> Placement:
        name = self.name
        n = len(self.ops.engines)  # the new instance's id
        free = self._free_gpus()
        topo = self.topology
        nodes = sorted(free)
        if a.node is not None:
            if not is_int(a.node) or a.node not in free:
                raise SpecError(f"scheduler {name!r}: {a} names node {a.node!r}; nodes are "
                                f"0..{len(free) - 1}")  # fmt: skip
            nodes = [a.node]
        elif a.template is not None:
            if topo is None or a.template not in topo.templates:
                raise SpecError(f"scheduler {name!r}: {a} names node template {a.template!r}")
            nodes = [k for k in nodes if topo.template_of(k) == a.template]
        size = {k: len(topo.gpus_of_node(k)) if topo is not None else self.gpus_per_node
                for k in nodes}  # fmt: skip
        if span and need > max(size.values(), default=0):
            # an expert-parallel instance wider than a node: whole free nodes, in order
            taken: list[int] = []
            first = -1
            for k in nodes:
                if len(taken) < need and len(free[k]) == size[k]:
                    first = k if not taken else first
                    taken += free[k][: need - len(taken)]
            if len(taken) < need:
                raise SpecError(
                    f"scheduler {name!r}: {a} needs {need} GPUs on whole free nodes; too few"
                    " are free"
                )
            return Placement(n, first, tuple(taken))
        node = next((k for k in nodes if len(free[k]) >= need), None)
        if node is None:
            raise SpecError(
                f"scheduler {name!r}: {a} needs {need} free GPUs in one node; none has them"
            )
        return Placement(n, node, tuple(free[node][:need]))

    def startup_s(self, placement: Placement, model: str = "") -> float:
        """Weights of ``model`` loaded (from storage, or from a serving peer
        over the topology's bottleneck bandwidth) plus the warm-up."""
        ops, keys = self.ops, self.keys
        weights = self.weight_bytes[model]
        bandwidth = keys.storage_bandwidth
        topo = self.topology
        if keys.weights_from == "network" and topo is not None:
            peers = [p for e, p in zip(ops.engines, ops.placements, strict=True)
                     if e.up and e.state == "serving"]  # fmt: skip
            if peers:
                dst = placement.gpus[0]
                bandwidth = max(topo.bottleneck_bytes_s(topo.path(p.gpus[0], dst)) for p in peers)
        return weights / bandwidth + keys.warmup_s

    def add(self, a: AddInstance) -> None:
        ops, name = self.ops, self.name
        if a.role not in ROLES:
            raise SpecError(f"scheduler {name!r}: {a} gives role {a.role!r}; expected one of "
                            f"{', '.join(ROLES)}")  # fmt: skip
        for key in ("tp", "pp"):
            v = getattr(a, key)
            if not is_int(v) or v <= 0:
                raise SpecError(f"scheduler {name!r}: {a}: {key} {v!r} must be a positive integer")
        if a.role != "mixed" and self.topology is None:
            raise SpecError(
                f"scheduler {name!r}: {a}: a {a.role} instance needs a topology for the KV "
                "cache to travel over (cluster.topology)"
            )
        tp, pp, ep, dp = self._layout(a)
        placement = self._place(a, dp * tp * pp, span=ep > 1)
        now = ops.env.now
        # starting; on a failed node, say, it comes up failed
        eng = ops.add_instance(placement, a.role, tp, pp, ep, dp, a.model)
        self.model_of[eng.id] = a.model
        self.scaled = True
        self.alloc[eng.id] = [now, None, len(placement.gpus)]
        cost = self.startup_s(placement, a.model)
        ops.env.timeout(cost).callbacks.append(lambda _ev: self._ready(eng, now))

    def _ready(self, eng: Engine, asked: float) -> None:
        ops = self.ops
        eng.started()
        self.started.append((asked, ops.env.now, eng.id))
        ops.capacity_changed()
        ops.instance_started(eng.id)
        if eng.id in self.failed_starting:  # it failed while starting: down until repaired
            self.failed_starting.discard(eng.id)
            ops.fail_instance(eng.id)

    # -- removing ----------------------------------------------------------------------
    def remove(self, a: RemoveInstance) -> None:
        ops, name = self.ops, self.name
        i, n = a.instance, len(ops.engines)
        if not is_int(i) or not 0 <= i < n:
            raise SpecError(f"scheduler {name!r}: {a} names instance {i!r}; instances are "
                            f"0..{n - 1}")  # fmt: skip
        eng = ops.engines[i]
        if eng.state in ("draining", "stopped"):
            return
        if eng.state == "starting":
            raise SpecError(f"scheduler {name!r}: {a}: instance {i} is still starting")
        model = self.model_of[i]  # each model keeps an instance that prefills and one that decodes
        left = [
            e for e in ops.engines
            if e is not eng and e.state == "serving" and self.model_of[e.id] == model
        ]  # fmt: skip
        pre = any(e.role != "decode" for e in left)
        dec = any(e.role != "prefill" for e in left)
        if not (pre and dec):
            of = f" of model {model!r}" if model else ""
            raise SpecError(
                f"scheduler {name!r}: {a} would leave no serving instance{of} that "
                f"{'prefills' if not pre else 'decodes'}"
            )
        self.scaled = True
        eng.drain(self._check_drained)
        self._drain_asked[i] = ops.env.now
        ops.capacity_changed()
        self._check_drained(eng)

    def _check_drained(self, eng: Engine) -> None:
        """Release ``eng`` once nothing is left on it or bound to it (a prompt
        prefilling elsewhere whose KV is to move here), a step later so that
        the engine finishes the change it is making."""
        if eng.state != "draining" or eng.holds_work() or self._bound_to(eng.id):
            return
        self.ops.env.timeout(0).callbacks.append(lambda _ev: self._release(eng))

    def _bound_to(self, i: int) -> bool:
        return any(
            s.handoff and s.decode_instance == i
            for e in self.ops.engines
            if e.id != i and e.state != "stopped"
            for s in e.held()
        )

    def _release(self, eng: Engine) -> None:
        if eng.state != "draining" or eng.holds_work() or self._bound_to(eng.id):
            return
        self.stop(eng)

    def stop(self, eng: Engine) -> None:
        """Release ``eng``'s GPUs now (drained, or failed while draining)."""
        now = self.ops.env.now
        was_up = eng.up
        eng.stop()
        self.alloc[eng.id][1] = now
        self.released.append((self._drain_asked.get(eng.id, now), now, eng.id))
        if was_up:
            self.ops.instance_stopped(eng.id)

    def recheck(self) -> None:
        """Drains whose last bound request went elsewhere (its prefill side failed)."""
        for e in self.ops.engines:
            if e.state == "draining":
                self._check_drained(e)
