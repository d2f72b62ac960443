"""Prediction intervals from a perf model's held-out residuals (twin.perf.residuals,
twin.sim.intervals)."""

from __future__ import annotations

import json
import math

import pytest
from helpers import small_spec

from twin.errors import SpecError
from twin.perf.residuals import (
    Residual,
    Residuals,
    bounds,
    from_pairs,
    interval,
    loo_coverage,
    read_residuals,
)
from twin.sim.simulation import Simulation
from twin.sim.summary import format_summary


def _table(metric_scores: dict[str, list[float]], coverage: float = 0.8) -> Residuals:
    rows = [
        Residual(f"run{i}", 0, m, r) for m, rs in metric_scores.items() for i, r in enumerate(rs)
    ]
    return Residuals(tuple(rows), "test", coverage)


def test_conformal_bounds_take_the_finite_sample_ranks():
    # n = 9, coverage 0.8 (a = 0.2): k_lo = floor(10 x 0.1) = 1, k_hi = ceil(10 x 0.9) = 9
    scores = [-0.4, -0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3, 0.4]
    assert bounds(scores, 0.8) == (-0.4, 0.4)
    # n = 19: k_lo = floor(2) = 2, k_hi = ceil(18) = 18
    s19 = [float(i) for i in range(19)]
    assert bounds(s19, 0.8) == (1.0, 17.0)
    # too few scores for a tail: unbounded there (n = 3: k_lo = 0, k_hi = ceil(3.6) = 4 > 3)
    assert bounds([0.0, 0.1, 0.2], 0.8) == (-math.inf, math.inf)
    # n = 8, coverage 0.5: k_lo = floor(9 x 0.25) = 2, k_hi = ceil(9 x 0.75) = 7
    assert bounds([0, 1, 2, 3, 4, 5, 6, 7], 0.5) == (1, 6)


def test_interval_maps_log_ratios_to_the_measured_side_and_contains_the_point():
    # the model reads 2x slow to 1.25x fast: the measured value is x/2 .. x*1.25
    lo, hi = interval(10.0, (math.log(0.8), math.log(2.0)))
    assert lo == pytest.approx(5.0) and hi == pytest.approx(12.5)
    # residual bounds around 0 always contain the point itself
    for r in ((-0.1, 0.3), (-2.0, 0.0), (0.0, 0.0)):
        lo, hi = interval(3.0, r)
        assert lo <= 3.0 <= hi
    assert interval(3.0, (-math.inf, math.inf)) == (0.0, math.inf)


def test_from_pairs_takes_log_ratios_and_drops_values_that_bound_nothing():
    rows = from_pairs([("a", 0, "ttft_mean", 2.0, 1.0), ("a", 1, "ttft_mean", 0.0, 1.0),
                       ("b", -1, "e2e_mean", 1.0, math.nan)])  # fmt: skip
    assert rows == [Residual("a", 0, "ttft_mean", math.log(2.0))]


def test_scores_use_stages_and_a_whole_run_row_only_without_them():
    t = Residuals((Residual("a", -1, "e2e_mean", 9.0), Residual("a", 0, "e2e_mean", 1.0),
                   Residual("a", 1, "e2e_mean", 2.0), Residual("b", -1, "e2e_mean", 3.0)),
                  "t")  # fmt: skip
    assert t.scores("e2e_mean") == [1.0, 2.0, 3.0]
    assert t.scores("e2e_mean", leave_out="a") == [3.0]


def test_loo_coverage_counts_held_out_scores_inside_the_others_bounds():
    # coverage 0.5 with 4 other runs each: k_lo = floor(5 x 0.25) = 1, k_hi = ceil(3.75) = 4:
    # the held-out score is inside exactly when it lies within the others' min and max,
    # so of 5 distinct scores the two extremes fall out.
    t = _table({"ttft_mean": [0.5, -0.2, 0.1, 0.0, 0.3]}, coverage=0.5)
    (c,) = loo_coverage(t)
    assert (c.metric, c.inside, c.n) == ("ttft_mean", 3, 5)
    assert c.share == pytest.approx(0.6)


