"""Results over time: per-window counts, attainment, latencies, time-averaged
queues and capacity, against hand-computed values; the JSON key, the CSV and
the plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import helpers
import numpy as np
import pytest
import yaml
from test_engine import Linear
from test_plots import check_written

import schedulers.colocated  # noqa: F401 - registers the built-ins when not installed
from twin.cli import main
from twin.request import Request
from twin.serving.observer import InstanceInfo
from twin.sim.simulation import Simulation
from twin.sim.timeline import TIMELINE_COLUMNS, Timeline
from twin.viz.overtime import load_run_timeline, plot_over_time, spec_events


# -- a tiny run, every window by hand ---------------------------------------------------------
def tiny_rows() -> tuple[list[dict], dict]:
    """One colocated instance whose every iteration takes 1 s, windows of 2 s,
    SLOs of 1.5 s. r0 (t=0) prefills 0-1; r1 (0.25) and r2 (0.75) wait and
    prefill together 1-2 (TTFT 1.75 misses, 1.25 meets); r5 (3.0) is longer
    than max_model_len and is rejected on arrival; r3 (2.5) prefills 2.5-3.5
    and decodes its second token 3.5-4.5 (TTFT 1, TPOT 1); r4 (5.0) prefills
    5-6 and ends the run at 6.0, on the last window's edge."""
    spec = helpers.small_spec(
        cluster={"instances": 1, "tp": 1},
        engine={"max_model_len": 100, "oversized": "reject"},
        slo={"ttft": "1.5 s", "tpot": "1.5 s"},
        output={"window": "2 s"},
    )
    reqs = [
        Request(0, 0.0, 10, 1),
        Request(1, 0.25, 10, 1),
        Request(2, 0.75, 10, 1),
        Request(3, 2.5, 10, 2),
        Request(5, 3.0, 200, 1),
        Request(4, 5.0, 10, 1),
    ]
    result = Simulation(spec, requests=reqs, perf=Linear(1.0, 0.0, 0.0)).run()
    return result.timeline_rows, result.summary


def test_windows_of_a_tiny_run_by_hand():
    rows, summary = tiny_rows()
    assert [(r["start_s"], r["end_s"]) for r in rows] == [(0.0, 2.0), (2.0, 4.0), (4.0, 6.0)]
    counts = [
        tuple(r[k] for k in ("arrived", "completed", "rejected", "failed", "slo_met", "finished"))
        for r in rows
    ]
    # finished: r0 at 1; r1, r2 at 2 and r5 at 3; r3 at 4.5 and r4 at 6 (the end)
    assert counts == [(3, 3, 0, 0, 2, 1), (2, 1, 1, 0, 1, 3), (1, 1, 0, 0, 1, 2)]
    assert [r["slo_attainment"] for r in rows] == [2 / 3, 0.5, 1.0]
    w0, w1, w2 = rows
    assert w0["ttft_p50_s"] == 1.25
    assert w0["ttft_p99_s"] == pytest.approx(float(np.quantile([1.0, 1.75, 1.25], 0.99)))
    assert w0["tpot_p50_s"] is None and w0["tpot_p99_s"] is None  # one-token outputs
    assert (w1["ttft_p50_s"], w1["tpot_p50_s"], w1["tpot_p99_s"]) == (1.0, 1.0, 1.0)
    assert w2["ttft_p50_s"] == 1.0
    # queued: r1 waits 0.25-1, r2 0.75-1: 1 request-second over 2 s
    assert [r["queued"] for r in rows] == [0.5, 0.0, 0.0]
    assert all(r["decode_queued"] == 0.0 for r in rows)
    assert all(
        (r["instances_mixed"], r["instances_prefill"], r["instances_decode"], r["gpus_up"])
        == (1.0, 0.0, 0.0, 1.0)
        for r in rows
    )
    # the rows add up to the summary
    assert sum(r["arrived"] for r in rows) == summary["requests"] == 6
    assert sum(r["slo_met"] for r in rows) / 6 == summary["slo_attainment"]


