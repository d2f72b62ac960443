"""``twin sweep`` and ``twin goodput``: a spec's ``sweep:`` section run into a
folder, and plotted there."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from twin.cli._common import make_executor, parallel_args
from twin.cli.plot import add_plot_options, plot_options
from twin.errors import TwinError


def _sweep_input(args: argparse.Namespace) -> tuple[dict[str, Any], str, Path, Any, Path]:
    """The spec (--set applied), its name and folder, the executor and --out."""
    from twin.sim.spec import parse_yaml, read_spec_text
    from twin.studies.sweep import apply_sweep_overrides

    text, where, base_dir = read_spec_text(args.spec)
    data = parse_yaml(text, where)
    apply_sweep_overrides(data, args.set or [])
    executor = make_executor(args)
    out = Path(args.out) if args.out else Path("out") / str(data.get("name", Path(where).stem))
    return data, where, base_dir, executor, out


def cmd_sweep(args: argparse.Namespace) -> int:
    from twin.studies.sweep import run_sweep

    data, where, base_dir, executor, out = _sweep_input(args)
    if "sweep" not in data:
        raise TwinError(f"{where}: sweep: missing; twin sweep runs a spec with a sweep: section")
    done = run_sweep(
        data, where, base_dir, out, executor=executor, requests=args.requests,
        traces=args.traces,
    )  # fmt: skip
    print(
        f"{len(done.runs)} runs ({done.ran} run, {done.skipped} already done): {out / 'runs.csv'}"
    )
    for note in done.notes:
        print(f"twin: {note}", file=sys.stderr)
    plot_after(args, out, () if args.traces else ("timeline",))
    return 0


def plot_after(args: argparse.Namespace, out: Any, unproduced: Sequence[str] = ()) -> None:
    """Plots of a sweep or goodput folder, unless --no-plots; ``unproduced``:
    plots whose inputs the command did not write (skipped without a note)."""
    if getattr(args, "no_plots", False):
        return
    from twin.viz.plots import plot_dir

    say = lambda msg: print(f"twin: {msg}", file=sys.stderr)  # noqa: E731
    for path in plot_dir(out, note=say, opts=plot_options(args), unproduced=unproduced):
        print(path)


def cmd_goodput(args: argparse.Namespace) -> int:
    from twin.studies.goodput import goodput

    data, where, base_dir, executor, out = _sweep_input(args)
    if args.rel_tol is not None and not 0 < args.rel_tol < 1:
        raise TwinError(f"--rel-tol: {args.rel_tol} must be in (0, 1)")
    if args.target is not None and not 0 < args.target <= 1:
        raise TwinError(f"--target: {args.target} must be in (0, 1]")
    result = goodput(
        data, where, base_dir, rate_key=args.rate_key, seeds=args.seeds, target=args.target,
        rel_tol=args.rel_tol or 0.05, executor=executor, sample=args.sample, out=out,
    )  # fmt: skip
    if result.reused:
        print(f"twin: {result.reused} of {result.probes} runs read from {out / 'probes'}",
              file=sys.stderr)  # fmt: skip
    try:
        out.mkdir(parents=True, exist_ok=True)
        result.write_csv(out / "goodput.csv")
    except OSError as e:
        raise TwinError(f"{out}: cannot write: {e.strerror}") from None
    print(result.format_table())
    plot_after(args, out, ("attainment", "cdf", "timeline"))  # it writes goodput.csv only
    print(f"written: {out / 'goodput.csv'}")
    return 0


def _executor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="spec path or bundled name")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY.PATH=VALUE",
        help="override a value; sweep.KEY=[...] replaces a swept key's values",
    )
    parallel_args(p, "runs")
    p.add_argument("--out", metavar="DIR", help="output folder (default: out/NAME)")


def add_sweep_parsers(sub: Any) -> None:
    """``twin sweep`` and ``twin goodput``."""
    sw = sub.add_parser("sweep", help="run every combination of a spec's sweep: section")
    _executor_args(sw)
    sw.add_argument("--no-plots", action="store_true", help="do not plot the folder afterwards")
    sw.add_argument(
        "--requests", action="store_true", help="keep per-request rows (DIR/requests/) for CDFs"
    )
    sw.add_argument(
        "--traces", action="store_true",
        help="write each run's Chrome/Perfetto trace to DIR/traces/<run_id>.json",
    )  # fmt: skip
    add_plot_options(sw)
    sw.set_defaults(func=cmd_sweep)

    gp = sub.add_parser("goodput", help="the largest rate meeting the SLO target, per config")
    _executor_args(gp)
    gp.add_argument("--seeds", type=int, metavar="K", help="seeds per configuration (default 3)")
    gp.add_argument(
        "--rate-key", choices=["workload.rate_scale", "workload.arrival.rate"],
        help="the spec key searched over (default: the one the workload has)",
    )  # fmt: skip
    gp.add_argument("--target", type=float, help="SLO attainment to meet (default slo.target)")
    gp.add_argument("--rel-tol", type=float, help="relative tolerance of the bisection (0.05)")
    gp.add_argument(
        "--sample", type=int, metavar="N", help="requests per run (workload.max_requests)"
    )
    gp.add_argument("--no-plots", action="store_true", help="do not plot the folder afterwards")
    add_plot_options(gp)
    gp.set_defaults(func=cmd_goodput)
