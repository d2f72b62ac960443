"""The Roofline: iteration time from the model's FLOPs and bytes on the GPU's peaks,
at efficiencies calibrated against measured profiles (``python -m twin.perf.calibrate``).
"""

from __future__ import annotations

import copy

from twin._check import is_int, is_number
from twin.errors import SpecError
from twin.perf.gpus import GPUSpec
from twin.perf.iteration import VECTOR_STEPS, Batch
from twin.perf.llm import ModelSpec
from twin.perf.moe import ExpertTerms, check_options, check_parallel, halves
from twin.perf.presets import (
    _NO_L2,
    _NO_THROTTLE,
    DEFAULT_ATTN_MFU,
    DEFAULT_ENGINE,
    DEFAULT_HOP_LATENCY_S,
    DEFAULT_MBU,
    DEFAULT_MFU,
    DEFAULT_TP_MFU_EXPONENT,
    FP8_GEMM_SHARE,
    GPU_EFFICIENCY,
    engine_overheads,
    l2_tokens,
)
from twin.perf.terms import check_fraction, check_nonneg


def fp8_gemm_ratio(model: ModelSpec, gpu: GPUSpec) -> float:
    """What a weight GEMM FLOP of ``model`` counts for at ``gpu``'s BF16 peak: FP8 weights
    (``weight_dtype_bytes`` 1) run on FP8 tensor cores where the GPU has them, the
    activations quantized on the fly (FP8 W8A8, as vLLM runs FP8 checkpoints), so
    ``flops_bf16 / (flops_fp8 x share)``, ``share`` the GPU's measured FP8 GEMM share
    relative to its BF16 one (:data:`~twin.perf.presets.FP8_GEMM_SHARE`, 1.0 where none is
    measured); exactly 1.0 otherwise (BF16 weights, or no FP8 peak)."""
    if model.weight_bytes_per_param == 1 and gpu.flops_fp8 > 0:
        return gpu.flops_bf16 / (gpu.flops_fp8 * FP8_GEMM_SHARE.get(gpu.name, 1.0))
    return 1.0


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
        "_p2p_token", "_p2p_fixed", "ep", "dp", "expert_skew", "_moe", "_experts",
        "_special", "_fa_pre", "_fa_dec",
        "_flop_ctx", "_kv_layer", "_full_layers", "_slide_layers", "_window",
        "moe_dispatch_dtype", "moe_overlap", "moe_dispatch_nodes", "moe_overlap_min_tokens",
        "_plain",
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
        self.moe_efficiency = check_fraction("moe_efficiency", moe_efficiency)
        eff = GPU_EFFICIENCY.get(
            gpu.name,
            (DEFAULT_MFU, DEFAULT_MBU, DEFAULT_ATTN_MFU, *_NO_THROTTLE, _NO_L2,
             DEFAULT_HOP_LATENCY_S),
        )  # fmt: skip
        l2 = eff[5] if l2_speedup is None else l2_speedup
        if not is_number(l2) or not 1.0 <= l2 < float("inf"):
            raise SpecError(f"roofline: l2_speedup={l2!r} must be a finite number >= 1")
        self.l2_speedup = float(l2)
        self.throttle = check_nonneg("throttle", eff[3] if throttle is None else throttle)
        knee = eff[4] if throttle_knee_s is None else throttle_knee_s
        self.throttle_knee_s = check_nonneg("throttle_knee_s", knee)
        self.mfu = check_fraction("mfu", eff[0] if mfu is None else mfu)
        self.mbu = check_fraction("mbu", eff[1] if mbu is None else mbu)
        self.attn_mfu = check_fraction("attn_mfu", eff[2] if attn_mfu is None else attn_mfu)
        self.overhead_s = check_nonneg("overhead_s", overhead_s)
        self.layer_overhead_s = check_nonneg("layer_overhead_s", layer_overhead_s)
        self.seq_overhead_s = check_nonneg("seq_overhead_s", seq_overhead_s)
        self.seq_shard_overhead_s = check_nonneg("seq_shard_overhead_s", seq_shard_overhead_s)
        if hop_latency_s is None:
            hop_latency_s = eff[6]
        self.hop_latency_s = check_nonneg("hop_latency_s", hop_latency_s)
        self.hop_overhead_s = check_nonneg("hop_overhead_s", hop_overhead_s)
        self.tp_mfu_exponent = check_nonneg("tp_mfu_exponent", tp_mfu_exponent)
        self.act_traffic = check_nonneg("act_traffic", act_traffic)
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
        self.expert_skew = check_nonneg("expert_skew", expert_skew)
        check_options(moe_dispatch_dtype, moe_overlap, moe_dispatch_nodes, moe_overlap_min_tokens)
        self.moe_overlap_min_tokens = moe_overlap_min_tokens
        self.moe_dispatch_dtype = moe_dispatch_dtype
        self.moe_overlap = moe_overlap
        self.moe_dispatch_nodes = moe_dispatch_nodes
        self._plain: Roofline | None = None  # this model without overlap (two-batch only)
        self._moe = m.experts > 0
        self._experts: ExpertTerms | None = None
        if self._moe:
            self._spread_dense()
            self._experts = ExpertTerms(
                m, tp, ep, fp8=self._fp8, moe_efficiency=self.moe_efficiency,
                expert_skew=self.expert_skew, inv_compute=self._inv_compute,
                inv_mem=self._inv_mem, no_overlap=self.no_overlap, link=link,
                hop_latency_s=self.hop_latency_s, dispatch_dtype=moe_dispatch_dtype,
                dispatch_nodes=moe_dispatch_nodes, intra=a2a_intra_bytes_s,
                inter=a2a_inter_bytes_s, per_node=a2a_ranks_per_node, latency=a2a_latency_s,
            )  # fmt: skip
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

    def _spread_dense(self) -> None:
        """The dense part of a mixture-of-experts model (attention, dense layers,
        shared experts, router, LM head) over its ``dp x tp`` attention ranks; the
        routed experts are :class:`~twin.perf.moe.ExpertTerms`'."""
        m, tp, dp = self.model, self.tp, self.dp
        check_parallel(m, tp, dp, self.ep)
        ranks = tp * dp
        wb = m.weight_bytes_per_param
        # each of the dp attention ranks runs its share of the sequences on tp GPUs
        self._flop_token = 2.0 * m.dense_token_params / ranks * self._fp8
        self._flop_seq = 2.0 * m.hidden * m.vocab / ranks
        self._flop_attn = 4.0 * m.layers * m.heads * m.head_dim / ranks
        self._kv_b = m.kv_bytes_per_token_tp(tp) / ranks
        self._w_b = (m.params - m.routed_params) * wb / tp
        self._comm_token /= dp  # TP all-reduces of T / dp tokens
        self._act_ranks = dp  # activation passes of T / dp tokens per rank
        self._p2p_token /= dp
        self._seq /= dp  # each rank's scheduler and sampler handle its own sequences

    def gemm_time(self, tokens: int) -> float:
        """Seconds of the layers' weight GEMMs alone for ``tokens`` new tokens, each priced as
        a kernel on its own: the larger of their FLOPs at ``mfu`` and their weights read at
        ``mbu`` (no attention, LM head, element-wise passes, communication, throttle or
        software overhead; a dense model's). What an operator-level profile such as Vidur's
        ``mlp.csv`` measures (:class:`twin.perf.validate.GemmPart`)."""
        return max(self._flop_token * tokens * self._inv_compute, self._gemm_w_b * self._inv_mem)

    @property
    def a2a_intra_bytes_s(self) -> float | None:
        """The all-to-alls' rate to a rank of the same node, as used (None without EP)."""
        return None if self._experts is None else self._experts.a2a_intra_bytes_s

    @property
    def a2a_inter_bytes_s(self) -> float | None:
        """The all-to-alls' rate across nodes, as used (None without EP or within a node)."""
        return None if self._experts is None else self._experts.a2a_inter_bytes_s

    @property
    def a2a_ranks_per_node(self) -> int | None:
        """The EP ranks of one node, as used (None without EP)."""
        return None if self._experts is None else self._experts.a2a_ranks_per_node

    @property
    def a2a_latency_s(self) -> float | None:
        """The latency of one all-to-all, as used (None without EP)."""
        return None if self._experts is None else self._experts.a2a_latency_s

    def all_to_all_time(self, tokens: int) -> float:
        """Seconds of one all-to-all of ``tokens`` tokens over the EP ranks
        (:meth:`twin.perf.moe.ExpertTerms.all_to_all_time`); 0.0 without EP."""
        return 0.0 if self._experts is None else self._experts.all_to_all_time(tokens)

    def dispatch_combine_times(self, tokens: int) -> tuple[float, float]:
        """Seconds of one MoE layer's dispatch and of its combine
        (:meth:`twin.perf.moe.ExpertTerms.dispatch_combine_times`); zeros without EP."""
        if self._experts is None:
            return 0.0, 0.0
        return self._experts.dispatch_combine_times(tokens)

    def a2a_time(self, tokens: int) -> float:
        """Seconds of an iteration's all-to-alls (two per MoE layer) for
        ``tokens`` new tokens; 0.0 without EP."""
        return 0.0 if self._experts is None else self._experts.a2a_time(tokens)

    def experts_time(self, tokens: int) -> float:
        """Seconds of the routed experts' GEMMs of an iteration of ``tokens``
        new tokens (:meth:`twin.perf.moe.ExpertTerms.experts_time`); 0.0 for a dense model."""
        return 0.0 if self._experts is None else self._experts.experts_time(tokens)

    def moe_time(self, tokens: int) -> float:
        """Seconds of the routed experts and the all-to-alls of an iteration of
        ``tokens`` new tokens (:meth:`twin.perf.moe.ExpertTerms.moe_time`); 0.0
        for a dense model."""
        return 0.0 if self._experts is None else self._experts.moe_time(tokens)

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
