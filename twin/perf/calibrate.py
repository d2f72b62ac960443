"""Fit the :class:`~twin.perf.roofline.Roofline` defaults to the measured profiles.

``fit_roofline(data_dir)`` (``fit_sources(sources)``) fits, jointly over the sources of
:mod:`twin.perf.validate`, the GPU terms (``mfu``, ``mbu``, ``attn_mfu``, the
sustained-power ``throttle`` and ``throttle_knee_s``, and the all-reduce
``hop_latency_s``, per GPU family and shared by every engine; a power-capped GPU
of :data:`CAPPED` shares its family's and adds its own ``sustained_clock``) and the software
terms of each serving engine (:data:`twin.perf.presets.ENGINE_TERMS` per key of
:data:`twin.perf.presets.ENGINE_OVERHEADS`; each source is priced with the terms of the
engine it was measured on), every parameter held within the physically
plausible bounds of ``_BOUNDS`` by every optimizer step. A source's loss is the
largest of ``worst error / 35%`` and ``median error / 15%`` (prompt and TPOT
alike): <= 1 means it meets the target. The objective is the mean over sources
of ``max(loss, 0.97)`` plus 0.3 x the largest loss (see ``_FLOOR``). The
Roofline formula is re-implemented here with numpy over all points at once (the
per-batch Python one is too slow to sit inside an optimizer); the result is
checked against the real :class:`~twin.perf.roofline.Roofline` at the end.
``tp_mfu_exponent`` stays at 0 (fits that free it land there). Variants tried
and dropped: a constant per-collective all-reduce latency (fitted to ~0), hops
growing as ``2 log2(TP)`` (tree / NVLink SHARP) instead of ``2 (TP - 1)``
(ring), a throttle saturating as ``compute / (compute + knee)`` instead of the
hinge at the knee (11 of 13 sources within bounds), and an attention efficiency
per engine (fitted to the shared one).

Run ``python -m twin.perf.calibrate --data DIR`` (about nine CPU minutes over the 19
sources) to print the fitted values; the rounded ones are hard-coded in
:mod:`twin.perf.roofline` (``DEFAULT_*``, ``GPU_EFFICIENCY`` and ``ENGINE_OVERHEADS``) and
:mod:`twin.perf.gpus` (the capped H100's ``sustained_clock``, from :func:`fit_clock`).

:func:`leave_one_out` is the out-of-sample check: per source, :func:`held_out_fit` (this
same routine, one start, never from the defaults) on all the other sources, scored on the
one left out; :func:`held_out_table` prints it with the reason for each miss (``twin
validate perf --held-out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares, minimize, minimize_scalar

from twin._progress import Progress
from twin.perf.gpus import GPUSpec, get_gpu
from twin.perf.llm import ModelSpec, get_model
from twin.perf.presets import ENGINE_OVERHEADS, ENGINE_TERMS, GPU_EFFICIENCY, l2_tokens
from twin.perf.roofline import Roofline, fp8_gemm_ratio
from twin.perf.validate import (
    TARGET_MEDIAN,
    TARGET_WORST,
    Source,
    ValidationRow,
    format_validation,
    iteration_sources,
    score,
)

# Parameters fitted in log space, in this order: efficiencies and throttle per GPU family, the
# all-reduce hop latency per GPU family (its NVLink/NVSwitch generation), the sustained clock of
# each power-capped GPU, then the software terms per engine.
GPUS = ("a100-80gb", "h100-sxm")
# The family (a key of GPUS) whose efficiencies each measured GPU shares: the same silicon.
FAMILY = {"a100-80gb": "a100-80gb", "h100-sxm": "h100-sxm", "h100-80gb-pcap": "h100-sxm"}
# GPUs run under a power limit below their family's: their GPUSpec.sustained_clock is fitted.
CAPPED = ("h100-80gb-pcap",)
# The engines whose presets are fitted here, to measured iteration tables; the ``vllm`` preset is
# fitted to measured serving runs instead (twin.perf.calibrate_runs, ``twin calibrate --runs``).
ENGINES = ("splitwise-sim", "distserve")
_EFF = ("mfu", "mbu", "attn_mfu", "throttle", "throttle_knee_s", "l2_speedup")
_LINK = ("hop_latency_s",)
NAMES = (
    *(f"{k}@{g}" for g in GPUS for k in _EFF),
    *(f"{k}@{g}" for k in _LINK for g in GPUS),
    *(f"sustained_clock@{g}" for g in CAPPED),
    *(f"{k}@{e}" for e in ENGINES for k in ENGINE_TERMS),
)
# (lower bound, upper bound, starting point) of each parameter. The bounds are what is physically
# plausible, enforced by every optimizer below: no GEMM above 85% of peak, no stream above 92% of
# HBM bandwidth, attention kernels at 10% to 80% of peak, a throttled clock at least half the
# unthrottled one, a power-capped GPU at least half its datasheet clock (and at most all of
# it), at most 10 ms per iteration, 100 us per layer and 0.6 ms per sequence of
# software overhead. Lower bounds are small positive numbers (log space); the random restarts
# perturb the starting point.
_BOUNDS = {
    "mfu": (0.2, 0.85, 0.75),
    "mbu": (0.3, 0.92, 0.8),
    "attn_mfu": (0.1, 0.8, 0.4),
    "throttle": (1e-4, 1.0, 0.3),
    "throttle_knee_s": (0.01, 5.0, 0.3),
    "l2_speedup": (1.0, 4.0, 2.0),
    "hop_latency_s": (1e-7, 5e-5, 8e-6),
    "sustained_clock": (0.5, 1.0, 0.8),
    "overhead_s": (1e-6, 0.01, 2e-3),
    "layer_overhead_s": (1e-9, 1e-4, 2e-5),
    "seq_overhead_s": (1e-8, 6e-4, 5e-5),
    "seq_shard_overhead_s": (1e-9, 6e-4, 2e-5),
    "act_traffic": (1e-3, 300.0, 10.0),
    "no_overlap": (1e-4, 1.0, 0.3),
    "hop_overhead_s": (1e-9, 2e-5, 1e-6),
}
_LO, _HI, _X0 = (np.log([_BOUNDS[n.split("@")[0]][i] for n in NAMES]) for i in range(3))


class _Source:
    """Per-point features of one source, as numpy arrays."""

    def __init__(
        self,
        s: Source,
        family: str | None = None,
        model: ModelSpec | None = None,
        gpu_spec: GPUSpec | None = None,
    ) -> None:
        """``family``: the key of the GPU terms (default: :data:`FAMILY` of the source's GPU,
        which must have one); ``model`` / ``gpu_spec``: the shapes and GPU, when not the
        catalog entries the source names."""
        m = get_model(s.model) if model is None else model
        gpu = get_gpu(s.gpu) if gpu_spec is None else gpu_spec
        tp = s.tp
        self.source = s
        self.name = s.name
        if family is None:
            if gpu.name not in FAMILY:
                raise ValueError(f"{s.name}: GPU {gpu.name} has no fitted efficiencies")
            self.gpu = FAMILY[gpu.name]
            self.clock = f"sustained_clock@{gpu.name}" if gpu.name in CAPPED else None
        else:  # a user's GPU: its own terms, at the clock it sustains
            self.gpu, self.clock = family, None
        self.engine = s.engine
        self.tp = tp
        self.layers = m.layers
        tok, seq, apre, adec, kv, meas, prompt = [], [], [], [], [], [], []
        for p in s.points:
            b = p.batch
            t = b.decode_count + sum(n for n, _ in b.prefill)
            tok.append(t)
            seq.append(b.decode_count + len(b.prefill))
            apre.append(sum(n * (c + (n + 1) * 0.5) for n, c in b.prefill))
            adec.append(b.decode_context_sum)
            kv.append(b.decode_context_sum + sum(c for _, c in b.prefill) + t)
            meas.append(p.measured_s)
            prompt.append(p.phase == "prompt")
        f = np.asarray
        self.tok, self.seq, self.apre, self.adec, self.kv = (
            f(tok, float), f(seq, float), f(apre, float), f(adec, float), f(kv, float))  # fmt: skip
        self.meas = f(meas, float)
        self.prompt = f(prompt, bool)
        fp8 = fp8_gemm_ratio(m, gpu)  # FP8 weights' GEMMs at the FP8 peak, as Roofline
        self.flop_lin = (2.0 * m.layers * m.linear_params_per_layer * self.tok * fp8
                         + 2.0 * m.hidden * m.vocab * self.seq) / tp  # fmt: skip
        self.flop_attn = 4.0 * m.layers * m.heads * m.head_dim * (self.apre + self.adec) / tp
        self.mem = m.weight_bytes / tp + m.kv_bytes_per_token_tp(tp) / tp * self.kv
        self.act = m.layers * m.hidden * m.dtype_bytes * self.tok  # bytes per unit act_traffic
        # the share of those bytes whose tokens fit in the L2 cache (L2_BYTES), per point
        l2_tok = l2_tokens(gpu, m)
        self.act_l2 = np.minimum(self.tok, l2_tok) / self.tok
        self.peak, self.hbm = gpu.flops_bf16, gpu.hbm_bytes_s
        if family is not None:
            self.peak = gpu.sustained_flops
        link = gpu.nvlink_bytes_s if gpu.nvlink_bytes_s > 0 else gpu.pcie_bytes_s
        n_ar = 2 * m.layers if tp > 1 else 0
        self.comm_s = n_ar * 2.0 * (tp - 1) / tp * m.hidden * m.dtype_bytes * self.tok / link
        self.n_hops = n_ar * 2 * (tp - 1)
        self.weights: list[np.ndarray] = []

    def weigh(self, weights: Sequence[Sequence[float]]) -> None:
        """Add a workload-weighted target: one vector per workload, a weight per point (how
        many of its iterations land on the point; see twin.studies.fidelity.point_weights)."""
        self.weights = [np.asarray(w, float) for w in weights]
        if any(w.shape != self.meas.shape for w in self.weights):
            raise ValueError(f"{self.name}: a weight vector per point needed")

    def predict(self, p: dict[str, float]) -> np.ndarray:
        g, e = self.gpu, self.engine
        peak = self.peak * p[self.clock] if self.clock else self.peak
        compute = (self.flop_lin / p[f"mfu@{g}"] + self.flop_attn / p[f"attn_mfu@{g}"]) / peak
        compute = compute + p[f"throttle@{g}"] * np.maximum(
            compute - p[f"throttle_knee_s@{g}"], 0.0
        )
        mbw = self.hbm * p[f"mbu@{g}"]
        mem = self.mem / mbw
        l2 = 1.0 - self.act_l2 + self.act_l2 / p[f"l2_speedup@{g}"]
        return (
            np.maximum(compute, mem)
            + p[f"no_overlap@{e}"] * np.minimum(compute, mem)
            + self.act * p[f"act_traffic@{e}"] * l2 / mbw
            + p[f"overhead_s@{e}"]
            + self.layers * p[f"layer_overhead_s@{e}"]
            + (p[f"seq_overhead_s@{e}"] + p[f"seq_shard_overhead_s@{e}"] / self.tp) * self.seq
            + self.n_hops * (p[f"hop_latency_s@{g}"] + p[f"hop_overhead_s@{e}"])
            + self.comm_s
        )

    def loss(self, p: dict[str, float]) -> float:
        err = np.abs(self.predict(p) - self.meas) / self.meas
        worst = 0.0
        for mask in (self.prompt, ~self.prompt):
            e = err[mask]
            if e.size:
                worst = max(worst, e.max() / TARGET_WORST, float(np.median(e)) / TARGET_MEDIAN)
            for w in self.weights:
                wm = w[mask]
                if wm.sum() > 0:
                    worst = max(worst, weighted_median(e, wm) / TARGET_WEIGHTED)
        return worst


# The workload-weighted target: median <= 10% for prompt and TPOT under each workload given.
TARGET_WEIGHTED = 0.10


def weighted_median(err: np.ndarray, w: np.ndarray) -> float:
    """The smallest of ``err`` whose cumulative weight ``w`` (in order of error) reaches half the
    total, as twin.studies.fidelity weighs its medians."""
    order = np.argsort(err, kind="stable")
    acc = np.cumsum(w[order])
    return float(err[order][np.searchsorted(acc, 0.5 * acc[-1])])


def _params(x: np.ndarray) -> dict[str, float]:
    return dict(zip(NAMES, np.exp(x).tolist(), strict=True))


def _objective(x: np.ndarray, sources: list[_Source]) -> float:
    p = _params(np.clip(x, _LO, _HI))
    losses = [s.loss(p) for s in sources]
    return sum(max(v, _FLOOR) for v in losses) / len(losses) + _MAX_WEIGHT * max(losses)


# The objective: the mean over sources of max(loss, _FLOOR), plus _MAX_WEIGHT x the largest loss.
# With every source able to meet the target this is the minimax fit with a margin; when they
# cannot, a pure minimax spreads the misses over most sources, while this keeps as many sources
# as possible within the target and still bounds the worst.
_FLOOR = 0.97
_MAX_WEIGHT = 0.3


def _residuals(x: np.ndarray, sources: list[_Source], power: int) -> np.ndarray:
    """log(predicted / measured) per point, raised to ``power`` (a large power approaches the
    worst error), each source weighted equally."""
    p = _params(x)
    r = [np.log(s.predict(p) / s.meas) / 0.25 for s in sources]
    if power > 1:
        r = [np.abs(v) ** power for v in r]
    return np.concatenate([v / math.sqrt(len(v)) for v in r])


def _defaults() -> np.ndarray:
    """The hard-coded defaults of :mod:`twin.perf.roofline` as a vector, within the bounds."""
    eff = {f"{k}@{g}": GPU_EFFICIENCY[g][i] for g in GPUS for i, k in enumerate((*_EFF, *_LINK))}
    eff.update({f"sustained_clock@{g}": get_gpu(g).sustained_clock for g in CAPPED})
    eff.update({f"{k}@{e}": ENGINE_OVERHEADS[e][k] for e in ENGINES for k in ENGINE_TERMS})
    return np.clip(np.log(np.maximum([eff[n] for n in NAMES], 1e-300)), _LO, _HI)


def _refine(
    x: np.ndarray, f: float, sources: list[_Source], rounds: int = 3
) -> tuple[np.ndarray, float]:
    """Powell and Nelder-Mead on the objective from ``x``, each restarted from the other's
    optimum, ``rounds`` times, within the bounds."""
    bounds = list(zip(_LO, _HI, strict=True))
    for _ in range(rounds):
        for method, opts in (
            ("Powell", {"maxiter": 20000, "xtol": 1e-4, "ftol": 1e-6}),
            ("Nelder-Mead", {"maxiter": 6000, "xatol": 1e-4, "fatol": 1e-5, "adaptive": True}),
        ):
            r = minimize(_objective, x, args=(sources,), method=method, options=opts,
                         bounds=bounds)  # fmt: skip
            if r.fun <= f:
                x, f = np.clip(r.x, _LO, _HI), float(r.fun)
    return x, f


def fit_sources(
    sources: Sequence[Source],
    starts: int = 3,
    seed: int = 0,
    from_defaults: bool = True,
    rounds: int = 3,
    on_fit: Callable[[], None] | None = None,
    weights: Mapping[str, Sequence[Sequence[float]]] | None = None,
) -> dict[str, float]:
    """Fitted Roofline parameters (names as in :data:`NAMES`) plus ``"loss"``, on ``sources``.

    Each start fits log(predicted / measured) by least squares (every source
    weighted equally), then on powers 2, 4 and 8 of it (towards the worst
    error), then refines the minimax objective with Powell and Nelder-Mead, each
    restarted from the other's optimum (``rounds`` times); the best of ``starts`` (the first from
    the built-in guess, the others perturbed at random with ``seed``) and, with
    ``from_defaults``, of the current defaults of :mod:`twin.perf.roofline`
    refined the same way wins (the fit is sensitive to rounding: the same starts
    on another machine or numpy build can end elsewhere). Every step keeps the
    parameters within ``_BOUNDS``. A held-out fit passes ``from_defaults=False``:
    the defaults were fitted with every source, the held-out one too. ``on_fit``
    is called as each start (and the defaults' refinement) is done.
    """
    if starts < 1 and not from_defaults:
        raise ValueError("fit_sources: no start (starts < 1 and from_defaults=False)")
    srcs = [_Source(s) for s in sources]
    for src in srcs:
        if weights and src.name in weights:
            src.weigh(weights[src.name])
    rng = np.random.default_rng(seed)
    best_x, best_f = _X0, math.inf
    if from_defaults:
        # The current defaults, refined, compete with the starts: a refit never does worse.
        best_x = _defaults()
        best_x, best_f = _refine(best_x, _objective(best_x, srcs), srcs, rounds)
        if on_fit is not None:
            on_fit()
    for i in range(starts):
        x = _X0 if i == 0 else _X0 + rng.normal(0.0, 0.7, len(NAMES))
        x = np.clip(x, _LO + 1e-6, _HI - 1e-6)
        for power in (1, 2, 4, 8):
            x = least_squares(_residuals, x, args=(srcs, power), bounds=(_LO, _HI)).x
            x = np.clip(x, _LO + 1e-9, _HI - 1e-9)
        x, f = _refine(x, _objective(x, srcs), srcs, rounds)
        if f < best_f:
            best_x, best_f = x, f
        if on_fit is not None:
            on_fit()
    out = _params(best_x)
    out["loss"] = float(best_f)
    return out


# The weighted fit (fit_weighted): least squares on each source's grid points (log error / 0.25,
# a source weighted as one, raised to the power 2 towards its worst), plus per workload and phase
# its points' log errors / TARGET_WEIGHTED, each weighted by the share of the workload's
# iterations on it, plus each pinned point's log error / TARGET_WEIGHTED (a pinned set weighted
# as one), both times WEIGHTED_FACTOR (how much the traffic's region counts against the grid).
# Iteratively reweighted towards the minimax: after each least squares, every weighted median
# above WEIGHTED_MISS, every pinned point above PINNED_MISS and every grid point above
# TARGET_WORST has its residuals boosted BOOST-fold in the next.
WEIGHTED_FACTOR = 4.0
WEIGHTED_MISS = 0.097
PINNED_MISS = 0.095
BOOST = 1.6
WEIGHTED_ROUNDS = 8


def _weighted_residuals(
    x: np.ndarray,
    sources: list[_Source],
    pinned: Mapping[str, np.ndarray],
    boost: Mapping[tuple[str, int, int], float],
) -> np.ndarray:
    p = _params(x)
    out = []
    for s in sources:
        r = np.log(s.predict(p) / s.meas)
        g = np.array([boost.get((s.name, -2, i), 1.0) for i in range(len(r))])
        out.append(g * np.abs(r / 0.25) ** 2 / math.sqrt(len(r)))
        for j, w in enumerate(s.weights):
            for k, mask in enumerate((s.prompt, ~s.prompt)):
                wm = w * mask
                if wm.sum() > 0:
                    f = boost.get((s.name, j, k), 1.0) * WEIGHTED_FACTOR
                    out.append(f * r / TARGET_WEIGHTED * np.sqrt(wm / wm.sum()))
        if s.name in pinned:
            m = pinned[s.name]
            b = np.array([boost.get((s.name, -1, i), 1.0) for i in range(len(r))])
            out.append((WEIGHTED_FACTOR * r / TARGET_WEIGHTED * b / math.sqrt(m.sum()))[m])
    return np.concatenate(out)


def _reweigh(
    x: np.ndarray,
    sources: list[_Source],
    pinned: Mapping[str, np.ndarray],
    boost: dict[tuple[str, int, int], float],
) -> int:
    """Boost (in ``boost``) what misses at ``x``; how many do."""
    p = _params(x)
    misses = 0
    for s in sources:
        err = np.abs(s.predict(p) - s.meas) / s.meas
        keys = []
        for j, w in enumerate(s.weights):
            for k, mask in enumerate((s.prompt, ~s.prompt)):
                if w[mask].sum() and weighted_median(err[mask], w[mask]) > WEIGHTED_MISS:
                    keys.append((s.name, j, k))
        if s.name in pinned:
            keys += [(s.name, -1, int(i)) for i in np.nonzero(pinned[s.name])[0]
                     if err[i] > PINNED_MISS]  # fmt: skip
        keys += [(s.name, -2, int(i)) for i in np.nonzero(err > TARGET_WORST)[0]]
        for key in keys:
            boost[key] = boost.get(key, 1.0) * BOOST
        misses += len(keys)
    return misses


def fit_weighted(
    sources: Sequence[Source],
    weights: Mapping[str, Sequence[Sequence[float]]],
    pinned: Mapping[str, Sequence[bool]] | None = None,
    start: dict[str, float] | None = None,
    rounds: int = WEIGHTED_ROUNDS,
    held: Sequence[str] = (),
) -> dict[str, float]:
    """Fitted parameters (as :func:`fit_sources`) where the traffic is, from ``start``
    (default: the hard-coded defaults, which it refines): ``weights`` per source name (one
    vector per workload, a weight per point: twin.studies.fidelity.workload_weights) put a
    weighted median <= TARGET_WEIGHTED on each workload's prompt and TPOT errors; ``pinned``
    per source name (a flag per point) asks each flagged point within TARGET_WEIGHTED on its
    own; the grid keeps its least-squares share. ``rounds`` iterations of least squares and
    reweighting (see WEIGHTED_FACTOR), every step within ``_BOUNDS``, the parameters named in
    ``held`` kept at their start; ``"misses"`` is how many targets miss at the end."""
    srcs = [_Source(s) for s in sources]
    for src in srcs:
        src.weigh(weights.get(src.name, ()))
    pins = {k: np.asarray(v, bool) for k, v in (pinned or {}).items()}
    if start is None:
        x = _defaults()
    else:
        x = np.clip(np.log([start[n] for n in NAMES]), _LO + 1e-9, _HI - 1e-9)
    free = np.array([n not in held for n in NAMES])
    x0 = x.copy()

    def residuals(xf: np.ndarray, boost: dict[tuple[str, int, int], float]) -> np.ndarray:
        full = x0.copy()
        full[free] = xf
        return _weighted_residuals(full, srcs, pins, boost)

    boost: dict[tuple[str, int, int], float] = {}
    for _ in range(rounds):
        _reweigh(x, srcs, pins, boost)
        lo, hi = _LO[free], _HI[free]
        r = least_squares(residuals, x[free], args=(boost,), bounds=(lo, hi))
        x[free] = np.clip(r.x, lo + 1e-9, hi - 1e-9)
    out = _params(x)
    out["misses"] = float(_reweigh(x, srcs, pins, {}))
    return out


def fit_clock(sources: Sequence[Source], gpu: str) -> float:
    """The ``sustained_clock`` of power-capped GPU ``gpu`` (one of :data:`CAPPED`) that
    minimises the objective over the sources measured on it, every other parameter held at
    the hard-coded defaults (bounded scalar search within ``_BOUNDS``). This is how the
    catalog value of :mod:`twin.perf.gpus` is fitted: the capped GPU shares its family's
    efficiencies, so only its clock is its own."""
    g = get_gpu(gpu).name
    srcs = [_Source(s) for s in sources if get_gpu(s.gpu).name == g]
    if g not in CAPPED or not srcs:
        raise ValueError(f"fit_clock: no source measured on power-capped GPU {gpu!r}")
    x0, k = _defaults(), NAMES.index(f"sustained_clock@{g}")
    lo, hi, _ = _BOUNDS["sustained_clock"]

    def f(v: float) -> float:
        x = x0.copy()
        x[k] = math.log(v)
        return _objective(x, srcs)

    r = minimize_scalar(f, bounds=(lo, hi), method="bounded", options={"xatol": 1e-4})
    return float(r.x)


def fit_roofline(
    data_dir: Path, starts: int = 3, seed: int = 0, on_fit: Callable[[], None] | None = None
) -> dict[str, float]:
    """:func:`fit_sources` on every source of :func:`twin.perf.validate.iteration_sources`."""
    return fit_sources(iteration_sources(Path(data_dir)), starts, seed, on_fit=on_fit)


def roofline_kwargs(p: dict[str, float], gpu: str, engine: str) -> dict[str, object]:
    """Keyword arguments of :class:`~twin.perf.roofline.Roofline` for fitted parameters ``p``
    (``gpu`` a key of :data:`FAMILY`)."""
    fam = FAMILY[gpu]
    kw: dict[str, object] = {k: p[f"{k}@{fam}"] for k in _EFF}
    kw.update({k: p[f"{k}@{fam}"] for k in _LINK})
    kw.update({k: p[f"{k}@{engine}"] for k in ENGINE_TERMS})
    kw["engine"] = engine
    return kw


def fitted_gpu(p: dict[str, float], gpu: GPUSpec) -> GPUSpec:
    """``gpu`` with its fitted sustained clock, for a power-capped GPU of :data:`CAPPED`."""
    if gpu.name in CAPPED:
        return dataclasses.replace(gpu, sustained_clock=p[f"sustained_clock@{gpu.name}"])
    return gpu


def fitted_roofline(p: dict[str, float], source: Source) -> Roofline:
    """The real :class:`~twin.perf.roofline.Roofline` of ``source`` at fitted parameters ``p``."""
    g = get_gpu(source.gpu)
    kwargs: dict[str, Any] = dict(roofline_kwargs(p, g.name, source.engine))
    return Roofline(get_model(source.model), fitted_gpu(p, g), source.tp, **kwargs)


def _loss(r: ValidationRow) -> float:
    return max(r.prompt_worst / TARGET_WORST, r.tpot_worst / TARGET_WORST,
               r.prompt_median / TARGET_MEDIAN, r.tpot_median / TARGET_MEDIAN)  # fmt: skip


def check(data_dir: Path, p: dict[str, float]) -> tuple[float, int, int]:
    """The largest per-source loss recomputed with the real :class:`~twin.perf.roofline.Roofline`,
    the number of sources within the target and the number of sources."""
    worst, passing, n = 0.0, 0, 0
    for s in iteration_sources(Path(data_dir)):
        loss = _loss(score(s, fitted_roofline(p, s)))
        worst, passing, n = max(worst, loss), passing + (loss <= 1.0), n + 1
    return worst, passing, n


# The held-out refit: one start from the built-in guess (never from the defaults, which saw the
# held-out source), the same least squares and minimax refinement as the full fit, one round of
# Powell and Nelder-Mead instead of three (a fit per source must take minutes, not hours).
HELD_OUT_STARTS = 1
HELD_OUT_ROUNDS = 1


def held_out_fit(sources: Sequence[Source]) -> dict[str, float]:
    """:func:`fit_sources` as a leave-one-out refit uses it."""
    return fit_sources(sources, starts=HELD_OUT_STARTS, from_defaults=False, rounds=HELD_OUT_ROUNDS)


Fit = Callable[[Sequence[Source]], dict[str, float]]
Model = Callable[[dict[str, float], Source], Any]
# Runs jobs (a function and its arguments) and yields (index, result) as each ends, in any order:
# twin.studies.sweep.Executor.run, or one after the other here.
Runner = Callable[[list[tuple[Callable[..., Any], tuple[Any, ...]]]], Iterable[tuple[int, Any]]]


def _serial(jobs: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> Iterator[tuple[int, Any]]:
    for i, (fn, args) in enumerate(jobs):
        yield i, fn(*args)


def held_out_one(
    sources: Sequence[Source], i: int, fit: Fit, model: Model
) -> tuple[ValidationRow, dict[str, float]]:
    """Source ``i``'s errors under the parameters ``fit`` finds on all the others, and those."""
    p = fit([s for j, s in enumerate(sources) if j != i])
    return score(sources[i], model(p, sources[i])), p


def leave_one_out(
    sources: Sequence[Source],
    fit: Fit = held_out_fit,
    model: Model = fitted_roofline,
    on_source: Callable[[], None] | None = None,
    run: Runner | None = None,
) -> list[tuple[ValidationRow, dict[str, float]]]:
    """Per source, in order: its errors under the parameters ``fit`` finds on all the other
    sources (``model(params, source)`` builds what is scored), and those parameters;
    ``on_source`` is called as each source is done. The fits are independent: ``run``
    (default: one after the other) may run them at once, in processes (``fit`` and ``model``
    must then pickle); each gives the same parameters wherever it runs."""
    jobs: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
        (held_out_one, (sources, i, fit, model)) for i in range(len(sources))
    ]
    done: dict[int, tuple[ValidationRow, dict[str, float]]] = {}
    for i, out in (_serial if run is None else run)(jobs):
        done[i] = out
        if on_source is not None:
            on_source()
    return [done[i] for i in range(len(sources))]