def _residual_file(tmp_path, rows, **extra):
    p = tmp_path / "res.json"
    p.write_text(json.dumps({"source": "hand-made", "rows": rows, **extra}))
    return p


ROWS = [
    {"run": f"r{i}", "stage": 0, "metric": m, "log_ratio": r}
    for i, r in enumerate([-0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    for m in ("ttft_mean", "ttft_p90", "ttft_p99", "e2e_mean", "e2e_p90", "e2e_p99", "itl_mean")
]


def test_a_run_with_residuals_carries_intervals_in_json_and_text(tmp_path):
    path = _residual_file(tmp_path, ROWS)
    spec = small_spec(perf={"kind": "roofline", "residuals": str(path)}, requests=100)
    res = Simulation(spec).run().to_dict()
    iv = res["summary"]["intervals"]
    assert iv["coverage"] == 0.8 and iv["source"] == "hand-made" and iv["runs"] == 9
    assert iv["sha256"] == read_residuals(str(path), "w").sha256()
    # n = 9 at 80%: bounds are the extremes -0.3 and 0.5
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        for q in ("mean", "p50", "p90", "p99"):
            x = res["summary"][key][q]
            assert iv[key][q]["lo"] == pytest.approx(x * math.exp(-0.5))
            assert iv[key][q]["hi"] == pytest.approx(x * math.exp(0.3))
    a = iv["slo_attainment"]
    assert a["lo"] <= res["summary"]["slo_attainment"] <= a["hi"]
    json.dumps(res, allow_nan=False)  # the key is plain JSON
    text = format_summary(res)
    assert "80% prediction intervals" in text and "hand-made" in text


def test_attainment_interval_counts_requests_at_the_scaled_latencies(tmp_path):
    rows = [dict(r) for r in ROWS]
    spec = small_spec(perf={"kind": "roofline", "residuals": {"rows": rows}}, requests=100)
    sim = Simulation(spec, keep_requests=True)
    res = sim.run()
    reqs = res.request_rows
    slo = spec.slo

    def met(f_ttft: float, f_tpot: float) -> float:
        ok = 0
        for r in reqs:
            if r["status"] != "completed":
                continue
            tpot = r["tpot_s"]
            ok += r["ttft_s"] * f_ttft <= slo.ttft_s and (tpot == "" or tpot * f_tpot <= slo.tpot_s)
        return ok / len(reqs)

    a = res.summary["intervals"]["slo_attainment"]
    assert a["lo"] == pytest.approx(met(math.exp(0.3), math.exp(0.3)))
    assert a["hi"] == pytest.approx(met(math.exp(-0.5), math.exp(-0.5)))


def test_a_run_without_residuals_carries_no_intervals():
    res = Simulation(small_spec(requests=50)).run().to_dict()
    assert "intervals" not in res["summary"]
    assert "prediction intervals" not in format_summary(res)


def test_a_metric_without_residuals_gets_no_interval_and_is_named(tmp_path):
    rows = [r for r in ROWS if r["metric"] == "e2e_mean"]
    spec = small_spec(perf={"kind": "roofline", "residuals": {"rows": rows}}, requests=50)
    iv = Simulation(spec).run().to_dict()["summary"]["intervals"]
    assert set(iv["e2e_s"]) == {"mean", "p50"} and "ttft_s" not in iv
    assert "slo_attainment" not in iv
    assert "itl_mean" in iv["no_residuals"] and "ttft_p99" in iv["no_residuals"]


def test_intervals_are_deterministic(tmp_path):
    path = _residual_file(tmp_path, ROWS, coverage=0.9)
    spec = small_spec(perf={"kind": "roofline", "residuals": str(path)}, requests=80)
    a = json.dumps(Simulation(spec).run().to_dict()["summary"], sort_keys=True)
    b = json.dumps(Simulation(spec).run().to_dict()["summary"], sort_keys=True)
    assert a == b and '"coverage": 0.9' in a


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (5, "expected a file path or a mapping"),
        ({"path": "x", "rows": []}, "expected a file path or a mapping"),
        ({"rows": []}, "expected a non-empty list"),
        ({"rows": [{"run": "a", "stage": 0, "metric": "tbt", "log_ratio": 0.1}]}, "tbt"),
        ({"rows": [{"run": "a", "stage": 0, "metric": "e2e_mean", "log_ratio": "x"}]},
         "log_ratio"),
        ({"rows": ROWS, "coverage": 1.0}, "coverage: 1.0"),
        ({"rows": ROWS, "level": 1}, "unknown key 'level'"),
        ("no-such-file.yaml", "is not a file"),
    ],
)  # fmt: skip
def test_bad_residuals_are_one_line_errors(tmp_path, value, words):
    with pytest.raises(SpecError, match="perf.residuals") as e:
        small_spec(perf={"kind": "roofline", "residuals": value})
    assert words in str(e.value) and "\n" not in str(e.value)


