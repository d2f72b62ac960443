"""Where a spec's instances run, and every check that needs to know it.

A spec resolves (:func:`twin.sim.spec.resolve_spec`) with its instances
placed: on the topology's nodes, or on boxes of ``gpus_per_node`` GPUs.
What can only be checked against that placement is checked there too, so
that ``twin spec`` refuses what ``twin run`` would: that the instances fit
the topology, that each leaves room for a KV cache on the GPUs it is placed
on, that every ``events:`` target is a part of the cluster, that random
failures of NICs and links have a topology to fail in, that the KV
store of ``kv_tiers.remote`` sits on a node of its own, and that the perf
model builds for every instance on the GPU it is placed on. The run then builds
on the placement it was given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twin.errors import CapacityError, SpecError
from twin.net.topology import all_to_all_links
from twin.perf.build import build_perf_model
from twin.perf.gpus import GPUSpec, get_gpu
from twin.perf.llm import ModelSpec
from twin.serving.cluster import Placement, place_instances, place_on_topology, placement_order
from twin.serving.engine import EngineConfig
from twin.serving.kvcache import kv_capacity_blocks


def place(
    groups: Sequence[Any], topology: Any, how: str, gpus_per_node: int, where: str
) -> list[Placement]:
    """Where each instance of ``groups`` (``twin.sim.spec.InstanceGroup``, in
    instance id order) runs: on ``topology`` as ``how`` (``placement``)
    orders them, or without one packed on nodes of ``gpus_per_node`` GPUs."""
    roles = [g.role for g in groups for _ in range(g.count)]
    sizes = [g.gpus for g in groups for _ in range(g.count)]
    if topology is None:
        return place_instances(len(roles), sizes[0], gpus_per_node)
    return place_on_topology(
        topology, sizes, placement_order(roles, how), where=f"{where}: cluster", roles=roles,
        templates=[g.template for g in groups for _ in range(g.count)],
        span=[g.ep > 1 for g in groups for _ in range(g.count)],
    )  # fmt: skip


def kv_blocks(
    model: ModelSpec, engine: EngineConfig, gpu: GPUSpec, role: str, tp: int, pp: int,
    ep: int = 1, dp: int = 1,
) -> int:  # fmt: skip
    """KV blocks of one instance of ``role`` on ``gpu`` (``dp x tp x pp`` of
    them); :class:`CapacityError` when its weights leave no room for them."""
    weights: float = model.weight_bytes
    if ep > 1:  # dense weights on each TP group, the experts split ep ways
        weights = model.weight_bytes_per_gpu(tp, pp, ep) * tp * pp
    try:
        return dp * kv_capacity_blocks(
            gpu_memory_bytes=gpu.memory_bytes,
            memory_utilization=engine.gpu_memory_utilization,
            weight_bytes=weights,
            activation_reserve_bytes=engine.activation_reserve_bytes,
            kv_bytes_per_token=model.kv_bytes_per_token_tp(tp),  # KV heads replicated
            tp=tp,
            pp=pp,
            block_size=engine.block_size,
        )
    except CapacityError:
        if ep == 1:
            raise
        usable = gpu.memory_bytes * engine.gpu_memory_utilization / 2**30
        raise CapacityError(
            f"no memory left for the KV cache: each GPU of the {role} instance (EP{ep}, "
            f"DP{dp} x TP{tp} x PP{pp}) has {usable:.1f} GiB usable and its weights take"
            f" {weights / (tp * pp) / 2**30:.1f} GiB"
            f" (the experts over {ep} GPUs); raise ep or use a larger GPU"
        ) from None


def instance_gpu(topology: Any, gpu: GPUSpec, p: Placement) -> GPUSpec:
    """The GPU instance ``p`` runs on: its node's, or without a topology ``gpu``."""
    return get_gpu(topology.gpu_type(p.gpus[0])) if topology is not None else gpu


