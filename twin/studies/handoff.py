"""The KV hand-off of one prompt on an otherwise idle network (``twin handoff``):
bytes, flows, path, bottleneck and time, simulated with the same flows as a run.
"""

from __future__ import annotations

from typing import Any

import simpy

from twin.errors import SpecError
from twin.net.flows import FlowSpec, Network
from twin.net.topology import Topology
from twin.serving.handoff import MODES, shard_flows

PLACEMENTS = ("same-node", "cross-node")


def handoff_estimate(
    model: Any,
    tokens: int,
    topology: Topology,
    *,
    tp: int = 1,
    placement: str = "cross-node",
    mode: str = "serialized",
    multi_nic: bool = False,
    prefill_s: float | None = None,
) -> dict[str, Any]:
    """The KV hand-off of one ``tokens``-token prompt between two TP-``tp``
    instances on an otherwise idle network: bytes moved, the flows and the time
    they take (simulated, so shards that share a link share it).

    ``layerwise`` streams during a prefill of ``prefill_s`` seconds (by default
    the Roofline's time for this prompt on the source GPU) and reports only the
    residual after the prefill ends.
    """
    from twin.perf.gpus import get_gpu
    from twin.perf.iteration import Batch
    from twin.perf.roofline import Roofline

    if placement not in PLACEMENTS:
        raise SpecError(f"placement: {placement!r}; expected one of {', '.join(PLACEMENTS)}")
    if mode not in MODES:
        raise SpecError(f"mode: {mode!r}; expected one of {', '.join(MODES)}")
    if tokens <= 0 or tp <= 0:
        raise SpecError(f"tokens (={tokens}) and tp (={tp}) must be > 0")
    node0 = topology.gpus_of_node(0)
    if placement == "same-node":
        if 2 * tp > len(node0):
            raise SpecError(
                f"same-node: two TP{tp} instances need {2 * tp} GPUs; a node of "
                f"{topology.name!r} has {len(node0)}"
            )
        src, dst = node0[:tp], node0[tp : 2 * tp]
    else:
        if topology.num_nodes < 2:
            raise SpecError(
                f"cross-node: topology {topology.name!r} has one node; scale a template "
                "with --nodes, or use --placement same-node"
            )
        node1 = topology.gpus_of_node(1)
        if tp > min(len(node0), len(node1)):
            raise SpecError(f"cross-node: TP{tp} does not fit in a node of {topology.name!r}")
        src, dst = node0[:tp], node1[:tp]
    kv_bytes = model.kv_bytes_per_token() * tokens
    flows = shard_flows(topology, src, dst, float(kv_bytes), multi_nic=multi_nic)
    env = simpy.Environment()
    net = Network(env)
    stream_s = 0.0
    if mode == "layerwise":
        if prefill_s is None:
            perf = Roofline(model, get_gpu(topology.gpu_type(src[0])), tp)
            prefill_s = perf.iteration_time(Batch(((tokens, 0),)))
        stream_s = prefill_s
        layer_s = prefill_s / model.layers
        capped = [FlowSpec(f.path, f.size_bytes, f.size_bytes / prefill_s) for f in flows]
        box: dict[str, Any] = {}

        def stream() -> Any:
            yield env.timeout(layer_s)
            box["t"] = net.start(capped)
            yield env.timeout(prefill_s - layer_s)
            box["t"].set_cap(None)

        env.process(stream())
        env.run()
        total = box["t"].end_s
    else:
        t = net.start(flows)
        env.run()
        total = t.end_s
    first = topology.path(src[0], dst[0])  # the path shard 0 takes
    return {
        "model": model.name,
        "tokens": tokens,
        "topology": topology.name,
        "placement": placement,
        "tp": tp,
        "mode": mode,
        "kv_bytes": kv_bytes,
        "flows": len(flows),
        "transfer_s": total - stream_s,
        "prefill_s": stream_s if mode == "layerwise" else None,
        "path": [f"{link.src} -> {link.dst} ({link.kind})" for link in first],
        "bottleneck_bytes_s": topology.bottleneck_bytes_s(first) if first else None,
    }
