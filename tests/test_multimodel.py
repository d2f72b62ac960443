"""Several models on one cluster (``models:``): each request names its model,
each model's instances run its own perf model, KV and policy, and a model
alone on its instances runs exactly as it would on a cluster of its own."""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import schedulers.disagg  # noqa: F401 - registers disagg
from twin.cli import main
from twin.errors import SpecError
from twin.perf.llm import get_model
from twin.request import Request
from twin.scheduler import Plan, RemoveInstance, Route, register
from twin.serving.observer import Observer
from twin.sim.simulation import Simulation
from twin.sim.spec import resolve_spec, spec_schema

LENGTHS = {"prompt": {"dist": "fixed", "value": 300}, "output": {"dist": "fixed", "value": 4}}
TWO: dict[str, Any] = {
    "name": "two",
    "models": {
        "chat": {"model": "llama-3.1-8b", "share": 0.6, "cluster": {"instances": 1}},
        "small": {
            "model": "llama-3.2-1b",
            "share": 0.4,
            "cluster": {"instances": 1},
            "slo": {"ttft": "2 s"},
        },
    },  # fmt: skip
    "workload": {
        "lengths": LENGTHS,
        "arrival": {"process": "poisson", "rate": 20},
        "max_requests": 40,
    },  # fmt: skip
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}


def _spec(data: dict[str, Any]) -> Any:
    return resolve_spec(copy.deepcopy(data), "two.yaml", Path.cwd())


def _alone(model: str, entry: dict[str, Any]) -> Any:
    """The spec of one of TWO's models on a cluster of its own."""
    data = {k: v for k, v in TWO.items() if k != "models"}
    data["model"] = entry["model"]
    data["cluster"] = entry["cluster"]
    if "slo" in entry:
        data["slo"] = {**TWO["slo"], **entry["slo"]}
    return _spec(data)


def _by_instance(log: list[tuple]) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for e in log:
        out.setdefault(e[2], []).append(e)
    return out


def test_the_event_trace_of_two_models_is_each_model_run_alone():
    """Two requests, one a model, arrive together: each runs on its model's
    instance, prefill then three decode steps, at the times its model's
    cluster alone gives it (the other model's instance changes nothing)."""
    reqs = [Request(0, 0.0, 300, 4, model="chat"), Request(1, 0.0, 300, 4, model="small")]
    log: list[tuple] = []
    rows: list[dict[str, Any]] = []
    Simulation(_spec(TWO), requests=reqs, log=log, on_row=rows.append).run()
    per = _by_instance(log)
    assert [(e[1], e[3]) for e in per[0]] == [("iteration", (0,))] + [("iteration", ())] * 3 + [
        ("finish", 0)
    ]
    assert [(e[1], e[3]) for e in per[1]] == [("iteration", (1,))] + [("iteration", ())] * 3 + [
        ("finish", 1)
    ]
    assert [r["model"] for r in sorted(rows, key=lambda r: r["id"])] == ["chat", "small"]
    for instance, (name, entry) in enumerate(TWO["models"].items()):
        req = dataclasses.replace(reqs[instance], model="")
        solo: list[tuple] = []
        Simulation(_alone(name, entry), requests=[req], log=solo).run()
        alone = [(e[0], e[1], instance, *e[3:]) for e in _by_instance(solo)[0]]
        assert per[instance] == alone


def test_a_model_among_others_runs_as_on_a_cluster_of_its_own():
    """Forty requests drawn between two models: each model's rows are those
    of its requests run on its own instances alone (colocated, no network
    between them), and its summary counts them against its own SLO."""
    rows: list[dict[str, Any]] = []
    sim = Simulation(_spec(TWO), on_row=rows.append, keep_requests=True)
    res = sim.run().to_dict()
    per = res["summary"]["models"]
    assert sum(m["requests"] for m in per.values()) == 40
    assert {r["model"] for r in rows} == {"chat", "small"}
    assert per["small"]["slo"]["ttft_s"] == 2.0 and per["chat"]["slo"]["ttft_s"] == 1.0
    for instance, (name, entry) in enumerate(TWO["models"].items()):
        mine = sorted((r for r in rows if r["model"] == name), key=lambda r: r["id"])
        assert per[name]["requests"] == len(mine) > 0
        reqs = [Request(r["id"], r["arrival_s"], r["prompt_tokens"], r["output_tokens"])
                for r in mine]  # fmt: skip
        solo: list[dict[str, Any]] = []
        Simulation(_alone(name, entry), requests=reqs, on_row=solo.append).run()
        for a, b in zip(mine, sorted(solo, key=lambda r: r["id"]), strict=True):
            assert a["instance"] == instance
            assert {k: v for k, v in a.items() if k not in ("model", "instance",
                    "prefill_instance", "decode_instance")} == {
                k: v for k, v in b.items() if k not in ("instance", "prefill_instance",
                                                        "decode_instance")}  # fmt: skip
        assert per[name]["slo_attainment"] == sum(r["slo_met"] for r in mine) / len(mine)


