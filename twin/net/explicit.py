"""The explicit topology form: vertices and links listed one by one, for any graph.

See ``topologies/README.md``. Links are numbered from 0 in messages:
``t.yaml: link 3 (nb -> sw): unknown kind 'infiniband2'; expected one of ...``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twin._check import boolean, check_keys, entry, is_int
from twin.errors import SpecError
from twin.net.topodef import (
    LINK_KINDS,
    NIC_KINDS,
    SWITCH_FABRICS,
    TCP_HOST_CEILING_BYTES_S,
    VERTEX_TYPES,
    LinkDef,
    TopoDef,
    VertexDef,
    as_mapping,
    gpu_name,
    one_of,
    parse_latency,
    parse_rate,
    per_kind,
    topology_name,
)


def parse_explicit(data: Mapping[str, Any], where: str, default: str) -> TopoDef:  # noqa: C901
    """A :class:`TopoDef` from the explicit form: ``vertices`` and ``links`` listed."""
    eff, lat = per_kind(data, where)
    topo = TopoDef(topology_name(data, where, default), where, fabric="explicit")
    wv = entry(where, "vertices")
    raw = data["vertices"]
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"{wv}: {raw!r} must be a non-empty list")
    seen: dict[str, int] = {}
    per_node: dict[tuple[int, str], int] = {}
    pending_serves: list[tuple[int, object, str]] = []
    for i, v in enumerate(raw):
        w = f"{wv}[{i}]"
        v = as_mapping(v, w)
        vtype = one_of(v.get("type"), entry(w, "type"), "vertex type", VERTEX_TYPES)
        optional = {"gpu": ("gpu",), "nic": ("kind", "serves"), "switch": ("fabric", "node")}
        required = ("name", "type", "node") if vtype != "switch" else ("name", "type")
        check_keys(v, w, required + (("gpu",) if vtype == "gpu" else ()), optional[vtype])
        name = v["name"]
        if not isinstance(name, str) or not name:
            raise SpecError(f"{entry(w, 'name')}: {name!r} must be a non-empty string")
        if name in seen:
            raise SpecError(f"{w}: vertex {name!r} is declared twice (first at {seen[name]})")
        seen[name] = i
        node = v.get("node")
        if node is not None:
            if not is_int(node) or node < 0:
                raise SpecError(f"{entry(w, 'node')}: {node!r} must be a node index >= 0")
        index = per_node.get((node, vtype), 0) if node is not None else 0
        if node is not None:
            per_node[(node, vtype)] = index + 1
        if vtype == "gpu":
            topo.vertices.append(
                VertexDef(
                    name, "gpu", node=node, index=index, gpu=gpu_name(v["gpu"], entry(w, "gpu"))
                )
            )
        elif vtype == "nic":
            kind = one_of(v.get("kind", "infiniband"), entry(w, "kind"), "NIC kind", NIC_KINDS)
            topo.vertices.append(VertexDef(name, "nic", node=node, index=index, kind=kind))
            pending_serves.append((len(topo.vertices) - 1, v.get("serves"), entry(w, "serves")))
        else:
            fab = one_of(
                v.get("fabric", "ethernet"), entry(w, "fabric"), "switch fabric", SWITCH_FABRICS
            )
            topo.vertices.append(VertexDef(name, "switch", node=node, fabric=fab))
    nodes = sorted({int(v.node or 0) for v in topo.vertices if v.type == "gpu"})
    if nodes != list(range(len(nodes))):
        raise SpecError(f"{wv}: GPU node indices {nodes} must run 0, 1, 2, ... without gaps")
    for at, serves, w in pending_serves:
        nic = topo.vertices[at]
        local = {v.name: v.index for v in topo.vertices if v.type == "gpu" and v.node == nic.node}
        if serves is None:
            idx = tuple(sorted(local.values()))
        else:
            if not isinstance(serves, list) or not serves:
                raise SpecError(f"{w}: {serves!r} must be a non-empty list of GPU names")
            for g in serves:
                if g not in local:
                    raise SpecError(
                        f"{w}: {g!r} is not a GPU of node {nic.node}; expected one of "
                        f"{', '.join(local) or '(none)'}"
                    )
            idx = tuple(local[g] for g in serves)
        topo.vertices[at] = VertexDef(
            nic.name, "nic", node=nic.node, index=nic.index, kind=nic.kind, serves=idx
        )
    links = data["links"]
    if not isinstance(links, list):
        raise SpecError(f"{entry(where, 'links')}: {links!r} must be a list")
    declared: dict[tuple[str, str], str] = {}
    for i, ln in enumerate(links):
        w0 = f"{entry(where, 'links')}[{i}]"
        ln = as_mapping(ln, w0)
        src, dst = str(ln.get("src")), str(ln.get("dst"))
        w = f"{where}: link {i} ({src} -> {dst})"
        check_keys(ln, w, ("src", "dst", "kind", "bandwidth"), ("latency", "duplex"))
        for end in (src, dst):
            if end not in seen:
                raise SpecError(f"{w}: {end!r} is not a declared vertex (dangling edge)")
        if src == dst:
            raise SpecError(f"{w}: a link must join two different vertices")
        kind = one_of(ln["kind"], w, "kind", LINK_KINDS)
        bw = parse_rate(ln["bandwidth"], f"{w}: bandwidth")
        latency = parse_latency(ln["latency"], f"{w}: latency") if "latency" in ln else lat[kind]
        duplex = boolean(ln.get("duplex", True), f"{w}: duplex")
        for pair in ((src, dst), (dst, src)) if duplex else ((src, dst),):
            if pair in declared:
                raise SpecError(f"{w}: {pair[0]} -> {pair[1]} is already {declared[pair]}")
            declared[pair] = f"link {i}"
        topo.links.append(LinkDef(src, dst, kind, bw, latency, eff[kind]))
        if duplex:
            topo.links.append(LinkDef(dst, src, kind, bw, latency, eff[kind]))
    # The node ceiling: ``ceiling:`` for every node; else a node with TCP NICs is
    # held to the host copy ceiling (twin.net.topodef.TCP_HOST_CEILING_BYTES_S).
    if "ceiling" in data:
        c = parse_rate(data["ceiling"], entry(where, "ceiling"))
        topo.ceilings.update({n: c for n in nodes})
    else:
        for v in topo.vertices:
            if v.type == "nic" and v.kind == "ethernet" and v.node in nodes:
                topo.ceilings[v.node] = TCP_HOST_CEILING_BYTES_S
    return topo
