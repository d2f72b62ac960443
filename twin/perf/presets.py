"""The Roofline's calibrated defaults: per GPU, its achieved efficiencies,
throttle, L2 speed-up and hop latency (:data:`GPU_EFFICIENCY`, :data:`L2_BYTES`);
per serving engine, its software terms (:data:`ENGINE_OVERHEADS`). Each value's
fit and source is in the comment above it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from twin.errors import UnknownNameError
from twin.perf.gpus import GPUSpec
from twin.perf.llm import ModelSpec
from twin.perf.vllm import VLLM_TERMS

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
# L40S (Ada, GDDR6, no NVLink; peaks in twin.perf.gpus from its datasheet): fitted to measured
# single kernels, the only L40S measurements in reach: NVIDIA AIConfigurator's L40S tables
# (ai-dynamo/aiconfigurator@095f58a5, aic-core/src/aiconfigurator_core/systems/data/l40s,
# Apache-2.0; vLLM 0.14.0's BF16 GEMMs, FlashAttention prefill and decode kernels, custom
# all-reduce, and NCCL 2.27.3's all-reduce), transcribed at a dense model's per-GPU shapes into
# twin/data/kernels_l40s.json and fitted by twin.perf.kernel_fit.fit_kernels
# (``python -m twin.studies.kernel_table l40s``; tests/test_kernel_fit.py): mfu over the
# compute-bound GEMMs (m >= 1024), mbu over the weight-bound GEMMs (m <= 16) and the decode
# attention kernels, attn_mfu over the prefill attention kernels (prompts of 1k to 16k tokens),
# the hop latency over vLLM's custom all-reduce of <= 8 KB at TP 2, 4 and 8 (CUDA graphs). Error
# on the held-out shapes (GEMMs with n != k, attention at other head counts, NCCL's all-reduce):
# median 2% compute-bound GEMMs, 5% weight-bound, 6% decode attention, 12% prefill attention,
# 24% small all-reduces; the GEMMs between weight- and compute-bound 9% (worst 26%).
# The best BF16 GEMM of the table reaches 303 TFLOPS (of AIConfigurator's whole L40S GEMM table,
# 315), 0.84 of the datasheet's 362 TFLOPS: that figure is the dense one (with sparsity, 733).
# FP8 GEMMs (the same shapes, vLLM 0.14.0's FP8 W8A8 kernels) reach 0.346 of the datasheet's
# 733 TFLOPS FP8 peak where compute-bound (m >= 1024; fitted as mfu is, FP8_GEMM_SHARE below),
# about as fast as the BF16 GEMMs; error on the held-out FP8 shapes: median 31% (the FP8
# kernels' times vary more with shape than the BF16 ones do). Not carried by these terms: the
# all-reduce's bandwidth on that machine's PCIe tree is far under the 32 GB/s PCIe Gen4 link the
# Roofline uses (ring bus bandwidth at 32 MB: 9.5 GB/s at TP 2, 1.8 at TP 4, 1.0 at TP 8), so
# large all-reduces at TP > 1 are priced at about a tenth of their measured time; that rate is
# a property of the server's PCIe topology, not of the GPU, and is left to the link. These are
# kernel-level shares: the same procedure on AIConfigurator's H100 SXM tables gives mfu 0.81,
# mbu 0.74, attn_mfu 0.40, hop 0.8 us, where the H100's whole-iteration fit above has 0.727,
# 0.92, 0.646 and 1.2 us (it absorbs costs no term carries), so L40S iterations are priced
# without that absorption until a measured L40S iteration profile can refit them. No throttle
# and no L2 term fitted (no iteration data).
_L40S_EFF = (0.747, 0.769, 0.428, 0.0, 0.0, 1.0, 2.29e-06)
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
# Per GPU, where measured: the share of the FP8 peak FP8 weight GEMMs reach, over the share of
# the BF16 peak BF16 GEMMs reach (mfu); an FP8 GEMM FLOP is priced at flops_bf16 / (flops_fp8 x
# this) BF16 FLOPs (twin.perf.roofline.fp8_gemm_ratio). L40S: 0.346 / 0.747, both fitted to
# AIConfigurator's measured L40S GEMMs (above; tests/test_kernel_fit.py holds the ratio to the
# fit). A GPU not named gets 1.0: FP8 GEMMs at the datasheet's ratio of the two peaks (H100's
# FP8 run of the realruns folder is priced within the E2E target with it).
FP8_GEMM_SHARE: Mapping[str, float] = MappingProxyType({"l40s": 0.463})
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


def engine_overheads(engine: str) -> Mapping[str, float]:
    """The software terms of serving engine ``engine`` (a key of :data:`ENGINE_OVERHEADS`)."""
    try:
        return ENGINE_OVERHEADS[engine]
    except (KeyError, TypeError):
        raise UnknownNameError("serving engine", str(engine), ENGINE_OVERHEADS) from None
