"""The model and GPU catalogs as data files (twin/data/models/, twin/data/gpus/):
every file cites its values, names itself, ships with the package, and a file
that does not cite a value is refused."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest

from twin.errors import SpecError
from twin.perf.catalogs import check_entry, read_catalog
from twin.perf.gpus import GPUS
from twin.perf.llm import MODELS

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("kind", ["models", "gpus"])
def test_every_catalog_entry_is_a_cited_file(kind):
    files = read_catalog(kind)
    on_disk = sorted(p.stem for p in (REPO / "twin" / "data" / kind).glob("*.json"))
    assert sorted(files) == on_disk
    assert sorted(files) == sorted(MODELS if kind == "models" else GPUS)
    for doc in files.values():
        assert doc["source"].strip()
        body = doc.get("shapes") or doc.get("config") or doc.get("spec")
        assert set(doc.get("sources", {})) <= set(body) | {"published_params"}


def test_catalog_files_ship_with_the_package():
    doc = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    globs = doc["tool"]["setuptools"]["package-data"]["twin.data"]
    assert {"models/*.json", "gpus/*.json"} <= set(globs)


def test_a_file_that_does_not_cite_is_refused():
    good = read_catalog("models")["llama-2-7b"]
    where = "twin/data/models/llama-2-7b.json"
    check_entry(good, "models", where)
    no_source = {k: v for k, v in good.items() if k != "source"}
    with pytest.raises(SpecError, match="source: missing"):
        check_entry(no_source, "models", where)
    stray = copy.deepcopy(good)
    stray["sources"]["bogus"] = "a paper"
    with pytest.raises(SpecError, match="'bogus' is not one of its values"):
        check_entry(stray, "models", where)
    with pytest.raises(SpecError, match="is not the file's name"):
        check_entry(good, "models", "twin/data/models/other.json")
    gpu = read_catalog("gpus")["h100-sxm"]
    with pytest.raises(SpecError, match="expected one of spec"):
        check_entry(
            {k: v for k, v in gpu.items() if k != "spec"}, "gpus", "twin/data/gpus/h100-sxm.json"
        )