def perf_shape(
    topology: Any, gpu: GPUSpec, p: Placement, tp: int, pp: int, ep: int, dp: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What instances that share a perf model have in common (the GPU, the
    shape and, expert-parallel, the links its all-to-alls run on), and
    those links (:func:`twin.net.topology.all_to_all_links`; none when dense)."""
    if ep == 1:
        return (gpu.name, tp, pp), {}
    a2a = all_to_all_links(topology, p.gpus[: dp * tp]) if topology is not None else {}
    return (gpu.name, tp, pp, ep, dp, *sorted(a2a.items())), a2a


def check_ep(model: ModelSpec, g: Any, g_keys: Any, where: str) -> None:
    """An expert-parallel layout a real engine accepts: a MoE model, ``ep``
    dividing its routed experts, and ``ep = dp x tp`` (the experts span the
    attention ranks of a stage, as in vLLM's and SGLang's EP); ``dp`` above 1
    only with EP. ``g`` is a ``twin.sim.spec.InstanceGroup``, ``g_keys`` its
    group's keys as given (None: a colocated cluster's)."""
    if g.ep == 1 and g.dp == 1:
        return
    pre = f"cluster.{g.role}" if g.role != "mixed" else "cluster"
    at = {
        k: f"{pre}.{k}" if g_keys is not None and getattr(g_keys, k) is not None else f"cluster.{k}"
        for k in ("ep", "dp")
    }
    name = "ep" if g.ep > 1 else "dp"
    if not model.is_moe:
        raise SpecError(
            f"{where}: {at[name]}: {getattr(g, name)} needs a mixture-of-experts model;"
            f" {model.name} is dense"
        )
    if model.experts % g.ep:
        raise SpecError(
            f"{where}: {at['ep']}: {g.ep} does not divide {model.name}'s {model.experts} experts"
        )
    if g.ep != g.dp * g.tp:
        raise SpecError(
            f"{where}: {at['ep']}: {g.ep} must equal dp x tp = {g.dp} x {g.tp} = {g.dp * g.tp}"
            " (the experts span the instance's attention ranks)"
        )


def check_perf(
    perf: Any, model: ModelSpec, gpu: GPUSpec, groups: Sequence[Any], topology: Any,
    placements: Sequence[Placement], where: str, base_dir: Any,
) -> None:  # fmt: skip
    """The perf model builds for every instance, on the GPU it is placed on
    and in its shape: a profile table or fit has rows for them, and the
    model's keys go together."""
    seen = set()
    i = 0
    for g in groups:
        for _ in range(g.count):
            p = placements[i]
            i += 1
            on = instance_gpu(topology, gpu, p)
            key, a2a = perf_shape(topology, on, p, g.tp, g.pp, g.ep, g.dp)
            if key in seen:
                continue
            seen.add(key)
            build_perf_model(
                perf, model, on, g.tp, g.pp, where=f"{where}: perf", base_dir=base_dir,
                ep=g.ep, dp=g.dp, a2a=a2a,
            )  # fmt: skip


def check_memory(
    model: ModelSpec, engine: EngineConfig, gpu: GPUSpec, groups: Sequence[Any],
    topology: Any, placements: Sequence[Placement], where: str,
) -> None:  # fmt: skip
    """Every instance leaves room for a KV cache on the GPUs it is placed on."""
    seen = set()
    i = 0
    for g in groups:
        for _ in range(g.count):
            on = instance_gpu(topology, gpu, placements[i])
            i += 1
            shape = (on.name, g.role, g.tp, g.pp, g.ep, g.dp)
            if shape in seen:
                continue
            seen.add(shape)
            try:
                kv_blocks(model, engine, on, g.role, g.tp, g.pp, g.ep, g.dp)
            except CapacityError as e:
                key = "cluster" if g.role == "mixed" else f"cluster.{g.role}"
                raise CapacityError(f"{where}: {key}: {e}") from None


def check_targets(  # noqa: C901
    events: Sequence[Any], failures: Sequence[Any], kv_tiers: Any, topology: Any,
    placements: Sequence[Placement], where: str,
) -> None:  # fmt: skip
    """Every ``events:`` target is a part of the cluster; random failures of
    NICs and links need a topology; a remote KV store sits on a node of the
    topology that holds no instance."""
    for ci, c in enumerate(failures):
        if c.component in ("nic", "link") and topology is None:
            raise SpecError(
                f"{where}: failures.random[{ci}].component: {c.component!r} needs cluster.topology"
            )
    gpus = sorted(g for p in placements for g in p.gpus)
    if topology is not None:  # an instance spans nodes only there (place_on_topology)
        nodes = sorted({topology.node_of(g) for g in gpus})
    else:
        nodes = sorted({p.node for p in placements})
    for e in events:
        key = f"{where}: events[{e.index}].{e.target}"
        if e.target == "instance" and not e.name < len(placements):
            raise SpecError(f"{key}: {e.name}; instances are 0..{len(placements) - 1}")
        if e.target == "node" and e.name not in nodes:
            raise SpecError(f"{key}: {e.name}; instances run on nodes {nodes}")
        if e.target == "gpu" and e.name not in gpus:
            raise SpecError(f"{key}: {e.name}; instances run on GPUs {gpus[0]}..{gpus[-1]}")
        if e.target == "nic":
            if topology is None or topology.graph.nodes.get(e.name, {}).get("type") != "nic":
                raise SpecError(
                    f"{key}: {e.name!r} is not a NIC of the topology (twin topo names them)"
                )
        if e.target == "link":
            if topology is None:
                raise SpecError(f"{key}: {e.name!r}; a link needs cluster.topology")
            src, _, dst = str(e.name).partition(" -> ")
            try:
                topology.link(src, dst)
            except KeyError as err:
                raise SpecError(f"{key}: {e.name!r}: {err.args[0]}") from None
    remote = kv_tiers.remote if kv_tiers is not None else None
    if remote is None:
        return
    at = f"{where}: kv_tiers.remote"
    if topology is None:
        raise SpecError(f"{at}: the store is reached over the network; give a cluster.topology")
    node = remote.node
    if not 0 <= node < topology.num_nodes:
        raise SpecError(f"{at}: node {node!r}: the topology has nodes 0..{topology.num_nodes - 1}")
    if node in nodes:
        raise SpecError(
            f"{at}: node {node} holds an instance; the store needs a node of its own "
            "(add one: cluster.nodes)"
        )
