"""Real engine limits: the model's context, and the parallel shapes an engine runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import schedulers.colocated  # registers the built-ins when not installed
import schedulers.disagg  # noqa: F401
from twin.cli import main
from twin.errors import SpecError
from twin.perf.llm import MODELS, get_model
from twin.request import Request
from twin.sim.simulation import Simulation, truncate
from twin.sim.spec import resolve_spec

_WORKLOAD = {
    "lengths": "azure-conv",
    "arrival": {"process": "poisson", "rate": 1},
    "max_requests": 1,
}


def _spec(**keys):
    return resolve_spec(
        {"model": "llama-2-7b", "workload": _WORKLOAD, **keys}, "lim.yaml", Path.cwd()
    )


def _run(spec, reqs):
    rows: list[dict] = []
    result = Simulation(spec, requests=reqs, on_row=rows.append).run()
    return result.summary, sorted(rows, key=lambda r: r["id"])


# -- context length ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "context"),
    [
        ("llama-2-7b", 4096),
        ("llama-2-13b", 4096),
        ("llama-2-70b", 4096),
        ("llama-3.1-8b", 131072),
        ("llama-3.1-70b", 131072),
        ("opt-13b", 2048),
        ("opt-66b", 2048),
        ("opt-175b", 2048),
        ("bloom-176b", 2048),
        ("qwen3-8b", 40960),
    ],
)
def test_catalog_models_carry_their_context(name, context):
    assert MODELS[name].max_context == context


def test_an_inline_model_may_give_a_context():
    shapes = {
        "name": "m",
        "layers": 2,
        "hidden": 64,
        "heads": 4,
        "kv_heads": 4,
        "head_dim": 16,
        "intermediate": 128,
        "vocab": 100,
        "params": 10**6,
    }
    assert get_model(shapes).max_context is None
    assert get_model({**shapes, "max_context": 512}).max_context == 512
    with pytest.raises(SpecError, match="max_context"):
        get_model({**shapes, "max_context": 0}, where="s.yaml: model")


def test_a_50000_token_prompt_on_llama_2_7b_is_rejected_for_its_context():
    summary, rows = _run(_spec(), [Request(0, 0.0, 50_000, 100), Request(1, 0.1, 100, 10)])
    assert summary["rejected_by_reason"] == {"context_length": 1}
    assert summary["completed"] == 1 and summary["requests"] == 2 and summary["truncated"] == 0
    assert rows[0]["status"] == "rejected" and rows[0]["reason"] == "context_length"


def test_a_request_exactly_at_the_context_is_served():
    summary, _ = _run(_spec(), [Request(0, 0.0, 4000, 96), Request(1, 0.0, 4000, 97)])
    assert summary["completed"] == 1 and summary["rejected_by_reason"] == {"context_length": 1}


def test_truncate_serves_the_prompt_s_last_tokens_within_the_context():
    spec = _spec(engine={"oversized": "truncate"})
    summary, rows = _run(
        spec, [Request(0, 0.0, 50_000, 100), Request(1, 0.1, 4000, 500), Request(2, 0.2, 100, 10)]
    )
    assert summary["completed"] == 3 and summary["rejected"] == 0
    assert summary["truncated"] == 2
    assert [(r["prompt_tokens"], r["output_tokens"]) for r in rows] == [
        (4095, 1),
        (4000, 96),
        (100, 10),
    ]


def test_truncate_keeps_prefix_hashes_only_when_the_prompt_is_whole():
    req = Request(0, 0.0, 3000, 2000, (1, 2, 3), 512)
    assert truncate(req, 4096) == Request(0, 0.0, 3000, 1096, (1, 2, 3), 512)
    assert truncate(req, 2048) == Request(0, 0.0, 2047, 1, (), 0)


def test_max_model_len_lowers_the_limit():
    spec = _spec(engine={"max_model_len": 1024})
    assert spec.max_model_len == 1024 and _spec().max_model_len == 4096
    summary, _ = _run(spec, [Request(0, 0.0, 1000, 100), Request(1, 0.0, 900, 100)])
    assert summary["completed"] == 1 and summary["rejected_by_reason"] == {"context_length": 1}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "0 must be a positive integer"),
        ("long", "'long' must be a positive integer"),
        (True, "True must be a positive integer"),
        (1, "1 must be at least 2"),
        (8192, "8192 exceeds llama-2-7b's context of 4,096 tokens"),
    ],
)
def test_bad_max_model_len_values_name_file_and_key(tmp_path, capsys, value, message):
    import yaml

    path = tmp_path / "lim.yaml"
    path.write_text(
        yaml.safe_dump(
            {"model": "llama-2-7b", "workload": _WORKLOAD, "engine": {"max_model_len": value}}
        )
    )
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"twin: error: {path}: engine.max_model_len: {message}"), err


def test_a_model_without_a_context_has_no_limit():
    shapes = {
        "name": "m",
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "kv_heads": 32,
        "head_dim": 128,
        "intermediate": 11008,
        "vocab": 32000,
        "params": 6_738_415_616,
    }
    spec = _spec(model=shapes)
    assert spec.max_model_len is None
    summary, _ = _run(spec, [Request(0, 0.0, 50_000, 10)])
    assert summary["completed"] == 1


# -- parallelism ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "tp", "problem"),
    [
        ("llama-2-13b", 5, "5 does not divide llama-2-13b's FFN width 13,824"),
        ("llama-2-13b", 3, "3 does not divide llama-2-13b's 40 attention heads"),
        ("llama-2-13b", 8, None),
        ("llama-2-70b", 16, None),
        ("llama-3.1-8b", 32, None),
        ("opt-13b", 5, None),
        ("opt-66b", 3, None),
        ("opt-66b", 8, None),
    ],
)
def test_tp_must_shard_heads_and_ffn_width(model, tp, problem):
    assert MODELS[model].tp_problem(tp) == problem


def test_tp_must_divide_or_be_a_multiple_of_the_kv_heads():
    m = get_model(
        {
            "name": "gqa",
            "layers": 2,
            "hidden": 768,
            "heads": 24,
            "kv_heads": 4,
            "head_dim": 32,
            "intermediate": 1536,
            "vocab": 100,
            "params": 10**6,
        }
    )
    assert m.tp_problem(2) is None and m.tp_problem(8) is None
    assert m.tp_problem(6) == "6 neither divides nor is a multiple of gqa's 4 KV heads"


def test_tp_errors_name_file_and_key():
    with pytest.raises(
        SpecError,
        match=r"^lim.yaml: cluster.tp: 5 does not divide llama-2-13b's"
        r" FFN width 13,824$",
    ):
        _spec(model="llama-2-13b", cluster={"tp": 5})
    with pytest.raises(
        SpecError,
        match=r"^lim.yaml: cluster.tp: 3 does not divide llama-2-13b's"
        r" 40 attention heads$",
    ):
        _spec(model="llama-2-13b", cluster={"tp": 3})
    with pytest.raises(SpecError, match=r"^lim.yaml: cluster.decode.tp: 3 does not divide"):
        _spec(
            model="llama-2-13b",
            cluster={
                "topology": "dgx-h100-ib400",
                "nodes": 1,
                "prefill": {"instances": 1, "tp": 4},
                "decode": {"instances": 1, "tp": 3},
            },
        )


def test_tp_wider_than_a_node_is_refused_not_priced_on_nvlink():
    with pytest.raises(SpecError, match=r"cluster.tp: 16 exceeds a node's 8 GPUs"):
        _spec(model="llama-2-70b", cluster={"tp": 16})
    assert _spec(model="llama-2-70b", cluster={"tp": 16, "gpus_per_node": 16}).tp == 16
    with pytest.raises(SpecError, match="needs 16 GPUs in one node"):
        spec = _spec(
            model="llama-2-70b",
            cluster={
                "topology": "dgx-h100-ib400",
                "nodes": 2,
                "prefill": {"instances": 1, "tp": 16},
                "decode": 1,
                "tp": 8,
            },
        )
        Simulation(spec, requests=[])


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    m = MODELS["llama-3.1-8b"]  # 8 KV heads
    assert [m.kv_heads_per_gpu(tp) for tp in (1, 2, 8, 16, 32)] == [8, 4, 1, 1, 1]
    assert m.kv_bytes_per_token_tp(8) == m.kv_bytes_per_token()
    assert m.kv_bytes_per_token_tp(16) == 2 * m.kv_bytes_per_token()
    assert m.kv_bytes_per_token_tp(32) == 4 * m.kv_bytes_per_token()


def test_replicated_kv_heads_shrink_the_kv_capacity():
    from twin.serving.kvcache import kv_capacity_blocks

    def blocks(tp):
        spec = _spec(model="llama-3.1-8b", cluster={"tp": tp, "gpus_per_node": 16})
        return Simulation(spec, requests=[]).engines[0].kv.total, spec

    got, spec = blocks(16)
    m = spec.model
    whole = kv_capacity_blocks(
        gpu_memory_bytes=spec.gpu.memory_bytes,
        memory_utilization=0.9,
        weight_bytes=m.weight_bytes,
        activation_reserve_bytes=2 * 2**30,
        kv_bytes_per_token=m.kv_bytes_per_token(),
        tp=16,
        pp=1,
        block_size=16,
    )
    assert got == whole // 2  # each GPU holds one of the 8 KV heads twice over: half the tokens
    assert blocks(8)[0] < got  # still more than at TP8, whose weights take more per GPU


# -- the planner ----------------------------------------------------------------------
def _planner(model, topology, nodes=1, perf=None, max_gpus=8):
    from twin.studies.planner import _Planner

    data = {
        "model": model,
        "workload": _WORKLOAD,
        "cluster": {"topology": topology, "nodes": nodes, "prefill": 1, "decode": 1},
    }
    if perf is not None:
        data["perf"] = perf
    spec = resolve_spec(data, "plan.yaml", Path.cwd())
    return _Planner(spec, [Request(0, 0.0, 100, 10)], max_gpus, 1, 10)


def test_the_planner_enumerates_only_runnable_tp():
    configs = _planner("llama-2-13b", "dgx-h100-ib400").configs()
    assert {tp for tp, _, _ in configs} == {1, 2, 4, 8}  # not 5: 13,824 % 5 != 0


def test_the_planner_skips_a_tp_missing_from_the_fitted_table(shared_data):
    fit = shared_data / "profiles" / "distserve" / "profiler-a100-80g.distserve.json"
    configs = _planner(
        "opt-13b", "dgx-a100-ib200", perf={"kind": "distserve", "path": str(fit)}
    ).configs()
    notes = {(tp, pp): note for tp, pp, note in configs}
    assert notes[(8, 1)] == "no entry in the perf model's table"  # the fit has TP 1, 2, 4
    assert notes[(4, 1)] == "" and notes[(1, 1)] == ""


_README_CASE = """\
# DistServe's README case: OPT-13B on one node of 4 A100s, its fitted latency model
model: opt-13b
cluster:
  topology:
    name: a100x4
    node: {{gpu: a100-80gb, gpus: 4, intra: {{kind: nvswitch, bandwidth: 300 GB/s}}}}
    nodes: 1
  prefill: 1
  decode: 1
