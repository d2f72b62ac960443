"""Every ``twin`` command of the shell examples of README.md and the
documentation pages (tests/doc_pages.py), run as a reader would
paste it (tests/readme_commands.py finds them): in a fresh folder beside a
``shared/data`` that holds the public data (as the repository's own folder
sits), through bash, with ``twin`` on the PATH. A command the README shows
failing must fail with exactly the lines it shows; any other must succeed.

Nothing is changed in a command but what :data:`ADDED` adds to it, in plain
view here. A command that needs what this machine lacks (the public data,
PyTorch and a GPU) is skipped, saying so; one that takes minutes is marked
slow (``pytest -m slow``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, shared_data_dir
from doc_pages import README, pages
from doc_pages import name as page_name
from readme_commands import Example, examples

EXAMPLES = [e for page in pages() for e in examples(page, page_name(page))]

# What a test adds to a command so that it takes seconds, not minutes (the
# rest of the command runs as written).
ADDED: dict[str, str] = {
    "twin run compare-azure-conv": " --set workload.max_requests=300",
    "twin provision disagg": " --sample 250 --replicates 1",
}
# Commands that take minutes even so (run with -m slow).
SLOW = (
    "twin validate perf --data ../shared/data --workload",
    "twin validate perf --held-out",
    "twin bench --sizes 10k,100k,1M",
    "twin plan disagg --set cluster.nodes=2",
)
# Commands that read the public data folder.
DATA = ("twin run azure-conv", "twin run compare-", "twin validate perf", "twin validate replay")
# A placeholder the reader replaces: as written, the command must end in one clean line.
PLACEHOLDER = {"PEER/run.sh": "PEER/run.sh: not found"}


def _has_torch_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


GPU = ("twin profile", "twin calibrate --profile qwen3-8b")  # the table it measures on a GPU


def _marks(e: Example) -> list[pytest.MarkDecorator]:
    marks = []
    if e.command.startswith(SLOW):
        marks.append(pytest.mark.slow)
    if e.command.startswith(GPU) and not _has_torch_gpu():
        marks.append(pytest.mark.skip(reason="measures on a CUDA GPU with PyTorch (profile extra)"))
    return marks


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``with/work`` beside ``with/shared/data`` (the data, when this machine has
    it) and ``without/work`` with no data folder near; both hold ``tests/``."""
    root = tmp_path_factory.mktemp("readme")
    out = {}
    for kind in ("with", "without"):
        work = root / kind / "work"
        work.mkdir(parents=True)
        (work / "tests").symlink_to(REPO / "tests")  # the README's fixture paths
        out[kind] = work
    data = shared_data_dir()
    if data is not None:
        (root / "with" / "shared").mkdir()
        (root / "with" / "shared" / "data").symlink_to(data.resolve())
    return out


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TWIN_DATA"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # twin
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=env, capture_output=True,
        text=True, timeout=1800,
    )  # fmt: skip


def test_the_readme_shows_commands():
    commands = [e.command for e in EXAMPLES]
    assert len(commands) >= 15 and all(c.startswith("twin ") for c in commands)
    assert any(e.error for e in EXAMPLES) and any(e.files for e in EXAMPLES)


@pytest.mark.parametrize(
    "example",
    [pytest.param(e, id=f"{e.page}:{e.line}", marks=_marks(e)) for e in EXAMPLES],
)
def test_readme_command(example: Example, folders: dict[str, Path]) -> None:
    e = example
    if e.error is not None:
        # The README shows it failing; the data folder is then absent (its
        # `twin run azure-conv` shows what happens without one).
        p = _run(e.command, folders["without"])
        assert p.returncode == 2, p.stderr
        assert p.stderr.splitlines() == e.shown.splitlines()
        return
    if e.command.startswith(DATA) and shared_data_dir() is None:
        pytest.skip("reads the public data: set TWIN_DATA or place it at ../shared/data")
    work = folders["with"]
    for name, text in e.files:  # what `$ cat` showed, as the reader has it
        (work / name).write_text(text, encoding="utf-8")
    command = e.command + next((v for k, v in ADDED.items() if e.command.startswith(k)), "")
    p = _run(command, work)
    placeholder = next((v for k, v in PLACEHOLDER.items() if k in e.command), None)
    assert "Traceback" not in p.stderr, p.stderr
    if placeholder is not None:
        assert p.returncode == 2 and p.stderr.startswith("twin: error: ")
        assert placeholder in p.stderr and p.stderr.count("\n") == 1, p.stderr
    else:
        assert p.returncode == 0, p.stderr


def test_the_readme_shows_the_default_experiments_output_as_it_prints_it(
    folders: dict[str, Path],
) -> None:
    """The one result README.md prints is ``twin run``'s output, to the digit:
    when the default experiment changes, paste its new output there."""
    (shown,) = [e for e in examples(README) if e.command == "twin run" and e.shown]
    p = _run("twin run", folders["without"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.rstrip("\n") == shown.shown.rstrip("\n"), (
        "README.md's `$ twin run` block is not what `twin run` prints now; paste its output"
    )


def test_the_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail into docs/"
