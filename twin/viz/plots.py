"""Plots of sweeps and runs, each written as PNG, SVG and PDF
(``out_base.png``, ``out_base.svg``, ``out_base.pdf``).

- :func:`plot_attainment`: SLO attainment against the arrival rate, a line per
  configuration (mean over seeds, min-max band), the target line and each
  configuration's knee marked;
- :func:`plot_goodput`: goodput per configuration, horizontal bars with the
  95% CI;
- :func:`plot_cdfs`: TTFT and TPOT CDFs of single runs (per-request CSVs);
  of a sweep folder, one run per configuration at one common rate;
- :func:`plot_timeline`: one run's iterations per instance and its KV
  transfers per instance pair (from a :class:`~twin.sim.trace.TraceRecorder` or
  a trace JSON of ``twin run --trace-out``);
- :func:`plot_over_time`: one run's SLO attainment and capacity (instances up
  per role, GPUs up), and its KV hand-off time when it moved KV, per window of
  simulated time, its failures, repairs and degradations marked (from ``twin
  run --json``, whose ``fault_log`` or spec ``events:`` it reads, or
  ``--timeline-csv``);
- :func:`plot_dir`: every plot a sweep folder allows.

The sweep plots take :class:`~twin.viz.style.PlotOptions` (panels per value
of a swept key, color by another, size, dpi, key names, the CDFs' rate) and
name configurations by the keys that vary only (:class:`~twin.viz.style.Styler`);
each ``*_figure`` function returns the figure unsaved, for the layout tests.

The sweep folder: ``runs.csv`` (``run_id``, swept keys by dotted path,
``label``, flattened summary metrics, ``gpus``), optional ``goodput.csv``,
``spec.yaml``, ``requests/<run_id>.csv`` and ``trace.json`` or
``traces/<run_id>.json``.

Only the command line and notebooks import this module; the core never does.
Figures are made with :class:`matplotlib.figure.Figure` and saved through the
Agg canvas, so no display is needed and pyplot's global state is untouched.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin._io import atomic_path, read_csv, read_text
from twin.errors import TwinError
from twin.viz.style import PALETTE, PlotOptions, Styler, figure, grid, wrap

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from twin.sim.trace import TraceRecorder

RATE_COLUMNS = ("workload.rate_scale", "workload.arrival.rate")
RATE_AXIS = {
    "workload.rate_scale": "arrival rate (x the trace's rate)",
    "workload.arrival.rate": "arrival rate (requests/s)",
}
RATE_UNIT = {"workload.rate_scale": "x", "workload.arrival.rate": " req/s"}
DEFAULT_TARGET = 0.9
FORMATS = ("png", "svg", "pdf")
SPAN_COLORS = {
    "prefill": "#1f77b4",
    "decode": "#2ca02c",
    "mixed": "#ff7f0e",
    "kv": "#9467bd",
    "fetch": "#8c564b",
}
# Fixed SVG ids (and no dates, see save): the same data gives the same files.
SVG_HASHSALT = "pd-twin"


# -- helpers --------------------------------------------------------------------------------
def knee(rates: Sequence[float], attainment: Sequence[float], target: float) -> float | None:
    """The largest rate whose attainment is >= ``target`` before the first
    rate (in increasing order) that falls below it; None when even the lowest
    rate misses it."""
    best = None
    for r, a in sorted(zip(rates, attainment, strict=True)):
        if not a >= target:
            break
        best = r
    return best


def label_colors(labels: Iterable[str]) -> dict[str, str]:
    """One color per label, by sorted label, so every plot of a sweep agrees."""
    return {lab: PALETTE[i % len(PALETTE)] for i, lab in enumerate(sorted(set(labels)))}


def _float(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _read_csv(path: str | Path) -> list[dict[str, str]]:
    header, rows = read_csv(path)
    return [dict(zip(header, row, strict=True)) for row in rows]


def _figure(width: float, height: float, opts: PlotOptions | None = None) -> Figure:
    return figure(width, height, opts or PlotOptions())


def save(fig: Figure, out_base: str | Path, opts: PlotOptions | None = None) -> list[Path]:
    """``fig`` as ``out_base`` + ``.png`` (at ``opts.dpi``), ``.svg`` and
    ``.pdf``, without dates or tool versions, so that the same data gives the
    same bytes."""
    import matplotlib

    base = Path(out_base)
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TwinError(f"{base.parent}: cannot create: {e.strerror}") from None
    paths = [Path(f"{base}.{ext}") for ext in FORMATS]
    dpi = (opts or PlotOptions()).dpi
    with matplotlib.rc_context({"svg.hashsalt": SVG_HASHSALT}):
        try:
            with atomic_path(paths[0]) as tmp:
                fig.savefig(tmp, dpi=dpi, metadata={"Software": None})
            with atomic_path(paths[1]) as tmp:
                fig.savefig(tmp, metadata={"Date": None, "Creator": None})
            with atomic_path(paths[2]) as tmp:
                fig.savefig(tmp, metadata={"CreationDate": None, "Creator": None, "Producer": None})
        except OSError as e:
            raise TwinError(f"{base}: cannot write: {e.strerror}") from None
    return paths


def _legend_outside(ax: Axes, **kw: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kw)


def _amount(x: float) -> str:
    """``12,345``, ``123``, ``12.3``, ``0.123``: three figures, no exponent."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def swept_columns(columns: Iterable[str], first: str, last: str) -> list[str]:
    """The swept keys of a sweep table: the columns between ``first`` and
    ``last`` (``run_id`` and ``label`` in runs.csv, ``label`` and
    ``goodput_rps_mean`` in goodput.csv), but the rate keys and ``seed``."""
    cols = list(columns)
    if first not in cols or last not in cols:
        return []
    inner = cols[cols.index(first) + 1 : cols.index(last)]
    return [c for c in inner if c not in RATE_COLUMNS and c != "seed"]


