"""The sweep plots hold up at 10 and 90 configurations: judged on the drawn
figure (matplotlib's renderer: tick labels' window extents, the title's and
the legend's boxes, the axes' area), on sweep folders in the layout
twin/studies/sweep.py writes, shaped like the bundled pool-ratio sweep."""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import math
import struct
from pathlib import Path

import pytest

from twin.cli import main
from twin.studies.sweep import Axis, _cell, make_label
from twin.viz.attainment import attainment_figure
from twin.viz.cdf import common_rate, sweep_cdf_figure
from twin.viz.plots import sweep_figures
from twin.viz.style import PlotOptions, Styler, layout_problems

TRACES = (
    ("code", "../shared/data/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv"),
    ("conv", "../shared/data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"),
)
# pool-ratio's zipped deployments: scheduler, prefill, decode, instances
DEPLOYMENTS = (
    ("disagg", 8, 4, None), ("disagg", 9, 3, None), ("disagg", 6, 6, None),
    ("disagg", 4, 8, None), ("colocated", None, None, 12),
)  # fmt: skip
RATES = (0.5, 1.0, 2.0)


def pool_ratio_axes(slo_pairs: int) -> list[Axis]:
    ttfts = ("0.5 s", "1 s", "2 s") if slo_pairs == 9 else ("1 s",)
    tpots = ("20 ms", "50 ms", "100 ms") if slo_pairs == 9 else ("50 ms",)
    return [
        Axis(("tag.trace", "workload.trace"), TRACES, zipped=True),
        Axis(
            (
                "scheduler.name",
                "cluster.prefill.instances",
                "cluster.decode.instances",
                "cluster.instances",
            ),
            DEPLOYMENTS,
            zipped=True,
        ),  # fmt: skip
        Axis(("slo.ttft",), tuple((t,) for t in ttfts)),
        Axis(("slo.tpot",), tuple((t,) for t in tpots)),
        Axis(("workload.rate_scale",), tuple((r,) for r in RATES)),
    ]


def write_pool_ratio(d: Path, slo_pairs: int, requests: Path | None = None) -> list[dict]:
    """runs.csv and goodput.csv of a pool-ratio-shaped sweep: 10 configurations
    (1 SLO pair) or 90 (9), attainment falling past a knee that differs per
    configuration; ``requests``: a per-request CSV copied for every run."""
    axes = pool_ratio_axes(slo_pairs)
    keys = [k for a in axes for k in a.keys]
    rows = []
    for n, combo in enumerate(itertools.product(*(a.rows for a in axes))):
        params = {}
        for axis, row in zip(axes, combo, strict=True):
            params.update(zip(axis.keys, row, strict=True))
        label = make_label(params, axes, {"workload.rate_scale", "seed"})
        knee = 0.8 + 0.5 * (n // len(RATES) % 7)  # of the logistic; the plot's knee is below
        att = 1 / (1 + math.exp(6 * (params["workload.rate_scale"] - knee)))
        run_id = hashlib.sha256(json.dumps(params).encode()).hexdigest()[:12]
        rows.append(
            {"run_id": run_id, **{k: _cell(params[k]) for k in keys}, "label": label,
             "requests": 100, "slo_attainment": repr(round(0.5 + 0.5 * att, 4)), "gpus": 12}
        )  # fmt: skip
    with open(d / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    ckeys = [k for k in keys if k != "workload.rate_scale"]
    with open(d / "goodput.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["label", *ckeys, "goodput_rps_mean", "goodput_rps_ci95", "goodput_per_gpu",
                    "seeds", "gpus"])  # fmt: skip
        for i, r in enumerate(rows[:: len(RATES)]):
            g = 3.0 + 41.7 * (i % 11)
            w.writerow([r["label"], *(r[k] for k in ckeys), g, g / 10, g / 12, 3, 12])
    (d / "spec.yaml").write_text("name: pool-ratio\nslo: {ttft: 1 s, tpot: 50 ms, target: 0.9}\n")
    if requests is not None:
        (d / "requests").mkdir()
        for r in rows:
            if r["workload.rate_scale"] != "0.5":
                (d / "requests" / f"{r['run_id']}.csv").write_bytes(requests.read_bytes())
    return rows


@pytest.fixture(scope="module")
def a_requests_csv(tmp_path_factory) -> Path:
    from test_plots import requests_csv, tiny_spec

    return requests_csv(tmp_path_factory.mktemp("req") / "r.csv", tiny_spec())


def texts_of(fig) -> list[str]:
    """Every legend text and title of a figure."""
    out = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    out += [ax.get_title() for ax in fig.axes]
    return out + [fig.get_suptitle()]


# -- the checker itself ----------------------------------------------------------------------
def test_the_layout_check_finds_what_is_wrong():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))  # no constrained layout: the title runs off the top
    ax = fig.add_axes((0.1, 0.1, 0.85, 0.85))
    ax.bar(range(12), range(12))
    ax.set_xticks(range(12), [f"a long configuration name {i}" for i in range(12)])
    ax.plot([0, 1], [0, 1], label="x")
    ax.legend(loc="upper left")
    fig.suptitle("a title\nof\nmany\nlines", y=1.2)
    problems = layout_problems(fig)
    assert any("x tick labels" in p and "overlap" in p for p in problems)
    assert any("the title outside the figure" in p for p in problems)
    assert any("the legend covers axes 0" in p for p in problems)
    small = Figure(figsize=(6, 6))
    small.add_axes((0.1, 0.1, 0.3, 0.3))
    assert layout_problems(small) == ["the axes cover 9% of the figure"]


