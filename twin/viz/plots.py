"""Plots of sweeps and runs, each written as PNG and SVG (``out_base.png``,
``out_base.svg``).

- :func:`plot_attainment`: SLO attainment against the arrival rate, a line per
  configuration (mean over seeds, min-max band), the target line and each
  configuration's knee marked;
- :func:`plot_goodput`: goodput per configuration, bars with the 95% CI;
- :func:`plot_cdfs`: TTFT and TPOT CDFs of single runs (per-request CSVs);
- :func:`plot_timeline`: one run's iterations per instance and its KV
  transfers per instance pair (from a :class:`~twin.sim.trace.TraceRecorder` or
  a trace JSON of ``twin run --trace-out``);
- :func:`plot_over_time`: one run's SLO attainment and capacity (instances up
  per role, GPUs up), and its KV hand-off time when it moved KV, per window of
  simulated time, its failures, repairs and degradations marked (from ``twin
  run --json``, whose ``fault_log`` or spec ``events:`` it reads, or
  ``--timeline-csv``);
- :func:`plot_dir`: every plot a sweep folder allows.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin.errors import TwinError

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
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
SPAN_COLORS = {
    "prefill": "#1f77b4",
    "decode": "#2ca02c",
    "mixed": "#ff7f0e",
    "kv": "#9467bd",
    "fetch": "#8c564b",
}
# Fixed SVG ids (and no dates, see _save): the same data gives the same files.
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
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise TwinError(f"{path}: cannot read: {e.strerror}") from None


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig: Figure, out_base: str | Path) -> list[Path]:
    import matplotlib

    base = Path(out_base)
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TwinError(f"{base.parent}: cannot create: {e.strerror}") from None
    png, svg = Path(f"{base}.png"), Path(f"{base}.svg")
    with matplotlib.rc_context({"svg.hashsalt": SVG_HASHSALT}):
        try:
            fig.savefig(png, dpi=150, metadata={"Software": None})
            fig.savefig(svg, metadata={"Date": None, "Creator": None})
        except OSError as e:
            raise TwinError(f"{base}: cannot write: {e.strerror}") from None
    return [png, svg]


def _legend_outside(ax: Axes, **kw: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kw)


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


def plot_attainment(
    runs_csv: str | Path, out_base: str | Path, target: float | None = None
) -> list[Path]:
    """SLO attainment (%) against the rate, a line per label, with the
    ``target`` line (default: the ``slo.target`` column, else 0.9) and each
    label's knee marked and annotated."""
    rows = _read_csv(runs_csv)
    rate_col, series = attainment_series(rows, str(runs_csv))
    if not series:
        raise TwinError(f"{runs_csv}: no run has both a rate and an SLO attainment")
    if target is None:
        targets = {_float(r.get("slo.target")) for r in rows} - {None}
        one = targets.pop() if len(targets) == 1 else None
        target = one if one is not None else DEFAULT_TARGET
    colors = label_colors(series)
    fig = _figure(8.5, 4.8)
    ax = fig.add_subplot()
    seeds = max(p[4] for pts in series.values() for p in pts)
    unit = RATE_UNIT[rate_col]
    knees: dict[float, int] = {}  # knee rate -> labels annotated there so far
    for label, pts in series.items():
        c = colors[label]
        x = [p[0] for p in pts]
        k = knee(x, [p[1] for p in pts], target)
        text = f"{label} (knee {k:g}{unit})" if k is not None else f"{label} (no knee)"
        ax.plot(x, [100 * p[1] for p in pts], "o-", color=c, label=text, ms=4, lw=1.6)
        if seeds > 1:
            ax.fill_between(x, [100 * p[2] for p in pts], [100 * p[3] for p in pts],
                            color=c, alpha=0.15, lw=0)  # fmt: skip
        if k is not None:
            y = 100 * next(p[1] for p in pts if p[0] == k)
            ax.plot([k], [y], marker="*", ms=15, color=c, mec="black", mew=0.8, zorder=5)
            ax.vlines(k, 0, y, colors=c, linestyles=":", lw=1.2)
            j = knees.get(k, 0)
            knees[k] = j + 1
            ax.annotate(f"{k:g}{unit}", (k, 0), xytext=(4, 4 + 13 * j), textcoords="offset points",
                        fontsize=9, color=c, fontweight="bold")  # fmt: skip
    ax.axhline(100 * target, color="0.3", ls="--", lw=1, label=f"target {100 * target:g}%")
    ax.set_xlabel(RATE_AXIS[rate_col])
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3)
    how = f"mean of {seeds} seeds, band min-max" if seeds > 1 else "one seed"
    ax.set_title(f"SLO attainment vs load ({how})")
    _legend_outside(ax, title="configuration")
    return _save(fig, out_base)


