"""Topology YAML -> plain vertex and link definitions.

Two forms, documented in ``topologies/README.md``:

- the template form: ``node:`` (or ``templates:``) describes a node (GPU type
  and count, intra-node fabric, NICs), ``nodes:`` how many of each, and
  ``fabric:`` the inter-node network (one switch, or leaf-spine);
- the explicit form: ``vertices:`` and ``links:`` listed one by one, for any
  graph.

Both give a :class:`TopoDef`: vertices with their attributes and directed
links with line rate, latency and protocol efficiency. :mod:`twin.net.topology`
turns it into a graph and checks that every GPU reaches every other one."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from twin._check import (
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    at_most,
    check_keys,
    entry,
    is_int,
    positive_float,
    positive_int,
)
from twin.errors import SpecError
from twin.net.explicit import parse_explicit
from twin.net.topodef import (
    FABRIC_KINDS,
    INTRA_KINDS,
    NIC_GENERATIONS,
    NIC_KINDS,
    TCP_HOST_CEILING_BYTES_S,
    LinkDef,
    TopoDef,
    VertexDef,
    as_mapping,
    gpu_name,
    nic_efficiency,
    one_of,
    parse_rate,
    per_kind,
    topology_name,
)
from twin.perf.gpus import get_gpu


def parse_topology(
    data: Mapping[str, Any], where: str, default_name: str, nodes: int | None = None
) -> TopoDef:
    """A :class:`TopoDef` from a topology mapping; ``nodes`` overrides the node
    count of a single-template topology. Raises :class:`SpecError`."""
    data = as_mapping(data, where or "topology")
    if "vertices" in data or "links" in data:
        check_keys(data, where, ("vertices", "links"), ("name", "protocol", "latency", "ceiling"))
        if nodes is not None:
            raise SpecError(
                f"{where}: a node count ({nodes}) scales a template; "
                "this topology lists its vertices explicitly"
            )
        return parse_explicit(data, where, default_name)
    check_keys(
        data, where, ("nodes",), ("name", "node", "templates", "fabric", "protocol", "latency")
    )
    return _templated(data, where, default_name, nodes)


# -- the template form -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Template:
    name: str
    gpu: str
    gpus: int
    intra: str
    intra_bytes_s: float
    gpu_pcie_bytes_s: float
    nic_count: int
    nic_kind: str
    nic_bytes_s: float
    nic_serves: tuple[tuple[int, ...], ...]
    nic_attach: str
    nic_pcie_bytes_s: float
    nic_generation: str | None = None  # NIC_GENERATIONS key: sets the RDMA efficiency
    ceiling_bytes_s: float | None = None  # the most the node's NICs carry together


def _template(t: object, where: str, name: str) -> _Template:
    t = as_mapping(t, where)
    check_keys(t, where, ("gpu", "gpus"), ("intra", "nics"))
    gpu = gpu_name(t["gpu"], entry(where, "gpu"))
    spec = get_gpu(gpu)
    n = positive_int(t["gpus"], entry(where, "gpus"))
    at_most(n, MAX_GPUS_PER_NODE, entry(where, "gpus"), "GPUs per node")
    wi = entry(where, "intra")
    intra = as_mapping(t.get("intra", {"kind": "nvswitch" if spec.nvlink_bytes_s else "pcie"}), wi)
    check_keys(intra, wi, ("kind",), ("bandwidth",))
    kind = one_of(intra["kind"], entry(wi, "kind"), "intra-node fabric", INTRA_KINDS)
    default_bw = spec.nvlink_bytes_s if kind == "nvswitch" else spec.pcie_bytes_s
    if "bandwidth" in intra:
        intra_bw = parse_rate(intra["bandwidth"], entry(wi, "bandwidth"))
    elif default_bw > 0:
        intra_bw = default_bw
    else:
        raise SpecError(f"{entry(wi, 'kind')}: {gpu} has no NVLink; use pcie or give a bandwidth")
    wn = entry(where, "nics")
    nics = as_mapping(t.get("nics", {"count": 0}), wn)
    if nics.get("count", 1) == 0:
        check_keys(nics, wn, ("count",))
        return _Template(name, gpu, n, kind, intra_bw, spec.pcie_bytes_s, 0, "", 0.0, (), "", 0.0)
    check_keys(
        nics,
        wn,
        ("count", "kind", "bandwidth"),
        ("gpus", "attach", "pcie", "generation", "ceiling"),
    )
    count = positive_int(nics["count"], entry(wn, "count"))
    at_most(count, MAX_GPUS_PER_NODE, entry(wn, "count"), "NICs per node")
    nic_kind = one_of(nics["kind"], entry(wn, "kind"), "NIC kind", NIC_KINDS)
    nic_bw = parse_rate(nics["bandwidth"], entry(wn, "bandwidth"))
    generation = None
    if "generation" in nics:
        wg = entry(wn, "generation")
        generation = one_of(nics["generation"], wg, "NIC generation", tuple(NIC_GENERATIONS))
        if nic_kind == "ethernet":
            raise SpecError(
                f"{wg}: {generation!r} sets an RDMA efficiency, but kind 'ethernet' is TCP; "
                "use kind infiniband or roce, or drop the generation"
            )
    if nic_kind == "ethernet":
        # TCP moves data through host memory: no GPUDirect, the NIC hangs off the host.
        attach_default = "host"
    else:
        attach_default = "gpu" if kind == "nvswitch" else "host"
    attach = one_of(
        nics.get("attach", attach_default),
        entry(wn, "attach"),
        "NIC attachment",
        ("gpu", "host"),
    )
    if nic_kind == "ethernet" and attach == "gpu":
        raise SpecError(
            f"{entry(wn, 'attach')}: 'gpu' is GPUDirect RDMA, but kind 'ethernet' is TCP, "
            "which copies through host memory; use attach: host"
        )
    ceiling = None
    if "ceiling" in nics:
        ceiling = parse_rate(nics["ceiling"], entry(wn, "ceiling"))
    elif nic_kind == "ethernet":
        ceiling = TCP_HOST_CEILING_BYTES_S
    pcie = parse_rate(nics.get("pcie", spec.pcie_bytes_s), entry(wn, "pcie"))
    serves = _nic_serves(nics.get("gpus"), count, n, entry(wn, "gpus"))
    return _Template(
        name,
        gpu,
        n,
        kind,
        intra_bw,
        spec.pcie_bytes_s,
        count,
        nic_kind,
        nic_bw,
        serves,
        attach,
        pcie,
        generation,
        ceiling,
    )


def _nic_serves(value: object, count: int, gpus: int, where: str) -> tuple[tuple[int, ...], ...]:
    """Which local GPUs each NIC serves. Default: GPUs spread evenly over the NICs in
    order (NIC i serves GPU i when counts match); with more NICs than GPUs, NIC i
    serves GPU i mod gpus."""
    if value is None:
        if count >= gpus:
            return tuple((i % gpus,) for i in range(count))
        per = -(-gpus // count)
        return tuple(tuple(range(i * per, min((i + 1) * per, gpus))) for i in range(count))
    if not isinstance(value, list) or len(value) != count:
        raise SpecError(f"{where}: {value!r} must be a list of {count} entries, one per NIC")
    out = []
    for i, item in enumerate(value):
        items = item if isinstance(item, list) else [item]
        for g in items:
            if not is_int(g) or not 0 <= g < gpus:
                raise SpecError(
                    f"{where}[{i}]: GPU index {g!r} outside the node; expected 0..{gpus - 1}"
                )
        if not items:
            raise SpecError(f"{where}[{i}]: NIC {i} serves no GPU")
        out.append(tuple(items))
    served = {g for s in out for g in s}
    missing = [g for g in range(gpus) if g not in served]
    if missing:
        raise SpecError(f"{where}: GPU {missing[0]} is served by no NIC")
    return tuple(out)


def _templated(data: Mapping[str, Any], where: str, default: str, nodes: int | None) -> TopoDef:
    if ("node" in data) == ("templates" in data):
        raise SpecError(f"{where}: give exactly one of 'node' (one template) or 'templates'")
    groups: list[tuple[_Template, int]] = []
    wnodes = entry(where, "nodes")
    if "node" in data:
        t = _template(data["node"], entry(where, "node"), "node")
        groups.append((t, positive_int(data["nodes"], wnodes)))
    else:
        wt = entry(where, "templates")
        raw = as_mapping(data["templates"], wt)
        if not raw:
            raise SpecError(f"{wt}: no templates given")
        templates = {str(k): _template(v, entry(wt, str(k)), str(k)) for k, v in raw.items()}
        items = data["nodes"]
        if is_int(items) and len(templates) == 1:
            items = [{"template": next(iter(templates)), "count": items}]
        if not isinstance(items, list) or not items:
            raise SpecError(f"{wnodes}: {items!r} must be a list of {{template, count}}")
        for i, g in enumerate(items):
            wg = f"{wnodes}[{i}]"
            check_keys(as_mapping(g, wg), wg, ("template", "count"))
            tname = one_of(g["template"], entry(wg, "template"), "template", tuple(templates))
            groups.append((templates[tname], positive_int(g["count"], entry(wg, "count"))))
    if nodes is not None:
        if len(groups) != 1:
            raise SpecError(
                f"{where}: a node count ({nodes}) scales a single template; this topology "
                f"mixes {len(groups)} node groups"
            )
        groups = [(groups[0][0], positive_int(nodes, "nodes"))]
    at_most(sum(c for _, c in groups), MAX_NODES, wnodes, "nodes")
    at_most(sum(t.gpus * c for t, c in groups), MAX_GPUS, wnodes, "GPUs (nodes x GPUs per node)")
    eff, lat = per_kind(data, where)
    given = data.get("protocol") or {}
    for t, _ in groups:
        if t.nic_generation is not None and t.nic_kind in given:
            raise SpecError(
                f"{entry(entry(where, 'protocol'), t.nic_kind)}: template {t.name!r} names its "
                f"NIC generation ({t.nic_generation}), which sets the {t.nic_kind} efficiency; "
                "give one of the two"
            )
    topo = TopoDef(topology_name(data, where, default), where)
    node = 0
    for t, count in groups:
        for _ in range(count):
            _add_node(topo, t, node, eff, lat)
            topo.templates[node] = t.name
            if t.ceiling_bytes_s is not None:
                topo.ceilings[node] = t.ceiling_bytes_s
            node += 1
    _add_fabric(topo, data.get("fabric"), entry(where, "fabric"), groups, eff, lat)
    return topo


def _duplex(
    topo: TopoDef,
    a: str,
    b: str,
    kind: str,
    bw: float,
    eff: dict,
    lat: dict,
    efficiency: float | None = None,
) -> None:
    e = eff[kind] if efficiency is None else efficiency
    topo.links.append(LinkDef(a, b, kind, bw, lat[kind], e))
    topo.links.append(LinkDef(b, a, kind, bw, lat[kind], e))


def _add_node(topo: TopoDef, t: _Template, i: int, eff: dict, lat: dict) -> None:
    p = f"n{i}."
    gpus = [f"{p}gpu{j}" for j in range(t.gpus)]
    for j, g in enumerate(gpus):
        topo.vertices.append(VertexDef(g, "gpu", node=i, index=j, gpu=t.gpu))
    intra = f"{p}nvswitch" if t.intra == "nvswitch" else f"{p}pcie"
    topo.vertices.append(VertexDef(intra, "switch", node=i, fabric=t.intra))
    link_kind = "nvlink" if t.intra == "nvswitch" else "pcie"
    for g in gpus:
        _duplex(topo, g, intra, link_kind, t.intra_bytes_s, eff, lat)
    host = f"{p}pcie"
    if t.nic_count and t.nic_attach == "host" and t.intra != "pcie":
        # NIC on the host's PCIe tree: GPUs reach it over their own PCIe link.
        topo.vertices.append(VertexDef(host, "switch", node=i, fabric="pcie"))
        for g in gpus:
            _duplex(topo, g, host, "pcie", t.gpu_pcie_bytes_s, eff, lat)
    for k in range(t.nic_count):
        nic = f"{p}nic{k}"
        topo.vertices.append(
            VertexDef(nic, "nic", node=i, index=k, kind=t.nic_kind, serves=t.nic_serves[k])
        )
        if t.nic_attach == "gpu":
            # GPUDirect RDMA: each GPU shares a PCIe switch with its NIC.
            for j in t.nic_serves[k]:
                _duplex(topo, gpus[j], nic, "pcie", t.nic_pcie_bytes_s, eff, lat)
        else:
            _duplex(topo, host, nic, "pcie", t.nic_pcie_bytes_s, eff, lat)


def _add_fabric(
    topo: TopoDef,
    raw: object,
    where: str,
    groups: list[tuple[_Template, int]],
    eff: dict,
    lat: dict,
) -> None:
    kinds = sorted({t.nic_kind for t, _ in groups if t.nic_count})
    if raw is None:
        raw = {"kind": "single-switch"}
    f = as_mapping(raw, where)
    kind = one_of(f.get("kind"), entry(where, "kind"), "fabric kind", FABRIC_KINDS)
    topo.fabric = kind
    if kind == "single-switch":
        check_keys(f, where, ("kind",))
    else:
        check_keys(f, where, ("kind", "nodes_per_leaf", "oversubscription"))
    if not kinds:
        return
    if len(kinds) > 1:
        raise SpecError(
            f"{where}: node NICs are of kinds {', '.join(kinds)}; one fabric carries one kind"
        )
    nk = kinds[0]
    nics = [v for v in topo.vertices if v.type == "nic"]
    cap = {nic.name: nic_bw for nic, nic_bw in _nic_rates(nics, groups)}
    # A NIC's own link runs at its generation's RDMA efficiency; switch-to-switch
    # links carry the same packets and take the best of the NICs' efficiencies.
    nic_eff = {nic.name: e for nic, e in _nic_efficiencies(nics, groups, eff)}
    fabric_eff = max(nic_eff.values())
    if kind == "single-switch":
        topo.vertices.append(VertexDef("switch", "switch", fabric=nk))
        for nic in nics:
            _duplex(topo, nic.name, "switch", nk, cap[nic.name], eff, lat, nic_eff[nic.name])
        return
    per_leaf = positive_int(f["nodes_per_leaf"], entry(where, "nodes_per_leaf"))
    over = positive_float(f["oversubscription"], entry(where, "oversubscription"))
    n_nodes = sum(c for _, c in groups)
    leaves = -(-n_nodes // per_leaf)
    # NOTE: the spine layer is one vertex; ECMP is taken as perfectly balanced, so
    # a leaf's uplinks act as one pipe of (its downlink total / oversubscription).
    topo.vertices.append(VertexDef("spine", "switch", fabric=nk, tier=1))
    for leaf in range(leaves):
        name = f"leaf{leaf}"
        topo.vertices.append(VertexDef(name, "switch", fabric=nk, tier=0))
        down = 0.0
        for nic in nics:
            assert nic.node is not None
            if nic.node // per_leaf == leaf:
                _duplex(topo, nic.name, name, nk, cap[nic.name], eff, lat, nic_eff[nic.name])
                down += cap[nic.name]
        _duplex(topo, name, "spine", nk, down / over, eff, lat, fabric_eff)


def _nic_rates(nics: list[VertexDef], groups: list[tuple[_Template, int]]):  # type: ignore[no-untyped-def]
    node_rate = []
    for t, count in groups:
        node_rate += [t.nic_bytes_s] * count
    for nic in nics:
        assert nic.node is not None
        yield nic, node_rate[nic.node]


def _node_templates(groups: list[tuple[_Template, int]]) -> list[_Template]:
    out: list[_Template] = []
    for t, count in groups:
        out += [t] * count
    return out


def _nic_efficiencies(
    nics: list[VertexDef], groups: list[tuple[_Template, int]], eff: dict
) -> Iterator[tuple[VertexDef, float]]:
    node_t = _node_templates(groups)
    for nic in nics:
        assert nic.node is not None
        t = node_t[nic.node]
        if t.nic_generation is None:
            yield nic, eff[t.nic_kind]
        else:
            yield nic, nic_efficiency(t.nic_generation, t.nic_kind)
