"""The command line: what a user sees, including every kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import schedulers.colocated  # noqa: F401 - registers the built-ins when not installed
from twin.cli import main

FAST = ["--set", "workload.max_requests=150"]


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_default_run_prints_a_summary(capsys):
    code, out, err = run_cli(capsys, "run", *FAST)
    assert code == 0, err
    assert "TTFT (s)" in out and "SLO attainment" in out and "quickstart" in out


def test_json_is_byte_identical_across_runs(capsys, tmp_path):
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    csvs = [tmp_path / "a.csv", tmp_path / "b.csv"]
    for p, c in zip(paths, csvs, strict=True):
        assert (
            run_cli(capsys, "run", *FAST, "--json", str(p), "--requests-csv", str(c), "-q")[0] == 0
        )
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert csvs[0].read_bytes() == csvs[1].read_bytes()
    doc = json.loads(paths[0].read_text())
    assert doc["summary"]["requests"] == 150
    assert doc["header"]["spec"]["workload"]["max_requests"] == 150
    assert len(csvs[0].read_text().splitlines()) == 151


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["run", "--set", "cluster.tp=0"],
            r"quickstart\.yaml: cluster\.tp: 0 must be a positive integer",
        ),
        (
            ["run", "--set", "scheduler.name=colocatd"],
            r"unknown scheduler 'colocatd'\. Did you mean 'colocated'",
        ),
        (["run", "--set", "model=lama-2-70b"], r"unknown model 'lama-2-70b'.*llama-2-70b"),
        (["run", "--set", "gpu=h1000"], r"unknown gpu 'h1000'"),
        (["run", "--set", "slo.ttft=1 parsec"], r"slo\.ttft: '1 parsec' is not a duration"),
        (["run", "--set", "clustr.tp=2"], r"unknown key .*'clustr'.*cluster"),
        (
            ["run", "--set", "engine.oversized=maybe"],
            r"engine\.oversized: 'maybe'; expected one of error, reject",
        ),
        (["run", "no-such-experiment"], r"unknown experiment 'no-such-experiment'.*quickstart"),
        (["run", "missing.yaml"], r"missing\.yaml: no such experiment spec file"),
        (["kv", "llama-2-70"], r"unknown model 'llama-2-70'"),
        (
            [
                "run",
                "--set",
                "gpu={name: x, flops_bf16: 1e15, hbm_bytes_s: 1e12, "
                "memory_bytes: 80 GiB, tdp_w: 500, sustained_clock: 2}",
            ],
            r"quickstart\.yaml: gpu\.sustained_clock: 2 must be a share of the clock in \(0, 1\]",
        ),  # fmt: skip
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(capsys, args, message):
    code, out, err = run_cli(capsys, *args)
    assert code == 2
    assert err.startswith("twin: error: ") and err.count("\n") == 1
    assert __import__("re").search(message, err), err


def test_bad_yaml_names_the_file_and_line(capsys, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("model: llama-2-70b\ncluster: [1, 2\n")
    code, _, err = run_cli(capsys, "run", str(spec))
    assert code == 2 and "bad.yaml: not valid YAML (line" in err


def test_missing_model_is_named(capsys, tmp_path):
    spec = tmp_path / "nomodel.yaml"
    spec.write_text(
        "workload: {lengths: azure-conv, arrival: {process: poisson, rate: 1}, max_requests: 5}\n"
    )
    code, _, err = run_cli(capsys, "run", str(spec))
    assert code == 2 and "nomodel.yaml: model: missing" in err


def test_a_bad_trace_names_file_line_and_value(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:45.0000000,396,109\n"
    )
    spec = tmp_path / "s.yaml"
    spec.write_text(f"model: llama-2-7b\nworkload: {{trace: {trace.name}}}\n")
    code, _, err = run_cli(capsys, "run", str(spec))
    assert code == 2
    assert "t.csv" in err and "3" in err and "TIMESTAMP" in err, err


def test_kv_prints_exact_bytes(capsys):
    code, out, _ = run_cli(capsys, "kv", "llama-2-70b", "--tokens", "1000")
    assert code == 0
    assert "327,680" in out or "327680" in out
    assert "1008" in out or "1,008" in out


def test_schedulers_lists_colocated(capsys):
    code, out, _ = run_cli(capsys, "schedulers")
    assert code == 0 and out.startswith("colocated")


def test_real_process_exits_2_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "twin.cli", "run", "--set", "cluster.instances=-1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "cluster.instances: -1 must be a positive integer" in proc.stderr


def test_a_spec_written_from_the_readme_runs(capsys, tmp_path):
    spec = tmp_path / "custom.yaml"
    spec.write_text(
        "model: {name: my-7b, layers: 32, hidden: 4096, heads: 32, kv_heads: 8, head_dim: 128,\n"
        "        intermediate: 14336, vocab: 128256, params: 8.0e9, dtype_bytes: 2}\n"
        "gpu: {name: mygpu, flops_bf16: 989 TFLOPS, hbm_bytes_s: 3.35 TB/s, memory_bytes: 80 GiB,\n"
        "      tdp_w: 700 W, nvlink_bytes_s: 450 GB/s, pcie_bytes_s: 64 GB/s}\n"
        "cluster: {gpus: 4, tp: 2}\n"
        "engine: {chunked_prefill: true}\n"
        "workload:\n"
        "  arrival: {process: gamma, rate: 20.0, cv: 2.0}\n"
        "  lengths:\n"
        "    prompt: {dist: lognormal, median: 1020, sigma: 1.0, min: 2, max: 14050}\n"
        "    output: {dist: fixed, value: 128}\n"
        "  duration: 10 s\n"
        "slo: {ttft: 500 ms, tpot: 30 ms}\n"
    )
    out = tmp_path / "r.json"
    code, text, err = run_cli(capsys, "run", str(spec), "--json", str(out))
    assert code == 0, err
    assert "my-7b, 2 x TP2 on mygpu" in text
    s = json.loads(out.read_text())["summary"]
    assert s["requests"] == s["completed"] > 100
    assert s["tpot_s"]["p50"] < 0.03


HEAVY = (
    "scipy", "matplotlib", "dask", "pandas", "pyarrow", "tqdm", "networkx", "numpy",
    "importlib.metadata",  # tens of ms; only --version and plugin lookup need it
)  # fmt: skip
# What no command may load before it has work to do: plotting, frames, progress
# bars, the Dask client, the fitting library.
NEVER_AT_START = {"scipy", "matplotlib", "dask", "pandas", "pyarrow", "tqdm"}


def _modules_after(code: str, prefix: str = "") -> list[str]:
    """The heavy modules (or, with ``prefix``, those whose names start with it)
    a fresh interpreter holds after ``code``."""
    pick = f"m.startswith({prefix!r})" if prefix else f"m in {HEAVY!r}"
    probe = f"import sys\n{code}\nprint(sorted(m for m in list(sys.modules) if {pick}))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1].replace("'", '"'))


def _cli(*argv: str) -> str:
    """Code that runs ``twin ARGV`` in-process, exits included."""
    return (
        "from twin.cli import main\n"
        f"try:\n    code = main({list(argv)!r})\nexcept SystemExit as e:\n    code = e.code\n"
    )


def test_the_cli_starts_lean(tmp_path):
    # building the parser (twin --help) and checking a bad spec load none of them
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbogus: 1\n")
    assert _modules_after("import twin.cli") == []
    assert _modules_after("import twin.cli; twin.cli.build_parser()") == []
    assert _modules_after(_cli("--help")) == []
    # the plugin lookup and simpy (which reads its own version) need importlib.metadata
    for argv in (["schedulers"], ["run", str(bad)], ["run", "/nonexistent.yaml"]):
        assert set(_modules_after(_cli(*argv))) <= {"importlib.metadata"}, argv
    code = f"from twin.cli import main\nassert main(['run', {str(bad)!r}]) == 2"
    assert set(_modules_after(code)) <= {"importlib.metadata"}
    # the parser alone pulls in no simulation layer
    twin_modules = set(_modules_after("import twin.cli; twin.cli.build_parser()", "twin"))
    twin_modules = {m for m in twin_modules if not m.startswith("twin.cli.")}  # its commands
    assert twin_modules <= {
        "twin", "twin._io", "twin._threads", "twin._version", "twin.cli", "twin.errors",
        "twin.units", "twin.sim", "twin.sim.summary", "twin.studies", "twin.studies.samples",
    }, twin_modules  # fmt: skip
    # a good spec (twin spec resolves it: scheduler built, topology loaded) may
    # need networkx, never the numerics and plotting libraries
    assert not set(_modules_after(_cli("spec", "quickstart"))) & NEVER_AT_START
    code = "from twin.cli import main\nassert main(['spec', 'disagg']) == 0"
    assert set(_modules_after(code)) <= {"networkx", "numpy", "importlib.metadata"}
