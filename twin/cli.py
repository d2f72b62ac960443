"""The ``twin`` command line.

Every error a user can cause is printed on one line, ``twin: error: ...``,
with exit status 2 and no traceback."""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from twin import _version
from twin._io import AtomicFile, check_outputs, with_label
from twin._threads import one_blas_thread
from twin.errors import TwinError
from twin.sim.summary import format_summary
from twin.units import format_bytes, parse_duration

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command ended by Ctrl-C


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line, ``twin: error: ...``, like every other."""

    def error(self, message: str) -> Any:
        where = self.prog.removeprefix("twin").strip()
        hint = f" (see twin {where + ' ' if where else ''}--help)"
        print(f"twin: error: {where + ': ' if where else ''}{message}{hint}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _open_out(path: str) -> AtomicFile:
    """An output file, written under a temporary name and renamed by close()."""
    return AtomicFile(path)


def _write_json(path: str, doc: dict[str, Any]) -> None:
    """``doc`` as JSON to ``path``, or to stdout for ``-``."""
    if path == "-":
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return
    with _open_out(path) as f:
        json.dump(doc, f, indent=2, default=str)
        f.write("\n")


# The flags naming a file a command writes (each command has some of them).
_OUTPUT_FILES = (
    ("json", "--json"), ("requests_csv", "--requests-csv"),
    ("requests_parquet", "--requests-parquet"), ("links_csv", "--links-csv"),
    ("trace_out", "--trace-out"), ("timeline_csv", "--timeline-csv"),
    ("export_dynamo", "--export-dynamo"), ("export_llm_d", "--export-llm-d"), ("png", "--png"),
)  # fmt: skip
# --out names a folder for these commands, a file for the others (report, profile).
_OUT_FOLDER = frozenset({"sweep", "goodput", "plot"})
# The arguments naming files a command reads: an output may not overwrite one.
_INPUTS = (
    ("spec", "SPEC"), ("against", "--against"), ("profile", "--profile"),
    ("requests", "--requests"), ("trace", "--trace"), ("timeline", "--timeline"),
    ("compare", "--compare"), ("topology", "NAME|PATH"), ("model", "MODEL"),
    ("model_opt", "--model"), ("workload", "--workload"),
)  # fmt: skip


def _check_outputs(args: argparse.Namespace) -> None:
    """Every output path of the command, checked before it runs (see
    :func:`twin._io.check_outputs`): one line naming the flag, not a
    traceback or an error after the work."""
    files = [(flag, getattr(args, dest, None)) for dest, flag in _OUTPUT_FILES]
    files = [(flag, v) for flag, v in files if isinstance(v, str)]  # validate: --json is a switch
    folders: list[tuple[str, str | None]] = []
    out = getattr(args, "out", None)
    if isinstance(out, str):
        (folders if args.command in _OUT_FOLDER else files).append(("--out", out))
    inputs: list[tuple[str, str]] = []
    for dest, what in _INPUTS:
        value = getattr(args, dest, None)
        for path in value if isinstance(value, list) else [value]:
            if isinstance(path, str) and Path(path).is_file():
                inputs.append((what, path))
    check_outputs(files, folders, inputs)


def _json_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--json", metavar="PATH|-",
        help=f"write {what} as JSON to PATH (- : to stdout, the text to stderr)",
    )  # fmt: skip


def _human(args: argparse.Namespace) -> IO[str]:
    """Where the readable output goes: stderr when ``--json -`` holds stdout."""
    return sys.stderr if getattr(args, "json", None) == "-" else sys.stdout


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


def _run_spec(spec: Any, files: dict[str, str | None], bucket: float | None) -> Any:
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
            classes=bool(spec.workload.classes),
        )  # fmt: skip
    csv_file = None
    try:
        csv_file = _open_out(files["requests_csv"]) if files["requests_csv"] else None
        sinks: list[Any] = []
        if csv_file is not None:
            columns = request_columns(bool(spec.workload.classes))
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
        with _open_out(files["links_csv"]) as f:
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
        _write_json(args.json, result.to_dict())
    if not args.quiet:
        print(result.format_table(), file=_human(args))
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
        return cmd_compare(args, data, where, base_dir)
    if args.only:
        raise TwinError(f"--only: picks entries of a compare spec; {where} has no compare:")
    spec = resolve_spec(overridden, where, base_dir)
    bucket = _link_bucket(args)
    result = _run_spec(spec, {k: getattr(args, k) for k in _RUN_FILES}, bucket).to_dict()
    if args.json:
        _write_json(args.json, result)
    if not args.quiet:
        print(format_summary(result), file=_human(args))
    if args.quiet or _human(args) is not sys.stderr:  # else the summary above said it there
        for w in result["summary"].get("warnings", ()):
            print(f"twin: warning: {w}", file=sys.stderr)
    return 0


def cmd_kv(args: argparse.Namespace) -> int:
    from twin.perf.kvreport import kv_facts, kv_report
    from twin.perf.llm import dtype_bytes, model_from_arg

    model = model_from_arg(_model_arg(args, "kv"), where="twin kv: MODEL")
    nbytes = dtype_bytes(args.dtype) if args.dtype else None
    if args.tokens < 0:
        raise TwinError(f"twin kv: --tokens: {args.tokens} must be >= 0")
    if args.block_size <= 0:
        raise TwinError(f"twin kv: --block-size: {args.block_size} must be > 0")
    if args.json:
        _write_json(args.json, kv_facts(model, args.tokens, args.block_size, nbytes))
    print(kv_report(model, args.tokens, args.block_size, nbytes), file=_human(args))
    return 0


def _model_arg(args: argparse.Namespace, cmd: str) -> str:
    """MODEL, given as the positional argument or as --model (one of them)."""
    if args.model is not None and args.model_opt is not None:
        raise TwinError(f"twin {cmd}: give the model once: MODEL or --model, not both")
    value = args.model if args.model is not None else args.model_opt
    if value is None:
        raise TwinError(f"twin {cmd}: MODEL: missing; a catalog name, a YAML file or a mapping")
    return str(value)


def _model_args(p: argparse.ArgumentParser) -> None:
    what = "catalog name or alias (twin models), a YAML file or an inline {name: ..., layers: ...}"
    p.add_argument("model", nargs="?", metavar="MODEL", help=f"the model: {what}")
    p.add_argument(
        "--model", dest="model_opt", metavar="MODEL", help="the model, as MODEL (either form)"
    )


def _add_validate_workload_args(v: argparse.ArgumentParser) -> None:
    # Defaults: twin.studies.fidelity (DEFAULT_REQUESTS, DEFAULT_RATE), not imported here
    # so that the CLI starts lean.
    v.add_argument(
        "--workload", metavar="TRACE|NAME",
        help="perf: also weight each source's errors by the iterations this workload forms "
        "(azure-conv, azure-code, mooncake, or a trace file)",
    )  # fmt: skip
    v.add_argument(
        "--requests", type=int,
        help="perf --workload: requests simulated per source (default 200)",
    )  # fmt: skip
    v.add_argument(
        "--rate", type=float,
        help="perf --workload: arrivals per second for a length table (default 1.0)",
    )  # fmt: skip


def cmd_validate(args: argparse.Namespace) -> int:
    if args.what == "runs":
        return cmd_validate_runs(args)
    if args.what == "run" and args.against is None and _measured_run(args.spec):
        return cmd_validate_real_run(args)
    if args.what == "run":
        return cmd_validate_run(args)
    if args.what == "replay":
        return cmd_validate_replay(args)
    if args.spec is not None or args.against is not None:
        raise TwinError("twin validate perf: takes no SPEC nor --against (those are for run)")
    from twin.perf.validate import (
        find_data_dir,
        format_validation,
        iteration_sources,
        validate_perf,
    )

    data = find_data_dir(args.data)
    weighted = None
    if args.workload is not None:
        from twin.studies.fidelity import format_weighted, validate_weighted

        rows = validate_weighted(data, args.workload, args.requests, args.rate)
        weighted = format_weighted(rows, args.workload)
    print("in sample (the calibrated defaults, fitted on every source)")
    print(format_validation(validate_perf(data)))
    if weighted is not None:
        print()
        print(weighted)
    if args.held_out:
        from twin._progress import Progress
        from twin.perf.calibrate import held_out_table

        sources = iteration_sources(data)
        with _executor(args) as ex, Progress(len(sources), "sources", desc="held out") as bar:
            table = held_out_table(sources, on_source=bar.update, run=ex.run)
        print()
        print(table)
    return 0


def cmd_validate_replay(args: argparse.Namespace) -> int:
    from twin.studies.replay import format_replay, validate_replay

    if args.spec is None or args.against is not None:
        raise TwinError("twin validate replay: needs SPEC and takes no --against")
    c = validate_replay(args.spec, args.set or ())
    print(json.dumps(c.to_dict(), indent=2, sort_keys=True) if args.json else format_replay(c))
    return 0


def _measured_run(path: str | None) -> bool:
    """Whether ``path`` names a measured run (a folder, DIR/KEY of a folder with a
    manifest.csv, a vllm bench serve result) rather than a spec."""
    if path is None:
        return False
    from twin.studies.benchrun import bench_file

    p = Path(path)
    return p.is_dir() or (p.parent / "manifest.csv").is_file() or bench_file(p) is not None


def cmd_validate_real_run(args: argparse.Namespace) -> int:
    from twin.studies.runs import read_run
    from twin.studies.validate_realrun import format_run, replay

    run = read_run(args.spec, gpu=args.gpu)
    r = replay(run, stage_requests=args.stage_requests, overrides=args.set or ())
    print(json.dumps(r.to_dict(), indent=2) if args.json else format_run(r))
    return 0


def cmd_validate_runs(args: argparse.Namespace) -> int:
    import dataclasses

    from twin._io import check_outputs
    from twin.perf.residuals import loo_coverage
    from twin.studies.runresiduals import format_coverage, read_scored, table_of, write_table
    from twin.studies.validate_realrun import format_summary, summarize

    if args.spec is None or args.against is not None:
        raise TwinError("twin validate runs: needs DIR (a folder of measured runs), no --against")
    if not 0 < args.coverage < 1:
        raise TwinError(f"--coverage: {args.coverage}; expected a number between 0 and 1")
    if args.residuals is not None:
        check_outputs([("--residuals", args.residuals)])
    if Path(args.spec).is_file():  # a --json output read back: no replay
        scored: list[Any] = [
            r for r in read_scored(args.spec) if args.all or not r.get("overloaded")
        ]
        table = table_of(scored, f"twin validate runs {args.spec}", args.coverage)
        rows, text = [], f"{len(scored)} runs read from {args.spec}"
    else:
        results, left_out = _replay_runs(args)
        scored = results
        table = table_of(results, f"twin validate runs {args.spec}", args.coverage)
        rows = summarize(results, include_overloaded=args.all)
        text = format_summary(rows, len(results), left_out)
    cover = loo_coverage(table)
    if args.residuals is not None:
        write_table(table, args.residuals)
    if args.json:
        doc = {"runs": [r if isinstance(r, dict) else r.to_dict() for r in scored],
               "summary": [dataclasses.asdict(r) for r in rows],
               "coverage": {"level": args.coverage,
                            "metrics": [dataclasses.asdict(c) for c in cover]}}  # fmt: skip
        print(json.dumps(doc, indent=2))
        return 0
    print(text)
    print()
    print(format_coverage(cover, table))
    return 0


def _replay_runs(args: argparse.Namespace) -> tuple[list[Any], int]:
    """The runs of ``args.spec`` replayed (overloaded ones only with ``--all``),
    and how many were left out."""
    from twin._progress import Progress
    from twin.studies.runs import read_runs
    from twin.studies.validate_realrun import replay

    runs = read_runs(args.spec, gpu=args.gpu)
    left_out = 0 if args.all else sum(r.overloaded for r in runs)
    runs = [r for r in runs if args.all or not r.overloaded]
    results = []
    with Progress(len(runs), "runs", desc="replay") as bar:
        for run in runs:
            results.append(
                replay(run, stage_requests=args.stage_requests, overrides=args.set or ())
            )
            bar.update()
    return results, left_out


def cmd_validate_run(args: argparse.Namespace) -> int:
    from twin.studies.validate_run import format_comparison, validate_run

    if args.spec is None or args.against is None:
        raise TwinError("twin validate run: needs SPEC and --against RESULTS")
    c = validate_run(args.spec, args.against, overrides=args.set or (), format=args.format)
    print(json.dumps(c.to_dict(), indent=2) if args.json else format_comparison(c))
    return 0


def cmd_handoff(args: argparse.Namespace) -> int:
    import dataclasses

    from twin._check import duration
    from twin.net.topology import load_topology
    from twin.perf.llm import model_from_arg
    from twin.serving.handoff import TransferConfig
    from twin.studies.handoff import handoff_estimate

    model = model_from_arg(_model_arg(args, "handoff"), where="twin handoff: MODEL")
    if args.tokens < 1:
        raise TwinError(f"twin handoff: --tokens: {args.tokens} must be a positive integer")
    problem = model.tp_problem(args.tp) if args.tp >= 1 else f"{args.tp} must be positive"
    if problem:
        raise TwinError(f"twin handoff: --tp: {problem}")
    where = "twin handoff: --topology"
    topo = load_topology(args.topology, nodes=args.nodes, where=where)
    costs: dict[str, Any] = {}
    for flag, field in _HANDOFF_COSTS:
        value = getattr(args, field)
        if value is not None:
            costs[field] = duration(value, f"twin handoff: --{flag}", positive=False)
    if args.block_size <= 0:
        raise TwinError(f"twin handoff: --block-size: {args.block_size} must be > 0")
    if args.descriptors is not None:
        costs["descriptors"] = args.descriptors
    est = handoff_estimate(
        model, args.tokens, topo, tp=args.tp, placement=args.placement, mode=args.mode,
        multi_nic=args.multi_nic, transfer=dataclasses.replace(TransferConfig(), **costs),
        block_size=args.block_size,
    )  # fmt: skip
    if args.json:
        _write_json(args.json, est)
    fx = est["fixed"]
    ms = 1e3
    parts = (
        f"fixed costs: control round trip {fx['control_s'] * ms:.3f} ms, registration "
        f"{fx['registration_s'] * ms:.3f} ms, {fx['descriptors']:,} descriptors x "
        f"{fx['per_descriptor_s'] * 1e6:.3f} us = {fx['descriptors_s'] * ms:.3f} ms, "
        f"router hop {fx['router_s'] * ms:.3f} ms\n"
    )
    if est["mode"] == "layerwise":
        last = (
            f"layer-wise over a {est['prefill_s'] * ms:.3f} ms prefill: bytes' residual "
            f"{est['bytes_s'] * ms:.3f} ms, then {fx['after_s'] * ms:.3f} ms (router hop and "
            f"the descriptors the prefill did not hide): residual {est['transfer_s'] * ms:.3f} ms"
        )
    else:
        last = (
            f"bytes on an idle network: {est['bytes_s'] * ms:.3f} ms\n"
            f"transfer: {fx['before_s'] * ms:.3f} ms fixed + {est['bytes_s'] * ms:.3f} ms bytes "
            f"= {est['transfer_s'] * ms:.3f} ms"
        )
    print(
        f"{est['model']}: {est['tokens']:,} tokens of KV = {est['kv_bytes']:,} B "
        f"({format_bytes(est['kv_bytes'])})\n"
        f"{est['placement']} on {est['topology']}, TP{est['tp']}: {est['flows']} flows\n"
        f"path (shard 0): {' | '.join(est['path']) or '(same GPU)'}\n"
        f"bottleneck: {(est['bottleneck_bytes_s'] or 0) / 1e9:,.3f} GB/s (usable)\n" + parts + last,
        file=_human(args),
    )
    return 0


# twin handoff's flags for the transfer's fixed costs -> TransferConfig fields
_HANDOFF_COSTS = (
    ("control-rtt", "control_rtt_s"),
    ("registration", "registration_s"),
    ("per-descriptor", "per_descriptor_s"),
    ("router-hop", "router_hop_s"),
)


def cmd_provision(args: argparse.Namespace) -> int:
    from twin.sim.spec import apply_overrides, parse_yaml, read_spec_text
    from twin.studies.provision import format_provision, parse_watts, provision

    text, where, base_dir = read_spec_text(args.spec)
    data = parse_yaml(text, where)
    apply_overrides(data, args.set or [])
    _compare_base(data, where, "provision")
    power = None if args.power is None else parse_watts(args.power, "--power")
    if args.gpus is not None:
        from twin._check import MAX_GPUS

        if not 0 < args.gpus <= MAX_GPUS:
            raise TwinError(f"twin provision: --gpus: {args.gpus}; expected 1 to {MAX_GPUS:,}")
    _sample_args(args, "provision")
    executor = _executor(args)

    def one(n: int) -> Any:
        return provision(
            data, where, base_dir, power_w=power, gpus=args.gpus, sample=n,
            replicates=args.replicates, executor=executor,
        )  # fmt: skip

    _export_args_check(args, "provision")
    if args.convergence:
        from twin.studies.samples import convergence_doc, format_convergence

        rows = []
        for n in args.convergence:
            p = one(n)
            b = p.best
            rows.append((n, p.sample, f"{b.prefill}:{b.decode}", b.goodput_rps, b.goodput_ci95))
        if args.json:
            _write_json(args.json, convergence_doc(rows, "best"))
        print(format_convergence(rows, "best P:D"), file=_human(args))
        return 0
    found = one(args.sample)
    if args.json:
        _write_json(args.json, found.to_dict())
    print(format_provision(found), file=_human(args))
    if args.export_dynamo or args.export_llm_d:
        from twin.studies.export import from_provision, write_exports

        dep = from_provision(data, where, base_dir, found)
        for path in write_exports(dep, args.export_dynamo, args.export_llm_d):
            print(f"written: {path}", file=_human(args))
    return 0


def _export_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--export-dynamo", metavar="FILE",
        help="write the chosen deployment as an NVIDIA Dynamo DynamoGraphDeployment (YAML)",
    )  # fmt: skip
    p.add_argument(
        "--export-llm-d", metavar="FILE",
        help="write the chosen deployment as llm-d ModelService Helm values (YAML)",
    )  # fmt: skip


def _export_args_check(args: argparse.Namespace, cmd: str) -> None:
    """Refuse an export with --convergence before the search (the files were
    checked with every output, by _check_outputs)."""
    if (args.export_dynamo or args.export_llm_d) and args.convergence:
        raise TwinError(f"twin {cmd}: --export-*: exports one deployment; not with --convergence")


def _sample_args(args: argparse.Namespace, cmd: str) -> None:
    if args.sample <= 0:
        raise TwinError(f"twin {cmd}: --sample: {args.sample} must be a positive integer")
    if args.replicates <= 0:
        raise TwinError(f"twin {cmd}: --replicates: {args.replicates} must be a positive integer")
    if args.convergence is not None:
        sizes = []
        for part in args.convergence.split(","):
            try:
                n = int(part)
            except ValueError:
                n = 0
            if n < 2:
                raise TwinError(
                    f"twin {cmd}: --convergence: {part.strip()!r} is not a sample size >= 2; "
                    "expected e.g. 250,500,1000,2000"
                )
            sizes.append(n)
        args.convergence = sorted(set(sizes))


def _compare_base(data: dict[str, Any], where: str, cmd: str) -> None:
    """A spec with ``compare:`` is planned as its base: the section is dropped, with a note."""
    if "compare" in data:
        entries = data.pop("compare")
        labels = ", ".join(map(str, entries)) if isinstance(entries, dict) else "..."
        print(
            f"twin: note: {where} has compare: ({labels}); twin {cmd} plans its base, "
            "the spec without it",
            file=sys.stderr,
        )


def cmd_plan(args: argparse.Namespace) -> int:
    import yaml

    from twin.sim.spec import apply_overrides, parse_yaml, read_spec_text, resolve_spec
    from twin.studies.planner import plan_distserve

    _sample_args(args, "plan")
    if args.target_rate is not None and not args.target_rate > 0:
        raise TwinError(f"twin plan: --target-rate: {args.target_rate} must be > 0")
    executor = _executor(args)
    text, where, base_dir = read_spec_text(args.spec)
    data = parse_yaml(text, where)
    apply_overrides(data, args.set or [])
    _compare_base(data, where, "plan")
    spec = resolve_spec(data, where, base_dir, place=False)  # a template: its layout is searched
    _export_args_check(args, "plan")
    from twin.studies.goodput import require_slo

    require_slo(spec, args.spec)  # up front: the planner's searches are judged against it

    def one(n: int) -> Any:
        return plan_distserve(
            spec, sample_size=n, replicates=args.replicates, target_rate=args.target_rate,
            executor=executor,
        )  # fmt: skip

    if args.convergence:
        from twin.studies.samples import convergence_doc, format_convergence

        rows = []
        for n in args.convergence:
            p = one(n)
            what = f"{p.n_prefill} x P {p.prefill.label()} + {p.n_decode} x D {p.decode.label()}"
            rows.append((n, p.sample_size, what, p.capacity_mean, p.capacity_ci95))
        if args.json:
            _write_json(args.json, convergence_doc(rows, "plan"))
        print(format_convergence(rows, "plan"), file=_human(args))
        return 0
    plan = one(args.sample)
    if args.json:
        _write_json(args.json, plan.to_dict())
    out = _human(args)
    print(plan.explain(), file=out)
    print("\n# paste into the spec:", file=out)
    print(yaml.safe_dump(plan.to_spec_overrides(), sort_keys=False).rstrip(), file=out)
    if args.export_dynamo or args.export_llm_d:
        from twin.studies.export import from_plan, write_exports

        for path in write_exports(from_plan(spec, plan), args.export_dynamo, args.export_llm_d):
            print(f"written: {path}", file=out)
    return 0


def _sweep_input(args: argparse.Namespace) -> tuple[dict[str, Any], str, Path, Any, Path]:
    """The spec (--set applied), its name and folder, the executor and --out."""
    from twin.sim.spec import parse_yaml, read_spec_text
    from twin.studies.sweep import apply_sweep_overrides

    text, where, base_dir = read_spec_text(args.spec)
    data = parse_yaml(text, where)
    apply_sweep_overrides(data, args.set or [])
    executor = _executor(args)
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
    _plot_after(args, out, () if args.traces else ("timeline",))
    return 0


def _plot_after(args: argparse.Namespace, out: Any, unproduced: Sequence[str] = ()) -> None:
    """Plots of a sweep or goodput folder, unless --no-plots; ``unproduced``:
    plots whose inputs the command did not write (skipped without a note)."""
    if getattr(args, "no_plots", False):
        return
    from twin.viz.plots import plot_dir

    say = lambda msg: print(f"twin: {msg}", file=sys.stderr)  # noqa: E731
    for path in plot_dir(out, note=say, opts=_plot_options(args), unproduced=unproduced):
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
    _plot_after(args, out, ("attainment", "cdf", "timeline"))  # it writes goodput.csv only
    print(f"written: {out / 'goodput.csv'}")
    return 0


def _sample_options(p: argparse.ArgumentParser) -> None:
    from twin.studies.samples import DEFAULT_REPLICATES, DEFAULT_SAMPLE

    p.add_argument(
        "--sample", type=int, default=DEFAULT_SAMPLE,
        help=f"requests per sample (default {DEFAULT_SAMPLE}, from a convergence study)",
    )  # fmt: skip
    p.add_argument(
        "--replicates", type=int, default=DEFAULT_REPLICATES, metavar="K",
        help=f"independent samples, for the 95%% CI (default {DEFAULT_REPLICATES})",
    )  # fmt: skip
    p.add_argument(
        "--convergence", metavar="N,N,...",
        help="run at each sample size and print how the goodput moves (e.g. 250,500,1000)",
    )  # fmt: skip


def _executor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="spec path or bundled name")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY.PATH=VALUE",
        help="override a value; sweep.KEY=[...] replaces a swept key's values",
    )
    _parallel_args(p, "runs")
    p.add_argument("--out", metavar="DIR", help="output folder (default: out/NAME)")


def _parallel_args(p: argparse.ArgumentParser, what: str) -> None:
    """-j, --executor and --address: where the independent simulations run."""
    p.add_argument(
        "-j",
        "--jobs",
        default="auto",
        metavar="N|auto",
        help=f"parallel {what} (default auto: every core; local processes or Dask workers)",
    )
    p.add_argument(
        "--executor",
        choices=["local", "dask"],
        default="local",
        help="local processes (default) or a Dask cluster (needs pd-twin[dask])",
    )
    p.add_argument(
        "--address",
        metavar="tcp://HOST:PORT",
        help="an existing Dask scheduler (implies --executor dask)",
    )


def _executor(args: argparse.Namespace) -> Any:
    """The executor the -j, --executor and --address flags ask for."""
    from twin.studies.sweep import Executor, parse_jobs

    return Executor(args.executor, parse_jobs(args.jobs), args.address)


def cmd_spec(args: argparse.Namespace) -> int:
    """``twin spec --schema``: the JSON Schema of a spec; ``twin spec SPEC``: the
    resolved spec (every default filled in), its sha256 and, for a trace
    replayed at its own times, the trace's own rate and the rate replayed."""
    if args.schema:
        from twin.sim.spec import spec_schema
        from twin.studies.compare import COMPARE_SCHEMA
        from twin.studies.sweep import SWEEP_SCHEMA

        doc = spec_schema({"compare": COMPARE_SCHEMA, "sweep": SWEEP_SCHEMA})
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    from twin.sim.spec import apply_overrides, parse_yaml, read_spec_text, resolve_spec
    from twin.workload.stream import trace_rates

    text, where, base_dir = read_spec_text(args.spec)
    data = parse_yaml(text, where)
    for section in ("compare", "sweep"):
        if section in data:
            raise TwinError(
                f"{where}: has {section}:, a set of specs; twin spec resolves a single one"
            )
    apply_overrides(data, args.set or [])
    spec = resolve_spec(data, where, base_dir)
    out: dict[str, Any] = {"spec": spec.resolved, "spec_sha256": spec.sha256}
    rates = trace_rates(spec.workload)
    if rates:  # a trace replayed at its own times, as a run's header gives it
        out["trace_rate_rps"] = rates
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


