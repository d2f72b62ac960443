"""Iteration-time models: how long one forward pass of a batch takes.

One interface, :class:`PerfModel`: ``iteration_time(batch) -> seconds`` for
the set of prefill chunks and decode sequences that run together in one
forward pass on one instance (with its tensor/pipeline parallelism fixed at
construction).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import statistics
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from twin.errors import ProfileError, SpecError, TwinError, UnitError, UnknownNameError
from twin.hardware import GPUSpec, get_gpu
from twin.models import ModelSpec, get_model
from twin.units import parse_duration


@dataclass(frozen=True, slots=True)
class Batch:
    """What runs in one iteration.

    ``prefill`` holds one ``(new_tokens, cached_tokens)`` pair per prefill
    chunk: the tokens computed in this pass and the tokens of the same
    sequence already in the KV cache (earlier chunks, or a prefix-cache hit).
    Decode sequences are summarized by their count and the sum of their
    context lengths (tokens whose KV each one reads), which is all a model
    needs and keeps the engine's per-iteration work O(1) in the batch size.
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode_count: int = 0
    decode_context_sum: int = 0

    @property
    def prefill_tokens(self) -> int:
        return sum(n for n, _ in self.prefill)

    @property
    def is_empty(self) -> bool:
        return not self.prefill and self.decode_count == 0


class PerfModel(Protocol):
    """Anything that prices an iteration. ``sha256`` names the data it was built
    from (a profile table), or is ``None`` for an analytical model."""

    name: str
    sha256: str | None

    def iteration_time(self, batch: Batch) -> float: ...


# Calibrated defaults: fitted by twin.calibrate (``python -m twin.calibrate --data DIR``), jointly
# over the 13 sources of twin.validate with the GPU efficiencies, throttles and hop latencies per
# GPU and the software terms per serving engine (ENGINE_OVERHEADS), every parameter held within
# physically plausible bounds (twin.calibrate._BOUNDS: mfu <= 0.85, mbu <= 0.92, attn_mfu in
# [0.1, 0.8], throttle <= 1, overheads <= 10 ms per iteration, 100 us per layer, 0.6 ms per
# sequence): least squares on log(predicted / measured), then Powell and Nelder-Mead on the
# per-source loss max(worst error / 35%, median error / 15%) (mean of max(loss, 0.97) plus 0.3 x
# the largest; see twin.calibrate), three starts; rounded here. twin.validate.validate_perf
# reproduces the resulting errors (all 13 sources within the target).
# DEFAULT_MFU / DEFAULT_MBU / DEFAULT_ATTN_MFU are for GPUs without fitted values, which get no
# throttle either: they are the A100 values of the earlier fit without a throttle term, which
# average over short and long iterations. DEFAULT_HOP_LATENCY_S is the A100 value.
DEFAULT_MFU = 0.82
DEFAULT_MBU = 0.86
DEFAULT_ATTN_MFU = 0.57
DEFAULT_HOP_LATENCY_S = 7.4e-06
DEFAULT_TP_MFU_EXPONENT = 0.0
DEFAULT_ENGINE = "distserve"

# Per GPU, shared by every engine preset: achieved efficiencies (mfu, mbu, attn_mfu), properties
# of the silicon; sustained-power throttle (throttle, throttle_knee_s), a property of its
# power/cooling envelope; and the all-reduce hop latency (hop_latency_s), a property of its
# NVLink/NVSwitch generation. A100 fitted on splitwise-sim and DistServe (A100-80GB), H100 on
# splitwise-sim (H100-80GB SXM). GPUs of the same generation reuse them (same kernels, same share
# of peak assumed); any other GPU gets DEFAULT_MFU / DEFAULT_MBU / DEFAULT_ATTN_MFU, no throttle
# and DEFAULT_HOP_LATENCY_S. A Roofline argument or a YAML ``perf`` key overrides all of them.
# NOTE: the throttle prices an iteration whose roofline compute time is ``compute`` seconds at
# compute + throttle x max(compute - throttle_knee_s, 0): the first ``throttle_knee_s`` of
# sustained tensor-core load run at the clocks that ``mfu`` describes, the rest at the
# power-capped sustained clock, 1 / (1 + throttle) as fast. Physically the board's power limit
# (400 W on A100, 700 W on H100) is enforced over an averaging window, so a short burst of GEMMs
# runs at boost clock and a long one settles lower; the measured sign is splitwise-sim's prompt
# time per token rising with a batch's total tokens whether they come as one prompt or many (A100
# TP 4: 0.20 ms at 2,048 tokens, 0.33 ms at 32,768; H100 TP 8: 0.065 ms at 2,048, 0.09 ms from
# 4,096). Consequence: long prefill iterations (and big chunked-prefill batches) cost more per
# token than short ones; decode steps, far under the knee, are unaffected. The model is per
# iteration and memoryless: it does not carry heat from one iteration to the next, so
# back-to-back long iterations under sustained load may throttle more than priced here.
# Fitted: A100 (a 142 ms window, then 1 / 1.30 of the clock), H100 (43 ms, then 1 / 1.52); hop
# latency 7.4 us on A100 (NVLink 3), 5.9 us on H100 (NVLink 4).
_A100_EFF = (0.795, 0.907, 0.799, 0.296, 0.142, 7.4e-06)
_H100_EFF = (0.831, 0.832, 0.646, 0.522, 0.0427, 5.9e-06)
GPU_EFFICIENCY: Mapping[str, tuple[float, float, float, float, float, float]] = MappingProxyType(
    {
        "a100-80gb": _A100_EFF,
        "a100-40gb": _A100_EFF,
        "h100-sxm": _H100_EFF,
        "h100-80gb-pcap": _H100_EFF,
        "h200": _H100_EFF,
    }
)
_NO_THROTTLE = (0.0, 0.0)