def _panels(fig: Figure, styler: Styler, cols_per: int = 1, **kw: Any) -> list[list[Axes]]:
    """One row of ``cols_per`` axes per facet value, laid out on a grid of at
    most 3 facets across; unused cells removed, tick labels kept under the
    last axes of each column."""
    n = len(styler.facets)
    rows, cols = grid(n)
    if cols_per > 1:
        rows, cols = n, 1
    grid_axes = fig.subplots(rows, cols * cols_per, squeeze=False, **kw)
    out = []
    for i in range(n):
        r, c = divmod(i, cols)
        out.append([grid_axes[r][c * cols_per + j] for j in range(cols_per)])
    for i in range(n, rows * cols):
        r, c = divmod(i, cols)
        for j in range(cols_per):
            grid_axes[r][c * cols_per + j].remove()
            if r > 0:
                grid_axes[r - 1][c * cols_per + j].xaxis.set_tick_params(labelbottom=True)
    return out


def _title(fig: Figure, styler: Styler, text: str, *, lines_drawn: bool = True) -> None:
    """The figure's title, the keys every configuration shares and those the
    styles cannot tell apart below it: centered over the axes and wrapped to
    their width, so that it never runs into the legend beside them. Call it
    last: it lays the figure out once to find where the axes are."""

    def lines(width: float) -> str:
        out = [wrap(text, width, 10)]
        shared = styler.constants_text()
        if shared:
            out.append(wrap(f"all: {shared}", width, 10))
        if styler.unstyled and lines_drawn:
            names = ", ".join(styler.name(k) or k for k in styler.unstyled)
            out.append(wrap(f"lines of one style differ in: {names}", width, 10))
        return "\n".join(out)

    title = fig.suptitle(lines(fig.get_figwidth() * 0.6), fontsize=10)
    fig.draw_without_rendering()
    data = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    x0 = min(ax.get_position().x0 for ax in data)
    x1 = max(ax.get_position().x1 for ax in data)
    title.set_text(lines((x1 - x0) * fig.get_figwidth()))
    title.set_x((x0 + x1) / 2)


def _text_width_in(texts: Iterable[str], fontsize: float) -> float:
    """About how wide the longest of ``texts`` is, in inches (0.6 em a glyph)."""
    longest = max((len(line) for t in texts for line in t.split("\n")), default=0)
    return longest * fontsize * 0.6 / 72


def _configs(rows: Sequence[Mapping[str, str]], keys: Sequence[str]) -> dict[str, dict[str, str]]:
    """Each label's values of ``keys`` (its first row's), in the order seen;
    with no swept keys, the label itself (shown as the value alone)."""
    out: dict[str, dict[str, str]] = {}
    for r in rows:
        label = r.get("label") or "all"
        if label not in out:
            out[label] = {k: r.get(k) or "" for k in keys} if keys else {"label": label}
    return out


def _styler(
    configs: Sequence[Mapping[str, str]], keys: Sequence[str], opts: PlotOptions, where: str
) -> Styler:
    if keys:
        return Styler(configs, keys, opts, where)
    bare = PlotOptions(None, None, opts.size, opts.dpi, {"label": ""}, opts.at_rate)
    for flag, key in (("--facet", opts.facet), ("--hue", opts.hue)):
        if key is not None:
            raise TwinError(f"{flag}: {key!r}: {where} has no swept keys")
    return Styler(configs, ["label"], bare, where)


KNEE_HANDLE = "knee (last rate at the target)"
COINCIDENT_SHIFT_PT = 2.5  # how far each repeat of a curve is lifted, in points
GOODPUT_REACH = 1.5  # the goodput axis ends at 1.5 x the largest mean (intervals cut there)
CENSORED_HANDLE = "knee (hollow >: censored)"  # KNEE_HANDLE's place when a knee is censored
WRAP_BARS, WRAP_CHARS = 24, 28  # goodput labels over 28 wrap when a panel has at most 24 bars
GROUPED_LEGEND_IN = 2.8  # a grouped legend's width: KNEE_HANDLE at 8 pt and its marker


# -- SLO attainment ---------------------------------------------------------------------------
def attainment_series(
    rows: list[dict[str, str]], where: str = "runs.csv"
) -> tuple[str, dict[str, list[tuple[float, float, float, float, int]]]]:
    """(rate column, {label: [(rate, mean, min, max, seeds), ...] by rate})
    of a sweep's rows: attainment averaged over seeds per (label, rate)."""
    cols = rows[0].keys() if rows else ()
    rate_col = next((c for c in RATE_COLUMNS if c in cols), None)
    if rate_col is None:
        raise TwinError(
            f"{where}: no rate column; expected one of {', '.join(RATE_COLUMNS)} "
            f"(columns: {', '.join(cols) or 'none'})"
        )
    if "slo_attainment" not in cols:
        raise TwinError(f"{where}: no slo_attainment column")
    groups: dict[tuple[str, float], list[float]] = {}
    for row in rows:
        rate, att = _float(row.get(rate_col)), _float(row.get("slo_attainment"))
        if rate is None or att is None:
            continue
        groups.setdefault((row.get("label") or "all", rate), []).append(att)
    series: dict[str, list[tuple[float, float, float, float, int]]] = {}
    for (label, rate), vals in sorted(groups.items()):
        series.setdefault(label, []).append(
            (rate, sum(vals) / len(vals), min(vals), max(vals), len(vals))
        )
    return rate_col, series


def _target(rows: Sequence[Mapping[str, str]], target: float | None) -> float:
    if target is not None:
        return target
    targets = {_float(r.get("slo.target")) for r in rows} - {None}
    one = targets.pop() if len(targets) == 1 else None
    return one if one is not None else DEFAULT_TARGET


def knees(
    rows: list[dict[str, str]], target: float, where: str = "runs.csv"
) -> dict[str, float | None]:
    """Each label's knee (:func:`knee` of its mean attainment over seeds)."""
    _, series = attainment_series(rows, where)
    return {
        label: knee([p[0] for p in pts], [p[1] for p in pts], target)
        for label, pts in series.items()
    }


