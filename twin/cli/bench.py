"""``twin bench``: the twin's own speed and memory."""

from __future__ import annotations

import argparse
from typing import Any

from twin.cli._common import human, json_option, write_json
from twin.errors import TwinError


def cmd_bench(args: argparse.Namespace) -> int:
    from twin.studies.bench import DEFAULT_SIZES, bench, format_rows, parse_configs, parse_sizes

    sizes = parse_sizes(args.sizes if args.sizes is not None else DEFAULT_SIZES)
    configs = parse_configs(args.config)
    repeat = args.repeat if args.repeat is not None else (3 if args.vs is not None else 1)
    if repeat < 1:
        raise TwinError(f"--repeat: {repeat} must be >= 1")
    rows = bench(sizes, configs, repeat, vs=args.vs)
    if args.json:
        write_json(args.json, {"rows": rows})
    print(format_rows(rows), file=human(args))
    return 0


def add_bench_parser(sub: Any) -> None:
    """``twin bench``."""
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
    json_option(b, "the rows, every run included,")
    b.add_argument(
        "--vs",
        metavar="CMD",
        help="a shell command to time in alternation with each row's run (A B A B ...); "
        "{requests_csv}, {n} and {config} are replaced by a CSV of the requests the twin "
        "serves (arrival_s,prompt_tokens,output_tokens; those over the model's context, "
        "which it rejects, left out), their count and the configuration",
    )
    b.set_defaults(func=cmd_bench)
