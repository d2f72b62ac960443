"""The commands that describe inputs without running a simulation: ``twin kv``,
``handoff``, ``spec``, ``schedulers``, ``topo`` and the catalogs (``models``,
``gpus``, ``topologies``, ``experiments``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from twin.cli._common import human, json_option, model_arg, model_args, write_json
from twin.errors import TwinError
from twin.units import format_bytes


def cmd_kv(args: argparse.Namespace) -> int:
    from twin.perf.kvreport import kv_facts, kv_report
    from twin.perf.llm import dtype_bytes, model_from_arg

    model = model_from_arg(model_arg(args, "kv"), where="twin kv: MODEL")
    nbytes = dtype_bytes(args.dtype) if args.dtype else None
    if args.tokens < 0:
        raise TwinError(f"twin kv: --tokens: {args.tokens} must be >= 0")
    if args.block_size <= 0:
        raise TwinError(f"twin kv: --block-size: {args.block_size} must be > 0")
    if args.json:
        write_json(args.json, kv_facts(model, args.tokens, args.block_size, nbytes))
    print(kv_report(model, args.tokens, args.block_size, nbytes), file=human(args))
    return 0


def cmd_handoff(args: argparse.Namespace) -> int:
    import dataclasses

    from twin._check import duration
    from twin.net.topology import load_topology
    from twin.perf.llm import model_from_arg
    from twin.serving.handoff import TransferConfig
    from twin.studies.handoff import handoff_estimate

    model = model_from_arg(model_arg(args, "handoff"), where="twin handoff: MODEL")
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
        write_json(args.json, est)
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
        file=human(args),
    )
    return 0


# twin handoff's flags for the transfer's fixed costs -> TransferConfig fields
_HANDOFF_COSTS = (
    ("control-rtt", "control_rtt_s"),
    ("registration", "registration_s"),
    ("per-descriptor", "per_descriptor_s"),
    ("router-hop", "router_hop_s"),
)


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
    if "sweep" in data:
        raise TwinError(f"{where}: has sweep:, a set of specs; twin spec resolves a single one")
    if "compare" in data:
        spec = _compare_entry(data, where, base_dir, args)
    else:
        if args.entry is not None:
            raise TwinError(f"--entry: names an entry of a compare spec; {where} has no compare:")
        apply_overrides(data, args.set or [])
        spec = resolve_spec(data, where, base_dir)
    out: dict[str, Any] = {"spec": spec.resolved, "spec_sha256": spec.sha256}
    rates = trace_rates(spec.workload)
    if rates:  # a trace replayed at its own times, as a run's header gives it
        out["trace_rate_rps"] = rates
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


def _compare_entry(data: dict[str, Any], where: str, base_dir: Any, args: Any) -> Any:
    """The entry ``--entry LABEL`` of a compare spec, resolved as ``twin run
    SPEC --only LABEL`` runs it."""
    from twin.studies.compare import compare_entries, compare_specs

    labels = list(compare_entries(data, where))
    if args.entry is None:
        raise TwinError(
            f"{where}: has compare:, a set of specs; twin spec resolves one: pick it with "
            f"--entry LABEL (one of {', '.join(labels)})"
        )
    return compare_specs(data, where, base_dir, args.set or [], only=[args.entry])[1][args.entry]


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
        write_json(args.json, {args.command: rows})
    print(format_rows(args.command, rows))
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

        write_json(args.json, describe(topo))
    out = human(args)
    print(summary(topo), file=out)
    if args.png:
        draw(topo, args.png)
        print(f"drawing written to {args.png}", file=out)
    return 0


def add_catalog_parsers(sub: Any) -> None:
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


def add_kv_parser(sub: Any) -> None:
    """``twin kv``."""
    k = sub.add_parser("kv", help="KV-cache bytes per token and for N tokens")
    model_args(k)
    k.add_argument("--tokens", type=int, default=1000, help="tokens of KV (default 1000)")
    k.add_argument("--block-size", type=int, default=16, help="tokens per KV block (16)")
    k.add_argument("--dtype", help="fp16, bf16, fp8, int8, fp32 (default: the model's)")
    json_option(k, "the KV shape and sizes")
    k.set_defaults(func=cmd_kv)


def add_handoff_parser(sub: Any) -> None:
    """``twin handoff``."""
    h = sub.add_parser("handoff", help="KV bytes and idle-network transfer time of one hand-off")
    model_args(h)
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


def add_spec_parsers(sub: Any) -> None:
    """``twin spec``, ``schedulers`` and ``topo``."""
    sp = sub.add_parser(
        "spec", help="print a spec resolved (defaults filled in), or with --schema its JSON Schema"
    )
    sp.add_argument(
        "spec", nargs="?", default="quickstart", help="spec path or bundled name (quickstart)"
    )
    sp.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a value")
    sp.add_argument(
        "--entry", metavar="LABEL",
        help="of a compare spec, the entry to resolve (a label, as twin run --only takes)",
    )  # fmt: skip
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
    json_option(t, "the counts, bandwidths and sample paths")
    t.set_defaults(func=cmd_topo)