def cmd_schedulers(args: argparse.Namespace) -> int:
    from twin.scheduler import describe, get_scheduler, scheduler_names

    names = scheduler_names()
    width = max((len(n) for n in names), default=0)
    for name in names:
        print(f"{name:{width}}  {describe(get_scheduler(name))}")
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    """``twin models | gpus | topologies | experiments``: what is bundled."""
    from twin.studies.catalog import catalog_rows, format_rows

    rows = catalog_rows(args.command)
    if args.json == "-":
        print(json.dumps({args.command: rows}, indent=2))
        return 0
    if args.json:
        _write_json(args.json, {args.command: rows})
    print(format_rows(args.command, rows))
    return 0


def _add_catalog_parsers(sub: Any) -> None:
    for name, what in (
        ("models", "the model catalog: parameters, layers, KV bytes per token, context"),
        ("gpus", "the GPU catalog: memory, HBM bandwidth, BF16 FLOP/s, NVLink, TDP"),
        ("topologies", "the bundled topologies: nodes, GPUs, NICs, links"),
        ("experiments", "the bundled experiments: kind and description"),
    ):
        c = sub.add_parser(name, help=f"list {what}")
        c.add_argument(
            "--json", metavar="PATH", help="also write the rows as JSON to PATH ('-': stdout only)"
        )
        c.set_defaults(func=cmd_catalog)