def test_read_residuals_round_trips_a_table(tmp_path):
    t = _table({"itl_mean": [0.1, -0.2]}, coverage=0.7)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(t.to_dict()))
    assert read_residuals(str(p), "w", tmp_path) == Residuals(t.rows, "test", 0.7)


def _scored_json(tmp_path, ratios: list[float], overloaded_last: bool = False):
    """A ``twin validate runs --json`` output: one run per ratio (predicted/actual)
    of e2e_mean at stage 0."""
    runs = [
        {"key": f"run{i}", "overloaded": overloaded_last and i == len(ratios) - 1,
         "scores": [{"stage": 0, "metric": "e2e_mean", "predicted": 2.0 * q, "actual": 2.0,
                     "mape": 0.0, "signed": 0.0}]}
        for i, q in enumerate(ratios)
    ]  # fmt: skip
    p = tmp_path / "scored.json"
    p.write_text(json.dumps({"runs": runs, "summary": []}))
    return p


def test_validate_runs_reads_its_json_back_writes_the_table_and_reports_coverage(tmp_path, capsys):
    from twin.cli import main

    # 5 runs at coverage 0.5: each held-out score is inside unless it is an extreme (3 of 5)
    ratios = [1.5, 0.8, 1.1, 1.0, 1.3]
    src = _scored_json(tmp_path, ratios + [100.0], overloaded_last=True)
    out = tmp_path / "res.json"
    assert main(["validate", "runs", str(src), "--coverage", "0.5", "--residuals", str(out),
                 "--json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["coverage"]["level"] == 0.5
    assert doc["coverage"]["metrics"] == [{"metric": "e2e_mean", "inside": 3, "n": 5}]
    table = read_residuals(str(out), "t", tmp_path)
    assert table.coverage == 0.5 and len(table.rows) == 5  # the overloaded run left out
    assert sorted(math.exp(s) for s in table.scores("e2e_mean")) == pytest.approx(sorted(ratios))
    assert main(["validate", "runs", str(src)]) == 0
    text = capsys.readouterr().out
    assert "e2e_mean" in text and "held out" in text


@pytest.mark.parametrize("body", ["[1, 2]", '{"runs": [{"scores": []}]}', "{"])
def test_validate_runs_refuses_a_file_that_is_not_its_output(tmp_path, capsys, body):
    from twin.cli import main

    p = tmp_path / "x.json"
    p.write_text(body)
    assert main(["validate", "runs", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and "x.json" in err and err.count("\n") == 1


def test_goodput_interval_searches_at_the_slos_scaled_by_the_residual_bounds(tmp_path):
    import copy as _copy
    import csv
    from pathlib import Path

    from twin.studies.goodput import goodput

    path = _residual_file(tmp_path, ROWS)  # bounds (-0.3, 0.5) at 80%
    limit = 3.0

    def runner(data, where, base_dir):
        # attainment meets the target up to a rate proportional to the TTFT SLO (s)
        ttft = data["slo"]["ttft"]
        ttft = 1.0 if ttft == "1 s" else ttft
        return 1.0 if data["workload"]["rate_scale"] <= limit * ttft else 0.5

    data = {
        "model": "llama-3.1-8b", "cluster": {"instances": 1, "tp": 1},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 2.0},
                     "max_requests": 20, "rate_scale": 1.0},
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
        "perf": {"kind": "roofline", "residuals": str(path)},
    }  # fmt: skip
    g = goodput(_copy.deepcopy(data), "x.yaml", Path.cwd(), seeds=2, rel_tol=0.01, runner=runner)
    (row,) = g.rows
    lo, hi = row.interval
    assert row.coverage == 0.8
    # offered rps = 2 req/s x rate_scale; each search ends within 1% below its limit
    assert 2 * limit * math.exp(-0.3) / 1.01 <= lo <= 2 * limit * math.exp(-0.3)
    assert 2 * limit * math.exp(0.5) / 1.01 <= hi <= 2 * limit * math.exp(0.5)
    assert lo <= row.mean_rps <= hi
    assert "80% prediction interval" in g.format_table()
    g.write_csv(tmp_path / "g.csv")
    head, first = list(csv.reader((tmp_path / "g.csv").open()))[:2]
    assert head[-3:] == ["goodput_rps_lo", "goodput_rps_hi", "coverage"]
    assert float(first[-3]) == lo and float(first[-2]) == hi
    # without residuals: no interval, no columns, only the point's searches
    del data["perf"]
    g0 = goodput(data, "x.yaml", Path.cwd(), seeds=2, rel_tol=0.01, runner=runner)
    assert g0.rows[0].interval is None and g0.probes < g.probes
    assert "goodput_rps_lo" not in g0.csv_rows()[0]


def test_exports_carry_the_predicted_figures_intervals(tmp_path):
    import copy as _copy
    from pathlib import Path

    import yaml

    from twin.sim.spec import resolve_spec
    from twin.studies.export import dynamo_yaml, from_plan, llm_d_yaml
    from twin.studies.planner import plan_distserve

    data = {
        "name": "Tiny Plan", "model": "llama-3.1-8b",
        "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "prefill": 1, "decode": 1},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 40},
        "engine": {"max_num_seqs": 16}, "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }  # fmt: skip
    spec = resolve_spec(data, "plan.yaml", Path.cwd())
    plan = plan_distserve(spec, replicates=1, max_gpus_per_instance=2, max_decode_requests=100,
                          iterations=3, sample_size=30)  # fmt: skip
    assert from_plan(spec, plan).intervals is None
    with_res = _copy.deepcopy(data)
    with_res["perf"] = {"kind": "roofline", "residuals": str(_residual_file(tmp_path, ROWS))}
    dep = from_plan(resolve_spec(with_res, "plan.yaml", Path.cwd()), plan)
    for text in (dynamo_yaml(dep), llm_d_yaml(dep)):
        (line,) = [x for x in text.splitlines() if x.startswith("# twin: ")]
        h = json.loads(line[len("# twin: ") :])
        iv = h["intervals"]
        assert iv["coverage"] == 0.8 and iv["runs"] == 9 and iv["source"] == "hand-made"
        for k in ("ttft_p90_s", "ttft_p99_s", "tpot_p90_s", "tpot_p99_s"):
            assert iv[k]["lo"] == pytest.approx(h[k] * math.exp(-0.5))
            assert iv[k]["hi"] == pytest.approx(h[k] * math.exp(0.3))
        assert iv["slo_attainment"]["lo"] <= h["slo_attainment"] <= iv["slo_attainment"]["hi"]
        assert "80% prediction intervals" in text
        yaml.safe_load(text)  # still one YAML document


def test_the_goodput_plot_draws_the_interval_when_goodput_csv_has_one(tmp_path):
    from twin.viz.goodput import goodput_figure

    head = "label,goodput_rps_mean,goodput_rps_ci95,goodput_per_gpu,seeds,gpus"
    rows = [
        dict(zip(head.split(","), ["a", "4.0", "0.5", "2.0", "2", "2"], strict=True)),
        dict(zip(head.split(","), ["b", "6.0", "0.2", "3.0", "2", "2"], strict=True)),
    ]
    plain = goodput_figure([dict(r) for r in rows])
    rows[0] |= {"goodput_rps_lo": "3.0", "goodput_rps_hi": "5.5", "coverage": "0.8"}
    rows[1] |= {"goodput_rps_lo": "4.0", "goodput_rps_hi": "", "coverage": "0.8"}
    fig = goodput_figure(rows)
    ax = fig.axes[0]
    grey = [line for line in ax.get_lines() if line.get_color() == "dimgray"]
    spans = sorted(tuple(line.get_xdata()) for line in grey if len(line.get_xdata()) == 2)
    assert spans == [(3.0, 5.5), (4.0, 9.0)]  # an open top drawn to 1.5 x the mean
    assert not [x for x in plain.axes[0].get_lines() if x.get_color() == "dimgray"]
    assert any("80% prediction interval" in t.get_text() for t in fig.texts)


def test_calibrate_residuals_replay_each_run_with_the_terms_fitted_to_the_others(shared_data):
    import dataclasses

    from twin.studies.calibrate_runs import PRIOR, perf_block
    from twin.studies.runresiduals import loo_table
    from twin.studies.runs import read_run
    from twin.studies.validate_realrun import replay

    data = shared_data / "realruns"
    if not (data / "manifest.csv").is_file():
        pytest.skip(f"{data}: no realruns data (manifest.csv)")
    runs = [read_run(data / "runs" / "20260217-162547-llama-2-7b-tp1-roleplay"),
            read_run(data / "runs" / "20260218-150304-codellama-34b-tp2-general")]  # fmt: skip
    terms = {runs[0].key: dict(PRIOR), runs[1].key: {**PRIOR, "overhead_s": 3e-3}}
    table = loo_table(runs, terms, 30, "t", perf_block)
    assert table.runs() == sorted(r.key for r in runs)
    for run in runs:  # each run's rows are its replay with its own held-out terms
        spec = {**run.spec, "perf": perf_block(terms[run.key]),
                "slo": {"client_latency": f"{terms[run.key]['client_latency_s']!r} s"}}  # fmt: skip
        s = replay(dataclasses.replace(run, spec=spec), stage_requests=30).scores
        mine = {(r.stage, r.metric): r.log_ratio for r in table.rows if r.run == run.key}
        assert mine == {k: pytest.approx(math.log(v.predicted / v.actual)) for k, v in s.items()}


def test_the_shipped_vllm_table_holds_the_presets_held_out_residuals():
    from twin.perf.residuals import METRICS

    t = read_residuals("vllm", "perf.residuals")
    assert t.source.startswith("twin calibrate --runs") and "leave one run out" in t.source
    assert len(t.runs()) == 17 and t.coverage == 0.8
    assert {r.metric for r in t.rows} == set(METRICS)
    # each run held out: at least the coverage asked of its interval, for every metric
    assert all(c.share >= 0.8 for c in loo_coverage(t))
    spec = small_spec(perf={"kind": "roofline", "engine": "vllm", "residuals": "vllm"},
                      requests=40)  # fmt: skip
    iv = Simulation(spec).run().to_dict()["summary"]["intervals"]
    assert iv["runs"] == 17 and iv["sha256"] == t.sha256() and "no_residuals" not in iv