# The out-of-sample target: median <= 15% and worst <= 40% per held-out source.
HELD_OUT_MEDIAN = 0.15
HELD_OUT_WORST = 0.40


def default_params() -> dict[str, float]:
    """The hard-coded defaults of :mod:`twin.perf.roofline` as fitted parameters (``NAMES``)."""
    return _params(_defaults())


def _used(source: Source) -> list[str]:
    """The parameters (``NAMES``) that price ``source``."""
    g = get_gpu(source.gpu).name
    keys = {f"{k}@{FAMILY[g]}" for k in (*_EFF, *_LINK)} | {f"sustained_clock@{g}"}
    keys |= {f"{k}@{source.engine}" for k in ENGINE_TERMS}
    return [n for n in NAMES if n in keys]


def held_out_reason(
    held: ValidationRow,
    inside: ValidationRow,
    p_out: dict[str, float],
    p_all: dict[str, float],
    source: Source,
) -> str:
    """Why held-out row ``held`` misses the out-of-sample target: the in-sample row ``inside``
    (fitted with it, ``p_all``) misses it too, so the model's form does; or it does not, and the
    fit without it (``p_out``) prices it differently: the two parameters whose held-out value,
    put alone into ``p_all``, raises the source's loss (calibrate's: 1 = at the in-sample
    target) the most."""
    prompt = max(held.prompt_median / HELD_OUT_MEDIAN, held.prompt_worst / HELD_OUT_WORST)
    tpot = max(held.tpot_median / HELD_OUT_MEDIAN, held.tpot_worst / HELD_OUT_WORST)
    phase = "prompt" if prompt >= tpot else "TPOT"
    if not inside.meets(HELD_OUT_MEDIAN, HELD_OUT_WORST):
        return (f"{phase}: misses in sample too (prompt median {inside.prompt_median:.0%}, worst"
                f" {inside.prompt_worst:.0%}; TPOT median {inside.tpot_median:.0%}, worst"
                f" {inside.tpot_worst:.0%}): the model's form, not the held-out fit")  # fmt: skip
    src = _Source(source)
    base = src.loss(p_all)
    alone = {n: src.loss({**p_all, n: p_out[n]}) for n in _used(source)}
    top = sorted(alone, key=lambda n: -alone[n])[:2]
    what = ", ".join(f"{n} {p_all[n]:.3g} -> {p_out[n]:.3g} (loss {alone[n]:.2f})" for n in top)
    return f"{phase}: in sample loss {base:.2f}; the fit without it moves, most: {what}"


