"""Mixture-of-experts models and expert parallelism: the catalog's shapes, the
MoE part of the Roofline, the all-to-all on the topology, the layouts."""

from __future__ import annotations

import dataclasses

import pytest

import schedulers.colocated  # noqa: F401 - registers the built-ins when not installed
from twin.cli import main
from twin.errors import SpecError
from twin.net.topology import all_to_all_links, load_topology
from twin.perf.gpus import GPUSpec, get_gpu
from twin.perf.iteration import Batch
from twin.perf.kvreport import kv_facts
from twin.perf.llm import MODELS, ModelSpec, get_model
from twin.perf.roofline import Roofline
from twin.sim.spec import load_spec

# (model, KV elements per layer per token from its config.json, layers)
KV_CASES = [
    # MLA: kv_lora_rank 512 + qk_rope_head_dim 64, one latent per layer
    ("deepseek-v3", 512 + 64, 61),
    # GQA: 2 (K and V) x num_key_value_heads x head_dim
    ("qwen3-30b-a3b", 2 * 4 * 128, 48),
    ("qwen3-235b-a22b", 2 * 4 * 128, 94),
    ("gpt-oss-20b", 2 * 8 * 64, 24),
    ("gpt-oss-120b", 2 * 8 * 64, 36),
    ("mixtral-8x7b", 2 * 8 * 128, 32),
]


@pytest.mark.parametrize(("name", "per_layer", "layers"), KV_CASES)
def test_kv_bytes_per_token_is_the_config_arithmetic(name, per_layer, layers):
    m = get_model(name)
    assert m.kv_bytes_per_token() == layers * per_layer * 2
    assert m.kv_bytes_per_token(1) == layers * per_layer
    facts = kv_facts(m, 1000)
    assert facts["bytes_per_token"] == layers * per_layer * 2
    assert facts["kv_bytes"] == 1008 * layers * per_layer * 2  # 63 blocks of 16


