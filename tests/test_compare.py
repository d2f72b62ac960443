"""Compare specs: several policies on one trace and seed, one table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from helpers import own_policies

import schedulers.colocated  # registers the built-ins when not installed
import schedulers.disagg
import schedulers.distserve
import schedulers.splitwise  # noqa: F401
from twin.cli import main
from twin.sim.spec import parse_yaml, read_spec_text
from twin.studies.compare import compare_entries, compare_specs, run_compare

REPO = Path(__file__).resolve().parent.parent
LABELS = ["colocated", "disagg", "distserve", "splitwise"]
TINY = {
    "name": "tiny",
    "seed": 1,
    "model": "llama-3.1-8b",
    "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "tp": 2, "prefill": 2, "decode": 2},
    "workload": {
        "lengths": "azure-conv",
        "arrival": {"process": "poisson", "rate": 20},
        "max_requests": 50,
    },
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
    "compare": {
        "colocated": {
            "scheduler": "colocated",
            "cluster.instances": 4,
            "cluster.prefill": None,
            "cluster.decode": None,
        },
        "disagg": {"scheduler": "disagg"},
        "distserve": {"scheduler": "distserve", "transfer.handoff": "pull"},
        "splitwise": {"scheduler": "splitwise"},
    },
}


def write_spec(tmp_path: Path, data: dict, name: str = "tiny.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    return [line.split() for line in lines[start:] if line.strip()]


def test_one_table_one_row_per_label_same_requests(capsys, tmp_path):
    code, out, err = run_cli(capsys, "run", write_spec(tmp_path, TINY))
    assert code == 0, err
    assert out.count("label") == 1 and "TTFT p50" in out and "KV GiB" in out
    rows = table_rows(out)
    assert [r[0] for r in rows] == LABELS
    assert [r[1] for r in rows] == LABELS  # each entry's scheduler
    assert {r[2] for r in rows} == {"8"}  # GPUs: 4 x TP2 either way
    assert {r[3] for r in rows} == {"50"}  # requests: the same trace for all
    kv = {r[0]: float(r[-1]) for r in rows}
    assert kv["colocated"] == 0.0 and all(kv[k] > 0 for k in LABELS[1:])


def test_json_holds_the_shared_header_and_every_run(capsys, tmp_path):
    path = tmp_path / "out.json"
    code, _, err = run_cli(capsys, "run", write_spec(tmp_path, TINY), "--json", str(path), "-q")
    assert code == 0, err
    doc = json.loads(path.read_text())
    assert list(doc) == ["header", "runs"]
    h = doc["header"]
    assert h["tool"] == "pd-twin" and h["name"] == "tiny" and h["seed"] == 1
    assert h["labels"] == LABELS and list(doc["runs"]) == LABELS
    assert h["spec"]["compare"] == TINY["compare"]
    for label, run in doc["runs"].items():
        assert set(run) == {"header", "summary", "instances", "links", "timeline"}
        assert run["header"]["spec"]["name"] == f"tiny/{label}"
        assert run["header"]["spec"]["scheduler"]["name"] == label
        assert run["summary"]["requests"] == 50
    roles = {r["role"] for r in doc["runs"]["colocated"]["instances"]}
    assert roles == {"mixed"}


def test_runs_are_deterministic(capsys, tmp_path):
    spec = write_spec(tmp_path, TINY)
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for p in paths:
        assert run_cli(capsys, "run", spec, "--json", str(p), "-q")[0] == 0
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_null_deletes_a_key_and_entries_override_the_base():
    base, specs = compare_specs(TINY, "tiny.yaml", Path.cwd())
    assert base == TINY  # the caller's data is left as it was
    colocated = specs["colocated"].resolved["cluster"]
    assert "prefill" not in colocated and colocated["instances"] == 4
    assert [g.role for g in specs["colocated"].groups] == ["mixed"]
    assert [g.role for g in specs["disagg"].groups] == ["prefill", "decode"]
    assert specs["distserve"].transfer.handoff == "pull"
    assert specs["splitwise"].transfer.handoff == "push"
    # deleting below a key that is not there creates nothing
    data = {**TINY, "compare": {"x": {"scheduler": "colocated", "perf.mfu": None}}}
    _, specs = compare_specs(data, "tiny.yaml", Path.cwd())
    assert specs["x"].resolved["perf"] == {"kind": "roofline"}


def test_set_applies_to_the_base_before_the_entries(capsys, tmp_path):
    sets = ["--set", "workload.max_requests=20", "--set", "scheduler=disagg"]
    code, out, err = run_cli(capsys, "run", write_spec(tmp_path, TINY), *sets)
    assert code == 0, err
    rows = table_rows(out)
    assert {r[3] for r in rows} == {"20"}
    assert [r[1] for r in rows] == LABELS  # the entries' schedulers win


def test_only_runs_a_subset_in_the_spec_order():
    result = run_compare(TINY, "tiny.yaml", Path.cwd(), only=["splitwise", "colocated"])
    assert list(result.runs) == ["colocated", "splitwise"]
    assert result.header["labels"] == ["colocated", "splitwise"]


def bad(entry: dict) -> dict:
    return {**TINY, "compare": {**TINY["compare"], "broken": entry}}


@pytest.mark.parametrize(
    ("data", "args", "message"),
    [
        (
            bad({"scheduler": "splitwse"}),
            [],
            r"tiny\.yaml: compare\.broken: scheduler: unknown scheduler 'splitwse'\. "
            r"Did you mean 'splitwise'\?",
        ),
        (
            bad({"cluster.tp": 0}),
            [],
            r"tiny\.yaml: compare\.broken: cluster\.tp: 0 must be a positive integer",
        ),
        (
            bad({"scheduler": "disagg", "workload.max_requests": 5}),
            [],
            r"compare\.broken: workload\.max_requests: the entries share the base spec's "
            r"name, seed, workload, slo",
        ),
        (bad(["scheduler", "disagg"]), [], r"compare\.broken: \['scheduler', 'disagg'\] must be"),
        (bad({"scheduler.": "disagg"}), [], r"compare\.broken: 'scheduler\.' is not a key path"),
        ({**TINY, "compare": {}}, [], r"compare: \{\} must be a non-empty mapping"),
        (TINY, ["--only", "disagg,splitwize"], r"compare: no entry 'splitwize'; the entries are"),
    ],
)
def test_bad_entries_name_the_label_and_exit_2(capsys, tmp_path, data, args, message):
    code, out, err = run_cli(capsys, "run", write_spec(tmp_path, data), *args)
    assert code == 2 and out == ""
    assert err.startswith("twin: error: ") and err.count("\n") == 1
    assert re.search(message, err), err


SMALL = {**TINY, "workload": {**TINY["workload"], "max_requests": 12}}


def test_per_run_files_are_written_once_per_entry_named_by_label(capsys, tmp_path):
    spec = write_spec(tmp_path, SMALL)
    only = ["--only", "colocated,splitwise"]
    outs = ["--requests-csv", str(tmp_path / "req.csv"), "--timeline-csv"]
    outs += [str(tmp_path / "tl.csv"), "--trace-out", str(tmp_path / "tr.json")]
    code, _, err = run_cli(capsys, "run", spec, *only, *outs, "--json", str(tmp_path / "c.json"))
    assert code == 0, err
    runs = json.loads((tmp_path / "c.json").read_text())["runs"]
    for label in ("colocated", "splitwise"):
        rows = (tmp_path / f"req-{label}.csv").read_text().splitlines()
        assert len(rows) == 1 + runs[label]["summary"]["requests"]
        assert (tmp_path / f"tl-{label}.csv").read_text().startswith("start_s,end_s,")
        assert json.loads((tmp_path / f"tr-{label}.json").read_text())["traceEvents"]
    assert not (tmp_path / "req.csv").exists() and not (tmp_path / "req-disagg.csv").exists()


def test_set_compare_null_runs_the_base_alone(capsys, tmp_path):
    spec = write_spec(tmp_path, SMALL)
    sets = ["--set", "compare=null", "--set", "scheduler=disagg"]
    code, out, err = run_cli(capsys, "run", spec, *sets, "--json", "-")
    assert code == 0, err
    doc = json.loads(out)
    assert "runs" not in doc and doc["summary"]["requests"] == 12
    assert doc["header"]["spec"]["scheduler"]["name"] == "disagg"


def test_run_compare_takes_the_forms_twin_run_takes(tmp_path):
    import twin

    path = write_spec(tmp_path, SMALL)
    by_path = twin.run_compare(path, only=["splitwise"])
    by_mapping = twin.run_compare(SMALL, only=["splitwise"])
    by_keyword = twin.run_compare(spec=Path(path), overrides=["seed=1"], only=["splitwise"])
    sums = [r.runs["splitwise"].summary["ttft_s"] for r in (by_path, by_mapping, by_keyword)]
    assert sums[0] == sums[1] == sums[2]
    with pytest.raises(twin.SpecError, match="a loaded spec has no compare: section"):
        twin.run_compare(twin.load_spec("quickstart"))


def test_only_needs_a_compare_spec(capsys):
    code, _, err = run_cli(capsys, "run", "--only", "colocated")
    assert code == 2 and "--only: picks entries of a compare spec; quickstart.yaml" in err


BUNDLED = {
    "compare-azure-conv": "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
    "compare-mooncake": "traces/mooncake_fast25/conversation_trace.jsonl",
}
POLICIES = ["colocated", "distserve", "splitwise", "mooncake"]


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_compare_specs_list_all_four_policies(name):
    text, where, _ = read_spec_text(name)
    data = parse_yaml(text, where)
    entries = compare_entries(data, where)
    assert list(entries) == POLICIES
    assert [e["scheduler"] for e in entries.values()] == POLICIES
    assert entries["mooncake"]["engine.prefix_caching"] is True
    assert entries["colocated"]["cluster.prefill"] is None
    # every registered policy resolves on a synthetic stand-in for the trace
    synthetic = (
        "workload={lengths: azure-conv, max_requests: 5, arrival: {process: poisson, rate: 1}}"
    )
    only = [p for p in POLICIES if p in own_policies()]
    _, specs = compare_specs(data, where, REPO, [synthetic], only=only)
    gpus = {sum(g.count * g.tp * g.pp for g in s.groups) for s in specs.values()}
    assert gpus == {32}


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_compare_specs_run_on_a_slice_of_the_trace(shared_data, name):
    text, where, _ = read_spec_text(name)
    data = parse_yaml(text, where)
    sets = [f"workload.trace={shared_data / BUNDLED[name]}", "workload.max_requests=60"]
    # `mooncake` is registered by its own module; until then the other three run
    only = [p for p in POLICIES if p in own_policies()]
    result = run_compare(data, where, REPO, sets, only=only)
    assert list(result.runs) == only and len(only) >= 3
    assert {r.summary["requests"] for r in result.runs.values()} == {60}
    assert len(result.header["trace_sha256"]) == 1
    table = result.format_table()
    assert all(re.search(rf"^{p}\s", table, re.M) for p in only)


def test_plot_reads_a_compare_file_per_entry_and_draws_no_empty_panel(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    from twin.viz.compare import compare_figure

    spec, doc = write_spec(tmp_path, SMALL), tmp_path / "c.json"
    only = ["--only", "colocated,splitwise", "--quiet"]
    assert run_cli(capsys, "run", spec, *only, "--json", str(doc))[0] == 0
    code, out, err = run_cli(capsys, "plot", "--timeline", str(doc), "--out", str(tmp_path))
    assert code == 0, err
    names = {Path(p).name for p in out.split()}
    assert {"c-colocated-over-time.png", "c-splitwise-over-time.png"} <= names
    code, out, err = run_cli(capsys, "plot", "--compare", str(doc), "--out", str(tmp_path))
    assert code == 0, err
    names = {Path(p).name for p in out.split()}
    assert "c-compare.png" in names and not any("kv-tiers" in n for n in names)
    assert "no run reused prompt tokens" in err
    runs = json.loads(doc.read_text())["runs"]
    att, ttft, _ = compare_figure(runs).axes[:3]
    bars = [b.get_height() for b in att.containers[0]]
    assert bars == [100 * runs[x]["summary"]["slo_attainment"] for x in runs]
    p99 = [b.get_height() for b in ttft.containers[1]]
    assert p99 == [runs[x]["summary"]["ttft_s"]["p99"] for x in runs] and min(p99) > 0