# -- labels, styles, legends -----------------------------------------------------------------
def test_labels_drop_the_constant_keys_and_the_paths_zipped_with_a_tag(tmp_path):
    rows = write_pool_ratio(tmp_path, 1)
    keys = [k for a in pool_ratio_axes(1) for k in a.keys if k != "workload.rate_scale"]
    configs = [{k: r[k] for k in keys} for r in rows[:: len(RATES)]]
    s = Styler(configs, keys, PlotOptions(), "runs.csv")
    assert s.constant == [("slo.ttft", "1 s"), ("slo.tpot", "50 ms")]
    assert s.label(configs[0]) == "trace=code scheduler=disagg prefill=8 decode=4"
    assert s.label(configs[4]) == "trace=code scheduler=colocated instances=12"
    assert not s.grouped and len({s.color(c) for c in configs}) == 10
    renamed = PlotOptions(labels={"tag.trace": "", "cluster.prefill.instances": "P"})
    s = Styler(configs, keys, renamed, "runs.csv")
    assert s.label(configs[0]) == "code scheduler=disagg P=8 decode=4"
    # a facet by the trace path reads as its tag; what the panel says, its labels do not
    s = Styler(configs, keys, PlotOptions(facet="workload.trace"), "runs.csv")
    assert [s.facet_title(f) for f in s.facets] == ["trace=code", "trace=conv"]
    assert s.label(configs[0]) == "scheduler=disagg prefill=8 decode=4"


def test_many_configurations_get_a_grouped_legend(tmp_path):
    rows = write_pool_ratio(tmp_path, 9)
    keys = [k for a in pool_ratio_axes(9) for k in a.keys if k != "workload.rate_scale"]
    configs = [{k: r[k] for k in keys} for r in rows[:: len(RATES)]]
    s = Styler(configs, keys, PlotOptions(), "runs.csv")
    # prefill has the most values a palette tells apart; decode and scheduler follow it
    assert s.hue == "cluster.prefill.instances" and s.grouped
    assert (s.linestyle_key, s.marker_key, s.unstyled) == ("tag.trace", "slo.ttft", ["slo.tpot"])
    s = Styler(configs, keys, PlotOptions(facet="tag.trace"), "runs.csv")
    assert (s.linestyle_key, s.marker_key, s.unstyled) == ("slo.ttft", "slo.tpot", [])
    styles = {(s.facet_of(c), s.color(c), s.linestyle(c), s.marker(c)) for c in configs}
    assert len(styles) == 90  # every configuration drawn its own way


