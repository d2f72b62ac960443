"""Where the prompt tokens a compare run reused came from, per KV tier
(:func:`plot_kv_tiers`), and each tier's occupancy (:func:`plot_kv_tier_occupancy`),
from a compare run's ``--json`` file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin._io import read_text
from twin.errors import TwinError
from twin.viz.canvas import _figure, _legend_outside, save
from twin.viz.style import PALETTE

if TYPE_CHECKING:
    from matplotlib.figure import Figure


# Where a run's reused prompt tokens came from: its summary's keys for each
# share below HBM, in the order the bars stack.
REUSE_SOURCES = (
    ("DRAM", "kv_tiers", "dram"),
    ("SSD", "kv_tiers", "ssd"),
    ("remote store", "kv_tiers", "remote"),
    ("pool DRAM", "kv_pool", "dram"),
    ("pool SSD", "kv_pool", "ssd"),
)


def kv_reuse_shares(runs: Mapping[str, Any]) -> dict[str, list[float]]:
    """Per source of reuse, one value per run of a compare file's ``runs``
    (in their order): the percent of prompt tokens served from it. ``HBM``
    (the instance's own prefix cache) is the rest of ``prefix_hit_rate``;
    ``DRAM``, ``SSD`` and ``remote store`` are the KV tiers' (``kv_tiers``),
    ``pool DRAM`` and ``pool SSD`` a KV pool's (``kv_pool``, Mooncake's
    store; every token its fetches loaded, as the summary counts them). A
    source no run has is left out; HBM, DRAM and SSD are always in."""
    shares: dict[str, list[float]] = {"HBM": []}
    for name, section, tier in REUSE_SOURCES:
        if name in ("DRAM", "SSD") or any(
            tier in (run["summary"].get(section) or {}) for run in runs.values()
        ):
            shares[name] = []
    for run in runs.values():
        s = run["summary"]
        below = 0.0
        for name, section, tier in REUSE_SOURCES:
            if name in shares:
                rate = ((s.get(section) or {}).get(tier) or {}).get("hit_rate") or 0.0
                shares[name].append(100 * rate)
                below += rate
        shares["HBM"].append(100 * max(0.0, (s.get("prefix_hit_rate") or 0.0) - below))
    return shares


def kv_tiers_figure(runs: Mapping[str, Any]) -> Figure:
    """The figure of :func:`plot_kv_tiers` for a compare file's ``runs``."""
    labels = list(runs)
    shares = kv_reuse_shares(runs)
    attainment = [100 * (runs[label]["summary"].get("slo_attainment") or 0.0) for label in labels]
    fig = _figure(max(6.0, 0.9 * len(labels) + 3.0), 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True)
    xs = list(range(len(labels)))
    base = [0.0] * len(labels)
    colors = dict(zip(["HBM", *(name for name, _, _ in REUSE_SOURCES)], PALETTE, strict=False))
    for name, values in shares.items():  # a source keeps its color whichever are drawn
        top.bar(xs, values, bottom=base, color=colors[name], label=name)
        base = [b + v for b, v in zip(base, values, strict=True)]
    top.set_ylabel("prompt tokens reused (%)")
    _legend_outside(top)
    bottom.bar(xs, attainment, color=PALETTE[0])
    bottom.set_ylabel("SLO attainment (%)")
    bottom.set_xticks(xs, labels, rotation=30, ha="right")
    return fig


def plot_kv_tiers(compare_json: str | Path, out_base: str | Path) -> list[Path]:
    """Two panels of a compare run's ``--json`` file, one bar per variant:
    the share of prompt tokens reused, stacked by where they came from
    (:func:`kv_reuse_shares`: HBM, the KV tiers' DRAM, SSD and remote store,
    a KV pool's DRAM and SSD), and the SLO attainment."""
    return save(kv_tiers_figure(_compare_runs(compare_json)), out_base)


def plot_kv_tier_occupancy(compare_json: str | Path, out_base: str | Path) -> list[Path]:
    """One panel per KV tier below HBM (DRAM, SSD) of a compare run's
    ``--json`` file: the bytes the tier holds over time, summed over
    instances, one line per variant that has the tier (the mean over each
    timeline window, from the summary's ``kv_tiers.<tier>.occupancy``; the
    window's peak as a thin line of the same color). None without tiers."""
    runs = _compare_runs(compare_json)
    panels: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for label, run in runs.items():
        for name, tier in (run["summary"].get("kv_tiers") or {}).items():
            if isinstance(tier, dict) and "occupancy" in tier:
                panels.setdefault(name, []).append((label, tier["occupancy"]))
    if not panels:
        return []
    fig = _figure(8.0, 2.8 * len(panels) + 0.6)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, series) in zip(axes, panels.items(), strict=True):
        for i, (label, occ) in enumerate(series):
            color = PALETTE[i % len(PALETTE)]
            w = occ["window_s"]
            xs = [(k + 0.5) * w for k in range(len(occ["mean_bytes"]))]
            ax.plot(xs, [b / 1e9 for b in occ["mean_bytes"]], color=color, label=label)
            ax.plot(xs, [b / 1e9 for b in occ["peak_bytes"]], color=color, lw=0.6, alpha=0.6)
        ax.set_ylabel(f"{name.upper()} held (GB)")
        _legend_outside(ax)
    axes[-1].set_xlabel("time (s)")
    return save(fig, out_base)


def _compare_runs(compare_json: str | Path) -> dict[str, Any]:
    try:
        doc = json.loads(read_text(compare_json, "compare --json file"))
    except ValueError as e:
        raise TwinError(f"{compare_json}: not JSON: {e}") from None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, dict) or not runs:
        raise TwinError(f"{compare_json}: not the --json file of a compare spec (no runs)")
    return runs
