"""The cluster's network as a directed graph: GPUs, NICs, switches, links.

A :class:`Topology` is loaded from YAML (a bundled name, a path, or an inline
mapping from an experiment spec; the schema is in ``topologies/README.md``
and parsed by :mod:`twin.net.topofile`). Vertices have ``type`` gpu | nic |
switch; every edge carries a :class:`Link`, one direction of a physical
link, with its line rate, latency and protocol efficiency.

Routing is static and deterministic: inside a node a GPU reaches another over
the node's NVSwitch (or PCIe switch); across nodes it goes GPU -> NIC ->
fabric -> NIC -> GPU. Each leg takes the widest route (the best bottleneck of
usable rates, however many hops), then among those the one with the least
latency, then the fewest hops, then the one whose vertex names sort first.
Between two nodes the NICs that serve the two GPUs are paired the same way.

A node may have a ceiling: the most its NICs carry together, per direction
(TCP's host copy ceiling, or a measured multi-NIC aggregate). It is a shared
capacity, not a hop: every path between two nodes carries the sending node's
outgoing ceiling first and the receiving node's incoming ceiling last, as
links with ``hop=False``, so the flow solver shares it among the node's flows.

The graph is a light directed graph of its own (:class:`Graph`, the read
side of networkx's ``DiGraph``: ``nodes``, ``edges``, ``succ``, ``pred``,
``in_edges``, ``out_edges``, ``has_edge``), so that loading a topology costs
no networkx import; only the max-flow capacities (``twin topo``) import
networkx, and only this module does.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin import yamlio
from twin._io import read_text
from twin.bundled import bundled_names, bundled_text
from twin.errors import SpecError, UnknownNameError
from twin.net.topodef import LINK_KINDS, TopoDef
from twin.net.topofile import parse_topology

__all__ = [
    "LINK_KINDS",
    "Link",
    "Topology",
    "load_topology",
    "topology_names",
]

if TYPE_CHECKING:
    import networkx as nx

CEILING = "ceiling"  # the kind of a node ceiling's link


class _Nodes(dict):  # type: ignore[type-arg]
    """Vertex -> its attributes, in insertion order; called as networkx's
    ``G.nodes(data=...)``: ``(vertex, attribute)`` pairs, or ``(vertex,
    attributes)`` with ``data=True``."""

    def __call__(self, data: bool | str = False) -> Iterator[Any]:
        if data is True:
            return iter(self.items())
        if data is False:
            return iter(self)
        return ((v, a.get(data)) for v, a in self.items())


class _Edges:
    """The edges of a :class:`Graph`, as networkx's ``G.edges``: ``(u, v)`` in
    order of ``u`` then of insertion; ``edges[u, v]`` its attributes, and
    ``edges(data=...)`` as :class:`_Nodes` does."""

    __slots__ = ("_succ",)

    def __init__(self, succ: dict[str, dict[str, dict[str, Any]]]) -> None:
        self._succ = succ

    def __getitem__(self, uv: tuple[str, str]) -> dict[str, Any]:
        return self._succ[uv[0]][uv[1]]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return ((u, v) for u, nbr in self._succ.items() for v in nbr)

    def __len__(self) -> int:
        return sum(len(nbr) for nbr in self._succ.values())

    def __call__(self, data: bool | str = False) -> Iterator[Any]:
        if data is False:
            return iter(self)
        if data is True:
            return ((u, v, a) for u, nbr in self._succ.items() for v, a in nbr.items())
        return ((u, v, a.get(data)) for u, nbr in self._succ.items() for v, a in nbr.items())


class Graph:
    """A directed graph with attributes on vertices and edges, read as
    networkx's ``DiGraph`` is (the same orders of iteration)."""

    __slots__ = ("nodes", "succ", "pred", "edges")

    def __init__(self) -> None:
        self.nodes = _Nodes()
        self.succ: dict[str, dict[str, dict[str, Any]]] = {}
        self.pred: dict[str, dict[str, dict[str, Any]]] = {}
        self.edges = _Edges(self.succ)

    def add_node(self, v: str, **attrs: Any) -> None:
        self.nodes.setdefault(v, {}).update(attrs)
        self.succ.setdefault(v, {})
        self.pred.setdefault(v, {})

    def add_edge(self, u: str, v: str, **attrs: Any) -> None:
        for x in (u, v):
            if x not in self.nodes:
                self.add_node(x)
        got = self.succ[u].get(v)
        if got is None:
            got = self.succ[u][v] = self.pred[v][u] = {}
        got.update(attrs)

    def has_edge(self, u: str, v: str) -> bool:
        return v in self.succ.get(u, ())

    def number_of_edges(self) -> int:
        return sum(len(nbr) for nbr in self.succ.values())

    def out_edges(self, v: str, data: bool | str = False) -> list[Any]:
        return self._around(v, self.succ[v], data, out=True)

    def in_edges(self, v: str, data: bool | str = False) -> list[Any]:
        return self._around(v, self.pred[v], data, out=False)

    @staticmethod
    def _around(v: str, nbr: dict[str, dict[str, Any]], data: bool | str, out: bool) -> list[Any]:
        pairs = [((v, w) if out else (w, v), a) for w, a in nbr.items()]
        if data is False:
            return [e for e, _ in pairs]
        if data is True:
            return [(*e, a) for e, a in pairs]
        return [(*e, a.get(data)) for e, a in pairs]

    def reachable(self, v: str, *, forward: bool = True) -> set[str]:
        """The vertices reachable from ``v`` (``forward``) or that reach it, but ``v``."""
        adj = self.succ if forward else self.pred
        seen = {v}
        stack = [v]
        while stack:
            for w in adj[stack.pop()]:
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        seen.discard(v)
        return seen


