"""The Roofline: iteration time from the model's FLOPs and bytes on the GPU's peaks,
at efficiencies calibrated against measured profiles (``python -m twin.perf.calibrate``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from twin._check import is_int, is_number
from twin.errors import SpecError, UnknownNameError
from twin.perf.gpus import GPUSpec
from twin.perf.iteration import VECTOR_STEPS, Batch
from twin.perf.llm import ModelSpec
from twin.perf.vllm import VLLM_TERMS

if TYPE_CHECKING:
    pass

# Calibrated defaults: fitted where traffic is, by twin.perf.calibrate.fit_weighted (``python -m
# twin.studies.fidelity --data DIR``, which refines the current values), jointly over the 19
# whole-iteration sources of twin.perf.validate (splitwise-sim llama2-70b on A100-80GB, H100-80GB
# and the power-capped H100 at TP 2/4/8 and bloom-176b at TP 8, DistServe's OPT-13B/66B fits):
# the GPU terms per GPU family, the capped H100's sustained clock and the software terms per
# serving engine (ENGINE_OVERHEADS), every parameter held within twin.perf.calibrate._BOUNDS
# (mfu <= 0.85, mbu <= 0.92, attn_mfu in [0.1, 0.8], throttle <= 1, l2_speedup in [1, 4],
# overheads <= 10 ms per iteration, 100 us per layer, 0.6 ms per sequence, 20 us per all-reduce
# step). Target: for each source, the median of its errors weighted by the iterations that the
# azure-conv, azure-code and mooncake workloads form on it (twin.studies.fidelity) <= 10% for
# prompt time and time per output token; each point of splitwise-sim's decode batch series
# (batch 1 to 64 at context 576) within 10%; no grid point beyond 35%; iteratively reweighted
# least squares (see twin.perf.calibrate.WEIGHTED_FACTOR); rounded here. The grid-wide 15%
# median / 35% worst fit (twin.perf.calibrate.fit_sources) is kept for held-out checks.
# Vidur's GEMM-only sources are scored, not fitted (see docs/guides/fidelity.md).
# DEFAULT_MFU / DEFAULT_MBU / DEFAULT_ATTN_MFU are for GPUs without fitted values, which get no
# throttle and no L2 speed-up either: they are the A100 values of an earlier fit without a
# throttle term, which average over short and long iterations. DEFAULT_HOP_LATENCY_S is that
# fit's A100 value.
DEFAULT_MFU = 0.82


DEFAULT_MBU = 0.86
DEFAULT_ATTN_MFU = 0.57
DEFAULT_HOP_LATENCY_S = 7.4e-06
DEFAULT_TP_MFU_EXPONENT = 0.0
DEFAULT_ENGINE = "vllm"


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
# Fitted with the L2 term (l2_speedup, see Roofline and L2_BYTES), which carries the rise of the
# time per prompt token past 2k to 4k tokens that the throttle carried before, the throttle is
# all but off: A100 1.3e-4 past 3.2 s, H100 1.8e-4 past 4.9 s (power-capped GPUs keep their
# sustained_clock); activation passes in L2 1.97x (A100) and 2.55x (H100) as fast as from HBM;
# hop latency 4.3 us on A100 (NVLink 3) and 1.2 us on H100 (NVLink 4), where the splitwise-sim
# preset's hop_overhead_s (4.1 us per ring step) carries most of the measured cost. H100's
# attn_mfu is held at 0.646 (the previous fit's): freed, the fit drives it to its 0.1 floor,
# which prices DeepSeek-V3's published prefill 44% under (twin.studies.moe_fidelity).
# Tuple order: mfu, mbu, attn_mfu, throttle, throttle_knee_s, l2_speedup, hop_latency_s.
_A100_EFF = (0.85, 0.92, 0.197, 0.000129, 3.21, 1.97, 4.27e-06)


_H100_EFF = (0.727, 0.92, 0.646, 0.000178, 4.86, 2.55, 1.23e-06)
# L40S (Ada, GDDR6, no NVLink; peaks in twin.perf.gpus from its datasheet): no measured
# profile or run of it is in reach, so nothing is fitted. The shares of peak are the H100's
# (the same cuBLAS/CUTLASS GEMMs and FlashAttention kernels; Hopper's fitted mbu 0.92 taken for
# GDDR6 as well), no throttle and no L2 term fitted, and the all-reduce hop latency is the
# default (PCIe peer-to-peer, no NVLink). Bounds: mfu in [0.5, 0.85], mbu in [0.75, 0.92].
_L40S_EFF = (0.727, 0.92, 0.646, 0.0, 0.0, 1.0, DEFAULT_HOP_LATENCY_S)
GPU_EFFICIENCY: Mapping[str, tuple[float, float, float, float, float, float, float]] = (
    MappingProxyType(
        {
            "a100-80gb": _A100_EFF,
            "a100-40gb": _A100_EFF,
            "h100-sxm": _H100_EFF,
            "h100-80gb-pcap": _H100_EFF,
            "h200": _H100_EFF,
            "h800": _H100_EFF,
            "l40s": _L40S_EFF,
        }
    )
)
_NO_THROTTLE = (0.0, 0.0)
_NO_L2 = 1.0

# L2 cache per GPU, bytes, from the vendor whitepapers: NVIDIA A100 Tensor Core GPU
# Architecture (2020): 40 MB on the A100 (40 GB and 80 GB alike); NVIDIA H100 Tensor Core GPU
# Architecture (2022): 50 MB on the H100 SXM5, the same die in the H200 and H800. A GPU not
# named here gets no L2 term (every activation pass priced at HBM bandwidth).
L2_BYTES: Mapping[str, float] = MappingProxyType(
    {
        "a100-80gb": 40e6,
        "a100-40gb": 40e6,
        "h100-sxm": 50e6,
        "h100-80gb-pcap": 50e6,
        "h200": 50e6,
        "h800": 50e6,
    }
)


def l2_tokens(gpu: GPUSpec, model: ModelSpec) -> float:
    """How many tokens' activations (``hidden x dtype`` bytes each, the tensor every
    element-wise pass of a layer streams) fit in ``gpu``'s L2 cache; 0 without one in
    :data:`L2_BYTES`."""
    return L2_BYTES.get(gpu.name, 0.0) / (model.hidden * model.dtype_bytes)


# Software terms of the Roofline per serving engine: what the serving software adds on top of the
# GPU's roofline (per-iteration, per-layer and per-sequence CPU/launch costs, activation-sized
# element-wise memory passes, how much compute and memory time fail to overlap). "vllm" (the
# default; twin.perf.vllm, each term's source there) is fitted to measured vLLM V1 serving runs
# by twin calibrate --runs; the other two jointly with GPU_EFFICIENCY by
# twin.perf.calibrate.fit_weighted:
# - "splitwise-sim": splitwise-sim's perf_model.csv (llama2-70b on A100-80GB, H100-80GB and the
#   capped H100 at TP 2, 4, 8, bloom-176b at TP 8). That profiling stack pays ~0.22 ms per
#   sequence per iteration, several times what current serving engines spend: extrapolated to
#   other models and to batches beyond 64 it makes decode far too slow (Llama-3.1-8B on one H100
#   at batch 64: 32 ms a step), so it is a preset for replaying that data, not the default.
# - "distserve": DistServe's fitted A100-80GB latency models (OPT-13B at TP 1, 2, 4; OPT-66B at
#   TP 2, 3, 4, 8), profiled on DistServe's own engine, whose light per-sequence costs match
#   current engines (Llama-2-70B TP8 H100 at batch 64: 26 ms a step; Llama-3.1-8B on one H100:
#   18 ms): the bundled experiments' preset.
# ``seq_overhead_s`` is paid per sequence per iteration whatever the TP; ``seq_shard_overhead_s``
# per sequence divided by TP (per-sequence work that the TP ranks split).
ENGINE_TERMS = ("overhead_s", "layer_overhead_s", "seq_overhead_s", "seq_shard_overhead_s",
                "act_traffic", "no_overlap", "hop_overhead_s")  # fmt: skip
# Kernel terms a preset may add (absent: 1.0): the share of the GPU's achieved HBM bandwidth
# (``mbu``) that the engine's fused mixture-of-experts kernel reaches reading expert weights.
KERNEL_TERMS = ("moe_efficiency",)


ENGINE_OVERHEADS: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        "vllm": VLLM_TERMS,
        "splitwise-sim": MappingProxyType(
            {
                "overhead_s": 0.00571,
                "layer_overhead_s": 0.0001,
                "seq_overhead_s": 0.000216,
                "seq_shard_overhead_s": 0.0,
                "act_traffic": 119.0,
                "no_overlap": 0.664,
                "hop_overhead_s": 4.14e-06,
            }
        ),
        "distserve": MappingProxyType(
            {
                "overhead_s": 0.00175,
                "layer_overhead_s": 0.0001,
                "seq_overhead_s": 5.26e-05,
                "seq_shard_overhead_s": 0.0,
                "act_traffic": 100.0,
                "no_overlap": 1.0,
                "hop_overhead_s": 0.0,
            }
        ),
    }
)


# Precisions of the MoE dispatch all-to-all (``moe_dispatch_dtype``; unset: the activations'
# dtype, the model's ``dtype_bytes``). FP8: one byte per element plus one float32 scale per 128
# elements of a token, the fine-grained (1 x 128 tile) activation quantization of DeepSeek-V3
# (arXiv 2412.19437, 3.3.2) that DeepEP carries as data plus scale factors; DeepSeek-V3 quantizes
# the activations to FP8 before dispatch and keeps the combine in BF16 (3.3), as DeepEP's
# benchmarks do ("FP8 dispatching, and BF16 combining", deepseek-ai/DeepEP README, Performance).
DISPATCH_DTYPES = ("bf16", "fp8")
FP8_SCALE_GROUP = 128  # elements per float32 scale (DeepSeek-V3 report, 3.3.2)
FP8_SCALE_BYTES = 4
# Overlap of the all-to-alls with compute (``moe_overlap``): "two-batch" splits an iteration
# into two micro-batches so that one's dispatch and combine run while the other computes
# (DeepSeek's dual-batch overlap, open-infra-index day-6 overview; SGLang's two-batch
# overlap, LMSYS blog 2025-05-05; vLLM's --enable-dbo). See Roofline.iteration_time.
MOE_OVERLAPS = ("none", "two-batch")


def dispatch_bytes(hidden: int, dtype: str) -> float:
    """Bytes of one token's activations in the dispatch all-to-all at ``dtype``
    (:data:`DISPATCH_DTYPES`): 2 per element in BF16; in FP8 one per element
    plus a float32 scale per :data:`FP8_SCALE_GROUP` elements."""
    if dtype == "fp8":
        return hidden + -(-hidden // FP8_SCALE_GROUP) * FP8_SCALE_BYTES
    return 2.0 * hidden


def remote_nodes(experts: int, k: int, nodes: float, limit: int) -> float:
    """Expected nodes other than its own that a token's ``k`` experts lie on,
    the experts spread evenly over ``nodes`` nodes and routed uniformly (a
    node holds none of them with probability ``C(E - E/N, k) / C(E, k)``),
    scaled down when the nodes reached exceed ``limit`` (node-limited
    routing: DeepSeek-V3 sends a token to at most 4 nodes, arXiv 2412.19437,
    2.1.2). NOTE: the cap is applied to the mean number of nodes reached, not
    to each token's."""
    per_node = experts / nodes
    p_none = 1.0
    for i in range(k):
        p_none *= max(0.0, (experts - per_node - i) / (experts - i))
    reached = nodes * (1.0 - p_none)
    remote = (nodes - 1.0) * (1.0 - p_none)
    return remote * limit / reached if reached > limit else remote