def cmd_bench(args: argparse.Namespace) -> int:
    from twin.studies.bench import DEFAULT_SIZES, bench, format_rows, parse_configs, parse_sizes

    sizes = parse_sizes(args.sizes if args.sizes is not None else DEFAULT_SIZES)
    configs = parse_configs(args.config)
    repeat = args.repeat if args.repeat is not None else (3 if args.vs is not None else 1)
    if repeat < 1:
        raise TwinError(f"--repeat: {repeat} must be >= 1")
    rows = bench(sizes, configs, repeat, vs=args.vs)
    if args.json:
        _write_json(args.json, {"rows": rows})
    print(format_rows(rows), file=_human(args))
    return 0


def cmd_topo(args: argparse.Namespace) -> int:
    from twin.net.report import summary
    from twin.net.topology import load_topology
    from twin.viz.topology import draw

    if args.nodes is not None and args.nodes <= 0:
        raise TwinError(f"twin topo: --nodes: {args.nodes} must be a positive integer")
    topo = load_topology(args.topology, nodes=args.nodes)
    if args.json:
        from twin.net.report import describe

        _write_json(args.json, describe(topo))
    out = _human(args)
    print(summary(topo), file=out)
    if args.png:
        draw(topo, args.png)
        print(f"drawing written to {args.png}", file=out)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from twin.viz.plots import plot_cdfs, plot_dir, plot_kv_tiers, plot_timeline

    if args.compare:
        from twin.viz.compare import plot_compare, reuses_prompts
        from twin.viz.plots import _compare_runs, plot_kv_tier_occupancy

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
    opts = _plot_options(args)
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
            runs, out / "requests-cdf", opts=_plot_options(args, sweep=False),
            by_class=args.by_class,
        )  # fmt: skip
    elif args.by_class:
        raise TwinError("twin plot: --by-class: applies to --requests")
    if args.window and not args.trace:
        raise TwinError("twin plot: --window: applies to --trace")
    if args.trace:
        window = None
        if args.window:
            try:
                a, b = (float(x) for x in args.window.split(","))
            except ValueError:
                a = b = math.nan
            if not 0 <= a < b < math.inf:
                raise TwinError(
                    f"twin plot: --window: {args.window!r}; expected START,END seconds, "
                    "0 <= START < END"
                )
            window = (a, b)
        stem = Path(args.trace).stem
        written += plot_timeline(
            args.trace, out / f"{stem}-timeline", window_s=window, opts=_plot_options(args, False)
        )
    if args.timeline:  # a run's file, or each entry's of a compare file
        from twin.viz.compare import plot_entries_over_time

        written += plot_entries_over_time(args.timeline, out, _plot_options(args, False))
    for path in written:
        print(path)
    return 0


