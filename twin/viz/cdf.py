"""TTFT and TPOT CDFs: of single runs' per-request CSVs (:func:`plot_cdfs`),
and of a sweep folder, one run per configuration at one common rate
(:func:`sweep_cdf_figure`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin.errors import TwinError
from twin.viz.attainment import GROUPED_LEGEND_IN, attainment_series, knees
from twin.viz.canvas import (
    DEFAULT_TARGET,
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
from twin.viz.style import PlotOptions, Styler, figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def read_latencies(
    path: str | Path, of_class: str | None = None, column: str = "class"
) -> tuple[list[float], list[float]]:
    """(TTFT s, TPOT s) of the completed requests of a ``--requests-csv`` file
    (``of_class``: of that class of traffic only; of that model, ``column``
    "model")."""
    rows = _read_csv(path)
    if rows and not {"ttft_s", "tpot_s", "status"} <= rows[0].keys():
        raise TwinError(f"{path}: not a requests CSV (needs ttft_s, tpot_s, status)")
    ttft, tpot = [], []
    for r in rows:
        if r["status"] != "completed" or (of_class is not None and r[column] != of_class):
            continue
        a, b = _float(r["ttft_s"]), _float(r["tpot_s"])
        if a is not None:
            ttft.append(a)
        if b is not None:
            tpot.append(b)
    return sorted(ttft), sorted(tpot)


_NEEDS = {"class": "workload.classes", "model": "several models (models:)"}


def csv_classes(path: str | Path, column: str = "class") -> list[str]:
    """The classes of traffic (``column`` "model": the models) of a
    ``--requests-csv`` file, in order of first appearance; an error naming
    the file when it has no such column."""
    rows = _read_csv(path)
    if rows and column not in rows[0]:
        raise TwinError(
            f"{path}: no {column} column: --by-{column} needs the requests of a run with "
            f"{_NEEDS[column]}"
        )
    return list(dict.fromkeys(r[column] for r in rows))


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
    data = [(cfg, text, _latencies(cfg, p)) for cfg, text, p in runs]
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


def _latencies(cfg: Mapping[str, str], path: str | Path) -> tuple[list[float], list[float]]:
    """The latencies of ``path`` a line of configuration ``cfg`` plots: of
    its class or its model when it names one."""
    column = "model" if "model" in cfg else "class"
    return read_latencies(path, cfg.get(column), column)


def plot_cdfs(
    request_csvs: Mapping[str, str | Path],
    out_base: str | Path,
    *,
    ttft_slo_s: float | None = None,
    tpot_slo_s: float | None = None,
    opts: PlotOptions | None = None,
    by_class: bool = False,
    by_model: bool = False,
) -> list[Path]:
    """CDFs of TTFT (s) and TPOT (ms) of completed requests, one line per
    label (``{label: requests CSV}``), with the SLOs as vertical lines when
    given; ``by_class``: one line per class of traffic of each file;
    ``by_model``: one line per model of each file."""
    opts = opts or PlotOptions()
    if opts.facet is not None or opts.hue is not None or opts.at_rate is not None:
        raise TwinError("--facet, --hue and --at-rate apply to a sweep folder")
    column = "model" if by_model else "class" if by_class else None
    if column is not None:
        request_csvs = {
            f"{label}: {name}": path
            for label, path in request_csvs.items()
            for name in csv_classes(path, column)
        }
    configs = [{"run": label} for label in request_csvs]
    bare = PlotOptions(None, None, opts.size, opts.dpi, {"run": "", **opts.labels})
    styler = Styler(configs, ["run"], bare, "--requests")
    styler.constant = []  # one file: its name is in the legend already
    if column is not None:  # each line reads its class's (model's) rows
        configs = [{"run": label, column: label.rpartition(": ")[2]} for label in request_csvs]
    runs = [(c, c["run"], p) for c, p in zip(configs, request_csvs.values(), strict=True)]
    fig = cdf_figure(runs, styler, "TTFT and TPOT CDFs", ttft_slo_s=ttft_slo_s,
                     tpot_slo_s=tpot_slo_s)  # fmt: skip
    return save(fig, out_base, opts)


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