@pytest.mark.parametrize(
    "slo_pairs, opts",
    [
        (1, PlotOptions()),
        (9, PlotOptions()),
        (9, PlotOptions(facet="workload.trace", hue="cluster.prefill.instances", at_rate=1.9)),
    ],
    ids=["10", "90", "90-facet-hue"],
)
def test_the_pool_ratio_plots_are_laid_out(tmp_path, a_requests_csv, slo_pairs, opts):
    # CDFs of 90 configurations cost seconds: drawn once, with panels and a hue
    cdfs = slo_pairs == 1 or opts.facet is not None
    write_pool_ratio(tmp_path, slo_pairs, a_requests_csv if cdfs else None)
    notes: list[str] = []
    figs = sweep_figures(tmp_path, opts, note=notes.append)
    assert list(figs) == ["attainment", "goodput", "cdf"][: 3 if cdfs else 2]
    assert notes == (
        [] if cdfs else [f"no CDFs: no per-request data ({tmp_path}/requests/<run_id>.csv)"]
    )
    for name, fig in figs.items():
        assert layout_problems(fig) == [], name
    texts = texts_of(figs["attainment"])
    assert not any("AzureLLM" in t for t in texts)  # the trace's path reads as its tag
    if slo_pairs == 1:
        legend = [t.get_text() for t in figs["attainment"].legends[0].get_texts()]
        assert len(legend) == 12  # ten configurations, the target, the knee
        assert "trace=code scheduler=disagg prefill=8 decode=4 (knee 0.5x)" in legend
        assert "all: slo.ttft=1 s, slo.tpot=50 ms" in figs["attainment"].get_suptitle()
    else:
        legend = [t.get_text() for t in figs["attainment"].legends[0].get_texts()]
        assert len(legend) <= 20 and "prefill:" in legend and "  none" in legend
    if opts.facet:
        assert [ax.get_title() for ax in figs["attainment"].axes] == ["trace=code", "trace=conv"]
        title = "TTFT and TPOT CDFs at 2x (the swept rate nearest 1.9x)"
        assert figs["cdf"].get_suptitle().startswith(title)
        assert len(figs["goodput"].axes) == 2
        assert len(figs["goodput"].axes[0].get_yticklabels()) == 45


