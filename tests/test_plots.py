"""Plots from a sweep folder, per-request CSVs and traces: files written, the
knee found where it should be."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import helpers
import pytest

import schedulers.colocated  # registers the built-ins when not installed
import schedulers.disagg  # noqa: F401
from twin.cli import main
from twin.errors import TwinError
from twin.sim.metrics import REQUEST_COLUMNS
from twin.sim.simulation import Simulation
from twin.sim.trace import TraceRecorder, write_chrome_trace
from twin.viz.attainment import attainment_series, knee, plot_attainment
from twin.viz.cdf import plot_cdfs
from twin.viz.goodput import plot_goodput
from twin.viz.plots import plot_dir
from twin.viz.timeline import plot_timeline


def check_written(paths: list[Path], *bases: Path) -> None:
    """A PNG, an SVG and a PDF per base, each a real image of some size."""
    exts = ("png", "svg", "pdf")
    assert sorted(paths) == sorted(Path(f"{b}.{ext}") for b in bases for ext in exts)
    for p in paths:
        assert p.stat().st_size > 1000, p
    for p in paths:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        elif p.suffix == ".pdf":
            assert p.read_bytes()[:5] == b"%PDF-"
        else:
            assert b"<svg" in p.read_bytes()[:2000]


# -- the knee -----------------------------------------------------------------------------
def test_knee_is_the_last_rate_at_the_target_before_the_first_miss():
    assert knee([1, 2, 3, 4], [0.99, 0.95, 0.85, 0.95], 0.9) == 2
    assert knee([4, 3, 2, 1], [0.95, 0.85, 0.95, 0.99], 0.9) == 2  # order does not matter
    assert knee([1, 2, 3], [0.9, 0.9, 0.9], 0.9) == 3  # never drops: the largest rate
    assert knee([1, 2], [0.5, 0.95], 0.9) is None  # misses from the start
    assert knee([], [], 0.9) is None
    assert knee([1, 2], [0.95, math.nan], 0.9) == 1  # NaN counts as a miss


# -- a synthetic sweep --------------------------------------------------------------------
LABELS = {"colocated": 1.8, "disagg P1:D1": 2.6}


def write_sweep(d: Path) -> list[dict]:
    rows = []
    for label, k in LABELS.items():
        for rate in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0):
            for seed in (0, 1):
                att = 1 / (1 + math.exp(4 * (rate - k) + 0.2 * seed))
                rows.append(
                    {
                        "run_id": f"r{len(rows):03d}",
                        "workload.rate_scale": rate,
                        "scheduler.name": label.split()[0],
                        "seed": seed,
                        "label": label,
                        "requests": 100,
                        "ttft_s.p50": 0.1,
                        "slo_attainment": round(att, 4),
                        "gpus": 16,
                    }
                )
    with open(d / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(d / "goodput.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "scheduler.name", "goodput_rps_mean", "goodput_rps_ci95",
                    "goodput_per_gpu", "seeds", "gpus"])  # fmt: skip
        for label, k in LABELS.items():
            w.writerow([label, label.split()[0], 4 * k, 0.4, 4 * k / 16, 2, 16])
    (d / "spec.yaml").write_text("slo: {ttft: 1 s, tpot: 50 ms, target: 0.9}\n")
    return rows


def test_attainment_is_averaged_over_seeds_per_label_and_rate(tmp_path):
    write_sweep(tmp_path)
    with open(tmp_path / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    col, series = attainment_series(rows)
    assert col == "workload.rate_scale"
    assert list(series) == ["colocated", "disagg P1:D1"]
    rate, mean, lo, hi, seeds = series["colocated"][2]
    assert (rate, seeds) == (1.5, 2) and lo <= mean <= hi and lo < hi
    assert knee([p[0] for p in series["colocated"]], [p[1] for p in series["colocated"]], 0.9) == 1
    ks = [p[0] for p in series["disagg P1:D1"]]
    assert knee(ks, [p[1] for p in series["disagg P1:D1"]], 0.9) == 2


def test_attainment_and_goodput_plots(tmp_path):
    write_sweep(tmp_path)
    check_written(plot_attainment(tmp_path / "runs.csv", tmp_path / "a", 0.9), tmp_path / "a")
    check_written(plot_goodput(tmp_path / "goodput.csv", tmp_path / "g"), tmp_path / "g")


def test_the_same_data_gives_the_same_files(tmp_path):
    write_sweep(tmp_path)
    plot_attainment(tmp_path / "runs.csv", tmp_path / "a")
    plot_attainment(tmp_path / "runs.csv", tmp_path / "b")
    for ext in ("png", "svg", "pdf"):
        assert (tmp_path / f"a.{ext}").read_bytes() == (tmp_path / f"b.{ext}").read_bytes(), ext


def test_a_runs_csv_without_a_rate_column_is_refused(tmp_path):
    (tmp_path / "runs.csv").write_text("run_id,label,slo_attainment\nr0,x,0.5\n")
    with pytest.raises(TwinError, match=r"no rate column; expected one of workload\.rate_scale"):
        plot_attainment(tmp_path / "runs.csv", tmp_path / "a")


# -- real tiny runs -----------------------------------------------------------------------
def tiny_spec(**over):
    return helpers.small_spec(rate=6.0, requests=60, **over)


def traced_spec(**over):
    """A shorter run for the timelines, whose drawing grows with the iterations traced."""
    return helpers.small_spec(rate=6.0, requests=20, **over)


def requests_csv(path: Path, spec) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=REQUEST_COLUMNS, lineterminator="\n")
        w.writeheader()
        Simulation(spec, on_row=w.writerow).run()
    return path


SPLIT = {
    "cluster": {"topology": "dgx-h100-ib400", "nodes": 2, "prefill": 1, "decode": 1, "tp": 8},
    "scheduler": "disagg",
}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("runs")
    return {
        "colocated": requests_csv(d / "colocated.csv", tiny_spec()),
        "disagg": requests_csv(d / "disagg.csv", tiny_spec(**SPLIT)),
    }


def test_cdfs_of_two_runs(tmp_path, two_runs):
    out = plot_cdfs(two_runs, tmp_path / "cdf", ttft_slo_s=1.0, tpot_slo_s=0.05)
    check_written(out, tmp_path / "cdf")


def test_a_csv_that_is_not_a_requests_csv_is_refused(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(TwinError, match="not a requests CSV"):
        plot_cdfs({"x": tmp_path / "x.csv"}, tmp_path / "cdf")


def test_timeline_from_a_recorder_and_from_its_json(tmp_path):
    rec = TraceRecorder()
    Simulation(traced_spec(**SPLIT), trace=rec).run()
    check_written(plot_timeline(rec, tmp_path / "t1"), tmp_path / "t1")
    path = write_chrome_trace(rec, tmp_path / "trace.json")
    check_written(plot_timeline(path, tmp_path / "t2", window_s=(0.0, 1.0)), tmp_path / "t2")
    with pytest.raises(TwinError, match="needs iteration durations"):
        plot_timeline([(0.0, "iteration", 0, (), 1)], tmp_path / "t3")


def test_plot_dir_makes_every_plot_the_folder_allows(tmp_path, two_runs):
    rows = write_sweep(tmp_path)
    notes: list[str] = []
    out = plot_dir(tmp_path, note=notes.append)
    plots = tmp_path / "plots"
    check_written(out, plots / "attainment", plots / "goodput")
    assert any("no CDFs" in n for n in notes) and any("no timeline" in n for n in notes)
    # per-request CSVs for some runs, and a trace: CDFs and a timeline too
    (tmp_path / "requests").mkdir()
    for row in rows:
        if row["seed"] == 0 and row["workload.rate_scale"] == 1.0:
            name = "colocated" if row["label"] == "colocated" else "disagg"
            (tmp_path / "requests" / f"{row['run_id']}.csv").write_bytes(
                two_runs[name].read_bytes()
            )
    rec = TraceRecorder()
    Simulation(traced_spec(), trace=rec).run()
    write_chrome_trace(rec, tmp_path / "trace.json")
    notes.clear()
    out = plot_dir(tmp_path, tmp_path / "elsewhere", note=notes.append)
    o = tmp_path / "elsewhere"
    check_written(out, o / "attainment", o / "goodput", o / "cdf", o / "timeline")
    assert notes == []


def test_twin_plot_cli(tmp_path, two_runs, capsys):
    write_sweep(tmp_path)
    assert main(["plot", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.split()
    assert str(tmp_path / "plots" / "attainment.png") in printed
    out = tmp_path / "single"
    assert main(["plot", "--requests", *map(str, two_runs.values()), "--out", str(out)]) == 0
    assert capsys.readouterr().out.split() == [
        str(out / "requests-cdf.png"),
        str(out / "requests-cdf.svg"),
        str(out / "requests-cdf.pdf"),
    ]
    rec = TraceRecorder()
    Simulation(traced_spec(), trace=rec).run()
    trace = write_chrome_trace(rec, tmp_path / "run.json")
    assert main(["plot", "--trace", str(trace), "--out", str(out)]) == 0
    assert capsys.readouterr().out.split()[0] == str(out / "run-timeline.png")
    assert main(["plot", "--trace", str(trace), "--window", "0.5,1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["plot", "--trace", str(trace), "--window", "1,0.5"]) == 2
    assert "expected START,END seconds" in capsys.readouterr().err
    assert main(["plot"]) == 2
    assert "give a sweep folder" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "nowhere")]) == 2