def attainment_figure(
    rows: list[dict[str, str]],
    where: str = "runs.csv",
    target: float | None = None,
    opts: PlotOptions | None = None,
) -> Figure:
    """The figure of :func:`plot_attainment` from the rows of a runs.csv."""
    opts = opts or PlotOptions()
    rate_col, series = attainment_series(rows, where)
    if not series:
        raise TwinError(f"{where}: no run has both a rate and an SLO attainment")
    target = _target(rows, target)
    keys = swept_columns(rows[0].keys(), "run_id", "label")
    params = _configs(rows, keys)
    order = [lab for lab in params if lab in series]
    styler = _styler([params[lab] for lab in order], keys if keys else [], opts, where)
    unit = RATE_UNIT[rate_col]
    seeds = max(p[4] for pts in series.values() for p in pts)
    nrows, ncols = grid(len(styler.facets))
    texts = [f"{styler.label(params[lab])} (knee >= 0.00{unit})" for lab in order]
    legend_w = GROUPED_LEGEND_IN if styler.grouped else _text_width_in(texts, 8) + 0.7
    # the axes at least twice as wide as the legend beside them: they fill half the figure
    fig = figure(max(4.6 * ncols, 6.0, 2.2 * legend_w) + legend_w + 0.6, 3.2 * nrows + 1.4, opts)
    panels = _panels(fig, styler, sharex=True, sharey=True)
    axes = [p[0] for p in panels]
    few = not styler.grouped
    per_config = []
    seen: dict[tuple[int, tuple[Any, ...]], list[str]] = {}
    from matplotlib.transforms import offset_copy

    for lab in order:
        pts, cfg = series[lab], params[lab]
        ax = axes[styler.facets.index(styler.facet_of(cfg))]
        c, ls, mk = styler.color(cfg), styler.linestyle(cfg), styler.marker(cfg)
        x = [p[0] for p in pts]
        k = knee(x, [p[1] for p in pts], target)
        # a curve equal to one drawn before in its panel is lifted a few points, so
        # that both show (coincident curves would otherwise read as one)
        same = seen.setdefault((id(ax), tuple(pts)), [])
        shift = offset_copy(ax.transData, fig=fig, y=COINCIDENT_SHIFT_PT * len(same),
                            units="points")  # fmt: skip
        same.append(lab)
        (line,) = ax.plot(x, [100 * p[1] for p in pts], color=c, ls=ls, marker=mk,
                          ms=4 if few else 3.5, lw=1.6 if few else 1.2,
                          transform=shift)  # fmt: skip
        if seeds > 1:
            ax.fill_between(x, [100 * p[2] for p in pts], [100 * p[3] for p in pts],
                            color=c, alpha=0.15 if few else 0.06, lw=0)  # fmt: skip
        # a knee at the highest rate tried is censored: the true knee lies above it
        open_ = k is not None and k == max(x)
        if k is not None:
            y = 100 * next(p[1] for p in pts if p[0] == k)
            ax.plot([k], [y], marker=">" if open_ else "*", ms=(13 if few else 9) - 4 * open_,
                    color="white" if open_ else c, mec=c if open_ else "black",
                    mew=1.4 if open_ else 0.6, zorder=5, ls="", transform=shift)  # fmt: skip
            if few and not open_:
                ax.vlines(k, 0, y, colors=[c], linestyles=":", lw=1.0)
        name = styler.label(cfg)
        text = f"{name} (no knee)" if k is None else f"{name} (knee {k:g}{unit})"
        per_config.append((line, f"{name} (knee >= {k:g}{unit})" if open_ else text))
    from matplotlib.lines import Line2D

    for i, ax in enumerate(axes):
        ax.axhline(100 * target, color="0.3", ls="--", lw=1)
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        ax.set_title(styler.facet_title(styler.facets[i]), fontsize=9)
        r, col = divmod(i, ncols)
        if col == 0:
            ax.set_ylabel("SLO attainment (%)")
        if r == nrows - 1 or i + ncols >= len(axes):
            ax.set_xlabel(RATE_AXIS[rate_col])
    extra = [
        (Line2D([], [], color="0.3", ls="--", lw=1), f"target {100 * target:g}%"),
        (Line2D([], [], color="0.6", marker="*", ms=10, mec="black", mew=0.6, ls=""), KNEE_HANDLE),
    ]
    if any(" (knee >= " in t for _, t in per_config):  # one entry says both marks
        extra[1] = (extra[1][0], CENSORED_HANDLE)
    styler.legend(fig, axes, per_config, extra)
    how = f"mean of {seeds} seeds, band min-max" if seeds > 1 else "one seed"
    _title(fig, styler, f"SLO attainment vs load ({how}, {len(order)} configurations)")
    return fig


def plot_attainment(
    runs_csv: str | Path,
    out_base: str | Path,
    target: float | None = None,
    opts: PlotOptions | None = None,
) -> list[Path]:
    """SLO attainment (%) against the rate, a line per configuration, with the
    ``target`` line (default: the ``slo.target`` column, else 0.9) and each
    configuration's knee starred (and, for a few, its rate in the legend);
    panels, colors and legend as ``opts`` and :class:`~twin.viz.style.Styler` say."""
    rows = _read_csv(runs_csv)
    return save(attainment_figure(rows, str(runs_csv), target, opts), out_base, opts)