def held_out_table(
    sources: Sequence[Source],
    fit: Callable[[Sequence[Source]], dict[str, float]] = held_out_fit,
    p_all: dict[str, float] | None = None,
    on_source: Callable[[], None] | None = None,
    run: Runner | None = None,
) -> str:
    """The leave-one-out table of ``sources`` (see :func:`leave_one_out`, which ``run`` goes
    to), a reason under it for each source that misses the out-of-sample target. ``p_all`` is
    the fit with every source (default: the hard-coded defaults)."""
    p_all = default_params() if p_all is None else p_all
    rows = leave_one_out(sources, fit, on_source=on_source, run=run)
    notes = {}
    for s, (held, p_out) in zip(sources, rows, strict=True):
        if not held.meets(HELD_OUT_MEDIAN, HELD_OUT_WORST):
            inside = score(s, fitted_roofline(p_all, s))
            notes[s.name] = held_out_reason(held, inside, p_out, p_all, s)
    table = format_validation([r for r, _ in rows], HELD_OUT_MEDIAN, HELD_OUT_WORST, notes)
    errs = sorted(e for r, _ in rows for e in (r.prompt_median, r.tpot_median))
    return (
        "held out (leave-one-source-out: each row fitted on all the other sources)\n"
        + table
        + f"\nmedian of the per-source median errors: {float(np.median(errs)):.1%}; worst: "
        + f"{max(max(r.prompt_worst, r.tpot_worst) for r, _ in rows):.1%}"
    )


