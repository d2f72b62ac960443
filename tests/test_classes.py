"""Classes of traffic: the spec and the trace column that give a request its
class, the queue order and the preemption victim they set (exact traces), each
class judged against its own SLO in the summary, rows and timelines, the
contract suite with two classes, and invariants under random classed load."""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import own_policies, small_spec
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import Auditing, run_engine
from test_queuepolicy import PREEMPTED, TRACES, config

import schedulers.colocated
import schedulers.disagg  # noqa: F401
from twin.cli import main
from twin.errors import SpecError, TraceError, TwinError
from twin.request import Request
from twin.serving.queuepolicy import Queued, register_queue_policy
from twin.sim.metrics import REQUEST_COLUMNS
from twin.sim.simulation import Simulation
from twin.sim.spec import resolve_spec
from twin.testing import CLASSES, check_scheduler
from twin.workload.stream import WorkloadSpec, iter_requests

TWO = [
    {"name": "interactive", "share": 0.6, "priority": 0,
     "slo": {"ttft": "500 ms", "tpot": "50 ms"}},
    {"name": "batch", "share": 0.4, "priority": 1, "slo": {"ttft": "20 s", "tpot": "200 ms"}},
]  # fmt: skip
POISSON = {"process": "poisson", "rate": 5.0}


def workload(**kw) -> WorkloadSpec:
    m = {"lengths": "azure-conv", "arrival": POISSON, "max_requests": 400, "classes": TWO}
    return WorkloadSpec.from_mapping({**m, **kw}, "w", Path.cwd())


LONG = {"prompt": {"dist": "fixed", "value": 3000}, "output": {"dist": "fixed", "value": 300}}


def classed_data(policy: str = "fcfs", rate: float = 12.0, requests: int = 600) -> dict:
    """One H100 serving chat lengths (interactive) and long batch prompts,
    loaded past what FCFS can keep the interactive TTFT under."""
    return {
        "model": "llama-3.1-8b", "gpu": "h100-sxm", "cluster": {"instances": 1, "tp": 1},
        "engine": {"queue_policy": policy, "max_num_seqs": 64},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": rate},
                     "max_requests": requests,
                     "classes": [TWO[0], {**TWO[1], "lengths": LONG}]},
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }  # fmt: skip


def classed_spec(policy: str = "fcfs", rate: float = 12.0, requests: int = 600):
    return resolve_spec(classed_data(policy, rate, requests), "test.yaml", Path.cwd())


# -- the class of a request ----------------------------------------------------------------
def test_classes_are_drawn_by_share_and_leave_the_rest_of_the_stream_alone():
    with_classes = list(iter_requests(workload(max_requests=4000), np.random.default_rng(3)))
    bare = WorkloadSpec.from_mapping(
        {"lengths": "azure-conv", "arrival": POISSON, "max_requests": 4000}, "w"
    )
    without = list(iter_requests(bare, np.random.default_rng(3)))
    counts = Counter(r.traffic_class for r in with_classes)
    assert abs(counts["interactive"] / 4000 - 0.6) < 0.03
    for a, b in zip(with_classes, without, strict=True):
        assert (a.arrival_s, a.prompt_tokens, a.output_tokens) == (
            b.arrival_s, b.prompt_tokens, b.output_tokens,
        )  # fmt: skip
        assert a.priority == (0 if a.traffic_class == "interactive" else 1)


def test_a_class_with_its_own_lengths_draws_them_for_its_requests_only():
    w = workload(classes=[TWO[0], {**TWO[1], "lengths": LONG}])
    reqs = list(iter_requests(w, np.random.default_rng(0)))
    batch = [r for r in reqs if r.traffic_class == "batch"]
    assert batch and all((r.prompt_tokens, r.output_tokens) == (3000, 300) for r in batch)
    chat = [r for r in reqs if r.traffic_class == "interactive"]
    plain = list(iter_requests(workload(), np.random.default_rng(0)))
    assert [(r.prompt_tokens, r.output_tokens) for r in chat] == [
        (r.prompt_tokens, r.output_tokens) for r in plain if r.traffic_class == "interactive"
    ]