# -- goodput ----------------------------------------------------------------------------------
def plot_goodput(goodput_csv: str | Path, out_base: str | Path) -> list[Path]:
    """Goodput (requests/s at the SLO target) per label, bars with the 95% CI
    over seeds, each annotated with its goodput per GPU."""
    rows = _read_csv(goodput_csv)
    if not rows or "goodput_rps_mean" not in rows[0]:
        raise TwinError(f"{goodput_csv}: expected columns label, goodput_rps_mean, ...")
    labels = [r.get("label") or f"row {i + 1}" for i, r in enumerate(rows)]
    means = [_float(r.get("goodput_rps_mean")) or 0.0 for r in rows]
    cis = [_float(r.get("goodput_rps_ci95")) or 0.0 for r in rows]
    colors = label_colors(labels)
    fig = _figure(max(5.0, 1.2 * len(rows) + 2.5), 4.6)
    ax = fig.add_subplot()
    x = range(len(rows))
    ax.bar(x, means, yerr=cis, capsize=5, color=[colors[lab] for lab in labels],
           edgecolor="black", linewidth=0.6, error_kw={"elinewidth": 1.2})  # fmt: skip
    top = max((m + c for m, c in zip(means, cis, strict=True)), default=0.0) or 1.0
    for i, r in enumerate(rows):
        per_gpu, gpus = _float(r.get("goodput_per_gpu")), r.get("gpus")
        text = f"{means[i]:.2f} req/s"
        if per_gpu is not None:
            text += f"\n{per_gpu:.3f} /GPU"
        if gpus:
            text += f" ({gpus} GPUs)"
        ax.annotate(text, (i, means[i] + cis[i]), xytext=(0, 4), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8)  # fmt: skip
    ax.set_ylim(0, top * 1.25)
    ax.set_xticks(list(x), labels, rotation=20 if len(rows) > 3 else 0,
                  ha="right" if len(rows) > 3 else "center")  # fmt: skip
    ax.set_ylabel("goodput (requests/s at the SLO target)")
    ax.set_xlabel("configuration")
    seeds = {r.get("seeds") for r in rows} - {None, ""}
    ax.set_title(
        "Goodput per configuration"
        + (f" (mean ± 95% CI over {seeds.pop()} seeds)" if len(seeds) == 1 else " (± 95% CI)")
    )
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, out_base)


# -- CDFs -------------------------------------------------------------------------------------
def read_latencies(path: str | Path) -> tuple[list[float], list[float]]:
    """(TTFT s, TPOT s) of the completed requests of a ``--requests-csv`` file."""
    rows = _read_csv(path)
    if rows and not {"ttft_s", "tpot_s", "status"} <= rows[0].keys():
        raise TwinError(f"{path}: not a requests CSV (needs ttft_s, tpot_s, status)")
    ttft, tpot = [], []
    for r in rows:
        if r["status"] != "completed":
            continue
        a, b = _float(r["ttft_s"]), _float(r["tpot_s"])
        if a is not None:
            ttft.append(a)
        if b is not None:
            tpot.append(b)
    return sorted(ttft), sorted(tpot)


def _cdf(ax: Axes, xs: list[float], color: str, label: str) -> None:
    n = len(xs)
    ax.step(xs, [(i + 1) / n for i in range(n)], where="post", color=color, lw=1.6, label=label)


def _log_if_wide(ax: Axes, values: list[float]) -> None:
    pos = [v for v in values if v > 0]
    if pos and max(pos) / min(pos) > 50:
        ax.set_xscale("log")


