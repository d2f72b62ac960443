"""A GPU's shares of peak fitted to measured single-kernel times, priced as the Roofline
prices each kind of kernel.

For a GPU with no measured whole-iteration profile in reach, its efficiencies come from a
kernel table (``twin/data/kernels_<gpu>.json``: measured GEMMs, prefill and decode attention
kernels and all-reduces, each row with the shape it ran; the file names its source). Each
kernel is priced with the Roofline's own terms (:func:`price`):

- a weight GEMM of ``m`` tokens by an ``n x k`` weight: the larger of ``2 m n k`` FLOPs at
  ``mfu`` of the BF16 peak (an FP8 GEMM at ``fp8_mfu`` of the FP8 peak, as
  :func:`twin.perf.roofline.fp8_gemm_ratio` prices it) and the weights read at ``mbu`` of the
  memory bandwidth (:meth:`twin.perf.roofline.Roofline.gemm_time`);
- an attention kernel: the larger of ``4 x heads x head_dim x A`` FLOPs at ``attn_mfu``
  (``A = n (n + 1) / 2`` for a prompt of ``n`` tokens, the context length for a decode step)
  and the K and V bytes it reads or writes at ``mbu``;
- an all-reduce of ``B`` bytes over ``tp`` GPUs: ``2 (tp - 1) / tp x B / link + 2 (tp - 1) x
  hop_latency_s`` (the link: NVLink, else PCIe).

:func:`fit_kernels` fits each share as the geometric mean of what the fitted points reach
(least squares of the log error of a one-term price): ``mfu`` over the BF16 GEMMs whose FLOPs
at peak take at least :data:`COMPUTE_BOUND` times their weight reads, ``mbu`` over the BF16
GEMMs whose weight reads take at least :data:`MEMORY_BOUND` times their FLOPs and over the
decode attention kernels, ``fp8_mfu`` over the FP8 GEMMs compute-bound at the FP8 peak (the
same bound), ``attn_mfu`` over the prefill attention kernels, ``hop_latency_s``
over the all-reduces of at most :data:`LATENCY_BOUND_BYTES` (their bandwidth term taken off).
Rows marked ``held_out`` are never fitted; GEMMs between the two bounds (the ramp from
weight-bound to compute-bound, where the roofline has a corner and the kernels a curve), FP8
GEMMs that are not compute-bound and bigger all-reduces are scored only.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

from twin.bundled import package_text
from twin.errors import SpecError, UnknownNameError
from twin.perf.gpus import GPUSpec

# A BF16 GEMM is fitted for mfu when its FLOPs at peak take at least this many times its
# weight reads at peak, and for mbu when its weight reads take at least MEMORY_BOUND times its
# FLOPs: clear of the corner, where neither share alone sets the time.
COMPUTE_BOUND = 2.0
MEMORY_BOUND = 16.0
# An all-reduce of at most this many bytes is fitted for hop_latency_s (its link time is a
# few percent of it at PCIe rates); bigger ones are scored only.
LATENCY_BOUND_BYTES = 8192
KINDS = ("gemm", "prefill-attention", "decode-attention", "all-reduce")


@dataclass(frozen=True, slots=True)
class KernelPoint:
    """One measured kernel: its ``kind`` (one of :data:`KINDS`), FLOPs, the bytes priced at
    ``mbu`` (GEMMs: weights; attention: K and V) or, for an all-reduce, its message bytes;
    ``tp`` (all-reduces), ``fp8`` (an FP8 GEMM), measured ``seconds``, whether the fit must
    leave it out (``held_out``) and a ``label`` naming its shape."""

    kind: str
    flops: float
    bytes: float
    seconds: float
    label: str
    tp: int = 1
    fp8: bool = False
    held_out: bool = False


@dataclass(frozen=True, slots=True)
class KernelEfficiency:
    """The GPU terms a kernel table fits (the Roofline's ``mfu``, ``mbu``, ``attn_mfu`` and
    ``hop_latency_s``, and ``fp8_mfu``, the FP8 GEMMs' share of the FP8 peak: None prices
    them at ``mfu``, the datasheet's ratio of the two peaks)."""

    mfu: float
    mbu: float
    attn_mfu: float
    hop_latency_s: float
    fp8_mfu: float | None = None


def _link(gpu: GPUSpec) -> float:
    return gpu.nvlink_bytes_s if gpu.nvlink_bytes_s > 0 else gpu.pcie_bytes_s


def _peak(p: KernelPoint, gpu: GPUSpec) -> float:
    return gpu.flops_fp8 if p.fp8 and gpu.flops_fp8 > 0 else gpu.flops_bf16


def price(p: KernelPoint, gpu: GPUSpec, eff: KernelEfficiency) -> float:
    """Seconds the Roofline's terms give kernel ``p`` on ``gpu`` at ``eff``."""
    if p.kind == "all-reduce":
        hops = 2 * (p.tp - 1)
        return hops / p.tp * p.bytes / _link(gpu) + hops * eff.hop_latency_s
    if p.kind != "gemm":
        share = eff.attn_mfu
    elif p.fp8 and eff.fp8_mfu is not None:
        share = eff.fp8_mfu
    else:
        share = eff.mfu
    return max(p.flops / (_peak(p, gpu) * share), p.bytes / (gpu.hbm_bytes_s * eff.mbu))


def regime(p: KernelPoint, gpu: GPUSpec) -> str:
    """``"compute"``, ``"memory"`` or ``"ramp"`` for a GEMM (see :data:`COMPUTE_BOUND`),
    and, prefixed ``"fp8-"``, for an FP8 GEMM (its FLOPs at the FP8 peak, its weights one byte
    each), ``"all-reduce-bw"`` for an all-reduce of more than :data:`LATENCY_BOUND_BYTES`, else
    its kind."""
    if p.kind == "all-reduce":
        return "all-reduce" if p.bytes <= LATENCY_BOUND_BYTES else "all-reduce-bw"
    if p.kind != "gemm":
        return p.kind
    ratio = (p.flops / _peak(p, gpu)) / (p.bytes / gpu.hbm_bytes_s)
    prefix = "fp8-" if p.fp8 else ""
    if ratio >= COMPUTE_BOUND:
        return prefix + "compute"
    return prefix + ("memory" if ratio <= 1.0 / MEMORY_BOUND else "ramp")


def _geomean(values: Sequence[float], what: str) -> float:
    if not values:
        raise SpecError(f"kernel table: no fitted point for {what}")
    return math.exp(statistics.fmean(math.log(v) for v in values))


def fit_kernels(points: Iterable[KernelPoint], gpu: GPUSpec) -> KernelEfficiency:
    """``mfu``, ``mbu``, ``attn_mfu`` and ``hop_latency_s`` fitted to the points not
    ``held_out`` (see the module's docstring); raises :class:`SpecError` when a term has no
    point to fit, or an all-reduce is faster than its bandwidth term."""
    by: dict[str, list[float]] = {"compute": [], "memory": [], "attn": [], "hop": [], "fp8": []}
    for p in points:
        if p.held_out:
            continue
        r = regime(p, gpu)
        if r == "compute":
            by["compute"].append(p.flops / gpu.flops_bf16 / p.seconds)
        elif r == "fp8-compute":
            by["fp8"].append(p.flops / _peak(p, gpu) / p.seconds)
        elif r in ("memory", "decode-attention"):
            by["memory"].append(p.bytes / gpu.hbm_bytes_s / p.seconds)
        elif r == "prefill-attention":
            by["attn"].append(p.flops / gpu.flops_bf16 / p.seconds)
        elif r == "all-reduce":
            hops = 2 * (p.tp - 1)
            left = p.seconds - hops / p.tp * p.bytes / _link(gpu)
            if left <= 0:
                raise SpecError(f"kernel table: {p.label}: faster than its link allows")
            by["hop"].append(left / hops)
    return KernelEfficiency(
        mfu=_geomean(by["compute"], "mfu"),
        mbu=_geomean(by["memory"], "mbu"),
        attn_mfu=_geomean(by["attn"], "attn_mfu"),
        hop_latency_s=_geomean(by["hop"], "hop_latency_s"),
        fp8_mfu=_geomean(by["fp8"], "fp8_mfu") if by["fp8"] else None,
    )


_SCORED_ONLY = ("ramp", "fp8-ramp", "fp8-memory", "all-reduce-bw")


@dataclass(frozen=True, slots=True)
class Score:
    """Absolute relative errors of one group of points: how many, their median and worst."""

    group: str
    fitted: bool
    count: int
    median: float
    worst: float


def score(points: Iterable[KernelPoint], gpu: GPUSpec, eff: KernelEfficiency) -> list[Score]:
    """Per regime (:func:`regime`), fitted points and held-out ones apart, the absolute
    relative error of :func:`price` against the measured time; the ramps, FP8 GEMMs that are
    not compute-bound and all-reduces past :data:`LATENCY_BOUND_BYTES` count as held out
    (never fitted)."""
    errs: dict[tuple[str, bool], list[float]] = {}
    for p in points:
        r = regime(p, gpu)
        fitted = not p.held_out and r not in _SCORED_ONLY
        errs.setdefault((r, fitted), []).append(abs(price(p, gpu, eff) / p.seconds - 1.0))
    return [Score(r, f, len(e), statistics.median(e), max(e)) for (r, f), e in sorted(errs.items())]


def _attention(row: Sequence[float], decode: bool) -> tuple[float, float, str]:
    batch, n, heads, kv_heads, head_dim = (int(v) for v in row[:5])
    pairs = n if decode else n * (n + 1) / 2
    flops = 4.0 * batch * heads * head_dim * pairs
    kv = 2.0 * batch * n * 2 * kv_heads * head_dim  # K and V, BF16
    return flops, kv, f"b{batch} {'ctx' if decode else 'isl'}{n} h{heads}/{kv_heads}x{head_dim}"


def points_from_table(table: Mapping[str, object], where: str) -> list[KernelPoint]:
    """The points of a kernel table (the layout of ``twin/data/kernels_*.json``: ``gemm``
    rows ``[dtype, m, n, k, ms, held_out]``, ``prefill-attention`` rows ``[batch, isl, heads,
    kv_heads, head_dim, ms, held_out]``, ``decode-attention`` rows the same with the context
    length for ``isl``, ``all-reduce`` rows ``[library, tp, bytes, ms, held_out]``)."""
    out: list[KernelPoint] = []
    try:
        for dtype, m, n, k, ms, held in table["gemm"]:  # type: ignore[attr-defined]
            fp8 = dtype == "fp8"
            out.append(KernelPoint("gemm", 2.0 * m * n * k, float(n * k * (1 if fp8 else 2)),
                                   ms * 1e-3, f"{dtype} m{m} n{n} k{k}", fp8=fp8,
                                   held_out=bool(held)))  # fmt: skip
        for kind in ("prefill-attention", "decode-attention"):
            for row in table[kind]:  # type: ignore[attr-defined]
                flops, kv, label = _attention(row, kind == "decode-attention")
                out.append(KernelPoint(kind, flops, kv, row[5] * 1e-3, label,
                                       held_out=bool(row[6])))  # fmt: skip
        for lib, tp, nbytes, ms, held in table["all-reduce"]:  # type: ignore[attr-defined]
            out.append(KernelPoint("all-reduce", 0.0, float(nbytes), ms * 1e-3,
                                   f"{lib} tp{tp} {nbytes} B", tp=int(tp),
                                   held_out=bool(held)))  # fmt: skip
    except (KeyError, TypeError, ValueError) as e:
        raise SpecError(f"{where}: not a kernel table ({e!r})") from None
    return out


def bundled_points(gpu: str) -> list[KernelPoint]:
    """The points of the kernel table bundled for ``gpu`` (``twin/data/kernels_<gpu>.json``);
    :class:`UnknownNameError` for a GPU without one."""
    name = f"kernels_{gpu}.json"
    try:
        text = package_text(name)
    except FileNotFoundError:
        known = [f.name[8:-5] for f in resources.files("twin.data").iterdir()
                 if f.name.startswith("kernels_") and f.name.endswith(".json")]  # fmt: skip
        raise UnknownNameError("GPU with a kernel table", gpu, known) from None
    return points_from_table(json.loads(text), name)