def _ticks(latency_s: float) -> int:
    """Latency in whole picoseconds, so that route latencies add and tie exactly."""
    return round(latency_s * 1e12)


@dataclass(frozen=True, slots=True)
class Link:
    """One directed edge. ``capacity_bytes_s``: line rate in one direction,
    bytes/s. ``latency_s``: one-way latency, s. ``efficiency``: the share of the
    line rate a bulk transfer gets over this link's protocol, in (0, 1].
    ``hop=False`` (kind ``ceiling``): a node's ceiling, a capacity its flows
    share that is not a step along the path (no vertex, no latency)."""

    src: str
    dst: str
    kind: str
    capacity_bytes_s: float
    latency_s: float
    efficiency: float
    hop: bool = True

    def __post_init__(self) -> None:
        if self.kind not in LINK_KINDS and not (self.kind == CEILING and not self.hop):
            raise ValueError(f"link {self.src} -> {self.dst}: kind {self.kind!r}")
        if not (self.capacity_bytes_s > 0 and math.isfinite(self.capacity_bytes_s)):
            raise ValueError(f"link {self.src} -> {self.dst}: capacity {self.capacity_bytes_s!r}")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"link {self.src} -> {self.dst}: latency {self.latency_s!r}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"link {self.src} -> {self.dst}: efficiency {self.efficiency!r}")

    @property
    def usable_bytes_s(self) -> float:
        """The rate a bulk transfer can use: ``capacity_bytes_s * efficiency``."""
        return self.capacity_bytes_s * self.efficiency


