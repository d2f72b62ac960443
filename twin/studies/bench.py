"""``twin bench``: what a run costs, and how that compares with another command.

Two configurations on the same requests (Azure LLM inference 2023
conversation lengths from the bundled ``azure-conv`` table, Poisson arrivals
at 8 requests/s, seed 0), on 4 DGX-H100 nodes (``dgx-h100-ib400``) serving
Llama-2-70B at TP 8:

- ``colocated``: 4 mixed instances, one per node, ``colocated`` least-loaded;
- ``split``: 2 prefill + 2 decode instances, ``splitwise``, TTFT at decode.

Llama-2-70B, not a current model, because the peer it is timed against with
``vs`` (splitwise-sim) has measured profiles (its ``perf_model.csv``) for
Llama-2-70B and BLOOM-176B only: the same model on both sides keeps the ratio
a comparison of simulators. Its 4,096-token context turns the longest Azure
conversations away at arrival (below); the bundled experiments serve models
whose context fits their traffic.

Each (configuration, size) runs in a fresh child process (``python -m
twin.studies.bench CONFIG N``), so that its CPU seconds (user + system, from
``os.wait4``), wall seconds and peak resident memory (``ru_maxrss``) are its
own, start-up and imports included: the whole process, as a user pays it. The
child reports the SimPy events it processed, the engine iterations (summed
over instances) and the simulated seconds. With ``repeat`` > 1 each figure is
the median over the runs.

``vs`` names another command (a shell command line) to time on the same
machine in alternation with twin's own run, A B A B ..., ``repeat`` pairs. To
let it simulate the same requests, the requests the twin simulates are written
to a CSV first (``arrival_s,prompt_tokens,output_tokens``, one row per
request, drawn from the simulation's own request stream, less the requests
the twin rejects at arrival because prompt + output exceed the model's
context, so that both sides serve the same requests) and ``{requests_csv}``,
``{n}`` and ``{config}`` in the command are replaced by its path (shell-quoted),
the number of requests in it and the configuration name. The other command's CPU is the
rusage of the shell that runs it, which includes every process it waited for.
The ratio B/A is the median over pairs of the pair's ratio, which stays
meaningful when the machine's speed drifts between pairs.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from twin._io import read_text
from twin._progress import Progress
from twin._threads import one_blas_thread, user_env
from twin.errors import TwinError

if TYPE_CHECKING:
    from twin.sim.spec import ExperimentSpec

CONFIGS = ("colocated", "split")
DEFAULT_SIZES = "10k,100k"
REQUEST_CSV_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")

_SIZE = re.compile(r"(\d+(?:\.\d+)?)([kKmM]?)")
_SUFFIX = {"": 1, "k": 1_000, "m": 1_000_000}


def parse_sizes(text: str) -> list[int]:
    """``"10k,100k,1M"`` -> ``[10000, 100000, 1000000]``; plain integers too.

    A suffix ``k`` is thousands, ``M`` millions (either case); ``1.5k`` is
    1500. Each size must be a whole number of requests > 0."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise TwinError(f"--sizes: {text!r} names no size; give e.g. 10k,100k,1M")
    sizes = []
    for item in items:
        m = _SIZE.fullmatch(item.replace("_", ""))
        if m is None:
            raise TwinError(
                f"--sizes: {item!r} is not a request count; give e.g. 10k,100k,1M or 5000"
            )
        exact = Fraction(m.group(1)) * _SUFFIX[m.group(2).lower()]
        if exact.denominator != 1:
            raise TwinError(f"--sizes: {item!r} is not a whole number of requests")
        value = int(exact)
        if value <= 0:
            raise TwinError(f"--sizes: {item!r} must be > 0 requests")
        sizes.append(value)
    return sizes


