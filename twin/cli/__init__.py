"""The ``twin`` command line.

Every error a user can cause is printed on one line, ``twin: error: ...``,
with exit status 2 and no traceback.

One module per command group, each with its ``cmd_*`` functions and the
parsers of its commands: :mod:`twin.cli.run` (run, compare),
:mod:`twin.cli.describe` (kv, handoff, spec, schedulers, topo, the catalogs),
:mod:`twin.cli.validate` (validate, calibrate, profile), :mod:`twin.cli.plan`
(provision, plan), :mod:`twin.cli.sweep` (sweep, goodput),
:mod:`twin.cli.plot` (plot, report), :mod:`twin.cli.bench`; what they share is
in :mod:`twin.cli._common`, each command's ``--help`` examples in
:mod:`twin.cli.examples`. The modules import the simulation only inside their
commands, so that ``twin --help`` starts lean."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from twin._threads import one_blas_thread
from twin.cli import bench, describe, plan, plot, run, sweep, validate
from twin.cli._common import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Parser,
    VersionAction,
    check_command_outputs,
)
from twin.cli.examples import EXAMPLES
from twin.errors import TwinError

__all__ = ["EXAMPLES", "EXIT_INTERRUPTED", "EXIT_USAGE", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command, in the order ``twin --help`` lists them."""
    p = Parser(prog="twin", description="pd-twin: a digital twin of an LLM serving cluster")
    p.add_argument("--version", action=VersionAction, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run.add_run_parser(sub)
    describe.add_kv_parser(sub)
    validate.add_validate_parser(sub)
    describe.add_handoff_parser(sub)
    plan.add_plan_parsers(sub)
    sweep.add_sweep_parsers(sub)
    describe.add_spec_parsers(sub)
    plot.add_plot_parser(sub)
    plot.add_report_parser(sub)
    bench.add_bench_parser(sub)
    describe.add_catalog_parsers(sub)
    validate.add_profile_parser(sub)
    validate.add_calibrate_parser(sub)
    helps = {a.dest: str(a.help or "") for a in sub._choices_actions}
    for name, sp in sub.choices.items():
        if sp.description is None and helps.get(name):
            sp.description = f"{helps[name][:1].upper()}{helps[name][1:]}."
        if name in EXAMPLES:
            sp.epilog = "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[name])
            sp.formatter_class = argparse.RawDescriptionHelpFormatter
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command: 0 done, 2 bad input (one ``twin: error:`` line),
    130 interrupted (Ctrl-C: one ``twin: interrupted`` line)."""
    one_blas_thread()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        check_command_outputs(args)
        return int(args.func(args))
    except TwinError as e:
        msg = " ".join(str(e).split("\n"))
        print(f"twin: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("twin: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