def halves(batch: Batch) -> tuple[Batch, Batch] | None:
    """``batch`` split into two micro-batches of (near) equal new tokens, or
    ``None`` when it has a single token. Decode sequences split by count (the
    first half ``n // 2`` of them, contexts pro rata, floored); the prefill
    tokens fill the first half up to the midpoint, the chunk it falls in cut in
    two (the second piece after the first in the KV cache), as SGLang's
    two-chunk split does."""
    n = batch.decode_count
    d1 = n // 2
    c1 = batch.decode_context_sum * d1 // n if n else 0
    half = (batch.prefill_tokens + n) // 2 - d1  # the first half's prefill tokens
    first: list[tuple[int, int]] = []
    second: list[tuple[int, int]] = []
    seen = 0
    for new, cached in batch.prefill:
        if seen >= half:
            second.append((new, cached))
        elif seen + new <= half:
            first.append((new, cached))
        else:
            k = half - seen
            first.append((k, cached))
            second.append((new - k, cached + k))
        seen += new
    a = Batch(tuple(first), d1, c1)
    b = Batch(tuple(second), n - d1, batch.decode_context_sum - c1)
    return None if a.is_empty or b.is_empty else (a, b)


def fp8_gemm_ratio(model: ModelSpec, gpu: GPUSpec) -> float:
    """What a weight GEMM FLOP of ``model`` counts for at ``gpu``'s BF16 peak: FP8 weights
    (``weight_dtype_bytes`` 1) run on FP8 tensor cores where the GPU has them, the
    activations quantized on the fly (FP8 W8A8, as vLLM runs FP8 checkpoints), so
    ``flops_bf16 / flops_fp8``; exactly 1.0 otherwise (BF16 weights, or no FP8 peak)."""
    if model.weight_bytes_per_param == 1 and gpu.flops_fp8 > 0:
        return gpu.flops_bf16 / gpu.flops_fp8
    return 1.0


