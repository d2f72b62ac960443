"""A sweep killed outright (SIGKILL): its pool workers end with it, and the
next sweep into the folder removes the temporary files it left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import child_pids

from twin._io import remove_stale_tmp

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").is_file(), reason="reads the process table from /proc (Linux)"
)

SPEC = """\
name: killed
model: llama-3.1-8b
gpu: h100-sxm
cluster: {instances: 1, tp: 1}
workload:
  lengths: azure-conv
  arrival: {process: poisson, rate: 20.0}
  max_requests: 400000
slo: {ttft: 1 s, tpot: 50 ms}
sweep:
  seed: [0, 1]
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_for(what, timeout_s: float):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    return what()


def test_sigkill_ends_the_workers_and_resume_removes_the_tmp_file(tmp_path):
    spec = tmp_path / "killed.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    twin = [sys.executable, "-m", "twin.cli"]
    proc = subprocess.Popen(
        [*twin, "sweep", str(spec), "--out", str(out), "-j", "2", "--no-plots"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
    )  # fmt: skip
    workers: list[int] = []
    try:
        tmp = f".runs.csv.{proc.pid}.tmp"
        workers = _wait_for(lambda: len(child_pids(proc.pid)) >= 2 and child_pids(proc.pid), 120)
        assert workers and len(workers) >= 2, "the sweep started no pool"
        assert _wait_for(lambda: (out / tmp).is_file(), 30)
        assert proc.poll() is None, "the sweep ended before it was killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        left = _wait_for(lambda: not any(_running(w) for w in workers), 5.0)
        assert left, f"workers {[w for w in workers if _running(w)]} outlived their parent"
    finally:
        if proc.poll() is None:
            proc.kill()
        for w in workers:  # none left, unless the test failed
            if _running(w):
                os.kill(w, signal.SIGKILL)
    assert (out / tmp).is_file()  # what SIGKILL leaves
    # the sweep run again into the folder (shortened: the tmp file is what is checked)
    rc = subprocess.run(
        [*twin, "sweep", str(spec), "--out", str(out), "--no-plots",
         "--set", "workload.max_requests=20"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert rc.returncode == 0, rc.stderr
    assert not (out / tmp).exists()
    assert not list(out.glob(".*.tmp*")) and not list((out / "runs").glob(".*.tmp*"))
    assert (out / "runs.csv").is_file()


def test_only_the_tmp_files_of_dead_writers_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    gone_pid = int(dead.stdout)
    names = {
        f".runs.csv.{gone_pid}.tmp": False,  # AtomicFile's, of a dead writer
        f".cdf.{gone_pid}.tmp.png": False,  # atomic_path's
        f".runs.csv.{os.getpid()}.tmp": True,  # this process's, in progress
        f".runs.csv.{os.getppid()}.tmp": True,  # a live one's
        "runs.csv": True,
        f"notes.{gone_pid}.tmp": True,  # not a temporary name (no leading dot)
    }
    for n in names:
        (tmp_path / n).write_text("x")
    removed = remove_stale_tmp(tmp_path)
    assert sorted(p.name for p in removed) == sorted(n for n, keep in names.items() if not keep)
    assert {p.name for p in tmp_path.iterdir()} == {n for n, keep in names.items() if keep}
