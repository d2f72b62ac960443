"""What every figure of :mod:`twin.viz` shares: the rate columns of a sweep,
reading its CSVs, sizing and titling figures and their panels, naming the
configurations, and saving a figure as PNG, SVG and PDF (the same data gives
the same files)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin._io import atomic_path, read_csv
from twin.errors import TwinError
from twin.viz.style import PALETTE, PlotOptions, Styler, figure, grid, wrap

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


RATE_COLUMNS = ("workload.rate_scale", "workload.arrival.rate")
RATE_AXIS = {
    "workload.rate_scale": "arrival rate (x the trace's rate)",
    "workload.arrival.rate": "arrival rate (requests/s)",
}
RATE_UNIT = {"workload.rate_scale": "x", "workload.arrival.rate": " req/s"}
DEFAULT_TARGET = 0.9
FORMATS = ("png", "svg", "pdf")
# Fixed SVG ids (and no dates, see save): the same data gives the same files.
SVG_HASHSALT = "pd-twin"


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