def test_deepseek_kv_is_70_272_bytes_per_token_and_the_same_on_every_tp_rank(capsys):
    m = get_model("deepseek-ai/DeepSeek-V3")
    assert m.kv_bytes_per_token() == 70_272
    # the latent is not split over heads: 8 TP ranks hold 8 copies
    assert m.kv_bytes_per_token_tp(8) == 8 * 70_272
    assert m.tp_problem(8) is None and m.tp_problem(3) is not None
    assert main(["kv", "deepseek-v3", "--tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert "70,272 B" in out and "512 latent + 64 rope" in out


def _count(m: ModelSpec) -> int:
    """Weights from the shapes (matrices only, embeddings and LM head untied),
    written out here independently of the catalog's properties."""
    h, f = m.hidden, m.expert_intermediate
    if m.kv_lora_rank:
        qk = m.heads * (m.qk_nope_dim + m.qk_rope_dim)
        attn = (
            h * m.q_lora_rank
            + m.q_lora_rank * qk
            + h * (m.kv_lora_rank + m.qk_rope_dim)
            + m.kv_lora_rank * m.heads * (m.qk_nope_dim + m.head_dim)
            + m.heads * m.head_dim * h
        )
    else:
        attn = 2 * h * m.heads * m.head_dim + 2 * h * m.kv_heads * m.head_dim
    moe = (m.experts + m.shared_experts) * 3 * h * f + h * m.experts
    dense = 3 * h * m.intermediate
    return (
        m.layers * attn
        + m.dense_layers * dense
        + (m.layers - m.dense_layers) * moe
        + 2 * m.vocab * h
    )


@pytest.mark.parametrize("name", [c[0] for c in KV_CASES])
def test_the_published_totals_follow_from_the_shapes(name):
    m = get_model(name)
    assert m.is_moe
    # norms, biases and sinks are the rest: well under 0.1% of the total
    assert abs(_count(m) - m.params) < 1e-3 * m.params
    # the catalog's split: routed experts plus what every token uses plus embeddings
    assert m.routed_params + m.dense_token_params + 2 * m.vocab * m.hidden == _count(m)


def test_active_parameters_match_the_published_figures():
    # DeepSeek-V3: 37B activated per token (arXiv 2412.19437, abstract), embeddings in
    ds = get_model("deepseek-v3")
    active = ds.dense_token_params + ds.moe_layers * 8 * ds.expert_params + 2 * 129280 * 7168
    assert 36.5e9 < active < 38e9
    # Qwen3-30B-A3B: 3.3B activated (its model card)
    q = get_model("qwen3-30b-a3b")
    active = q.dense_token_params + q.moe_layers * 8 * q.expert_params + 2 * 151936 * 2048
    assert 3.2e9 < active < 3.4e9


def test_a_user_moe_model_is_checked():
    base = {"name": "m", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16,
            "intermediate": 128, "vocab": 100, "params": 10**6}  # fmt: skip
    m = get_model({**base, "experts": 4, "experts_per_token": 2, "expert_intermediate": 32})
    assert m.moe_layers == 2 and m.expert_params == 3 * 64 * 32
    with pytest.raises(SpecError, match="experts_per_token=5"):
        get_model({**base, "experts": 4, "experts_per_token": 5, "expert_intermediate": 32})
    with pytest.raises(SpecError, match="need experts"):
        get_model({**base, "experts_per_token": 2})
    with pytest.raises(SpecError, match="qk_rope_dim"):
        get_model({**base, "kv_lora_rank": 32})


# -- the perf model -------------------------------------------------------------------
UNIT_GPU = GPUSpec("unit", 1e12, 1e11, 80 * 2**30, 700.0, 1e10, 1e9)
QUIET = dict(mfu=1.0, mbu=1.0, attn_mfu=1.0, overhead_s=0.0, layer_overhead_s=0.0,
             seq_overhead_s=0.0, seq_shard_overhead_s=0.0, hop_latency_s=0.0, act_traffic=0.0,
             no_overlap=0.0, throttle=0.0, moe_efficiency=1.0)  # fmt: skip
TINY = ModelSpec("tiny-moe", 1, 64, 4, 2, 16, 128, 100, 10**6, 2, "gated", None, experts=4,
                 experts_per_token=2, expert_intermediate=32)  # fmt: skip


def test_one_moe_layer_by_hand():
    r = Roofline(TINY, UNIT_GPU, **QUIET)
    # decode of 3 sequences, contexts summing to 30
    t = r.iteration_time(Batch((), 3, 30))
    h, e, f, v = 64, 4, 32, 100
    attn_w = 2 * h * 4 * 16 + 2 * h * 2 * 16  # q, o and k, v
    dense_w = attn_w + h * e  # attention and the router
    compute = (2 * dense_w * 3 + 2 * h * v * 3) / 1e12 + 4 * 4 * 16 * 30 / 1e12
    routed = e * 3 * h * f
    mem = ((10**6 - routed) * 2 + 2 * 2 * 16 * 2 * (30 + 3)) / 1e11
    dense = max(compute, mem)
    # 3 tokens x 2 experts = 6 pairs; experts with a token: 4 x (1 - (1 - 2/4)^3) = 3.5
    pairs, active = 6, 4 * (1 - 0.5**3)
    expert = max(pairs * 2 * 3 * h * f / 1e12, active * 3 * h * f * 2 / 1e11)
    assert expert == active * 3 * h * f * 2 / 1e11  # small decode: memory bound
    assert t == pytest.approx(dense + expert, rel=1e-12)
    # a big prefill chunk: the experts become compute bound
    big = r.moe_time(4096)
    assert big == pytest.approx(4096 * 2 * 2 * 3 * h * f / 1e12, rel=1e-12)
    # a skew of 0.5 puts 1.5x the mean on the busiest GPU (compute-bound case)
    skewed = Roofline(TINY, UNIT_GPU, expert_skew=0.5, **QUIET).moe_time(4096)
    assert skewed == pytest.approx(1.5 * big, rel=1e-12)


def test_decode_steps_equal_iteration_times_for_moe():
    r = Roofline(get_model("qwen3-30b-a3b"), get_gpu("h100"), 2)
    for n in (5, 200):
        want = [r.iteration_time(Batch((), 16, 1600 + 16 * i)) for i in range(n)]
        assert r.decode_steps(16, 1600, n) == want


def test_expert_parallel_weights_and_validation():
    ds = get_model("deepseek-v3")
    routed = ds.routed_params  # FP8: one byte each
    assert ds.weight_bytes_per_gpu(1, 1, 32) == pytest.approx((ds.params - routed) + routed / 32)
    assert ds.weight_bytes_per_gpu(8, 1, 1) == ds.params / 8
    with pytest.raises(SpecError, match="does not divide"):
        Roofline(ds, get_gpu("h100"), 1, ep=3, dp=3)
    with pytest.raises(SpecError, match="dp x tp"):
        Roofline(ds, get_gpu("h100"), 2, ep=8, dp=8)
    with pytest.raises(SpecError, match="mixture-of-experts"):
        Roofline(get_model("llama-3-8b"), get_gpu("h100"), 1, ep=2, dp=2)


def test_all_to_all_on_an_idle_path_is_the_topology_rate():
    topo = load_topology("dgx-h100-ib400", nodes=2)
    links = all_to_all_links(topo, range(16))
    assert links["a2a_ranks_per_node"] == 8
    # inside a node: the NVSwitch path; across: each GPU's own ConnectX-7
    assert links["a2a_intra_bytes_s"] == topo.bottleneck_bytes_s(topo.path(0, 1))
    assert links["a2a_inter_bytes_s"] == topo.bottleneck_bytes_s(topo.path(0, 8))
    assert links["a2a_latency_s"] == topo.latency_s(topo.path(0, 8))
    ds = get_model("deepseek-v3")
    r = Roofline(ds, get_gpu("h100"), 1, ep=16, dp=16, **links)  # type: ignore[arg-type]
    tokens = 1600
    sent = tokens / 16 * 8 * 7168 * 2  # each rank's tokens, 8 copies each, BF16
    intra = sent * 7 / 16 / links["a2a_intra_bytes_s"]
    inter = sent * 8 / 16 / links["a2a_inter_bytes_s"]
    assert inter > intra  # the NICs bound it
    assert r.all_to_all_time(tokens) == pytest.approx(inter + links["a2a_latency_s"], rel=1e-12)


# -- layouts in a spec --------------------------------------------------------------
WIDE = [
    "model=deepseek-v3", "cluster.topology=dgx-h100-ib400", "cluster.nodes=8", "cluster.tp=1",
    "cluster.ep=16", "cluster.dp=16", "cluster.prefill={instances: 2}",
    "cluster.decode={instances: 1, ep: 32, dp: 32}", "workload.max_requests=20",
    "scheduler.name=disagg",
]  # fmt: skip


def test_a_wide_ep_decode_instance_spans_nodes():
    from twin.sim.simulation import Simulation

    spec = load_spec("disagg", WIDE)
    assert [(g.role, g.gpus, g.ep, g.dp) for g in spec.groups] == [
        ("prefill", 16, 16, 16), ("decode", 32, 32, 32)
    ]  # fmt: skip
    sim = Simulation(spec)
    decode = sim.placements[2]
    assert len(decode.gpus) == 32
    assert {sim.spec.topology.node_of(g) for g in decode.gpus} == {4, 5, 6, 7}
    names = sorted(p.name for p in sim.perfs.values())
    assert any("ep32dp32" in n for n in names) and any("ep16dp16" in n for n in names)
    r = sim.run()
    assert r.summary["completed"] == 20


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["cluster.decode={instances: 1, ep: 24, dp: 24}"], r"cluster\.decode\.ep: 24 does not"),
        (["cluster.decode={instances: 1, ep: 32, dp: 16}"], r"cluster\.decode\.ep: 32 must equal"),
        (["model=llama-3-8b"], r"cluster\.ep: 16 needs a mixture-of-experts model"),
    ],
)
def test_bad_layouts_give_one_error_line(capsys, extra, message):
    import re

    args = ["run", "disagg", "-q"]
    for s in WIDE + extra:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("twin: error:"), err
    assert re.search(message, err[0]), err[0]


def test_the_catalog_lists_every_moe_model():
    for name in ("deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b",
                 "gpt-oss-120b", "mixtral-8x7b"):  # fmt: skip
        assert MODELS[name].is_moe


