"""The text ``twin topo`` prints for a :class:`twin.net.topology.Topology`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twin.net.topodef import LINK_KINDS

if TYPE_CHECKING:
    from twin.net.topology import Topology


def _gbs(x: float) -> str:
    return f"{x / 1e9:,.2f} GB/s ({x * 8 / 1e9:,.0f} Gb/s)"


def _count(n: int, noun: str) -> str:
    plural = noun + ("es" if noun.endswith("h") else "s")
    return f"{n} {noun if n == 1 else plural}"


def _span(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _describe_node(topo: Topology, node: int, switches: dict[int, list[str]]) -> str:
    nodes = topo.graph.nodes
    gpus = topo.gpus_of_node(node)
    types = sorted({topo.gpu_type(i) for i in gpus})
    parts = [f"{len(gpus)} x {'/'.join(types)}"]
    for v in switches.get(node, ()):
        a = nodes[v]
        rates = sorted(
            {
                ln.capacity_bytes_s
                for _, _, ln in topo.graph.in_edges(v, data="link")
                if nodes[ln.src]["type"] == "gpu"
            }
        )
        if rates:
            per = "/".join(f"{r / 1e9:g} GB/s" for r in rates)
            parts.append(f"{a['fabric']} {per} per GPU")
    nics = topo.nics_of_node(node)
    if nics:
        kinds = sorted({nodes[n]["kind"] for n in nics})
        rates = sorted(
            {
                ln.capacity_bytes_s
                for n in nics
                for _, v, ln in topo.graph.out_edges(n, data="link")
                if nodes[v]["node"] is None
            }
        )
        rate = "/".join(f"{r * 8 / 1e9:g} Gb/s" for r in rates)
        parts.append(f"{len(nics)} x {'/'.join(kinds)} NIC {rate}")
    else:
        parts.append("no NIC")
    return ", ".join(parts)


def summary(topo: Topology) -> str:
    """The readable description ``twin topo`` prints."""
    nodes = topo.graph.nodes
    counts = {t: 0 for t in ("gpu", "nic", "switch")}
    for _, t in nodes(data="type"):
        counts[t] += 1
    has_fabric = any(n is None for _, n in nodes(data="node"))
    lines = [
        f"topology {topo.name}: {_count(topo.num_nodes, 'node')}, "
        f"{_count(len(topo.gpus), 'GPU')}, {_count(counts['nic'], 'NIC')}, "
        f"{_count(counts['switch'], 'switch')}; "
        f"fabric {topo.fabric if has_fabric else 'none'}",
    ]
    groups: list[tuple[int, int, str]] = []
    switches: dict[int, list[str]] = {}  # each node's switches, in the graph's order
    for v, a in nodes(data=True):
        if a["type"] == "switch" and a["node"] is not None:
            switches.setdefault(a["node"], []).append(v)
    for k in range(topo.num_nodes):
        desc = _describe_node(topo, k, switches)
        if groups and groups[-1][2] == desc:
            groups[-1] = (groups[-1][0], k, desc)
        else:
            groups.append((k, k, desc))
    for lo, hi, desc in groups:
        span = f"node {lo}" if lo == hi else f"nodes {lo}-{hi}"
        lines.append(f"  {span}: {desc}")
    by_kind: dict[str, int] = {}
    eff: dict[str, float] = {}
    for _, _, ln in topo.graph.edges(data="link"):
        by_kind[ln.kind] = by_kind.get(ln.kind, 0) + 1
        eff[ln.kind] = ln.efficiency
    lines.append(
        "links (directed): "
        + ", ".join(f"{k} {by_kind[k]} (eff {eff[k]:g})" for k in LINK_KINDS if k in by_kind)
    )
    ceilings = sorted(
        {c for k in range(topo.num_nodes) if (c := topo.ceiling_bytes_s(k)) is not None}
    )
    if ceilings:
        shown = "/".join(_gbs(c) for c in ceilings)
        lines.append(f"node ceiling: {shown} per direction through all of a node's NICs")
    inj = sorted({topo.injection_bytes_s(i) for i in range(len(topo.gpus))})
    if inj == [0.0]:
        lines.append("per-GPU injection: none (no NIC)")
    else:
        shown = _gbs(inj[0]) if len(inj) == 1 else f"{_gbs(inj[0])} to {_gbs(inj[-1])}"
        lines.append(f"per-GPU injection: {shown} usable, through its own NIC(s)")
    a, b = topo.halves()
    if topo.num_nodes > 1:
        half = topo.num_nodes // 2
        cut = f"nodes {_span(0, half - 1)} | {_span(half, topo.num_nodes - 1)}"
    else:
        cut = (
            f"GPUs {_span(0, len(a) - 1)} | {_span(len(a), len(topo.gpus) - 1)}" if a else "one GPU"
        )
    lines.append(f"bisection: {_gbs(topo.bisection_bytes_s())} usable ({cut})")
    samples = []
    if len(topo.gpus_of_node(0)) > 1:
        samples.append((0, topo.gpus_of_node(0)[1]))
    if topo.num_nodes > 1:
        samples.append((0, topo.gpus_of_node(1)[0]))
    for s, d in samples:
        p = topo.path(s, d)
        h = topo.hops(p)
        kinds = "/".join(dict.fromkeys(ln.kind for ln in h))
        lines.append(
            f"GPU {s} -> GPU {d}: {' -> '.join([h[0].src] + [ln.dst for ln in h])}; "
            f"{kinds}; bottleneck {_gbs(topo.bottleneck_bytes_s(p))}; "
            f"latency {topo.latency_s(p) * 1e6:g} us"
        )
    return "\n".join(lines)


def describe(topo: Topology) -> dict[str, Any]:
    """What ``twin topo --json`` writes: the counts, each run of identical
    nodes (``nodes: [first, last]`` and its description), the directed links
    per kind with their efficiency, and the bandwidths in bytes/s, usable
    (after efficiency): each node's host copy ceiling through all its NICs
    (None where there is none: RDMA, or no NIC), per-GPU injection (min and
    max), the bisection and the cut it is taken across;
    and the sample paths ``twin topo`` prints (hops, bottleneck, latency in s)."""
    nodes = topo.graph.nodes
    counts = {t: 0 for t in ("gpu", "nic", "switch")}
    for _, t in nodes(data="type"):
        counts[t] += 1
    has_fabric = any(n is None for _, n in nodes(data="node"))
    groups: list[dict[str, Any]] = []
    switches: dict[int, list[str]] = {}  # each node's switches, in the graph's order
    for v, a in nodes(data=True):
        if a["type"] == "switch" and a["node"] is not None:
            switches.setdefault(a["node"], []).append(v)
    for k in range(topo.num_nodes):
        desc = _describe_node(topo, k, switches)
        if groups and groups[-1]["description"] == desc:
            groups[-1]["nodes"][1] = k
        else:
            groups.append({"nodes": [k, k], "description": desc})
    links: dict[str, dict[str, Any]] = {}
    for _, _, ln in topo.graph.edges(data="link"):
        entry = links.setdefault(ln.kind, {"count": 0, "efficiency": ln.efficiency})
        entry["count"] += 1
    inj = [topo.injection_bytes_s(i) for i in range(len(topo.gpus))]
    a, _ = topo.halves()
    if topo.num_nodes > 1:
        half = topo.num_nodes // 2
        cut = {"by": "node", "first_half": [0, half - 1], "second_half": [half, topo.num_nodes - 1]}
    else:
        cut = {
            "by": "gpu",
            "first_half": [0, len(a) - 1],
            "second_half": [len(a), len(topo.gpus) - 1],
        }
    samples = []
    if len(topo.gpus_of_node(0)) > 1:
        samples.append((0, topo.gpus_of_node(0)[1]))
    if topo.num_nodes > 1:
        samples.append((0, topo.gpus_of_node(1)[0]))
    paths = []
    for s, d in samples:
        p = topo.path(s, d)
        h = topo.hops(p)
        paths.append(
            {
                "src_gpu": s,
                "dst_gpu": d,
                "hops": [h[0].src] + [ln.dst for ln in h],
                "kinds": list(dict.fromkeys(ln.kind for ln in h)),
                "bottleneck_bytes_s": topo.bottleneck_bytes_s(p),
                "latency_s": topo.latency_s(p),
            }
        )
    return {
        "name": topo.name,
        "nodes": topo.num_nodes,
        "gpus": len(topo.gpus),
        "nics": counts["nic"],
        "switches": counts["switch"],
        "fabric": topo.fabric if has_fabric else None,
        "node_groups": groups,
        "links": {k: links[k] for k in LINK_KINDS if k in links},
        "node_ceiling_bytes_s": [topo.ceiling_bytes_s(k) for k in range(topo.num_nodes)],
        "injection_bytes_s": {"min": min(inj), "max": max(inj)},
        "bisection_bytes_s": topo.bisection_bytes_s(),
        "bisection_cut": cut,
        "paths": paths,
    }