def parse_configs(text: str) -> list[str]:
    """``"colocated,split"`` -> ``["colocated", "split"]``, each known, no repeats."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise TwinError(f"--config: {text!r} names no configuration; choose from colocated, split")
    for item in items:
        if item not in CONFIGS:
            raise TwinError(
                f"--config: {item!r} is not a configuration; choose from {', '.join(CONFIGS)}"
            )
    return list(dict.fromkeys(items))


def bench_spec(config: str, n: int) -> dict[str, Any]:
    """The spec (a mapping, as parsed from YAML) of ``config`` with ``n`` requests."""
    if config not in CONFIGS:
        raise TwinError(
            f"twin bench: {config!r} is not a configuration; choose from colocated, split"
        )
    spec: dict[str, Any] = {
        "name": f"bench-{config}",
        "seed": 0,
        "model": "llama-2-70b",
        "workload": {
            "lengths": "azure-conv",
            "arrival": {"process": "poisson", "rate": 8.0},
            "max_requests": n,
        },
    }
    if config == "colocated":
        spec["cluster"] = {"topology": "dgx-h100-ib400", "nodes": 4, "instances": 4, "tp": 8}
        spec["scheduler"] = {"name": "colocated", "routing": "least_loaded"}
        spec["slo"] = {"ttft": "1 s", "tpot": "50 ms"}
    else:
        spec["cluster"] = {
            "topology": "dgx-h100-ib400",
            "nodes": 4,
            "prefill": {"instances": 2, "tp": 8},
            "decode": {"instances": 2, "tp": 8},
            "placement": "packed",
        }
        spec["scheduler"] = {"name": "splitwise"}
        spec["slo"] = {"ttft": "1 s", "tpot": "50 ms", "ttft_at": "decode"}
    return spec


def _resolved(config: str, n: int) -> ExperimentSpec:
    from twin.sim.spec import resolve_spec

    return resolve_spec(bench_spec(config, n), f"bench {config}", Path.cwd())


def bench_requests(config: str, n: int) -> Iterator[tuple[float, int, int]]:
    """``(arrival_s, prompt_tokens, output_tokens)`` of each request the run of
    ``config`` with ``n`` requests serves: the simulation's own stream, less
    the requests it rejects at arrival for the model's context (prompt +
    output over ``max_model_len``; truncated instead under ``engine.oversized:
    truncate``, as the run does). A peer handed these serves what the twin
    serves, so a ratio compares like with like."""
    from twin.sim.simulation import Simulation, truncate
    from twin.workload.stream import iter_requests

    sim = Simulation(_resolved(config, n))
    limit = sim.spec.max_model_len
    for req in iter_requests(sim.spec.workload, sim.rng_workload):
        if limit is not None and req.prompt_tokens + req.output_tokens > limit:
            if sim.spec.oversized != "truncate":
                continue
            req = truncate(req, limit)
        yield req.arrival_s, req.prompt_tokens, req.output_tokens


def write_requests_csv(rows: Iterable[tuple[float, int, int]], out: IO[str]) -> int:
    """One CSV row per request; ``arrival_s`` as ``repr`` of the float, so it
    reads back exactly. Returns the number of rows."""
    w = csv.writer(out, lineterminator="\n")
    w.writerow(REQUEST_CSV_COLUMNS)
    count = 0
    for t, p, o in rows:
        w.writerow((repr(t), p, o))
        count += 1
    return count


def run_one(config: str, n: int) -> dict[str, Any]:
    """One run in this process (the child's work): its counts, no timing."""
    from twin.sim.simulation import Simulation

    sim = Simulation(_resolved(config, n))
    result = sim.run()
    return {
        "requests": result.summary["requests"],
        "completed": result.summary["completed"],
        "events": sim.events,
        "iterations": sum(e.iterations for e in sim.engines),
        "simulated_s": result.summary["simulated_s"],
    }


# -- measuring a child process -------------------------------------------------------------
@dataclass(frozen=True)
class Usage:
    """What one finished child cost: CPU (user + system) and wall seconds, and
    its peak resident memory in MiB (the largest of it and the processes it
    waited for)."""

    cpu_s: float
    wall_s: float
    rss_mib: float
    stdout: str


# Linux keeps a process's peak RSS across fork and exec: a child forked from
# this process (which has imported the twin and, for --vs, drawn the requests)
# would report this process's peak as its own floor. So a bare interpreter
# (``python -S``, no site) starts each measured command and reports its
# ``os.wait4`` figures; the floor is then that interpreter's own few MiB.
_MEASURER = """
import json, os, sys, time
argv = json.loads(sys.argv[1])
t0 = time.perf_counter()
pid = os.posix_spawnp(argv[0], argv, os.environ)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
with open(sys.argv[2], "w") as f:
    json.dump({"status": os.waitstatus_to_exitcode(status), "wall_s": wall,
               "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kib": ru.ru_maxrss}, f)
"""


def _measure(argv: list[str], env: dict[str, str] | None, what: str) -> Usage:
    """Run ``argv`` to its end; its resource usage from ``os.wait4`` in the
    bare interpreter that started it (user + system seconds of it and of every
    process it waited for; its peak RSS, or the largest of theirs)."""
    with (
        tempfile.TemporaryDirectory(prefix="twin-bench-m-") as tmp,
        open(Path(tmp) / "out", "w+b") as out,
        open(Path(tmp) / "err", "w+b") as err,
    ):
        report = Path(tmp) / "usage.json"
        measurer = [sys.executable, "-S", "-c", _MEASURER, json.dumps(argv), str(report)]
        rc = subprocess.call(measurer, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
        if rc != 0 or not report.is_file():
            tail = stderr.strip().splitlines()[-1:]
            raise TwinError(f"{what}: could not be started: {tail[0] if tail else rc}")
        u = json.loads(read_text(report))
    if u["status"] != 0:
        tail = stderr.strip().splitlines()[-1:]
        why = tail[0] if tail else "no message"
        raise TwinError(f"{what} exited with status {u['status']}: {why}")
    # Linux reports ru_maxrss in KiB
    return Usage(u["cpu_s"], u["wall_s"], u["maxrss_kib"] / 1024.0, stdout)


def _child_env() -> dict[str, str]:
    """This environment, with the twin this process imported first on the path
    (the folder that holds this module's package, twin/)."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def measure_twin(config: str, n: int) -> dict[str, Any]:
    """One run of ``config`` with ``n`` requests in a fresh child process."""
    argv = [sys.executable, "-m", "twin.studies.bench", config, str(n)]
    u = _measure(argv, _child_env(), f"twin bench: {config} with {n} requests")
    counts = json.loads(u.stdout)
    return {**counts, "cpu_s": u.cpu_s, "wall_s": u.wall_s, "rss_mib": u.rss_mib}


def vs_command(template: str, requests_csv: Path, n: int, config: str) -> str:
    """``template`` with its placeholders filled (the path shell-quoted)."""
    return (
        template.replace("{requests_csv}", shlex.quote(str(requests_csv)))
        .replace("{n}", str(n))
        .replace("{config}", config)
    )


def measure_command(command: str) -> dict[str, Any]:
    """One run of a shell command line; its output is not kept."""
    u = _measure(["/bin/sh", "-c", command], user_env(), f"--vs: {command!r}")
    return {"cpu_s": u.cpu_s, "wall_s": u.wall_s, "rss_mib": u.rss_mib}


# -- the table -----------------------------------------------------------------------------
def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def summarize(config: str, n: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the runs of one (configuration, size): medians of the
    measured figures, the counts (identical in every run) per request."""
    first = runs[0]
    for r in runs[1:]:
        if (r["events"], r["iterations"]) != (first["events"], first["iterations"]):
            raise TwinError(f"twin bench: {config} with {n} requests is not deterministic")
    req = first["requests"]
    cpu = _median(runs, "cpu_s")
    return {
        "config": config,
        "size": n,
        "requests": req,
        "completed": first["completed"],
        "runs": len(runs),
        "cpu_s": cpu,
        "wall_s": _median(runs, "wall_s"),
        "cpu_us_per_request": cpu / req * 1e6,
        "events_per_request": first["events"] / req,
        "iterations_per_request": first["iterations"] / req,
        "events": first["events"],
        "iterations": first["iterations"],
        "rss_mib": _median(runs, "rss_mib"),
        "simulated_s": first["simulated_s"],
    }


def _vs_row(
    a_runs: list[dict[str, Any]], b_runs: list[dict[str, Any]], template: str, command: str
) -> dict[str, Any]:
    pairs = list(zip(a_runs, b_runs, strict=True))

    def ratio(key: str) -> float | None:
        if any(a[key] <= 0 for a, _ in pairs):
            return None
        return statistics.median(b[key] / a[key] for a, b in pairs)

    return {
        "template": template,
        "command": command,
        "pairs": len(pairs),
        "cpu_s": _median(b_runs, "cpu_s"),
        "wall_s": _median(b_runs, "wall_s"),
        "rss_mib": _median(b_runs, "rss_mib"),
        "cpu_ratio": ratio("cpu_s"),
        "wall_ratio": ratio("wall_s"),
        "runs": b_runs,
    }


def bench(
    sizes: list[int],
    configs: list[str],
    repeat: int,
    vs: str | None = None,
) -> list[dict[str, Any]]:
    """The rows of ``twin bench``: per size, per configuration, twin's figures
    and, with ``vs``, the other command's beside them."""
    if repeat < 1:
        raise TwinError(f"--repeat: {repeat} must be >= 1")
    if vs is not None and not vs.strip():
        raise TwinError("--vs: the command is empty")
    rows = []
    # a unit is one measured run (twin's, or the --vs command's); the bar is drawn
    # between them, never while one is measured
    total = len(sizes) * len(configs) * repeat * (1 if vs is None else 2)
    with (
        tempfile.TemporaryDirectory(prefix="twin-bench-") as tmp,
        Progress(total, "runs", desc="bench") as bar,
    ):
        for n in sizes:
            for config in configs:
                if vs is None:
                    runs = []
                    for _ in range(repeat):
                        runs.append(measure_twin(config, n))
                        bar.update()
                    rows.append({**summarize(config, n, runs), "raw": runs})
                    continue
                path = Path(tmp) / f"requests-{config}-{n}.csv"
                with open(path, "w", encoding="utf-8", newline="") as f:
                    handed = write_requests_csv(bench_requests(config, n), f)
                command = vs_command(vs, path, handed, config)
                a_runs, b_runs = [], []
                for _ in range(repeat):  # A B A B ...
                    a_runs.append(measure_twin(config, n))
                    bar.update()
                    b_runs.append(measure_command(command))
                    bar.update()
                row = summarize(config, n, a_runs)
                v = {**_vs_row(a_runs, b_runs, vs, command), "requests": handed}
                rows.append({**row, "raw": a_runs, "vs": v})
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'config':<10}{'requests':>10}{'CPU s':>9}{'wall s':>9}{'CPU us/req':>12}"
        f"{'events/req':>12}{'iter/req':>10}{'peak MiB':>10}{'sim s':>9}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['config']:<10}{r['requests']:>10,}{r['cpu_s']:>9.2f}{r['wall_s']:>9.2f}"
            f"{r['cpu_us_per_request']:>12.1f}{r['events_per_request']:>12.2f}"
            f"{r['iterations_per_request']:>10.2f}{r['rss_mib']:>10.1f}{r['simulated_s']:>9.0f}"
        )
    versus = [r for r in rows if "vs" in r]
    if versus:
        lines.append("")
        lines.append(
            f"{'config':<10}{'requests':>10}{'pairs':>7}{'A CPU s':>9}{'B CPU s':>9}"
            f"{'B/A CPU':>9}{'A wall s':>10}{'B wall s':>10}{'B/A wall':>10}{'B MiB':>8}"
        )
        for r in versus:
            v = r["vs"]
            cr = "-" if v["cpu_ratio"] is None else f"{v['cpu_ratio']:.2f}x"
            wr = "-" if v["wall_ratio"] is None else f"{v['wall_ratio']:.2f}x"
            lines.append(
                f"{r['config']:<10}{r['requests']:>10,}{v['pairs']:>7}{r['cpu_s']:>9.2f}"
                f"{v['cpu_s']:>9.2f}{cr:>9}{r['wall_s']:>10.2f}{v['wall_s']:>10.2f}{wr:>10}"
                f"{v['rss_mib']:>8.1f}"
            )
        for r in versus:
            if r["vs"]["requests"] != r["requests"]:
                lines.append(
                    f"{r['config']} {r['requests']:,}: B was handed the "
                    f"{r['vs']['requests']:,} requests within the model's context; "
                    f"the other {r['requests'] - r['vs']['requests']:,} are rejected by "
                    "the twin at arrival (context_length)"
                )
        lines.append(f"B: {versus[0]['vs']['template']}")
    return "\n".join(lines)


def _main(argv: list[str]) -> int:
    one_blas_thread()  # as ``twin run`` does
    if len(argv) != 2:
        print("usage: python -m twin.studies.bench CONFIG N", file=sys.stderr)
        return 2
    print(json.dumps(run_one(argv[0], int(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