# Software terms of the Roofline per serving engine: what the serving software adds on top of the
# GPU's roofline (per-iteration, per-layer and per-sequence CPU/launch costs, activation-sized
# element-wise memory passes, how much compute and memory time fail to overlap). Fitted jointly
# with GPU_EFFICIENCY by twin.calibrate:
# - "splitwise-sim": splitwise-sim's perf_model.csv (llama2-70b on A100-80GB and H100-80GB at
#   TP 2, 4, 8). That profiling stack pays ~0.25 ms per sequence per iteration, several times what
#   current serving engines spend: extrapolated to other models and to batches beyond 64 it makes
#   decode far too slow (Llama-3.1-8B on one H100 at batch 64: 34 ms a step), so it is a preset
#   for replaying that data, not the default.
# - "distserve": DistServe's fitted A100-80GB latency models (OPT-13B at TP 1, 2, 4; OPT-66B at
#   TP 2, 3, 4, 8), profiled on DistServe's own engine, whose light per-sequence costs match
#   current engines (Llama-2-70B TP8 H100 at batch 64: 31 ms a step; Llama-3.1-8B on one H100:
#   18 ms): the default.
# ``seq_overhead_s`` is paid per sequence per iteration whatever the TP; ``seq_shard_overhead_s``
# per sequence divided by TP (per-sequence work that the TP ranks split).
ENGINE_TERMS = ("overhead_s", "layer_overhead_s", "seq_overhead_s", "seq_shard_overhead_s",
                "act_traffic", "no_overlap")  # fmt: skip
ENGINE_OVERHEADS: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        "splitwise-sim": MappingProxyType(
            {
                "overhead_s": 0.0075,
                "layer_overhead_s": 5.8e-05,
                "seq_overhead_s": 0.00024,
                "seq_shard_overhead_s": 0.0,
                "act_traffic": 91.0,
                "no_overlap": 0.0,
            }
        ),
        "distserve": MappingProxyType(
            {
                "overhead_s": 0.0040,
                "layer_overhead_s": 0.0,
                "seq_overhead_s": 7.0e-05,
                "seq_shard_overhead_s": 0.0,
                "act_traffic": 28.0,
                "no_overlap": 0.73,
            }
        ),
    }
)


def engine_overheads(engine: str) -> Mapping[str, float]:
    """The software terms of serving engine ``engine`` (a key of :data:`ENGINE_OVERHEADS`)."""
    try:
        return ENGINE_OVERHEADS[engine]
    except (KeyError, TypeError):
        raise UnknownNameError("serving engine", str(engine), ENGINE_OVERHEADS) from None