SPLIT: dict[str, Any] = {
    **TWO,
    "cluster": {"topology": "dgx-h100-ib400", "nodes": 1},
    "scheduler": "disagg",
    "models": {
        "chat": {"model": "llama-3.1-8b", "cluster": {"prefill": 1, "decode": 1}},
        "big": {"model": "llama-3.1-70b", "cluster": {"prefill": 1, "decode": 1, "tp": 2}},
    },
}


def test_a_split_model_moves_its_own_models_kv_between_its_own_instances():
    rows: list[dict[str, Any]] = []
    res = Simulation(_spec(SPLIT), on_row=rows.append).run().to_dict()
    mine = {"chat": (0, 1), "big": (2, 3)}
    assert {r["model"] for r in rows} == {"chat", "big"}
    for r in rows:
        model = get_model(SPLIT["models"][r["model"]]["model"])
        assert (r["prefill_instance"], r["decode_instance"]) == mine[r["model"]]
        assert r["kv_bytes_moved"] == r["prompt_tokens"] * model.kv_bytes_per_token()
    per = res["summary"]["models"]
    assert per["big"]["gpus"] == 4 and per["chat"]["gpus"] == 2
    end = res["summary"]["simulated_s"]
    assert per["big"]["gpu_seconds"] == pytest.approx(4 * end, rel=1e-6)


def test_a_policy_that_routes_to_another_models_instance_is_refused():
    sim = Simulation(_spec(TWO))

    class Stray:
        def setup(self, cluster: Any) -> Any:
            raise AssertionError("not asked again")

        def route(self, req: Request, view: Any) -> Route:
            return Route(1, 1)  # the small model's instance

    sim.scheduler.policies["chat"] = Stray()
    with pytest.raises(SpecError, match="model 'chat'.*instance 1, which is not one of the model"):
        sim.run()


