"""The KV hand-off of one prompt on an otherwise idle network (``twin handoff``):
bytes, flows, path, bottleneck, the fixed costs part by part and the time,
simulated with the same flows and costs as a run.
"""

from __future__ import annotations

from typing import Any

import simpy

from twin.errors import SpecError
from twin.net.flows import FlowSpec, Network
from twin.net.shards import shard_flows
from twin.net.topology import Topology
from twin.serving.handoff import MODES, TransferConfig, handoff_costs
from twin.serving.kvcache import blocks_for

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
    transfer: TransferConfig | None = None,
    block_size: int = 16,
) -> dict[str, Any]:
    """The KV hand-off of one ``tokens``-token prompt between two TP-``tp``
    instances on an otherwise idle network: bytes moved, the flows and the time
    they take (simulated, so shards that share a link share it), with the
    fixed costs of ``transfer`` (default: the spec's defaults) for KV blocks
    of ``block_size`` tokens, as a run charges them.

    ``layerwise`` streams during a prefill of ``prefill_s`` seconds (by default
    the Roofline's time for this prompt on the source GPU) and reports only the
    residual after the prefill ends. ``bytes_s`` is the time of the bytes
    alone (the residual of their stream, layer-wise); ``transfer_s`` adds the
    fixed costs as they show.
    """
    from twin.perf.gpus import get_gpu
    from twin.perf.iteration import Batch
    from twin.perf.roofline import Roofline

    if placement not in PLACEMENTS:
        raise SpecError(f"placement: {placement!r}; expected one of {', '.join(PLACEMENTS)}")
    if mode not in MODES:
        raise SpecError(f"mode: {mode!r}; expected one of {', '.join(MODES)}")
    if tokens <= 0 or tp <= 0 or block_size <= 0:
        raise SpecError(
            f"tokens (={tokens}), tp (={tp}) and block size (={block_size}) must be > 0"
        )
    config = transfer if transfer is not None else TransferConfig()
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
    blocks = blocks_for(tokens, block_size)
    stream_s = 0.0
    if mode == "layerwise":
        if prefill_s is None:
            perf = Roofline(model, get_gpu(topology.gpu_type(src[0])), tp)
            prefill_s = perf.iteration_time(Batch(((tokens, 0),)))
        stream_s = prefill_s
        layer_s = prefill_s / model.layers
        costs = handoff_costs(config, blocks, model.layers, layer_s)
        lead = max(layer_s, costs.before_s)
        bytes_end = _stream(flows, layer_s, prefill_s)
        end = _stream(flows, lead, prefill_s) + costs.after_s
        bytes_s = bytes_end - prefill_s
    else:
        costs = handoff_costs(config, blocks, model.layers)
        env = simpy.Environment()
        t = Network(env).start(flows)
        env.run()
        assert t.end_s is not None
        bytes_s = t.end_s
        end = costs.before_s + bytes_s
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
        "transfer_s": end - stream_s,
        "bytes_s": bytes_s,
        "fixed": {
            "control_s": costs.control_s,
            "registration_s": costs.registration_s,
            "descriptors": costs.descriptors,
            "per_descriptor_s": costs.per_descriptor_s,
            "descriptors_s": costs.descriptors_s,
            "router_s": costs.router_s,
            "before_s": costs.before_s,
            "after_s": costs.after_s,
        },
        "prefill_s": stream_s if mode == "layerwise" else None,
        "path": [f"{link.src} -> {link.dst} ({link.kind})" for link in first],
        "bottleneck_bytes_s": topology.bottleneck_bytes_s(first) if first else None,
    }


def _stream(flows: list[FlowSpec], lead_s: float, prefill_s: float) -> float:
    """When the last byte of a layer-wise stream lands, on an idle network: it
    starts ``lead_s`` into a ``prefill_s`` iteration, capped at the rate the
    prefill makes KV until the iteration ends (as a run streams it)."""
    env = simpy.Environment()
    net = Network(env)
    capped = [FlowSpec(f.path, f.size_bytes, f.size_bytes / prefill_s) for f in flows]
    box: dict[str, Any] = {}

    def stream() -> Any:
        yield env.timeout(lead_s)
        box["t"] = net.start(capped)
        if prefill_s > lead_s:
            yield env.timeout(prefill_s - lead_s)
        box["t"].set_cap(None)

    env.process(stream())
    env.run()
    end = box["t"].end_s
    assert end is not None
    return float(end)