class Topology:
    """A validated topology. ``gpus[i]`` is the vertex name of global GPU ``i``
    (node by node, ``n0.gpu0``, ``n0.gpu1``, ...). Paths and flows are cached;
    treat the graph as read-only."""

    def __init__(self, d: TopoDef) -> None:
        self.name = d.name
        self.where = d.where
        self.fabric = d.fabric
        g = Graph()
        for v in d.vertices:
            attrs: dict[str, Any] = {"type": v.type, "node": v.node}
            if v.type == "gpu":
                attrs.update(gpu=v.gpu, index=v.index)
            elif v.type == "nic":
                attrs.update(kind=v.kind, index=v.index, serves=v.serves)
            else:
                attrs.update(fabric=v.fabric, tier=v.tier)
            g.add_node(v.name, **attrs)
        for ln in d.links:
            g.add_edge(
                ln.src,
                ln.dst,
                link=Link(
                    ln.src, ln.dst, ln.kind, ln.capacity_bytes_s, ln.latency_s, ln.efficiency
                ),
            )
        self.graph = g
        gpu_v = [v for v in d.vertices if v.type == "gpu"]
        if not gpu_v:
            raise SpecError(f"{d.where}: the topology has no GPU")
        gpu_v.sort(key=lambda v: (v.node, v.index))
        self.gpus: tuple[str, ...] = tuple(v.name for v in gpu_v)
        self._node: tuple[int, ...] = tuple(int(v.node or 0) for v in gpu_v)
        self._type: tuple[str, ...] = tuple(v.gpu for v in gpu_v)
        n_nodes = max(self._node) + 1
        self._template: tuple[str | None, ...] = tuple(d.templates.get(k) for k in range(n_nodes))
        self._node_gpus = tuple(
            tuple(i for i, n in enumerate(self._node) if n == k) for k in range(n_nodes)
        )
        self._node_nics = tuple(
            tuple(v.name for v in d.vertices if v.type == "nic" and v.node == k)
            for k in range(n_nodes)
        )
        self._gpu_nics = tuple(self._serving(i) for i in range(len(self.gpus)))
        core: list[set[str]] = [set() for _ in range(n_nodes)]
        for v, a in g.nodes(data=True):
            if a["node"] is not None and a["type"] != "nic" and a["node"] < n_nodes:
                core[a["node"]].add(v)
        self._node_core = tuple(frozenset(c) for c in core)
        self._fabric = frozenset(v for v, n in g.nodes(data="node") if n is None)
        self._out = {
            k: Link(f"n{k}.nics", f"n{k}.nics.out", CEILING, c, 0.0, 1.0, hop=False)
            for k, c in sorted(d.ceilings.items())
            if k < n_nodes
        }
        self._in = {
            k: Link(f"n{k}.nics.in", f"n{k}.nics", CEILING, c, 0.0, 1.0, hop=False)
            for k, c in sorted(d.ceilings.items())
            if k < n_nodes
        }
        self._paths: dict[tuple[int, int, int | None], tuple[Link, ...]] = {}
        self._legs: dict[tuple[str, str, str], list[str] | None] = {}
        self._injection: dict[int, float] = {}
        self._injection_by_key: dict[tuple[Any, ...], float] = {}
        self._vertex_rank: dict[str, int] | None = None
        self.max_flows = 0  # max-flow problems solved so far (what twin topo's size costs)
        self._bisection: float | None = None
        self._check_connected()

    # -- structure ---------------------------------------------------------------------
    def _serving(self, gpu: int) -> tuple[str, ...]:
        node, g = self.graph.nodes, self.gpus[gpu]
        local = node[g]["index"]
        nics = self._node_nics[self._node[gpu]]
        return tuple(n for n in nics if local in node[n]["serves"])

    def _check_connected(self) -> None:
        first = self.gpus[0]
        down = self.graph.reachable(first)
        up = self.graph.reachable(first, forward=False)
        for g in self.gpus[1:]:
            if g not in down or g not in up:
                a, b = (first, g) if g not in down else (g, first)
                raise SpecError(
                    f"{self.where}: GPU {g!r} is not connected to the other GPUs "
                    f"(no route {a} -> {b}); every GPU must reach every other GPU"
                )

    @property
    def num_nodes(self) -> int:
        return len(self._node_gpus)

    def node_of(self, gpu: int) -> int:
        """The node index of global GPU ``gpu``."""
        return self._node[gpu]

    def gpu_type(self, gpu: int) -> str:
        """The GPU catalog name (:func:`twin.perf.gpus.get_gpu`) of global GPU ``gpu``."""
        return self._type[gpu]

    def template_of(self, node: int) -> str | None:
        """The name of the node template ``node`` was made from (``"node"`` for a
        file with one ``node:``); None in the explicit form."""
        return self._template[node]

    @property
    def templates(self) -> tuple[str, ...]:
        """The node templates the nodes were made from, in node order, each once."""
        return tuple(dict.fromkeys(t for t in self._template if t is not None))

    def gpus_of_node(self, node: int) -> tuple[int, ...]:
        """Global indices of the GPUs of ``node``, in order."""
        return self._node_gpus[node]

    def nic_count(self, node: int) -> int:
        return len(self._node_nics[node])

    def nics_of_node(self, node: int) -> tuple[str, ...]:
        """NIC vertex names of ``node``, by NIC index."""
        return self._node_nics[node]

    def nics_of_gpu(self, gpu: int) -> tuple[str, ...]:
        """The NICs that serve ``gpu`` (its own first), by NIC index; empty if none."""
        return self._gpu_nics[gpu]

    def ceiling_bytes_s(self, node: int) -> float | None:
        """The most ``node``'s NICs carry together, bytes/s per direction (each way
        on its own); None when only its links bound it."""
        ln = self._out.get(node)
        return None if ln is None else ln.capacity_bytes_s

    def link(self, u: str, v: str) -> Link:
        """The directed link ``u -> v``; ``KeyError`` if there is none."""
        try:
            return self.graph.edges[u, v]["link"]
        except KeyError:
            raise KeyError(f"no link {u} -> {v} in topology {self.name!r}") from None

    # -- routing -----------------------------------------------------------------------
    def _leg(self, s: str, d: str, area: str) -> list[str] | None:
        """A cached route ``s -> d`` within ``area``: ``"n<k>"`` node k without its
        NICs (plus ``s`` and ``d``), ``"fabric"`` the fabric (plus both ends), ``"all"``."""
        key = (s, d, area)
        if key not in self._legs:
            allowed: Set[str] | None
            if area == "all":
                allowed = None
            elif area == "fabric":
                allowed = self._fabric | {s, d}
            else:
                allowed = self._node_core[int(area[1:])] | {s, d}
            self._legs[key] = self._route(s, d, allowed)
        return self._legs[key]

    def _route(self, s: str, d: str, allowed: Set[str] | None) -> list[str] | None:
        """The widest route ``s -> d`` through ``allowed`` vertices (None: all): the
        best bottleneck of usable rates; among those the least latency, then the
        fewest hops, then the first by vertex names. None when there is none.

        Two label-setting passes (a single one on the combined key would be
        wrong: two routes capped by the same link tie on width, and the one that
        was wider before it may be the slower): a max-min Dijkstra finds the best
        bottleneck, then a Dijkstra on (latency, hops, names) runs over the links
        at least that wide. O(E log V) each."""
        succ = self.graph.succ
        if s not in succ or d not in succ:
            return None
        ok = (lambda _v: True) if allowed is None else allowed.__contains__
        best: dict[str, float] = {s: math.inf}
        heap: list[tuple[float, str]] = [(-math.inf, s)]
        done: set[str] = set()
        while heap:
            neg, u = heapq.heappop(heap)
            if u in done:
                continue
            done.add(u)
            if u == d:
                break
            for v, attrs in succ[u].items():
                if v in done or not ok(v):
                    continue
                w = min(-neg, attrs["link"].usable_bytes_s)
                if w > best.get(v, -1.0):
                    best[v] = w
                    heapq.heappush(heap, (-w, v))
        if d not in done:
            return None
        width = best[d]
        queue: list[tuple[int, int, tuple[str, ...]]] = [(0, 0, (s,))]
        settled: set[str] = set()
        while queue:
            lat, hops, route = heapq.heappop(queue)
            u = route[-1]
            if u in settled:
                continue
            settled.add(u)
            if u == d:
                return list(route)
            for v, attrs in succ[u].items():
                ln = attrs["link"]
                if v in settled or not ok(v) or ln.usable_bytes_s < width:
                    continue
                heapq.heappush(queue, (lat + _ticks(ln.latency_s), hops + 1, route + (v,)))
        raise AssertionError(f"no route {s} -> {d} at the width just found")  # unreachable

    def _rank(self, route: list[str]) -> tuple[float, int, int, list[str]]:
        """Orders routes: widest first, then least latency, fewest hops, names."""
        links = [self.graph.edges[u, v]["link"] for u, v in itertools.pairwise(route)]
        return (
            -min((ln.usable_bytes_s for ln in links), default=math.inf),
            sum(_ticks(ln.latency_s) for ln in links),
            len(links),
            route,
        )

    def _inside(self, node: int, *extra: str) -> Set[str]:
        """The node's vertices but its NICs, plus ``extra``."""
        return self._node_core[node] | set(extra)

    def path(self, src: int, dst: int, nic: int | None = None) -> tuple[Link, ...]:
        """Links from global GPU ``src`` to ``dst``; empty when ``src == dst``.

        Inside a node: over the node's NVSwitch or PCIe switch (``nic`` is
        ignored). Across nodes: ``src`` -> its own NIC (or NIC ``nic`` of its
        node) -> fabric -> the NIC of ``dst`` (or NIC ``nic`` mod the NIC count
        of the destination node) -> ``dst``.
        """
        key = (src, dst, nic)
        hit = self._paths.get(key)
        if hit is not None:
            return hit
        s, d = self.gpus[src], self.gpus[dst]
        ns, nd = self._node[src], self._node[dst]
        route: list[str] | None
        if src == dst:
            route = [s]
        elif ns == nd:
            route = self._leg(s, d, f"n{ns}") or self._leg(s, d, "all")
        else:
            route = self._cross(src, dst, nic)
        if route is None:  # excluded by the connectivity check at load
            raise AssertionError(f"no route {s} -> {d}")
        links = tuple(self.graph.edges[u, v]["link"] for u, v in itertools.pairwise(route))
        if ns != nd:
            head = (self._out[ns],) if ns in self._out else ()
            tail = (self._in[nd],) if nd in self._in else ()
            links = head + links + tail
        self._paths[key] = links
        return links

    def _cross(self, src: int, dst: int, nic: int | None) -> list[str] | None:
        s, d = self.gpus[src], self.gpus[dst]
        ns, nd = self._node[src], self._node[dst]
        if nic is not None and not 0 <= nic < self.nic_count(ns):
            raise ValueError(f"nic {nic}: node {ns} has {self.nic_count(ns)} NICs")
        own_s, own_d = self._gpu_nics[src], self._gpu_nics[dst]
        if nic is not None:
            pairs = [
                (self._node_nics[ns][nic], self._node_nics[nd][nic % max(1, self.nic_count(nd))])
            ]
        elif own_s and own_d:
            pairs = [(a, b) for a in own_s for b in own_d]
        else:
            return self._leg(s, d, "all")
        routes = []
        for a, b in pairs:
            legs = (
                self._leg(s, a, f"n{ns}"),
                self._leg(a, b, "fabric"),
                self._leg(b, d, f"n{nd}"),
            )
            if all(leg is not None for leg in legs):
                one, two, three = legs
                assert one is not None and two is not None and three is not None
                routes.append(one + two[1:] + three[1:])
        if not routes:
            return self._leg(s, d, "all")
        return min(routes, key=self._rank)

    @staticmethod
    def latency_s(path: Iterable[Link]) -> float:
        """Sum of the links' latencies, s."""
        return sum(ln.latency_s for ln in path)

    @staticmethod
    def hops(path: Iterable[Link]) -> tuple[Link, ...]:
        """The links of ``path`` that are steps along it (node ceilings left out)."""
        return tuple(ln for ln in path if ln.hop)

    @staticmethod
    def bottleneck_bytes_s(path: Iterable[Link]) -> float:
        """The smallest usable rate along ``path``, bytes/s; ``inf`` for an empty path."""
        return min((ln.usable_bytes_s for ln in path), default=math.inf)

    # -- capacities --------------------------------------------------------------------
    def _flow_graph(self, keep: Set[str] | None = None) -> nx.DiGraph:
        import networkx as nx

        f: nx.DiGraph = nx.DiGraph()
        if keep is None:
            for u, v, ln in self.graph.edges(data="link"):
                f.add_edge(u, v, capacity=ln.usable_bytes_s)
            return f
        # the edges among ``keep`` only, in the graph's order (max-flow's sums are
        # then the same to the bit as over a scan of the whole graph), not a scan
        for u in sorted(keep, key=self._vertex_order):
            for _, v, ln in self.graph.out_edges(u, data="link"):
                if v in keep:
                    f.add_edge(u, v, capacity=ln.usable_bytes_s)
        return f

    def _injection_key(self, gpu: int) -> tuple[Any, ...]:
        """What :meth:`injection_bytes_s` depends on, without the node's
        number: the GPU's place in its node, the rates of the node's links
        (in the graph's vertex order, which repeats from node to node of
        one template), of its NICs' fabric links and the node's ceiling. Two
        GPUs with the same key have the same injection, so a topology of
        many identical nodes runs one max-flow per GPU position, not per GPU."""
        node = self._node[gpu]
        keep = self._inside(node, *self._gpu_nics[gpu])
        ranked = sorted(keep, key=self._vertex_order)
        order = {v: i for i, v in enumerate(ranked)}
        links = tuple(
            (order[u], order[v], ln.usable_bytes_s)
            for u in ranked
            for _, v, ln in self.graph.out_edges(u, data="link")
            if v in keep
        )
        fabric = tuple(
            sum(
                ln.usable_bytes_s
                for _, v, ln in self.graph.out_edges(n, data="link")
                if self.graph.nodes[v]["node"] is None
            )
            for n in self._gpu_nics[gpu]
        )
        src = order.get(self.gpus[gpu])
        return (self._template[node], src, links, fabric, self.ceiling_bytes_s(node))

    def _vertex_order(self, vertex: str) -> int:
        if self._vertex_rank is None:
            self._vertex_rank = {v: i for i, v in enumerate(self.graph.nodes)}
        return self._vertex_rank[vertex]

    def injection_bytes_s(self, gpu: int) -> float:
        """The most a GPU alone can send off its node through the NICs that serve
        it, usable bytes/s: a max-flow from the GPU over its node's links to
        those NICs' fabric links, and at most its node's ceiling. 0 when no NIC
        serves it."""
        if gpu in self._injection:
            return self._injection[gpu]
        node = self._node[gpu]
        nics = self._gpu_nics[gpu]
        total = 0.0
        key = self._injection_key(gpu) if nics else ()
        if key in self._injection_by_key:
            total = self._injection_by_key[key]
        elif nics:
            f = self._flow_graph(self._inside(node, *nics))
            for n in nics:
                out = sum(
                    ln.usable_bytes_s
                    for _, v, ln in self.graph.out_edges(n, data="link")
                    if self.graph.nodes[v]["node"] is None
                )
                f.add_edge(n, "__sink__", capacity=out)
            total = _max_flow(f, self.gpus[gpu], "__sink__")
            self.max_flows += 1
            cap = self.ceiling_bytes_s(node)
            if cap is not None:
                total = min(total, cap)
            self._injection_by_key[key] = total
        self._injection[gpu] = total
        return total

    def halves(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The two GPU sets :meth:`bisection_bytes_s` separates: nodes
        ``[0, N//2)`` against ``[N//2, N)``; on one node, its GPUs split the same way."""
        if self.num_nodes > 1:
            cut = self.num_nodes // 2
            a = tuple(i for i, n in enumerate(self._node) if n < cut)
        else:
            a = tuple(range(len(self.gpus) // 2))
        b = tuple(i for i in range(len(self.gpus)) if i not in set(a))
        return a, b

    def bisection_bytes_s(self) -> float:
        """Usable bytes/s from the first half of the GPUs to the second (see
        :meth:`halves`) when all of them send at once: a max-flow over every link's
        usable rate, each node's traffic held to its ceiling. NOTE: one fixed cut by
        node order, not the minimum over all bisections (that is NP-hard); for the
        symmetric bundled topologies they agree."""
        if self._bisection is None:
            a, b = self.halves()
            if not a or not b:
                self._bisection = 0.0
            else:
                f = self._flow_graph()
                cross = self.num_nodes > 1  # a node's ceiling holds only what leaves it
                for i in a:
                    n = self._node[i]
                    if cross and n in self._out:
                        f.add_edge(
                            "__source__", f"__out{n}", capacity=self._out[n].capacity_bytes_s
                        )
                        f.add_edge(f"__out{n}", self.gpus[i])
                    else:
                        f.add_edge("__source__", self.gpus[i])  # no capacity: unbounded
                for i in b:
                    n = self._node[i]
                    if cross and n in self._in:
                        f.add_edge(self.gpus[i], f"__in{n}")
                        f.add_edge(f"__in{n}", "__sink__", capacity=self._in[n].capacity_bytes_s)
                    else:
                        f.add_edge(self.gpus[i], "__sink__")
                self._bisection = _max_flow(f, "__source__", "__sink__")
        return self._bisection

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, nodes={self.num_nodes}, gpus={len(self.gpus)})"


# -- loading ---------------------------------------------------------------------------
def topology_names() -> list[str]:
    """Names of the bundled topologies."""
    return bundled_names("topologies")


def _read(spec: str, base_dir: Path | None) -> tuple[str, str, str]:
    """``(text, label for messages, default name)`` of a path or a bundled name."""
    path = Path(spec)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    if path.suffix in (".yaml", ".yml") or path.exists() or "/" in spec:
        if not path.is_file():
            raise SpecError(f"{spec}: no such topology file")
        return read_text(path, "topology", SpecError), str(spec), path.stem
    names = topology_names()
    if spec not in names:
        raise UnknownNameError("topology", spec, names)
    return bundled_text("topologies", spec), f"topologies/{spec}.yaml", spec


def _max_flow(f: nx.DiGraph, source: str, sink: str) -> float:
    import networkx as nx

    return float(nx.maximum_flow_value(f, source, sink))


def load_topology(
    spec: str | Mapping[str, Any],
    *,
    nodes: int | None = None,
    where: str = "",
    base_dir: Path | None = None,
) -> Topology:
    """A topology from a bundled name, a YAML path (relative to ``base_dir`` when
    given), or an inline mapping. ``where`` names the spec entry in messages
    (e.g. ``"spec.yaml: topology"``); errors inside a topology file name that
    file. ``nodes`` overrides the node count of a single-template topology.

    Raises :class:`UnknownNameError` for an unknown name and :class:`SpecError`
    for a bad file or value.
    """
    if isinstance(spec, Mapping):
        label = where or "topology"
        default = "custom"
        data: Any = spec
    elif isinstance(spec, str | Path):
        try:
            text, label, default = _read(str(spec), base_dir)
        except SpecError as e:
            raise SpecError(f"{where}: {e}" if where else str(e)) from None
        data = yamlio.load_text(text, label)
        if not isinstance(data, Mapping):
            raise SpecError(f"{label}: a topology must be a mapping of keys")
    else:
        raise SpecError(f"{where or 'topology'}: {spec!r} is not a topology name, path or mapping")
    return Topology(parse_topology(data, label, default, nodes))


def all_to_all_links(topo: Topology, gpus: Sequence[int]) -> dict[str, float | int]:
    """What an all-to-all among ``gpus`` (one expert-parallel group) runs on,
    from the topology, for :class:`~twin.perf.roofline.Roofline`: the ranks on
    the busiest node (``a2a_ranks_per_node``), the rate one GPU reaches another
    of its node (``a2a_intra_bytes_s``: the path's bottleneck), and when the
    group spans nodes the rate each GPU sends off its node while all send at
    once (``a2a_inter_bytes_s``: the smallest over the group of its NICs'
    injection rate shared among the group's GPUs those NICs serve, and of the
    node's ceiling shared among the group's GPUs on it) and the latency of a
    cross-node path (``a2a_latency_s``). Computed once per instance when it is
    built, not per iteration."""
    by_node: dict[int, list[int]] = {}
    for g in gpus:
        by_node.setdefault(topo.node_of(g), []).append(g)
    per_node = max(len(v) for v in by_node.values())
    out: dict[str, float | int] = {"a2a_ranks_per_node": per_node}
    intra = math.inf
    for members in by_node.values():
        if len(members) > 1:
            intra = min(intra, topo.bottleneck_bytes_s(topo.path(members[0], members[1])))
    if math.isfinite(intra):
        out["a2a_intra_bytes_s"] = intra
    if len(by_node) > 1:
        nodes = sorted(by_node)
        inter = math.inf
        for k in nodes:
            members = by_node[k]
            for g in members:
                nics = set(topo.nics_of_gpu(g))
                sharing = sum(1 for h in members if nics & set(topo.nics_of_gpu(h)))
                inter = min(inter, topo.injection_bytes_s(g) / max(1, sharing))
            ceiling = topo.ceiling_bytes_s(k)
            if ceiling is not None:
                inter = min(inter, ceiling / len(members))
        a, b = by_node[nodes[0]][0], by_node[nodes[1]][0]
        out["a2a_inter_bytes_s"] = inter
        out["a2a_latency_s"] = topo.latency_s(topo.path(a, b))
    return out
