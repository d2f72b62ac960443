"""Specs are read with YAML 1.2 booleans (only ``true``/``false``), and every
YAML block of the README parses with the project's loader and, where it is a
spec or a spec fragment, resolves as the README says it is used, so the
README cannot show YAML that the twin refuses."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import shared_data_dir
from tests.doc_pages import name, pages
from twin import yamlio
from twin.bundled import bundled_text
from twin.sim.spec import resolve_spec
from twin.studies.compare import compare_specs
from twin.studies.sweep import expand
from twin.workload.schedule import parse_rate_schedule

# The spec reference (## Experiment spec) and the workload reference (###
# Workloads) list every key, alternatives and elisions (``...``) included:
# they parse here, and tests/test_schema.py holds their keys and defaults.
REFERENCES = ("## Experiment spec", "### Workloads")


def _blocks() -> list[tuple[str, str, str]]:
    """(page:line, the heading above it, text) of every ```yaml block of the
    README and the documentation pages."""
    out = []
    for page in pages():
        heading = ""
        block: list[str] | None = None
        start = 0
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            stripped = line.strip()
            if block is None:
                if line.startswith("#"):
                    heading = line.strip()
                elif stripped == "```yaml":
                    block, start = [], n + 1
            elif stripped.startswith("```"):
                out.append((f"{name(page)}:{start}", heading, "\n".join(block)))
                block = None
            else:
                block.append(line)
    return out


BLOCKS = _blocks()


def _base() -> dict[str, Any]:
    """The spec a fragment completes: the bundled split deployment, with the
    TP of the bundled comparison's cluster (compare-azure-conv, whose
    ``compare:`` the README shows) for a colocated variant."""
    data = yamlio.load(bundled_text("experiments", "disagg"))
    data["cluster"]["tp"] = yamlio.load(bundled_text("experiments", "compare-azure-conv"))[
        "cluster"
    ]["tp"]
    return data


def test_the_readme_has_yaml_blocks():
    assert len(BLOCKS) >= 10
    assert {h for _, h, _ in BLOCKS} >= set(REFERENCES)


@pytest.mark.parametrize(("line", "heading", "text"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_every_readme_yaml_block_parses_and_resolves_as_documented(line, heading, text):
    doc = yamlio.load(text)
    assert isinstance(doc, dict) and doc, f"{line}: not a mapping"
    assert all(isinstance(k, str) for k in doc), f"{line}: keys {list(doc)}"
    if heading in REFERENCES:
        return
    where = line
    if {"model", "workload", "scheduler"} <= set(doc):  # a whole spec
        resolve_spec(doc, where, Path.cwd())
        return
    data = _base()
    if "models" in doc:  # several models: each its own model, and its policy unless given
        for key in ("model", "scheduler"):
            data.pop(key)
    data.update(copy.deepcopy(doc))  # a fragment: its sections replace the base's
    base_dir = Path.cwd()
    if "trace" in data.get("workload", {}):  # the Mooncake trace it names
        data_dir = shared_data_dir()
        if data_dir is None:
            pytest.skip("real public data not found: set TWIN_DATA or place it at ../shared/data")
        base_dir = data_dir / "traces" / "mooncake_fast25"
    if "compare" in doc:
        _, specs = compare_specs(data, where, base_dir)
        assert list(specs) == list(doc["compare"])
    elif "sweep" in doc:  # its runs choose the split: a base cluster without one
        for role in ("prefill", "decode"):
            data["cluster"].pop(role)
        _, runs = expand(data, where, base_dir)
        assert runs
    else:
        resolve_spec(data, where, base_dir)


def _rate_schedules() -> list[str]:
    """The forms of ``rate_schedule`` the workload reference shows, the one
    given and the alternatives commented out below it."""
    text = next(t for _, h, t in BLOCKS if h == "### Workloads")
    forms = []
    for line in text.splitlines():
        m = re.match(r"\s*(?:rate_schedule:|#)\s*(\{kind:[^}]*(?:\[.*\])?[^}]*\})", line)
        if m:
            forms.append(m.group(1))
    return forms


def test_every_rate_schedule_form_in_the_readme_loads():
    forms = _rate_schedules()
    assert {yamlio.load(f)["kind"] for f in forms} == {"steps", "linear", "diurnal", "bursts"}
    for form in forms:
        parse_rate_schedule(yamlio.load(form), "README: workload.rate_schedule")


def test_a_bursts_schedule_written_in_yaml_resolves():
    data = _base()
    data["workload"]["rate_schedule"] = yamlio.load(
        "{kind: bursts, on: 30 s, off: 90 s, high: 4.0, low: 1.0}"
    )
    spec = resolve_spec(data, "bursts.yaml", Path.cwd())
    assert spec.resolved["workload"]["rate_schedule"]["on"] == "30 s"


@pytest.mark.parametrize("word", ["on", "off", "yes", "no", "y", "n", "On", "OFF", "Yes"])
def test_yaml_1_1_booleans_stay_strings(word):
    assert yamlio.load(f"{word}: 1") == {word: 1}
    assert yamlio.load(f"key: {word}") == {"key": word}


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("True", True), ("TRUE", True), ("false", False), ("FALSE", False),
     ("~", None), ("null", None), ("8e9", 8e9), ("12", 12), ("'on'", "on")],
)  # fmt: skip
def test_yaml_1_2_booleans_nulls_and_numbers(text, value):
    assert yamlio.load(f"k: {text}") == {"k": value}