def main(argv: list[str] | None = None) -> int:
    """Fit the defaults to the shared data's sources (``twin calibrate
    --profile`` fits one GPU's terms to measured tables instead:
    :mod:`twin.perf.fit_profile`, which builds on this module)."""
    ap = argparse.ArgumentParser(prog="python -m twin.perf.calibrate", description=__doc__)
    ap.add_argument("--data", required=True, help="shared data directory")
    ap.add_argument("--starts", type=int, default=3)
    args = ap.parse_args(argv)
    # a unit is a fit: each capped GPU's clock, each start and the defaults' refinement
    with Progress(len(CAPPED) + args.starts + 1, "fits", desc="calibrate") as bar:
        clocks = []
        for g in CAPPED:
            clocks.append((g, fit_clock(iteration_sources(Path(args.data)), g)))
            bar.update()
        p = fit_roofline(Path(args.data), starts=args.starts, on_fit=bar.update)
    for g, clock in clocks:
        print(f"{'sustained_clock@' + g:<32} {clock:.4g} (the other defaults held)")
    for k, v in p.items():
        print(f"{k:<32} {v:.4g}")
    worst, passing, n = check(Path(args.data), p)
    print(f"{'worst loss (real Roofline)':<32} {worst:.4g} ({passing}/{n} sources within target)")
    return 0 if math.isfinite(p["loss"]) else 1


if __name__ == "__main__":
    sys.exit(main())