class _VersionAction(argparse.Action):
    """``--version``, whose package metadata is read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kw: Any) -> None:
        print(f"pd-twin {_version.__version__}")
        parser.exit()


def _add_plot_options(p: argparse.ArgumentParser) -> None:
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


def _plot_options(args: argparse.Namespace, sweep: bool = True) -> Any:
    """The PlotOptions the flags of _add_plot_options ask for."""
    from twin.viz.style import PlotOptions, parse_labels, parse_size

    size = parse_size(args.size) if args.size else None
    labels = parse_labels(args.label)
    if not sweep:
        return PlotOptions(size=size, dpi=args.dpi, labels=labels)
    return PlotOptions(args.facet, args.hue, size, args.dpi, labels, args.at_rate)


def cmd_report(args: argparse.Namespace) -> int:
    from twin.viz.report import write_report

    note = lambda msg: print(f"twin report: {msg}", file=sys.stderr)  # noqa: E731
    print(write_report(args.dir, args.out, _plot_options(args), note))
    return 0


def _add_report_parser(sub: Any) -> None:
    rp = sub.add_parser(
        "report",
        help="one self-contained HTML page of a sweep folder: plots, sortable tables, hashes",
    )
    rp.add_argument("dir", help="a sweep or goodput folder (runs.csv, goodput.csv, spec.yaml)")
    rp.add_argument("--out", metavar="FILE", help="where to write (default: DIR/report.html)")
    _add_plot_options(rp)
    rp.set_defaults(func=cmd_report)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="twin", description="pd-twin: a digital twin of an LLM serving cluster")
    p.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    r.add_argument("-q", "--quiet", action="store_true", help="print nothing")
    r.set_defaults(func=cmd_run)

    k = sub.add_parser("kv", help="KV-cache bytes per token and for N tokens")
    _model_args(k)
    k.add_argument("--tokens", type=int, default=1000, help="tokens of KV (default 1000)")
    k.add_argument("--block-size", type=int, default=16, help="tokens per KV block (16)")
    k.add_argument("--dtype", help="fp16, bf16, fp8, int8, fp32 (default: the model's)")
    _json_option(k, "the KV shape and sizes")
    k.set_defaults(func=cmd_kv)

    v = sub.add_parser("validate", help="check the performance model against measured profiles")
    v.add_argument(
        "what", choices=["perf", "run", "runs", "replay"],
        help="perf: the performance model against measured profiles; run: a spec against a "
        "real serving run (--against), or a measured inference-perf run (a run folder, or "
        "DIR/KEY of a folder with manifest.csv) replayed as its own spec; runs: every "
        "measured run of DIR; replay: a spec's measured perf table against each roofline "
        "preset",
    )  # fmt: skip
    v.add_argument(
        "spec", nargs="?",
        help="run, replay: the spec (path or bundled name); run: or a measured run; runs: DIR",
    )  # fmt: skip
    v.add_argument(
        "--stage-requests", type=int, metavar="N",
        help="run RUN, runs: replay only the first N requests sent in each load stage (speed)",
    )  # fmt: skip
    v.add_argument(
        "--gpu", help="run RUN, runs: the GPU (catalog name) where the run's files name none"
    )
    v.add_argument(
        "--all", action="store_true",
        help="runs: replay and count the overloaded runs too (left out by default)",
    )  # fmt: skip
    v.add_argument(
        "--residuals", metavar="OUT",
        help="runs: write the residual table (log predicted/measured per run, stage and metric)"
        " for a spec's perf.residuals",
    )  # fmt: skip
    v.add_argument(
        "--coverage", type=float, default=0.8,
        help="runs: the prediction intervals' coverage, checked leaving each run out (default 0.8)",
    )  # fmt: skip
    v.add_argument(
        "--against", metavar="RESULTS",
        help="run: a `vllm bench serve --save-detailed` JSON or an AIPerf profile_export.jsonl",
    )  # fmt: skip
    v.add_argument(
        "--format", default="auto", choices=["auto", "vllm", "aiperf"], help="run: RESULTS format"
    )
    v.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="run, replay: override")
    v.add_argument("--json", action="store_true", help="run, runs, replay: print JSON")
    v.add_argument(
        "--data", help="the public data folder (default: $TWIN_DATA, ./shared/data, ../shared/data)"
    )
    v.add_argument(
        "--held-out",
        action="store_true",
        help="also refit leaving each source out and score it (one fit per source, minutes "
        "each; -j runs them at once)",
    )
    _parallel_args(v, "held-out fits")
    _add_validate_workload_args(v)
    v.set_defaults(func=cmd_validate)

    h = sub.add_parser("handoff", help="KV bytes and idle-network transfer time of one hand-off")
    _model_args(h)
    h.add_argument("--tokens", type=int, required=True, help="prompt tokens whose KV moves")
    h.add_argument("--topology", required=True, help="bundled topology name or YAML path")
    h.add_argument(
        "--placement", choices=["same-node", "cross-node"], default="cross-node",
        help="prefill and decode instance on one node or on two (default cross-node)",
    )  # fmt: skip
    h.add_argument("--tp", type=int, default=1, help="tensor parallelism of both instances")
    h.add_argument(
        "--mode", choices=["serialized", "layerwise"], default="serialized",
        help="KV sent after the prefill (serialized, default) or layer by layer during it",
    )  # fmt: skip
    h.add_argument("--multi-nic", action="store_true", help="spread each shard over all NICs")
    h.add_argument("--nodes", type=int, help="scale the topology to this many nodes")
    h.add_argument("--block-size", type=int, default=16, help="tokens per KV block (16)")
    h.add_argument(
        "--descriptors", choices=["layer", "block"],
        help="what a descriptor covers: one K/V region of a layer (default) or each KV block",
    )  # fmt: skip
    for flag, field in _HANDOFF_COSTS:
        h.add_argument(
            f"--{flag}", dest=field, metavar="DURATION",
            help=f"transfer.{flag.replace('-', '_')} (default: the spec's, e.g. '2 us')",
        )  # fmt: skip
    h.add_argument(
        "--json", nargs="?", const="-", metavar="PATH|-",
        help="write the estimate as JSON to PATH (- or none: to stdout, the text to stderr)",
    )  # fmt: skip
    h.set_defaults(func=cmd_handoff)

    pv = sub.add_parser(
        "provision", help="search prefill:decode instance counts for the best goodput in a budget"
    )
    pv.add_argument("spec", help="a split spec (path or bundled name); its tp/pp are kept")
    budget = pv.add_mutually_exclusive_group()
    budget.add_argument("--power", metavar="W", help="power budget, e.g. '20 kW' or 20000")
    budget.add_argument("--gpus", type=int, metavar="N", help="GPU budget (default: the spec's)")
    _sample_options(pv)
    pv.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a value")
    _parallel_args(pv, "goodput searches (one per split and sample)")
    _export_options(pv)
    _json_option(pv, "every split searched and the best one")
    pv.set_defaults(func=cmd_provision)
    pl = sub.add_parser(
        "plan", help="DistServe's planner: parallelism, P:D counts and placement for a spec"
    )
    pl.add_argument("spec", help="spec path or bundled name")
    pl.add_argument(
        "--set", action="append", metavar="KEY.PATH=VALUE", help="override a spec value"
    )
    _sample_options(pl)
    pl.add_argument(
        "--target-rate", type=float, metavar="RPS", help="replicate to this rate, not to fill"
    )
    _parallel_args(pl, "goodput searches (one per configuration of a phase, per sample)")
    _export_options(pl)
    _json_option(pl, "the plan, its candidates and the spec overrides")
    pl.set_defaults(func=cmd_plan)

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
    _add_plot_options(sw)
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
    _add_plot_options(gp)
    gp.set_defaults(func=cmd_goodput)

    sp = sub.add_parser(
        "spec", help="print a spec resolved (defaults filled in), or with --schema its JSON Schema"
    )
    sp.add_argument(
        "spec", nargs="?", default="quickstart", help="spec path or bundled name (quickstart)"
    )
    sp.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a value")
    sp.add_argument(
        "--schema", action="store_true", help="print the JSON Schema (draft 2020-12) of a spec"
    )
    sp.set_defaults(func=cmd_spec)

    s = sub.add_parser("schedulers", help="list the registered scheduling policies")
    s.set_defaults(func=cmd_schedulers)

    t = sub.add_parser(
        "topo", help="describe a topology: GPUs, links, injection and bisection bandwidth"
    )
    t.add_argument("topology", metavar="NAME|PATH", help="a bundled topology name or a YAML path")
    t.add_argument("--nodes", type=int, help="scale a single-template topology to N nodes")
    t.add_argument("--png", metavar="FILE", help="draw the graph to FILE")
    _json_option(t, "the counts, bandwidths and sample paths")
    t.set_defaults(func=cmd_topo)

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
    _add_plot_options(pt)
    pt.set_defaults(func=cmd_plot)
    _add_report_parser(sub)

    b = sub.add_parser(
        "bench",
        help="CPU, wall, events and iterations per request and peak memory of the colocated "
        "and split benchmark runs; --vs times another command on the same requests",
    )
    b.add_argument(
        "--sizes", help="request counts, comma-separated, k/M suffixes (default 10k,100k)"
    )
    b.add_argument(
        "--config", default="colocated,split", help="colocated, split or both (the default)"
    )
    b.add_argument(
        "--repeat",
        type=int,
        metavar="R",
        help="runs per row, median reported (default 1; with --vs: 3 pairs)",
    )
    _json_option(b, "the rows, every run included,")
    b.add_argument(
        "--vs",
        metavar="CMD",
        help="a shell command to time in alternation with each row's run (A B A B ...); "
        "{requests_csv}, {n} and {config} are replaced by a CSV of the requests the twin "
        "serves (arrival_s,prompt_tokens,output_tokens; those over the model's context, "
        "which it rejects, left out), their count and the configuration",
    )
    b.set_defaults(func=cmd_bench)
    _add_catalog_parsers(sub)
    _add_profile_parser(sub)
    _add_calibrate_parser(sub)
    helps = {a.dest: str(a.help or "") for a in sub._choices_actions}
    for name, sp in sub.choices.items():
        if sp.description is None and helps.get(name):
            sp.description = f"{helps[name][:1].upper()}{helps[name][1:]}."
        if name in EXAMPLES:
            sp.epilog = "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[name])
            sp.formatter_class = argparse.RawDescriptionHelpFormatter
    return p


def _add_profile_parser(sub: Any) -> None:
    pr = sub.add_parser(
        "profile", help="measure a profile table of a model on a GPU with PyTorch (extra: profile)"
    )
    _model_args(pr)
    pr.add_argument("--gpu", help="the catalog GPU measured (twin gpus); optional on --device cpu")
    pr.add_argument("--tp", type=int, default=1, help="tensor parallelism: one rank's shard timed")
    pr.add_argument("--out", default="profile.csv", help="the table (default profile.csv)")
    pr.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cuda (default)")
    pr.add_argument(
        "--grid", default="full", choices=["full", "small", "tiny"], help="the points (full)"
    )
    pr.add_argument("--layers", type=int, help="layers timed, scaled to all (default: all)")
    pr.add_argument("--dtype", help="bf16, fp16 or fp32 (default: bf16 on cuda, fp32 on cpu)")
    pr.add_argument("--warmup", type=int, default=3, help="passes before timing (3)")
    pr.add_argument("--repeats", type=int, default=5, help="timed passes per point, median (5)")
    pr.add_argument("-q", "--quiet", action="store_true", help="no line per point")
    pr.set_defaults(func=cmd_profile)


def cmd_profile(args: argparse.Namespace) -> int:
    from twin.perf.profile import command

    return command(
        _model_arg(args, "profile"), args.gpu, tp=args.tp, out=args.out, device=args.device,
        grid=args.grid, layers=args.layers, dtype=args.dtype, warmup=args.warmup,
        repeats=args.repeats, quiet=args.quiet,
    )  # fmt: skip


def _add_calibrate_parser(sub: Any) -> None:
    ca = sub.add_parser(
        "calibrate",
        help="fit the roofline's terms to profile tables (--profile) or serving runs (--runs)",
    )
    src = ca.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--profile", action="append", metavar="TABLE",
        help="a native table (twin profile); repeat for several models on one GPU",
    )  # fmt: skip
    src.add_argument(
        "--runs", metavar="DIR",
        help="measured vLLM runs (inference-perf run folders, or a realruns-style folder):"
        " fit the vllm preset's free terms and write its perf: block",
    )  # fmt: skip
    ca.add_argument(
        "--stage-requests", type=int, metavar="N",
        help="--runs: replay only the first N requests sent in each load stage (faster)",
    )  # fmt: skip
    ca.add_argument(
        "--leave-one-out", action="store_true",
        help="--runs: also score each run with the terms fitted to the others",
    )  # fmt: skip
    ca.add_argument("--out", metavar="FILE", help="--runs: write the perf: block (YAML) here")
    ca.add_argument(
        "--residuals", metavar="FILE",
        help="--runs: fit leaving each run out and write the held-out residual table here"
        " (for perf.residuals: prediction intervals)",
    )  # fmt: skip
    ca.add_argument("--model", help="the model measured (default: the table's sidecar)")
    ca.add_argument("--gpu", help="the catalog GPU measured (default: the sidecar)")
    ca.add_argument("--tp", type=int, help="the TP measured (default: the sidecar, else 1)")
    ca.add_argument(
        "--engine", default="distserve", help="preset of the terms not fitted (distserve)"
    )
    ca.add_argument(
        "--fit", metavar="TERM[,TERM...]",
        help="terms to fit (--profile default mfu,mbu,attn_mfu,overhead_s,seq_overhead_s;"
        " --runs default overhead_s,layer_overhead_s,hop_overhead_s,moe_efficiency)",
    )  # fmt: skip
    ca.add_argument("--json", action="store_true", help="print JSON")
    ca.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.runs is not None:
        from twin._io import check_outputs
        from twin.studies.calibrate_runs import command as runs_command

        check_outputs([("--residuals", args.residuals)])

        return runs_command(
            args.runs, gpu=args.gpu, fit_terms=args.fit, stage_requests=args.stage_requests,
            loo=args.leave_one_out, out=args.out, as_json=args.json, residuals=args.residuals,
        )  # fmt: skip
    from twin.perf.fit_profile import command

    return command(
        args.profile, args.model, args.gpu, args.tp, args.engine, args.fit, as_json=args.json
    )


# Each subcommand's --help ends with these examples (one place, not one per parser).
EXAMPLES: dict[str, tuple[str, ...]] = {
    "run": (
        "twin run quickstart --set workload.max_requests=500 --json out.json",
        "twin run disagg --requests-csv requests.csv --trace-out trace.json",
    ),
    "kv": ("twin kv llama-3-70b --tokens 4096", "twin kv --model my-model.yaml --dtype fp8"),
    "validate": (
        "twin validate perf --data ../shared/data",
        "twin validate perf --workload azure-conv",
        "twin validate replay my-profile-spec.yaml",
        "twin validate run my-spec.yaml --against vllm-result.json",
        "twin validate run my-spec.yaml --against artifacts/run/profile_export.jsonl --json",
        "twin validate run ../shared/data/realruns/runs/20260217-155451-llama-2-7b-tp1-codegen",
        "twin validate runs ../shared/data/realruns --stage-requests 500 --json",
    ),
    "handoff": (
        "twin handoff llama-3.1-70b --tokens 8000 --topology dgx-h100-ib400 --tp 8",
        "twin handoff meta-llama/Llama-2-70b-hf --tokens 2000 --topology a100-eth25 --json",
    ),
    "provision": (
        "twin provision disagg --gpus 32",
        "twin provision disagg --power '20 kW' --export-dynamo dynamo.yaml",
    ),
    "plan": (
        "twin plan disagg --target-rate 10",
        "twin plan disagg --export-dynamo dynamo.yaml --export-llm-d values.yaml",
    ),
    "sweep": ("twin sweep pool-ratio -j 2", "twin sweep pool-ratio --requests --no-plots"),
    "goodput": ("twin goodput pool-ratio -j 2 --seeds 1",),
    "spec": ("twin spec disagg --set cluster.nodes=2", "twin spec --schema"),
    "schedulers": ("twin schedulers",),
    "topo": ("twin topo dgx-h100-ib400", "twin topo dgx-h100-ib400 --nodes 8 --png topo.png"),
    "plot": (
        "twin plot out/pool-ratio",
        "twin plot out/pool-ratio --facet workload.trace --hue cluster.prefill.instances",
        "twin plot --requests a.csv b.csv --out plots",
        "twin plot --trace trace.json --window 10,20",
    ),
    "bench": ("twin bench --sizes 10k --config split",),
    "report": (
        "twin report out/pool-ratio",
        "twin report out/pool-ratio --hue cluster.prefill.instances",
    ),
    "models": ("twin models", "twin models --json -"),
    "gpus": ("twin gpus", "twin gpus --json gpus.json"),
    "topologies": ("twin topologies", "twin topologies --json -"),
    "experiments": ("twin experiments", "twin experiments --json -"),
    "calibrate": (
        "twin calibrate --profile qwen3-8b-h200.csv",
        "twin calibrate --profile qwen3-8b-h200.csv --profile llama-3.1-8b-h200.csv",
        "twin calibrate --runs ../shared/data/realruns --stage-requests 500 --out perf.yaml",
    ),
    "profile": (
        "twin profile qwen3-8b --gpu h200 --out qwen3-8b-h200.csv",
        "twin profile tiny --device cpu --grid tiny --out tiny.csv",
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command: 0 done, 2 bad input (one ``twin: error:`` line),
    130 interrupted (Ctrl-C: one ``twin: interrupted`` line)."""
    one_blas_thread()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        _check_outputs(args)
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


if __name__ == "__main__":
    sys.exit(main())
