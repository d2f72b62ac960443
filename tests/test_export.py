"""Deployment export: the deployment twin plan / twin provision chose, as a
Dynamo DynamoGraphDeployment and as llm-d ModelService values, headed by
what the twin predicted for it."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from twin.cli import main
from twin.studies.export import (
    KV_TRANSFER,
    dynamo_yaml,
    from_plan,
    from_provision,
    llm_d_yaml,
)

PLAN_KW = dict(max_gpus_per_instance=2, max_decode_requests=100, iterations=3, sample_size=30)


@pytest.fixture(scope="module")
def planned():
    """A plan of the tiny split spec, and its deployment."""
    from twin.sim.spec import resolve_spec
    from twin.studies.planner import plan_distserve

    data = {
        "name": "Tiny Plan",
        "model": "llama-3.1-8b",
        "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "prefill": 1, "decode": 1},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 40},
        "engine": {"max_num_seqs": 16},
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }  # fmt: skip
    spec = resolve_spec(data, "plan.yaml", Path.cwd())
    plan = plan_distserve(spec, replicates=1, **PLAN_KW)
    return spec, plan, from_plan(spec, plan)


def _header(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("# twin: ")]
    assert len(lines) == 1
    return json.loads(lines[0][len("# twin: ") :])


def _worker(doc: dict, kind: str) -> dict:
    (c,) = [c for c in doc["spec"]["components"] if c["type"] == kind]
    return c


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_the_dynamo_graph_has_the_plans_counts_and_parallelism(planned):
    spec, plan, dep = planned
    text = dynamo_yaml(dep)
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "nvidia.com/v1beta1" and doc["kind"] == "DynamoGraphDeployment"
    assert doc["metadata"]["name"] == "tiny-plan"
    assert [c["type"] for c in doc["spec"]["components"]] == ["frontend", "prefill", "decode"]
    for kind, n, cand in (
        ("prefill", plan.n_prefill, plan.prefill), ("decode", plan.n_decode, plan.decode),
    ):  # fmt: skip
        w = _worker(doc, kind)
        assert w["replicas"] == n
        (ctr,) = w["podTemplate"]["spec"]["containers"]
        args = ctr["args"]
        assert ctr["command"] == ["python3", "-m", "dynamo.vllm"]
        assert _flag(args, "--disaggregation-mode") == kind
        assert _flag(args, "--model") == "meta-llama/Llama-3.1-8B"
        assert int(_flag(args, "--tensor-parallel-size")) == cand.tp
        assert int(_flag(args, "--pipeline-parallel-size") or 1) == cand.pp
        assert json.loads(_flag(args, "--kv-transfer-config")) == KV_TRANSFER
        assert ctr["resources"]["limits"]["nvidia.com/gpu"] == str(cand.tp * cand.pp)


def test_the_llm_d_values_have_the_plans_counts_and_parallelism(planned):
    _, plan, dep = planned
    doc = yaml.safe_load(llm_d_yaml(dep))
    assert doc["modelArtifacts"]["name"] == "meta-llama/Llama-3.1-8B"
    for kind, n, cand in (
        ("prefill", plan.n_prefill, plan.prefill), ("decode", plan.n_decode, plan.decode),
    ):  # fmt: skip
        role = doc[kind]
        assert role["create"] is True and role["replicas"] == n
        assert role["parallelism"]["tensor"] == cand.tp
        (ctr,) = role["containers"]
        assert int(_flag(ctr["args"], "--pipeline-parallel-size") or 1) == cand.pp
        assert json.loads(_flag(ctr["args"], "--kv-transfer-config"))["kv_connector"] == (
            "NixlConnector"
        )
        assert ctr["resources"]["requests"]["nvidia.com/gpu"] == str(cand.tp * cand.pp)


def test_the_header_holds_the_plans_figures(planned):
    from twin.sim.simulation import Simulation
    from twin.sim.spec import resolve_spec
    from twin.studies.provision import unit_rate
    from twin.studies.samples import replicate_samples

    spec, plan, dep = planned
    for text in (dynamo_yaml(dep), llm_d_yaml(dep)):
        h = _header(text)
        assert h["source"] == "twin plan" and h["spec_sha256"] == spec.sha256
        assert h["goodput_rps"] == plan.capacity_mean == plan.capacity_rps
        assert h["rate_rps"] == plan.capacity_rps  # no target rate: at the goodput
        assert h["prefill"] == {"replicas": plan.n_prefill, "tp": plan.prefill.tp,
                                "pp": plan.prefill.pp}  # fmt: skip
        assert h["decode"]["replicas"] == plan.n_decode
        assert f"Spec sha256 {spec.sha256}." in text
        assert f"goodput {plan.capacity_rps:.3f} req/s" in text
    # the percentiles are those of the planned deployment itself at that rate,
    # on the plan's sample: the spec with the plan pasted in, as a person would
    data = copy.deepcopy(dict(spec.resolved))
    data.update(plan.to_spec_overrides())
    run = resolve_spec(data, "pasted.yaml", Path.cwd())
    unit = unit_rate(spec, replicate_samples(spec, plan.sample_size, 1)[0])
    rate = plan.capacity_rps
    reqs = [dataclasses.replace(r, arrival_s=r.arrival_s / rate) for r in unit]
    s = Simulation(run, requests=reqs).run().summary
    assert h["requests"] == len(unit) == plan.sample_size
    assert (h["ttft_p90_s"], h["ttft_p99_s"]) == (s["ttft_s"]["p90"], s["ttft_s"]["p99"])
    assert (h["tpot_p90_s"], h["tpot_p99_s"]) == (s["tpot_s"]["p90"], s["tpot_s"]["p99"])
    assert h["slo_attainment"] == s["slo_attainment"]
    assert (
        f"TTFT p90 {s['ttft_s']['p90'] * 1e3:.1f} ms, p99 {s['ttft_s']['p99'] * 1e3:.1f} ms" in text
    )


def test_an_export_is_deterministic(planned):
    spec, plan, dep = planned
    again = from_plan(spec, plan)
    assert dynamo_yaml(again) == dynamo_yaml(dep) and llm_d_yaml(again) == llm_d_yaml(dep)


PROVISION_SPEC = {
    "name": "split",
    "model": "llama-3.1-8b",
    "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "tp": 4, "prefill": 1, "decode": 1},
    "scheduler": "splitwise",
    "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 5},
                 "max_requests": 1000},
    "slo": {"ttft": "500 ms", "tpot": "40 ms"},
}  # fmt: skip


def test_twin_provision_exports_its_best_split(tmp_path, capsys, monkeypatch):
    """One export to a file, the other to stdout (``-``), the text then to stderr."""
    from twin.studies.provision import provision

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "split.yaml"
    path.write_text(yaml.safe_dump(PROVISION_SPEC))
    llmd = tmp_path / "values.yaml"
    argv = ["provision", str(path), "--power", "6 kW", "--sample", "40", "--replicates", "1"]
    assert main([*argv, "--export-dynamo", "-", "--export-llm-d", str(llmd)]) == 0
    captured = capsys.readouterr()
    dynamo_text = captured.out
    assert f"written: {llmd}" in captured.err and "written:" not in dynamo_text
    assert "best" in captured.err and not (tmp_path / "-").exists()
    prov = provision(PROVISION_SPEC, str(path), tmp_path, power_w=6000, sample=40, replicates=1)
    best = prov.best
    doc = yaml.safe_load(dynamo_text)
    assert _worker(doc, "prefill")["replicas"] == best.prefill
    assert _worker(doc, "decode")["replicas"] == best.decode
    args = _worker(doc, "decode")["podTemplate"]["spec"]["containers"][0]["args"]
    assert _flag(args, "--tensor-parallel-size") == "4"
    values = yaml.safe_load(llmd.read_text())
    assert (values["prefill"]["replicas"], values["decode"]["replicas"]) == (
        best.prefill, best.decode,
    )  # fmt: skip
    assert values["decode"]["parallelism"]["tensor"] == 4
    for text in (dynamo_text, llmd.read_text()):
        h = _header(text)
        assert h["source"] == "twin provision"
        assert h["goodput_rps"] == h["rate_rps"] == best.goodput_rps
        assert h["goodput_ci95"] is None  # one sample: no interval
    # the same through the API
    dep = from_provision(PROVISION_SPEC, str(path), tmp_path, prov)
    assert dynamo_yaml(dep) == dynamo_text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "disagg", "--convergence", "250,500", "--export-dynamo", "x.yaml"],
         "twin plan: --export-*: exports one deployment; not with --convergence"),
        (["provision", "disagg", "--export-llm-d", "/nonexistent/dir/v.yaml"],
         "--export-llm-d: '/nonexistent/dir/v.yaml': no folder '/nonexistent/dir'"),
        (["plan", "disagg", "--export-dynamo", "-", "--json", "-"],
         "twin plan: --json and --export-dynamo are both '-': one output may go to stdout"),
    ],
)  # fmt: skip
def test_bad_exports_fail_before_the_search(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def _wide_ep(**kw):
    """A DeepSeek-V3 deployment of 2 prefill instances of EP16 (two 8-GPU nodes
    each) and a single-node EP8 decode instance, as a plan of it would give."""
    from twin.studies.export import Deployment, Role

    base = dict(
        name="wide-ep", model="deepseek-v3", hf_model="deepseek-ai/DeepSeek-V3", gpu="h100-sxm",
        prefill=Role(2, 1, 1, ep=16, dp=16), decode=Role(1, 2, 1, ep=8, dp=4),
        source="twin plan", spec_sha256="0" * 64, slo={"ttft_s": 1.0, "tpot_s": 0.05,
        "target": 0.9}, goodput_rps=1.0, goodput_ci95=float("nan"), rate_rps=1.0,
        requests=10, predicted={"ttft_p90_s": 0.5, "ttft_p99_s": 0.6, "tpot_p90_s": 0.02,
        "tpot_p99_s": 0.03, "slo_attainment": 1.0}, gpus_per_node=8,
    )  # fmt: skip
    return Deployment(**{**base, **kw})


def test_a_wide_ep_layout_exports_its_expert_and_data_parallelism():
    dep = _wide_ep()
    doc = yaml.safe_load(dynamo_yaml(dep))
    pre, dec = _worker(doc, "prefill"), _worker(doc, "decode")
    # prefill: 16 GPUs, 2 nodes of 8, DP16 (8 ranks a node), TP1
    assert pre["multinode"] == {"nodeCount": 2} and pre["replicas"] == 2
    (ctr,) = pre["podTemplate"]["spec"]["containers"]
    args = ctr["args"]
    assert "--enable-expert-parallel" in args
    assert _flag(args, "--data-parallel-size") == "16"
    assert _flag(args, "--data-parallel-size-local") == "8"
    assert _flag(args, "--tensor-parallel-size") == "1"
    assert ctr["resources"]["limits"]["nvidia.com/gpu"] == "8"  # per node
    # decode: 8 GPUs on one node, DP4 x TP2
    assert "multinode" not in dec
    (ctr,) = dec["podTemplate"]["spec"]["containers"]
    assert _flag(ctr["args"], "--data-parallel-size") == "4"
    assert "--data-parallel-size-local" not in ctr["args"]
    assert ctr["resources"]["limits"]["nvidia.com/gpu"] == "8"
    values = yaml.safe_load(llm_d_yaml(dep))
    assert values["multinode"] is True
    assert values["prefill"]["parallelism"] == {"tensor": 1, "data": 16, "dataLocal": 8,
                                                "workers": 2}  # fmt: skip
    assert values["decode"]["parallelism"] == {"tensor": 2, "data": 4, "dataLocal": 4,
                                               "workers": 1}  # fmt: skip
    (ctr,) = values["prefill"]["containers"]
    assert "--enable-expert-parallel" in ctr["args"]
    assert ctr["resources"]["limits"]["nvidia.com/gpu"] == "8"  # tensor x dataLocal
    h = _header(llm_d_yaml(dep))
    assert h["prefill"] == {"replicas": 2, "tp": 1, "pp": 1, "ep": 16, "dp": 16}
    assert "2 prefill x EP16 (DP16 x TP1 PP1)" in llm_d_yaml(dep)


def test_a_dense_layout_exports_no_expert_parallel_keys(planned):
    _, _, dep = planned
    text = dynamo_yaml(dep) + llm_d_yaml(dep)
    assert "expert-parallel" not in text and "data-parallel" not in text
    assert "multinode: false" in llm_d_yaml(dep) and "nodeCount" not in text


def test_the_export_takes_ep_and_dp_from_the_planned_layout():
    from twin.sim.spec import InstanceGroup
    from twin.studies.export import Role, _role
    from twin.studies.planner import Candidate

    assert _role(3, Candidate("decode", 2, 1, 1.0, ep=16)) == Role(3, 2, 1, ep=16, dp=8)
    assert _role(1, InstanceGroup("prefill", 1, 1, 1, None, 32, 32)) == Role(1, 1, 1, 32, 32)
    assert _role(2, Candidate("decode", 4, 1, 1.0)) == Role(2, 4, 1)


def test_an_instance_that_splits_unevenly_over_nodes_is_refused():
    from twin.errors import TwinError
    from twin.studies.export import Role

    dep = _wide_ep(decode=Role(1, 1, 1, ep=12, dp=12))
    with pytest.raises(TwinError, match="12 GPUs .* nodes of 8"):
        dynamo_yaml(dep)


def test_a_failed_plan_leaves_no_export_file(tmp_path, capsys):
    """The export files are written once the plan exists, never opened before."""
    spec = yaml.safe_load((Path(__file__).parents[1] / "experiments" / "disagg.yaml").read_text())
    del spec["slo"]  # the plan stops: goodput needs an SLO
    path = tmp_path / "noslo.yaml"
    path.write_text(yaml.safe_dump(spec))
    dyn, llmd = tmp_path / "dynamo.yaml", tmp_path / "values.yaml"
    argv = ["plan", str(path), "--export-dynamo", str(dyn), "--export-llm-d", str(llmd)]
    assert main(argv) == 2
    assert "slo: no ttft or tpot given" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["noslo.yaml"]


SCHEMAS = Path(__file__).parent / "fixtures" / "export_schemas"


@pytest.mark.parametrize(
    ("render", "schema"),
    [
        (dynamo_yaml, "dynamo-graph-deployment-v1beta1.schema.json"),
        (llm_d_yaml, "llm-d-modelservice-values.schema.json"),
    ],
)
def test_both_exports_validate_against_the_published_schemas(planned, render, schema):
    jsonschema = pytest.importorskip("jsonschema")
    doc = json.loads((SCHEMAS / schema).read_text())
    for dep in (planned[2], _wide_ep()):
        jsonschema.validate(yaml.safe_load(render(dep)), doc)
    # the schemas can fail: a parallelism key llm-d does not know; in Dynamo's CRD a node
    # count of 1, a component type it does not list, a v1alpha1 key v1beta1 would prune
    breaks = (
        [lambda d: d["decode"]["parallelism"].update(pipeline=2)]
        if render is llm_d_yaml
        else [
            lambda d: _worker(d, "decode").update(multinode={"nodeCount": 1}),
            lambda d: _worker(d, "decode").update(type="backend"),
            lambda d: _worker(d, "prefill").update(envFromSecret="hf-token-secret"),
        ]
    )
    for brk in breaks:
        bad = yaml.safe_load(render(planned[2]))
        brk(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, doc)


def test_the_workers_carry_the_engine_flags_the_twin_simulated(planned):
    spec, _, dep = planned
    e = spec.engine
    want = {
        "--max-num-seqs": "16", "--block-size": str(e.block_size),
        "--gpu-memory-utilization": str(e.gpu_memory_utilization),
        "--max-model-len": str(spec.max_model_len),
    }  # fmt: skip
    doc, values = yaml.safe_load(dynamo_yaml(dep)), yaml.safe_load(llm_d_yaml(dep))
    arg_lists = [_worker(doc, k)["podTemplate"]["spec"]["containers"][0]["args"]
                 for k in ("prefill", "decode")]  # fmt: skip
    arg_lists += [values[k]["containers"][0]["args"] for k in ("prefill", "decode")]
    for args in arg_lists:
        assert {f: _flag(args, f) for f in want} == want
        assert "--no-enable-chunked-prefill" in args  # the spec does not chunk
    h = _header(dynamo_yaml(dep))
    assert h["engine"]["--max-num-seqs"] == 16
    assert "# vLLM engine arguments as simulated: --max-num-seqs 16" in dynamo_yaml(dep)


def test_a_chunked_engine_exports_its_token_budget_and_a_small_one_a_caveat():
    from twin.sim.spec import resolve_spec
    from twin.studies.export import engine_args

    base = {"model": "llama-3.1-8b", "cluster": {"instances": 1, "tp": 1},
            "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                         "max_requests": 5}}  # fmt: skip
    chunked = resolve_spec({**base, "engine": {"chunked_prefill": True}}, "c.yaml", Path.cwd())
    args, notes = engine_args(chunked)
    assert args["--enable-chunked-prefill"] is True and args["--max-num-batched-tokens"] == 2048
    assert notes == []
    whole = resolve_spec(base, "w.yaml", Path.cwd())  # 8,192 tokens against a 131,072 context
    args, notes = engine_args(whole)
    assert "--max-num-batched-tokens" not in args and args["--max-model-len"] == 131072
    assert notes and "vLLM without chunked prefill needs a budget >= max_model_len" in notes[0]


def test_the_header_lists_the_caveats_that_shaped_the_figures(planned):
    _, plan, dep = planned
    caveats = _header(llm_d_yaml(dep))["caveats"]
    assert list(plan.warnings) == caveats[: len(plan.warnings)]
    assert plan.warnings  # a sample of 30 requests warns
    text = dynamo_yaml(dep)
    assert "# Caveats (what shaped these figures):" in text
    assert all(f"#   - {c}" in text for c in caveats)
    line = "3 of the 30 requests were rejected (context_length 3)"
    rejected = dataclasses.replace(dep, caveats=(line,))
    assert "#   - 3 of the 30 requests were rejected" in llm_d_yaml(rejected)