def test_a_window_with_nothing_arriving_has_empty_attainment():
    spec = helpers.small_spec(cluster={"instances": 1, "tp": 1}, output={"window": "1 s"})
    reqs = [Request(0, 0.0, 10, 1), Request(1, 2.5, 10, 1)]
    rows = Simulation(spec, requests=reqs, perf=Linear(0.5, 0.0, 0.0)).run().timeline_rows
    assert [r["end_s"] for r in rows] == [1.0, 2.0, 3.0]
    assert [r["arrived"] for r in rows] == [1, 0, 1]
    assert rows[1]["slo_attainment"] is None and rows[1]["ttft_p50_s"] is None


# -- time integrals, analytically -------------------------------------------------------------
def test_time_averaged_queue_and_capacity():
    t = Timeline(2.0)
    t.start([InstanceInfo(0, "prefill", 0, tuple(range(8))),
             InstanceInfo(1, "decode", 1, tuple(range(8, 16)))])  # fmt: skip
    # one request queued 1.5 -> 5.5 (0.5, 2 and 1.5 s in windows 0, 1, 2)
    t.completed(1.5, 5.9, ttft=4.0, tpot=None, met=False, scheduled=5.5, landed=-1.0,
                decode_start=-1.0)  # fmt: skip
    # a second one whose KV waits on the decode side 0.5 -> 1.5
    t.completed(0.0, 1.9, ttft=0.2, tpot=0.01, met=True, scheduled=0.0, landed=0.5,
                decode_start=1.5, transfer=0.125)  # fmt: skip
    t.role_changed(1.0, 1, "prefill")  # [1, 3): two prefill instances
    t.instance_down(3.0, 0)  # [3, 5): instance 1 alone, 8 GPUs
    t.instance_up(4.0, 2, InstanceInfo(2, "decode", 2, (16, 17, 18, 19)))  # a new one
    t.instance_up(5.0, 0)  # [5, 6]: 0 back
    rows = t.rows(6.0)
    assert [r["queued"] for r in rows] == [0.25, 1.0, 0.75]
    assert [r["decode_queued"] for r in rows] == [0.5, 0.0, 0.0]
    assert [r["instances_prefill"] for r in rows] == [1.5, 1.5, 1.5]
    assert [r["instances_decode"] for r in rows] == [0.5, 0.0, 1.0]
    assert [r["gpus_up"] for r in rows] == [16.0, 12.0, 16.0]  # (8 + 4 + 16 + 4) / 2
    assert [r["finished"] for r in rows] == [1, 0, 1]
    assert [r["transfer_p50_s"] for r in rows] == [0.125, None, None]  # by arrival


@pytest.mark.parametrize("seed", range(4))
def test_sealed_windows_give_the_rows_of_unsealed_ones(seed):
    """Fed its arrivals, a timeline seals each window once its requests have
    ended; its rows are those of one that never seals (not told of arrivals)."""
    rng = np.random.default_rng(seed)
    n = 400
    arrivals = np.cumsum(rng.exponential(0.05, n))
    ends = arrivals + rng.exponential(0.4, n)
    kinds = rng.choice(["completed", "rejected", "failed"], n, p=[0.9, 0.05, 0.05])
    events = sorted([(a, 0, i) for i, a in enumerate(arrivals)]
                    + [(e, 1, i) for i, e in enumerate(ends)])  # fmt: skip
    sealed, plain = Timeline(1.0), Timeline(1.0)
    for t in (sealed, plain):
        t.start([InstanceInfo(0, "mixed", 0, (0, 1))])
    for time, end, i in events:
        a = float(arrivals[i])
        if not end:
            sealed.arrived(a)
            continue
        for t in (sealed, plain):
            if kinds[i] == "completed":
                t.completed(a, float(time), ttft=float(time - a) / 3, tpot=float(time - a) / 30,
                            met=bool(i % 3), scheduled=a + 0.01, landed=a + 0.02,
                            decode_start=a + 0.03, transfer=0.01 + i * 1e-4)  # fmt: skip
            else:
                t.ended(a, float(time), str(kinds[i]))
    windows = list(sealed._windows.values())
    assert sum(w.quantiles is not None for w in windows) >= len(windows) - 3
    assert sealed.rows(float(ends.max())) == plain.rows(float(ends.max()))