def test_a_models_view_holds_its_own_instances_only():
    sim = Simulation(_spec(SPLIT))
    view = sim.scheduler.views["big"]
    assert [i.id for i in view.instances] == [2, 3] and len(view) == 2
    assert view[3].role == "decode" and view.of_role("prefill")[0].id == 2
    assert view.slo.ttft_s == 1.0
    with pytest.raises(IndexError, match="instance 0 is not one of model 'big'"):
        view[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": "llama-3.1-8b"}, "two.yaml: model: with models:, each model gives its own"),
        ({"cluster": {"instances": 2}}, "two.yaml: cluster.instances: with models:, each model"),
        ({"kv_tiers": {"dram": "1 GB"}}, "two.yaml: kv_tiers: not with several models"),
        ({"gpu_budget": 1}, "two.yaml: gpu_budget: 1 is below the 2 GPUs the models start with"),
        ({"gpu_budget": 0}, "two.yaml: gpu_budget: 0"),
        ({"models": {}}, "two.yaml: models: empty"),
        ({"models": {"a": {"model": "llama-3.1-8b"}}}, "two.yaml: models.a.cluster: missing"),
        (
            {"models": {"a": {"model": "llama-3.1-8b", "cluster": {"instances": 1, "tp": 3}}}},
            "two.yaml: models.a: cluster.tp: 3",
        ),
        (
            {
                "models": {
                    "a": {"model": "llama-3.1-8b", "cluster": {"instances": 1}},
                    "b": {"model": "llama-3.1-8b", "cluster": {"instances": 1, "tp": 2}},
                }
            },
            "two.yaml: models: instances of different sizes need a cluster.topology",
        ),  # fmt: skip
        (
            {
                "models": {
                    "a": {"model": "llama-3.1-8b", "cluster": {"instances": 1}, "scheduler": "nope"}
                }
            },
            "two.yaml: models.a: scheduler: unknown scheduler 'nope'",
        ),  # fmt: skip
    ],
)
def test_a_bad_models_spec_is_one_line(change, message, tmp_path, capsys):
    data = {**copy.deepcopy(TWO), **change}
    path = tmp_path / "two.yaml"
    path.write_text(json.dumps(data))
    rc = main(["spec", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"twin: error: {tmp_path}/{message}"), err


def test_a_gpu_budget_goes_with_several_models(tmp_path, capsys):
    data = {**{k: v for k, v in TWO.items() if k != "models"}, "model": "llama-3.1-8b"}
    path = tmp_path / "one.yaml"
    path.write_text(json.dumps({**data, "gpu_budget": 4}))
    assert main(["spec", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"twin: error: {path}: gpu_budget: applies to several models (models:)\n"


def test_a_spec_of_one_model_resolves_as_before():
    """No models: key, no models section, no model column, no per-model summary."""
    data = {k: v for k, v in TWO.items() if k != "models"}
    spec = _spec({**data, "model": "llama-3.1-8b"})
    assert spec.models == () and "models" not in spec.resolved
    res = Simulation(spec, keep_requests=True).run()
    assert "models" not in res.summary and "model" not in res.requests.columns


def test_the_schema_takes_a_spec_of_several_models_and_refuses_one_of_none():
    jsonschema = pytest.importorskip("jsonschema")
    schema = spec_schema()
    jsonschema.validate(TWO, schema)
    jsonschema.validate({**{k: v for k, v in TWO.items() if k != "models"}, "model": "x"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({k: v for k, v in TWO.items() if k != "models"}, schema)


def test_a_run_exports_each_models_split_deployment_one_document_each(tmp_path, capsys):
    """twin run SPEC --export-dynamo/--export-llm-d: a DynamoGraphDeployment and
    a ModelService values document per model, each with its model, pools and
    parallelism, its header the model's figures from the run; each document
    validates against the schemas the exports of one model do."""
    jsonschema = pytest.importorskip("jsonschema")
    spec = tmp_path / "split.yaml"
    spec.write_text(json.dumps(SPLIT))
    dyn, llmd, out = tmp_path / "dynamo.yaml", tmp_path / "values.yaml", tmp_path / "run.json"
    argv = ["run", str(spec), "-q", "--json", str(out), "--export-dynamo", str(dyn),
            "--export-llm-d", str(llmd)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    per = json.loads(out.read_text())["summary"]["models"]
    schemas = Path(__file__).parent / "fixtures" / "export_schemas"
    for path, schema in ((dyn, "dynamo-graph-deployment-v1beta1.schema.json"),
                         (llmd, "llm-d-modelservice-values.schema.json")):  # fmt: skip
        text = path.read_text()
        docs = list(yaml.safe_load_all(text))
        assert len(docs) == 2
        for doc in docs:
            jsonschema.validate(doc, json.loads((schemas / schema).read_text()))
        heads = [json.loads(line[len("# twin: ") :]) for line in text.splitlines()
                 if line.startswith("# twin: ")]  # fmt: skip
        assert [h["model"] for h in heads] == ["llama-3.1-8b", "llama-3.1-70b"]
        for h, name in zip(heads, ("chat", "big"), strict=True):
            assert h["requests"] == per[name]["requests"]
            assert h["slo_attainment"] == per[name]["slo_attainment"]
            assert h["ttft_p99_s"] == per[name]["ttft_s"]["p99"]
            assert h["goodput_rps"] is None
        assert [h["prefill"]["tp"] for h in heads] == [1, 2]
    dyn_docs = list(yaml.safe_load_all(dyn.read_text()))
    assert [d["metadata"]["name"] for d in dyn_docs] == ["two-chat", "two-big"]
    workers = [c for c in dyn_docs[1]["spec"]["components"] if c["type"] == "decode"]
    assert workers[0]["podTemplate"]["spec"]["containers"][0]["args"][:2] == [
        "--model",
        "meta-llama/Llama-3.1-70B",
    ]
    values = list(yaml.safe_load_all(llmd.read_text()))
    assert [v["modelArtifacts"]["name"] for v in values] == [
        "meta-llama/Llama-3.1-8B",
        "meta-llama/Llama-3.1-70B",
    ]
    assert [v["decode"]["parallelism"]["tensor"] for v in values] == [1, 2]


def test_an_export_of_a_colocated_model_is_refused_before_the_run(tmp_path, capsys):
    spec = tmp_path / "two.yaml"
    spec.write_text(json.dumps(TWO))
    out = tmp_path / "dynamo.yaml"
    assert main(["run", str(spec), "-q", "--export-dynamo", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"twin: error: {spec}: models.chat: cluster: mixed instances; the exports write split "
        "deployments (give cluster.prefill and cluster.decode)\n"
    )
    assert not out.exists()


def test_a_request_is_held_to_its_own_models_kv_capacity():
    """A 40,000-token prompt fits the 8B model's instances (27,900 blocks of
    16 tokens) but not the 70B model's (1,740): the 8B model serves it, and
    the 70B model rejects it, each by its own instances' capacity."""
    data = {**SPLIT, "engine": {"oversized": "reject"}}
    reqs = [Request(0, 0.0, 40_000, 10, model="chat"), Request(1, 0.0, 40_000, 10, model="big")]
    rows: list[dict[str, Any]] = []
    Simulation(_spec(data), requests=reqs, on_row=rows.append).run()
    by_id = {r["id"]: r for r in rows}
    assert by_id[0]["status"] == "completed"
    assert (by_id[1]["status"], by_id[1]["reason"]) == ("rejected", "exceeds_kv_capacity")


@register("test-drop-own")
@dataclass
class DropOwn:
    """Colocated routing over its model's instances; its first tick removes
    the model's instance ``victim``."""

    victim: int = 0
    tick_s: float = 0.01

    def setup(self, cluster: Any) -> Plan:
        return Plan()

    def route(self, req: Request, view: Any) -> Route:
        pre = min((i.id for i in view.up() if i.role != "decode"), default=-1)
        dec = min((i.id for i in view.up() if i.role != "prefill"), default=-1)
        return Route(pre, dec)

    def tick(self, view: Any) -> list[Any]:
        return [RemoveInstance(self.victim)] if view.now < 0.015 else []


@pytest.mark.parametrize(
    ("small", "victim", "left"),
    [({"instances": 1}, 1, "prefills"), ({"prefill": 1, "decode": 1}, 2, "decodes")],
)
def test_a_removal_that_empties_one_models_pool_is_refused_on_a_cluster_of_two(small, victim, left):
    """The other model's instance still prefills and decodes; the model whose
    only instance (or only decode instance) the policy drains would serve
    nothing, so it is refused as on a cluster of one model, naming the model."""
    data = copy.deepcopy(TWO)
    data["cluster"] = {"topology": "dgx-h100-ib400", "nodes": 1}
    data["models"]["small"]["cluster"] = small
    data["models"]["small"]["scheduler"] = {"name": "test-drop-own", "victim": victim}
    with pytest.raises(
        SpecError, match=r"RemoveInstance\(.*\) would leave no serving instance of model "
        f"'small' that {left}"
    ):  # fmt: skip
        Simulation(_spec(data)).run()


def test_a_model_of_two_may_remove_an_instance_of_its_own_it_can_spare():
    data = copy.deepcopy(TWO)
    data["models"]["small"]["cluster"] = {"instances": 2}
    data["models"]["small"]["scheduler"] = {"name": "test-drop-own", "victim": 2}
    sim = Simulation(_spec(data))
    result = sim.run()
    ((_, _, inst),) = sim.scaler.released
    assert inst == 2 and sim.engines[2].state == "stopped"
    assert result.summary["completed"] == 40


def test_the_shared_budget_grants_the_model_under_pressure_and_never_exceeds_it():
    """Two models start on a GPU each within a budget of 3: the busy one's
    planner asks for more instances, the budget grants one GPU and refuses the
    rest; the GPUs held (starting and draining instances included) never pass 3,
    and the busy model holds more GPU-seconds than the idle one."""
    data = copy.deepcopy(TWO)
    data["cluster"] = {"topology": "dgx-h100-ib400", "nodes": 1}
    data["models"]["chat"]["share"] = 0.98
    data["models"]["small"]["share"] = 0.02
    data["gpu_budget"] = 3
    data["workload"] = {
        "lengths": {
            "prompt": {"dist": "fixed", "value": 2000},
            "output": {"dist": "fixed", "value": 100},
        },
        "arrival": {"process": "poisson", "rate": 60},
        "duration": "40 s",
    }
    data["scheduler"] = {"name": "sla-planner", "adjustment_interval": "2 s", "max_gpus": 3}
    data["scaling"] = {"storage_bandwidth": "50 GB/s", "warmup": "1 s"}
    held: list[int] = []

    class Held(Observer):
        """The GPUs held at each arrival and each instance's coming up or down."""

        sim: Simulation | None = None

        def _seen(self) -> None:
            if self.sim is not None:
                live = self.sim.view.in_state("serving", "starting", "draining")
                held.append(sum(len(i.gpus) for i in live))

        def request_arrived(self, now: float, req: Request) -> None:
            self._seen()

        def instance_up(self, now: float, instance: int, info: Any = None) -> None:
            self._seen()

        def instance_down(self, now: float, instance: int) -> None:
            self._seen()

    watch = Held()
    sim = Simulation(_spec(data), observers=[watch])
    watch.sim = sim
    out = sim.run().to_dict()["summary"]
    assert max(held) == 3
    assert any(model == "chat" for _, model, _ in sim.scheduler.refused)
    per = out["models"]
    assert per["chat"]["gpu_seconds"] > 1.5 * per["small"]["gpu_seconds"]
