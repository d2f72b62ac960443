"""``twin provision`` and ``twin plan``: the deployment searches, with their
sample options and the deployment exports."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from twin.cli._common import (
    human,
    json_option,
    make_executor,
    one_stdout,
    parallel_args,
    write_json,
)
from twin.errors import TwinError


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
    executor = make_executor(args)

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
            write_json(args.json, convergence_doc(rows, "best"))
        print(format_convergence(rows, "best P:D"), file=human(args))
        return 0
    found = one(args.sample)
    if args.json:
        write_json(args.json, found.to_dict())
    print(format_provision(found), file=human(args))
    if args.export_dynamo or args.export_llm_d:
        from twin.studies.export import from_provision, write_exports

        dep = from_provision(data, where, base_dir, found)
        for path in write_exports(dep, args.export_dynamo, args.export_llm_d):
            print(f"written: {path}", file=human(args))
    return 0


def export_options(p: argparse.ArgumentParser, what: str = "the chosen deployment") -> None:
    """``--export-dynamo`` and ``--export-llm-d``, writing ``what``."""
    p.add_argument(
        "--export-dynamo", metavar="FILE|-",
        help=f"write {what} as an NVIDIA Dynamo DynamoGraphDeployment (YAML;"
        " - : to stdout, the text to stderr)",
    )  # fmt: skip
    p.add_argument(
        "--export-llm-d", metavar="FILE|-",
        help=f"write {what} as llm-d ModelService Helm values (YAML;"
        " - : to stdout, the text to stderr)",
    )  # fmt: skip


def _export_args_check(args: argparse.Namespace, cmd: str) -> None:
    """Refuse an export with --convergence before the search (the files were
    checked with every output, by check_command_outputs)."""
    if (args.export_dynamo or args.export_llm_d) and args.convergence:
        raise TwinError(f"twin {cmd}: --export-*: exports one deployment; not with --convergence")
    one_stdout(args, cmd)


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


def sample_options(p: argparse.ArgumentParser) -> None:
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
    executor = make_executor(args)
    text, where, base_dir = read_spec_text(args.spec)
    data = parse_yaml(text, where)
    apply_overrides(data, args.set or [])
    _compare_base(data, where, "plan")
    spec = resolve_spec(data, where, base_dir, place=False)  # a template: its layout is searched
    _export_args_check(args, "plan")
    from twin.studies.goodput import require_slo

    # up front: the planner's searches are judged against it (TTFT and TPOT per phase)
    require_slo(spec, args.spec, slowdown=False)

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
            write_json(args.json, convergence_doc(rows, "plan"))
        print(format_convergence(rows, "plan"), file=human(args))
        return 0
    plan = one(args.sample)
    if args.json:
        write_json(args.json, plan.to_dict())
    out = human(args)
    print(plan.explain(), file=out)
    print("\n# paste into the spec:", file=out)
    print(yaml.safe_dump(plan.to_spec_overrides(), sort_keys=False).rstrip(), file=out)
    if args.export_dynamo or args.export_llm_d:
        from twin.studies.export import from_plan, write_exports

        for path in write_exports(from_plan(spec, plan), args.export_dynamo, args.export_llm_d):
            print(f"written: {path}", file=out)
    return 0


def add_plan_parsers(sub: Any) -> None:
    """``twin provision`` and ``twin plan``."""
    pv = sub.add_parser(
        "provision", help="search prefill:decode instance counts for the best goodput in a budget"
    )
    pv.add_argument("spec", help="a split spec (path or bundled name); its tp/pp are kept")
    budget = pv.add_mutually_exclusive_group()
    budget.add_argument("--power", metavar="W", help="power budget, e.g. '20 kW' or 20000")
    budget.add_argument("--gpus", type=int, metavar="N", help="GPU budget (default: the spec's)")
    sample_options(pv)
    pv.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a value")
    parallel_args(pv, "goodput searches (one per split and sample)")
    export_options(pv)
    json_option(pv, "every split searched and the best one")
    pv.set_defaults(func=cmd_provision)
    pl = sub.add_parser(
        "plan", help="DistServe's planner: parallelism, P:D counts and placement for a spec"
    )
    pl.add_argument("spec", help="spec path or bundled name")
    pl.add_argument(
        "--set", action="append", metavar="KEY.PATH=VALUE", help="override a spec value"
    )
    sample_options(pl)
    pl.add_argument(
        "--target-rate", type=float, metavar="RPS", help="replicate to this rate, not to fill"
    )
    parallel_args(pl, "goodput searches (one per configuration of a phase, per sample)")
    export_options(pl)
    json_option(pl, "the plan, its candidates and the spec overrides")
    pl.set_defaults(func=cmd_plan)