def _trace(tmp_path: Path, classes: list[str], name: str = "t.csv") -> Path:
    path = tmp_path / name
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens,class"]
    lines += [f"{0.001 * i},{p},1,{c}" for i, (p, c) in enumerate(zip(
        (100, 80, 20, 10), classes, strict=True))]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_trace_class_column_names_each_request_class(tmp_path):
    path = _trace(tmp_path, ["batch", "batch", "interactive", "interactive"])
    classes = [{k: v for k, v in c.items() if k != "share"} for c in TWO]
    w = WorkloadSpec.from_mapping({"trace": str(path), "classes": classes, "skip": 1}, "w")
    reqs = list(iter_requests(w, np.random.default_rng(0)))
    assert [(r.traffic_class, r.priority) for r in reqs] == [
        ("batch", 1),
        ("interactive", 0),
        ("interactive", 0),
    ]


def test_a_trace_class_not_declared_is_one_error_naming_file_line_and_value(tmp_path):
    path = _trace(tmp_path, ["batch", "batch", "chat", "interactive"])
    classes = [{k: v for k, v in c.items() if k != "share"} for c in TWO]
    w = WorkloadSpec.from_mapping({"trace": str(path), "classes": classes}, "w")
    with pytest.raises(TraceError, match=r"t\.csv: line 4: column class: 'chat' is not a class"):
        list(iter_requests(w, np.random.default_rng(0)))


@pytest.mark.parametrize(
    ("classes", "extra", "message"),
    [
        ([{"name": "a", "share": 1}, {"name": "a", "share": 1}], {},
         r"classes\[1\]\.name: 'a' is given twice"),
        ([{"name": "a", "share": 1}, {"name": "b"}], {}, "give every class a share"),
        ([{"name": "a"}], {}, "synthetic lengths draw each request's class"),
        ([{"name": "a", "share": -1}], {}, r"classes\[0\]\.share: -1 must be a number > 0"),
        ([{"name": "a", "share": 1, "slo": {"ttft": "fast"}}], {}, r"classes\[0\]\.slo\.ttft"),
        ([{"name": "a", "share": 1, "prio": 1}], {}, r"classes\[0\]: unknown key 'prio'"),
        ([{"name": "a", "share": 1}], {"priority": 1}, "workload.priority 1 goes with no classes"),
        ([], {}, "must be a non-empty list"),
    ],
)  # fmt: skip
def test_a_bad_class_is_one_error_naming_its_key(classes, extra, message):
    with pytest.raises(SpecError, match=message):
        workload(classes=classes, **extra)