# -- the planner --------------------------------------------------------------------
def test_the_planner_prefers_expert_parallel_decode_for_deepseek():
    """DeepSeek-V3's FP8 weights fill most of an H200 node whatever the layout,
    and under TP its latent KV is copied to every rank; EP 8 over 8
    data-parallel attention ranks keeps one copy and reads each GPU's own
    sequences' KV only, so it decodes more per GPU and the planner takes it."""
    from pathlib import Path

    from twin._progress import Progress
    from twin.sim.spec import resolve_spec
    from twin.studies.planner import Candidate, _best, _Planner, _score
    from twin.studies.samples import replicate_samples
    from twin.studies.sweep import Executor

    topo = {
        "name": "h200-node",
        "node": {"gpu": "h200", "gpus": 8,
                 "nics": {"count": 8, "kind": "infiniband", "bandwidth": "400 Gbps"}},
        "nodes": 2,
    }  # fmt: skip
    data = {
        "model": "deepseek-v3",
        "cluster": {"topology": topo, "prefill": 1, "decode": 1},
        "workload": {
            "lengths": {
                "prompt": {"dist": "fixed", "value": 2000},
                "output": {"dist": "fixed", "value": 100},
            },
            "arrival": {"process": "poisson", "rate": 4.0},
            "max_requests": 24,
        },  # fmt: skip
        "slo": {"ttft": "30 s", "tpot": "30 ms"},  # decode limits, not the prefill feed
        # explicit software terms (the distserve preset before the workload-weighted refit), so
        # the planner is checked on a fixed pricing rather than on whatever the preset is now
        "perf": {
            "kind": "roofline",
            "overhead": "4 ms",
            "layer_overhead": "0 s",
            "seq_overhead": "70 us",
            "act_traffic": 28.0,
            "no_overlap": 0.73,
        },  # fmt: skip
    }
    spec = resolve_spec(data, "plan.yaml", Path.cwd(), place=False)  # the planner's template
    pl = _Planner(spec, replicate_samples(spec, 24, 1)[0], 8, 3, 200)
    # every layout of the node: only TP8 and the EP8 ones hold the weights
    dense = {(tp, pp): note for tp, pp, note in pl.configs()}
    assert dense == {(1, 1): "weights do not fit", (2, 1): "weights do not fit",
                     (4, 1): "weights do not fit", (8, 1): ""}  # fmt: skip
    fits = [(tp, ep) for tp, ep, note in pl.expert_configs() if not note]
    assert fits == [(1, 8), (2, 8), (4, 8)]
    # the decode phase's search, as plan_distserve runs it, on TP8 and on EP8 (DP8)
    feed = Candidate("prefill", 8, 1, 200.0)
    with Executor(jobs=1) as ex, Progress(2, "searches", desc="plan") as bar:
        decodes, _ = _score(ex, spec, pl.sample, (8, 3, 200), "decode",
                            [(8, 1, "", 1), (1, 1, "", 8)], feed, bar)  # fmt: skip
    tp8, ep8 = decodes
    assert (tp8.label(), ep8.label()) == ("TP8 PP1", "TP1 DP8 EP8")
    assert tp8.note == ep8.note == ""  # both searches found a bound
    assert tp8.goodput_rps > 0 and ep8.per_gpu > 1.2 * tp8.per_gpu
    assert _best(decodes) == ep8


def test_provision_keeps_the_expert_parallel_layout_and_counts_its_gpus():
    from twin.sim.spec import apply_overrides, read_spec
    from twin.studies.provision import _candidate_spec, placed_power_w

    spec = load_spec("disagg", WIDE)
    data = read_spec("disagg")[0]
    apply_overrides(data, WIDE)
    pg, dg = spec.groups
    cand = _candidate_spec(data, spec.source, spec.base_dir, pg, dg, 1, 1)
    assert [(g.role, g.count, g.ep, g.dp, g.gpus) for g in cand.groups] == [
        ("prefill", 1, 16, 16, 16), ("decode", 1, 32, 32, 32)
    ]  # fmt: skip
    # 64 GPUs placed (two prefill instances of 16 over two nodes each, a decode of 32)
    assert placed_power_w(spec) == 64 * get_gpu("h100").tdp_w


def test_deepseek_published_figures_within_half():
    """DeepSeek's day-6 overview: 73.7k input and 14.8k output tokens/s per H800
    node; the plain twin is under both (BF16 all-to-alls added to compute); with
    the overview's FP8 dispatch and dual-batch overlap decode is closer and
    prefill over (production traffic against a saturated iteration)."""
    from twin.studies.moe_fidelity import deepseek_decode, deepseek_prefill, report

    p, d = deepseek_prefill(plain=True), deepseek_decode(plain=True)
    assert 0.5 < p["input_tokens_s_node"] / 73.7e3 < 1.0
    assert 0.5 < d["output_tokens_s_node"] / 14.8e3 < 1.0
    assert d["step_s"] <= 0.05 and d["batch_per_rank"] > 8
    p2, d2 = deepseek_prefill(), deepseek_decode()
    assert p2["input_tokens_s_node"] > 73.7e3 > p["input_tokens_s_node"]
    assert d["output_tokens_s_node"] < d2["output_tokens_s_node"] < 14.8e3
    assert d2["step_s"] <= 0.05 and d2["batch_per_rank"] > d["batch_per_rank"]
    assert "published 73,700" in report()


def test_a_node_failure_takes_down_the_wide_ep_instance_spanning_it():
    from twin.sim.simulation import Simulation

    spec = load_spec("disagg", [*WIDE, "events=[{at: 0.5 s, action: fail, node: 6}]"])
    sim = Simulation(spec)
    assert sim.faults.instances_of(spec.events[0]) == (2,)  # node 6 is the decode's third


def test_expert_weights_that_do_not_fit_name_the_layout(capsys):
    # EP8 on one 80 GB H100 node: 17 GB of dense weights plus 82 GB of experts a GPU
    args = ["run", "disagg", "-q"]
    for s in [*WIDE, "cluster.prefill={instances: 2, ep: 8, dp: 8}"]:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "prefill instance (EP8, DP8 x TP1 x PP1)" in err[0], err


# -- wide EP in the planner and EP in provisioning -----------------------------------
def _wide_plan_spec(nodes: int, tpot: str):
    from pathlib import Path

    from twin.sim.spec import resolve_spec

    data = {
        "model": "deepseek-v3",
        "cluster": {"topology": "dgx-h100-ib400", "nodes": nodes, "prefill": 1, "decode": 1},
        "workload": {
            "lengths": {
                "prompt": {"dist": "fixed", "value": 2000},
                "output": {"dist": "fixed", "value": 100},
            },
            "arrival": {"process": "poisson", "rate": 4.0},
            "max_requests": 24,
        },  # fmt: skip
        "slo": {"ttft": "30 s", "tpot": tpot},
    }
    return resolve_spec(data, "plan.yaml", Path.cwd(), place=False)  # the planner's template


