"""SLO attainment against the arrival rate: a line per configuration (mean
over seeds, min-max band), the target line and each configuration's knee
marked (:func:`plot_attainment`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin.errors import TwinError
from twin.viz.canvas import (
    DEFAULT_TARGET,
    RATE_AXIS,
    RATE_COLUMNS,
    RATE_UNIT,
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
    from matplotlib.figure import Figure


KNEE_HANDLE = "knee (last rate at the target)"
COINCIDENT_SHIFT_PT = 2.5  # how far each repeat of a curve is lifted, in points
CENSORED_HANDLE = "knee (hollow >: censored)"  # KNEE_HANDLE's place when a knee is censored
GROUPED_LEGEND_IN = 2.8  # a grouped legend's width: KNEE_HANDLE at 8 pt and its marker


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
