"""The JSON Schema of a spec (``twin spec --schema``): valid draft 2020-12,
deterministic, true to the declarations, met by every bundled experiment, and
the README's spec reference documents exactly its keys and defaults."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import yaml
from doc_pages import find_page

import schedulers.colocated  # registers the built-ins when not installed
import schedulers.disagg  # noqa: F401
from twin._declare import declarations, keys
from twin.bundled import bundled_names, bundled_text
from twin.cli import main
from twin.serving.engine import EngineConfig
from twin.serving.handoff import TransferConfig
from twin.sim.metrics import SLO
from twin.workload.stream import WorkloadSpec


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    from twin.sim.spec import spec_schema
    from twin.studies.compare import COMPARE_SCHEMA
    from twin.studies.sweep import SWEEP_SCHEMA

    return spec_schema({"compare": COMPARE_SCHEMA, "sweep": SWEEP_SCHEMA})


def test_twin_spec_schema_prints_a_valid_draft_2020_12_schema_the_same_each_time(capsys, schema):
    outs = []
    for _ in range(2):
        assert main(["spec", "--schema"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
    doc = json.loads(outs[0])
    assert outs[0] == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert doc == json.loads(json.dumps(schema))
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(doc)


@pytest.mark.parametrize("name", bundled_names("experiments"))
def test_every_bundled_experiment_meets_the_schema(schema, name):
    data = yaml.safe_load(bundled_text("experiments", name))
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(data))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


@pytest.mark.parametrize(
    "bad",
    [
        {"clustr": {}},
        {"seed": -1},
        {"engine": {"block_size": 0}},
        {"engine": {"blok_size": 16}},
        {"engine": {"activation_reserve": "lots"}},
        {"engine": {"oversized": "maybe"}},
        {"slo": {"ttft": "1 parsec"}},
        {"slo": {"target": 1.5}},
        {"transfer": {"mode": "streamed"}},
        {"cluster": {"prefill": {"instancs": 2}}},
        {"scheduler": "colocatd"},
        {"perf": {"kind": "table"}},
        {"perf": {"kind": "roofline", "mfuu": 0.5}},
        {"workload": {"lengths": "azure-conv", "arrival": {"process": "weibull", "rate": 1}}},
        {"workload": {"lengths": "azure-conv", "rate_schedule": {"kind": "sine"}}},
        {
            "workload": {
                "lengths": "azure-conv",
                "rate_schedule": {"kind": "steps", "points": [[0, -1]]},
            }
        },
        {
            "workload": {
                "lengths": "azure-conv",
                "rate_schedule": {"kind": "bursts", "on": "1 s", "off": "1 s"},
            }
        },
    ],
)
def test_the_schema_refuses_what_the_loader_refuses(schema, bad):
    data = {"model": "llama-2-70b", "workload": {"lengths": "azure-conv"}, **bad}
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(data))


def test_the_schema_is_the_declarations(schema):
    props = schema["properties"]
    for section, cls in (
        ("engine", EngineConfig),
        ("transfer", TransferConfig),
        ("slo", SLO),
        ("workload", WorkloadSpec),
    ):
        s = props[section]
        assert list(s["properties"]) == list(keys(cls)), section
        for _, d in declarations(cls):
            p = s["properties"][d.key]
            assert p["description"] == d.help
            assert p.get("default") == d.default, (section, d.key)
    engine = props["engine"]["properties"]
    assert engine["activation_reserve"]["x-unit"] == "bytes"
    assert engine["activation_reserve"]["default"] == "2 GiB"
    assert props["slo"]["properties"]["ttft"]["x-unit"] == "s"
    assert props["model"] and props["models"] and schema["required"] == ["workload"]
    assert schema["anyOf"] == [{"required": ["model"]}, {"required": ["models"]}]


# -- the README's spec reference -----------------------------------------------------
_LINE = re.compile(r"^(?P<indent> *)(?P<off># )?(?P<key>[a-z_]+):(?P<rest>.*)$")


def _yaml_block(heading: str) -> str:
    """The first YAML block under ``heading``, on the page that has it (the
    spec reference moved from README.md to docs/guides/spec.md)."""
    text = find_page(heading).read_text(encoding="utf-8")
    start = text.index("```yaml\n", text.index(f"{heading}\n")) + len("```yaml\n")
    return text[start : text.index("```", start)]


def _documented(block: str) -> dict[tuple[str, ...], tuple[bool, str]]:
    """Key path -> (commented out, the value text) of every key in a README block."""
    out: dict[tuple[str, ...], tuple[bool, str]] = {}
    path: tuple[str, ...] = ()
    for line in block.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        path = (*path[: len(m["indent"]) // 2], m["key"])
        out[path] = (m["off"] is not None, m["rest"].split("#")[0].strip())
    return out


def _branches(node: dict[str, Any]) -> list[dict[str, Any]]:
    """``node`` and the alternatives it allows, at any depth."""
    return [node, *(c for k in ("anyOf", "oneOf") for b in node.get(k, []) for c in _branches(b))]


def _child(node: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The schema of ``key`` under ``node``; ``{}`` where ``node`` takes other keys."""
    for b in _branches(node):
        if key in b.get("properties", {}):
            return b["properties"][key]
    if any(b.get("additionalProperties") is True for b in _branches(node)):
        return {}
    return None


def _check_block(schema: dict[str, Any], block: str, root: tuple[str, ...]) -> set:
    """Every key of ``block`` is in the schema, inline mappings too, and every
    value shown uncommented equals the schema's default where it has one.
    Returns the documented key paths."""
    docs = _documented(block)
    assert docs, "no keys found in the README block"
    for path, (commented, text) in docs.items():
        node: dict[str, Any] | None = schema
        for key in path[len(root) :] if path[: len(root)] == root else path:
            assert node is not None
            node = _child(node, key)
            assert node is not None, (
                f"README documents {'.'.join(path)}; the schema has no such key"
            )
        value = yaml.safe_load(text) if text and "..." not in text else None  # ...: elided
        if isinstance(value, dict):
            for key in value:
                assert _child(node, key) is not None, f"README: {'.'.join(path)}.{key}"
        elif value is not None and not commented and "default" in node:
            assert value == node["default"], (
                f"README shows {'.'.join(path)}: {text}, the default is {node['default']!r}"
            )
    return set(docs)


def test_the_readme_spec_reference_matches_the_schema(schema):
    documented = _check_block(schema, _yaml_block("## Experiment spec"), ())
    props = schema["properties"]
    for key in props:
        assert (key,) in documented, f"README's spec reference leaves out {key}"
    for section in ("cluster", "engine", "transfer", "slo", "scheduler"):
        node = props[section]
        for b in _branches(node):
            for key in b.get("properties", {}):
                assert (section, key) in documented, f"README leaves out {section}.{key}"
    assert ("perf", "kind") in documented


def test_the_readme_workload_reference_matches_the_schema(schema):
    workload = schema["properties"]["workload"]
    documented = _check_block(workload, _yaml_block("### Workloads"), ("workload",))
    for key in workload["properties"]:
        assert ("workload", key) in documented, f"README's Workloads leaves out {key}"
