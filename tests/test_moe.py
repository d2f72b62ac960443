"""Mixture-of-experts models and expert parallelism: the catalog's shapes, the
MoE part of the Roofline, the all-to-all on the topology, the layouts."""

from __future__ import annotations

import pytest

import schedulers.colocated  # noqa: F401 - registers the built-ins when not installed
from twin.cli import main
from twin.errors import SpecError
from twin.net.topology import all_to_all_links, load_topology
from twin.perf.gpus import GPUSpec, get_gpu
from twin.perf.iteration import Batch
from twin.perf.llm import MODELS, ModelSpec, get_model, kv_facts
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
             no_overlap=0.0, throttle=0.0)  # fmt: skip
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
    spec = resolve_spec(data, "plan.yaml", Path.cwd())
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


def test_deepseek_published_figures_within_forty_percent():
    """DeepSeek's day-6 overview: 73.7k input and 14.8k output tokens/s per H800
    node; the twin is under both (BF16 peaks, no overlap of the all-to-alls)."""
    from twin.studies.moe_fidelity import deepseek_decode, deepseek_prefill, report

    p, d = deepseek_prefill(), deepseek_decode()
    assert 0.6 < p["input_tokens_s_node"] / 73.7e3 < 1.0
    assert 0.6 < d["output_tokens_s_node"] / 14.8e3 < 1.0
    assert d["step_s"] <= 0.05 and d["batch_per_rank"] > 8
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
    return resolve_spec(data, "plan.yaml", Path.cwd())


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
                          max_decode_requests=400)  # fmt: skip
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
