"""Fit the :class:`~twin.perf.Roofline` defaults to the measured profiles.

``fit_roofline(data_dir)`` minimizes, over the sources of :mod:`twin.validate`,
the largest of ``worst error / 35%`` and ``median error / 15%`` (prompt and
TPOT alike): a value <= 1 means every source meets the target. The Roofline
formula is re-implemented here with numpy over all points at once (the
per-batch Python one is too slow to sit inside an optimizer); the result is
checked against the real :class:`~twin.perf.Roofline` at the end.

Run ``python -m twin.calibrate --data DIR`` to print the fitted values; the
rounded ones are hard-coded in :mod:`twin.perf` (``DEFAULT_*`` and
``GPU_EFFICIENCY``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares, minimize

from twin.hardware import get_gpu
from twin.models import get_model
from twin.validate import TARGET_MEDIAN, TARGET_WORST, Source, load_sources

# Parameters fitted in log space, in this order. Efficiencies per GPU family.
GPUS = ("a100-80gb", "h100-sxm")
_EFF = ("mfu", "mbu", "attn_mfu")
NAMES = (
    *(f"{k}@{g}" for g in GPUS for k in _EFF),
    "overhead_s",
    "layer_overhead_s",
    "seq_overhead_s",
    "hop_latency_s",
    "tp_mfu_exponent",
    "act_traffic",
    "no_overlap",
)
# Starting point (and the scale of the random restarts).
_X0 = {
    "mfu": 0.8,
    "mbu": 0.8,
    "attn_mfu": 0.3,
    "overhead_s": 2e-3,
    "layer_overhead_s": 5e-5,
    "seq_overhead_s": 2e-5,
    "hop_latency_s": 8e-6,
    "tp_mfu_exponent": 0.3,
    "act_traffic": 10.0,
    "no_overlap": 0.3,
}


class _Source:
    """Per-point features of one source, as numpy arrays."""

    def __init__(self, s: Source) -> None:
        m, gpu, tp = get_model(s.model), get_gpu(s.gpu), s.tp
        self.name = s.name
        self.gpu = GPUS.index(gpu.name)
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
        self.flop_lin = (2.0 * m.layers * m.linear_params_per_layer * self.tok
                         + 2.0 * m.hidden * m.vocab * self.seq) / tp  # fmt: skip
        self.flop_attn = 4.0 * m.layers * m.heads * m.head_dim * (self.apre + self.adec) / tp
        self.mem = m.weight_bytes / tp + m.kv_bytes_per_token() / tp * self.kv
        self.act = m.layers * m.hidden * m.dtype_bytes * self.tok  # bytes per unit act_traffic
        self.peak, self.hbm = gpu.flops_bf16, gpu.hbm_bytes_s
        link = gpu.nvlink_bytes_s if gpu.nvlink_bytes_s > 0 else gpu.pcie_bytes_s
        n_ar = 2 * m.layers if tp > 1 else 0
        self.comm_s = n_ar * 2.0 * (tp - 1) / tp * m.hidden * m.dtype_bytes * self.tok / link
        self.n_hops = n_ar * 2 * (tp - 1)

    def predict(self, p: dict[str, float]) -> np.ndarray:
        g = GPUS[self.gpu]
        scale = self.tp ** p["tp_mfu_exponent"] / self.peak
        compute = (self.flop_lin / p[f"mfu@{g}"] + self.flop_attn / p[f"attn_mfu@{g}"]) * scale
        mbw = self.hbm * p[f"mbu@{g}"]
        mem = self.mem / mbw
        return (
            np.maximum(compute, mem)
            + p["no_overlap"] * np.minimum(compute, mem)
            + self.act * p["act_traffic"] / mbw
            + p["overhead_s"]
            + self.layers * p["layer_overhead_s"]
            + p["seq_overhead_s"] * self.seq
            + self.n_hops * p["hop_latency_s"]
            + self.comm_s
        )

    def loss(self, p: dict[str, float]) -> float:
        err = np.abs(self.predict(p) - self.meas) / self.meas
        worst = 0.0
        for mask in (self.prompt, ~self.prompt):
            e = err[mask]
            if e.size:
                worst = max(worst, e.max() / TARGET_WORST, float(np.median(e)) / TARGET_MEDIAN)
        return worst


def _params(x: np.ndarray) -> dict[str, float]:
    p = dict(zip(NAMES, np.exp(x), strict=True))
    return p


def _objective(x: np.ndarray, sources: list[_Source]) -> float:
    p = _params(x)
    if p["no_overlap"] > 1.0 or any(p[f"{k}@{g}"] > 1.0 for g in GPUS for k in _EFF):
        return 1e9
    return max(s.loss(p) for s in sources)


def _x0() -> np.ndarray:
    return np.log([_X0[n.split("@")[0]] for n in NAMES])


def _residuals(x: np.ndarray, sources: list[_Source]) -> np.ndarray:
    p = _params(x)
    return np.concatenate([np.log(s.predict(p) / s.meas) / math.sqrt(len(s.meas)) for s in sources])


def fit_roofline(data_dir: Path, starts: int = 6, seed: int = 0) -> dict[str, float]:
    """Fitted Roofline parameters (names as in :data:`NAMES`) plus ``"loss"``.

    Each start first fits log(predicted / measured) by least squares (every
    source weighted equally), then refines the minimax objective with
    Nelder-Mead; the best of ``starts`` (the first from the built-in guess,
    the others perturbed at random with ``seed``) wins.
    """
    sources = [_Source(s) for s in load_sources(Path(data_dir))]
    rng = np.random.default_rng(seed)
    upper = np.array([0.0 if ("@" in n or n == "no_overlap") else np.inf for n in NAMES])
    best_x, best_f = _x0(), math.inf
    for i in range(starts):
        x = _x0() if i == 0 else _x0() + rng.normal(0.0, 0.7, len(NAMES))
        x = np.minimum(x, upper - 1e-6)
        x = least_squares(_residuals, x, args=(sources,), bounds=(-np.inf, upper)).x
        for _ in range(3):  # restart Nelder-Mead from its own optimum
            r = minimize(_objective, x, args=(sources,), method="Nelder-Mead",
                         options={"maxiter": 3000, "xatol": 1e-4, "fatol": 1e-5})  # fmt: skip
            x = r.x
        if r.fun < best_f:
            best_x, best_f = r.x, r.fun
    out = _params(best_x)
    out["loss"] = float(best_f)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m twin.calibrate", description=__doc__)
    ap.add_argument("--data", required=True, help="shared data directory")
    ap.add_argument("--starts", type=int, default=6)
    args = ap.parse_args(argv)
    p = fit_roofline(Path(args.data), starts=args.starts)
    for k, v in p.items():
        print(f"{k:<28} {v:.4g}")
    return 0 if math.isfinite(p["loss"]) else 1


if __name__ == "__main__":
    sys.exit(main())