def test_the_planner_takes_a_wide_ep_decode_where_no_node_holds_deepseek(monkeypatch):
    """DeepSeek-V3's 671 GB of FP8 weights do not fit one DGX H100 node in any
    layout (TP8: 84 GB a GPU; EP8: 17 GB of dense weights and 82 GB of experts
    a GPU; 0.9 x 80 GiB usable), so every in-node candidate is out and the
    planner must span nodes: EP16 over 2 nodes, EP32 over 4. At the same
    sequences per rank a decode step of EP32 is shorter than EP16's (each GPU
    reads 8 experts' weights instead of 16, memory bound, while the all-to-all
    crosses the same NICs), so under a TPOT SLO EP32 decodes more per GPU."""
    from twin.net.topology import all_to_all_links
    from twin.perf.build import build_perf_model
    from twin.studies import planner
    from twin.studies.planner import _Planner, plan_distserve
    from twin.studies.samples import replicate_samples

    spec = _wide_plan_spec(6, "20 ms")
    ds, h100 = spec.model, get_gpu("h100")
    usable = spec.memory_utilization * h100.memory_bytes
    assert ds.weight_bytes_per_gpu(8, 1, 1) > usable
    assert ds.weight_bytes_per_gpu(1, 1, 8) > usable > ds.weight_bytes_per_gpu(1, 1, 16)
    pl = _Planner(spec, replicate_samples(spec, 24, 1)[0], 8, 3, 400, 4)
    assert all(note == "weights do not fit" for *_, note in pl.configs())
    fits = [(tp, ep) for tp, ep, note in pl.expert_configs() if not note]
    assert fits == [(tp, ep) for ep in (16, 32) for tp in (1, 2, 4, 8)]  # 2 and 4 nodes
    assert pl.where() == "within a node or, with EP, over up to 4 nodes"
    topo = load_topology("dgx-h100-ib400", nodes=4)
    step = {}
    for ep in (16, 32):
        links = all_to_all_links(topo, range(ep))
        assert links["a2a_inter_bytes_s"] == topo.injection_bytes_s(0)  # one NIC a GPU
        r = build_perf_model(None, ds, h100, 1, 1, ep=ep, dp=ep, a2a=links)
        step[ep] = r.iteration_time(Batch((), 4 * ep, 4 * ep * 2050))  # 4 sequences a rank
    assert step[32] < 0.9 * step[16]
    # the search as plan_distserve runs it, on the TP1 layouts (pure data-parallel attention)
    orig = _Planner.expert_configs
    monkeypatch.setattr(_Planner, "expert_configs", lambda s: [c for c in orig(s) if c[0] == 1])
    plan = plan_distserve(spec, sample_size=24, replicates=1, iterations=3,
                          max_decode_requests=200)  # fmt: skip
    by = {(c.role, c.label()): c for c in plan.candidates}
    d16, d32 = by["decode", "TP1 DP16 EP16"], by["decode", "TP1 DP32 EP32"]
    assert 0 < d16.per_gpu < d32.per_gpu
    assert plan.decode == d32 and plan.decode.gpus == 32 > plan.gpus_per_node
    assert plan.prefill.label() == "TP1 DP16 EP16"
    over = plan.to_spec_overrides()["cluster"]
    assert over["decode"] == {"instances": 1, "tp": 1, "pp": 1, "ep": 32, "dp": 32}
    assert "+ 1 x decode TP1 DP32 EP32 = 48 GPUs" in plan.explain()
    assert planner._nodes_needed([16, 32], 8) == 6


def test_provision_searches_the_ep_layouts_of_each_role(capsys, tmp_path):
    """On 48 GPUs of DGX H100 nodes, DeepSeek-V3's valid layouts are EP16 and
    EP32 (EP8 and below leave no room for KV, EP64 exceeds the budget): four
    layout pairs, of which EP32 + EP32 does not fit, each with its splits."""
    import json

    from twin.studies.provision import layouts

    spec = load_spec("deepseek-wide-ep", ["compare=null"])
    pg, dg = spec.groups
    assert [g.ep for g in layouts(spec, pg, 48)] == [16, 32]
    assert [g.ep for g in layouts(spec, pg, 31)] == [16]
    assert [(g.ep, g.dp, g.tp) for g in layouts(spec, dg, 48)] == [(16, 16, 1), (32, 32, 1)]
    # the CLI plans the spec's base, with a note, and names each split's layouts
    args = ["provision", "deepseek-wide-ep", "--gpus", "48", "--sample", "12",
            "--replicates", "1", "--set", "workload.max_requests=40",
            "--json", str(tmp_path / "p.json")]  # fmt: skip
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert err.startswith("twin: note: deepseek-wide-ep.yaml has compare: (disagg, colocated)")
    doc = json.loads((tmp_path / "p.json").read_text())
    rows = [
        (c["prefill"], c["prefill_group"]["ep"], c["decode"], c["decode_group"]["ep"], c["gpus"])
        for c in doc["candidates"]
    ]
    assert rows == [(1, 16, 2, 16, 48), (2, 16, 1, 16, 48), (1, 16, 1, 32, 48), (1, 32, 1, 16, 48)]
    assert doc["candidates"][2]["decode_group"] == {"tp": 1, "pp": 1, "ep": 32, "dp": 32,
                                                    "template": None}  # fmt: skip
    assert "       1  TP1 DP16 EP16       1  TP1 DP32 EP32    48" in out
    best = doc["best"]
    assert f"best: {best['prefill']} prefill ({_lbl(best['prefill_group'])}) + " in out


def _lbl(g: dict) -> str:
    return f"TP{g['tp']} DP{g['dp']} EP{g['ep']}"


def test_provision_of_a_dense_model_searches_its_own_layout_only():
    from twin.studies.provision import layouts

    spec = load_spec("disagg")
    assert [layouts(spec, g, 10**4) for g in spec.groups] == [[g] for g in spec.groups]


