"""The commands that hold the model to measurements: ``twin validate``,
``calibrate`` and ``profile``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from twin.cli._common import make_executor, model_arg, model_args, parallel_args
from twin.errors import TwinError


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
        with make_executor(args) as ex, Progress(len(sources), "sources", desc="held out") as bar:
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


def add_profile_parser(sub: Any) -> None:
    pr = sub.add_parser(
        "profile", help="measure a profile table of a model on a GPU with PyTorch (extra: profile)"
    )
    model_args(pr)
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
        model_arg(args, "profile"), args.gpu, tp=args.tp, out=args.out, device=args.device,
        grid=args.grid, layers=args.layers, dtype=args.dtype, warmup=args.warmup,
        repeats=args.repeats, quiet=args.quiet,
    )  # fmt: skip


def add_calibrate_parser(sub: Any) -> None:
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


def add_validate_parser(sub: Any) -> None:
    """``twin validate``."""
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
    parallel_args(v, "held-out fits")
    _add_validate_workload_args(v)
    v.set_defaults(func=cmd_validate)
