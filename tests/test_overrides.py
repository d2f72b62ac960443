"""--set key=null, compare entries that override --set, the summary header of an
inline topology, and sweeps' --traces (and the notes sweeps and goodput print)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from twin.cli import main
from twin.sim.spec import apply_overrides

BASE = {
    "name": "over",
    "model": "llama-3.1-8b",
    "cluster": {"instances": 1, "tp": 1},
    "engine": {"block_size": 32, "max_num_seqs": 64},
    "workload": {
        "lengths": "azure-conv",
        "arrival": {"process": "poisson", "rate": 2.0},
        "max_requests": 10,
    },
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}


def _spec(tmp_path: Path, data: dict, name: str = "spec.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _resolved(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)["spec"]


# -- --set key=null ------------------------------------------------------------------
def test_set_null_removes_the_key_so_its_default_applies(tmp_path, capsys):
    spec = _spec(tmp_path, BASE)
    given = _resolved(capsys, ["spec", spec])
    assert given["engine"]["block_size"] == 32
    nulled = _resolved(capsys, ["spec", spec, "--set", "engine.block_size=null"])
    assert nulled["engine"]["block_size"] == 16  # EngineConfig's default
    without = {**BASE, "engine": {"max_num_seqs": 64}}
    assert nulled == _resolved(capsys, ["spec", _spec(tmp_path, without, "without.yaml")])
    # the run uses the default too: 16-token blocks
    assert main(["run", spec, "--set", "engine.block_size=null", "--json", "-", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["header"]["spec"]["engine"]["block_size"] == 16


def test_set_null_in_place():
    data = {"a": {"b": 1, "c": 2}, "scheduler": "colocated"}
    apply_overrides(data, ["a.b=null", "x.y.z=null", "scheduler.name=null"])
    assert data == {"a": {"c": 2}, "scheduler": {}}  # nothing made for x.y.z
    apply_overrides(data, ["a=null"])
    assert data == {"scheduler": {}}


def test_set_null_of_a_required_key_reads_as_missing(tmp_path, capsys):
    assert main(["spec", _spec(tmp_path, BASE), "--set", "workload=null"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and err.count("\n") == 1 and "workload" in err


# -- compare: entries that override --set --------------------------------------------
COMPARE = {
    **BASE,
    "compare": {
        "one": {},
        "two": {"cluster.instances": 2, "scheduler": "colocated"},
        "three": {"cluster": {"instances": 3, "tp": 1}},
    },
}


def test_compare_entry_overriding_a_set_key_warns_once_per_key(tmp_path, capsys):
    spec = _spec(tmp_path, COMPARE)
    argv = ["run", spec, "--set", "cluster.instances=4", "--set", "scheduler.routing=round_robin"]
    assert main([*argv, "-q"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "twin: warning: compare entry 'two' overrides --set cluster.instances=4 "
        "with cluster.instances=2",
        "twin: warning: compare entry 'two' overrides --set scheduler.routing=round_robin "
        "with scheduler=colocated",
        "twin: warning: compare entry 'three' overrides --set cluster.instances=4 "
        "with cluster={instances: 3, tp: 1}",
    ]
    # the entries win: one runs 4 instances (the --set), two 2, three 3
    assert main([*argv, "--json", "-", "-q"]) == 0
    out, err2 = capsys.readouterr()
    runs = json.loads(out)["runs"]
    counts = {k: r["header"]["spec"]["cluster"]["groups"][0]["instances"] for k, r in runs.items()}
    assert counts == {"one": 4, "two": 2, "three": 3}
    # --only: only the entries that run are told about
    assert main([*argv, "--only", "one,three", "-q"]) == 0
    assert capsys.readouterr().err.count("twin: warning:") == 1


def test_compare_without_overlap_says_nothing(tmp_path, capsys):
    spec = _spec(tmp_path, COMPARE)
    assert main(["run", spec, "--set", "engine.max_num_seqs=32", "-q"]) == 0
    assert capsys.readouterr().err == ""


# -- the summary header --------------------------------------------------------------
INLINE = {
    "name": "inline-topo",
    "model": "llama-3.1-8b",
    "cluster": {
        "topology": {
            "name": "h100x2",
            "node": {"gpu": "h100-sxm", "gpus": 2, "intra": {"kind": "nvswitch",
                                                             "bandwidth": "450 GB/s"}},
            "nodes": 1,
        },
        "prefill": 1,
        "decode": 1,
    },
    "scheduler": "disagg",
    "workload": {
        "lengths": "azure-conv",
        "arrival": {"process": "poisson", "rate": 2.0},
        "max_requests": 10,
    },
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}  # fmt: skip


def test_the_summary_header_names_an_inline_topology(tmp_path, capsys):
    assert main(["run", _spec(tmp_path, INLINE)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert " on h100x2 (inline) | scheduler disagg" in first and "{" not in first
    unnamed = {**INLINE, "cluster": {**INLINE["cluster"]}}
    unnamed["cluster"]["topology"] = {
        k: v for k, v in INLINE["cluster"]["topology"].items() if k != "name"
    }
    assert main(["run", _spec(tmp_path, unnamed, "unnamed.yaml")]) == 0
    assert " on an inline topology | " in capsys.readouterr().out.splitlines()[0]
    # a bundled topology reads as before: by its name
    bundled = {**INLINE, "cluster": {**INLINE["cluster"], "topology": "dgx-h100-box"}}
    assert main(["run", _spec(tmp_path, bundled, "bundled.yaml")]) == 0
    assert " on dgx-h100-box | " in capsys.readouterr().out.splitlines()[0]


# -- sweeps: --traces, and the notes -------------------------------------------------
SWEEP = {**BASE, "sweep": {"workload.arrival.rate": [1.0, 4.0]}}


def test_sweep_traces_writes_a_chrome_trace_per_run(tmp_path, capsys):
    spec = _spec(tmp_path, SWEEP)
    plain = tmp_path / "plain"
    assert main(["sweep", spec, "-j", "1", "--out", str(plain)]) == 0
    out, err = capsys.readouterr()
    assert "no timeline" not in err  # no note about the traces it was not asked for
    assert not (plain / "traces").exists() and not (plain / "plots" / "timeline.png").exists()
    out_dir = tmp_path / "traced"
    assert main(["sweep", spec, "-j", "1", "--out", str(out_dir), "--traces"]) == 0
    out, err = capsys.readouterr()
    ids = [json.loads(p.read_text())["header"]["spec_sha256"][:12] for p in
           sorted((out_dir / "runs").glob("*.json"))]  # fmt: skip
    traces = sorted((out_dir / "traces").glob("*.json"))
    assert sorted(p.stem for p in traces) == sorted(ids) and len(ids) == 2
    for p in traces:
        doc = json.loads(p.read_text())
        run = json.loads((out_dir / "runs" / p.name).read_text())
        spans = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "lifetime"]
        assert sum(1 for _ in spans) >= run["instances"][0]["iterations"] > 0
    assert (out_dir / "plots" / "timeline.png").is_file()
    # the same bytes on a second sweep; a done run missing its trace is run again
    first = {p.name: p.read_bytes() for p in traces}
    traces[0].unlink()
    assert main(["sweep", spec, "-j", "1", "--out", str(out_dir), "--traces", "--no-plots"]) == 0
    assert "(1 run, 1 already done)" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in (out_dir / "traces").glob("*.json")} == first


def test_goodput_writes_no_notes_about_outputs_it_never_makes(tmp_path, capsys):
    spec = _spec(tmp_path, {**BASE, "sweep": {"slo.ttft": ["1 s", "2 s"]}})
    args = ["goodput", spec, "-j", "1", "--seeds", "1", "--rel-tol", "0.5"]
    assert main([*args, "--out", str(tmp_path / "g")]) == 0
    out, err = capsys.readouterr()
    assert "goodput.png" in out
    for note in ("no timeline", "no attainment plot", "no CDFs"):  # it writes goodput.csv only
        assert note not in err, err


# -- list items in --set (and in compare entries) -------------------------------------
CLASSED = {
    **BASE,
    "workload": {
        **BASE["workload"],
        "classes": [
            {"name": "interactive", "share": 0.7, "slo": {"ttft": "1 s"}},
            {"name": "batch", "share": 0.3},
        ],
    },
}


def test_set_indexes_a_list_by_position(tmp_path, capsys):
    spec = _spec(tmp_path, CLASSED)
    dotted = _resolved(capsys, ["spec", spec, "--set", "workload.classes.0.share=0.4",
                                "--set", "workload.classes.1.slo.ttft=30 s"])  # fmt: skip
    bracketed = _resolved(capsys, ["spec", spec, "--set", "workload.classes[0].share=0.4",
                                   "--set", "workload.classes[1].slo={ttft: 30 s}"])  # fmt: skip
    assert dotted == bracketed
    classes = dotted["workload"]["classes"]
    assert [c["share"] for c in classes] == [0.4, 0.3]
    assert classes[1]["slo"] == {"ttft": "30 s"} and classes[0]["slo"] == {"ttft": "1 s"}
    # null removes the item, as it removes a key
    dropped = _resolved(capsys, ["spec", spec, "--set", "workload.classes[1]=null"])
    assert [c["name"] for c in dropped["workload"]["classes"]] == ["interactive"]


def test_a_compare_entry_indexes_a_list_too(tmp_path, capsys):
    events = [{"at": "2 s", "action": "fail", "instance": 0}]
    data = {**BASE, "cluster": {"instances": 2, "tp": 1}, "events": events,
            "compare": {"later": {"events[0].at": "3 s"}, "as-given": {}}}  # fmt: skip
    spec = _spec(tmp_path, data)
    later = _resolved(capsys, ["spec", spec, "--entry", "later"])
    assert _resolved(capsys, ["spec", spec, "--entry", "as-given"])["events"][0]["at"] == "2 s"
    assert later["events"][0]["at"] == "3 s"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("workload.classes.2.share=0.1",
         "workload.classes has 2 item(s); index 2 is out of range (0..1)"),
        ("workload.classes[5]=null",
         "workload.classes has 2 item(s); index 5 is out of range (0..1)"),
        ("workload.max_requests[0]=3", "workload.max_requests is 10, not a list"),
        ("workload[0].rate=3", "workload is a mapping, not a list; [0] indexes a list"),
        ("workload.classes.first.share=1",
         "workload.classes is a list; name an item by its index (workload.classes[0])"),
        ("workload.nothing[0]=1", "workload.nothing is not set; [0] indexes a list"),
        ("workload.classes[x]=1", "is not a key path"),
    ],
)  # fmt: skip
def test_a_bad_list_index_is_one_error_line(tmp_path, capsys, override, message):
    spec = _spec(tmp_path, CLASSED)
    assert main(["spec", spec, "--set", override]) == 2
    err = capsys.readouterr().err
    assert err == f"twin: error: --set {override!r}: {message}\n" or (
        message == "is not a key path" and err.count("\n") == 1 and message in err
    )


# -- twin spec of a compare entry ------------------------------------------------------
def test_twin_spec_prints_one_compare_entry_resolved_as_twin_run_runs_it(capsys):
    got = _resolved(capsys, ["spec", "classes", "--entry", "priority"])
    assert got["name"] == "classes/priority"
    assert got["engine"]["queue_policy"] == "priority"
    assert main(["run", "classes", "--only", "priority", "--set", "workload.max_requests=5",
                 "--json", "-", "-q"]) == 0  # fmt: skip
    run = json.loads(capsys.readouterr().out)
    header = run["runs"]["priority"]["header"]
    five = _resolved(capsys, ["spec", "classes", "--entry", "priority",
                              "--set", "workload.max_requests=5"])  # fmt: skip
    assert header["spec"] == five


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["spec", "classes"], "classes.yaml: has compare:, a set of specs; twin spec resolves "
         "one: pick it with --entry LABEL (one of fcfs, priority)"),
        (["spec", "classes", "--entry", "lifo"],
         "classes.yaml: compare: no entry 'lifo'; the entries are fcfs, priority"),
        (["spec", "quickstart", "--entry", "fcfs"],
         "--entry: names an entry of a compare spec; quickstart.yaml has no compare:"),
    ],
)  # fmt: skip
def test_twin_spec_refuses_a_missing_or_unknown_entry_in_one_line(capsys, argv, message):
    assert main(argv) == 2
    assert capsys.readouterr().err == f"twin: error: {message}\n"


def test_a_compare_entry_overriding_a_set_list_item_warns_whichever_the_spelling(tmp_path, capsys):
    events = [{"at": "2 s", "action": "fail", "instance": 0}]
    data = {**BASE, "cluster": {"instances": 2, "tp": 1}, "events": events,
            "compare": {"later": {"events[0].at": "3 s"}}}  # fmt: skip
    argv = ["spec", _spec(tmp_path, data), "--entry", "later", "--set", "events.0.at=1 s"]
    assert main(argv) == 0
    assert capsys.readouterr().err == (
        "twin: warning: compare entry 'later' overrides --set events.0.at=1 s with "
        "events[0].at=3 s\n"
    )