def plot_cdfs(
    request_csvs: Mapping[str, str | Path],
    out_base: str | Path,
    *,
    ttft_slo_s: float | None = None,
    tpot_slo_s: float | None = None,
) -> list[Path]:
    """CDFs of TTFT (s) and TPOT (ms) of completed requests, one line per
    label (``{label: requests CSV}``), with the SLOs as vertical lines when
    given."""
    data = {label: read_latencies(p) for label, p in request_csvs.items()}
    data = {k: v for k, v in data.items() if v[0]}
    if not data:
        raise TwinError("no completed requests in " + ", ".join(map(str, request_csvs.values())))
    colors = label_colors(data)
    fig = _figure(11.5, 4.4)
    ax1, ax2 = fig.subplots(1, 2)
    for label, (ttft, tpot) in data.items():
        _cdf(ax1, ttft, colors[label], label)
        if tpot:
            _cdf(ax2, [v * 1e3 for v in tpot], colors[label], label)
    _log_if_wide(ax1, [v for t, _ in data.values() for v in t])
    _log_if_wide(ax2, [v * 1e3 for _, t in data.values() for v in t])
    if ttft_slo_s is not None:
        ax1.axvline(ttft_slo_s, color="0.3", ls="--", lw=1, label=f"TTFT SLO {ttft_slo_s:g} s")
    if tpot_slo_s is not None:
        ax2.axvline(tpot_slo_s * 1e3, color="0.3", ls="--", lw=1,
                    label=f"TPOT SLO {tpot_slo_s * 1e3:g} ms")  # fmt: skip
    ax1.set_xlabel("time to first token (s)")
    ax2.set_xlabel("time per output token (ms)")
    for ax, what in ((ax1, "TTFT"), (ax2, "TPOT")):
        ax.set_ylabel("share of completed requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.set_title(f"{what} CDF")
    handles, texts = ax2.get_legend_handles_labels()
    for h, t in zip(*ax1.get_legend_handles_labels(), strict=True):
        if t not in texts:
            handles.append(h)
            texts.append(t)
    ax2.legend(handles, texts, loc="upper left", bbox_to_anchor=(1.02, 1.0), title="run")
    return _save(fig, out_base)


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
            doc = json.loads(Path(trace).read_text(encoding="utf-8"))
        except OSError as e:
            raise TwinError(f"{trace}: cannot read: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise TwinError(f"{trace}: not JSON: {e}") from None
        if not isinstance(doc, dict) or "traceEvents" not in doc:
            raise TwinError(f"{trace}: not a Chrome trace (no traceEvents)")
        return doc
    raise TwinError(
        f"a timeline needs iteration durations: pass a TraceRecorder (Simulation(spec, "
        f"trace=...)) or a trace JSON from `twin run --trace-out`, not {type(trace).__name__}"
    )


def _span_color(e: dict[str, Any]) -> str:
    if e.get("cat") == "transfer":
        return SPAN_COLORS["fetch" if str(e["name"]).startswith("fetch") else "kv"]
    return SPAN_COLORS.get(str(e["name"]), "#7f7f7f")


def plot_timeline(
    trace_or_log: TraceRecorder | Mapping[str, Any] | str | Path,
    out_base: str | Path,
    *,
    window_s: tuple[float, float] | None = None,
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
    fig = _figure(12.0, 1.6 + 0.42 * len(rows))
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
    return _save(fig, out_base)


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
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as e:
            raise TwinError(f"{source}: cannot read: {e.strerror}") from None
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


def plot_over_time(source: Mapping[str, Any] | str | Path, out_base: str | Path) -> list[Path]:
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
    fig = _figure(10.0, 8.0 if moved else 6.0)
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
    return _save(fig, out_base)


# -- a sweep folder ---------------------------------------------------------------------------
def _spec_slo(d: Path) -> dict[str, Any]:
    path = d / "spec.yaml"
    if not path.is_file():
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
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


def _cdf_runs(d: Path, rows: list[dict[str, str]], target: float) -> dict[str, Path]:
    """Per label, the requests CSV of the run nearest the label's knee (else
    its lowest rate) that has one, lowest seed first; keys ``label @ rate``."""
    have = {p.stem: p for p in sorted((d / "requests").glob("*.csv"))}
    if not rows:
        return have
    try:
        rate_col, series = attainment_series(rows)
    except TwinError:
        return {r["run_id"]: have[r["run_id"]] for r in rows if r.get("run_id") in have}
    out = {}
    for label, pts in series.items():
        k = knee([p[0] for p in pts], [p[1] for p in pts], target)
        aim = k if k is not None else pts[0][0]
        cands = [
            r for r in rows
            if (r.get("label") or "all") == label and r.get("run_id") in have
            and _float(r.get(rate_col)) is not None
        ]  # fmt: skip
        if not cands:
            continue

        def closeness(r: dict[str, str], aim: float = aim) -> tuple[float, float, float, str]:
            rate = _float(r.get(rate_col)) or 0.0
            return (abs(rate - aim), rate, _float(r.get("seed")) or 0.0, r["run_id"])

        best = min(cands, key=closeness)
        rate = _float(best.get(rate_col)) or 0.0
        out[f"{label} @ {rate:g}{RATE_UNIT[rate_col]}"] = have[best["run_id"]]
    return out


def plot_dir(
    d: str | Path,
    out: str | Path | None = None,
    note: Callable[[str], None] | None = None,
    unproduced: Sequence[str] = (),
) -> list[Path]:
    """Every plot a sweep folder allows, written to ``out`` (default
    ``d/plots``): attainment (runs.csv), goodput (goodput.csv), cdf
    (requests/*.csv), timeline (trace.json or the first traces/*.json).
    What cannot be drawn is skipped with a note (default: to stderr), but for
    the plots named in ``unproduced`` (the command that made the folder did
    not write their inputs: a note would point at nothing to do)."""
    d = Path(d)
    if not d.is_dir():
        raise TwinError(f"{d}: not a folder")
    out = Path(out) if out is not None else d / "plots"
    tell = note or (lambda msg: print(f"twin plot: {msg}", file=sys.stderr))

    def say(plot: str, msg: str) -> None:
        if plot not in unproduced:
            tell(msg)

    slo = _spec_slo(d)
    target = _float(slo.get("target")) or DEFAULT_TARGET
    written: list[Path] = []
    rows = _read_csv(d / "runs.csv") if (d / "runs.csv").is_file() else []
    if rows:
        try:
            written += plot_attainment(d / "runs.csv", out / "attainment", target)
        except TwinError as e:
            say("attainment", f"no attainment plot: {e}")
    else:
        say("attainment", f"no attainment plot: {d / 'runs.csv'} missing or empty")
    if (d / "goodput.csv").is_file():
        written += plot_goodput(d / "goodput.csv", out / "goodput")
    runs = _cdf_runs(d, rows, target)
    if runs:
        swept = rows[0].keys() if rows else set()
        ttft = None if "slo.ttft" in swept else _seconds(slo.get("ttft"))
        tpot = None if "slo.tpot" in swept else _seconds(slo.get("tpot"))
        written += plot_cdfs(runs, out / "cdf", ttft_slo_s=ttft, tpot_slo_s=tpot)
    else:
        say("cdf", f"no CDFs: no per-request data ({d / 'requests'}/<run_id>.csv)")
    traces = [d / "trace.json"] if (d / "trace.json").is_file() else []
    traces += sorted((d / "traces").glob("*.json"))
    if traces:
        written += plot_timeline(traces[0], out / "timeline")
    else:
        say("timeline", f"no timeline: no {d / 'trace.json'} or {d / 'traces'}/<run_id>.json")
    return written


# -- KV tiers ---------------------------------------------------------------------------------
def plot_kv_tiers(compare_json: str | Path, out_base: str | Path) -> list[Path]:
    """Two panels of a compare run's ``--json`` file, one bar per variant:
    the share of prompt tokens reused, stacked by where they came from (HBM
    or a KV pool, host DRAM, SSD), and the SLO attainment."""
    try:
        doc = json.loads(Path(compare_json).read_text(encoding="utf-8"))
    except OSError as e:
        raise TwinError(f"{compare_json}: cannot read: {e.strerror}") from None
    except ValueError as e:
        raise TwinError(f"{compare_json}: not JSON: {e}") from None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, dict) or not runs:
        raise TwinError(f"{compare_json}: not the --json file of a compare spec (no runs)")
    labels = list(runs)
    shares: dict[str, list[float]] = {"HBM or pool": [], "DRAM": [], "SSD": []}
    attainment = []
    for label in labels:
        s = runs[label]["summary"]
        tiers = s.get("kv_tiers", {})
        dram = tiers.get("dram", {}).get("hit_rate") or 0.0
        ssd = tiers.get("ssd", {}).get("hit_rate") or 0.0
        shares["DRAM"].append(100 * dram)
        shares["SSD"].append(100 * ssd)
        shares["HBM or pool"].append(100 * max(0.0, (s.get("prefix_hit_rate") or 0.0) - dram - ssd))
        attainment.append(100 * (s.get("slo_attainment") or 0.0))
    fig = _figure(max(6.0, 0.9 * len(labels) + 3.0), 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True)
    xs = list(range(len(labels)))
    base = [0.0] * len(labels)
    for (name, values), color in zip(shares.items(), PALETTE, strict=False):
        top.bar(xs, values, bottom=base, color=color, label=name)
        base = [b + v for b, v in zip(base, values, strict=True)]
    top.set_ylabel("prompt tokens reused (%)")
    _legend_outside(top)
    bottom.bar(xs, attainment, color=PALETTE[0])
    bottom.set_ylabel("SLO attainment (%)")
    bottom.set_xticks(xs, labels, rotation=30, ha="right")
    return _save(fig, out_base)
