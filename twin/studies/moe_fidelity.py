"""The twin against published mixture-of-experts serving figures.

``python -m twin.studies.moe_fidelity`` prints, for each published figure,
the setup it was measured on, the figure, and what the calibrated Roofline
(:class:`~twin.perf.roofline.Roofline`, its MoE part and all-to-alls priced
on the named topology) gives for the same setup. The Roofline's efficiencies
were fitted on dense models (see README, Fidelity); nothing here is fitted to
these figures.

DeepSeek's inference system overview (deepseek-ai/open-infra-index,
202502OpenSourceWeek/day_6_one_more_thing_deepseekV3R1_inference_system_overview.md):
H800 nodes, prefill on EP32 with data-parallel attention (4 nodes), decode on
EP144 (18 nodes; 256 routed experts plus 32 redundant ones, which the twin
cannot express: it takes EP128 on 16 nodes), "each H800 node delivers an
average throughput of 73.7k tokens/s input (including cache hits) during
prefilling or 14.8k tokens/s output during decoding", with 56.3% of input
tokens hitting the on-disk KV cache, an average KV length of 4,989 tokens per
output token, and 20-22 tokens/s per user.
"""

from __future__ import annotations

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

# An H800 node as DeepSeek describes it (DeepSeek-V3 report, arXiv 2412.19437, 3.2.2):
# 8 GPUs on NVLink/NVSwitch, one 400 Gb/s InfiniBand NIC (ConnectX-7) per GPU.
H800_NODE: dict[str, Any] = {
    "name": "h800-ib400",
    "node": {
        "gpu": "h800",
        "gpus": 8,
        "intra": {"kind": "nvswitch", "bandwidth": "200 GB/s"},
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


def _roofline(ep: int, nodes: int) -> Roofline:
    topo = load_topology({**H800_NODE, "nodes": nodes}, where="moe_fidelity")
    links = all_to_all_links(topo, range(ep))
    return Roofline(get_model("deepseek-v3"), get_gpu("h800"), 1, ep=ep, dp=ep, **links)  # type: ignore[arg-type]


def deepseek_prefill(prompt: int = 4096, new_per_rank: int = 16384) -> dict[str, float]:
    """Prefill on EP32 (4 nodes): every rank runs ``new_per_rank`` new tokens
    an iteration, prompts of ``prompt`` tokens of which 56.3% are cached."""
    r = _roofline(32, 4)
    cached = round(prompt * DS_CACHE_HIT)
    new = prompt - cached
    per_rank = max(1, new_per_rank // new)
    chunks = ((new, cached),) * (per_rank * 32)
    t = r.iteration_time(Batch(chunks))
    return {
        "iteration_s": t,
        "input_tokens_s_node": len(chunks) * prompt / t / 4,
    }


def deepseek_decode(ep: int = 128, nodes: int = 16) -> dict[str, float]:
    """Decode on EP128 (16 nodes) at the average KV length: the largest batch
    per rank whose step stays within 1 / 20 s, and its output per node."""
    r = _roofline(ep, nodes)
    best = (0, 0.0)
    for per_rank in range(1, 1025):
        n = per_rank * ep
        t = r.iteration_time(Batch((), n, n * DS_KV_LEN))
        if t > 1.0 / DS_USER_TOKENS_S:
            break
        best = (per_rank, t)
    per_rank, t = best
    return {
        "batch_per_rank": per_rank,
        "step_s": t,
        "output_tokens_s_node": per_rank * ep / t / nodes if t else 0.0,
    }


def report() -> str:
    p, d = deepseek_prefill(), deepseek_decode()
    rows = [
        ("DeepSeek-V3 prefill, EP32 on 4 H800 nodes, 4k prompts 56.3% cached",
         DS_PREFILL_TOKENS_S_NODE, p["input_tokens_s_node"], "input tok/s/node"),
        (f"DeepSeek-V3 decode, EP128 on 16 H800 nodes (published: EP144 on 18), "
         f"KV {DS_KV_LEN}, {d['batch_per_rank']:.0f} seqs/GPU at TPOT {d['step_s'] * 1e3:.1f} ms",
         DS_DECODE_TOKENS_S_NODE, d["output_tokens_s_node"], "output tok/s/node"),
    ]  # fmt: skip
    out = []
    for name, pub, twin, unit in rows:
        out.append(
            f"{name}\n  published {pub:,.0f}  twin {twin:,.0f} {unit}  ({twin / pub - 1:+.0%})"
        )
    return "\n".join(out)


if __name__ == "__main__":
    print(report())
