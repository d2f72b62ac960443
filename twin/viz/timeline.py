"""One run's iterations per instance and its KV transfers per instance pair
(:func:`plot_timeline`), from a :class:`~twin.sim.trace.TraceRecorder` or a
trace JSON of ``twin run --trace-out``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin._io import read_text
from twin.errors import TwinError
from twin.viz.canvas import _figure, save
from twin.viz.style import PlotOptions

if TYPE_CHECKING:
    from twin.sim.trace import TraceRecorder


SPAN_COLORS = {
    "prefill": "#1f77b4",
    "decode": "#2ca02c",
    "mixed": "#ff7f0e",
    "kv": "#9467bd",
    "fetch": "#8c564b",
}


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


def plot_timeline(  # noqa: C901
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