def test_a_run_seals_its_windows():
    spec = small(output={"window": "1 s"})
    sim = Simulation(spec)
    rows = sim.run().timeline_rows
    timeline = sim.metrics.timeline
    # every window before the last arrival's is sealed: its requests all ended
    last = timeline._arriving
    assert last > 5 and len(rows) > last
    assert all(w.quantiles is not None for k, w in timeline._windows.items() if k < last)


def test_a_bad_window_is_refused():
    with pytest.raises(ValueError, match="must be > 0"):
        Timeline(0.0)
    assert Timeline().rows(0.0) == []


# -- a real run: the JSON key, determinism, the summary untouched -----------------------------
def small(**over):
    return helpers.small_spec(rate=6.0, requests=80, **over)


def test_the_timeline_adds_up_and_leaves_the_summary_alone():
    a = Simulation(small()).run().to_dict()
    b = Simulation(small(output={"window": "1 s"})).run().to_dict()
    assert a["summary"] == b["summary"]
    rows = b["timeline"]
    assert len(rows) == int(np.ceil(b["summary"]["simulated_s"]))
    assert list(rows[0]) == list(TIMELINE_COLUMNS)
    s = b["summary"]
    assert sum(r["arrived"] for r in rows) == sum(r["finished"] for r in rows) == s["requests"]
    assert sum(r["slo_met"] for r in rows) / s["requests"] == pytest.approx(s["slo_attainment"])
    waited = sum(r["queued"] * (r["end_s"] - r["start_s"]) for r in rows)
    assert waited == pytest.approx(s["queue_s"]["mean"] * s["completed"], rel=1e-9)
    # without output: in the spec, the resolved spec (and its sha256) is as before
    assert "output" not in a["header"]["spec"]
    assert b["header"]["spec"]["output"] == {"window": "1 s"}


def test_the_timeline_is_deterministic():
    one = json.dumps(Simulation(small()).run().to_dict()["timeline"])
    two = json.dumps(Simulation(small()).run().to_dict()["timeline"])
    assert one == two


# -- the command line: --window, --timeline-csv, twin plot --timeline -------------------------
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    data = {
        "model": "llama-3.1-8b",
        "gpu": "h100-sxm",
        "cluster": {"instances": 2, "tp": 1},
        "workload": {
            "lengths": "azure-conv",
            "arrival": {"process": "poisson", "rate": 6.0},
            "max_requests": 60,
        },
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }
    path.write_text(yaml.safe_dump(data))
    return path


