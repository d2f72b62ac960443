"""A sweep killed outright (SIGKILL): its pool workers end with it, and the
next sweep into the folder removes the temporary files it left. A pool sent
SIGTERM as a process group (workers included) ends, workers and all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import shared_data_dir
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


def _term_handler() -> bool:
    return signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_pool_worker_does_not_keep_the_sigterm_handler_it_forked_with():
    # the parent's handler (SIGTERM raises SystemExit, so that it stops its
    # pool) would make a worker report the signal as a job's error and go on
    from concurrent.futures import ProcessPoolExecutor

    from twin.studies.sweep import _restore_term, _terminate_raises
    from twin.studies.workers import init_worker

    previous = _terminate_raises()
    try:
        with ProcessPoolExecutor(1, initializer=init_worker, initargs=(os.getpid(),)) as pool:
            assert pool.submit(_term_handler).result(timeout=60)
    finally:
        _restore_term(previous)


@pytest.mark.parametrize("what", ["sweep", "held-out fits"])
def test_sigterm_to_the_whole_process_group_ends_the_pool_and_its_workers(tmp_path, what):
    # what `kill -- -PGID` sends: the workers get the signal too, and must end
    # rather than report it as a job's error and go on with the next job
    spec = tmp_path / "killed.yaml"
    spec.write_text(SPEC)
    twin = [sys.executable, "-m", "twin.cli"]
    if what == "sweep":
        args = ["sweep", str(spec), "--out", str(tmp_path / "out"), "-j", "2", "--no-plots"]
    else:
        data = shared_data_dir()
        if data is None:
            pytest.skip("reads the public data: set TWIN_DATA or place it at ../shared/data")
        args = ["validate", "perf", "--data", str(data), "--held-out", "-j", "2"]
    proc = subprocess.Popen(
        [*twin, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
        start_new_session=True,
    )  # fmt: skip
    workers: list[int] = []
    try:
        workers = _wait_for(lambda: len(child_pids(proc.pid)) >= 2 and child_pids(proc.pid), 120)
        assert workers and len(workers) >= 2, "no pool started"
        time.sleep(2.0)  # the workers are busy
        assert proc.poll() is None, "the command ended before it was stopped"
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("still running 30 s after SIGTERM to its process group")
        assert proc.returncode != 0
        left = _wait_for(lambda: not any(_running(w) for w in workers), 5.0)
        assert left, f"workers {[w for w in workers if _running(w)]} outlived the SIGTERM"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for w in workers:
            if _running(w):
                os.kill(w, signal.SIGKILL)


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
