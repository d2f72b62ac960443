"""Write the measured outputs the documentation pages show (Fidelity, Speed, guides).

Each entry of :data:`MEASURED` is a command a reader can run from the
repository root (the public data at ``../shared/data``); this script runs it
and writes ``docs/data/NAME.txt``: the command on its first line (``$ ...``),
then what it printed. A page shows the file with ``<!-- twin:include
docs/data/NAME.txt -->``, so its figures are those the command printed, never
retyped; ``tests/test_docs_measured.py`` holds each page, file and command to
one another.

    python docs/measure.py            # every entry
    python docs/measure.py bench      # some
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data"

MEASURED: dict[str, str] = {
    "validate-perf": "twin validate perf --data ../shared/data",
    "validate-perf-azure-conv": "twin validate perf --data ../shared/data --workload azure-conv",
    "validate-perf-azure-code": "twin validate perf --data ../shared/data --workload azure-code",
    "validate-perf-mooncake": "twin validate perf --data ../shared/data --workload mooncake",
    "validate-perf-held-out": "twin validate perf --held-out --data ../shared/data",
    "kernel-fit-l40s": "python -m twin.studies.kernel_table l40s",
    "splitwise-isopower": "twin goodput splitwise-isopower --seeds 1 -j 2 --no-plots",
    "bench": "twin bench --sizes 10k,100k",
    "speculative-1": "twin run speculative",
    "speculative-24": "twin run speculative --set workload.arrival.rate=24",
    "speculative-48": "twin run speculative --set workload.arrival.rate=48",
    "classes": "twin run classes",
    "fabric-aware": "twin run fabric-aware",
    "sessions": "twin run sessions",
    "compare-azure-conv": "twin run compare-azure-conv",
    "compare-mooncake": "twin run compare-mooncake",
    "compare-kv-tiers": "twin run compare-kv-tiers",
    "compare-kv-tiers-remote": "twin run compare-kv-tiers --only round-robin,round-robin+tiers"
    " --set cluster.nodes=5 --set 'kv_tiers.remote={capacity: 10 TB, node: 4}'",
    "deepseek-wide-ep": "twin run deepseek-wide-ep",
    "deepseek-wide-ep-fp8": "twin run deepseek-wide-ep"
    " --set 'perf={kind: roofline, moe_dispatch_dtype: fp8, moe_dispatch_nodes: 4}'",
    "deepseek-wide-ep-two-batch": "twin run deepseek-wide-ep --only disagg --set 'perf={kind:"
    " roofline, moe_dispatch_dtype: fp8, moe_dispatch_nodes: 4, moe_overlap: two-batch}'",
    "deepseek-wide-ep-two-batch-32": "twin run deepseek-wide-ep --only disagg --set 'perf={kind:"
    " roofline, moe_dispatch_dtype: fp8, moe_dispatch_nodes: 4, moe_overlap: two-batch,"
    " moe_overlap_min_tokens: 32}'",
    "diurnal-autoscale": "twin run diurnal-autoscale",
    "handoff-llama-2-70b": "twin handoff llama-2-70b --tokens 4096 --topology dgx-h100-ib400"
    " --tp 8",
    "handoff-llama-2-70b-block": "twin handoff llama-2-70b --tokens 4096 --topology"
    " dgx-h100-ib400 --tp 8 --descriptors block",
    "handoff-llama-3.1-70b-multi-nic": "twin handoff llama-3.1-70b --tokens 131072 --topology"
    " h100-roce-8x400 --tp 8 --multi-nic",
    "validate-replay-h100-tp8": "twin validate replay docs/examples/replay-h100-tp8.yaml",
    "azure-conv-x2": "twin run azure-conv --set workload.rate_scale=2",
    "azure-conv-x2-steps": "twin run azure-conv --set workload.rate_scale=2 --set"
    " 'workload.rate_schedule={kind: steps, points: [[0 s, 1.0], [10 min, 2.0], [20 min, 1.0]]}'",
    "diurnal": "twin run diurnal",
    "diurnal-flat": "twin run diurnal --set workload.rate_schedule=null",
    "disagg": "twin run disagg",
    "disagg-roce-4x200": "twin run disagg --set cluster.topology=h100-roce-4x200",
    "disagg-ethernet-25g": "twin run disagg --set 'cluster.topology={node: {gpu: h100-sxm,"
    " gpus: 8, nics: {count: 1, kind: ethernet, bandwidth: 25 Gbps}}, nodes: 4}'",
    "goodput-classes-fcfs": "twin goodput classes --set compare=null --set"
    " engine.queue_policy=fcfs --seeds 1 --sample 1000 -j 2 --no-plots",
    "goodput-classes-priority": "twin goodput classes --set compare=null --set"
    " engine.queue_policy=priority --seeds 1 --sample 1000 -j 2 --no-plots",
    "pp-decode": "twin run docs/examples/pp-decode.yaml",
    "pp-decode-pp1": "twin run docs/examples/pp-decode.yaml --set cluster.decode.pp=1",
    "moe-fidelity": "python -m twin.studies.moe_fidelity",
    "provision-disagg-convergence": "twin provision disagg --convergence 250,500,1000,2000 -j 2",
    "plan-disagg-convergence": "twin plan disagg --set cluster.nodes=2"
    " --convergence 250,500,1000,2000 -j 2",
    "plan-disagg-nodes2": "twin plan disagg --set cluster.nodes=2 -j 2",
    "plan-disagg-export-dynamo": "twin plan disagg --sample 100 --replicates 1 --export-dynamo -",
    "provision-deepseek-wide-ep": "twin provision deepseek-wide-ep --gpus 48 --sample 20"
    " --replicates 1",
    "multi-model": "twin run multi-model",
}


def measure(name: str) -> Path:
    """Run ``MEASURED[name]`` and write its output under ``docs/data``."""
    command = MEASURED[name]
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    p = subprocess.run(
        shlex.split(command), cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    if p.returncode != 0:
        raise SystemExit(f"{command}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
    DATA.mkdir(exist_ok=True)
    out = DATA / f"{name}.txt"
    out.write_text(f"$ {command}\n{p.stdout.rstrip()}\n", encoding="utf-8")
    return out


def main(names: list[str]) -> int:
    for name in names or list(MEASURED):
        if name not in MEASURED:
            raise SystemExit(f"measure.py: unknown entry {name!r}; known: {', '.join(MEASURED)}")
        print(measure(name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
