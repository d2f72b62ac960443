"""``twin plot`` and ``twin report``, and the plot options other commands share."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from twin.errors import TwinError


def cmd_plot(args: argparse.Namespace) -> int:  # noqa: C901
    from twin.viz.cdf import plot_cdfs
    from twin.viz.kvtiers import plot_kv_tiers
    from twin.viz.plots import plot_dir
    from twin.viz.timeline import plot_timeline

    if args.compare:
        from twin.viz.compare import plot_compare, reuses_prompts
        from twin.viz.kvtiers import _compare_runs, plot_kv_tier_occupancy

        out = Path(args.out) if args.out else Path(".")
        stem = Path(args.compare).stem
        drawn = plot_compare(args.compare, out / f"{stem}-compare")
        if reuses_prompts(_compare_runs(args.compare)):
            drawn += plot_kv_tiers(args.compare, out / f"{stem}-kv-tiers")
        else:
            print(f"twin plot: {args.compare}: no run reused prompt tokens: no kv-tiers figure",
                  file=sys.stderr)  # fmt: skip
        drawn += plot_kv_tier_occupancy(args.compare, out / f"{stem}-kv-occupancy")
        for path in drawn:
            print(path)
        if args.dir is None and not args.requests and not args.trace and not args.timeline:
            return 0
    if args.dir is None and not args.requests and not args.trace and not args.timeline:
        raise TwinError(
            "twin plot: give a sweep folder, --requests CSV ..., --trace FILE or --timeline FILE"
        )
    if args.window and not args.trace:
        raise TwinError("twin plot: --window: applies to --trace")
    out = Path(args.out) if args.out else (Path(args.dir) / "plots" if args.dir else Path("."))
    opts = plot_options(args)
    if args.dir is None and (args.facet or args.hue or args.at_rate is not None):
        raise TwinError("twin plot: --facet, --hue and --at-rate apply to a sweep folder")
    written: list[Path] = []
    if args.dir is not None:
        notes: list[str] = []
        from_dir = plot_dir(args.dir, out, note=notes.append, opts=opts)
        if not from_dir:  # nothing drawn is an error, not a note
            raise TwinError(f"twin plot: {args.dir}: nothing to plot: {'; '.join(notes)}")
        for msg in notes:
            print(f"twin plot: {msg}", file=sys.stderr)
        written += from_dir
    if args.requests:
        runs: dict[str, str] = {}
        for path in args.requests:
            label = Path(path).stem
            while label in runs:
                label += "'"
            runs[label] = path
        written += plot_cdfs(
            runs, out / "requests-cdf", opts=plot_options(args, sweep=False),
            by_class=args.by_class, by_model=args.by_model,
        )  # fmt: skip
    elif args.by_class or args.by_model:
        flag = "--by-class" if args.by_class else "--by-model"
        raise TwinError(f"twin plot: {flag}: applies to --requests")
    if args.window and not args.trace:
        raise TwinError("twin plot: --window: applies to --trace")
    if args.trace:
        window = _trace_window(args.window) if args.window else None
        stem = Path(args.trace).stem
        written += plot_timeline(
            args.trace, out / f"{stem}-timeline", window_s=window, opts=plot_options(args, False)
        )
    if args.timeline:  # a run's file, or each entry's of a compare file
        from twin.viz.compare import plot_entries_over_time

        written += plot_entries_over_time(args.timeline, out, plot_options(args, False))
    for path in written:
        print(path)
    return 0


def _trace_window(text: str) -> tuple[float, float]:
    """``--window START,END`` (seconds) of ``twin plot --trace``."""
    try:
        a, b = (float(x) for x in text.split(","))
    except ValueError:
        a = b = math.nan
    if not 0 <= a < b < math.inf:
        raise TwinError(
            f"twin plot: --window: {text!r}; expected START,END seconds, 0 <= START < END"
        )
    return a, b


def add_plot_options(p: argparse.ArgumentParser) -> None:
    """The sweep plots' options (twin plot, sweep, goodput, report)."""
    g = p.add_argument_group("plots")
    g.add_argument("--facet", metavar="KEY", help="one panel per value of this swept key")
    g.add_argument("--hue", metavar="KEY", help="color by this swept key; legend grouped by key")
    g.add_argument("--size", metavar="W,H", help="figure size in inches (default: by content)")
    g.add_argument("--dpi", type=int, default=150, help="PNG resolution (default 150)")
    g.add_argument(
        "--label", action="append", metavar="KEY=TEXT",
        help="call KEY TEXT in labels (empty TEXT: the value alone); repeatable",
    )  # fmt: skip
    g.add_argument(
        "--at-rate", type=float, metavar="R",
        help="CDFs of every configuration at the swept rate nearest R (default: the median knee)",
    )  # fmt: skip


def plot_options(args: argparse.Namespace, sweep: bool = True) -> Any:
    """The PlotOptions the flags of add_plot_options ask for."""
    from twin.viz.style import PlotOptions, parse_labels, parse_size

    size = parse_size(args.size) if args.size else None
    labels = parse_labels(args.label)
    if not sweep:
        return PlotOptions(size=size, dpi=args.dpi, labels=labels)
    return PlotOptions(args.facet, args.hue, size, args.dpi, labels, args.at_rate)


def cmd_report(args: argparse.Namespace) -> int:
    from twin.viz.report import write_report

    note = lambda msg: print(f"twin report: {msg}", file=sys.stderr)  # noqa: E731
    print(write_report(args.dir, args.out, plot_options(args), note))
    return 0


def add_report_parser(sub: Any) -> None:
    rp = sub.add_parser(
        "report",
        help="one self-contained HTML page of a sweep folder: plots, sortable tables, hashes",
    )
    rp.add_argument("dir", help="a sweep or goodput folder (runs.csv, goodput.csv, spec.yaml)")
    rp.add_argument("--out", metavar="FILE", help="where to write (default: DIR/report.html)")
    add_plot_options(rp)
    rp.set_defaults(func=cmd_report)


def add_plot_parser(sub: Any) -> None:
    """``twin plot``."""
    pt = sub.add_parser(
        "plot",
        help="plot a sweep folder, per-request CSVs, a trace or a run's timeline; PNG, SVG, PDF",
    )
    pt.add_argument("dir", nargs="?", help="a sweep folder (runs.csv, goodput.csv, requests/)")
    pt.add_argument(
        "--requests", nargs="+", metavar="CSV", help="TTFT/TPOT CDFs of these --requests-csv files"
    )
    pt.add_argument(
        "--by-class", action="store_true",
        help="--requests: a line per class of traffic of each file (its class column)",
    )  # fmt: skip
    pt.add_argument(
        "--by-model", action="store_true",
        help="--requests: a line per model of each file (its model column; models:)",
    )  # fmt: skip
    pt.add_argument("--trace", metavar="FILE", help="a timeline of this --trace-out file")
    pt.add_argument(
        "--window", metavar="START,END", help="the --trace timeline from START to END seconds"
    )
    pt.add_argument(
        "--timeline",
        metavar="FILE",
        help="attainment and capacity over time of a `twin run --json` or --timeline-csv file "
        "(of a compare run's --json file, one figure per entry)",
    )
    pt.add_argument(
        "--compare",
        metavar="FILE",
        help="SLO attainment, TTFT and TPOT per entry of a compare run's --json file, and "
        "prompt tokens reused per KV tier when a run reused any",
    )
    pt.add_argument("--out", metavar="DIR", help="where to write (default: DIR/plots, else .)")
    add_plot_options(pt)
    pt.set_defaults(func=cmd_plot)
