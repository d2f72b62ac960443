"""``twin bench``: how fast the twin runs and how much memory it takes.

Replays the Azure LLM inference 2023 conversation trace, looped to reach each
request count, on a colocated cluster of 4 instances of Llama-2-70B TP8 on
H100, and reports per size the wall seconds, simulated requests per wall
second, SimPy events per second and peak resident memory. Each size runs in a
fresh process so that its peak memory is its own.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from twin.errors import TwinError

TRACE = Path("traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv")


def bench_spec(trace: Path, requests: int) -> dict[str, Any]:
    return {
        "name": f"bench-{requests}",
        "model": "llama-2-70b",
        "gpu": "h100-sxm",
        "cluster": {"instances": 4, "tp": 8},
        "scheduler": {"name": "colocated", "routing": "least_loaded"},
        "workload": {
            "trace": str(trace),
            "format": "azure",
            "repeat": True,
            "max_requests": requests,
        },
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }


def run_one(trace: Path, requests: int) -> dict[str, Any]:
    """Run one size in this process; wall time covers building and running."""
    from twin.sim.simulation import Simulation
    from twin.sim.spec import resolve_spec

    t0 = time.perf_counter()
    spec = resolve_spec(bench_spec(trace, requests), "bench", Path.cwd())
    sim = Simulation(spec)
    result = sim.run()
    wall = time.perf_counter() - t0
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "requests": result.summary["requests"],
        "wall_s": wall,
        "events": sim.events,
        "rss_mib": rss_kib / 1024.0,
        "simulated_s": result.summary["simulated_s"],
    }


def resolve_trace(trace: str | None, data: str | None) -> Path:
    if trace:
        path = Path(trace)
    else:
        from twin.perf.validate import find_data_dir

        path = find_data_dir(data) / TRACE
    if not path.is_file():
        raise TwinError(f"{path}: Azure conversation trace not found; pass --trace PATH")
    return path


def run_bench(sizes: list[int], trace: str | None, data: str | None) -> str:
    path = resolve_trace(trace, data)
    rows = []
    for n in sizes:
        if n <= 0:
            raise TwinError(f"twin bench: --sizes: {n} must be > 0")
        out = subprocess.run(
            [sys.executable, "-m", "twin.studies.bench", str(path), str(n)],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise TwinError(f"twin bench: size {n} failed: {out.stderr.strip().splitlines()[-1:]}")
        rows.append(json.loads(out.stdout))
    lines = [
        f"{'requests':>10}{'wall s':>10}{'req/s':>12}{'events/s':>12}"
        f"{'peak RSS MiB':>14}{'sim s':>10}",
    ]
    for r in rows:
        lines.append(
            f"{r['requests']:>10,}{r['wall_s']:>10.2f}{r['requests'] / r['wall_s']:>12,.0f}"
            f"{r['events'] / r['wall_s']:>12,.0f}{r['rss_mib']:>14.1f}{r['simulated_s']:>10.0f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(run_one(Path(sys.argv[1]), int(sys.argv[2]))))
