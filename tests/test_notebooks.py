"""The notebooks run headless, top to bottom, with a small workload, and the
outputs committed with them are those a fresh run gives.

Each notebook is executed once per session (the way ``python
tests/test_notebooks.py`` executes them to refresh the committed outputs:
``TWIN_NOTEBOOK_SMALL=1``, the Agg backend, the public data through
``TWIN_DATA`` when it is found) and both checks read that one execution.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
# The notebooks whose outputs depend on whether the public data is found.
USES_DATA = {"02-pool-ratio"}
TIMEOUT_S = 600  # per cell


def data_dir() -> Path | None:
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    from conftest import shared_data_dir

    return shared_data_dir()


@contextmanager
def notebook_env() -> Iterator[str]:
    """The environment a notebook runs in, and the name of a kernel spec for
    this very interpreter, found before any installed one, so the notebooks
    run against the pd-twin these tests run against."""
    with tempfile.TemporaryDirectory(prefix="twin-kernel-") as tmp:
        spec = Path(tmp) / "jupyter" / "kernels" / "twin-test"
        spec.mkdir(parents=True)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        kernel_json = {"argv": argv, "display_name": "pd-twin tests", "language": "python"}
        (spec / "kernel.json").write_text(json.dumps(kernel_json))
        data = data_dir()
        env = {
            "JUPYTER_PATH": str(Path(tmp) / "jupyter"),
            "TWIN_NOTEBOOK_SMALL": "1",
            "MPLBACKEND": "Agg",
            "PYTHONHASHSEED": "0",
        }
        if data is not None:
            env["TWIN_DATA"] = str(data)
        saved = {k: os.environ.get(k) for k in [*env, "TWIN_DATA"]}
        os.environ.update(env)
        if data is None:
            os.environ.pop("TWIN_DATA", None)
        try:
            yield "twin-test"
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _client(path: Path, kernel: str, workdir: Path) -> Any:
    """The notebook at ``path`` and a client that runs it in ``workdir``."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=TIMEOUT_S,
        kernel_name=kernel,
        record_timing=False,
        resources={"metadata": {"path": str(workdir)}},
    )
    return nb, client


def execute(path: Path, kernel: str, workdir: Path) -> Any:
    """``path`` run top to bottom in ``workdir`` (the files it writes go
    there); the notebook with its outputs."""
    nb, client = _client(path, kernel, workdir)
    client.execute()  # raises CellExecutionError on any error
    return nb


def execute_all(jobs: list[tuple[Path, Path]], kernel: str) -> list[Any]:
    """Each (notebook, folder) of ``jobs`` run as :func:`execute` runs it, in
    its own kernel, as many kernels at a time as there are cores (the kernels
    share nothing but the environment); per job the notebook with its
    outputs, or the exception its run raised."""
    import asyncio

    async def run_all() -> list[Any]:
        slots = asyncio.Semaphore(max(1, os.cpu_count() or 1))

        async def one(path: Path, workdir: Path) -> Any:
            async with slots:
                nb, client = _client(path, kernel, workdir)
                await client.async_execute()
                return nb

        return await asyncio.gather(*(one(p, w) for p, w in jobs), return_exceptions=True)

    return asyncio.run(run_all())


_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def outputs(nb: Any, workdir: Path | None = None) -> list[dict[str, Any]]:
    """Per code cell, what a reader sees of its outputs: the text of each
    stream and of each result, and the number of images. Only what may
    legitimately differ between two runs is normalized: memory addresses and
    the folder it ran in."""

    def norm(text: str) -> str:
        if workdir is not None:
            text = text.replace(str(workdir), "<workdir>")
        return _ADDRESS.sub("0x<address>", text)

    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        streams: dict[str, str] = {}
        results: list[str] = []
        images = 0
        for o in cell.get("outputs", []):
            kind = o.get("output_type")
            if kind == "stream":
                streams[o["name"]] = streams.get(o["name"], "") + norm(o["text"])
            elif kind in ("display_data", "execute_result"):
                data = o.get("data", {})
                if any(k.startswith("image/") for k in data):
                    images += 1
                elif "text/plain" in data:
                    results.append(norm(data["text/plain"]))
            elif kind == "error":
                results.append(f"error: {o.get('ename')}: {o.get('evalue')}")
        cells.append({"streams": streams, "results": results, "images": images})
    return cells


