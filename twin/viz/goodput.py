"""Goodput per configuration: horizontal bars with the 95% CI
(:func:`plot_goodput`)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from twin.errors import TwinError
from twin.viz.canvas import (
    _amount,
    _configs,
    _float,
    _panels,
    _read_csv,
    _styler,
    _text_width_in,
    _title,
    save,
    swept_columns,
)
from twin.viz.style import PlotOptions, figure, grid

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


GOODPUT_REACH = 1.5  # the goodput axis ends at 1.5 x the largest mean (intervals cut there)
WRAP_BARS, WRAP_CHARS = 24, 28  # goodput labels over 28 wrap when a panel has at most 24 bars


def goodput_figure(  # noqa: C901
    rows: list[dict[str, str]], where: str = "goodput.csv", opts: PlotOptions | None = None
) -> Figure:
    """The figure of :func:`plot_goodput` from the rows of a goodput.csv."""
    opts = opts or PlotOptions()
    if not rows or "goodput_rps_mean" not in rows[0]:
        raise TwinError(f"{where}: expected columns label, goodput_rps_mean, ...")
    keys = swept_columns(rows[0].keys(), "label", "goodput_rps_mean")
    for i, r in enumerate(rows):
        r.setdefault("label", "")
        r["label"] = r["label"] or f"row {i + 1}"
    params = _configs(rows, keys)
    labels = [r["label"] for r in rows]
    styler = _styler([params[lab] for lab in labels], keys, opts, where)
    by_facet: dict[str | None, list[dict[str, str]]] = {f: [] for f in styler.facets}
    for r in rows:
        by_facet[styler.facet_of(params[r["label"]])].append(r)
    most = max(len(v) for v in by_facet.values())
    nrows, ncols = grid(len(styler.facets))
    gpus_vary = len({r.get("gpus") for r in rows}) > 1

    def note(r: Mapping[str, str]) -> str:
        mean, per_gpu = _float(r.get("goodput_rps_mean")) or 0.0, _float(r.get("goodput_per_gpu"))
        text = f"{_amount(mean)} req/s"
        if per_gpu is not None:
            text += f", {_amount(per_gpu)}/GPU"
        if gpus_vary and r.get("gpus"):
            text += f" ({r['gpus']} GPUs)"
        return text

    # a few configurations: long labels wrapped onto lines of WRAP_CHARS, so the bars
    # beside them still fill half the figure; many: one line each
    names = {lab: styler.label(params[lab]) for lab in labels}
    longest = max(len(v) for v in names.values())
    if most <= WRAP_BARS and longest > WRAP_CHARS:
        half = max(WRAP_CHARS, math.ceil(longest * 0.7))  # two lines, rarely three
        names = {k: textwrap.fill(v, half, break_on_hyphens=False) for k, v in names.items()}
    lines = max(v.count("\n") + 1 for v in names.values())
    if opts.size is None:
        # a bar and its gap: 9 pt labels (about 12.5 pt a line) never touch
        pitch_in = max(0.26, 0.17 * lines + 0.1)
        height = nrows * (most * pitch_in + 1.0) + 1.0
    else:
        height = opts.size[1]
    pitch_pt = max(1.0, (height - 1.0) / nrows - 1.0) * 72 / most
    fs = min(9.0, max(3.0, pitch_pt / (1.45 * lines)))
    label_w = _text_width_in(names.values(), fs)
    # the axis follows the goodputs: an interval reaching past GOODPUT_REACH x the
    # largest mean is drawn to there, its note giving the whole interval
    reach = GOODPUT_REACH * max((_float(r.get("goodput_rps_mean")) or 0.0 for r in rows),
                                default=0.0)  # fmt: skip

    def cut(r: Mapping[str, str]) -> str:
        m = _float(r.get("goodput_rps_mean")) or 0.0
        c = _float(r.get("goodput_rps_ci95")) or 0.0
        return f" (CI ±{c:.3g} cut)" if reach > 0 and m + c > reach else ""

    note_w = _text_width_in((note(r) + cut(r) for r in rows), 7)
    # the bars get at least as much width as their labels: the axes fill half the figure
    panel_w = max(label_w + note_w + 2.8, 2 * label_w + 0.6)
    legend_w = 1.8 if styler.grouped else 0.0
    fig = figure(ncols * panel_w + legend_w + 0.4, height, opts)
    panels = _panels(fig, styler, sharex=True)
    axes = [p[0] for p in panels]
    top = 0.0
    for f, ax in zip(styler.facets, axes, strict=True):
        mine = by_facet[f]
        means = [_float(r.get("goodput_rps_mean")) or 0.0 for r in mine]
        cis = [_float(r.get("goodput_rps_ci95")) or 0.0 for r in mine]
        shown = [min(c, reach - m) if reach > 0 else c for m, c in zip(means, cis, strict=True)]
        y = list(range(len(mine)))
        ax.barh(y, means, xerr=shown, height=0.7, capsize=2.5,
                color=[styler.color(params[r["label"]]) for r in mine],
                edgecolor="black", linewidth=0.5, error_kw={"elinewidth": 0.9})  # fmt: skip
        for i, r in enumerate(mine):
            text = note(r) + cut(r)
            ax.annotate(text, (means[i] + shown[i], i), xytext=(3, 0), textcoords="offset points",
                        ha="left", va="center", fontsize=min(7.0, fs))  # fmt: skip
        top = max([top, *(m + c for m, c in zip(means, shown, strict=True))])
        top = max(top, _interval_bars(ax, mine))
        ax.set_yticks(y, [names[r["label"]] for r in mine], fontsize=fs)
        ax.set_ylim(most - 0.5, -0.5)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(styler.facet_title(f), fontsize=9)
    # room right of the longest bar for its note: the note's share of the axes' width
    share = min(0.6, (note_w + 0.15) / max(panel_w - label_w - 0.6, 0.5))
    axes[0].set_xlim(0, (top or 1.0) / (1 - share))
    for i, ax in enumerate(axes):
        if i // ncols == nrows - 1 or i + ncols >= len(axes):
            ax.set_xlabel("goodput (requests/s at the SLO target)")
    if styler.grouped:
        styler.legend(fig, axes, [], lines=False)
    seeds = {r.get("seeds") for r in rows} - {None, ""}
    how = f"mean ± 95% CI over {seeds.pop()} seeds" if len(seeds) == 1 else "± 95% CI"
    cover = sorted({c for r in rows if (c := _float(r.get("coverage"))) is not None})
    if cover:  # goodput.csv of a spec with perf.residuals
        how += "; grey: " + "/".join(f"{c:.0%}" for c in cover)
        how += " prediction interval (model error and seeds)"
    gpus = {r.get("gpus") for r in rows} - {None, ""}
    on = f", {gpus.pop()} GPUs each" if len(gpus) == 1 else ""
    _title(fig, styler, f"Goodput per configuration ({how}{on})", lines_drawn=False)
    return fig


def _interval_bars(ax: Axes, rows: Sequence[Mapping[str, str]]) -> float:
    """Each row's prediction interval (``goodput_rps_lo`` .. ``goodput_rps_hi``, an
    open end drawn as an arrow) as a grey line under its bar; the largest end drawn."""
    top = 0.0
    for i, r in enumerate(rows):
        lo = _float(r.get("goodput_rps_lo"))
        if lo is None:
            continue
        hi = _float(r.get("goodput_rps_hi"))
        end = hi if hi is not None else max(lo, _float(r.get("goodput_rps_mean")) or 0.0) * 1.5
        y = i + 0.25
        ax.plot([lo, end], [y, y], color="dimgray", linewidth=1.6, solid_capstyle="butt")
        ax.plot([lo], [y], marker="|", color="dimgray", markersize=6)
        ax.plot([end], [y], marker="|" if hi is not None else ">", color="dimgray", markersize=6)
        top = max(top, end)
    return top


def plot_goodput(
    goodput_csv: str | Path, out_base: str | Path, opts: PlotOptions | None = None
) -> list[Path]:
    """Goodput (requests/s at the SLO target) per configuration, horizontal
    bars (one row of text per configuration, so labels never collide) with
    the 95% CI over seeds, each annotated with its goodput per GPU."""
    rows = _read_csv(goodput_csv)
    return save(goodput_figure(rows, str(goodput_csv), opts), out_base, opts)
