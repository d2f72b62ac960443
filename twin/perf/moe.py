"""Mixture of experts in the Roofline: the routed experts' GEMMs and the
all-to-alls of expert parallelism (EP), with their options (dispatch
precision, node-limited dispatch, two-batch overlap).

:class:`ExpertTerms` holds what an iteration's experts and all-to-alls cost
per token, computed once per :class:`~twin.perf.roofline.Roofline` of a
mixture-of-experts model; the Roofline adds :meth:`ExpertTerms.moe_time` to
its dense part and, under ``moe_overlap: two-batch``, splits a batch with
:func:`halves`. The dense part over the data-parallel attention ranks stays
in :mod:`twin.perf.roofline`.
"""

from __future__ import annotations

from twin._check import is_int
from twin.errors import SpecError
from twin.perf.iteration import Batch
from twin.perf.llm import ModelSpec
from twin.perf.terms import check_nonneg, positive_float_or

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


def check_options(
    dispatch_dtype: str | None, overlap: str, dispatch_nodes: int | None, overlap_min_tokens: int
) -> None:
    """Refuse a bad MoE option of a Roofline (one :class:`SpecError` naming it)."""
    if dispatch_dtype is not None and dispatch_dtype not in DISPATCH_DTYPES:
        raise SpecError(
            f"roofline: moe_dispatch_dtype={dispatch_dtype!r}; expected one of"
            f" {', '.join(DISPATCH_DTYPES)}"
        )
    if overlap not in MOE_OVERLAPS:
        raise SpecError(
            f"roofline: moe_overlap={overlap!r}; expected one of {', '.join(MOE_OVERLAPS)}"
        )
    if dispatch_nodes is not None and (not is_int(dispatch_nodes) or dispatch_nodes < 1):
        raise SpecError(
            f"roofline: moe_dispatch_nodes={dispatch_nodes!r} must be a positive integer"
        )
    if not is_int(overlap_min_tokens) or overlap_min_tokens < 0:
        raise SpecError(
            f"roofline: moe_overlap_min_tokens={overlap_min_tokens!r} must be an integer >= 0"
        )
    if overlap_min_tokens and overlap != "two-batch":
        raise SpecError(
            f"roofline: moe_overlap_min_tokens={overlap_min_tokens!r} acts only with"
            " moe_overlap='two-batch'"
        )


def check_parallel(m: ModelSpec, tp: int, dp: int, ep: int) -> None:
    """Refuse an EP/DP shape the model's experts and the attention ranks cannot take."""
    if m.experts % ep:
        raise SpecError(f"roofline: ep={ep} does not divide {m.name}'s {m.experts} experts")
    if ep > 1 and ep != dp * tp:
        raise SpecError(
            f"roofline: ep={ep} must equal dp x tp = {dp * tp} (the experts span the"
            " attention ranks of a stage)"
        )
    if ep == 1 and dp > 1:
        raise SpecError(f"roofline: dp={dp} (data-parallel attention) needs ep = dp x tp")


