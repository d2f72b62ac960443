"""``twin run``: one experiment, or each entry of a spec's ``compare:`` section."""

from __future__ import annotations

import argparse
import copy
import csv
import math
import sys
from pathlib import Path
from typing import Any

from twin._io import with_label
from twin.cli._common import human, one_stdout, open_out, write_json
from twin.cli.plan import export_options
from twin.errors import TwinError
from twin.sim.summary import format_summary
from twin.units import parse_duration

# The flags of ``twin run`` naming a file written from one run's results.
_RUN_FILES = ("requests_csv", "requests_parquet", "links_csv", "trace_out", "timeline_csv")


def _link_bucket(args: argparse.Namespace) -> float | None:
    if not args.links_csv:
        return None
    try:
        bucket = parse_duration(args.link_bucket)
    except TwinError as e:
        raise TwinError(f"--link-bucket: {e}") from None
    if bucket <= 0:
        raise TwinError(f"--link-bucket: {args.link_bucket!r} must be > 0")
    return bucket


def _run_spec(spec: Any, files: dict[str, str | None], bucket: float | None) -> Any:  # noqa: C901
    """Run ``spec`` and write the files of ``files`` (``_RUN_FILES`` -> path or
    None) from it; the :class:`twin.sim.simulation.Result`. A file is written
    whole or not at all."""
    recorder, trace_out = None, files["trace_out"]
    if trace_out:
        from twin.sim.trace import TraceRecorder

        recorder = TraceRecorder()
    # The simulation's modules load once the spec is known to be good.
    from twin.sim.metrics import request_columns
    from twin.sim.simulation import Simulation

    parquet = None
    if files["requests_parquet"]:
        from twin.sim.frames import RequestParquet

        parquet = RequestParquet(
            files["requests_parquet"], {"pd-twin.spec_sha256": spec.sha256},
            classes=bool(spec.workload.classes), models=bool(spec.models),
        )  # fmt: skip
    csv_file = None
    try:
        csv_file = open_out(files["requests_csv"]) if files["requests_csv"] else None
        sinks: list[Any] = []
        if csv_file is not None:
            columns = request_columns(bool(spec.workload.classes), bool(spec.models))
            writer = csv.DictWriter(csv_file, fieldnames=columns, lineterminator="\n")
            writer.writeheader()
            sinks.append(writer.writerow)
        if parquet is not None:
            sinks.append(parquet.add)
        on_row = sinks[0] if len(sinks) == 1 else None
        if len(sinks) > 1:

            def on_row(row: dict[str, Any]) -> None:
                for sink in sinks:
                    sink(row)

        sim = Simulation(spec, on_row=on_row, link_series_s=bucket, trace=recorder)
        result = sim.run()
    except BaseException:
        if parquet is not None:
            parquet.abort()  # no partial file that reads as whole
        if csv_file is not None:
            csv_file.discard()  # no partial CSV under the name of a finished one
        raise
    if csv_file is not None:
        csv_file.close()
    if parquet is not None:
        parquet.close()
    if recorder is not None and trace_out:
        from twin.sim.trace import write_chrome_trace

        write_chrome_trace(recorder, trace_out)
    if files["timeline_csv"]:
        from twin.sim.timeline import write_timeline_csv

        write_timeline_csv(result.timeline_rows, files["timeline_csv"])
    if files["links_csv"]:
        with open_out(files["links_csv"]) as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["src", "dst", "t_s", "bytes", "utilization"])
            for link in result.link_rows:
                for t, nbytes, util in link.pop("series"):
                    w.writerow([link["src"], link["dst"], t, nbytes, util])
    return result