def test_twin_run_writes_the_timeline_csv_and_json(tmp_path, capsys):
    spec = spec_file(tmp_path)
    out_csv, out_json = tmp_path / "t.csv", tmp_path / "r.json"
    argv = ["run", str(spec), "-q", "--window", "2s", "--timeline-csv", str(out_csv)]
    assert main([*argv, "--json", str(out_json)]) == 0
    doc = json.loads(out_json.read_text())
    assert doc["header"]["spec"]["output"] == {"window": "2s"}
    with open(out_csv, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        body = list(reader)
    assert tuple(header) == TIMELINE_COLUMNS
    assert len(body) == len(doc["timeline"]) > 1
    for line, row in zip(body, doc["timeline"], strict=True):
        assert line == ["" if row[c] is None else str(row[c]) for c in TIMELINE_COLUMNS]
    first = out_csv.read_bytes()
    assert main(argv) == 0
    assert out_csv.read_bytes() == first  # byte-identical on a rerun
    capsys.readouterr()
    for bad in ("0s", "abc"):
        assert main(["run", str(spec), "-q", "--window", bad]) == 2
        assert capsys.readouterr().err.startswith("twin: error: --window:")
    assert main(["run", str(spec), "-q", "--set", "output.window=-1"]) == 2
    assert "output.window" in capsys.readouterr().err


def test_spec_events_are_read_in_the_events_schema():
    spec = {
        "events": [
            {"at": "30 s", "action": "fail", "node": 0},
            {"at": 10, "action": "degrade", "link": "n0.nic0 -> switch", "factor": 0.25},
            {"at": 12, "action": "degrade", "gpu": 3, "factor": "0.5"},
            {"at": 45.0, "action": "recover", "node": 0},
            {"action": "recover", "node": 0},  # no time
            {"at": 5, "node": 0},  # no action
            {"at": 5, "action": "explode", "node": 0},  # not an action
            {"at": 5, "action": "fail"},  # no target
            {"at": "30 s", "kind": "fail", "instance": 1},  # not the schema
            "fail",
        ]
    }
    assert spec_events(spec) == [
        (10.0, "degrade link n0.nic0 -> switch x0.25"),
        (12.0, "degrade gpu 3 x0.5"),
        (30.0, "fail node 0"),
        (45.0, "recover node 0"),
    ]
    assert spec_events({}) == [] and spec_events({"events": "x"}) == []
    # a whole fabric at once is one label
    fabric = [
        {"at": 30, "action": "degrade", "nic": f"n{i}.nic0", "factor": 0.25} for i in range(4)
    ]
    assert spec_events({"events": fabric}) == [(30.0, "degrade 4 nics x0.25")]


def test_the_plot_marks_what_the_fault_log_says_took_effect():
    # random failures are only in the result's fault_log, which wins over the spec
    result = Simulation(small()).run().to_dict()
    result["header"]["spec"]["events"] = [{"at": 3.0, "action": "fail", "node": 0}]
    rows, events, _, _ = load_run_timeline(result)
    assert events == [(3.0, "fail node 0")]
    result["fault_log"] = [
        {"time_s": 1.5, "action": "fail", "target": "gpu", "name": 1, "instances": [0]},
        {"time_s": 2.25, "action": "recover", "target": "gpu", "name": 1, "instances": [0]},
        {"time_s": 2.5, "action": "degrade", "target": "link", "name": "a -> b", "factor": 0.25,
         "instances": []},
        {"time_s": "x"},
    ]  # fmt: skip
    rows, events, _, _ = load_run_timeline(result)
    assert events == [
        (1.5, "fail gpu 1"),
        (2.25, "recover gpu 1"),
        (2.5, "degrade link a -> b x0.25"),
    ]


def test_plot_over_time_from_json_and_csv(tmp_path, capsys):
    result = Simulation(small()).run().to_dict()
    result["header"]["spec"]["events"] = [{"at": 3.0, "action": "fail", "node": 0}]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(result))
    rows, events, target, _ = load_run_timeline(path)
    assert len(rows) == len(result["timeline"]) and events == [(3.0, "fail node 0")]
    assert target == 0.9
    check_written(plot_over_time(path, tmp_path / "a"), tmp_path / "a")
    out_csv = tmp_path / "t.csv"
    assert main(["run", str(spec_file(tmp_path)), "-q", "--timeline-csv", str(out_csv)]) == 0
    assert main(["plot", "--timeline", str(out_csv), "--out", str(tmp_path / "p")]) == 0
    assert capsys.readouterr().out.split() == [
        str(tmp_path / "p" / "t-over-time.png"),
        str(tmp_path / "p" / "t-over-time.svg"),
        str(tmp_path / "p" / "t-over-time.pdf"),
    ]
    check_written(sorted((tmp_path / "p").iterdir()), tmp_path / "p" / "t-over-time")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    assert main(["plot", "--timeline", str(tmp_path / "x.csv")]) == 2
    assert "not a timeline CSV" in capsys.readouterr().err


def test_instances_going_down_and_up_reach_the_timeline_and_the_trace():
    from twin.serving.observer import Broadcast
    from twin.sim.metrics import SLO, Metrics
    from twin.sim.trace import TraceRecorder, chrome_trace

    metrics, rec = Metrics(SLO(), timeline=Timeline(1.0)), TraceRecorder()
    obs = Broadcast([metrics, rec])
    obs.run_started("x", [InstanceInfo(0, "mixed", 0, (0, 1))], None)
    obs.instance_down(0.5, 0)
    obs.instance_up(1.25, 0)
    metrics.last_end_s = 2.0
    rows = metrics.timeline_rows()
    assert [r["instances_mixed"] for r in rows] == [0.5, 0.75]
    assert [r["gpus_up"] for r in rows] == [1.0, 1.5]
    instants = [(e["ts"], e["name"]) for e in chrome_trace(rec)["traceEvents"] if e["ph"] == "i"]
    assert instants == [(500000, "down"), (1250000, "up")]
