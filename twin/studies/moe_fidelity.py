"""The twin against published mixture-of-experts serving figures.

``python -m twin.studies.moe_fidelity`` prints, for each published figure,
the setup it was measured on, what the twin runs for it (where the setup
cannot be expressed exactly, the closest layout the twin takes), the figure,
what the calibrated Roofline (:class:`~twin.perf.roofline.Roofline`, its MoE
part and all-to-alls priced on the named topology) gives for that setup, and
the gap. The Roofline's efficiencies were fitted on dense models (see
README, Fidelity); nothing here is fitted to these figures. Each figure is
priced twice: with the all-to-all settings its source reports
(``Benchmark.perf``: FP8 dispatch, per-node dispatch, two-batch overlap;
the Roofline's ``moe_*`` keys) and plain, without them.

Each :class:`Benchmark` is one published figure: a prefill or a decode
phase measured alone (the other phase given unlimited resources, as every
source below does), on ``nodes`` nodes of one node type with ``ep``
expert-parallel ranks (one data-parallel attention rank per GPU, TP 1).
:func:`run_benchmark` prices one iteration of the stated batch:

- prefill: every rank runs ``tokens_per_rank`` new tokens an iteration, as
  prompts of ``prompt`` tokens of which a share ``cached`` is a prefix-cache
  hit; the figure is input tokens (cache hits included) per second per node;
- decode: every rank holds ``batch_per_rank`` sequences of ``kv_len`` tokens
  of context (or, with ``tpot_s``, the largest batch whose step stays within
  it); the figure is output tokens per second per node, or per GPU.

Sources (setups in :data:`BENCHMARKS`):

- DeepSeek's inference system overview (deepseek-ai/open-infra-index,
  202502OpenSourceWeek/day_6_one_more_thing_deepseekV3R1_inference_system_overview.md):
  H800 nodes, prefill on EP32 with data-parallel attention (4 nodes), decode on
  EP144 (18 nodes; 256 routed experts plus 32 redundant ones, which the twin
  cannot express: it takes EP128 on 16 nodes), "each H800 node delivers an
  average throughput of 73.7k tokens/s input (including cache hits) during
  prefilling or 14.8k tokens/s output during decoding", with 56.3% of input
  tokens hitting the on-disk KV cache, an average KV length of 4,989 tokens
  per output token, and 20-22 tokens/s per user.
- SGLang, "Deploying DeepSeek with PD Disaggregation and Large-scale Expert
  Parallelism on 96 H100 GPUs" (LMSYS blog, 2025-05-05,
  https://lmsys.org/blog/2025-05-05-large-scale-ep/, section Evaluation):
  DeepSeek-V3 on 12 nodes of 8 H100 connected by InfiniBand; prefill on 4
  nodes (EP32), 16,384 tokens per device, 57,674 / 54,543 / 50,302 input
  tokens/s per node for 1K / 2K / 4K prompts; decode on 9 nodes (EP72, which
  needs EPLB's 288 physical experts: the twin takes EP64 on 8 nodes, 4
  experts a GPU) at 256 sequences per device with 2,000 tokens of KV, 22,282
  output tokens/s per node (the section's "Profile Results" table).
- llm-d's wide-EP well-lit path and vLLM's large-scale serving post (llm-d
  0.3 release blog, https://llm-d.ai/blog/llm-d-v0.3-expanded-hardware-faster-perf-and-igw-ga,
  section "Wide-EP Performance"; vLLM blog 2025-12-17,
  https://blog.vllm.ai/2025/12/17/large-scale-serving.html, section
  Results; the deployment of llm-d's guides/wide-ep-lws/README.md): DeepSeek-R1
  (DeepSeek-V3's shapes) on 32 H200 with InfiniBand ConnectX-7 NICs (CoreWeave),
  one DP16 prefill and one DP16 decode worker, each EP16 over 2 nodes; "2.2k
  tokens/s per H200 GPU" in decode. Neither text gives the batch or the
  lengths (they are in the posts' figures only): the twin assumes 256
  sequences per GPU (vLLM's VLLM_MOE_DP_CHUNK_SIZE default, the tokens one
  DP rank dispatches per MoE chunk, vllm/envs.py) at 2,000 tokens of KV.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twin.net.topology import all_to_all_links, load_topology
from twin.perf.gpus import get_gpu
from twin.perf.iteration import Batch
from twin.perf.llm import get_model
from twin.perf.roofline import Roofline

# DeepSeek day-6 overview (module docstring): the setup and the figures
DS_PREFILL_TOKENS_S_NODE = 73.7e3  # input tokens/s per H800 node, cache hits included
DS_DECODE_TOKENS_S_NODE = 14.8e3  # output tokens/s per H800 node
DS_CACHE_HIT = 0.563  # share of input tokens served from the KV cache
DS_KV_LEN = 4989  # average KV length per output token in decode
DS_USER_TOKENS_S = 20.0  # the low end of "20~22 tps" per user: TPOT <= 50 ms


def _node(gpu: str, intra: str, why: str) -> dict[str, Any]:
    """An 8-GPU node on NVSwitch with one 400 Gb/s ConnectX-7 NIC per GPU
    (GPUDirect RDMA), nodes on one non-blocking switch. ``why`` names the
    node's source (kept in the mapping's name for messages)."""
    return {
        "name": why,
        "node": {
            "gpu": gpu,
            "gpus": 8,
            "intra": {"kind": "nvswitch", "bandwidth": intra},
            "nics": {
                "count": 8,
                "kind": "infiniband",
                "bandwidth": "400 Gbps",
                "generation": "connectx-7",
                "attach": "gpu",
                "pcie": "64 GB/s",
            },
        },  # fmt: skip
        "fabric": {"kind": "single-switch"},
    }


# An H800 node as DeepSeek describes it (DeepSeek-V3 report, arXiv 2412.19437, 3.2.2):
# 8 GPUs on NVLink/NVSwitch (H800: 400 GB/s bidirectional, 200 per direction), one
# 400 Gb/s InfiniBand NIC (ConnectX-7) per GPU.
H800_NODE = _node("h800", "200 GB/s", "h800-ib400")
# SGLang's nodes: 8 H100 "connected via InfiniBand" (the blog's Experimental Setup); the
# NIC count and rate are not given: those of an HGX/DGX H100 node, 8 x 400 Gb/s
# ConnectX-7 (DGX H100 datasheet), NVLink 4 at 450 GB/s per direction.
H100_NODE = _node("h100-sxm", "450 GB/s", "h100-ib400")
# CoreWeave's H200 nodes, "Infiniband with ConnectX-7 NICs" (vLLM's post): one 400 Gb/s
# NDR port per GPU as in an HGX H200 node, NVLink 4 at 450 GB/s per direction.
H200_NODE = _node("h200", "450 GB/s", "h200-ib400")


@dataclass(frozen=True)
class Benchmark:
    """One published MoE serving figure and the setup it was measured on.

    ``setup`` is the setup as published; ``twin_setup`` what the twin runs
    where it differs (empty: the same). ``per`` is ``"node"`` or ``"gpu"``:
    what the published figure is counted over. Prefill: ``prompt``,
    ``cached`` (share of each prompt already in the KV cache) and
    ``tokens_per_rank`` (new tokens per rank per iteration). Decode:
    ``kv_len`` and either ``batch_per_rank`` or ``tpot_s`` (then the
    largest batch per rank whose step stays within it). ``perf`` holds the
    Roofline's all-to-all settings the source reports (``moe_dispatch_dtype``,
    ``moe_overlap``, ``moe_dispatch_nodes``), ``perf_source`` where each is
    stated."""

    key: str
    source: str
    url: str
    section: str
    phase: str
    model: str
    node: Mapping[str, Any]
    nodes: int
    ep: int
    published: float
    per: str
    setup: str
    twin_setup: str = ""
    prompt: int = 0
    cached: float = 0.0
    tokens_per_rank: int = 0
    batch_per_rank: int = 0
    kv_len: int = 0
    tpot_s: float = 0.0
    unit: str = field(default="")
    perf: Mapping[str, Any] = field(default_factory=dict)
    perf_source: str = ""

    def __post_init__(self) -> None:
        if self.phase not in ("prefill", "decode"):
            raise ValueError(f"benchmark {self.key}: phase {self.phase!r}")
        if self.per not in ("node", "gpu"):
            raise ValueError(f"benchmark {self.key}: per {self.per!r}")


# The all-to-all settings each source runs (Benchmark.perf; README, Fidelity):
# DeepSeek's day-6 overview: "dispatch transmissions adopt the FP8 format ... combine
# transmissions use the BF16 format", a dual-batch overlap in prefill and decode (decode's
# five-stage pipeline still alternates two micro-batches); prefill on DeepEP's normal kernels,
# which cross the NICs once per destination node and forward over NVLink (deepseek-ai/DeepEP,
# docs/legacy.md: "asymmetric-domain bandwidth forwarding, such as forwarding data from NVLink
# domain to RDMA domain"), each token on at most 4 nodes (DeepSeek-V3 report, arXiv
# 2412.19437, 2.1.2); decode on the low-latency kernels, each copy straight to its GPU over
# RDMA (the same README: "low-latency kernels with pure RDMA").
_DS_PREFILL = {"moe_dispatch_dtype": "fp8", "moe_overlap": "two-batch", "moe_dispatch_nodes": 4}
_DS_DECODE = {"moe_dispatch_dtype": "fp8", "moe_overlap": "two-batch"}
_DS_PERF = "FP8 dispatch, BF16 combine, dual-batch overlap (overview)"
_DS_PERF_PREFILL = _DS_PERF + "; once per node, at most 4 (DeepEP normal kernels, V3 2.1.2)"
# SGLang's blog: DeepEP normal kernels in prefill and low-latency ones in decode, with its
# two-batch overlap (section "Two-batch Overlap"); its DeepEP dispatcher quantizes to FP8
# before the dispatch when DeepGEMM runs the experts (sgl-project/sglang,
# python/sglang/srt/layers/moe/ep_moe/token_dispatcher.py, dispatch_a), and the low-latency
# dispatch runs with use_fp8.
_SGL_PREFILL = _DS_PREFILL
_SGL_DECODE = _DS_DECODE
_SGL_PERF = "FP8 dispatch (its DeepEP dispatcher), two-batch overlap (blog, Two-batch Overlap)"
_SGL_PERF_PREFILL = _SGL_PERF + "; once per node (DeepEP normal kernels)"
# llm-d's wide-EP guide: VLLM_ALL2ALL_BACKEND=deepep_low_latency, FP8 dispatch for a
# 128-block FP8 model (vLLM's DeepEP low-latency prepare/finalize, use_fp8_dispatch); its
# decode command passes no --enable-dbo, so no overlap (guides/wide-ep-lws, decode.yaml).
_LLMD_DECODE = {"moe_dispatch_dtype": "fp8"}
_LLMD_PERF = "FP8 dispatch (deepep_low_latency); no --enable-dbo in the guide: no overlap"

_DS_URL = (
    "https://github.com/deepseek-ai/open-infra-index/blob/main/202502OpenSourceWeek/"
    "day_6_one_more_thing_deepseekV3R1_inference_system_overview.md"
)
_SGL_URL = "https://lmsys.org/blog/2025-05-05-large-scale-ep/"
_LLMD_URL = "https://llm-d.ai/blog/llm-d-v0.3-expanded-hardware-faster-perf-and-igw-ga"


def _sglang_prefill(prompt: int, figure: float) -> Benchmark:
    return Benchmark(
        f"sglang-prefill-{prompt // 1024}k", "SGLang (LMSYS blog)", _SGL_URL,
        "Evaluation: Performance Analysis of Prefill and Decode Phases", "prefill",
        "deepseek-v3", H100_NODE, 4, 32, figure, "node",
        f"DeepSeek-V3 prefill, EP32 with DP attention on 4 H100 nodes (InfiniBand),"
        f" {prompt // 1024}K prompts, 16,384 tokens per device",
        prompt=prompt, tokens_per_rank=16384, perf=_SGL_PREFILL,
        perf_source=_SGL_PERF_PREFILL,
    )  # fmt: skip


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "deepseek-prefill", "DeepSeek inference system overview", _DS_URL,
        "Statistics of DeepSeek's Online Service", "prefill", "deepseek-v3", H800_NODE, 4, 32,
        DS_PREFILL_TOKENS_S_NODE, "node",
        "DeepSeek-V3 prefill, EP32 with DP attention on 4 H800 nodes (8 x 400 Gb/s IB"
        " each), 56.3% of input tokens cached, production traffic",
        "4,096-token prompts, 16k new tokens per rank",
        prompt=4096, cached=DS_CACHE_HIT, tokens_per_rank=16384, perf=_DS_PREFILL,
        perf_source=_DS_PERF_PREFILL,
    ),
    Benchmark(
        "deepseek-decode", "DeepSeek inference system overview", _DS_URL,
        "Statistics of DeepSeek's Online Service", "decode", "deepseek-v3", H800_NODE, 16, 128,
        DS_DECODE_TOKENS_S_NODE, "node",
        "DeepSeek-V3 decode, EP144 on 18 H800 nodes at 20-22 tok/s per user, average KV"
        " 4,989 tokens",
        "EP128 on 16 nodes (144 needs 32 redundant experts), the largest batch with"
        " TPOT <= 50 ms",
        kv_len=DS_KV_LEN, tpot_s=1.0 / DS_USER_TOKENS_S, perf=_DS_DECODE, perf_source=_DS_PERF,
    ),
    _sglang_prefill(1024, 57674.0),
    _sglang_prefill(2048, 54543.0),
    _sglang_prefill(4096, 50302.0),
    Benchmark(
        "sglang-decode", "SGLang (LMSYS blog)", _SGL_URL, "Evaluation: Profile Results",
        "decode", "deepseek-v3", H100_NODE, 8, 64, 22282.0, "node",
        "DeepSeek-V3 decode, EP72 on 9 H100 nodes (288 experts with EPLB), 256"
        " sequences per device, KV 2,000 tokens",
        "EP64 on 8 nodes (72 does not divide 256 experts)",
        batch_per_rank=256, kv_len=2000, perf=_SGL_DECODE, perf_source=_SGL_PERF,
    ),
    Benchmark(
        "llm-d-decode", "llm-d 0.3 / vLLM wide-EP", _LLMD_URL, "Wide-EP Performance",
        "decode", "deepseek-v3", H200_NODE, 2, 16, 2200.0, "gpu",
        "DeepSeek-R1 decode, one DP16/EP16 worker over 2 H200 nodes (CoreWeave, IB"
        " ConnectX-7), batch and lengths not given in the text",
        "assumed: 256 sequences per GPU, KV 2,000 tokens",
        batch_per_rank=256, kv_len=2000, perf=_LLMD_DECODE, perf_source=_LLMD_PERF,
    ),
)  # fmt: skip


def benchmark_roofline(b: Benchmark, plain: bool = False) -> Roofline:
    """The Roofline of ``b``'s instance: ``b.ep`` data-parallel attention
    ranks of one GPU each on ``b.nodes`` nodes of ``b.node``, the all-to-alls
    on that topology's links with ``b.perf``'s settings (``plain``: without
    them, the all-to-alls in BF16, each copy on its own, added to compute)."""
    topo = load_topology({**b.node, "nodes": b.nodes}, where=f"moe_fidelity: {b.key}")
    links = all_to_all_links(topo, range(b.ep))
    gpu = get_gpu(topo.gpu_type(0))
    settings = {} if plain else dict(b.perf)
    # wide-EP deployments (DeepSeek's engine, SGLang, llm-d's vLLM with DeepEP), not the
    # single-instance vLLM runs the default preset is fitted to: the study keeps the distserve
    # preset its published comparison was made with
    model = get_model(b.model)
    kw = {"ep": b.ep, "dp": b.ep, "engine": "distserve", **links, **settings}
    return Roofline(model, gpu, 1, **kw)  # type: ignore[arg-type]


def run_benchmark(b: Benchmark, plain: bool = False) -> dict[str, float]:
    """What the twin gives for ``b`` (``plain``: without ``b.perf``'s
    settings): ``twin`` (in ``b``'s unit: tokens/s per node or per GPU),
    ``iteration_s`` (the priced iteration), ``a2a_s`` (its all-to-alls, both
    micro-batches' under overlap, hidden or not) and, for decode,
    ``batch_per_rank``."""
    r = benchmark_roofline(b, plain)
    scale = b.nodes if b.per == "node" else b.ep
    if b.phase == "prefill":
        cached = round(b.prompt * b.cached)
        new = b.prompt - cached
        per_rank = max(1, b.tokens_per_rank // new)
        chunks = ((new, cached),) * (per_rank * b.ep)
        t = r.iteration_time(Batch(chunks))
        a2a = r.a2a_time(len(chunks) * new)
        return {"twin": len(chunks) * b.prompt / t / scale, "iteration_s": t, "a2a_s": a2a}
    if b.batch_per_rank:
        per_rank = b.batch_per_rank
        n = per_rank * b.ep
        t = r.iteration_time(Batch((), n, n * b.kv_len))
    else:
        per_rank, t = 0, 0.0
        for k in range(1, 1025):
            n = k * b.ep
            step = r.iteration_time(Batch((), n, n * b.kv_len))
            if step > b.tpot_s:
                break
            per_rank, t = k, step
    out = per_rank * b.ep / t / scale if t else 0.0
    a2a = r.a2a_time(per_rank * b.ep)
    return {"twin": out, "iteration_s": t, "a2a_s": a2a, "batch_per_rank": float(per_rank)}


def deepseek_prefill(plain: bool = False) -> dict[str, float]:
    """DeepSeek's prefill figure through the twin (``input_tokens_s_node``)."""
    res = run_benchmark(BENCHMARKS[0], plain)
    return {"iteration_s": res["iteration_s"], "input_tokens_s_node": res["twin"]}


def deepseek_decode(plain: bool = False) -> dict[str, float]:
    """DeepSeek's decode figure through the twin: the largest batch per rank
    within 50 ms a step and its output per node."""
    res = run_benchmark(BENCHMARKS[1], plain)
    return {
        "batch_per_rank": res["batch_per_rank"],
        "step_s": res["iteration_s"],
        "output_tokens_s_node": res["twin"],
    }


def rows(benchmarks: tuple[Benchmark, ...] = BENCHMARKS) -> list[dict[str, Any]]:
    """One row per benchmark: its key, source, setups, the all-to-all
    settings it runs (``perf``, ``perf_source``), published and twin figures
    with those settings (``twin``, ``gap``) and without (``plain``,
    ``plain_gap``: BF16 dispatch, each copy on its own, no overlap)."""
    out = []
    for b in benchmarks:
        res = run_benchmark(b)
        base = run_benchmark(b, plain=True)
        out.append({
            "key": b.key, "source": b.source, "url": b.url, "section": b.section,
            "setup": b.setup, "twin_setup": b.twin_setup, "per": b.per,
            "phase": b.phase, "published": b.published, "twin": res["twin"],
            "gap": res["twin"] / b.published - 1.0, "iteration_s": res["iteration_s"],
            "a2a_s": res["a2a_s"], "perf": dict(b.perf), "perf_source": b.perf_source,
            "plain": base["twin"], "plain_gap": base["twin"] / b.published - 1.0,
            "plain_iteration_s": base["iteration_s"], "plain_a2a_s": base["a2a_s"],
            "batch_per_rank": res.get("batch_per_rank"),
            "plain_batch_per_rank": base.get("batch_per_rank"),
        })  # fmt: skip
    return out


def _settings(perf: Mapping[str, Any]) -> str:
    parts = [f"{k}: {v}" for k, v in sorted(perf.items())]
    return ", ".join(parts) if parts else "none"


def report(benchmarks: tuple[Benchmark, ...] = BENCHMARKS) -> str:
    """The table :func:`rows` holds, as text."""
    out = []
    for row in rows(benchmarks):
        kind = "input" if row["phase"] == "prefill" else "output"
        unit = f"{kind} tok/s/{row['per']}"

        def step(t: float, a2a: float, batch: float | None) -> str:
            text = f"iteration {t * 1e3:.1f} ms, all-to-alls {a2a * 1e3:.1f} ms"
            return text + (f", {batch:.0f} seqs/GPU" if batch is not None else "")

        out.append(
            f"{row['key']}: {row['source']}, {row['url']} ({row['section']})\n"
            f"  setup: {row['setup']}\n"
            + (f"  twin runs: {row['twin_setup']}\n" if row["twin_setup"] else "")
            + f"  settings: {_settings(row['perf'])} ({row['perf_source']})\n"
            f"  published {row['published']:,.0f} {unit}\n"
            f"  twin      {row['twin']:,.0f} ({row['gap']:+.0%};"
            f" {step(row['iteration_s'], row['a2a_s'], row['batch_per_rank'])})\n"
            f"  plain     {row['plain']:,.0f} ({row['plain_gap']:+.0%};"
            f" {step(row['plain_iteration_s'], row['plain_a2a_s'], row['plain_batch_per_rank'])})"
        )
    return "\n".join(out)


if __name__ == "__main__":
    print(report())