# -- goodput ----------------------------------------------------------------------------------
def goodput_figure(
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


# -- CDFs -------------------------------------------------------------------------------------
def read_latencies(
    path: str | Path, of_class: str | None = None
) -> tuple[list[float], list[float]]:
    """(TTFT s, TPOT s) of the completed requests of a ``--requests-csv`` file
    (``of_class``: of that class of traffic only)."""
    rows = _read_csv(path)
    if rows and not {"ttft_s", "tpot_s", "status"} <= rows[0].keys():
        raise TwinError(f"{path}: not a requests CSV (needs ttft_s, tpot_s, status)")
    ttft, tpot = [], []
    for r in rows:
        if r["status"] != "completed" or (of_class is not None and r["class"] != of_class):
            continue
        a, b = _float(r["ttft_s"]), _float(r["tpot_s"])
        if a is not None:
            ttft.append(a)
        if b is not None:
            tpot.append(b)
    return sorted(ttft), sorted(tpot)


def csv_classes(path: str | Path) -> list[str]:
    """The classes of traffic of a ``--requests-csv`` file, in order of first
    appearance; an error naming the file when it has no class column."""
    rows = _read_csv(path)
    if rows and "class" not in rows[0]:
        raise TwinError(
            f"{path}: no class column: --by-class needs the requests of a run with workload.classes"
        )
    return list(dict.fromkeys(r["class"] for r in rows))


def _log_if_wide(ax: Axes, values: list[float]) -> None:
    pos = [v for v in values if v > 0]
    if pos and max(pos) / min(pos) > 50:
        ax.set_xscale("log")


def cdf_figure(
    runs: Sequence[tuple[Mapping[str, str], str, str | Path]],
    styler: Styler,
    title: str,
    *,
    ttft_slo_s: float | None = None,
    tpot_slo_s: float | None = None,
) -> Figure:
    """TTFT and TPOT CDFs, a row of two panels per facet; ``runs``:
    (configuration, legend text, requests CSV) each."""
    opts = styler.opts
    data = [(cfg, text, read_latencies(p, cfg.get("class"))) for cfg, text, p in runs]
    data = [d for d in data if d[2][0]]
    if not data:
        raise TwinError("no completed requests in " + ", ".join(str(p) for _, _, p in runs))
    n = len(styler.facets)
    legend_w = (
        GROUPED_LEGEND_IN if styler.grouped else _text_width_in((t for _, t, _ in data), 8) + 0.7
    )
    fig = figure(max(9.0, 2.2 * legend_w) + legend_w, 3.0 * n + 1.4, opts)
    panels = _panels(fig, styler, cols_per=2, sharex="col", sharey=True)
    few = not styler.grouped
    per_config = []
    for cfg, text, (ttft, tpot) in data:
        ax1, ax2 = panels[styler.facets.index(styler.facet_of(cfg))]
        style: dict[str, Any] = {
            "color": styler.color(cfg),
            "ls": styler.linestyle(cfg),
            "lw": 1.5 if few else 1.1,
        }
        if styler.marker_key:
            style.update(marker=styler.marker(cfg), markevery=0.2, ms=4)
        m = len(ttft)
        (line,) = ax1.step(ttft, [(i + 1) / m for i in range(m)], where="post", **style)
        if tpot:
            ms = [v * 1e3 for v in tpot]
            ax2.step(ms, [(i + 1) / len(ms) for i in range(len(ms))], where="post", **style)
        per_config.append((line, text))
    _log_if_wide(panels[0][0], [v for _, _, (t, _) in data for v in t])
    _log_if_wide(panels[0][1], [v * 1e3 for _, _, (_, t) in data for v in t])
    from matplotlib.lines import Line2D

    extra = []
    for i, (ax1, ax2) in enumerate(panels):
        if ttft_slo_s is not None:
            ax1.axvline(ttft_slo_s, color="0.3", ls="--", lw=1)
        if tpot_slo_s is not None:
            ax2.axvline(tpot_slo_s * 1e3, color="0.3", ls="--", lw=1)
        facet = styler.facet_title(styler.facets[i])
        for ax, what in ((ax1, "TTFT"), (ax2, "TPOT")):
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            ax.set_title(f"{what} CDF" + (f", {facet}" if facet else ""), fontsize=9)
        ax1.set_ylabel("share of completed requests")
    panels[-1][0].set_xlabel("time to first token (s)")
    panels[-1][1].set_xlabel("time per output token (ms)")
    if ttft_slo_s is not None or tpot_slo_s is not None:
        slos = [f"TTFT {ttft_slo_s:g} s" if ttft_slo_s is not None else "",
                f"TPOT {tpot_slo_s * 1e3:g} ms" if tpot_slo_s is not None else ""]  # fmt: skip
        extra.append(
            (Line2D([], [], color="0.3", ls="--", lw=1), "SLO " + ", ".join(s for s in slos if s))
        )
    styler.legend(fig, [a for p in panels for a in p], per_config, extra)
    _title(fig, styler, title)
    return fig


def plot_cdfs(
    request_csvs: Mapping[str, str | Path],
    out_base: str | Path,
    *,
    ttft_slo_s: float | None = None,
    tpot_slo_s: float | None = None,
    opts: PlotOptions | None = None,
    by_class: bool = False,
) -> list[Path]:
    """CDFs of TTFT (s) and TPOT (ms) of completed requests, one line per
    label (``{label: requests CSV}``), with the SLOs as vertical lines when
    given; ``by_class``: one line per class of traffic of each file."""
    opts = opts or PlotOptions()
    if opts.facet is not None or opts.hue is not None or opts.at_rate is not None:
        raise TwinError("--facet, --hue and --at-rate apply to a sweep folder")
    if by_class:
        request_csvs = {
            f"{label}: {name}": path
            for label, path in request_csvs.items()
            for name in csv_classes(path)
        }
    configs = [{"run": label} for label in request_csvs]
    bare = PlotOptions(None, None, opts.size, opts.dpi, {"run": "", **opts.labels})
    styler = Styler(configs, ["run"], bare, "--requests")
    styler.constant = []  # one file: its name is in the legend already
    if by_class:  # each line reads its class's rows
        configs = [{"run": label, "class": label.rpartition(": ")[2]} for label in request_csvs]
    runs = [(c, c["run"], p) for c, p in zip(configs, request_csvs.values(), strict=True)]
    fig = cdf_figure(runs, styler, "TTFT and TPOT CDFs", ttft_slo_s=ttft_slo_s,
                     tpot_slo_s=tpot_slo_s)  # fmt: skip
    return save(fig, out_base, opts)


# -- timeline ---------------------------------------------------------------------------------
def load_trace(trace: TraceRecorder | Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """A Chrome trace document from a recorder, a loaded document or a file."""
    from twin.sim.trace import TraceRecorder, chrome_trace

    if isinstance(trace, TraceRecorder):
        return chrome_trace(trace)
    if isinstance(trace, Mapping):
        return dict(trace)
    if isinstance(trace, str | Path):
        try:
            doc = json.loads(read_text(trace, "trace"))
        except json.JSONDecodeError as e:
            raise TwinError(f"{trace}: not JSON: {e}") from None
        if not isinstance(doc, dict) or "traceEvents" not in doc:
            raise TwinError(f"{trace}: not a Chrome trace (no traceEvents)")
        _check_events(doc["traceEvents"], str(trace))
        return doc
    raise TwinError(
        f"a timeline needs iteration durations: pass a TraceRecorder (Simulation(spec, "
        f"trace=...)) or a trace JSON from `twin run --trace-out`, not {type(trace).__name__}"
    )


def _check_events(events: Any, where: str) -> None:
    """The fields :func:`plot_timeline` reads: each event an object, ``ts`` and
    ``dur`` numbers, ``pid`` and ``tid`` numbers or strings."""
    if not isinstance(events, list):
        raise TwinError(f"{where}: traceEvents: {type(events).__name__}; expected a list")
    for i, e in enumerate(events):
        at = f"{where}: traceEvents[{i}]"
        if not isinstance(e, dict):
            raise TwinError(f"{at}: {e!r:.60} is not an object")
        for k in ("pid", "tid"):
            if k in e and (isinstance(e[k], bool) or not isinstance(e[k], int | float | str)):
                raise TwinError(f"{at}.{k}: {e[k]!r:.60} is not a number or a string")
        need = ("ts", "dur") if e.get("ph") == "X" else ("ts",) if e.get("ph") == "i" else ()
        for k in need:
            v = e.get(k)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise TwinError(f"{at}.{k}: {v!r:.60} is not a number of microseconds")
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            args = e.get("args")
            if not isinstance(args, dict) or "name" not in args:
                raise TwinError(f"{at}.args: expected {{name: ...}} for a thread_name event")


def _span_color(e: dict[str, Any]) -> str:
    if e.get("cat") == "transfer":
        return SPAN_COLORS["fetch" if str(e["name"]).startswith("fetch") else "kv"]
    return SPAN_COLORS.get(str(e["name"]), "#7f7f7f")


def plot_timeline(
    trace_or_log: TraceRecorder | Mapping[str, Any] | str | Path,
    out_base: str | Path,
    *,
    window_s: tuple[float, float] | None = None,
    opts: PlotOptions | None = None,
) -> list[Path]:
    """One row per instance with its iterations (colored prefill, decode or
    mixed) and one per instance pair with its KV transfers, over the
    run or ``window_s`` = (start, end) seconds; preemptions are red ticks."""
    doc = load_trace(trace_or_log)
    names: dict[tuple[int, int], str] = {}
    spans: dict[tuple[int, int], dict[str, list[tuple[float, float]]]] = {}
    instants: dict[tuple[int, int], list[float]] = {}
    parity: dict[tuple[int, int], int] = {}
    t_max = 0.0
    begun: dict[tuple[Any, Any], dict[str, Any]] = {}  # (cat, id) -> its async "b" event
    for e in doc["traceEvents"]:
        key = (e.get("pid", 0), e.get("tid", 0))
        if e.get("ph") == "b":
            begun[(e.get("cat"), e.get("id"))] = e
            continue
        if e.get("ph") == "e":  # an async slice (a transfer) on its begin's row
            b = begun.pop((e.get("cat"), e.get("id")), None)
            if b is None:
                continue
            label = b.get("args", {}).get("label", b.get("name", ""))
            e = {**b, "ph": "X", "name": label, "dur": e["ts"] - b["ts"]}
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[key] = e["args"]["name"]
        elif e.get("ph") == "X":
            a, d = e["ts"] / 1e6, e["dur"] / 1e6
            t_max = max(t_max, a + d)
            if window_s is not None and (a + d < window_s[0] or a > window_s[1]):
                continue
            # consecutive spans of a row alternate two shades, so steps show when zoomed in
            n = parity[key] = parity.get(key, -1) + 1
            color = _span_color(e) + ("" if n % 2 == 0 else "b0")
            spans.setdefault(key, {}).setdefault(color, []).append((a, d))
        elif e.get("ph") == "i" and str(e.get("name", "")).startswith("preempt"):
            instants.setdefault(key, []).append(e["ts"] / 1e6)
    rows = sorted(set(names) | set(spans))
    if not rows:
        raise TwinError("the trace has no instances or spans")
    fig = _figure(12.0, 1.6 + 0.42 * len(rows), opts)
    ax = fig.add_subplot()
    for y, key in enumerate(rows):
        for color, bars in spans.get(key, {}).items():
            # an edge as wide as a hairline keeps spans narrower than a pixel visible
            ax.broken_barh(bars, (y - 0.38, 0.76), facecolors=color, edgecolors=color, lw=0.4)
        if key in instants:
            ax.plot(instants[key], [y] * len(instants[key]), "|", color="#d62728", ms=12)
    ax.set_yticks(range(len(rows)), [names.get(k, f"{k[0]}/{k[1]}") for k in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(*(window_s or (0.0, t_max or 1.0)))
    ax.set_xlabel("simulated time (s)")
    ax.grid(axis="x", alpha=0.3)
    n_inst = sum(1 for k in rows if k[0] == 1)
    if 0 < n_inst < len(rows):
        ax.axhline(n_inst - 0.5, color="0.5", lw=0.8)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    used = {c[:7] for d in spans.values() for c in d}
    handles: list[Any] = [
        Patch(color=c, label={"kv": "KV transfer", "fetch": "KV pool fetch"}.get(k, k))
        for k, c in SPAN_COLORS.items()
        if c in used
    ]
    if instants:
        handles.append(Line2D([], [], marker="|", ls="", color="#d62728", ms=10, label="preempt"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    name = doc.get("otherData", {}).get("name") or "run"
    when = f", {window_s[0]:g} to {window_s[1]:g} s" if window_s else ""
    ax.set_title(f"Timeline of {name}{when}: iterations per instance, KV transfers per pair")
    return save(fig, out_base, opts)


# -- one run over time ------------------------------------------------------------------------
ROLE_STYLES = {"mixed": ("#ff7f0e", "-"), "prefill": ("#1f77b4", "-"), "decode": ("#2ca02c", "--")}
_EVENT_TARGETS = ("instance", "node", "gpu", "link", "nic")  # twin.sim.faults.TARGETS
_EVENT_ACTIONS = ("fail", "recover", "degrade", "restore")


def _grouped(events: list[tuple[float, str, str, Any, Any]]) -> list[tuple[float, str]]:
    """``(time s, label)`` per event in time order; several events of one
    action on one kind of target at one time (a whole fabric degraded) make
    one label, ``degrade 32 nics x0.25``."""
    from twin.sim.faults import label as event_label

    groups: dict[tuple[float, str, str, Any], list[Any]] = {}
    for t, action, target, name, factor in events:
        groups.setdefault((t, action, target, factor), []).append(name)
    out = []
    for (t, action, target, factor), names in groups.items():
        if len(names) > 2:
            f = _float(factor)
            x = f" x{f:g}" if action == "degrade" and f else ""
            out.append((t, f"{action} {len(names)} {target}s{x}"))
        else:
            out.extend((t, event_label(action, target, n, _float(factor))) for n in names)
    return sorted(out, key=lambda x: x[0])


def spec_events(spec: Any) -> list[tuple[float, str]]:
    """``(time s, label)`` of a resolved spec's ``events:`` list (``at``, an
    ``action``, one target key and, to degrade, a ``factor``; see
    :mod:`twin.sim.faults`), read defensively: an entry without a time, an
    action or a target is skipped."""
    events = spec.get("events") if isinstance(spec, Mapping) else None
    if not isinstance(events, list):
        return []
    out = []
    for e in events:
        if not isinstance(e, Mapping):
            continue
        t = _seconds(e.get("at"))
        action = e.get("action")
        target = next((k for k in _EVENT_TARGETS if e.get(k) is not None), None)
        if t is None or not math.isfinite(t) or action not in _EVENT_ACTIONS or target is None:
            continue
        out.append((t, str(action), target, e[target], e.get("factor")))
    return _grouped(out)


def fault_log_events(log: Any) -> list[tuple[float, str]]:
    """``(time s, label)`` of a result's ``fault_log`` (the events as they took
    effect, random failures and repairs included); malformed rows are skipped."""
    if not isinstance(log, list):
        return []
    out = []
    for e in log:
        if not isinstance(e, Mapping):
            continue
        t = _float(e.get("time_s"))
        action, target = e.get("action"), e.get("target")
        if t is None or not math.isfinite(t) or action not in _EVENT_ACTIONS or target is None:
            continue
        out.append((t, str(action), str(target), e.get("name"), e.get("factor")))
    return _grouped(out)


def load_run_timeline(
    source: Mapping[str, Any] | str | Path,
) -> tuple[list[dict[str, float | None]], list[tuple[float, str]], float | None, str]:
    """(timeline rows with numbers, events, SLO target, name) of a run: a
    result mapping, a ``twin run --json`` file or a ``--timeline-csv`` file
    (told apart by content: a JSON object, else CSV with ``start_s``). The
    events are the result's ``fault_log`` when it has one (random failures
    included), else its spec's ``events:``; a CSV has neither."""
    from twin.sim.timeline import TIMELINE_COLUMNS

    where = "result" if isinstance(source, Mapping) else str(source)
    if isinstance(source, Mapping):
        doc: Any = source
    else:
        text = read_text(source, "timeline")
        if text.lstrip().startswith("{"):
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as e:
                raise TwinError(f"{source}: not JSON: {e}") from None
        else:
            doc = {"timeline": list(csv.DictReader(text.splitlines()))}
    rows = doc.get("timeline") if isinstance(doc, Mapping) else None
    if not isinstance(rows, list) or (rows and not isinstance(rows[0], Mapping)):
        raise TwinError(f"{where}: no timeline (a `twin run --json` or --timeline-csv file)")
    if rows and "start_s" not in rows[0]:
        raise TwinError(
            f"{where}: not a timeline CSV; expected columns {', '.join(TIMELINE_COLUMNS[:4])}, ..."
        )

    def sub(m: Any, key: str) -> Mapping[str, Any]:
        v = m.get(key)
        return v if isinstance(v, Mapping) else {}

    spec = sub(sub(doc, "header"), "spec")
    slo = sub(spec, "slo")
    target = _float(slo.get("target"))
    name = str(spec.get("name") or (Path(where).stem if where != "result" else "run"))
    return (
        [{k: _float(r.get(k)) for k in TIMELINE_COLUMNS} for r in rows],
        fault_log_events(doc["fault_log"]) if "fault_log" in doc else spec_events(spec),
        target,
        name,
    )


def plot_over_time(
    source: Mapping[str, Any] | str | Path, out_base: str | Path, opts: PlotOptions | None = None
) -> list[Path]:
    """A run's SLO attainment per window (by arrival) above its capacity:
    instances up per role and GPUs up, averaged over each window; below them,
    when the run moved KV, the median hand-off time per window; the run's
    failures, repairs and degradations as labelled vertical lines in each."""
    rows, events, target, name = load_run_timeline(source)
    if not rows:
        raise TwinError(f"{source if not isinstance(source, Mapping) else 'result'}: "
                        "the timeline has no windows (no request ended)")  # fmt: skip
    edges = [r["start_s"] or 0.0 for r in rows] + [rows[-1]["end_s"] or 0.0]

    def steps(key: str) -> list[float]:
        vals = [math.nan if r[key] is None else float(r[key]) for r in rows]  # type: ignore[arg-type]
        return vals + vals[-1:]

    moved = any(r.get("transfer_p50_s") is not None for r in rows)
    fig = _figure(10.0, 8.0 if moved else 6.0, opts)
    if moved:
        top, bottom, kv = fig.subplots(3, 1, sharex=True, height_ratios=(3, 2, 2))
        ms = [v * 1e3 for v in steps("transfer_p50_s")]
        kv.step(edges, ms, where="post", color=PALETTE[2], label="KV hand-off p50")
        kv.set_ylabel("hand-off p50 (ms)")
        kv.set_ylim(bottom=0)
        kv.grid(alpha=0.3)
        _legend_outside(kv)
        axes: tuple[Axes, ...] = (top, bottom, kv)
    else:
        top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
        axes = (top, bottom)
    att = [v * 100 for v in steps("slo_attainment")]
    top.step(edges, att, where="post", color=PALETTE[0], label="SLO attainment (by arrival)")
    if target is not None:
        top.axhline(target * 100, color="0.4", ls="--", lw=1, label=f"target {target * 100:g}%")
    top.set_ylim(-2, 102)
    top.set_ylabel("SLO attainment (%)")
    top.grid(alpha=0.3)
    _legend_outside(top)
    for role, (color, ls) in ROLE_STYLES.items():
        vals = steps(f"instances_{role}")
        if any(v > 0 for v in vals if not math.isnan(v)):
            bottom.step(edges, vals, where="post", color=color, ls=ls, label=f"{role} instances")
    bottom.set_ylabel("instances up")
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    gpus = bottom.twinx()
    gpus.step(edges, steps("gpus_up"), where="post", color="0.3", ls=":", label="GPUs up")
    gpus.set_ylabel("GPUs up")
    gpus.set_ylim(bottom=0)
    handles = bottom.get_legend_handles_labels()[0] + gpus.get_legend_handles_labels()[0]
    bottom.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.1, 1.0))
    for t, label in events:
        for ax in axes:
            ax.axvline(t, color="#d62728", lw=0.9, alpha=0.8)
        top.annotate(label, (t, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -2),
                     textcoords="offset points", rotation=90, va="top", fontsize=7,
                     color="#d62728")  # fmt: skip
    axes[-1].set_xlabel("simulated time (s)")
    bottom.set_xlim(edges[0], edges[-1] if edges[-1] > edges[0] else edges[0] + 1.0)
    width = f" (windows of {edges[1] - edges[0]:g} s)" if len(rows) > 1 else ""
    top.set_title(f"{name} over time{width}")
    return save(fig, out_base, opts)


# -- a sweep folder ---------------------------------------------------------------------------
def _spec_slo(d: Path) -> dict[str, Any]:
    path = d / "spec.yaml"
    if not path.is_file():
        return {}
    import yaml

    from twin import yamlio

    try:
        data = yamlio.load(read_text(path, "spec")) or {}
    except (TwinError, yaml.YAMLError):
        return {}
    slo = data.get("slo") if isinstance(data, dict) else None
    return slo if isinstance(slo, dict) else {}


def _seconds(value: Any) -> float | None:
    from twin.units import parse_duration

    if value is None:
        return None
    try:
        return float(parse_duration(value)) if isinstance(value, str) else float(value)
    except (TwinError, TypeError, ValueError):
        return None


def common_rate(
    rows: list[dict[str, str]], target: float, at_rate: float | None
) -> tuple[float, str]:
    """(rate, why) the CDFs compare the configurations at: ``at_rate`` when
    given, else the swept rate nearest the median of the configurations'
    knees (the lowest rate when none has one)."""
    rate_col, series = attainment_series(rows)
    if at_rate is not None:
        return at_rate, "asked"
    rates = sorted({p[0] for pts in series.values() for p in pts})
    found = sorted(k for k in knees(rows, target).values() if k is not None)
    if not found:
        return rates[0], "the lowest rate swept: no configuration has a knee"
    mid = (
        found[len(found) // 2]
        if len(found) % 2
        else (found[len(found) // 2 - 1] + found[len(found) // 2]) / 2
    )
    return min(rates, key=lambda r: (abs(r - mid), r)), "the median knee"


def cdf_runs(
    d: Path, rows: list[dict[str, str]], rate: float | None
) -> list[tuple[str, float, Path]]:
    """Per label (in the sweep's order), the run with per-request data at the
    rate nearest ``rate`` (lowest seed first; any rate when the sweep has no
    rate column, ``rate`` None): (label, its rate, requests CSV)."""
    have = {p.stem: p for p in sorted((d / "requests").glob("*.csv"))}
    rate_col = next((c for c in RATE_COLUMNS if rows and c in rows[0]), None)
    out = []
    for label in dict.fromkeys(r.get("label") or "all" for r in rows):
        cands = [
            r for r in rows
            if (r.get("label") or "all") == label and r.get("run_id") in have
            and (rate_col is None or _float(r.get(rate_col)) is not None)
        ]  # fmt: skip
        if not cands:
            continue

        def closeness(r: dict[str, str]) -> tuple[float, float, float, str]:
            x = (_float(r.get(rate_col)) or 0.0) if rate_col else 0.0
            return (abs(x - (rate or 0.0)), x, _float(r.get("seed")) or 0.0, r["run_id"])

        best = min(cands, key=closeness)
        x = (_float(best.get(rate_col)) or 0.0) if rate_col else 0.0
        out.append((label, x, have[best["run_id"]]))
    return out


def sweep_cdf_figure(
    d: Path, rows: list[dict[str, str]], slo: Mapping[str, Any], opts: PlotOptions
) -> Figure | None:
    """The CDFs of the folder's configurations at one common rate
    (:func:`common_rate`), stated in the title; None without per-request data."""
    target = _float(slo.get("target")) or DEFAULT_TARGET
    rate_col = next((c for c in RATE_COLUMNS if rows and c in rows[0]), None)
    if rate_col is None and opts.at_rate is not None:
        raise TwinError(f"--at-rate: {d / 'runs.csv'} sweeps no rate ({', '.join(RATE_COLUMNS)})")
    rate, why = common_rate(rows, target, opts.at_rate) if rate_col else (0.0, "")
    picked = cdf_runs(d, rows, rate if rate_col else None)
    if not picked:
        return None
    unit = RATE_UNIT[rate_col] if rate_col else ""
    keys = swept_columns(rows[0].keys(), "run_id", "label")
    params = _configs(rows, keys)
    styler = _styler([params[lab] for lab, _, _ in picked], keys, opts, str(d / "runs.csv"))
    got = sorted({x for _, x, _ in picked})
    if rate_col is None:
        at = "(one run per configuration)"
    elif len(got) == 1:
        at = f"at {got[0]:g}{unit}"
        if why != "asked":
            at += f" ({why})"
        elif got[0] != rate:
            at += f" (the swept rate nearest {rate:g}{unit})"
    else:
        listed = ", ".join(f"{x:g}" for x in got)
        at = f"at the rates nearest {rate:g}{unit} ({why}): {listed}{unit}"
    texts = []
    for lab, x, _ in picked:
        name = styler.label(params[lab])
        texts.append(name if len(got) == 1 else f"{name} @ {x:g}{unit}")

    def one_slo(key: str) -> float | None:
        """The SLO every configuration shares: swept to one value, or the spec's."""
        if f"slo.{key}" not in rows[0]:
            return _seconds(slo.get(key))
        values = {r.get(f"slo.{key}") for r in rows}
        return _seconds(values.pop()) if len(values) == 1 else None

    ttft, tpot = one_slo("ttft"), one_slo("tpot")
    runs = [(params[lab], t, p) for (lab, _, p), t in zip(picked, texts, strict=True)]
    return cdf_figure(runs, styler, f"TTFT and TPOT CDFs {at}", ttft_slo_s=ttft, tpot_slo_s=tpot)


def sweep_figures(
    d: str | Path,
    opts: PlotOptions | None = None,
    note: Callable[[str], None] | None = None,
    unproduced: Sequence[str] = (),
) -> dict[str, Figure]:
    """The figures a sweep folder allows, by name: ``attainment``
    (runs.csv), ``goodput`` (goodput.csv), ``cdf`` (requests/*.csv); what
    cannot be drawn is told to ``note`` (default: stderr), but for the plots
    named in ``unproduced`` (the command that made the folder did not write
    their inputs: a note would point at nothing to do)."""
    d = Path(d)
    if not d.is_dir():
        raise TwinError(f"{d}: not a folder")
    opts = opts or PlotOptions()
    tell = note or (lambda msg: print(f"twin plot: {msg}", file=sys.stderr))

    def say(plot: str, msg: str) -> None:
        if plot not in unproduced:
            tell(msg)

    slo = _spec_slo(d)
    target = _float(slo.get("target")) or DEFAULT_TARGET
    figs: dict[str, Figure] = {}
    rows = _read_csv(d / "runs.csv") if (d / "runs.csv").is_file() else []
    if rows:
        try:
            figs["attainment"] = attainment_figure(rows, str(d / "runs.csv"), target, opts)
        except TwinError as e:
            if opts.facet is not None or opts.hue is not None:
                raise
            say("attainment", f"no attainment plot: {e}")
    else:
        say("attainment", f"no attainment plot: {d / 'runs.csv'} missing or empty")
    if (d / "goodput.csv").is_file():
        figs["goodput"] = goodput_figure(_read_csv(d / "goodput.csv"), str(d / "goodput.csv"), opts)
    cdf = None
    if rows and any((d / "requests").glob("*.csv")):
        try:
            cdf = sweep_cdf_figure(d, rows, slo, opts)
        except TwinError as e:
            if opts.facet is not None or opts.hue is not None or opts.at_rate is not None:
                raise
            say("cdf", f"no CDFs: {e}")
            return figs
    if cdf is not None:
        figs["cdf"] = cdf
    else:
        say("cdf", f"no CDFs: no per-request data ({d / 'requests'}/<run_id>.csv)")
    return figs


def plot_dir(
    d: str | Path,
    out: str | Path | None = None,
    note: Callable[[str], None] | None = None,
    opts: PlotOptions | None = None,
    unproduced: Sequence[str] = (),
) -> list[Path]:
    """Every plot a sweep folder allows, written to ``out`` (default
    ``d/plots``): :func:`sweep_figures` and a timeline (trace.json or the
    first traces/*.json). What cannot be drawn is skipped with a note
    (default: to stderr), but for the plots named in ``unproduced``."""
    d = Path(d)
    out = Path(out) if out is not None else d / "plots"
    tell = note or (lambda msg: print(f"twin plot: {msg}", file=sys.stderr))

    def say(plot: str, msg: str) -> None:
        if plot not in unproduced:
            tell(msg)

    written: list[Path] = []
    for name, fig in sweep_figures(d, opts, tell, unproduced).items():
        written += save(fig, out / name, opts)
    traces = [d / "trace.json"] if (d / "trace.json").is_file() else []
    traces += sorted((d / "traces").glob("*.json"))
    if traces:
        written += plot_timeline(traces[0], out / "timeline", opts=opts)
    else:
        say("timeline", f"no timeline: no {d / 'trace.json'} or {d / 'traces'}/<run_id>.json")
    return written


# -- KV tiers ---------------------------------------------------------------------------------
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
