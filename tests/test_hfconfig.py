"""Models from Hugging Face config.json: shapes and parameter counts derived,
the catalog's config rows, files and inline mappings, and bad files."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from twin.cli import main
from twin.perf.hfconfig import bundled_configs, count_params
from twin.perf.llm import MODELS, get_model

CONFIGS = bundled_configs()


@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_a_config_row_gives_its_published_parameter_count(key):
    row = CONFIGS[key]
    m = MODELS[key]
    assert m.params == pytest.approx(row["published_params"], rel=0.01)
    assert m.layers == row["config"]["num_hidden_layers"]
    assert m.hidden == row["config"]["hidden_size"]


# Where a row's values were read: a copy of the config at a pinned commit of a
# public repository, or (the first rows) the copies in realruns/models.
_PINNED = re.compile(r"[\w.-]+/[\w.-]+@[0-9a-f]{40} \S+|realruns/models/\S+\.json")


@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_a_config_row_names_where_its_values_were_read(key):
    row = CONFIGS[key]
    assert _PINNED.search(row["source"]), row["source"]
    assert row["published_source"].strip()


# The catalog rows typed from config.json: their published totals against the
# count the shapes give (the gated-MLP models; OPT and BLOOM carry biases and
# learned positions the count does not model).
_FAMILY = {"qwen3-8b": "qwen3", "qwen3-30b-a3b": "qwen3_moe", "qwen3-235b-a22b": "qwen3_moe"}


@pytest.mark.parametrize(
    "key", sorted(k for k, m in MODELS.items() if m.mlp == "gated" and k not in CONFIGS)
)
def test_every_catalog_model_counts_to_its_published_size(key):
    m = MODELS[key]
    shapes = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
    cfg = {"model_type": _FAMILY.get(key, "")}
    assert count_params(shapes, cfg) == pytest.approx(m.params, rel=0.01)


@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_a_config_json_file_round_trips_to_the_catalog_model(tmp_path, key):
    path = tmp_path / f"{key}.json"
    path.write_text(json.dumps(CONFIGS[key]["config"]))
    assert get_model(str(path)) == MODELS[key]
    inline = get_model(dict(CONFIGS[key]["config"], _name_or_path=key))
    assert inline == MODELS[key]


def test_the_realruns_configs_are_read_as_they_come(shared_data):
    models = shared_data / "realruns" / "models"
    scout = get_model(str(models / "RedHatAI__Llama-4-Scout-17B-16E-Instruct-FP8-dynamic.json"))
    # text_config read; 16 experts, top-1, one shared expert per layer: 107.8B
    # (109B published with the vision encoder)
    assert (scout.layers, scout.experts, scout.experts_per_token, scout.shared_experts) == (
        48, 16, 1, 1,
    )  # fmt: skip
    assert scout.params == pytest.approx(109e9, rel=0.02)
    for f in models.glob("*.json"):
        get_model(str(f))  # every one derives


def test_a_spec_takes_a_config_json_beside_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["qwen2.5-7b"]["config"]))
    from twin.sim.spec import resolve_spec

    spec = resolve_spec(
        {"model": "config.json", "gpu": "h100-sxm", "cluster": {"instances": 1, "tp": 1},
         "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                      "max_requests": 5},
         "slo": {"ttft": "1 s", "tpot": "50 ms"}},
        "spec.yaml", tmp_path,
    )  # fmt: skip
    assert spec.model.params == MODELS["qwen2.5-7b"].params


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda c: c.pop("hidden_size"), "hidden_size"),
        (lambda c: c.update(num_key_value_heads="eight"), "num_key_value_heads"),
        (lambda c: c.update(torch_dtype="float8"), "torch_dtype"),
    ],
)
def test_a_bad_config_json_is_one_line_naming_file_and_key(tmp_path, capsys, edit, key):
    cfg = dict(CONFIGS["codellama-34b"]["config"])
    edit(cfg)
    path = tmp_path / "bad-config.json"
    path.write_text(json.dumps(cfg))
    assert main(["kv", str(path), "--tokens", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("twin: error: ")
    assert "bad-config.json" in err and key in err


def test_a_file_that_is_not_json_is_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    assert main(["kv", str(path), "--tokens", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.json" in err