def test_the_cli_refuses_a_bad_class_in_one_line(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "model: llama-3.1-8b\ngpu: h100-sxm\ncluster: {instances: 1, tp: 1}\n"
        "workload: {lengths: azure-conv, arrival: {process: poisson, rate: 1}, "
        "max_requests: 5, classes: [{name: a, share: 0}]}\n"
    )
    code = main(["run", str(spec)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("twin: error: ") and err.count("\n") == 1
    assert "s.yaml: workload.classes[0].share: 0 must be a number > 0" in err


# -- the queue order and the preemption victim (exact traces) --------------------------------
def test_the_priority_policy_serves_the_higher_class_first_exact_trace(tmp_path):
    """The trace's class column sets each request's priority: under ``priority``
    the interactive requests that arrived later go before the batch one queued;
    under FCFS they wait their turn."""
    path = _trace(tmp_path, ["batch", "batch", "interactive", "interactive"])
    classes = [{k: v for k, v in c.items() if k != "share"} for c in TWO]
    w = WorkloadSpec.from_mapping({"trace": str(path), "classes": classes}, "w")
    reqs = list(iter_requests(w, np.random.default_rng(0)))
    assert [(r.prompt_tokens, r.priority) for r in reqs] == [(100, 1), (80, 1), (20, 0), (10, 0)]
    # Linear: 10 ms + 0.1 ms a prompt token; one running at a time, one token each
    for policy, order, ends in (
        ("fcfs", [0, 1, 2, 3], [0.02, 0.038, 0.05, 0.061]),
        ("priority", [0, 2, 3, 1], [0.02, 0.032, 0.043, 0.061]),
    ):
        log: list[tuple] = []
        run_engine(reqs, config=config(policy, max_num_seqs=1), log=log)
        want, start = [], 0.0
        for rid, end in zip(order, ends, strict=True):
            want += [(start, "iteration", 0, (rid,), 0), (end, "finish", 0, rid)]
            start = end
        assert [(pytest.approx(e[0]), *e[1:]) for e in log] == want


def _classed(reqs: list[Request]) -> list[Request]:
    return [
        Request(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, priority=r.priority,
                traffic_class="batch" if r.priority else "interactive")
        for r in reqs
    ]  # fmt: skip


@pytest.mark.parametrize("policy", ["fcfs", "shortest-prompt-first"])
def test_preemption_takes_the_lowest_class_first_under_every_policy_exact_trace(policy):
    """r0 (batch) is admitted first, r1 and r2 (interactive) after it: without
    classes FCFS and shortest-prompt-first preempt the latest admitted
    interactive request; with classes the batch one goes, twice, as under
    ``priority``. Only the admission order of r1 and r2 differs between them."""
    log: list[tuple] = []
    cfg = config(policy, block_size=4, watermark=0.0)
    eng, done = run_engine(_classed(PREEMPTED), blocks=6, config=cfg, log=log, perf=Auditing())
    want = TRACES["priority"]
    if policy == "shortest-prompt-first":
        want = [(*e[:3], (2, 1), *e[4:]) if e[3] == (1, 2) else e for e in want]
    assert [(pytest.approx(e[0]), *e[1:]) for e in log] == want
    assert [e[3] for e in log if e[1] == "preempt"] == [0, 0]
    assert eng.kv.free == eng.kv.total and sorted(s.req.id for s in done) == [0, 1, 2]


# -- each class against its own SLO ----------------------------------------------------------
def test_each_request_is_judged_by_its_class_slo_and_the_classes_add_up():
    rows: list[dict] = []
    result = Simulation(classed_spec(), on_row=rows.append).run()
    s = result.to_dict()["summary"]
    per = s["classes"]
    assert list(per) == ["interactive", "batch"]
    assert sum(c["requests"] for c in per.values()) == s["requests"] == len(rows)
    limits = {"interactive": (0.5, 0.05), "batch": (20.0, 0.2)}
    for r in rows:
        ttft, tpot = limits[r["class"]]
        want = (
            r["status"] == "completed"
            and r["ttft_s"] <= ttft
            and (r["tpot_s"] == "" or r["tpot_s"] <= tpot)
        )
        assert r["slo_met"] == int(want), r
    for name, c in per.items():
        mine = [r for r in rows if r["class"] == name]
        assert c["slo_attainment"] == sum(r["slo_met"] for r in mine) / len(mine)
        assert (
            c["slo"]["ttft_s"] == limits[name][0]
            and c["priority"] == TWO[list(per).index(name)]["priority"]
        )
    assert s["slo_attainment"] == sum(r["slo_met"] for r in rows) / len(rows)
    # each class's timeline adds up to its summary
    for name, tl in result.to_dict()["timeline_by_class"].items():
        assert sum(w["arrived"] for w in tl) == per[name]["requests"]
        assert sum(w["slo_met"] for w in tl) == round(
            per[name]["slo_attainment"] * per[name]["requests"]
        )


def test_priority_serves_the_interactive_class_better_than_fcfs():
    """Interactive and batch on one overloaded instance: FCFS lets batch prompts
    delay the interactive ones past their TTFT; priority admits them first."""
    per = {
        p: Simulation(classed_spec(p)).run().to_dict()["summary"]["classes"]
        for p in ("fcfs", "priority")
    }
    assert per["priority"]["interactive"]["slo_attainment"] > 0.9
    assert per["fcfs"]["interactive"]["slo_attainment"] < 0.5
    assert (
        per["priority"]["interactive"]["ttft_s"]["p99"]
        < per["fcfs"]["interactive"]["ttft_s"]["p99"]
    )


def test_a_run_without_classes_has_no_class_column_nor_section(tmp_path, capsys):
    out = {}
    bare = classed_data(requests=20)
    del bare["workload"]["classes"]
    for name, data in (("bare", bare), ("classed", classed_data(requests=20))):
        csv_path = tmp_path / f"{name}.csv"
        json_path = tmp_path / f"{name}.json"
        spec_path = tmp_path / f"{name}.yaml"
        spec_path.write_text(yaml.safe_dump(data))
        assert main(["run", str(spec_path), "-q", "--requests-csv", str(csv_path),
                     "--json", str(json_path)]) == 0  # fmt: skip
        out[name] = (next(csv.reader(io.StringIO(csv_path.read_text()))), json_path.read_text())
    assert tuple(out["bare"][0]) == REQUEST_COLUMNS
    assert tuple(out["classed"][0]) == (*REQUEST_COLUMNS, "class")
    assert '"classes"' not in out["bare"][1] and "timeline_by_class" not in out["bare"][1]
    assert '"classes"' in out["classed"][1] and "timeline_by_class" in out["classed"][1]


def test_the_printed_summary_has_a_line_per_class(capsys, tmp_path):
    spec_path = tmp_path / "c.yaml"
    spec_path.write_text(yaml.safe_dump(classed_data(requests=50)))
    assert main(["run", str(spec_path)]) == 0
    out = capsys.readouterr().out
    assert "each request against its class's SLO" in out
    rows = {ln.split()[0]: ln.split()[1:3] for ln in out.splitlines() if ln.split()[:1] in (
        ["interactive"], ["batch"])}  # fmt: skip
    assert rows["interactive"][0] == "0" and rows["batch"][0] == "1"  # their priorities
    assert int(rows["interactive"][1]) + int(rows["batch"][1]) == 50


# -- the contract suite with two classes -----------------------------------------------------
@pytest.mark.parametrize("name", own_policies())
def test_every_scheduler_keeps_the_contract_with_two_classes(name):
    assert check_scheduler(name, classes=True, queue_policy="priority") in (
        "colocated", "split", "both",
    )  # fmt: skip


@pytest.mark.parametrize("queue_policy", ["fcfs", "priority", "shortest-prompt-first"])
@pytest.mark.parametrize("scheduler", ["colocated", "disagg"])
def test_every_queue_policy_keeps_the_contract_with_two_classes(queue_policy, scheduler):
    assert check_scheduler(scheduler, classes=True, queue_policy=queue_policy, seeds=(0,))


def test_the_contract_classes_are_the_documented_ones():
    assert [c["name"] for c in CLASSES] == ["interactive", "batch"]


# -- invariants ------------------------------------------------------------------------------
@settings(max_examples=12, deadline=None)
@given(
    policy=st.sampled_from(["fcfs", "priority", "shortest-prompt-first"]),
    shares=st.tuples(st.floats(0.05, 1.0), st.floats(0.05, 1.0)),
    priorities=st.tuples(st.integers(-2, 2), st.integers(-2, 2)),
    rate=st.floats(2.0, 40.0),
    blocks=st.sampled_from([None, "scarce"]),
    seed=st.integers(0, 2**16),
)
def test_invariants_hold_with_random_classes(policy, shares, priorities, rate, blocks, seed):
    """Random shares and priorities (equal ones too), light to heavy load, KV
    scarce or not: every request ends once, in one class; the classes add up
    to the run; attainments lie in [0, 1]; no block is held at the end; the
    same inputs give the same result."""
    classes = [
        {"name": "a", "share": shares[0], "priority": priorities[0], "slo": {"ttft": "1 s"}},
        {"name": "b", "share": shares[1], "priority": priorities[1], "slo": {"tpot": "30 ms"}},
    ]
    engine: dict = {"queue_policy": policy, "max_num_seqs": 32}
    if blocks is not None:
        engine["gpu_memory_utilization"] = 0.23  # ~1.6 GB of KV: preemptions
    spec = small_spec(
        rate=rate, requests=80, seed=seed, engine=engine, cluster={"instances": 1, "tp": 1},
        workload={"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": rate},
                  "max_requests": 80, "classes": classes},
    )  # fmt: skip
    rows: list[dict] = []
    sim = Simulation(spec, on_row=rows.append)
    result = sim.run()
    d = result.to_dict()
    assert sorted(r["id"] for r in rows) == list(range(80))
    per = d["summary"]["classes"]
    assert sum(c["requests"] for c in per.values()) == 80
    assert sum(c["preemptions"] for c in per.values()) == d["summary"]["preemptions"]
    for c in per.values():
        att = c["slo_attainment"]
        assert att is None or 0.0 <= att <= 1.0
        assert c["completed"] + c["rejected"] == c["requests"]
    for r in rows:
        assert r["class"] in per
        if r["status"] == "completed":
            assert r["arrival_s"] <= r["first_token_s"] <= r["finish_s"]
            assert not math.isnan(r["ttft_s"]) and r["ttft_s"] >= 0
    for e in sim.engines:
        assert e.kv.free == e.kv.total
    again = Simulation(spec).run().to_dict()
    assert again["summary"] == d["summary"]


# -- goodput per class -----------------------------------------------------------------------
def _fake_runner(d, where, base_dir, of_class=None):
    """Attainment as a step in the offered rate: all meet below 10 req/s, the
    interactive class below 4, the batch class below 8 (both against 0.9)."""
    rate = d["workload"]["arrival"]["rate"]
    edge = {None: 10.0, "interactive": 4.0, "batch": 8.0}[of_class]
    return 1.0 if rate < edge else 0.5


def test_goodput_searches_each_class_against_its_own_target(tmp_path):
    from twin.studies.goodput import goodput

    data = classed_data(requests=300)
    data["workload"]["arrival"]["rate"] = 1.0
    got = goodput(data, "x.yaml", Path.cwd(), seeds=1, runner=_fake_runner, rel_tol=0.01)
    (row,) = got.rows
    assert 9.8 < row.mean_rps < 10.0
    shares = Counter(
        r.traffic_class for r in iter_requests(classed_spec(requests=300).workload,
                                               np.random.default_rng(0))
    )  # fmt: skip
    per = {name: (rps, total) for name, rps, total, _ in row.classes}
    assert 3.9 < per["interactive"][1] < 4.0 and 7.8 < per["batch"][1] < 8.0
    for name, (rps, total) in per.items():
        assert rps == pytest.approx(total * shares[name] / 300)
    head, cells = got.csv_rows()
    assert head[-2:] == ["goodput_rps_interactive", "goodput_rps_batch"]
    assert "goodput per class req/s: interactive" in got.format_table()


def test_goodput_without_classes_writes_its_columns_as_before():
    from twin.studies.goodput import goodput

    data = classed_data(requests=300)
    del data["workload"]["classes"]
    data["workload"]["arrival"]["rate"] = 1.0
    got = goodput(data, "x.yaml", Path.cwd(), seeds=1, runner=_fake_runner)
    assert got.csv_rows()[0][-1] == "gpus" and got.rows[0].classes == ()
    assert "per class" not in got.format_table()


def test_a_goodput_probe_reads_the_class_attainment_of_the_run():
    from twin.studies.goodput import probe_attainment

    data = classed_data(requests=200)
    summary = Simulation(classed_spec(requests=200)).run().to_dict()["summary"]
    for name in ("interactive", "batch"):
        got = probe_attainment(data, "x.yaml", str(Path.cwd()), name)
        assert got == summary["classes"][name]["slo_attainment"]
    assert probe_attainment(data, "x.yaml", str(Path.cwd())) == summary["slo_attainment"]


# -- plots split by class --------------------------------------------------------------------
def test_twin_plot_draws_a_line_per_class_of_a_requests_csv(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from twin.viz.cdf import csv_classes, read_latencies

    spec_path = tmp_path / "c.yaml"
    spec_path.write_text(yaml.safe_dump(classed_data(requests=120)))
    rows = tmp_path / "c.csv"
    assert main(["run", str(spec_path), "-q", "--requests-csv", str(rows)]) == 0
    table = list(csv.DictReader(io.StringIO(rows.read_text())))
    assert csv_classes(rows) == list(dict.fromkeys(r["class"] for r in table))
    for name in ("interactive", "batch"):
        ttft, _ = read_latencies(rows, name)
        mine = [r for r in table if r["class"] == name and r["status"] == "completed"]
        assert ttft == sorted(float(r["ttft_s"]) for r in mine)
    out = tmp_path / "plots"
    assert main(["plot", "--requests", str(rows), "--by-class", "--out", str(out)]) == 0
    assert (out / "requests-cdf.png").stat().st_size > 0


def test_plot_by_class_of_a_csv_without_classes_is_one_error(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    data = classed_data(requests=20)
    del data["workload"]["classes"]
    spec_path = tmp_path / "c.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    rows = tmp_path / "c.csv"
    assert main(["run", str(spec_path), "-q", "--requests-csv", str(rows)]) == 0
    capsys.readouterr()
    assert main(["plot", "--requests", str(rows), "--by-class", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and err.count("\n") == 1
    assert "c.csv: no class column" in err


# -- the bundled experiment ------------------------------------------------------------------
REPO = Path(__file__).resolve().parent.parent


def test_the_bundled_experiment_prints_what_the_classes_guide_shows(capsys):
    """`twin run classes`: priority lifts the interactive class from about a
    fifth to nearly all of it meeting its SLO, the batch class meets its own
    in both; the guide's figures are this output (docs/data/classes.txt)."""
    assert main(["run", "classes"]) == 0
    out = capsys.readouterr().out
    shown = (REPO / "docs" / "data" / "classes.txt").read_text(encoding="utf-8")
    assert shown == f"$ twin run classes\n{out.rstrip()}\n"
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.split()[:1] in (
        ["fcfs"], ["priority"])}  # fmt: skip
    interactive = {k: float(v[-2]) for k, v in rows.items()}
    batch = {k: float(v[-1]) for k, v in rows.items()}
    assert interactive["fcfs"] < 30.0 < 85.0 < interactive["priority"]
    assert batch == {"fcfs": 100.0, "priority": 100.0}


def test_a_mooncake_trace_names_classes_by_key_and_a_repeat_reads_them_again(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = [
        f'{{"timestamp": {1000 * i}, "input_length": 600, "output_length": 4, '
        f'"hash_ids": [{i}], "class": "{c}"}}'
        for i, c in enumerate(["batch", "interactive", "batch"])
    ]
    path.write_text("\n".join(lines) + "\n")
    classes = [{k: v for k, v in c.items() if k != "share"} for c in TWO]
    w = WorkloadSpec.from_mapping(
        {"trace": str(path), "classes": classes, "repeat": True, "max_requests": 7}, "w"
    )
    reqs = list(iter_requests(w, np.random.default_rng(0)))
    assert [r.traffic_class for r in reqs] == ["batch", "interactive", "batch"] * 2 + ["batch"]
    lines[1] = lines[1].replace(', "class": "interactive"', "")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"m\.jsonl: line 2: no key 'class'"):
        list(iter_requests(w, np.random.default_rng(0)))


def test_a_trace_without_a_class_column_is_one_error_when_classes_have_no_shares(tmp_path):
    path = tmp_path / "v.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,1\n")
    classes = [{k: v for k, v in c.items() if k != "share"} for c in TWO]
    w = WorkloadSpec.from_mapping({"trace": str(path), "classes": classes}, "w")
    with pytest.raises(TraceError, match=r"v\.csv: line 1: missing column\(s\) class"):
        list(iter_requests(w, np.random.default_rng(0)))


def test_the_requests_parquet_and_frame_carry_the_class(tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("pandas")
    from twin.sim.frames import read_parquet_columns

    spec_path = tmp_path / "c.yaml"
    spec_path.write_text(yaml.safe_dump(classed_data(requests=40)))
    out = tmp_path / "r.parquet"
    rows = tmp_path / "r.csv"
    assert main(["run", str(spec_path), "-q", "--requests-parquet", str(out),
                 "--requests-csv", str(rows)]) == 0  # fmt: skip
    cols, kinds = read_parquet_columns(out)
    table = list(csv.DictReader(io.StringIO(rows.read_text())))
    assert kinds["class"] == "str"
    assert cols["class"] == [r["class"] for r in table]
    frame = Simulation(classed_spec(requests=40), keep_requests=True).run().requests
    assert set(frame["class"]) == {"interactive", "batch"}


@register_queue_policy("test-slack")
@dataclass(frozen=True)
class _Slack:
    """A queue policy with a parameter: the TTFT deadline less ``margin``."""

    margin: float = 0.0

    def key(self, item: Queued) -> float:
        return item.req.arrival_s + item.slo.ttft_s - self.margin


@pytest.mark.parametrize(
    "kw",
    [
        {"queue_policy": {"name": "test-slack", "margin": 0.5}},
        {"queue_policy": "test-slack", "queue_policy_params": {"margin": 0.5}},
    ],
)
def test_the_contract_takes_a_queue_policy_with_parameters(kw):
    assert check_scheduler("colocated", classes=True, seeds=(0,), **kw) == "colocated"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"queue_policy": "test-slack", "queue_policy_params": {"slack": 1}},
         r"check_scheduler\(queue_policy=\.\.\.\)\.slack: unknown parameter"),
        ({"queue_policy": {"name": "test-slak"}}, r"unknown queue policy 'test-slak'"),
        ({"queue_policy": {"name": "test-slack"}, "queue_policy_params": {"margin": 1}},
         r"queue_policy_params=\.\.\.\): \{'margin': 1\} goes with a queue policy name"),
    ],
)  # fmt: skip
def test_a_bad_queue_policy_for_the_contract_is_the_callers_error(kw, message):
    # refused before anything runs, as the caller's mistake (not the scheduler's broken promise)
    with pytest.raises(TwinError, match=message):
        check_scheduler("colocated", seeds=(0,), **kw)
