"""Pictures of a compare run's ``--json`` file (``{"header", "runs": {label: run}}``):
one bar per entry for its SLO attainment and latencies (:func:`compare_figure`),
and each entry's own timeline (:func:`plot_entries_over_time`), so that every
plot of a single run also reads the runs of a comparison."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin._io import read_text, with_label
from twin.errors import TwinError
from twin.viz.canvas import _figure, _legend_outside, save
from twin.viz.kvtiers import _compare_runs
from twin.viz.overtime import plot_over_time
from twin.viz.style import PALETTE, PlotOptions

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# (panel, its y label, the summary key, scale to the label's unit)
PANELS = (
    ("SLO attainment (%)", "slo_attainment", None, 100.0),
    ("TTFT (s)", "ttft_s", ("p50", "p99"), 1.0),
    ("TPOT (ms)", "tpot_s", ("p50", "p99"), 1e3),
)


def _value(summary: Mapping[str, Any], key: str, stat: str | None, scale: float) -> float:
    v = summary.get(key)
    if stat is not None:
        v = v.get(stat) if isinstance(v, Mapping) else None
    return math.nan if not isinstance(v, int | float) else float(v) * scale


def compare_figure(runs: Mapping[str, Any], opts: PlotOptions | None = None) -> Figure:
    """One bar per entry of a compare file's ``runs`` (in their order) in three
    panels: SLO attainment, TTFT p50 and p99, TPOT p50 and p99 (p50 solid,
    p99 hatched beside it); a value a run did not measure is left out."""
    labels = list(runs)
    fig = _figure(max(6.0, 0.9 * len(labels) + 3.0), 8.0, opts)
    axes = fig.subplots(len(PANELS), 1, sharex=True)
    xs = list(range(len(labels)))
    for ax, (ylabel, key, stats, scale) in zip(axes, PANELS, strict=True):
        if stats is None:
            vals = [_value(runs[x]["summary"], key, None, scale) for x in labels]
            ax.bar(xs, vals, color=PALETTE[0], label="SLO attainment")
        else:
            width = 0.4
            for i, stat in enumerate(stats):
                vals = [_value(runs[x]["summary"], key, stat, scale) for x in labels]
                offset = (i - 0.5) * width
                ax.bar([x + offset for x in xs], vals, width, color=PALETTE[i],
                       hatch="//" if i else None, label=stat)  # fmt: skip
            _legend_outside(ax)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
    axes[-1].set_xticks(xs, labels, rotation=30, ha="right")
    return fig


def plot_compare(
    compare_json: str | Path, out_base: str | Path, opts: PlotOptions | None = None
) -> list[Path]:
    """:func:`compare_figure` of a compare run's ``--json`` file."""
    return save(compare_figure(_compare_runs(compare_json), opts), out_base, opts)


def reuses_prompts(runs: Mapping[str, Any]) -> bool:
    """Whether any run of a compare file reused prompt tokens (the KV tier
    figure has something to draw)."""
    return any(
        (run["summary"].get("prefix_hit_rate") or 0) > 0
        or run["summary"].get("kv_tiers")
        or run["summary"].get("kv_pool")
        for run in runs.values()
    )


def compare_runs_of(source: str | Path) -> dict[str, Any] | None:
    """The ``runs`` of a compare ``--json`` file, or None for any other file."""
    text = read_text(source, "timeline")
    if not text.lstrip().startswith("{"):
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TwinError(f"{source}: not JSON: {e}") from None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    return runs if isinstance(runs, dict) and runs else None


def plot_entries_over_time(
    source: str | Path, out: Path, opts: PlotOptions | None = None
) -> list[Path]:
    """:func:`twin.viz.plots.plot_over_time` of a run's file, or of each entry
    of a compare file (``out/STEM-LABEL-over-time``)."""
    stem = Path(source).stem
    runs = compare_runs_of(source)
    if runs is None:
        return plot_over_time(source, out / f"{stem}-over-time", opts)
    written: list[Path] = []
    for label, run in runs.items():
        named = with_label(out / f"{stem}.json", label).with_suffix("")  # out/STEM-LABEL
        written += plot_over_time(run, f"{named}-over-time", opts)
    return written
