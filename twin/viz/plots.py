"""Plots of sweeps and runs, each written as PNG, SVG and PDF
(``out_base.png``, ``out_base.svg``, ``out_base.pdf``), a module per figure family:

- :mod:`twin.viz.attainment`: SLO attainment against the arrival rate, a line per
  configuration (mean over seeds, min-max band), the target line and each
  configuration's knee marked;
- :mod:`twin.viz.goodput`: goodput per configuration, horizontal bars with the
  95% CI;
- :mod:`twin.viz.cdf`: TTFT and TPOT CDFs of single runs (per-request CSVs);
  of a sweep folder, one run per configuration at one common rate;
- :mod:`twin.viz.timeline`: one run's iterations per instance and its KV
  transfers per instance pair (from a :class:`~twin.sim.trace.TraceRecorder` or
  a trace JSON of ``twin run --trace-out``);
- :mod:`twin.viz.overtime`: one run's SLO attainment and capacity (instances up
  per role, GPUs up), and its KV hand-off time when it moved KV, per window of
  simulated time, its failures, repairs and degradations marked (from ``twin
  run --json``, whose ``fault_log`` or spec ``events:`` it reads, or
  ``--timeline-csv``);
- :mod:`twin.viz.kvtiers`: where a compare run's reused prompt tokens came from,
  per KV tier, and each tier's occupancy;
- :mod:`twin.viz.canvas`: what they share (sizes, panels, titles, saving);
- this module: :func:`sweep_figures` and :func:`plot_dir`, every plot a sweep
  folder allows.

The sweep plots take :class:`~twin.viz.style.PlotOptions` (panels per value
of a swept key, color by another, size, dpi, key names, the CDFs' rate) and
name configurations by the keys that vary only (:class:`~twin.viz.style.Styler`);
each ``*_figure`` function returns the figure unsaved, for the layout tests.

The sweep folder: ``runs.csv`` (``run_id``, swept keys by dotted path,
``label``, flattened summary metrics, ``gpus``), optional ``goodput.csv``,
``spec.yaml``, ``requests/<run_id>.csv`` and ``trace.json`` or
``traces/<run_id>.json``.

Only the command line and notebooks import these modules; the core never does.
Figures are made with :class:`matplotlib.figure.Figure` and saved through the
Agg canvas, so no display is needed and pyplot's global state is untouched.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin._io import read_text
from twin.errors import TwinError
from twin.viz.attainment import attainment_figure
from twin.viz.canvas import DEFAULT_TARGET, _float, _read_csv, save
from twin.viz.cdf import sweep_cdf_figure
from twin.viz.goodput import goodput_figure
from twin.viz.style import PlotOptions
from twin.viz.timeline import plot_timeline

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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
