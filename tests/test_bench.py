"""``twin bench``: sizes, the two benchmark configurations, every measured
column of a real (tiny) run, ``--vs`` with a trivial command, and the requests
CSV the other command reads, which must be exactly the requests simulated."""

from __future__ import annotations

import csv
import json
import shlex
import sys
from pathlib import Path

import pytest

import schedulers.colocated  # registers the built-ins when not installed
import schedulers.splitwise  # noqa: F401
from twin.cli import main
from twin.errors import TwinError
from twin.serving.observer import Observer
from twin.sim.simulation import Simulation
from twin.sim.spec import resolve_spec
from twin.studies.bench import (
    bench,
    bench_requests,
    bench_spec,
    parse_configs,
    parse_sizes,
    run_one,
    vs_command,
    write_requests_csv,
)

COLUMNS = (
    "config",
    "requests",
    "cpu_s",
    "wall_s",
    "cpu_us_per_request",
    "events_per_request",
    "iterations_per_request",
    "rss_mib",
    "simulated_s",
)


def test_sizes_take_k_and_m_suffixes():
    assert parse_sizes("10k,100k,1M") == [10_000, 100_000, 1_000_000]
    assert parse_sizes("5000, 1.5k,2m,1_000") == [5000, 1500, 2_000_000, 1000]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10x", "'10x' is not a request count"),
        ("1.2345k", "not a whole number"),
        ("0", "must be > 0"),
        ("", "names no size"),
        ("-5", "'-5' is not a request count"),
    ],
)
def test_bad_sizes_say_which(text, message):
    with pytest.raises(TwinError, match=message):
        parse_sizes(text)


def test_configs_are_checked():
    assert parse_configs("split, colocated,split") == ["split", "colocated"]
    with pytest.raises(TwinError, match="'mixed' is not a configuration; choose from colocated"):
        parse_configs("colocated,mixed")


def _resolve(config: str, n: int):
    return resolve_spec(bench_spec(config, n), "bench", Path.cwd())


def test_the_two_configurations_resolve_to_their_cluster_shapes():
    colo, split = _resolve("colocated", 100), _resolve("split", 100)
    for spec in (colo, split):
        r = spec.resolved
        assert r["model"] == "llama-2-70b" and r["gpu"] == "h100-sxm"
        assert r["cluster"]["topology"] == "dgx-h100-ib400" and r["cluster"]["nodes"] == 4
        assert r["workload"] == {
            "lengths": "azure-conv",
            "arrival": {"process": "poisson", "rate": 8.0},
            "max_requests": 100,
        }
        assert r["seed"] == 0
    assert [(g["role"], g["instances"], g["tp"]) for g in colo.resolved["cluster"]["groups"]] == [
        ("mixed", 4, 8)
    ]
    assert colo.resolved["scheduler"] == {"name": "colocated", "routing": "least_loaded"}
    assert [(g["role"], g["instances"], g["tp"]) for g in split.resolved["cluster"]["groups"]] == [
        ("prefill", 2, 8),
        ("decode", 2, 8),
    ]
    assert split.resolved["scheduler"]["name"] == "splitwise"
    assert split.resolved["slo"]["ttft_at"] == "decode"
    # one instance per DGX node, all 8 of its GPUs
    for spec, roles in ((colo, ["mixed"] * 4), (split, ["prefill"] * 2 + ["decode"] * 2)):
        sim = Simulation(spec)
        assert [e.role for e in sim.engines] == roles
        assert [p.node for p in sim.placements] == [0, 1, 2, 3]
        assert all(len(p.gpus) == 8 for p in sim.placements)