def data_branch(nb: Any) -> str | None:
    """What a data notebook replays, as its first output says (``replaying trace ...``)."""
    for cell in outputs(nb):
        text = cell["streams"].get("stdout", "")
        if text.startswith("replaying "):
            return text.split()[1]
    return None


# -- the tests ------------------------------------------------------------------------------
def _selected(session: pytest.Session) -> list[Path]:
    """The notebooks the session's tests of this module name by parameter."""
    here = Path(__file__).resolve()
    paths = set()
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        if item.path == here and callspec is not None and "path" in callspec.params:
            paths.add(callspec.params["path"])
    return [p for p in NOTEBOOKS if p in paths]


@pytest.fixture(scope="session")
def executed(tmp_path_factory, request) -> Iterator[Any]:
    """path -> (the notebook as a fresh run left it, the folder it ran in),
    each executed once: those the session's tests name up front, side by side
    (:func:`execute_all`), any other on first use."""
    pytest.importorskip("nbformat", reason="the notebooks extra is not installed")
    pytest.importorskip("nbclient", reason="the notebooks extra is not installed")
    pytest.importorskip("ipykernel", reason="the notebooks extra is not installed")
    cache: dict[Path, tuple[Any, Path]] = {}
    with notebook_env() as kernel:
        ahead = [(p, tmp_path_factory.mktemp(p.stem)) for p in _selected(request.session)]
        for (path, workdir), nb in zip(ahead, execute_all(ahead, kernel), strict=True):
            cache[path] = (nb, workdir)

        def get(path: Path) -> tuple[Any, Path]:
            if path not in cache:
                workdir = tmp_path_factory.mktemp(path.stem)
                cache[path] = (execute(path, kernel, workdir), workdir)
            nb, workdir = cache[path]
            if isinstance(nb, BaseException):
                raise nb  # its run failed: the tests of this notebook fail with it
            return nb, workdir

        yield get


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_without_error(path, executed):
    nb, _ = executed(path)
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]  # fmt: skip
    assert not errors, errors


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_committed_outputs_are_those_a_fresh_run_gives(path, executed):
    import nbformat

    committed = nbformat.read(path, as_version=4)
    if path.stem in USES_DATA and data_dir() is None:
        pytest.skip("its outputs are committed from a run with the public data, not found here")
    fresh, workdir = executed(path)
    if path.stem in USES_DATA and data_branch(fresh) != data_branch(committed):
        pytest.skip(
            f"this run replays {data_branch(fresh)}, the committed one {data_branch(committed)}"
        )
    want, got = outputs(committed, None), outputs(fresh, workdir)
    assert any(c["streams"] or c["results"] or c["images"] for c in want), (
        f"{path.name} is committed without outputs: run python tests/test_notebooks.py"
    )
    for k, (w, g) in enumerate(zip(want, got, strict=True)):
        assert w == g, f"{path.name}, code cell {k}: stale; run python tests/test_notebooks.py"


def test_the_data_notebooks_are_those_that_look_for_the_data():
    looks = {
        p.stem
        for p in NOTEBOOKS
        if "find_data_dir" in p.read_text() or "TWIN_DATA" in p.read_text()
    }
    assert looks == USES_DATA


def test_notebook_03_shows_its_chart(executed):
    (path,) = [p for p in NOTEBOOKS if p.stem.startswith("03-")]
    nb, _ = executed(path)
    assert sum(c["images"] for c in outputs(nb)) == 1


def test_there_are_notebooks():
    assert {p.stem for p in NOTEBOOKS} == {
        "01-quickstart",
        "02-pool-ratio",
        "03-topology-whatif",
        "04-your-own-scheduler",
        "05-failures-and-autoscaling",
        "06-speculative-decoding",
        "07-sessions",
    }


def main(argv: list[str]) -> int:
    """Execute the notebooks named (default: all) as the tests do and save
    them with their outputs."""
    import nbformat

    paths = [Path(a) for a in argv] or NOTEBOOKS
    with notebook_env() as kernel:
        for path in paths:
            with tempfile.TemporaryDirectory(prefix="twin-nb-") as tmp:
                nb = execute(path, kernel, Path(tmp))
            nb.metadata.pop("widgets", None)
            nb.metadata["kernelspec"] = {
                "display_name": "Python 3", "language": "python", "name": "python3"
            }  # fmt: skip
            nb.metadata["language_info"] = {"name": "python"}
            nbformat.write(nb, path)
            print(path, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