def cmd_compare(args: argparse.Namespace, data: dict[str, Any], where: str, base_dir: Path) -> int:
    """``twin run`` on a spec with a ``compare:`` section (see twin/studies/compare.py):
    each per-run file flag writes one file per entry, named by its label."""
    from twin.studies.compare import run_compare

    bucket = _link_bucket(args)

    def runner(label: str, spec: Any) -> Any:
        given = {k: getattr(args, k) for k in _RUN_FILES}
        files = {k: v and str(with_label(v, label)) for k, v in given.items()}
        return _run_spec(spec, files, bucket)

    only = [x.strip() for x in args.only.split(",") if x.strip()] if args.only else None
    result = run_compare(
        data, where, base_dir, args.set or [], only=only, quiet=args.quiet, runner=runner
    )
    if args.json:
        write_json(args.json, result.to_dict())
    if not args.quiet:
        print(result.format_table(), file=human(args))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from twin.sim.spec import apply_overrides, parse_yaml, read_spec_text, resolve_spec

    text, where, base_dir = read_spec_text(args.spec)
    data = parse_yaml(text, where)
    if args.window is not None:
        # the same as --set output.window=..., so the header records it
        try:
            window = parse_duration(args.window)
        except TwinError as e:
            raise TwinError(f"--window: {e}") from None
        if not 0 < window < math.inf:
            raise TwinError(f"--window: {args.window!r} must be > 0")
        args.set = [*(args.set or []), f"output.window={args.window}"]
    overridden = copy.deepcopy(data)
    apply_overrides(overridden, args.set or [])
    if "compare" in overridden:  # (--set compare=null runs the base alone)
        if args.export_dynamo or args.export_llm_d:
            raise TwinError(f"--export-*: exports one run's deployment; {where} has compare:")
        return cmd_compare(args, data, where, base_dir)
    if args.only:
        raise TwinError(f"--only: picks entries of a compare spec; {where} has no compare:")
    spec = resolve_spec(overridden, where, base_dir)
    one_stdout(args, "run")
    if args.export_dynamo or args.export_llm_d:  # before the run: every model split
        from twin.studies.export import split_groups

        for model in [p.name for p in spec.models] or [""]:
            split_groups(spec, model)
    bucket = _link_bucket(args)
    result = _run_spec(spec, {k: getattr(args, k) for k in _RUN_FILES}, bucket).to_dict()
    if args.export_dynamo or args.export_llm_d:  # the spec's deployment, as it ran
        from twin.studies.export import from_run, write_exports

        write_exports(from_run(spec, result["summary"]), args.export_dynamo, args.export_llm_d)
    if args.json:
        write_json(args.json, result)
    if not args.quiet:
        print(format_summary(result), file=human(args))
    if args.quiet or human(args) is not sys.stderr:  # else the summary above said it there
        for w in result["summary"].get("warnings", ()):
            print(f"twin: warning: {w}", file=sys.stderr)
    return 0


def add_run_parser(sub: Any) -> None:
    """``twin run``."""
    r = sub.add_parser("run", help="run one experiment and print its summary")
    r.add_argument(
        "spec",
        nargs="?",
        default="quickstart",
        help="spec path or bundled name (default: quickstart)",
    )
    r.add_argument(
        "--set",
        action="append",
        metavar="KEY.PATH=VALUE",
        help="override a spec value (repeatable)",
    )
    r.add_argument(
        "--json", metavar="PATH|-",
        help="write header + summary as JSON (- : to stdout, the summary to stderr)",
    )  # fmt: skip
    r.add_argument(
        "--only",
        metavar="LABEL[,LABEL...]",
        help="run only these entries of a spec's compare: section",
    )
    r.add_argument("--requests-csv", metavar="PATH", help="write one row per request")
    r.add_argument(
        "--requests-parquet", metavar="PATH",
        help="write one typed row per request as Parquet (needs pd-twin[data])",
    )  # fmt: skip
    r.add_argument(
        "--links-csv", metavar="PATH", help="write each link's bytes and utilization over time"
    )
    r.add_argument(
        "--link-bucket", default="1 s", metavar="DURATION", help="time bucket of --links-csv"
    )
    r.add_argument(
        "--trace-out",
        metavar="FILE",
        help="write a Chrome/Perfetto trace (iterations and KV transfers) to FILE",
    )
    r.add_argument(
        "--window",
        metavar="DURATION",
        help="width of the timeline's windows (output.window; default 10 s)",
    )
    r.add_argument(
        "--timeline-csv",
        metavar="PATH",
        help="write one row of metrics per window of simulated time",
    )
    export_options(r, "the spec's split deployment (a document per model, figures from this run)")
    r.add_argument("-q", "--quiet", action="store_true", help="print nothing")
    r.set_defaults(func=cmd_run)