def test_plan_takes_a_compare_spec_by_its_base(capsys):
    # the base is planned: its own keys are checked (here a bad EP), compare: is not refused
    assert main(["plan", "deepseek-wide-ep", "--set", "cluster.decode.ep=24"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == (
        "twin: note: deepseek-wide-ep.yaml has compare: (disagg, colocated); twin plan plans "
        "its base, the spec without it"
    )
    assert len(err) == 2 and "cluster.decode.ep: 24 does not divide" in err[1]


def test_a_published_benchmark_runs_through_the_roofline_of_its_setup():
    """The fidelity study's arithmetic on a small case: Qwen3-30B-A3B on one
    8-GPU H100 node, EP8: prefill of 1,000-token prompts half cached, and a
    decode step, each the Roofline of that layout priced by hand here."""
    from twin.studies.moe_fidelity import H100_NODE, Benchmark, run_benchmark

    topo = load_topology({**H100_NODE, "nodes": 1}, where="test")
    links = all_to_all_links(topo, range(8))
    r = Roofline(get_model("qwen3-30b-a3b"), get_gpu("h100-sxm"), 1, ep=8, dp=8,
                 engine="distserve", **links)  # the study's preset  # fmt: skip
    common = {"source": "s", "url": "u", "section": "x", "model": "qwen3-30b-a3b",
              "node": H100_NODE, "nodes": 1, "ep": 8, "setup": "small"}  # fmt: skip
    pre = Benchmark("p", phase="prefill", published=1.0, per="node", prompt=1000,
                    cached=0.5, tokens_per_rank=1000, **common)  # fmt: skip
    # 500 new tokens a prompt: 2 prompts a rank, 16 in all
    t = r.iteration_time(Batch(((500, 500),) * 16))
    res = run_benchmark(pre)
    assert res["iteration_s"] == t and res["twin"] == 16 * 1000 / t
    assert res["a2a_s"] == 2 * 48 * r.all_to_all_time(16 * 500) > 0
    dec = Benchmark("d", phase="decode", published=1.0, per="gpu", batch_per_rank=4,
                    kv_len=300, **common)  # fmt: skip
    t = r.iteration_time(Batch((), 32, 32 * 300))
    assert run_benchmark(dec)["twin"] == 32 / t / 8  # per GPU
    # with a TPOT bound: the largest batch per rank whose step fits
    bound = r.iteration_time(Batch((), 8 * 20, 8 * 20 * 300))
    tpot = Benchmark("t", phase="decode", published=1.0, per="node", kv_len=300,
                     tpot_s=bound, **common)  # fmt: skip
    res = run_benchmark(tpot)
    assert res["batch_per_rank"] == 20 and res["iteration_s"] == bound


def test_every_published_wide_ep_benchmark_is_reported_with_its_source():
    from twin.studies.moe_fidelity import BENCHMARKS, report, rows

    keys = {b.key for b in BENCHMARKS}
    assert {"sglang-prefill-4k", "sglang-decode", "llm-d-decode"} <= keys
    table = rows()
    assert [r["key"] for r in table] == [b.key for b in BENCHMARKS]
    for row, b in zip(table, BENCHMARKS, strict=True):
        assert row["url"].startswith("https://") and row["twin"] > 0
        assert row["gap"] == row["twin"] / b.published - 1
        assert row["plain_gap"] == row["plain"] / b.published - 1
        # every source names its all-to-all settings, and they raise the figure
        assert b.perf and b.perf_source and row["perf"] == dict(b.perf)
        assert row["twin"] > row["plain"] > 0
        assert row["a2a_s"] < row["plain_a2a_s"] or b.phase == "decode"
    # decode runs DeepEP's low-latency kernels: no per-node dedup
    assert all("moe_dispatch_nodes" not in b.perf for b in BENCHMARKS if b.phase == "decode")
    text = report()
    assert all(b.url in text for b in BENCHMARKS)
    assert "moe_overlap: two-batch" in text and "plain " in text


@pytest.mark.parametrize("tp", [1, 32])  # the pool's tp, or its GPUs in all
def test_an_instance_a_policy_adds_keeps_the_pools_wide_ep_layout(tp):
    from twin.scheduler import AddInstance
    from twin.sim.simulation import Simulation

    spec = load_spec("disagg", [*WIDE, "cluster.nodes=12"])
    sim = Simulation(spec)
    sim.scaler.add(AddInstance("decode", tp=tp))
    eng, p = sim.engines[-1], sim.placements[-1]
    assert (eng.role, eng.state) == ("decode", "starting")
    assert len(p.gpus) == 32 and p.node == 8  # four whole free nodes: 8..11
    assert {spec.topology.node_of(g) for g in p.gpus} == {8, 9, 10, 11}
    assert eng.perf.ep == 32 and eng.perf.dp == 32 and eng.perf.tp == 1
    assert eng.perf is sim.engines[2].perf  # the pool's own model: same layout and links
    # KV blocks: dp ranks of one GPU each, as the spec's decode instance
    assert sim.capacity[eng.id] == sim.capacity[2]
    assert sim.scaler.alloc[eng.id][2] == 32  # its GPU-seconds count 32 GPUs


def test_an_added_instance_that_breaks_the_pools_layout_is_an_error():
    from twin.scheduler import AddInstance
    from twin.sim.simulation import Simulation

    sim = Simulation(load_spec("disagg", [*WIDE, "cluster.nodes=12"]))
    with pytest.raises(SpecError, match=r"decode pool's layout EP32 \(DP32 x TP1 x PP1"):
        sim.scaler.add(AddInstance("decode", tp=4))


# compute-bound: memory (1e30 B/s) never binds, so an iteration is its FLOPs at 1e12 FLOP/s
FLOPS_GPU = GPUSpec("flops-only", 1e12, 1e30, 80 * 2**30, 700.0, 1e10, 1e9)
# memory-bound: compute (1e30 FLOP/s) never binds, an iteration is its bytes at 1e11 B/s
BYTES_GPU = GPUSpec("bytes-only", 1e30, 1e11, 80 * 2**30, 700.0, 1e10, 1e9)
# one MLA layer: 4 heads, latent 16, rope key 4, no-rope query/key 8, value head 8
TINY_MLA = ModelSpec("tiny-mla", 1, 64, 4, 4, 8, 128, 100, 10**6, 2, "gated", None,
                     kv_lora_rank=16, qk_rope_dim=4, qk_nope_dim=8)  # fmt: skip


def test_latent_attention_decode_is_priced_absorbed_and_prefill_not():
    """DeepSeek-V2 (arXiv 2405.04434) 2.1.2-2.1.3: decode with W_UK folded into
    the query and W_UV into the output attends over the cached latent itself
    (per head and context token: a dot product of kv_lora_rank + qk_rope,
    then kv_lora_rank for the value); prefill up-projects K (qk_nope, plus the
    shared rope key) and V (v_head) per head and attends over those."""
    r = Roofline(TINY_MLA, FLOPS_GPU, **QUIET)
    heads, lora, rope, nope, v = 4, 16, 4, 8, 8
    # decode: 3 sequences; 300 more context tokens cost 2 x heads x (2 lora + rope) each
    d1, d2 = r.iteration_time(Batch((), 3, 30)), r.iteration_time(Batch((), 3, 330))
    assert d2 - d1 == pytest.approx(300 * 2 * heads * (lora + rope + lora) / 1e12, rel=1e-9)
    # prefill of 10 new tokens after 20 cached: 10 x (20 + 11/2) = 255 (query, key) pairs
    # at 2 x heads x (nope + rope + v), and the 20 cached latents up-projected to K and V
    # (kv_up: lora x heads x (nope + v) weights, 2 FLOPs each), against the same chunk alone
    p0, p1 = r.iteration_time(Batch(((10, 0),))), r.iteration_time(Batch(((10, 20),)))
    pairs = 10 * 20  # the extra pairs the 20 cached tokens add
    extra = pairs * 2 * heads * (nope + rope + v) + 20 * 2 * lora * heads * (nope + v)
    assert p1 - p0 == pytest.approx(extra / 1e12, rel=1e-9)
    # and the whole prefill chunk by hand: linear weights per token, LM head, attention
    h = 64
    q = h * heads * (nope + rope)
    kv_down, kv_up, o = h * (lora + rope), lora * heads * (nope + v), heads * v * h
    mlp = 3 * h * 128
    linear = 2 * 10 * (q + kv_down + kv_up + o + mlp) + 2 * h * 100
    attn = 10 * 5.5 * 2 * heads * (nope + rope + v)
    assert p0 == pytest.approx((linear + attn) / 1e12, rel=1e-12)
    # decode_steps agree with iteration_time, step by step
    assert r.decode_steps(3, 30, 4) == [r.iteration_time(Batch((), 3, 30 + 3 * i))
                                        for i in range(4)]  # fmt: skip


def test_deepseek_decode_attention_is_the_absorbed_count():
    m = get_model("deepseek-v3")
    # 128 heads x 2 x (512 + 64 + 512) per context token and layer, absorbed;
    # 128 x 2 x (128 + 64 + 128) per (query, key) pair without absorption
    assert m.attn_flops_per_pair(absorbed=True) == 128 * 2 * 1088
    assert m.attn_flops_per_pair() == 128 * 2 * 320
    assert m.kv_up_params_per_layer == 512 * 128 * 256
    dense = get_model("llama-3.1-8b")
    assert dense.attn_flops_per_pair() == dense.attn_flops_per_pair(True) == 4 * 32 * 128


# openai/gpt-oss-20b and -120b config.json: layer_types, sliding_window 128
GPT_OSS_LAYER_TYPES = {
    "gpt-oss-20b": ["sliding_attention", "full_attention"] * 12,
    "gpt-oss-120b": ["sliding_attention", "full_attention"] * 18,
}


@pytest.mark.parametrize("name", sorted(GPT_OSS_LAYER_TYPES))
def test_gpt_oss_sliding_layers_follow_the_config(name):
    m = get_model(name)
    types = GPT_OSS_LAYER_TYPES[name]
    assert m.layers == len(types)
    assert m.sliding_layers == types.count("sliding_attention")
    assert m.sliding_window == 128
    # the KV held stays the upper bound: every layer's K and V for every token
    assert m.kv_bytes_per_token() == 2 * len(types) * 8 * 64 * 2


def test_sliding_layers_attend_and_read_at_most_the_window():
    m = get_model("gpt-oss-20b")  # 12 full and 12 sliding layers of 64 heads x 64
    per_pair = 4 * 64 * 64  # FLOPs per layer and (query, key) pair
    r = Roofline(m, FLOPS_GPU, **QUIET)
    # decode, 4 sequences, every context past the window: only full layers grow
    d1, d2 = r.iteration_time(Batch((), 4, 4 * 500)), r.iteration_time(Batch((), 4, 4 * 1500))
    assert d2 - d1 == pytest.approx(12 * per_pair * 4 * 1000 / 1e12, rel=1e-9)
    # a prefill chunk of 300 after 0 or 1,000 cached: full layers add 300 x 1,000 pairs;
    # a sliding layer's query at position p sees min(p, 128) keys: 128 x 129 / 2 + 172 x 128
    # pairs from an empty cache, 300 x 128 after 1,000 cached
    p0, p1 = r.iteration_time(Batch(((300, 0),))), r.iteration_time(Batch(((300, 1000),)))
    slide0, slide1 = 128 * 129 // 2 + 172 * 128, 300 * 128
    full = 12 * per_pair * 300 * 1000
    assert p1 - p0 == pytest.approx((full + 12 * per_pair * (slide1 - slide0)) / 1e12, rel=1e-9)
    # KV reads: sliding layers read the last 128 tokens of each context
    rb = Roofline(m, BYTES_GPU, **QUIET)
    b1, b2 = rb.iteration_time(Batch((), 4, 4 * 500)), rb.iteration_time(Batch((), 4, 4 * 1500))
    per_layer_token = 2 * 8 * 64 * 2  # K and V, 8 KV heads x 64, 2 bytes
    assert b2 - b1 == pytest.approx(12 * per_layer_token * 4 * 1000 / 1e11, rel=1e-9)
    assert rb.decode_steps(4, 2000, 3) == [rb.iteration_time(Batch((), 4, 2000 + 4 * i))
                                          for i in range(3)]  # fmt: skip


def test_a_sliding_model_within_its_window_prices_as_without_sliding_layers():
    # every term of the default presets (activation passes, all-reduces, overheads) on
    # the second pricing path too: inside the window a sliding layer is a full one
    m = get_model("gpt-oss-20b")
    full = dataclasses.replace(m, sliding_window=0, sliding_layers=0)
    gpu = get_gpu("h100-sxm")
    for tp in (1, 2):
        r, f = Roofline(m, gpu, tp=tp), Roofline(full, gpu, tp=tp)
        for batch in (Batch((), 4, 4 * 100), Batch(((50, 20), (30, 0)), 2, 200)):
            assert r.iteration_time(batch) == pytest.approx(f.iteration_time(batch), rel=1e-12)
        assert r.decode_steps(4, 400, 3) == pytest.approx(f.decode_steps(4, 400, 3), rel=1e-12)


def test_a_user_model_gives_sliding_window_and_layers_together():
    base = {"name": "u", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2,
            "head_dim": 16, "intermediate": 128, "vocab": 100, "params": 10**6}  # fmt: skip
    m = get_model({**base, "sliding_window": 64, "sliding_layers": 2})
    assert (m.sliding_window, m.sliding_layers) == (64, 2)
    with pytest.raises(SpecError, match="sliding_window and sliding_layers go together"):
        get_model({**base, "sliding_window": 64})
    with pytest.raises(SpecError, match="sliding_layers=5 exceeds layers=4"):
        get_model({**base, "sliding_window": 64, "sliding_layers": 5})


# -- all-to-all precision, overlap, per-node dispatch -----------------------------------
def _ep2(**kw):
    """TINY (one MoE layer of 4 experts, k = 2) on EP2 of one node, its all-to-all
    on a 1 GB/s link with no latency."""
    return Roofline(TINY, UNIT_GPU, ep=2, dp=2, a2a_intra_bytes_s=1e9, a2a_ranks_per_node=2,
                    a2a_latency_s=0.0, **QUIET, **kw)  # fmt: skip


def test_fp8_dispatch_halves_the_dispatch_bytes_and_keeps_the_combine():
    from twin.perf.moe import dispatch_bytes

    # DeepSeek-V3's 7,168: one byte each plus a float32 scale per 128 (56 of them)
    assert dispatch_bytes(7168, "fp8") == 7168 + 56 * 4
    assert dispatch_bytes(7168, "bf16") == 2 * 7168
    assert dispatch_bytes(7168, "fp8") / dispatch_bytes(7168, "bf16") == pytest.approx(
        0.5156, abs=1e-4
    )
    plain, fp8 = _ep2(), _ep2(moe_dispatch_dtype="fp8")
    tokens = 10
    # each rank sends its 5 tokens' 2 copies, half of them to the other rank
    combine = 5 * 2 * 64 * 2 / 2 / 1e9
    dispatch = 5 * 2 * (64 + 4) / 2 / 1e9  # 64 FP8 bytes and one scale
    assert plain.dispatch_combine_times(tokens) == pytest.approx((combine, combine), rel=1e-12)
    assert fp8.dispatch_combine_times(tokens) == pytest.approx((dispatch, combine), rel=1e-12)
    assert fp8.a2a_time(tokens) == pytest.approx(dispatch + combine, rel=1e-12)
    assert plain.a2a_time(tokens) == pytest.approx(2 * combine, rel=1e-12)
    # the rest of the iteration is the same
    b = Batch((), tokens, 100)
    assert fp8.iteration_time(b) - fp8.a2a_time(tokens) == pytest.approx(
        plain.iteration_time(b) - plain.a2a_time(tokens), rel=1e-12
    )
    # bf16 named is the activations' own: the same time as unset
    assert _ep2(moe_dispatch_dtype="bf16").iteration_time(b) == plain.iteration_time(b)


def _tiny_dense_s(seqs: int, ctx: int) -> float:
    """TINY's dense part on one of 2 data-parallel ranks, by hand: memory bound
    (the non-expert weights and the KV read once per pass)."""
    routed = 4 * 3 * 64 * 32
    kv = 2 * 2 * 16 * 2 / 2  # K and V, 2 KV heads x 16, 2 bytes, over 2 ranks
    return ((10**6 - routed) * 2 + kv * (ctx + seqs)) / 1e11


def _tiny_experts_s(tokens: int) -> float:
    """TINY's routed experts on one of 2 EP ranks (2 experts each), by hand:
    the weights of the experts that get a token (memory bound)."""
    active = 2 * (1 - 0.5**tokens)
    return active * 3 * 64 * 32 * 2 / 1e11


@pytest.mark.parametrize("link", [1e9, 1e6])  # compute bound, communication bound
def test_two_batch_overlap_takes_the_larger_of_compute_and_comm(link):
    r = Roofline(TINY, UNIT_GPU, ep=2, dp=2, a2a_intra_bytes_s=link, a2a_ranks_per_node=2,
                 a2a_latency_s=0.0, moe_overlap="two-batch", **QUIET)  # fmt: skip
    # decode of 4 sequences, contexts summing to 40: two halves of 2 sequences, 20 each
    t = r.iteration_time(Batch((), 4, 40))
    dense, experts = _tiny_dense_s(2, 20), _tiny_experts_s(2)
    assert dense > 2 * 2 * 64 * 32 * 3 / 1e12  # memory bound indeed
    comm_half = 2 * (1 * 2 * 64 * 2 / 2) / link  # dispatch + combine: 1 token x 2 copies a rank
    compute = 2 * (dense + experts)  # one MoE layer: both halves' compute
    comm = 2 * comm_half
    want = max(compute, comm) + 0.5 * min(compute, comm)
    assert t == pytest.approx(want, rel=1e-9)
    plain = Roofline(TINY, UNIT_GPU, ep=2, dp=2, a2a_intra_bytes_s=link, a2a_ranks_per_node=2,
                     a2a_latency_s=0.0, **QUIET).iteration_time(Batch((), 4, 40))  # fmt: skip
    assert plain == pytest.approx(_tiny_dense_s(4, 40) + _tiny_experts_s(4) + 2 * comm_half,
                                  rel=1e-9)  # fmt: skip
    if link == 1e6:  # the all-to-alls dominate: overlap hides the compute under them
        assert t < plain
    else:  # small decode batch, fast link: halving reads the weights twice and loses
        assert t > plain


def test_two_batch_splits_and_prices_consistently():
    from twin.perf.moe import halves

    # tokens split at the midpoint: the chunk it falls in cut, its second piece after the first
    assert halves(Batch(((10, 0), (6, 5)), 3, 30)) == (
        Batch(((8, 0),), 1, 10), Batch(((2, 8), (6, 5)), 2, 20)
    )  # fmt: skip
    assert halves(Batch(((1, 0),))) is None and halves(Batch((), 1, 5)) is None
    # a prefill token and a decode one: one each
    assert halves(Batch(((1, 0),), 1, 7)) == (Batch(((1, 0),), 0, 0), Batch((), 1, 7))
    assert halves(Batch((), 5, 53)) == (Batch((), 2, 21), Batch((), 3, 32))
    r = _ep2(moe_overlap="two-batch")
    assert r.name.endswith(":two-batch")
    # one token runs unsplit, as without overlap
    assert r.iteration_time(Batch((), 1, 5)) == _ep2().iteration_time(Batch((), 1, 5))
    assert r.decode_steps(4, 40, 3) == [r.iteration_time(Batch((), 4, 40 + 4 * i))
                                        for i in range(3)]  # fmt: skip
    assert r.decode_steps(0, 0, 2) == [0.0, 0.0]
    # under the threshold (tokens per attention rank; 2 ranks here) the batch runs unsplit
    gated = _ep2(moe_overlap="two-batch", moe_overlap_min_tokens=3)
    assert gated.iteration_time(Batch((), 5, 50)) == _ep2().iteration_time(Batch((), 5, 50))
    assert gated.iteration_time(Batch((), 6, 60)) == r.iteration_time(Batch((), 6, 60))
    assert r.iteration_time(Batch((), 6, 60)) != _ep2().iteration_time(Batch((), 6, 60))
    # no EP, or a dense model: nothing to hide, the keys change nothing
    for model in (TINY, get_model("llama-3-8b")):
        a = Roofline(model, UNIT_GPU, moe_overlap="two-batch", moe_dispatch_dtype="fp8")
        b = Roofline(model, UNIT_GPU)
        assert a.name == b.name
        assert a.iteration_time(Batch(((300, 0),), 4, 400)) == b.iteration_time(
            Batch(((300, 0),), 4, 400)
        )


def test_dispatch_once_per_node_scales_with_nodes_reached():
    from math import comb

    from twin.perf.moe import remote_nodes

    # 256 experts on 4 nodes, k = 8: a node holds none of a token's experts with
    # probability C(192, 8) / C(256, 8); each of the 3 other nodes is reached otherwise
    p_none = comb(192, 8) / comb(256, 8)
    assert remote_nodes(256, 8, 4, 4) == pytest.approx(3 * (1 - p_none), rel=1e-12)
    # on 16 nodes a token reaches 16 (1 - p) > 4 of them on average: capped at 4
    p16 = comb(240, 8) / comb(256, 8)
    assert remote_nodes(256, 8, 16, 4) == pytest.approx(15 * (1 - p16) * 4 / (16 * (1 - p16)))
    ds = get_model("deepseek-v3")
    kw = dict(ep=32, dp=32, a2a_intra_bytes_s=4e11, a2a_inter_bytes_s=5e10, a2a_ranks_per_node=8,
              a2a_latency_s=0.0)  # fmt: skip
    plain = Roofline(ds, get_gpu("h100"), 1, **kw)  # type: ignore[arg-type]
    dedup = Roofline(ds, get_gpu("h100"), 1, moe_dispatch_nodes=4, **kw)  # type: ignore[arg-type]
    tokens = 3200
    act = 7168 * 2
    # plain: each rank's 100 tokens' 8 copies, 24 / 32 of them over its NIC
    assert plain.all_to_all_time(tokens) == pytest.approx(100 * 8 * act * 24 / 32 / 5e10)
    # once per other node reached over the NIC (the slower side still)
    per_node = 100 * act * 3 * (1 - p_none) / 5e10
    assert per_node > 100 * 8 * act * 7 / 8 / 4e11  # NVLink forwarding is faster
    assert dedup.all_to_all_time(tokens) == pytest.approx(per_node, rel=1e-12)
    assert dedup.name.endswith(":nodes4")


def test_all_to_all_settings_in_a_spec_and_their_errors(capsys):
    from twin.perf.build import build_perf_model

    ds = get_model("deepseek-v3")
    links = {"a2a_intra_bytes_s": 4e11, "a2a_inter_bytes_s": 5e10, "a2a_ranks_per_node": 8}
    spec = {"kind": "roofline", "moe_dispatch_dtype": "fp8", "moe_overlap": "two-batch",
            "moe_dispatch_nodes": 4}  # fmt: skip
    r = build_perf_model(spec, ds, get_gpu("h100"), 1, ep=16, dp=16, a2a=links)
    assert isinstance(r, Roofline)
    assert (r.moe_dispatch_dtype, r.moe_overlap, r.moe_dispatch_nodes) == ("fp8", "two-batch", 4)
    for bad, msg in (
        ("moe_overlap: three", "perf.moe_overlap: 'three'; expected one of none, two-batch"),
        ("moe_dispatch_dtype: fp4", "perf.moe_dispatch_dtype: 'fp4'; expected one of bf16, fp8"),
        ("moe_dispatch_nodes: 0", "perf.moe_dispatch_nodes: 0"),
        ("moe_overlap_min_tokens: -1", "perf.moe_overlap_min_tokens: -1"),
    ):
        bad = "{kind: roofline, " + bad + "}"
        assert main(["run", "quickstart", "-q", "--set", f"perf={bad}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("twin: error: ") and msg in err[0], err
    with pytest.raises(SpecError, match="moe_overlap='x'"):
        Roofline(TINY, UNIT_GPU, moe_overlap="x")
    with pytest.raises(SpecError, match="moe_dispatch_nodes=0"):
        Roofline(TINY, UNIT_GPU, moe_dispatch_nodes=0)


def test_a_two_batch_threshold_without_two_batch_overlap_is_refused(capsys):
    from twin.perf.build import build_perf_model

    bad = "{kind: roofline, moe_overlap_min_tokens: 32}"
    assert main(["run", "quickstart", "-q", "--set", f"perf={bad}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("twin: error: "), err
    assert "perf.moe_overlap_min_tokens: 32 acts only with moe_overlap: two-batch" in err[0]
    spec = {"kind": "roofline", "moe_overlap": "none", "moe_overlap_min_tokens": 0}
    with pytest.raises(SpecError, match="perf.moe_overlap_min_tokens: 0 acts only with"):
        build_perf_model(spec, TINY, UNIT_GPU, 1)
    with pytest.raises(SpecError, match="moe_overlap_min_tokens=32 acts only with"):
        Roofline(TINY, UNIT_GPU, moe_overlap_min_tokens=32)
    # with two-batch overlap it is taken, on a dense model too, where it changes nothing
    llama = get_model("llama-3-8b")
    keys = {"kind": "roofline", "moe_overlap": "two-batch", "moe_overlap_min_tokens": 32,
            "moe_dispatch_dtype": "fp8", "moe_dispatch_nodes": 4}  # fmt: skip
    a = build_perf_model(keys, llama, UNIT_GPU, 1)
    b = build_perf_model(None, llama, UNIT_GPU, 1)
    batch = Batch(((300, 0),), 4, 400)
    assert a.name == b.name and a.iteration_time(batch) == b.iteration_time(batch)


def test_a_roofline_reports_its_all_to_all_terms_as_used():
    # what a proposer's Roofline copies from its target (twin.serving.speculative)
    from twin.perf.gpus import get_gpu

    gpu = get_gpu("h100")
    names = ("a2a_intra_bytes_s", "a2a_inter_bytes_s", "a2a_ranks_per_node", "a2a_latency_s")
    dense = Roofline(get_model("llama-3.1-8b"), gpu)
    assert [getattr(dense, n) for n in names] == [None] * 4
    ep = Roofline(get_model("deepseek-v3"), gpu, ep=16, dp=16, a2a_ranks_per_node=8,
                  a2a_inter_bytes_s=50e9)  # fmt: skip
    assert [getattr(ep, n) for n in names] == [gpu.nvlink_bytes_s, 50e9, 8, ep.hop_latency_s]
