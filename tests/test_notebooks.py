"""The notebooks run headless, top to bottom, with a small workload."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))

nbformat = pytest.importorskip("nbformat", reason="the notebooks extra is not installed")
nbclient = pytest.importorskip("nbclient", reason="the notebooks extra is not installed")
pytest.importorskip("ipykernel", reason="the notebooks extra is not installed")


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """A kernel spec for this very interpreter, found before any installed one,
    so the notebooks run against the pd-twin these tests run against."""
    spec = tmp_path / "jupyter" / "kernels" / "twin-test"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel_json = {"argv": argv, "display_name": "pd-twin tests", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel_json))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "twin-test"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_without_error(path, tmp_path, monkeypatch, kernel):
    monkeypatch.setenv("TWIN_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name=kernel, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError on any error
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]  # fmt: skip
    assert not errors, errors


def test_there_are_notebooks():
    assert {p.stem for p in NOTEBOOKS} == {
        "01-quickstart",
        "02-pool-ratio",
        "03-topology-whatif",
        "04-your-own-scheduler",
        "05-failures-and-autoscaling",
    }