def _check_fraction(name: str, v: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 < v <= 1.0:
        raise SpecError(f"roofline: {name}={v!r} must be a number in (0, 1]")
    return float(v)


def _check_nonneg(name: str, v: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v < float("inf"):
        raise SpecError(f"roofline: {name}={v!r} must be a finite number >= 0")
    return float(v)


class Roofline:
    """Analytical iteration time from the model's shapes and the GPU's peaks.

    Per iteration on one instance of ``tp x pp`` GPUs, with ``T`` new tokens
    (prefill chunk tokens plus one per decode sequence) and ``S`` sequences:

    - dense FLOPs per GPU = [2 T x (linear weights per layer) x layers
      + 2 S x hidden x vocab (LM head, once per sequence)] / TP, run at
      ``mfu``; attention FLOPs per GPU = 4 x layers x heads x head_dim x A / TP,
      where A is ``n (c + (n + 1) / 2)`` for a prefill chunk of ``n`` new
      tokens after ``c`` cached ones and the context length for each decode
      sequence, run at ``attn_mfu`` (attention kernels reach a much lower share
      of peak than GEMMs, which makes long prompts grow faster than linearly).
      compute = dense / (peak x mfu) + attention / (peak x attn_mfu), both
      times ``TP^tp_mfu_exponent``; then the sustained-power throttle: compute
      time beyond ``throttle_knee_s`` runs ``1 + throttle`` times slower
      (compute += throttle x max(compute - throttle_knee_s, 0); per GPU, see
      ``GPU_EFFICIENCY``; none for a GPU without a fitted throttle).
    - bytes per GPU = [weights + KV bytes/token x (decode contexts + cached
      prefill context read + T written)] / TP; memory = bytes / (HBM x mbu).
    - time = max(compute, memory) + no_overlap x min(compute, memory)
      + T x act_traffic x layers x hidden x dtype / (HBM x mbu)
      + overhead_s + layers x layer_overhead_s
      + S x (seq_overhead_s + seq_shard_overhead_s / TP)
      + 2 x layers ring all-reduces of ``T x hidden x dtype`` bytes, each
      ``2 (TP-1)/TP x bytes / link + 2 (TP-1) x hop_latency_s`` (link = NVLink,
      or PCIe when the GPU has none).

    ``act_traffic`` counts the activation-sized memory passes per token per
    layer of the element-wise kernels (norms, residual adds, rotary, the
    all-reduce buffer copies) that TP replicates rather than splits, so that
    term does not shrink with TP; ``no_overlap`` is the share of the shorter
    of compute and memory time that does not hide under the longer one.

    ``mfu``, ``mbu``, ``attn_mfu``, ``throttle``, ``throttle_knee_s`` and
    ``hop_latency_s`` are properties of the GPU (and its NVLink generation) and
    default per GPU (``GPU_EFFICIENCY``), else to ``DEFAULT_*`` and no
    throttle. ``overhead_s``,
    ``layer_overhead_s``, ``seq_overhead_s``, ``seq_shard_overhead_s``,
    ``act_traffic`` and ``no_overlap`` are properties of the serving software
    and default to the preset of ``engine`` (``ENGINE_OVERHEADS``: ``"distserve"``,
    the default, fitted to DistServe's engine; ``"splitwise-sim"``, fitted to
    splitwise-sim's profiles). Passing a value overrides either kind, one term at
    a time; an unknown ``engine`` raises :class:`~twin.errors.UnknownNameError`.

    NOTE: pipeline parallelism is modeled as one batch traversing the ``pp``
    stages one after another with no micro-batch overlap: the stage times add
    up to the TP-only time, plus ``pp - 1`` point-to-point activation sends
    (``T x hidden x dtype`` bytes over the link, plus one hop latency). So PP
    never shortens an iteration here, and an engine that pipelines micro-batches
    gets about ``pp`` times more throughput than this model credits.

    NOTE: ``tp_mfu_exponent`` is empirical (compute efficiency falling with
    TP); the current fit puts it at 0, the TP-replicated ``act_traffic`` term
    carrying the poor TP scaling of the measured sources instead.

    Defaults were fitted by :mod:`twin.calibrate` to the measured profiles in
    shared data (splitwise-sim llama2-70b on A100/H100 at TP 2/4/8 with the
    ``splitwise-sim`` preset, DistServe's OPT-13B/66B A100 fits with ``distserve``),
    GPU terms shared, every parameter held within a physically plausible
    bound (``twin.calibrate._BOUNDS``: mfu <= 0.85, mbu <= 0.92, attn_mfu in
    [0.1, 0.8], throttle <= 1, overheads <= 10 ms per iteration, 100 us per
    layer, 0.6 ms per sequence). All 13 sources meet the 15% median / 35%
    worst target, several with little margin (A100 TP 8 and H100 TP 8 prompt
    worst ~34%, A100 attn_mfu at its 0.8 bound). Fitted ``act_traffic`` (tens
    of passes) is more than a count of kernels gives; it also absorbs
    per-token costs of the measured engines that have no term here. Use a
    ProfileTable where accuracy matters; :func:`twin.validate.validate_perf`
    prints the errors.

    ``iteration_time`` is a pure function of the batch; everything that does
    not depend on it is precomputed here.
    """

    __slots__ = (
        "name", "sha256", "model", "gpu", "tp", "pp", "engine", "mfu", "mbu", "attn_mfu",
        "overhead_s", "layer_overhead_s", "seq_overhead_s", "seq_shard_overhead_s",
        "hop_latency_s", "tp_mfu_exponent", "act_traffic", "no_overlap", "throttle",
        "throttle_knee_s", "_flop_token", "_flop_seq", "_flop_attn", "_kv_b", "_w_b",
        "_inv_compute", "_inv_attn", "_inv_mem", "_fixed", "_seq", "_comm_token", "_comm_fixed",
    )  # fmt: skip

    def __init__(
        self,
        model: ModelSpec,
        gpu: GPUSpec,
        tp: int = 1,
        pp: int = 1,
        *,
        mfu: float | None = None,
        mbu: float | None = None,
        attn_mfu: float | None = None,
        engine: str = DEFAULT_ENGINE,
        overhead_s: float | None = None,
        layer_overhead_s: float | None = None,
        seq_overhead_s: float | None = None,
        seq_shard_overhead_s: float | None = None,
        hop_latency_s: float | None = None,
        tp_mfu_exponent: float = DEFAULT_TP_MFU_EXPONENT,
        act_traffic: float | None = None,
        no_overlap: float | None = None,
        throttle: float | None = None,
        throttle_knee_s: float | None = None,
    ) -> None:
        for label, v in (("tp", tp), ("pp", pp)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"roofline: {label}={v!r} must be a positive integer")
        if model.layers % pp:
            raise SpecError(
                f"roofline: pp={pp} does not divide {model.name}'s {model.layers} layers"
            )
        self.model, self.gpu, self.tp, self.pp = model, gpu, tp, pp
        sw = engine_overheads(engine)
        self.engine = engine
        overhead_s = sw["overhead_s"] if overhead_s is None else overhead_s
        layer_overhead_s = sw["layer_overhead_s"] if layer_overhead_s is None else layer_overhead_s
        seq_overhead_s = sw["seq_overhead_s"] if seq_overhead_s is None else seq_overhead_s
        if seq_shard_overhead_s is None:
            seq_shard_overhead_s = sw["seq_shard_overhead_s"]
        act_traffic = sw["act_traffic"] if act_traffic is None else act_traffic
        no_overlap = sw["no_overlap"] if no_overlap is None else no_overlap
        eff = GPU_EFFICIENCY.get(
            gpu.name,
            (DEFAULT_MFU, DEFAULT_MBU, DEFAULT_ATTN_MFU, *_NO_THROTTLE, DEFAULT_HOP_LATENCY_S),
        )
        self.throttle = _check_nonneg("throttle", eff[3] if throttle is None else throttle)
        knee = eff[4] if throttle_knee_s is None else throttle_knee_s
        self.throttle_knee_s = _check_nonneg("throttle_knee_s", knee)
        self.mfu = _check_fraction("mfu", eff[0] if mfu is None else mfu)
        self.mbu = _check_fraction("mbu", eff[1] if mbu is None else mbu)
        self.attn_mfu = _check_fraction("attn_mfu", eff[2] if attn_mfu is None else attn_mfu)
        self.overhead_s = _check_nonneg("overhead_s", overhead_s)
        self.layer_overhead_s = _check_nonneg("layer_overhead_s", layer_overhead_s)
        self.seq_overhead_s = _check_nonneg("seq_overhead_s", seq_overhead_s)
        self.seq_shard_overhead_s = _check_nonneg("seq_shard_overhead_s", seq_shard_overhead_s)
        if hop_latency_s is None:
            hop_latency_s = eff[5]
        self.hop_latency_s = _check_nonneg("hop_latency_s", hop_latency_s)
        self.tp_mfu_exponent = _check_nonneg("tp_mfu_exponent", tp_mfu_exponent)
        self.act_traffic = _check_nonneg("act_traffic", act_traffic)
        if (
            isinstance(no_overlap, bool)
            or not isinstance(no_overlap, int | float)
            or not (0.0 <= no_overlap <= 1.0)
        ):
            raise SpecError(f"roofline: no_overlap={no_overlap!r} must be a number in [0, 1]")
        self.no_overlap = float(no_overlap)
        self.name = f"roofline:{model.name}@{gpu.name}x{tp}" + (f"pp{pp}" if pp > 1 else "")
        if engine != DEFAULT_ENGINE:
            self.name += f":{engine}"
        self.sha256: str | None = None

        m = model
        self._flop_token = 2.0 * m.layers * m.linear_params_per_layer / tp
        self._flop_seq = 2.0 * m.hidden * m.vocab / tp
        self._flop_attn = 4.0 * m.layers * m.heads * m.head_dim / tp
        self._kv_b = m.kv_bytes_per_token() / tp
        self._w_b = m.weight_bytes / tp
        self._inv_compute = tp**self.tp_mfu_exponent / (gpu.flops_bf16 * self.mfu)
        self._inv_attn = tp**self.tp_mfu_exponent / (gpu.flops_bf16 * self.attn_mfu)
        self._inv_mem = 1.0 / (gpu.hbm_bytes_s * self.mbu)
        self._fixed = self.overhead_s + m.layers * self.layer_overhead_s
        self._seq = self.seq_overhead_s + self.seq_shard_overhead_s / tp
        link = gpu.nvlink_bytes_s if gpu.nvlink_bytes_s > 0 else gpu.pcie_bytes_s
        act = m.hidden * m.dtype_bytes  # activation bytes per token
        comm_token = self.act_traffic * m.layers * act * self._inv_mem
        comm_fixed = 0.0
        if tp > 1:
            n_ar = 2 * m.layers
            comm_token += n_ar * 2.0 * (tp - 1) / tp * act / link
            comm_fixed += n_ar * 2 * (tp - 1) * self.hop_latency_s
        if pp > 1:
            comm_token += (pp - 1) * act / link
            comm_fixed += (pp - 1) * self.hop_latency_s
        self._comm_token = comm_token  # per-token time outside the roofline max()
        self._comm_fixed = comm_fixed

    def iteration_time(self, batch: Batch) -> float:
        """Seconds for one forward pass of ``batch``; 0.0 for an empty batch."""
        n_dec = batch.decode_count
        tokens = n_dec
        attn = float(batch.decode_context_sum)
        kv_read = batch.decode_context_sum
        for n, c in batch.prefill:
            tokens += n
            attn += n * (c + (n + 1) * 0.5)
            kv_read += c
        if tokens == 0:
            return 0.0
        seqs = n_dec + len(batch.prefill)
        compute_s = (self._flop_token * tokens + self._flop_seq * seqs) * self._inv_compute + (
            self._flop_attn * attn * self._inv_attn
        )
        if compute_s > self.throttle_knee_s:  # sustained-power clock throttle (GPU_EFFICIENCY)
            compute_s += self.throttle * (compute_s - self.throttle_knee_s)
        mem_s = (self._w_b + self._kv_b * (kv_read + tokens)) * self._inv_mem
        if compute_s > mem_s:
            roof = compute_s + self.no_overlap * mem_s
        else:
            roof = mem_s + self.no_overlap * compute_s
        return roof + self._fixed + self._seq * seqs + self._comm_fixed + self._comm_token * tokens


class _Grid:
    """Piecewise-linear interpolation over rows ``k -> (xs, ys)``.

    Inside a row: linear in ``x``; below the first ``x``: clamped to the first
    value; above the last: ``above="proportional"`` scales the last value by
    ``x / x_last`` (time per token stays at the last measured rate),
    ``above="clamp"`` holds it. Across rows: linear in ``k`` between the two
    bracketing rows; below the first row clamped; above the last row
    ``extrapolate_k`` continues the slope of the last two rows (else clamps).
    """

    __slots__ = ("_ks", "_rows", "_above", "_extra_k")

    def __init__(
        self, points: dict[tuple[int, int], float], above: str, extrapolate_k: bool
    ) -> None:
        rows: dict[int, list[tuple[int, float]]] = {}
        for (k, x), y in points.items():
            rows.setdefault(k, []).append((x, y))
        self._ks = sorted(rows)
        self._rows = [
            ([float(x) for x, _ in sorted(rows[k])], [y for _, y in sorted(rows[k])])
            for k in self._ks
        ]
        self._above = above
        self._extra_k = extrapolate_k

    def _row(self, i: int, x: float) -> float:
        xs, ys = self._rows[i]
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] * x / xs[-1] if self._above == "proportional" else ys[-1]
        j = bisect_right(xs, x)
        x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def __call__(self, k: float, x: float) -> float:
        ks = self._ks
        if k <= ks[0]:
            return self._row(0, x)
        if k >= ks[-1]:
            if not self._extra_k or len(ks) == 1 or k == ks[-1]:
                return self._row(len(ks) - 1, x)
            i = len(ks) - 1
        else:
            i = bisect_right(ks, k)
            if ks[i - 1] == k:
                return self._row(i - 1, x)
        y0, y1 = self._row(i - 1, x), self._row(i, x)
        return y0 + (y1 - y0) * (k - ks[i - 1]) / (ks[i] - ks[i - 1])


def _same_name(a: str, b: str, lookup: Callable[[str], object]) -> bool:
    """Whether two spellings name the same catalog entry (``llama2-70b`` and
    ``llama-2-70b``, ``h100-80gb`` and ``h100-sxm``); names outside the catalog
    must match exactly."""
    if a == b:
        return True
    try:
        return lookup(a) == lookup(b)
    except TwinError:
        return False


class ProfileTable:
    """Iteration times interpolated from a measured table.

    Prefill: the time of ``B`` prompts of ``P`` tokens each, by ``(B, B x P)``;
    decode: the time of one step of ``B`` sequences at context ``C`` each,
    by ``(B, C)``. Interpolation is piecewise linear (see :class:`_Grid`):

    - prefill: linear in total tokens within a batch size; above the largest
      measured total, the last per-token rate continues (proportional); below
      the smallest, clamped. Linear between measured batch sizes; above the
      largest, that batch size's curve over total tokens is used.
    - decode: linear in mean context, clamped at both ends; linear between
      batch sizes, continuing the slope of the last two beyond the largest.

    A batch's prefill chunks ``(n, c)`` count as ``len(prefill)`` prompts of
    ``sum(n)`` tokens in all. NOTE: cached context ``c`` is ignored, since
    the tables are measured without prefix caching; a long cached prefix
    makes real chunks slower than priced here.

    NOTE: a mixed batch (prefill chunks and decode sequences together) is
    priced as the prefill part plus the extra a decode batch of ``B`` costs
    over a decode batch of one, ``prefill + decode(B) - decode(1)``: the
    weights are read once, so the decode part adds only its marginal cost.

    Formats (``fmt``):

    - ``splitwise``: splitwise-sim's ``perf_model.csv`` (times in ms), rows
      selected by ``model``, ``hardware`` and ``tp``; repeated runs reduced to
      their median; decode context = ``prompt_size + token_size // 2``.
    - ``native``: CSV with header ``phase,batch_size,tokens,context,time_s``;
      ``prefill`` rows give ``B`` prompts of ``tokens`` each (context 0),
      ``decode`` rows ``B`` sequences at ``context`` each (tokens 1); times in
      seconds; repeated keys reduced to their median.
    """

    __slots__ = ("name", "sha256", "_prefill", "_decode", "_decode1")

    def __init__(
        self,
        name: str,
        sha256: str | None,
        prefill: dict[tuple[int, int], float],
        decode: dict[tuple[int, int], float],
    ) -> None:
        """``prefill`` maps ``(batch size, prompt tokens each)`` and ``decode``
        maps ``(batch size, context each)`` to seconds; each needs >= 1 point."""
        if not prefill or not decode:
            raise ProfileError(
                f"profile {name}: needs both prefill and decode points "
                f"(got {len(prefill)} prefill, {len(decode)} decode)"
            )
        for (b, x), t in (*prefill.items(), *decode.items()):
            if b < 1 or x < 0 or not t > 0 or not math.isfinite(t):
                raise ProfileError(
                    f"profile {name}: bad point batch_size={b}, tokens/context={x}, time={t!r}"
                )
        self.name = name
        self.sha256 = sha256
        self._prefill = _Grid({(b, b * p): t for (b, p), t in prefill.items()},
                              "proportional", extrapolate_k=False)  # fmt: skip
        self._decode = _Grid(dict(decode), "clamp", extrapolate_k=True)
        self._decode1 = 0.0
        self._decode1 = self._decode(1, min(c for _, c in decode))

    def prefill_time(self, batch_size: int, total_tokens: int) -> float:
        """Seconds for ``batch_size`` prompts of ``total_tokens`` tokens in all."""
        return self._prefill(batch_size, total_tokens)

    def decode_time(self, batch_size: int, context_sum: int) -> float:
        """Seconds for one decode step of ``batch_size`` sequences, ``context_sum`` in all."""
        return self._decode(batch_size, context_sum / batch_size)

    def iteration_time(self, batch: Batch) -> float:
        """Seconds for ``batch`` (see the class docstring for mixed batches)."""
        n = batch.decode_count
        if not batch.prefill:
            return self._decode(n, batch.decode_context_sum / n) if n else 0.0
        t = self._prefill(len(batch.prefill), batch.prefill_tokens)
        if n:
            d = self._decode(n, batch.decode_context_sum / n) - self._decode(
                1, batch.decode_context_sum / n
            )
            t += d if d > 0.0 else 0.0
        return t

    @classmethod
    def from_splitwise(
        cls, path: Path, model: str, hardware: str, tp: int, *, where: str = ""
    ) -> ProfileTable:
        """Rows of splitwise-sim's ``perf_model.csv`` for one (model, hardware, TP)."""
        data = path.read_bytes()
        where = where or str(path)
        prefill: dict[tuple[int, int], list[float]] = {}
        decode: dict[tuple[int, int], list[float]] = {}
        combos: set[tuple[str, str, int]] = set()
        try:
            for r in csv.DictReader(io.StringIO(data.decode())):
                combo = (r["model"], r["hardware"], int(r["tensor_parallel"]))
                combos.add(combo)
                same = _same_name(combo[0], model, get_model) and _same_name(
                    combo[1], hardware, get_gpu
                )
                if combo[2] != tp or not same:
                    continue
                p, b, t = int(r["prompt_size"]), int(r["batch_size"]), int(r["token_size"])
                prefill.setdefault((b, p), []).append(float(r["prompt_time"]) / 1e3)
                decode.setdefault((b, p + t // 2), []).append(float(r["token_time"]) / 1e3)
        except (KeyError, ValueError, TypeError) as e:
            raise ProfileError(f"{where}: not a splitwise-sim perf_model.csv ({e!r})") from None
        if not prefill:
            known = ", ".join(f"{m}/{h}/tp{t}" for m, h, t in sorted(combos))
            raise ProfileError(
                f"{where}: no rows for model={model!r} hardware={hardware!r} tp={tp}; "
                f"available: {known or '(none)'}"
            )
        return cls(
            f"profile:{Path(path).name}:{model}@{hardware}x{tp}",
            hashlib.sha256(data).hexdigest(),
            {k: statistics.median(v) for k, v in prefill.items()},
            {k: statistics.median(v) for k, v in decode.items()},
        )

    @classmethod
    def from_native(cls, path: Path, *, where: str = "") -> ProfileTable:
        """A native CSV (``phase,batch_size,tokens,context,time_s``; see the class docstring)."""
        data = path.read_bytes()
        where = where or str(path)
        cols = ["phase", "batch_size", "tokens", "context", "time_s"]
        prefill: dict[tuple[int, int], list[float]] = {}
        decode: dict[tuple[int, int], list[float]] = {}
        reader = csv.DictReader(io.StringIO(data.decode()))
        if reader.fieldnames is None or list(reader.fieldnames) != cols:
            raise ProfileError(f"{where}: header {reader.fieldnames!r}; expected {','.join(cols)}")
        for line, r in enumerate(reader, start=2):
            try:
                b, n, c, t = (int(r["batch_size"]), int(r["tokens"]), int(r["context"]),
                              float(r["time_s"]))  # fmt: skip
            except (ValueError, TypeError):
                raise ProfileError(f"{where}: line {line}: bad number in {r!r}") from None
            if r["phase"] == "prefill":
                prefill.setdefault((b, n), []).append(t)
            elif r["phase"] == "decode":
                decode.setdefault((b, c), []).append(t)
            else:
                raise ProfileError(
                    f"{where}: line {line}: phase {r['phase']!r}; expected prefill or decode"
                )
        return cls(
            f"profile:{Path(path).name}",
            hashlib.sha256(data).hexdigest(),
            {k: statistics.median(v) for k, v in prefill.items()},
            {k: statistics.median(v) for k, v in decode.items()},
        )


class DistServeFit:
    """DistServe's fitted latency model (``simdistserve``), coefficients in ms.

    prefill = A + B x sum(len) + C x sum(len^2); decode = A + B x sum(context)
    + C x batch, with the small-batch coefficients when batch < threshold and
    the large-batch ones otherwise. A prefill chunk ``(n, c)`` contributes
    ``n`` to sum(len) and ``n (n + 2c)`` to sum(len^2) (the attention work of
    ``n`` new tokens after ``c`` cached ones, which is ``n^2`` without cache).
    NOTE: a mixed batch is priced as prefill + decode, as if run back to back;
    DistServe itself never mixes phases.
    """

    __slots__ = ("name", "sha256", "prefill", "decode_small", "decode_large", "threshold")

    def __init__(
        self,
        name: str,
        sha256: str | None,
        prefill: tuple[float, float, float],
        decode_small: tuple[float, float, float],
        decode_large: tuple[float, float, float],
        threshold: int,
    ) -> None:
        self.name, self.sha256 = name, sha256
        self.prefill = tuple(float(x) for x in prefill)
        self.decode_small = tuple(float(x) for x in decode_small)
        self.decode_large = tuple(float(x) for x in decode_large)
        self.threshold = int(threshold)

    @classmethod
    def from_json(cls, path: Path, model: str, tp: int, *, where: str = "") -> DistServeFit:
        """Coefficients of ``model`` (as keyed in the file, e.g. ``facebook/opt-13b``) at TP."""
        data = Path(path).read_bytes()
        where = where or str(path)
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise ProfileError(f"{where}: not JSON ({e})") from None
        entry = None
        if isinstance(doc, dict):
            key = next((k for k in doc if _same_name(k, model, get_model)), model)
            entry = doc.get(key, {}).get(str(tp)) if isinstance(doc.get(key), dict) else None
        if entry is None:
            known = ", ".join(
                f"{m} tp{t}" for m in sorted(doc) if isinstance(doc[m], dict) for t in doc[m]
            )
            raise ProfileError(
                f"{where}: no fit for model={model!r} tp={tp}; available: {known or '(none)'}"
            )
        try:
            return cls(
                f"distserve:{Path(path).name}:{model}x{tp}",
                hashlib.sha256(data).hexdigest(),
                tuple(entry["prefill"]),
                tuple(entry["decoding_smallbs"]),
                tuple(entry["decoding_largebs"]),
                entry["decoding_large_small_bs_threshold"],
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"{where}: {model} tp{tp}: malformed fit ({e!r})") from None

    def iteration_time(self, batch: Batch) -> float:
        """Seconds for ``batch`` per the fitted formulas."""
        ms = 0.0
        if batch.prefill:
            a, b, c = self.prefill
            s1 = 0
            s2 = 0
            for n, cached in batch.prefill:
                s1 += n
                s2 += n * (n + 2 * cached)
            ms += a + b * s1 + c * s2
        n = batch.decode_count
        if n:
            a, b, c = self.decode_small if n < self.threshold else self.decode_large
            ms += a + b * batch.decode_context_sum + c * n
        return ms * 1e-3


_ROOFLINE_KEYS = ("kind", "mfu", "mbu", "attn_mfu", "overhead", "layer_overhead",
                  "seq_overhead", "seq_shard_overhead", "hop_latency", "tp_mfu_exponent",
                  "act_traffic", "no_overlap", "throttle", "throttle_knee", "engine")  # fmt: skip
_PROFILE_KEYS = ("kind", "path", "format", "model", "hardware", "tp")
_DISTSERVE_KEYS = ("kind", "path", "model", "tp")
_KINDS = {"roofline": _ROOFLINE_KEYS, "profile": _PROFILE_KEYS, "distserve": _DISTSERVE_KEYS}


def build_perf_model(
    spec: Mapping[str, object] | None,
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int,
    pp: int = 1,
    where: str = "",
    base_dir: Path | None = None,
) -> PerfModel:
    """A perf model from a YAML mapping; ``None`` is the calibrated Roofline.

    ``{kind: roofline, engine: distserve|splitwise-sim, mfu: 0.5, mbu: 0.8, attn_mfu: 0.3,
    overhead: "4 ms", layer_overhead, seq_overhead, seq_shard_overhead,
    hop_latency, tp_mfu_exponent, act_traffic, no_overlap, throttle,
    throttle_knee}`` (durations with
    units; unset efficiencies default per GPU, unset software terms to the
    ``engine`` preset, itself ``distserve`` by default);
    ``{kind: profile, path, format: splitwise|native, model, hardware, tp}``
    (``model``/``hardware``/``tp`` select splitwise rows and default to the
    instance's model name, GPU name and TP); ``{kind: distserve, path, model,
    tp}``. Relative paths resolve against ``base_dir``. ``where`` prefixes
    error messages (``"spec.yaml: perf"``).
    """
    w = where or "perf"
    if spec is None:
        return Roofline(model, gpu, tp, pp)
    if not isinstance(spec, Mapping):
        raise SpecError(f"{w}: {spec!r} must be a mapping with a 'kind'")
    kind = spec.get("kind")
    if kind not in _KINDS:
        raise SpecError(f"{w}.kind: {kind!r}; expected one of {', '.join(_KINDS)}")
    allowed = _KINDS[kind]
    for key in spec:
        if key not in allowed:
            raise SpecError(
                f"{w}: unknown key {key!r} for kind {kind}; expected one of {', '.join(allowed)}"
            )
    if kind == "roofline":
        kw: dict[str, float] = {}
        engine = spec.get("engine", DEFAULT_ENGINE)
        if not isinstance(engine, str):
            known = ", ".join(ENGINE_OVERHEADS)
            raise SpecError(f"{w}.engine: {engine!r}; expected one of {known}")
        engine_overheads(engine)  # UnknownNameError (with suggestions) for a misspelled name
        for key in ("mfu", "mbu", "attn_mfu"):
            if key in spec:
                v = spec[key]
                if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
                    raise SpecError(f"{w}.{key}: {v!r} must be a number in (0, 1]")
                kw[key] = float(v)
        if "tp_mfu_exponent" in spec:
            v = spec["tp_mfu_exponent"]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 2:
                raise SpecError(f"{w}.tp_mfu_exponent: {v!r} must be a number in [0, 2]")
            kw["tp_mfu_exponent"] = float(v)
        if "act_traffic" in spec:
            v = spec["act_traffic"]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1e4:
                raise SpecError(f"{w}.act_traffic: {v!r} must be a number in [0, 10000)")
            kw["act_traffic"] = float(v)
        if "throttle" in spec:
            v = spec["throttle"]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 10:
                raise SpecError(f"{w}.throttle: {v!r} must be a number in [0, 10]")
            kw["throttle"] = float(v)
        if "no_overlap" in spec:
            v = spec["no_overlap"]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
                raise SpecError(f"{w}.no_overlap: {v!r} must be a number in [0, 1]")
            kw["no_overlap"] = float(v)
        for key in ("overhead", "layer_overhead", "seq_overhead", "seq_shard_overhead",
                    "hop_latency", "throttle_knee"):  # fmt: skip
            if key in spec:
                try:
                    kw[f"{key}_s"] = parse_duration(spec[key])
                except UnitError as e:
                    raise SpecError(f"{w}.{key}: {e}") from None
                if kw[f"{key}_s"] < 0:
                    raise SpecError(f"{w}.{key}: {spec[key]!r} must be >= 0")
        return Roofline(model, gpu, tp, pp, engine=engine, **kw)
    if "path" not in spec or not isinstance(spec["path"], str):
        raise SpecError(f"{w}.path: {spec.get('path')!r}; expected a file path")
    path = Path(spec["path"])
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise SpecError(f"{w}.path: {str(path)!r} is not a file")
    sel_tp = spec.get("tp", tp)
    if isinstance(sel_tp, bool) or not isinstance(sel_tp, int) or sel_tp < 1:
        raise SpecError(f"{w}.tp: {sel_tp!r} must be a positive integer")
    if kind == "distserve":
        name = spec.get("model", model.name)
        return DistServeFit.from_json(path, str(name), sel_tp, where=f"{w}: {path}")
    fmt = spec.get("format", "auto")
    if fmt == "auto":
        head = path.open("rb").readline()
        fmt = "splitwise" if b"tensor_parallel" in head else "native"
    if fmt == "native":
        return ProfileTable.from_native(path, where=f"{w}: {path}")
    if fmt == "splitwise":
        return ProfileTable.from_splitwise(
            path,
            str(spec.get("model", model.name)),
            str(spec.get("hardware", gpu.name)),
            sel_tp,
            where=f"{w}: {path}",
        )
    raise SpecError(f"{w}.format: {fmt!r}; expected one of splitwise, native")
