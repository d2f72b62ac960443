"""A picture of a :class:`twin.net.topology.Topology` (matplotlib, Agg backend).

Nodes are boxes side by side; in each, GPUs on a row, the node's switches
below and its NICs above; fabric switches on top (leaves, then the spine).
Edges are drawn once per pair of vertices, colored by link kind.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from twin._io import atomic_path
from twin.errors import TwinError

if TYPE_CHECKING:
    from twin.net.topology import Topology

COLORS = {
    "nvlink": "#76b900",
    "pcie": "#1f77b4",
    "infiniband": "#d62728",
    "roce": "#ff7f0e",
    "ethernet": "#9467bd",
}
MARKERS = {"gpu": ("s", "#2ca02c"), "nic": ("D", "#444444"), "switch": ("o", "#bbbbbb")}


def _positions(topo: Topology) -> tuple[dict[str, tuple[float, float]], list[tuple[float, float]]]:
    nodes = topo.graph.nodes
    width = max(len(topo.gpus_of_node(k)) for k in range(topo.num_nodes))
    width = max(width, max((topo.nic_count(k) for k in range(topo.num_nodes)), default=1))
    step = width + 1.5
    pos: dict[str, tuple[float, float]] = {}
    spans = []
    for k in range(topo.num_nodes):
        x0 = k * step
        spans.append((x0 - 0.5, x0 + width - 0.5))
        for j, g in enumerate(topo.gpus_of_node(k)):
            pos[topo.gpus[g]] = (x0 + j, 0.0)
        nics = topo.nics_of_node(k)
        for j, n in enumerate(nics):
            pos[n] = (x0 + (j + 0.5) * width / len(nics) - 0.5, 1.5)
        switches = sorted(
            v for v, a in nodes(data=True) if a["node"] == k and a["type"] == "switch"
        )
        for j, s in enumerate(switches):  # side by side, so NIC links miss them
            pos[s] = (x0 + (width - 1) / 2 + (j - (len(switches) - 1) / 2) * width / 3, -1.3)
    total = topo.num_nodes * step - 1.5
    tiers: dict[int, list[str]] = {}
    for v, a in nodes(data=True):
        if a["node"] is None:
            tiers.setdefault(int(a.get("tier", 0)), []).append(v)
    for tier, names in tiers.items():
        names.sort(key=lambda s: (len(s), s))
        for j, s in enumerate(names):
            pos[s] = ((j + 0.5) * total / len(names) - 0.5, 3.5 + 1.5 * tier)
    for v in nodes:  # anything else (explicit graphs): beside its node
        pos.setdefault(v, (-1.5, 0.0))
    return pos, spans


def draw(topo: Topology, path: str | Path) -> None:
    """Write the picture to ``path``; the format follows the extension."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    pos, spans = _positions(topo)
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    fig_w = min(40.0, max(6.0, 0.55 * (max(xs) - min(xs) + 2)))
    fig_h = max(4.0, 0.9 * (max(ys) - min(ys) + 2))
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    for k, (lo, hi) in enumerate(spans):
        ys_k = [pos[v][1] for v, n in topo.graph.nodes(data="node") if n == k]
        y0, y1 = min(ys_k) - 0.5, max(ys_k) + 0.5
        ax.add_patch(
            Rectangle(
                (lo - 0.2, y0), hi - lo + 0.4, y1 - y0, fill=False, ls="--", ec="#999999", lw=0.8
            )
        )
        ax.text(lo - 0.1, y1 + 0.05, f"node {k}", fontsize=8, va="bottom", color="#555555")
    drawn: set[frozenset[str]] = set()
    caps = [ln.capacity_bytes_s for _, _, ln in topo.graph.edges(data="link")]
    top = max(caps)
    for u, v, ln in topo.graph.edges(data="link"):
        pair = frozenset((u, v))
        if pair in drawn:
            continue
        drawn.add(pair)
        (x1, y1), (x2, y2) = pos[u], pos[v]
        lw = 0.6 + 2.4 * math.log1p(ln.capacity_bytes_s) / math.log1p(top)
        ax.plot([x1, x2], [y1, y2], color=COLORS[ln.kind], lw=lw, alpha=0.7, zorder=1)
    for t, (marker, color) in MARKERS.items():
        names = [v for v, a in topo.graph.nodes(data="type") if a == t]
        if names:
            ax.scatter(
                [pos[v][0] for v in names],
                [pos[v][1] for v in names],
                marker=marker,
                s=90,
                c=color,
                edgecolors="black",
                linewidths=0.6,
                zorder=2,
            )
    for v, a in topo.graph.nodes(data=True):
        if a["type"] == "gpu":
            label = f"{topo.gpus.index(v)}"
        elif a["type"] == "nic":
            label = f"nic{a['index']}"
        else:
            label = v.split(".")[-1]
        ax.annotate(
            label,
            pos[v],
            xytext=(0, -11 if a["type"] == "gpu" else 8),
            textcoords="offset points",
            ha="center",
            fontsize=6,
        )
    kinds = sorted({ln.kind for _, _, ln in topo.graph.edges(data="link")})
    handles = [Line2D([], [], color=COLORS[k], lw=2.5, label=k) for k in kinds]
    handles += [
        Line2D([], [], ls="", marker=m, color=c, markeredgecolor="black", label=t)
        for t, (m, c) in MARKERS.items()
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    types = sorted({topo.gpu_type(i) for i in range(len(topo.gpus))})
    ax.set_title(
        f"{topo.name}: {topo.num_nodes} x node, {len(topo.gpus)} x GPU ({', '.join(types)})"
    )
    ax.set_axis_off()
    ax.margins(0.05)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
    except (OSError, ValueError) as e:
        raise TwinError(f"{path}: cannot write the picture: {e}") from None
    finally:
        plt.close(fig)
