"""``data:`` paths: bundled experiments read the public data folder ($TWIN_DATA,
else ./shared/data, else ../shared/data) and say how to point at it when it is
missing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from twin.bundled import data_path, find_data_dir
from twin.cli import main
from twin.errors import SpecError

CONV = "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
CODE = "traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv"


def fake_trace(root: Path, rel: str, rows: int) -> Path:
    """A tiny Azure-format trace of ``rows`` requests, one a second."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:15:{10 + i:02d}.0000000,{100 + i},{5 + i}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_bundled_experiment_reads_its_trace_from_twin_data(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    trace = fake_trace(data, CONV, 4)
    monkeypatch.setenv("TWIN_DATA", str(data))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r.json"
    assert main(["run", "azure-conv", "--json", str(out), "-q"]) == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["summary"]["requests"] == 4  # the fake trace's rows, not the real trace's
    sha = hashlib.sha256(trace.read_bytes()).hexdigest()
    assert doc["header"]["trace_sha256"] == {trace.name: sha}
    # the spec records the data: path, not where the data lies on this machine
    assert doc["header"]["spec"]["workload"]["trace"] == f"data:{CONV}"


def test_twin_data_comes_first_then_dot_then_dot_dot(tmp_path, monkeypatch):
    env, here = tmp_path / "env", tmp_path / "work"
    fake_trace(env, CONV, 1)
    fake_trace(here / "shared" / "data", CONV, 1)
    (here / "sub").mkdir()
    monkeypatch.setenv("TWIN_DATA", str(env))
    monkeypatch.chdir(here)
    assert data_path(f"data:{CONV}", "x.yaml: workload.trace") == env / CONV
    monkeypatch.delenv("TWIN_DATA")
    assert data_path(f"data:{CONV}", "w") == here / "shared" / "data" / CONV
    monkeypatch.chdir(here / "sub")
    assert data_path(f"data:{CONV}", "w") == here / "shared" / "data" / CONV
    assert find_data_dir(None) == here / "shared" / "data"


def test_a_missing_data_folder_says_how_to_point_at_it(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TWIN_DATA", raising=False)
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert main(["run", "azure-conv"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("twin: error: azure-conv.yaml: workload.trace: 'data:traces/")
    assert "no data folder ($TWIN_DATA unset" in err
    assert err.rstrip().endswith("set TWIN_DATA=DIR or --set workload.trace=PATH")


def test_a_missing_file_in_the_data_folder_names_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TWIN_DATA", str(tmp_path))
    assert main(["run", "mooncake-conv"]) == 2
    err = capsys.readouterr().err
    missing = tmp_path / "traces/mooncake_fast25/conversation_trace.jsonl"
    assert f"no such file {missing} (data folder $TWIN_DATA={tmp_path})" in err
    assert err.count("\n") == 1 and "--set workload.trace=PATH" in err


def test_a_missing_plain_trace_says_how_to_point_at_it(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("model: llama-2-7b\nworkload: {trace: nope.csv}\n")
    assert main(["run", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"s.yaml: workload.trace: {tmp_path / 'nope.csv'}: no such file" in err
    assert "--set workload.trace=PATH" in err and err.count("\n") == 1


@pytest.mark.parametrize("value", ["data:", "data:  "])
def test_an_empty_data_path_is_refused(value):
    with pytest.raises(SpecError, match="expected data:RELATIVE/PATH"):
        data_path(value, "w.trace")


def test_a_sweep_over_data_paths_expands_with_twin_data(tmp_path, monkeypatch):
    from twin.sim.spec import parse_yaml, read_spec_text
    from twin.studies.sweep import apply_sweep_overrides, expand

    fake_trace(tmp_path, CONV, 2)
    fake_trace(tmp_path, CODE, 2)
    monkeypatch.setenv("TWIN_DATA", str(tmp_path))
    text, where, base_dir = read_spec_text("pool-ratio")
    data = parse_yaml(text, where)
    # one rate and SLO pair: the traces x deployments, not all 900 runs
    one = ["sweep.workload.rate_scale=[1.0]", "sweep.slo.ttft=[1 s]", "sweep.slo.tpot=[50 ms]"]
    apply_sweep_overrides(data, one)
    _, runs = expand(data, where, base_dir)
    assert len(runs) == 2 * 5
    assert {r.params["workload.trace"] for r in runs} == {f"data:{CONV}", f"data:{CODE}"}


FIT = "profiles/distserve/profiler-a100-80g.distserve.json"


def test_a_perf_table_reads_from_the_data_folder(tmp_path, monkeypatch, capsys):
    fit = tmp_path / "data" / FIT
    fit.parent.mkdir(parents=True)
    flat = [20.0, 0.0, 0.0]
    coeffs = {"decoding_large_small_bs_threshold": 95, "prefill": [10.0, 0.1, 0.0],
              "decoding_smallbs": flat, "decoding_largebs": flat}  # fmt: skip
    fit.write_text(json.dumps({"facebook/opt-13b": {"1": coeffs}}))
    monkeypatch.setenv("TWIN_DATA", str(tmp_path / "data"))
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "model: opt-13b\ncluster: {topology: dgx-a100-ib200, nodes: 1, instances: 1, tp: 1}\n"
        f"perf: {{kind: distserve, path: 'data:{FIT}',"
        " overhead: 0 s, token_overhead: 0 s, prefill_overhead: 0 s}\n"
        "workload: {lengths: {prompt: {dist: fixed, value: 100}, output: {dist: fixed, value: 3}},"
        " arrival: {process: poisson, rate: 0.001}, max_requests: 1}\n"
    )
    out = tmp_path / "r.json"
    assert main(["run", str(spec), "--json", str(out), "-q"]) == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    # the spec records the data: path; the header, the table's hash
    assert doc["header"]["spec"]["perf"]["path"] == f"data:{FIT}"
    assert doc["header"]["profile_sha256"] == hashlib.sha256(fit.read_bytes()).hexdigest()
    # prefill 10 + 0.1 x 100 = 20 ms, two decode steps of 20 ms
    assert doc["summary"]["ttft_s"]["p50"] == pytest.approx(0.020, rel=1e-6)
    assert doc["summary"]["e2e_s"]["p50"] == pytest.approx(0.060, rel=1e-6)
    assert main(["run", str(spec), "--set", "perf.path=data:profiles/none.json", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"twin: error: {spec}: perf.path: 'data:profiles/none.json': no such")