class ExpertTerms:
    """The routed experts and all-to-alls of one Roofline of a mixture-of-experts
    model, per token (see :meth:`moe_time`). ``fp8`` is the Roofline's FP8 GEMM
    ratio, ``inv_compute`` and ``inv_mem`` its seconds per FLOP at ``mfu`` and per
    byte at ``mbu``, ``link`` its GPU-to-GPU bytes/s and ``hop_latency_s`` its
    all-reduce hop latency (the all-to-all latency unless ``latency`` is given);
    ``intra``, ``inter``, ``per_node`` and ``latency`` are the Roofline's
    ``a2a_*`` arguments."""

    __slots__ = (
        "model", "ep", "expert_skew", "no_overlap", "_inv_compute", "_inv_mem", "_e_local",
        "_e_flop", "_e_bytes", "_a2a_token", "_a2a_fixed", "_a2a_dispatch", "_a2a_combine",
        "a2a_intra_bytes_s", "a2a_inter_bytes_s", "a2a_ranks_per_node", "a2a_latency_s",
    )  # fmt: skip

    def __init__(
        self,
        m: ModelSpec,
        tp: int,
        ep: int,
        *,
        fp8: float,
        moe_efficiency: float,
        expert_skew: float,
        inv_compute: float,
        inv_mem: float,
        no_overlap: float,
        link: float,
        hop_latency_s: float,
        dispatch_dtype: str | None,
        dispatch_nodes: int | None,
        intra: float | None,
        inter: float | None,
        per_node: int | None,
        latency: float | None,
    ) -> None:
        self.model, self.ep, self.expert_skew, self.no_overlap = m, ep, expert_skew, no_overlap
        self._inv_compute, self._inv_mem = inv_compute, inv_mem
        self.a2a_intra_bytes_s: float | None = None
        self.a2a_inter_bytes_s: float | None = None
        self.a2a_latency_s: float | None = None
        self.a2a_ranks_per_node: int | None = None
        self._a2a_dispatch = self._a2a_combine = 0.0  # their shares of _a2a_token
        self._a2a_token = self._a2a_fixed = 0.0
        wb = m.weight_bytes_per_param
        act = m.hidden * m.dtype_bytes
        # routed experts: with EP each GPU holds experts / ep whole experts; without, every
        # GPU holds a 1 / tp slice of every expert
        shard = 1 if ep > 1 else tp
        self._e_local = float(m.experts // ep)
        self._e_flop = 2.0 * m.expert_params / shard * fp8  # per token routed to it
        # the expert's weights read once, at moe_efficiency x mbu
        self._e_bytes = m.expert_params * wb / shard / moe_efficiency
        if ep > 1:
            self._init_all_to_all(
                act, link if intra is None else intra, inter, per_node,
                hop_latency_s if latency is None else latency, dispatch_dtype, dispatch_nodes,
            )  # fmt: skip

    def _init_all_to_all(
        self,
        act: int,
        intra: float,
        inter: float | None,
        per_node: int | None,
        latency: float,
        dispatch_dtype: str | None,
        dispatch_nodes: int | None,
    ) -> None:
        """The all-to-alls' terms under EP: ``act`` bytes of a token's activations,
        ``intra`` bytes/s to a rank of the same node, ``latency`` per all-to-all."""
        m, ep, expert_skew = self.model, self.ep, self.expert_skew
        g = ep if per_node is None else per_node
        if not is_int(g) or not 1 <= g <= ep:
            raise SpecError(f"roofline: a2a_ranks_per_node={per_node!r} must be in 1..ep={ep}")
        if g < ep and inter is None:
            raise SpecError(
                f"roofline: ep={ep} spans nodes of {g} ranks; a2a_inter_bytes_s is needed"
            )
        self.a2a_ranks_per_node = g
        intra_bw = positive_float_or(intra, "a2a_intra_bytes_s")
        self.a2a_intra_bytes_s = intra_bw
        lat = check_nonneg("a2a_latency_s", latency)
        self.a2a_latency_s = lat
        # one all-to-all: each rank sends its T / ep tokens' k copies (hidden x dtype bytes
        # each), (g - 1) / ep of them to the other ranks of its node over NVLink, (ep - g) / ep
        # over the NIC; the links run in parallel and the slower bounds it
        per_token = m.experts_per_token * act / ep * (1.0 + expert_skew)
        t_intra = per_token * (g - 1) / ep / intra_bw
        t_inter = 0.0
        if inter is not None:
            inter_bw = positive_float_or(inter, "a2a_inter_bytes_s")
            self.a2a_inter_bytes_s = inter_bw
            t_inter = per_token * (ep - g) / ep / inter_bw
            if dispatch_nodes is not None and g < ep:
                # once per remote node a token reaches over the NIC, then forwarded over
                # NVLink to the experts' GPUs there: (g - 1) / g of the copies cross NVLink
                remote = remote_nodes(m.experts, m.experts_per_token, ep / g, dispatch_nodes)
                t_inter = act / ep * (1.0 + expert_skew) * remote / inter_bw
                t_intra = per_token * (g - 1) / g / intra_bw
        # two per MoE layer (dispatch and combine)
        combine = max(t_intra, t_inter)
        self._a2a_fixed = 2.0 * m.moe_layers * lat
        self._a2a_dispatch = self._a2a_combine = m.moe_layers * combine
        if dispatch_dtype is None:
            self._a2a_token = 2.0 * m.moe_layers * combine
            return
        # the dispatch at its own precision, the combine at the activations' (DeepEP: FP8
        # dispatch, BF16 combine); the same links, so its time scales with its bytes
        ratio = dispatch_bytes(m.hidden, dispatch_dtype) / act
        self._a2a_dispatch = m.moe_layers * combine * ratio
        self._a2a_token = self._a2a_dispatch + self._a2a_combine

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
        if self.ep == 1 or tokens == 0:
            return 0.0
        return self._a2a_fixed + self._a2a_token * tokens

    def experts_time(self, tokens: int) -> float:
        """Seconds of the routed experts' GEMMs of an iteration of ``tokens``
        new tokens, all MoE layers (:meth:`moe_time` without the all-to-alls)."""
        if tokens == 0:
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
        ``tokens`` new tokens, all MoE layers.

        Per MoE layer on the busiest GPU: its ``T k / ep x (1 + expert_skew)``
        token-expert pairs (all ``T k`` without EP, on a 1 / tp slice of each
        expert) over its active experts, ``experts / ep x (1 - (1 - k / E)^T)``
        (the expected number with at least one token under uniform routing), each
        expert's GEMM at its own batch: compute ``2 x pairs x expert params`` at
        ``mfu``, memory its weights at ``mbu``, combined as the dense roofline
        (the larger plus ``no_overlap`` x the smaller): a small decode batch reads
        every active expert's weights. Plus two all-to-alls under EP.
        """
        if tokens == 0:
            return 0.0
        t = self.experts_time(tokens)
        if self.ep > 1:
            t += self._a2a_fixed + self._a2a_token * tokens
        return t
