"""Transcribe a kernel table (``twin/data/kernels_<gpu>.json``) from NVIDIA AIConfigurator's
measured per-system kernel data, and fit a GPU's shares of peak to it
(:func:`twin.perf.kernel_fit.fit_kernels`).

``python -m twin.studies.kernel_table GPU`` fits the catalog GPU ``GPU``'s bundled table
(``twin/data/kernels_<GPU>.json``) and prints the fitted ``mfu``, ``mbu``, ``attn_mfu`` and
``hop_latency_s``, each group's error at them and at the GPU's preset
(:data:`twin.perf.presets.GPU_EFFICIENCY`). With ``--aic SYSTEM_DIR`` it reads
AIConfigurator's folder instead (``aic-core/src/aiconfigurator_core/systems/data/<system>``;
needs pandas and pyarrow, the ``data`` extra) and keeps the rows :data:`SELECTION` names;
``--write PATH`` then writes them (shapes and times only, with their source) as a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from twin.errors import TwinError
from twin.perf.gpus import GPUSpec, get_gpu
from twin.perf.kernel_fit import (
    KernelEfficiency,
    KernelPoint,
    bundled_points,
    fit_kernels,
    points_from_table,
    score,
)
from twin.perf.presets import FP8_GEMM_SHARE, GPU_EFFICIENCY

# The tables read, relative to the system folder, and which rows are kept: the vLLM 0.14.0
# collection (the serving engine the Roofline's default preset describes) in BF16 (FP8 GEMMs
# scored only), at the shapes a dense model's layer runs per GPU.
GEMM = "gemm/vllm/0.14.0/gemm_perf.parquet"
PREFILL = "attention/vllm/0.14.0/context_attention_perf.parquet"
DECODE = "attention/vllm/0.14.0/generation_attention_perf.parquet"
VLLM_AR = "comm/vllm/0.14.0/custom_allreduce_perf.parquet"
NCCL_AR = "comm/nccl/2.27.3/nccl_perf.parquet"
GEMM_DIMS = (4096, 8192, 16384)
GEMM_TOKENS = (1, 2, 4, 8, 16, 64, 256, 512, 1024, 2048, 4096, 8192)
# (heads, KV heads) per GPU: Llama-3.1-8B at TP 1 (fitted), and held out: TP 2, TP 4, and
# Llama-3.1-70B at TP 1
HEADS = ((32, 8), (16, 4), (8, 2), (64, 8))
PREFILL_ISL = (1024, 2048, 4096, 8192, 16384)
PREFILL_BATCH = (1, 4)
# decode attention: kept where the K and V read exceed 256 MB, well past the 96 MB L2 of the
# full AD102 die (NVIDIA Ada GPU architecture whitepaper, 2023), so each point streams from
# device memory as a serving step does (smaller ones read back from L2 in a repeated benchmark)
DECODE_MIN_BYTES = 256 * 2**20
AR_BYTES = (128, 256, 512, 1024, 2048, 4096, 8192, 524288, 4194304, 33554432)
SELECTION = {
    "gemm": f"{GEMM}: vllm_default, bfloat16 m in {GEMM_TOKENS} and n, k in {GEMM_DIMS} "
            f"(held out: n != k); fp8 the same shapes (held out: n != k)",
    "prefill-attention": f"{PREFILL}: vllm_flash_attn, BF16 KV, head_dim 128, batch in "
                         f"{PREFILL_BATCH}, isl in {PREFILL_ISL}, (heads, KV heads) in {HEADS} "
                         "(held out: all but (32, 8))",
    "decode-attention": f"{DECODE}: vllm_flash_attn, BF16 KV, head_dim 128, (heads, KV heads) "
                        f"in {HEADS} (held out: all but (32, 8)), context = isl + step, K and "
                        f"V bytes >= {DECODE_MIN_BYTES}",
    "all-reduce": f"{VLLM_AR}: vllm_graph (fitted) and {NCCL_AR}: all_reduce half (held "
                  f"out), TP 2, 4, 8, messages of {AR_BYTES} bytes",
}  # fmt: skip


def _cell(v: Any) -> Any:
    v = v.item() if hasattr(v, "item") else v
    return float(f"{v:.5g}") if isinstance(v, float) else v


def _rows(frame: Any, cols: list[str]) -> list[list[Any]]:
    return [[_cell(v) for v in row] for row in frame[cols].values]


def read_system(system_dir: Path) -> dict[str, list[list[Any]]]:
    """The kept rows of AIConfigurator's tables under ``system_dir`` (see :data:`SELECTION`),
    in the layout :func:`twin.perf.kernel_fit.points_from_table` reads."""
    import pandas as pd

    g = pd.read_parquet(system_dir / GEMM)
    g = g[g.kernel_source == "vllm_default"]
    bf = g[(g.gemm_dtype == "bfloat16") & g.m.isin(GEMM_TOKENS) & g.n.isin(GEMM_DIMS)
           & g.k.isin(GEMM_DIMS)].assign(held=lambda d: d.n != d.k)  # fmt: skip
    f8 = g[(g.gemm_dtype == "fp8") & g.m.isin(GEMM_TOKENS) & g.n.isin(GEMM_DIMS)
           & g.k.isin(GEMM_DIMS)].assign(held=lambda d: d.n != d.k)  # fmt: skip
    gemm_cols = ["gemm_dtype", "m", "n", "k", "latency", "held"]
    out: dict[str, list[list[Any]]] = {"gemm": _rows(bf, gemm_cols) + _rows(f8, gemm_cols)}
    attn_cols = ["batch_size", "n", "num_heads", "num_key_value_heads", "head_dim", "latency",
                 "held"]  # fmt: skip
    for kind, path in (("prefill-attention", PREFILL), ("decode-attention", DECODE)):
        a = pd.read_parquet(system_dir / path)
        a = a[(a.kernel_source == "vllm_flash_attn") & (a.kv_cache_dtype == "bfloat16")
              & (a.head_dim == 128)]  # fmt: skip
        heads = list(zip(a.num_heads, a.num_key_value_heads, strict=True))
        a = a[[h in HEADS for h in heads]]
        a = a.assign(held=(a.num_heads != 32) | (a.num_key_value_heads != 8))
        if kind == "prefill-attention":
            a = a[a.batch_size.isin(PREFILL_BATCH) & a.isl.isin(PREFILL_ISL)].assign(n=a.isl)
        else:
            a = a.assign(n=a.isl + a.step)
            a = a[a.batch_size * a.n * 4 * a.num_key_value_heads * a.head_dim >= DECODE_MIN_BYTES]
        out[kind] = _rows(a.sort_values(attn_cols[:5]), attn_cols)
    v = pd.read_parquet(system_dir / VLLM_AR)
    v = v[(v.backend == "vllm_graph") & v.message_size.isin(AR_BYTES)]
    n = pd.read_parquet(system_dir / NCCL_AR)
    n = n[(n.op_name == "all_reduce") & (n.nccl_dtype == "half") & n.message_size.isin(AR_BYTES)]
    ar_cols = ["lib", "num_gpus", "message_size", "latency", "held"]
    out["all-reduce"] = (_rows(v.assign(lib="vllm-custom", held=False), ar_cols)
                         + _rows(n.assign(lib="nccl", held=True), ar_cols))  # fmt: skip
    return out


def _dump(doc: dict[str, Any]) -> str:
    """``doc`` as JSON, one table row a line."""
    lines = ["{"]
    for i, (key, value) in enumerate(doc.items()):
        end = "," if i < len(doc) - 1 else ""
        if isinstance(value, list):
            rows = ",\n  ".join(json.dumps(r) for r in value)
            lines.append(f" {json.dumps(key)}: [\n  {rows}\n ]{end}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, indent=1)}{end}")
    return "\n".join(lines) + "\n}\n"


def _print_scores(points: list[KernelPoint], gpu: GPUSpec, eff: KernelEfficiency) -> None:
    for s in score(points, gpu, eff):
        print(f"  {s.group:18s} {'fitted' if s.fitted else 'held out':8s} n={s.count:4d}  "
              f"median {s.median:6.1%}  worst {s.worst:6.1%}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m twin.studies.kernel_table", description=__doc__)
    ap.add_argument("gpu")
    ap.add_argument("--aic", type=Path, help="an AIConfigurator system data folder to read")
    ap.add_argument("--write", type=Path, help="with --aic: write the kept rows as a table")
    ap.add_argument("--commit", default="", help="the AIConfigurator commit read, for --write")
    a = ap.parse_args(argv)
    try:
        gpu = get_gpu(a.gpu)
        if a.aic is None:
            points = bundled_points(gpu.name)
        else:
            table = read_system(a.aic)
            points = points_from_table(table, str(a.aic))
        eff = fit_kernels(points, gpu)
    except (TwinError, OSError, ImportError) as e:
        print(f"twin: error: {e}", file=sys.stderr)
        return 2
    fp8 = f"  fp8_mfu {eff.fp8_mfu:.3f}" if eff.fp8_mfu is not None else ""
    print(f"{gpu.name}, fitted: mfu {eff.mfu:.3f}  mbu {eff.mbu:.3f}  attn_mfu {eff.attn_mfu:.3f}"
          f"  hop_latency_s {eff.hop_latency_s:.3g}{fp8}")  # fmt: skip
    _print_scores(points, gpu, eff)
    if gpu.name in GPU_EFFICIENCY:
        mfu, mbu, attn, *_, hop = GPU_EFFICIENCY[gpu.name]
        fp8_mfu = mfu * FP8_GEMM_SHARE.get(gpu.name, 1.0)
        preset = KernelEfficiency(mfu, mbu, attn, hop, fp8_mfu)
        print(f"{gpu.name}, preset: mfu {mfu:.3f}  mbu {mbu:.3f}  attn_mfu {attn:.3f}"
              f"  hop_latency_s {hop:.3g}  fp8_mfu {fp8_mfu:.3f}")  # fmt: skip
        _print_scores(points, gpu, preset)
    if a.write and a.aic is not None:
        doc = {
            "about": "Measured single-kernel times (ms) on one GPU, transcribed from NVIDIA "
                     "AIConfigurator's per-system data (Apache-2.0) by "
                     "python -m twin.studies.kernel_table; the layout is "
                     "twin.perf.kernel_fit.points_from_table's; the last column marks the rows "
                     "the fit leaves out.",
            "source": {"repo": "ai-dynamo/aiconfigurator", "commit": a.commit,
                       "license": "Apache-2.0",
                       "path": "aic-core/src/aiconfigurator_core/systems/data/" + a.aic.name,
                       "device": gpu.name, "selection": SELECTION},
            **table,
        }  # fmt: skip
        a.write.write_text(_dump(doc), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