perf: {{kind: distserve, path: {fit}}}
workload:
  lengths: {{prompt: {{dist: fixed, value: 512}}, output: {{dist: fixed, value: 64}}}}
  arrival: {{process: poisson, rate: 2}}
  max_requests: 40
slo: {{ttft: 1 s, tpot: 100 ms}}
"""


def test_twin_plan_plans_opt_13b_on_one_node_of_four_a100s(
    shared_data, tmp_path, capsys, monkeypatch
):
    import functools

    import yaml

    from twin.studies import planner

    # the real planner over a shorter search (fewer bisection steps, shorter decode probes)
    small = dict(iterations=4, max_decode_requests=400)
    monkeypatch.setattr(
        planner, "plan_distserve", functools.partial(planner.plan_distserve, **small)
    )
    fit = shared_data / "profiles" / "distserve" / "profiler-a100-80g.distserve.json"
    path = tmp_path / "distserve-readme.yaml"
    path.write_text(_README_CASE.format(fit=fit))
    # With 40 requests a 4-GPU prefill has the most goodput per GPU: with any
    # decode instance beside it, more than the node's 4 GPUs.
    assert main(["plan", str(path), "--sample", "40", "--replicates", "1"]) == 0
    out = capsys.readouterr().out
    plan = yaml.safe_load(out.split("# paste into the spec:", 1)[1])["cluster"]
    used = sum(plan[r]["instances"] * plan[r]["tp"] * plan[r]["pp"] for r in ("prefill", "decode"))
    assert 0 < used <= 4 and "of the pairs that fit" in out
    assert re.search(r"fit: a prefill (TP4 PP1|TP2 PP2|TP1 PP4) and a decode", out)


def test_when_the_best_pair_does_not_fit_the_planner_takes_the_best_that_does():
    from twin.studies.planner import Candidate, _fill, _fitting_pair

    p4, p2 = Candidate("prefill", 4, 1, 40.0), Candidate("prefill", 2, 1, 16.0)
    d4, d1 = Candidate("decode", 4, 1, 30.0), Candidate("decode", 1, 1, 6.0)
    assert _fill(p4, d4, 1, 4) == (0, 0, 0.0)  # TP4 + TP4 is 8 GPUs: DistServe's README case
    assert _fitting_pair([p4, p2], [d4, d1], 1, 4) == (p2, d1)  # 1 x TP2 + 2 x TP1: 12 req/s
    assert _fitting_pair([p4], [d4], 1, 4) is None