def engine_overheads(engine: str) -> Mapping[str, float]:
    """The software terms of serving engine ``engine`` (a key of :data:`ENGINE_OVERHEADS`)."""
    try:
        return ENGINE_OVERHEADS[engine]
    except (KeyError, TypeError):
        raise UnknownNameError("serving engine", str(engine), ENGINE_OVERHEADS) from None


def _check_fraction(name: str, v: float) -> float:
    if not is_number(v) or not 0.0 < v <= 1.0:
        raise SpecError(f"roofline: {name}={v!r} must be a number in (0, 1]")
    return float(v)


def positive_float_or(v: float, name: str) -> float:
    """``v`` as a float when it is a finite number > 0, else a :class:`SpecError`."""
    if not is_number(v) or not 0.0 < v < float("inf"):
        raise SpecError(f"roofline: {name}={v!r} must be a finite number > 0")
    return float(v)


def _check_nonneg(name: str, v: float) -> float:
    if not is_number(v) or not 0.0 <= v < float("inf"):
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
      + (T - R + R / l2_speedup) x act_traffic x layers x hidden x dtype / (HBM x mbu),
      R = min(T, L2 tokens)
      + overhead_s + layers x layer_overhead_s
      + S x (seq_overhead_s + seq_shard_overhead_s / TP)
      + 2 x layers ring all-reduces of ``T x hidden x dtype`` bytes, each
      ``2 (TP-1)/TP x bytes / link + 2 (TP-1) x (hop_latency_s + hop_overhead_s)``
      (link = NVLink, or PCIe when the GPU has none).

    ``act_traffic`` counts the activation-sized memory passes per token per
    layer of the element-wise kernels (norms, residual adds, rotary, the
    all-reduce buffer copies) that TP replicates rather than splits, so that
    term does not shrink with TP; ``no_overlap`` is the share of the shorter
    of compute and memory time that does not hide under the longer one.
    L2 tokens (:func:`l2_tokens`) is how many tokens' activations (``hidden x
    dtype`` bytes each) fit in the GPU's L2 cache (:data:`L2_BYTES`); while an
    iteration's activation tensor fits, its passes hit L2, ``l2_speedup``
    times faster than HBM, and the tokens beyond it stream from HBM: an
    iteration's time per token rises once its tokens outgrow L2 (2k to 4k
    tokens of a hidden size of 8,192), independent of TP, as splitwise-sim's
    prompt times do (Llama-2-70B H100 TP 8: 58 us per token from 1,024 to
    2,048 tokens, 124 us from 2,048 to 4,096). ``hop_overhead_s`` is the
    serving software's own latency per ring step of an all-reduce (its
    collective library and launch path), on top of the link's
    ``hop_latency_s``.

    ``mfu``, ``mbu``, ``attn_mfu``, ``throttle``, ``throttle_knee_s``,
    ``l2_speedup`` and ``hop_latency_s`` are properties of the GPU (and its
    NVLink generation) and default per GPU (``GPU_EFFICIENCY``), else to
    ``DEFAULT_*``, no throttle and no L2 speed-up. ``overhead_s``,
    ``layer_overhead_s``, ``seq_overhead_s``, ``seq_shard_overhead_s``,
    ``act_traffic``, ``no_overlap`` and ``hop_overhead_s`` are properties of the serving software
    and default to the preset of ``engine`` (``ENGINE_OVERHEADS``: ``"vllm"``, the
    default, fitted to measured vLLM V1 runs, :mod:`twin.perf.vllm`; ``"distserve"``,
    fitted to DistServe's engine; ``"splitwise-sim"``, fitted to splitwise-sim's
    profiles); a preset may add ``moe_efficiency`` (:data:`KERNEL_TERMS`), the
    share of ``mbu`` its fused-MoE kernel reaches reading expert weights (1 when
    absent). FP8 weights (``weight_dtype_bytes`` 1) run their weight GEMMs at the
    GPU's FP8 peak where it has one (:func:`fp8_gemm_ratio`). Passing a value
    overrides either kind, one term at a time; an unknown ``engine`` raises
    :class:`~twin.errors.UnknownNameError`.

    Pipeline parallelism: the ``pp`` stages split the TP-only time evenly,
    and each stage after the first first receives the activations from the one
    before (``T x hidden x dtype`` bytes over the link, plus one hop latency).
    ``iteration_time`` is a batch's latency through all stages, the TP-only
    time plus ``pp - 1`` sends; :meth:`stage_times` gives the time it holds
    each stage, so the engine can keep up to ``pp`` micro-batches in flight
    (:class:`~twin.perf.iteration.Pipelined`): in steady state one batch
    leaves per stage time (TP-only time / pp + one send), about ``pp`` times
    the throughput of one batch at a time. NOTE: the per-iteration software
    overheads are split over the stages with the rest (as DistServe's simulator
    splits its fit's intercept); the LM head, on the last stage only in a real
    engine, is spread evenly too.

    NOTE: ``tp_mfu_exponent`` is empirical (compute efficiency falling with
    TP); the current fit puts it at 0, the TP-replicated ``act_traffic`` term
    carrying the poor TP scaling of the measured sources instead.

    Defaults were fitted by :func:`twin.perf.calibrate.fit_weighted` to the
    measured profiles in shared data (splitwise-sim on A100/H100 with the
    ``splitwise-sim`` preset, DistServe's OPT-13B/66B A100 fits with
    ``distserve``), GPU terms shared, every parameter held within a physically
    plausible bound (``twin.perf.calibrate._BOUNDS``), weighted by where the
    bundled workloads' iterations fall (see the comment above
    :data:`DEFAULT_MFU`). Several terms sit at a bound (A100 mfu 0.85, mbu 0.92 on
    both GPUs, 100 us per layer); fitted ``act_traffic``
    (about a hundred passes) is more than a count of kernels gives: it also
    absorbs per-token costs of the measured engines that have no term here.
    Use a ProfileTable where accuracy matters;
    :func:`twin.perf.validate.validate_perf` prints the errors.

    Mixture of experts (``model.experts > 0``): the dense part above covers
    attention, the dense layers, the shared experts and the router, run by
    ``dp`` data-parallel attention ranks of ``tp`` GPUs (FLOPs, KV reads,
    activation passes and per-sequence costs over ``dp x tp``; the non-expert
    weights read by every rank); :meth:`moe_time` adds each MoE layer's routed
    experts and, under ``ep`` > 1, its two all-to-alls, priced on the links
    given (``a2a_*``, from :func:`twin.net.topology.all_to_all_links`).
    Three options of the all-to-alls, each off by default: ``moe_dispatch_dtype``
    (``"fp8"``: the dispatch at :func:`dispatch_bytes`, the combine at the
    activations' dtype, as DeepEP runs them); ``moe_dispatch_nodes`` (a
    token crosses the NICs once per node it reaches, at most that many, and
    is forwarded over NVLink there: :func:`remote_nodes`); ``moe_overlap``
    (``"two-batch"``: :meth:`overlapped_time`). They change nothing without
    EP or for a dense model.

    Multi-head latent attention (``model.kv_lora_rank > 0``, DeepSeek): a
    decode step runs the absorbed form (the K up-projection folded into the
    query and the V one into the output, attention over the cached latent:
    ``2 x heads x (2 kv_lora_rank + qk_rope)`` FLOPs per context token and
    layer), a prefill chunk the non-absorbed one (``2 x heads x (qk_nope +
    qk_rope + v_head)`` per (query, key) pair, plus its cached tokens'
    latents up-projected to K and V); :meth:`ModelSpec.attn_flops_per_pair`.
    Sliding-window layers (``model.sliding_layers``, GPT-OSS) attend and read
    the KV of at most ``sliding_window`` tokens; see :meth:`_special_time`.

    ``iteration_time`` is a pure function of the batch; everything that does
    not depend on it is precomputed here.
    """

    __slots__ = (
        "name", "sha256", "model", "gpu", "tp", "pp", "engine", "mfu", "mbu", "attn_mfu",
        "overhead_s", "layer_overhead_s", "seq_overhead_s", "seq_shard_overhead_s",
        "hop_latency_s", "tp_mfu_exponent", "act_traffic", "no_overlap", "hop_overhead_s",
        "throttle",
        "throttle_knee_s", "l2_speedup", "moe_efficiency", "_fp8",
        "_flop_token", "_flop_seq", "_flop_attn", "_kv_b", "_w_b",
        "_inv_compute", "_inv_attn", "_inv_mem", "_fixed", "_seq", "_comm_token", "_comm_fixed",
        "_act_token", "_act_l2", "_act_ranks", "_gemm_w_b",
        "_p2p_token", "_p2p_fixed", "ep", "dp", "expert_skew", "a2a_intra_bytes_s",
        "a2a_inter_bytes_s", "a2a_ranks_per_node", "a2a_latency_s", "_moe", "_e_local",
        "_e_flop", "_e_bytes", "_a2a_token", "_a2a_fixed", "_special", "_fa_pre", "_fa_dec",
        "_flop_ctx", "_kv_layer", "_full_layers", "_slide_layers", "_window",
        "moe_dispatch_dtype", "moe_overlap", "moe_dispatch_nodes", "moe_overlap_min_tokens",
        "_a2a_dispatch",
        "_a2a_combine", "_plain",
    )  # fmt: skip

    def __init__(  # noqa: C901
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
        hop_overhead_s: float | None = None,
        throttle: float | None = None,
        throttle_knee_s: float | None = None,
        l2_speedup: float | None = None,
        moe_efficiency: float | None = None,
        ep: int = 1,
        dp: int = 1,
        expert_skew: float = 0.0,
        a2a_intra_bytes_s: float | None = None,
        a2a_inter_bytes_s: float | None = None,
        a2a_ranks_per_node: int | None = None,
        a2a_latency_s: float | None = None,
        moe_dispatch_dtype: str | None = None,
        moe_overlap: str = "none",
        moe_dispatch_nodes: int | None = None,
        moe_overlap_min_tokens: int = 0,
    ) -> None:
        for label, v in (("tp", tp), ("pp", pp), ("ep", ep), ("dp", dp)):
            if not is_int(v) or v < 1:
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
        hop_overhead_s = sw["hop_overhead_s"] if hop_overhead_s is None else hop_overhead_s
        if moe_efficiency is None:
            moe_efficiency = sw.get("moe_efficiency", 1.0)
        self.moe_efficiency = _check_fraction("moe_efficiency", moe_efficiency)
        eff = GPU_EFFICIENCY.get(
            gpu.name,
            (DEFAULT_MFU, DEFAULT_MBU, DEFAULT_ATTN_MFU, *_NO_THROTTLE, _NO_L2,
             DEFAULT_HOP_LATENCY_S),
        )  # fmt: skip
        l2 = eff[5] if l2_speedup is None else l2_speedup
        if not is_number(l2) or not 1.0 <= l2 < float("inf"):
            raise SpecError(f"roofline: l2_speedup={l2!r} must be a finite number >= 1")
        self.l2_speedup = float(l2)
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
            hop_latency_s = eff[6]
        self.hop_latency_s = _check_nonneg("hop_latency_s", hop_latency_s)
        self.hop_overhead_s = _check_nonneg("hop_overhead_s", hop_overhead_s)
        self.tp_mfu_exponent = _check_nonneg("tp_mfu_exponent", tp_mfu_exponent)
        self.act_traffic = _check_nonneg("act_traffic", act_traffic)
        if not is_number(no_overlap) or not 0.0 <= no_overlap <= 1.0:
            raise SpecError(f"roofline: no_overlap={no_overlap!r} must be a number in [0, 1]")
        self.no_overlap = float(no_overlap)
        self.name = f"roofline:{model.name}@{gpu.name}x{tp}" + (f"pp{pp}" if pp > 1 else "")
        if engine != DEFAULT_ENGINE:
            self.name += f":{engine}"
        self.sha256: str | None = None

        m = model
        self._fp8 = fp8_gemm_ratio(m, gpu)
        self._flop_token = 2.0 * m.layers * m.linear_params_per_layer / tp * self._fp8
        self._flop_seq = 2.0 * m.hidden * m.vocab / tp
        self._flop_attn = 4.0 * m.layers * m.heads * m.head_dim / tp
        self._kv_b = m.kv_bytes_per_token_tp(tp) / tp  # per GPU: KV heads replicated past tp
        self._w_b = m.weight_bytes / tp
        self._gemm_w_b = m.layers * m.linear_params_per_layer * m.weight_bytes_per_param / tp
        # the peak at the clock the GPU sustains under its power limit (GPUSpec.sustained_clock)
        self._inv_compute = tp**self.tp_mfu_exponent / (gpu.sustained_flops * self.mfu)
        self._inv_attn = tp**self.tp_mfu_exponent / (gpu.sustained_flops * self.attn_mfu)
        self._inv_mem = 1.0 / (gpu.hbm_bytes_s * self.mbu)
        self._fixed = self.overhead_s + m.layers * self.layer_overhead_s
        self._seq = self.seq_overhead_s + self.seq_shard_overhead_s / tp
        link = gpu.nvlink_bytes_s if gpu.nvlink_bytes_s > 0 else gpu.pcie_bytes_s
        act = m.hidden * m.dtype_bytes  # activation bytes per token
        # activation passes: per token at HBM bandwidth, the first _act_l2 tokens (those
        # whose activations fit in L2) l2_speedup times faster (see _act_time)
        self._act_token = self.act_traffic * m.layers * act * self._inv_mem
        self._act_l2 = l2_tokens(gpu, m)
        self._act_ranks = 1
        comm_token = 0.0
        comm_fixed = 0.0
        if tp > 1:
            n_ar = 2 * m.layers
            comm_token += n_ar * 2.0 * (tp - 1) / tp * act / link
            comm_fixed += n_ar * 2 * (tp - 1) * (self.hop_latency_s + self.hop_overhead_s)
        # one point-to-point activation send between pipeline stages
        self._p2p_token = act / link if pp > 1 else 0.0
        self._p2p_fixed = self.hop_latency_s if pp > 1 else 0.0
        if pp > 1:
            comm_token += (pp - 1) * act / link
            comm_fixed += (pp - 1) * self.hop_latency_s
        self._comm_token = comm_token  # per-token time outside the roofline max()
        self._comm_fixed = comm_fixed
        self.ep, self.dp = ep, dp
        self.expert_skew = _check_nonneg("expert_skew", expert_skew)
        self.a2a_intra_bytes_s: float | None = None
        self.a2a_inter_bytes_s: float | None = None
        self.a2a_latency_s: float | None = None
        self.a2a_ranks_per_node: int | None = None
        if moe_dispatch_dtype is not None and moe_dispatch_dtype not in DISPATCH_DTYPES:
            raise SpecError(
                f"roofline: moe_dispatch_dtype={moe_dispatch_dtype!r}; expected one of"
                f" {', '.join(DISPATCH_DTYPES)}"
            )
        if moe_overlap not in MOE_OVERLAPS:
            raise SpecError(
                f"roofline: moe_overlap={moe_overlap!r}; expected one of {', '.join(MOE_OVERLAPS)}"
            )
        if moe_dispatch_nodes is not None and (
            not is_int(moe_dispatch_nodes) or moe_dispatch_nodes < 1
        ):
            raise SpecError(
                f"roofline: moe_dispatch_nodes={moe_dispatch_nodes!r} must be a positive integer"
            )
        if not is_int(moe_overlap_min_tokens) or moe_overlap_min_tokens < 0:
            raise SpecError(
                f"roofline: moe_overlap_min_tokens={moe_overlap_min_tokens!r} must be an"
                " integer >= 0"
            )
        if moe_overlap_min_tokens and moe_overlap != "two-batch":
            raise SpecError(
                f"roofline: moe_overlap_min_tokens={moe_overlap_min_tokens!r} acts only with"
                " moe_overlap='two-batch'"
            )
        self.moe_overlap_min_tokens = moe_overlap_min_tokens
        self.moe_dispatch_dtype = moe_dispatch_dtype
        self.moe_overlap = moe_overlap
        self.moe_dispatch_nodes = moe_dispatch_nodes
        self._a2a_dispatch = self._a2a_combine = 0.0  # their shares of _a2a_token
        self._plain: Roofline | None = None  # this model without overlap (two-batch only)
        self._moe = m.experts > 0
        self._e_local = self._e_flop = self._e_bytes = self._a2a_token = self._a2a_fixed = 0.0
        if self._moe:
            self._init_moe(link, a2a_intra_bytes_s, a2a_inter_bytes_s, a2a_ranks_per_node,
                           a2a_latency_s)  # fmt: skip
        elif ep > 1 or dp > 1:
            raise SpecError(
                f"roofline: ep/dp above 1 need a mixture-of-experts model, not {m.name}"
            )
        if ep > 1:
            self.name += f"ep{ep}"
        if dp > 1:
            self.name += f"dp{dp}"
        if moe_dispatch_dtype is not None and self._moe and ep > 1:
            self.name += f":dispatch-{moe_dispatch_dtype}"
        if moe_dispatch_nodes is not None and self._moe and ep > 1:
            self.name += f":nodes{moe_dispatch_nodes}"
        # latent attention and sliding windows: iteration_time's second path (_special_time)
        ranks = tp * dp
        self._special = m.is_mla or m.sliding_layers > 0
        self._fa_pre = m.attn_flops_per_pair() / ranks  # per layer and (query, key) pair
        self._fa_dec = m.attn_flops_per_pair(absorbed=True) / ranks
        self._flop_ctx = 2.0 * m.layers * m.kv_up_params_per_layer / ranks  # per cached token
        self._kv_layer = self._kv_b / m.layers
        self._full_layers = m.layers - m.sliding_layers
        self._slide_layers = m.sliding_layers
        self._window = m.sliding_window
        if moe_overlap == "two-batch" and self._moe and ep > 1:
            plain = copy.copy(self)  # the same terms, priced without overlap
            plain.moe_overlap = "none"
            self._plain = plain
            self.name += ":two-batch"

    def _init_moe(
        self,
        link: float,
        intra: float | None,
        inter: float | None,
        per_node: int | None,
        latency: float | None,
    ) -> None:
        """The mixture-of-experts terms: the dense part over the ``dp x tp``
        attention ranks, each routed expert's GEMM, the all-to-alls of EP."""
        m, tp, dp, ep = self.model, self.tp, self.dp, self.ep
        if m.experts % ep:
            raise SpecError(f"roofline: ep={ep} does not divide {m.name}'s {m.experts} experts")
        if ep > 1 and ep != dp * tp:
            raise SpecError(
                f"roofline: ep={ep} must equal dp x tp = {dp * tp} (the experts span the"
                " attention ranks of a stage)"
            )
        if ep == 1 and dp > 1:
            raise SpecError(f"roofline: dp={dp} (data-parallel attention) needs ep = dp x tp")
        ranks = tp * dp
        wb = m.weight_bytes_per_param
        # dense part (attention, dense layers, shared experts, router, LM head): each of the
        # dp attention ranks runs its share of the sequences on tp GPUs
        self._flop_token = 2.0 * m.dense_token_params / ranks * self._fp8
        self._flop_seq = 2.0 * m.hidden * m.vocab / ranks
        self._flop_attn = 4.0 * m.layers * m.heads * m.head_dim / ranks
        self._kv_b = m.kv_bytes_per_token_tp(tp) / ranks
        self._w_b = (m.params - m.routed_params) * wb / tp
        act = m.hidden * m.dtype_bytes
        self._comm_token /= dp  # TP all-reduces of T / dp tokens
        self._act_ranks = dp  # activation passes of T / dp tokens per rank
        self._p2p_token /= dp
        self._seq /= dp  # each rank's scheduler and sampler handle its own sequences
        # routed experts: with EP each GPU holds experts / ep whole experts; without, every
        # GPU holds a 1 / tp slice of every expert
        shard = 1 if ep > 1 else tp
        self._e_local = float(m.experts // ep)
        self._e_flop = 2.0 * m.expert_params / shard * self._fp8  # per token routed to it
        # the expert's weights read once, at moe_efficiency x mbu
        self._e_bytes = m.expert_params * wb / shard / self.moe_efficiency
        if ep == 1:
            return
        g = ep if per_node is None else per_node
        if not is_int(g) or not 1 <= g <= ep:
            raise SpecError(f"roofline: a2a_ranks_per_node={per_node!r} must be in 1..ep={ep}")
        intra = link if intra is None else intra
        if g < ep and inter is None:
            raise SpecError(
                f"roofline: ep={ep} spans nodes of {g} ranks; a2a_inter_bytes_s is needed"
            )
        self.a2a_ranks_per_node = g
        intra_bw = positive_float_or(intra, "a2a_intra_bytes_s")
        self.a2a_intra_bytes_s = intra_bw
        lat = _check_nonneg("a2a_latency_s", self.hop_latency_s if latency is None else latency)
        self.a2a_latency_s = lat
        # one all-to-all: each rank sends its T / ep tokens' k copies (hidden x dtype bytes
        # each), (g - 1) / ep of them to the other ranks of its node over NVLink, (ep - g) / ep
        # over the NIC; the links run in parallel and the slower bounds it
        per_token = m.experts_per_token * act / ep * (1.0 + self.expert_skew)
        t_intra = per_token * (g - 1) / ep / intra_bw
        t_inter = 0.0
        if inter is not None:
            inter_bw = positive_float_or(inter, "a2a_inter_bytes_s")
            self.a2a_inter_bytes_s = inter_bw
            t_inter = per_token * (ep - g) / ep / inter_bw
            if self.moe_dispatch_nodes is not None and g < ep:
                # once per remote node a token reaches over the NIC, then forwarded over
                # NVLink to the experts' GPUs there: (g - 1) / g of the copies cross NVLink
                remote = remote_nodes(m.experts, m.experts_per_token, ep / g,
                                      self.moe_dispatch_nodes)  # fmt: skip
                t_inter = act / ep * (1.0 + self.expert_skew) * remote / inter_bw
                t_intra = per_token * (g - 1) / g / intra_bw
        # two per MoE layer (dispatch and combine)
        combine = max(t_intra, t_inter)
        self._a2a_fixed = 2.0 * m.moe_layers * lat
        self._a2a_dispatch = self._a2a_combine = m.moe_layers * combine
        if self.moe_dispatch_dtype is None:
            self._a2a_token = 2.0 * m.moe_layers * combine
            return
        # the dispatch at its own precision, the combine at the activations' (DeepEP: FP8
        # dispatch, BF16 combine); the same links, so its time scales with its bytes
        ratio = dispatch_bytes(m.hidden, self.moe_dispatch_dtype) / act
        self._a2a_dispatch = m.moe_layers * combine * ratio
        self._a2a_token = self._a2a_dispatch + self._a2a_combine

    def gemm_time(self, tokens: int) -> float:
        """Seconds of the layers' weight GEMMs alone for ``tokens`` new tokens, each priced as
        a kernel on its own: the larger of their FLOPs at ``mfu`` and their weights read at
        ``mbu`` (no attention, LM head, element-wise passes, communication, throttle or
        software overhead; a dense model's). What an operator-level profile such as Vidur's
        ``mlp.csv`` measures (:class:`twin.perf.validate.GemmPart`)."""
        return max(self._flop_token * tokens * self._inv_compute, self._gemm_w_b * self._inv_mem)

    def all_to_all_time(self, tokens: int) -> float:
        """Seconds of one all-to-all of ``tokens`` tokens (the instance's, all
        ranks together) over the EP ranks, the mean of the dispatch and the
        combine (which differ under ``moe_dispatch_dtype``); 0.0 without EP."""
        if self.ep == 1 or tokens == 0:
            return 0.0
        per_layer = 2.0 * self.model.moe_layers
        return (self._a2a_fixed + self._a2a_token * tokens) / per_layer

    def dispatch_combine_times(self, tokens: int) -> tuple[float, float]:
        """Seconds of one MoE layer's dispatch and of its combine of ``tokens``
        tokens over the EP ranks; (0.0, 0.0) without EP."""
        if self.ep == 1 or tokens == 0:
            return 0.0, 0.0
        layers = self.model.moe_layers
        lat = self._a2a_fixed / (2.0 * layers)
        return lat + self._a2a_dispatch / layers * tokens, lat + self._a2a_combine / layers * tokens

    def a2a_time(self, tokens: int) -> float:
        """Seconds of an iteration's all-to-alls (two per MoE layer) for
        ``tokens`` new tokens; 0.0 without EP."""
        if self.ep == 1 or tokens == 0 or not self._moe:
            return 0.0
        return self._a2a_fixed + self._a2a_token * tokens

    def experts_time(self, tokens: int) -> float:
        """Seconds of the routed experts' GEMMs of an iteration of ``tokens``
        new tokens, all MoE layers (:meth:`moe_time` without the all-to-alls)."""
        if not self._moe or tokens == 0:
            return 0.0
        m = self.model
        k, e = m.experts_per_token, m.experts
        pairs = tokens * k * (1.0 + self.expert_skew) / self.ep
        active = self._e_local * (1.0 - (1.0 - k / e) ** tokens)
        compute = pairs * self._e_flop * self._inv_compute
        mem = active * self._e_bytes * self._inv_mem
        if compute > mem:
            roof = compute + self.no_overlap * mem
        else:
            roof = mem + self.no_overlap * compute
        return m.moe_layers * roof

    def moe_time(self, tokens: int) -> float:
        """Seconds of the routed experts and the all-to-alls of an iteration of
        ``tokens`` new tokens, all MoE layers; 0.0 for a dense model.

        Per MoE layer on the busiest GPU: its ``T k / ep x (1 + expert_skew)``
        token-expert pairs (all ``T k`` without EP, on a 1 / tp slice of each
        expert) over its active experts, ``experts / ep x (1 - (1 - k / E)^T)``
        (the expected number with at least one token under uniform routing), each
        expert's GEMM at its own batch: compute ``2 x pairs x expert params`` at
        ``mfu``, memory its weights at ``mbu``, combined as the dense roofline
        (the larger plus ``no_overlap`` x the smaller): a small decode batch reads
        every active expert's weights. Plus two all-to-alls under EP.
        """
        if not self._moe or tokens == 0:
            return 0.0
        t = self.experts_time(tokens)
        if self.ep > 1:
            t += self._a2a_fixed + self._a2a_token * tokens
        return t

    def stage_times(self, batch: Batch) -> tuple[float, float]:
        """Seconds ``batch`` holds the first pipeline stage and each later one
        (which includes receiving the activations): ``iteration_time`` split
        evenly over the ``pp`` stages, the sends kept with the stages they reach."""
        t = self.iteration_time(batch)
        pp = self.pp
        if pp == 1 or t == 0.0:
            return t, 0.0
        send = self._p2p_fixed + self._p2p_token * (batch.decode_count + batch.prefill_tokens)
        share = (t - (pp - 1) * send) / pp
        return share, share + send

    def stage_steps(self, count: int, context_sum: int, n: int) -> tuple[list[float], list[float]]:
        """:meth:`stage_times` of ``n`` successive decode-only micro-batches (see
        :func:`twin.perf.iteration.stage_steps`), from :meth:`decode_steps`."""
        ts = self.decode_steps(count, context_sum, n)
        pp = self.pp
        if pp == 1:
            return ts, [0.0] * n
        send = self._p2p_fixed + self._p2p_token * count
        sends = (pp - 1) * send
        firsts = [t if t == 0.0 else (t - sends) / pp for t in ts]
        laters = [0.0 if t == 0.0 else a + send for t, a in zip(ts, firsts, strict=True)]
        return firsts, laters

    def iteration_time(self, batch: Batch) -> float:
        """Seconds for one forward pass of ``batch``; 0.0 for an empty batch
        (with ``moe_overlap: two-batch``, :meth:`overlapped_time`)."""
        if self._plain is not None:
            return self.overlapped_time(batch)
        if self._special:
            return self._special_time(batch)
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
        gpu = roof + self._comm_fixed + self._comm_token * tokens + self._act_time(tokens)
        if self._moe:
            gpu += self.moe_time(tokens)
        return gpu + self._fixed + self._seq * seqs

    def _act_time(self, tokens: int) -> float:
        """Seconds of the activation passes of an iteration of ``tokens`` new tokens: per
        rank's ``x = tokens / dp`` tokens, the first ``min(x, L2 tokens)`` (whose
        activations stay in L2) ``l2_speedup`` times faster than the rest."""
        x = tokens / self._act_ranks
        r = x if x < self._act_l2 else self._act_l2
        return self._act_token * (x - r + r / self.l2_speedup)

    def overlapped_time(self, batch: Batch) -> float:
        """Seconds of ``batch`` run as two micro-batches whose all-to-alls hide
        under each other's compute (``moe_overlap: two-batch``, under EP).

        The batch is split in two (:func:`halves`); each half is priced on its
        own (its roofline, with all the weights it reads, and its experts at
        its own tokens: the cost of halving, which a small decode batch feels
        most). Per MoE layer the compute stream runs both halves' compute
        (their dense part over the layers, and their experts) while the
        communication stream runs both halves' dispatch and combine, so the
        MoE layers take ``max(compute, comm)``, plus one half-layer's shorter
        side that cannot hide (the first half's compute before the first
        dispatch, or the last combine after the compute ends). The dense
        layers' share of the dense part adds; the software overheads
        (per iteration, layer and sequence) count once, as without overlap.
        A batch of one token runs unsplit, as does one of fewer new tokens per
        attention rank than ``moe_overlap_min_tokens`` (vLLM's
        ``--dbo-decode-token-threshold``)."""
        p = self._plain
        assert p is not None
        split = halves(batch)
        tokens = batch.decode_count + batch.prefill_tokens
        if split is None or tokens < self.moe_overlap_min_tokens * self.dp:
            return p.iteration_time(batch)
        m = self.model
        share = m.moe_layers / m.layers
        compute = comm = rest = 0.0
        for h in split:
            tokens = h.decode_count + h.prefill_tokens
            seqs = h.decode_count + len(h.prefill)
            a2a = p.a2a_time(tokens)
            experts = p.experts_time(tokens)
            dense = p.iteration_time(h) - a2a - experts - (p._fixed + p._seq * seqs)
            compute += dense * share + experts
            rest += dense * (1.0 - share)
            comm += a2a
        fill = 0.5 * min(compute, comm) / m.moe_layers
        seqs = batch.decode_count + len(batch.prefill)
        return self._fixed + self._seq * seqs + rest + max(compute, comm) + fill

    def _special_time(self, batch: Batch) -> float:
        """:meth:`iteration_time` of a model with latent attention or sliding
        windows (the class docstring's terms, attention and KV reads split).

        Latent attention: decode attention at the absorbed form's FLOPs per
        (query, key) pair, prefill at the non-absorbed form's, and each
        prefill chunk's cached tokens up-projected from their latents
        (``2 x kv_up weights`` FLOPs each, at ``mfu``). Sliding layers: a
        query at position ``p`` attends ``min(p, window)`` keys, a chunk of
        ``n`` after ``c`` cached reads ``min(c, window)`` of them, and decode
        sequences ``min(context sum, count x window)`` in all (exact when
        every context is at least the window, else an upper bound: a batch
        carries only its contexts' sum)."""
        n_dec = batch.decode_count
        dsum = batch.decode_context_sum
        w = self._window
        tokens = n_dec
        pairs = pairs_w = 0.0
        cached = cached_w = 0
        for n, c in batch.prefill:
            tokens += n
            pairs += n * (c + (n + 1) * 0.5)
            cached += c
            if w:
                k = max(0, min(n, w - c))  # queries whose whole past fits the window
                pairs_w += k * c + k * (k + 1) * 0.5 + (n - k) * w
                cached_w += min(c, w)
        if tokens == 0:
            return 0.0
        seqs = n_dec + len(batch.prefill)
        full, slide = self._full_layers, self._slide_layers
        dec_w = min(dsum, n_dec * w)
        attn = self._fa_dec * (full * dsum + slide * dec_w) + self._fa_pre * (
            full * pairs + slide * pairs_w
        )
        linear = self._flop_token * tokens + self._flop_seq * seqs + self._flop_ctx * cached
        compute_s = linear * self._inv_compute + attn * self._inv_attn
        if compute_s > self.throttle_knee_s:
            compute_s += self.throttle * (compute_s - self.throttle_knee_s)
        kv_tokens = full * (dsum + cached + tokens) + slide * (dec_w + cached_w + tokens)
        mem_s = (self._w_b + self._kv_layer * kv_tokens) * self._inv_mem
        if compute_s > mem_s:
            roof = compute_s + self.no_overlap * mem_s
        else:
            roof = mem_s + self.no_overlap * compute_s
        t = roof + self._fixed + self._seq * seqs + self._comm_fixed + self._comm_token * tokens
        t += self._act_time(tokens)
        if self._moe:
            t += self.moe_time(tokens)
        return t

    def _special_decode_steps(self, count: int, context_sum: int, n: int) -> list[float]:
        """:meth:`decode_steps` of a model with latent attention or sliding
        windows: :meth:`_special_time` of each decode-only step, its float
        operations in the same order (the prefill terms, zero, left out: adding
        0.0 changes no bits), the step-invariant parts computed once."""
        if count == 0:
            return [0.0] * n
        tokens = seqs = count
        w, full, slide = self._window, self._full_layers, self._slide_layers
        fa, ia, knee, throttle = self._fa_dec, self._inv_attn, self.throttle_knee_s, self.throttle
        c0 = (self._flop_token * tokens + self._flop_seq * seqs) * self._inv_compute
        w_b, kv_layer, inv_mem, no = self._w_b, self._kv_layer, self._inv_mem, self.no_overlap
        fixed, per_seq = self._fixed, self._seq * seqs
        comm_fixed, comm = self._comm_fixed, self._comm_token * tokens
        act = self._act_time(tokens)
        moe = self.moe_time(tokens) if self._moe else 0.0
        cap = count * w
        out = []
        for ctx in range(context_sum, context_sum + n * count, count):
            dec_w = min(ctx, cap)
            compute_s = c0 + fa * (full * ctx + slide * dec_w) * ia
            if compute_s > knee:
                compute_s += throttle * (compute_s - knee)
            mem_s = (w_b + kv_layer * (full * (ctx + tokens) + slide * (dec_w + tokens))) * inv_mem
            roof = compute_s + no * mem_s if compute_s > mem_s else mem_s + no * compute_s
            t = roof + fixed + per_seq + comm_fixed + comm
            t += act
            if self._moe:
                t += moe
            out.append(t)
        return out

    def decode_steps(self, count: int, context_sum: int, n: int) -> list[float]:
        """Seconds of ``n`` decode-only iterations of ``count`` sequences, their
        contexts summing to ``context_sum`` in the first and ``count`` more in each
        next one: :meth:`iteration_time` of each, the same float operations in the
        same order (so the same bits), without building the batches; one numpy
        pass over the steps when there are many. A model with latent attention
        or sliding windows prices each step with :meth:`iteration_time`, as does
        ``moe_overlap: two-batch``."""
        if self._plain is not None:
            if count == 0:
                return [0.0] * n
            ctxs = range(context_sum, context_sum + n * count, count)
            return [self.iteration_time(Batch((), count, c)) for c in ctxs]
        if self._special:
            return self._special_decode_steps(count, context_sum, n)
        tokens = seqs = count
        c0 = (self._flop_token * tokens + self._flop_seq * seqs) * self._inv_compute
        fa, ia = self._flop_attn, self._inv_attn
        knee, throttle = self.throttle_knee_s, self.throttle
        w_b, kv_b, inv_mem, no = self._w_b, self._kv_b, self._inv_mem, self.no_overlap
        fixed, per_seq = self._fixed, self._seq * seqs
        comm_fixed, comm = self._comm_fixed, self._comm_token * tokens
        act = self._act_time(tokens)
        stop = context_sum + n * count
        moe = self.moe_time(tokens) if self._moe else 0.0
        if n < VECTOR_STEPS:
            if n >= 16 and not moe and fa >= 0.0 and ia >= 0.0 and kv_b >= 0.0 and inv_mem >= 0.0:
                # Every float operation here is monotone in ctx (rounding keeps
                # order), so the compute time of the last step bounds every
                # step's from above and the memory time of the first bounds
                # every step's from below: when no step throttles and one
                # side wins throughout, each step takes the same branch and
                # the loop is one expression (the same operations in the same
                # order as below, so the same bits). Below 16 steps the checks
                # cost more than they save.
                last = stop - count
                c_last = c0 + fa * last * ia
                if c_last <= knee:
                    if c_last <= (w_b + kv_b * (context_sum + tokens)) * inv_mem:
                        return [
                            (w_b + kv_b * (ctx + tokens)) * inv_mem + no * (c0 + fa * ctx * ia)
                            + comm_fixed + comm + act + fixed + per_seq
                            for ctx in range(context_sum, stop, count)
                        ]  # fmt: skip
                    if c0 + fa * context_sum * ia > (w_b + kv_b * (last + tokens)) * inv_mem:
                        return [
                            c0 + fa * ctx * ia + no * ((w_b + kv_b * (ctx + tokens)) * inv_mem)
                            + comm_fixed + comm + act + fixed + per_seq
                            for ctx in range(context_sum, stop, count)
                        ]  # fmt: skip
            out = []
            for ctx in range(context_sum, stop, count):
                compute_s = c0 + fa * ctx * ia
                if compute_s > knee:
                    compute_s += throttle * (compute_s - knee)
                mem_s = (w_b + kv_b * (ctx + tokens)) * inv_mem
                roof = compute_s + no * mem_s if compute_s > mem_s else mem_s + no * compute_s
                gpu = roof + comm_fixed + comm + act
                if moe:
                    gpu += moe
                out.append(gpu + fixed + per_seq)
            return out
        import numpy as np

        ctx_a = np.arange(context_sum, stop, count, dtype=np.int64)
        compute = c0 + fa * ctx_a.astype(np.float64) * ia
        hot = compute > knee
        if hot.any():
            compute = np.where(hot, compute + throttle * (compute - knee), compute)
        mem = (w_b + kv_b * (ctx_a + tokens).astype(np.float64)) * inv_mem
        bound = compute > mem
        gpu_a = np.where(bound, compute + no * mem, mem + no * compute)
        gpu_a += comm_fixed
        gpu_a += comm
        gpu_a += act
        if moe:
            gpu_a += moe
        gpu_a += fixed
        gpu_a += per_seq
        return gpu_a.tolist()  # type: ignore[no-any-return]
