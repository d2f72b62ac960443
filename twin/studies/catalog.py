"""What pd-twin ships: the model and GPU catalogs, the bundled topologies and
experiments, as rows (``twin models``, ``twin gpus``, ``twin topologies``,
``twin experiments``) and as a text table.

Each row is a flat mapping of plain values (ints, floats, strings), in the
catalog's name order, so that ``--json`` writes it as is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from twin import yamlio
from twin.bundled import bundled_names, bundled_text

__all__ = ["CATALOGS", "catalog_rows", "format_rows"]


def model_rows() -> list[dict[str, Any]]:
    from twin.perf.llm import HF_IDS, MODELS

    return [
        {
            "name": name,
            "params": m.params,
            "layers": m.layers,
            "hidden": m.hidden,
            "heads": m.heads,
            "kv_heads": m.kv_heads,
            "kv_bytes_per_token": m.kv_bytes_per_token(),
            "max_context": m.max_context,
            "hf_id": HF_IDS.get(name, ""),
        }
        for name, m in sorted(MODELS.items())
    ]


def gpu_rows() -> list[dict[str, Any]]:
    from twin.perf.gpus import get_gpu, gpu_names

    rows = []
    for name in gpu_names():
        g = get_gpu(name)
        rows.append(
            {
                "name": name,
                "memory_bytes": int(g.memory_bytes),  # bytes (80 GiB for an 80 GB HBM part)
                "hbm_bytes_s": g.hbm_bytes_s,
                "flops_bf16": g.flops_bf16,
                "nvlink_bytes_s": g.nvlink_bytes_s,
                "tdp_w": g.tdp_w,
            }
        )
    return rows


def _first_comment(text: str) -> str:
    """The first sentence of a file's leading comment, the file's own description."""
    words = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        words += line.lstrip("#").split()
    para = " ".join(words)
    end = para.find(". ")
    return para if end < 0 else para[: end + 1]


def topology_rows() -> list[dict[str, Any]]:
    from twin.net.topology import load_topology

    rows = []
    for name in bundled_names("topologies"):
        topo = load_topology(name)
        types = sorted({topo.gpu_type(i) for i in range(len(topo.gpus))})
        nics = sum(1 for _, t in topo.graph.nodes(data="type") if t == "nic")
        rows.append(
            {
                "name": name,
                "nodes": topo.num_nodes,
                "gpus": len(topo.gpus),
                "gpu": ", ".join(types),
                "nics": nics,
                "links": topo.graph.number_of_edges(),
                "description": _first_comment(bundled_text("topologies", name)),
            }
        )
    return rows


def experiment_rows() -> list[dict[str, Any]]:
    rows = []
    for name in bundled_names("experiments"):
        text = bundled_text("experiments", name)
        doc = yamlio.load_text(text, f"{name}.yaml") or {}
        kind = "compare" if "compare" in doc else "sweep" if "sweep" in doc else "run"
        rows.append(
            {
                "name": name,
                "kind": kind,
                "description": str(doc.get("description") or _first_comment(text)),
            }
        )
    return rows


Column = tuple[str, str, Callable[[Any], str]]  # key, heading, format


def _int(x: Any) -> str:
    return f"{x:,}"


def _giga(x: Any) -> str:
    return f"{x / 1e9:,.0f}"


def _tera(x: Any) -> str:
    return f"{x / 1e12:,.0f}"


def _billions(x: Any) -> str:
    return f"{x / 1e9:,.1f}"


def _short(x: Any) -> str:
    """A description cut to a table's width (``--json`` has it whole)."""
    text = str(x)
    return text if len(text) <= 72 else text[:69].rstrip() + "..."


# Name -> (its rows, the columns its table shows).
CATALOGS: dict[str, tuple[Callable[[], list[dict[str, Any]]], Sequence[Column]]] = {
    "models": (
        model_rows,
        (
            ("name", "model", str),
            ("params", "params (B)", _billions),
            ("layers", "layers", str),
            ("kv_heads", "kv heads", str),
            ("kv_bytes_per_token", "KV B/token", _int),
            ("max_context", "context", _int),
            ("hf_id", "Hugging Face id", str),
        ),
    ),
    "gpus": (
        gpu_rows,
        (
            ("name", "gpu", str),
            ("memory_bytes", "memory (GiB)", lambda x: f"{x / 2**30:,.0f}"),
            ("hbm_bytes_s", "HBM (GB/s)", _giga),
            ("flops_bf16", "BF16 (TFLOP/s)", _tera),
            ("nvlink_bytes_s", "NVLink (GB/s)", _giga),
            ("tdp_w", "TDP (W)", lambda x: f"{x:,.0f}"),
        ),
    ),
    "topologies": (
        topology_rows,
        (
            ("name", "topology", str),
            ("nodes", "nodes", str),
            ("gpus", "GPUs", str),
            ("gpu", "gpu", str),
            ("nics", "NICs", str),
            ("links", "links", str),
            ("description", "description", _short),
        ),
    ),
    "experiments": (
        experiment_rows,
        (
            ("name", "experiment", str),
            ("kind", "kind", str),
            ("description", "description", _short),
        ),
    ),
}


def catalog_rows(kind: str) -> list[dict[str, Any]]:
    """The rows of one of :data:`CATALOGS`."""
    return CATALOGS[kind][0]()


def format_rows(kind: str, rows: list[dict[str, Any]]) -> str:
    """A text table of ``rows`` with :data:`CATALOGS`' columns for ``kind``; the
    last column is left unpadded."""
    columns = CATALOGS[kind][1]
    cells = [[head for _, head, _ in columns]]
    cells += [[fmt(row[key]) for key, _, fmt in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    numeric = [all(_numeric(r[i]) for r in cells[1:]) for i in range(len(columns))]
    lines = []
    for r in cells:
        parts = []
        for i, text in enumerate(r):
            last = i == len(r) - 1
            if numeric[i]:
                parts.append(text.rjust(widths[i]))
            else:
                parts.append(text if last else text.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _numeric(text: str) -> bool:
    return text.replace(",", "").replace(".", "").isdigit()
