"""One run over time (:func:`plot_over_time`): SLO attainment and capacity
(instances up per role, GPUs up), and its KV hand-off time when it moved KV,
per window of simulated time, its failures, repairs and degradations marked."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin._io import read_text
from twin.errors import TwinError
from twin.viz.canvas import _figure, _float, _legend_outside, save
from twin.viz.cdf import _seconds
from twin.viz.style import PALETTE, PlotOptions

if TYPE_CHECKING:
    from matplotlib.axes import Axes


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