class _Arrivals(Observer):
    """The requests that arrive, less those rejected at arrival for the context."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, int, int]] = []
        self.over_context: set[tuple[float, int, int]] = set()

    def request_arrived(self, now, req):
        self.seen.append((req.arrival_s, req.prompt_tokens, req.output_tokens))

    def request_ended(self, now, instance, req, seq, outcome, reason):
        if outcome == "rejected" and reason == "context_length":
            self.over_context.add((req.arrival_s, req.prompt_tokens, req.output_tokens))

    @property
    def served(self) -> list[tuple[float, int, int]]:
        return [r for r in self.seen if r not in self.over_context]


@pytest.mark.parametrize("config", ["colocated", "split"])
def test_the_requests_csv_holds_exactly_the_requests_the_twin_serves(config, tmp_path):
    n = 300
    seen = _Arrivals()
    Simulation(_resolve(config, n), observers=[seen]).run()
    # the Azure conversation lengths run past Llama-2-70B's 4,096 tokens: some
    # requests are rejected at arrival, and the peer must not be handed them
    assert seen.over_context and len(seen.seen) == n
    path = tmp_path / "requests.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        assert write_requests_csv(bench_requests(config, n), f) == len(seen.served)
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["arrival_s", "prompt_tokens", "output_tokens"]
    back = [(float(r["arrival_s"]), int(r["prompt_tokens"]), int(r["output_tokens"])) for r in rows]
    assert back == seen.served  # floats round-trip exactly
    assert all(p + o <= 4096 for _, p, o in back)
    assert len(set(back)) > n // 2  # drawn, not one request repeated


def test_under_truncate_the_peer_gets_the_truncated_requests(monkeypatch):
    from twin.studies import bench as bench_mod

    plain = bench_mod.bench_spec

    def truncating(config, n):
        spec = plain(config, n)
        spec["engine"] = {"oversized": "truncate"}
        return spec

    monkeypatch.setattr(bench_mod, "bench_spec", truncating)
    rows = list(bench_requests("colocated", 300))
    assert len(rows) == 300 and all(p + o <= 4096 for _, p, o in rows)


def test_a_tiny_bench_fills_every_column():
    (row,) = bench([200], ["colocated"], 1)
    for key in COLUMNS:
        assert key in row
    assert row["config"] == "colocated" and row["requests"] == 200 and row["runs"] == 1
    assert row["cpu_s"] > 0 and row["wall_s"] > 0 and row["rss_mib"] > 0
    assert row["cpu_us_per_request"] == pytest.approx(row["cpu_s"] / 200 * 1e6)
    assert row["events_per_request"] > 1 and row["iterations_per_request"] > 1
    assert row["simulated_s"] > 0
    # the child counted what a run in this process counts
    here = run_one("colocated", 200)
    assert row["events"] == here["events"] and row["iterations"] == here["iterations"]
    assert row["events_per_request"] == here["events"] / 200
    assert row["simulated_s"] == here["simulated_s"]


def test_vs_fills_the_placeholders_and_gives_a_ratio(capsys, tmp_path):
    # B checks what it was given: the CSV has {n} rows and {config} is the name;
    # {n} counts the requests within the context, those the twin serves
    check = (
        "import csv, sys; rows = list(csv.DictReader(open(sys.argv[1]))); "
        "sys.exit(0 if len(rows) == int(sys.argv[2]) and sys.argv[3] == 'split' else 5)"
    )
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(check)} {{requests_csv}} {{n}} {{config}}"
    out_json = tmp_path / "bench.json"
    code = main(
        ["bench", "--sizes", "150", "--config", "split", "--repeat", "1", "--vs", cmd]
        + ["--json", str(out_json)]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "B/A CPU" in out and "split" in out and f"B: {cmd}" in out
    (row,) = json.loads(out_json.read_text())["rows"]
    v = row["vs"]
    assert v["requests"] == len(list(bench_requests("split", 150))) < 150
    assert f"B was handed the {v['requests']:,} requests within the model's context" in out
    assert v["pairs"] == 1 and len(v["runs"]) == 1 and len(row["raw"]) == 1
    assert v["cpu_s"] > 0 and v["wall_s"] > 0
    assert v["cpu_ratio"] == pytest.approx(v["cpu_s"] / row["cpu_s"])
    assert v["wall_ratio"] == pytest.approx(v["wall_s"] / row["wall_s"])
    # a bare interpreter's peak, not this process's (which has imported the twin)
    assert 0 < v["rss_mib"] < row["rss_mib"]


def test_vs_command_quotes_the_path():
    cmd = vs_command("peer {config} {requests_csv} --n {n}", Path("/tmp/a b/r.csv"), 10, "split")
    assert shlex.split(cmd) == ["peer", "split", "/tmp/a b/r.csv", "--n", "10"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sizes", "10q"], "--sizes: '10q' is not a request count"),
        (["--config", "disagg"], "--config: 'disagg' is not a configuration"),
        (["--repeat", "0"], "--repeat: 0 must be >= 1"),
        (["--sizes", "10", "--vs", " "], "--vs: the command is empty"),
        (["--sizes", "10", "--vs", "exit 3", "--config", "colocated"], "exited with status 3"),
        (
            ["--json", "/nonexistent/dir/x.json"],
            "'/nonexistent/dir/x.json': no folder '/nonexistent/dir'",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code = main(["bench", *args])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("twin: error: ") and message in err


@pytest.mark.parametrize(("given", "want"), [(None, "1 -"), ("3", "3 3")])
def test_a_twin_process_asks_for_one_blas_thread_unless_told(given, want):
    """Before numpy loads, a twin process asks OpenBLAS for one thread (its
    pool only spins in a run); a count in the user's environment stands, and
    :func:`user_env` gives the environment as the user gave it."""
    import os
    import subprocess

    code = (
        "import os; from twin._threads import one_blas_thread, user_env; one_blas_thread(); "
        "import numpy; one_blas_thread(); "
        "print(os.environ['OPENBLAS_NUM_THREADS'], user_env().get('OPENBLAS_NUM_THREADS', '-'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == want.split()


def test_vs_runs_in_the_environment_the_user_gave(monkeypatch):
    """The one-thread setting is the twin's own: the other command does not get it."""
    import twin._threads

    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    monkeypatch.setattr(twin._threads, "_set_here", True)
    check = "import os, sys; sys.exit(5 if 'OPENBLAS_NUM_THREADS' in os.environ else 0)"
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(check)}"
    code = main(["bench", "--sizes", "50", "--config", "colocated", "--repeat", "1", "--vs", cmd])
    assert code == 0  # a command that fails is an error (exit 2)
