"""What every command shares: the one-line errors, output files and the
flags several commands take."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from twin import _version
from twin._io import AtomicFile, check_outputs
from twin.errors import TwinError

EXIT_USAGE = 2


EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command ended by Ctrl-C


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line, ``twin: error: ...``, like every other."""

    def error(self, message: str) -> Any:
        where = self.prog.removeprefix("twin").strip()
        hint = f" (see twin {where + ' ' if where else ''}--help)"
        print(f"twin: error: {where + ': ' if where else ''}{message}{hint}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


class VersionAction(argparse.Action):
    """``--version``, whose package metadata is read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kw: Any) -> None:
        print(f"pd-twin {_version.__version__}")
        parser.exit()


def open_out(path: str) -> AtomicFile:
    """An output file, written under a temporary name and renamed by close()."""
    return AtomicFile(path)


def write_json(path: str, doc: dict[str, Any]) -> None:
    """``doc`` as JSON to ``path``, or to stdout for ``-``."""
    if path == "-":
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return
    with open_out(path) as f:
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


def check_command_outputs(args: argparse.Namespace) -> None:
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


def json_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--json", metavar="PATH|-",
        help=f"write {what} as JSON to PATH (- : to stdout, the text to stderr)",
    )  # fmt: skip


# The flags that may send their file to stdout with ``-`` (one of them at a time).
STDOUT_FILES = (("json", "--json"), ("export_dynamo", "--export-dynamo"),
                ("export_llm_d", "--export-llm-d"))  # fmt: skip


def one_stdout(args: argparse.Namespace, cmd: str) -> None:
    """Refuse more than one output given as ``-`` (stdout)."""
    to_stdout = [flag for dest, flag in STDOUT_FILES if getattr(args, dest, None) == "-"]
    if len(to_stdout) > 1:
        raise TwinError(f"twin {cmd}: {' and '.join(to_stdout)} are both '-': one output "
                        "may go to stdout; give the others a file")  # fmt: skip


def human(args: argparse.Namespace) -> IO[str]:
    """Where the readable output goes: stderr when ``--json -`` (or an export
    to ``-``) holds stdout."""
    held = any(getattr(args, dest, None) == "-" for dest, _ in STDOUT_FILES)
    return sys.stderr if held else sys.stdout


def model_arg(args: argparse.Namespace, cmd: str) -> str:
    """MODEL, given as the positional argument or as --model (one of them)."""
    if args.model is not None and args.model_opt is not None:
        raise TwinError(f"twin {cmd}: give the model once: MODEL or --model, not both")
    value = args.model if args.model is not None else args.model_opt
    if value is None:
        raise TwinError(f"twin {cmd}: MODEL: missing; a catalog name, a YAML file or a mapping")
    return str(value)


def model_args(p: argparse.ArgumentParser) -> None:
    what = "catalog name or alias (twin models), a YAML file or an inline {name: ..., layers: ...}"
    p.add_argument("model", nargs="?", metavar="MODEL", help=f"the model: {what}")
    p.add_argument(
        "--model", dest="model_opt", metavar="MODEL", help="the model, as MODEL (either form)"
    )


def parallel_args(p: argparse.ArgumentParser, what: str) -> None:
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


def make_executor(args: argparse.Namespace) -> Any:
    """The executor the -j, --executor and --address flags ask for."""
    from twin.studies.sweep import Executor, parse_jobs

    return Executor(args.executor, parse_jobs(args.jobs), args.address)
