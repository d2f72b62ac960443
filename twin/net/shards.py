"""The flows that move one instance's KV to another's GPUs, shard by shard.

Each GPU of an instance holds a share of a request's KV (TP shards the heads,
PP the layers); moving it to another instance is one flow per source GPU (a
KV hand-off, a KV pool's load or a tier's write), spread over every NIC of
the source node with ``multi_nic``, as Mooncake's transfer engine does.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from twin.net.flows import FlowSpec
from twin.net.topology import Topology


def shard_flows(
    topology: Topology,
    src_gpus: Seq[int],
    dst_gpus: Seq[int],
    kv_bytes: float,
    *,
    multi_nic: bool = False,
) -> list[FlowSpec]:
    """The flows that move ``kv_bytes`` of KV from one instance's GPUs to another's.

    Source GPU ``i`` holds ``1/len(src_gpus)`` of the KV (TP shards the heads,
    PP the layers) and sends it to destination GPU ``i mod len(dst_gpus)``.
    NOTE: when the two sides' parallelism differs, a real system reshards; here
    each source shard goes whole to one destination GPU, so the per-GPU load on
    the destination side is approximate.
    """
    paths = shard_paths(topology, src_gpus, dst_gpus, multi_nic=multi_nic)
    return sized_flows(paths, len(src_gpus), kv_bytes)


def shard_paths(
    topology: Topology, src_gpus: Seq[int], dst_gpus: Seq[int], *, multi_nic: bool = False
) -> list[tuple[FlowSpec, int]]:
    """The flows of :func:`shard_flows` with no bytes yet, each with the number
    of NICs its source GPU's share is spread over (1 but with ``multi_nic``)."""
    out: list[tuple[FlowSpec, int]] = []
    for i, g in enumerate(src_gpus):
        d = dst_gpus[i % len(dst_gpus)]
        if g == d:
            continue  # the same GPU: nothing moves
        src_node = topology.node_of(g)
        if multi_nic and src_node != topology.node_of(d):
            n = topology.nic_count(src_node)
            for k in range(n):
                out.append((FlowSpec(topology.path(g, d, nic=k), 0.0), n))
        else:
            out.append((FlowSpec(topology.path(g, d), 0.0), 1))
    return out


def sized_flows(paths: Seq[tuple[FlowSpec, int]], shards: int, kv_bytes: float) -> list[FlowSpec]:
    """``kv_bytes`` over ``paths`` (:func:`shard_paths`) from ``shards`` source GPUs."""
    share = kv_bytes / shards
    return [f.resized(share if n == 1 else share / n) for f, n in paths]