def test_the_cdfs_compare_every_configuration_at_one_rate(tmp_path, a_requests_csv):
    rows = write_pool_ratio(tmp_path, 1, a_requests_csv)
    with open(tmp_path / "runs.csv", newline="") as f:
        table = list(csv.DictReader(f))
    # the knees are 0.5, 1, 1, 2, 2, 2, 2, 0.5, 1, 1: the median is 1
    assert common_rate(table, 0.9, None) == (1.0, "the median knee")
    assert common_rate(table, 0.9, 1.7) == (1.7, "asked")
    slo = {"target": 0.9, "ttft": "1 s", "tpot": "50 ms"}
    fig = sweep_cdf_figure(tmp_path, table, slo, PlotOptions(at_rate=1.7))
    assert fig.get_suptitle().startswith("TTFT and TPOT CDFs at 2x (the swept rate nearest 1.7x)")
    fig = sweep_cdf_figure(tmp_path, table, slo, PlotOptions())
    assert fig.get_suptitle().startswith("TTFT and TPOT CDFs at 1x (the median knee)")
    # the SLOs every configuration shares are drawn, and named in the legend
    assert "SLO TTFT 1 s, TPOT 50 ms" in [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(rows) == 30


def test_a_numeric_hue_of_many_values_is_a_colorbar(tmp_path):
    rows = []
    for i, rate in itertools.product(range(1, 21), (1.0, 2.0)):
        rows.append({"run_id": f"r{len(rows)}", "cluster.decode.instances": str(i),
                     "workload.rate_scale": repr(rate), "label": f"decode={i}",
                     "slo_attainment": repr(1.0 if rate * i < 20 else 0.5)})  # fmt: skip
    fig = attainment_figure(rows, "runs.csv", 0.9, PlotOptions(hue="cluster.decode.instances"))
    assert [ax.get_label() for ax in fig.axes].count("<colorbar>") == 1
    assert layout_problems(fig) == []


# -- the command line: --facet, --hue, --size, --dpi, --label, --at-rate ------------------------
def png_size(path: Path) -> tuple[int, int]:
    w, h = struct.unpack(">II", path.read_bytes()[16:24])
    return w, h


def test_twin_plot_takes_the_plot_options(tmp_path, capsys):
    write_pool_ratio(tmp_path, 1)
    (tmp_path / "goodput.csv").unlink()  # the attainment plot alone tells
    out = tmp_path / "p"
    argv = ["plot", str(tmp_path), "--out", str(out), "--size", "9,5", "--dpi", "40",
            "--label", "tag.trace=workload", "--hue", "scheduler.name"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / f"attainment.{e}") for e in ("png", "svg", "pdf")]
    assert png_size(out / "attainment.png") == (360, 200)
    for bad, says in [
        (["--facet", "nope"], "--facet: 'nope' is not a swept key of"),
        (["--hue", "workload.rate_scale"], "--hue: 'workload.rate_scale' is not a swept key"),
        (["--size", "9"], "--size: '9'; expected W,H in inches"),
        (["--size", "0,5"], "--size: 0,5: width and height must be"),
        (["--dpi", "0"], "--dpi: 0 must be an integer from 10 to 1200"),
        (["--label", "tag.trace"], "--label: 'tag.trace'; expected KEY=TEXT"),
        (["--at-rate", "-1"], "--at-rate: -1.0 must be a positive number"),
    ]:
        assert main(["plot", str(tmp_path), "--out", str(out), *bad]) == 2, bad
        err = capsys.readouterr().err
        assert err.startswith("twin: error: ") and says in err and err.count("\n") == 1, err
    assert main(["plot", "--requests", str(tmp_path / "runs.csv"), "--facet", "x"]) == 2
    assert "apply to a sweep folder" in capsys.readouterr().err


# -- the bundled sweep itself, small ---------------------------------------------------------
def test_the_bundled_pool_ratio_sweep_plots_after_it_runs(shared_data, tmp_path, capsys):
    traces = shared_data / "traces" / "azure_llm_2023"
    code, conv = (traces / f"AzureLLMInferenceTrace_{k}.csv" for k in ("code", "conv"))
    out = tmp_path / "pool-ratio"
    argv = [
        "sweep", "pool-ratio", "-j", "1", "--out", str(out), "--requests",
        "--set", f"sweep.workload.trace=[{code}, {conv}]", "--set", f"workload.trace={conv}",
        "--set", "workload.max_requests=20", "--set", "sweep.workload.rate_scale=[1, 50]",
        "--set", "sweep.slo.ttft=[1 s]", "--set", "sweep.slo.tpot=[50 ms]",
        "--hue", "cluster.prefill.instances", "--dpi", "30",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out.split()
    plots = out / "plots"
    for name in ("attainment", "cdf"):
        assert [p for p in printed if p.startswith(str(plots / f"{name}."))] == [
            str(plots / f"{name}.{e}") for e in ("png", "svg", "pdf")
        ]
    figs = sweep_figures(out, PlotOptions(facet="workload.trace"), note=lambda m: None)
    assert [ax.get_title() for ax in figs["attainment"].axes] == ["trace=code", "trace=conv"]
    for name, fig in figs.items():
        assert layout_problems(fig) == [], name
