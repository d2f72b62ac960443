"""The examples that end each command's ``--help``."""

from __future__ import annotations

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
    "spec": (
        "twin spec disagg --set cluster.nodes=2",
        "twin spec classes --entry priority --set 'workload.classes[0].share=0.5'",
        "twin spec --schema",
    ),
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
