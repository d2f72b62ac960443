"""Sweeps, executors, the output layout twin.viz.plots reads, and the goodput search."""

from __future__ import annotations

import copy
import csv
import json
import math
from pathlib import Path

import pytest
import yaml

from twin.cli import main
from twin.errors import SpecError, TwinError
from twin.sim.spec import parse_yaml, read_spec_text
from twin.studies.goodput import ci95, find_max_rate, goodput
from twin.studies.sweep import Executor, apply_sweep_overrides, expand, parse_sweep, run_sweep

BASE = {
    "name": "tiny",
    "model": "llama-3.1-8b",
    "cluster": {"instances": 1, "tp": 1},
    "workload": {
        "lengths": "azure-conv",
        "arrival": {"process": "poisson", "rate": 2.0},
        "max_requests": 20,
    },
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}


def sweep_spec(**sweep) -> dict:
    d = copy.deepcopy(BASE)
    d["sweep"] = sweep or {
        "workload.rate_scale": [1.0, 4.0],
        "zip": [{"cluster.instances": [1, 2], "tag.size": ["one", "two"]}],
        "slo.ttft": ["1 s", "200 ms"],
    }
    return d


# -- expansion -----------------------------------------------------------------------
def test_cartesian_order_as_written_with_zip_groups():
    axes, runs = expand(sweep_spec(), "tiny.yaml", Path.cwd())
    assert [a.keys for a in axes] == [
        ("workload.rate_scale",),
        ("cluster.instances", "tag.size"),
        ("slo.ttft",),
    ]
    got = [
        (r.params["workload.rate_scale"], r.params["tag.size"], r.params["slo.ttft"]) for r in runs
    ]
    assert got == [
        (1.0, "one", "1 s"), (1.0, "one", "200 ms"), (1.0, "two", "1 s"), (1.0, "two", "200 ms"),
        (4.0, "one", "1 s"), (4.0, "one", "200 ms"), (4.0, "two", "1 s"), (4.0, "two", "200 ms"),
    ]  # fmt: skip
    assert [r.index for r in runs] == list(range(8))
    # the rate and seed stay out of the label; a tag names its zipped keys
    assert runs[2].label == "size=two slo.ttft=1 s"
    assert [r.gpus for r in runs[:4]] == [1, 1, 2, 2]
    assert runs[0].run_id == runs[0].spec_sha256[:12] and len(runs[0].run_id) == 12
    assert runs[2].data["cluster"]["instances"] == 2 and "tag" not in runs[2].data


def test_null_deletes_a_key_and_label_skips_it():
    d = copy.deepcopy(BASE)
    d["cluster"] = {"topology": "dgx-h100-ib400", "nodes": 1, "tp": 2}
    d["scheduler"] = "disagg"
    d["sweep"] = {
        "zip": [
            {
                "scheduler.name": ["disagg", "colocated"],
                "cluster.prefill.instances": [2, None],
                "cluster.decode.instances": [1, None],
                "cluster.instances": [None, 3],
            }
        ]
    }
    _, runs = expand(d, "x.yaml", Path.cwd())
    assert [r.label for r in runs] == [
        "scheduler=disagg prefill=2 decode=1",
        "scheduler=colocated instances=3",
    ]
    assert [r.gpus for r in runs] == [6, 6]
    assert "prefill" not in runs[1].data["cluster"]


@pytest.mark.parametrize(
    "sweep, message",
    [
        ({"slo.ttft": "1 s"}, "sweep: slo.ttft: '1 s' must be a non-empty list"),
        ({"slo.ttft": []}, "sweep: slo.ttft: [] must be a non-empty list"),
        (
            {"zip": [{"slo.ttft": ["1 s", "2 s"], "slo.tpot": ["50 ms"]}]},
            "sweep.zip[0]: zipped keys need as many values each; slo.ttft has 2, slo.tpot has 1",
        ),
        ({"zip": {"a": [1]}}, "sweep.zip: {'a': [1]} must be a list"),
        ({"seed": [0], "zip": [{"seed": [1]}]}, "sweep: seed is swept twice"),
        ({"cluster..tp": [1]}, "'cluster..tp' is not a key path"),
    ],
)
def test_sweep_section_errors(sweep, message):
    with pytest.raises(SpecError) as e:
        parse_sweep(sweep, "x.yaml")
    assert message in str(e.value)


def test_unknown_key_names_the_run():
    d = sweep_spec(**{"slo.ttft": ["1 s"], "engine.chunky": [True]})
    with pytest.raises(SpecError) as e:
        expand(d, "x.yaml", Path.cwd())
    msg = str(e.value)
    assert msg.startswith("x.yaml: sweep run 0 (slo.ttft=1 s, engine.chunky=True): ")
    assert "chunky" in msg


def test_a_bad_value_names_the_run_and_nothing_runs(tmp_path):
    d = sweep_spec(**{"cluster.tp": [1, 0]})
    with pytest.raises(SpecError, match=r"sweep run 1 \(cluster.tp=0\).*cluster.tp: 0 must be"):
        run_sweep(d, "x.yaml", Path.cwd(), tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_runs_that_are_the_same_spec_are_refused():
    d = sweep_spec(**{"tag.a": [1, 2]})
    with pytest.raises(SpecError, match="sweep run 1 .*the same spec as run 0"):
        expand(d, "x.yaml", Path.cwd())


def test_set_sweep_key_replaces_its_values():
    d = sweep_spec()
    apply_sweep_overrides(
        d, ["sweep.cluster.instances=[3, 4]", "sweep.seed=[5]", "workload.max_requests=7"]
    )
    assert d["sweep"]["zip"][0]["cluster.instances"] == [3, 4]
    assert d["sweep"]["seed"] == [5] and d["workload"]["max_requests"] == 7


# -- outputs -------------------------------------------------------------------------
def test_output_layout(tmp_path):
    d = sweep_spec()
    out = tmp_path / "o"
    done = run_sweep(d, "tiny.yaml", Path.cwd(), out)
    assert (done.ran, done.skipped) == (8, 0)
    assert yaml.safe_load((out / "spec.yaml").read_text()) == d
    rows = list(csv.reader((out / "runs.csv").open()))
    head = rows[0]
    swept = ["workload.rate_scale", "cluster.instances", "tag.size", "slo.ttft"]
    assert head[:6] == ["run_id", *swept, "label"]
    for metric in (
        "requests", "completed", "rejected", "ttft_s.p50", "ttft_s.p99", "tpot_s.p50",
        "slo_attainment", "throughput_rps", "kv_bytes_transferred",
    ):  # fmt: skip
        assert metric in head
    assert head[6:9] == ["requests", "completed", "rejected"] and head[-1] == "gpus"
    assert len(rows) == 9 and all(len(r) == len(head) for r in rows)
    files = sorted(p.name for p in (out / "runs").iterdir())
    assert files == sorted(f"{r.run_id}.json" for r in done.runs)
    for run, row in zip(done.runs, rows[1:], strict=True):
        doc = json.loads((out / "runs" / f"{run.run_id}.json").read_text())
        assert list(doc) == ["params", "header", "summary", "instances", "links", "timeline"]
        assert doc["params"] == run.params
        assert doc["header"]["spec_sha256"][:12] == run.run_id == row[0]
        rec = dict(zip(head, row, strict=True))
        assert rec["label"] == run.label and rec["gpus"] == str(run.gpus)
        assert float(rec["slo_attainment"]) == doc["summary"]["slo_attainment"]  # repr-exact
        assert rec["ttft_s.p99"] == repr(doc["summary"]["ttft_s"]["p99"])
        assert rec["workload.rate_scale"] == repr(run.params["workload.rate_scale"])


def test_resume_skips_finished_runs(tmp_path):
    from twin.studies.sweep import run_spec

    calls = []

    def counting(data, where, base_dir):
        calls.append(data["slo"]["ttft"])
        return run_spec(data, where, base_dir)

    d = sweep_spec(**{"slo.ttft": ["1 s", "2 s", "3 s"]})
    out = tmp_path / "o"
    run_sweep(d, "x.yaml", Path.cwd(), out, runner=counting)
    assert len(calls) == 3
    first = (out / "runs.csv").read_bytes()
    run_sweep(d, "x.yaml", Path.cwd(), out, runner=counting)
    assert len(calls) == 3
    assert (out / "runs.csv").read_bytes() == first
    # a missing or broken JSON runs again; so does a JSON of another spec
    runs = sorted((out / "runs").iterdir())
    runs[0].unlink()
    runs[1].write_text('{"header": {"spec_sha256": "0"}')
    run_sweep(d, "x.yaml", Path.cwd(), out, runner=counting)
    assert len(calls) == 5
    assert (out / "runs.csv").read_bytes() == first


def test_results_of_other_code_are_not_reused(tmp_path, monkeypatch):
    from twin import _version
    from twin.studies.sweep import run_spec

    calls = []

    def counting(data, where, base_dir):
        calls.append(1)
        return run_spec(data, where, base_dir)

    d = sweep_spec(**{"slo.ttft": ["1 s", "2 s"]})
    out = tmp_path / "o"
    run_sweep(d, "x.yaml", Path.cwd(), out, runner=counting)
    monkeypatch.setattr(_version, "_code_sha", "0" * 64)  # as if the model had changed
    run_sweep(d, "x.yaml", Path.cwd(), out, runner=counting)
    assert len(calls) == 4


def test_a_failing_run_keeps_the_finished_ones(tmp_path):
    from twin.studies.sweep import run_spec

    def flaky(data, where, base_dir):
        if data["slo"]["ttft"] == "2 s":
            raise RuntimeError("worker died")
        return run_spec(data, where, base_dir)

    d = sweep_spec(**{"slo.ttft": ["1 s", "2 s", "3 s"]})
    out = tmp_path / "o"
    with pytest.raises(RuntimeError):
        run_sweep(d, "x.yaml", Path.cwd(), out, runner=flaky)
    assert len(list((out / "runs").iterdir())) == 1
    # no runs.csv that looks complete, and no temporary file left beside it
    assert sorted(p.name for p in out.iterdir()) == ["runs", "spec.yaml"]
    assert run_sweep(d, "x.yaml", Path.cwd(), out).ran == 2


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_jobs_give_identical_bytes(tmp_path):
    d = sweep_spec()
    run_sweep(d, "tiny.yaml", Path.cwd(), tmp_path / "j1", executor=Executor(jobs=1))
    run_sweep(d, "tiny.yaml", Path.cwd(), tmp_path / "j2", executor=Executor(jobs=2))
    a, b = _tree(tmp_path / "j1"), _tree(tmp_path / "j2")
    assert len(a) == 11 and a == b  # spec, runs.csv, runs.parquet, 8 runs


def test_dask_gives_identical_bytes(tmp_path):
    pytest.importorskip(
        "dask.distributed", reason="dask.distributed is not installed (pip install 'pd-twin[dask]')"
    )
    d = sweep_spec()
    run_sweep(d, "tiny.yaml", Path.cwd(), tmp_path / "local", executor=Executor(jobs=1))
    run_sweep(d, "tiny.yaml", Path.cwd(), tmp_path / "dask", executor=Executor("dask", jobs=2))
    assert _tree(tmp_path / "local") == _tree(tmp_path / "dask")


def test_jobs_default_to_every_core_and_say_what_is_wrong(capsys):
    from twin.cli import main
    from twin.studies.sweep import cores, parse_jobs

    assert parse_jobs("auto") is None and parse_jobs(None) is None and parse_jobs("3") == 3
    assert Executor().workers == cores() == Executor(jobs=None).workers
    assert Executor(jobs=2).workers == 2
    for bad in ("0", "-2", "many"):
        with pytest.raises(TwinError, match=rf"-j: '{bad}' must be a positive integer or auto"):
            parse_jobs(bad)
    for cmd in ("sweep", "goodput", "plan", "provision"):
        assert main([cmd, "disagg", "-j", "x"]) == 2
        assert capsys.readouterr().err == (
            "twin: error: -j: 'x' must be a positive integer or auto\n"
        )


def test_an_address_means_dask():
    assert Executor("local", address="tcp://127.0.0.1:8786").kind == "dask"
    with pytest.raises(TwinError, match="--executor: 'ray'; expected one of local, dask"):
        Executor("ray")


def test_progress_is_quiet_off_a_terminal(tmp_path, capsys):
    run_sweep(sweep_spec(**{"slo.ttft": ["1 s"]}), "x.yaml", Path.cwd(), tmp_path / "o")
    assert capsys.readouterr().err == ""


# -- goodput -------------------------------------------------------------------------
def test_rate_search_brackets_and_bisects():
    for limit in (0.3, 1.0, 3.7, 100.0):

        def meets(r, limit=limit):
            return r <= limit

        rate, bounded = find_max_rate(meets, 1.0, rel_tol=0.01)
        assert bounded and rate <= limit and limit / rate <= 1.01 + 1e-12
    assert find_max_rate(lambda r: True, 1.0, up=3) == (8.0, False)
    assert find_max_rate(lambda r: False, 1.0, down=3) == (0.0, True)


def test_ci95():
    from scipy.stats import t

    assert ci95([2.0, 2.0, 2.0]) == 0.0
    assert ci95([1.0, 2.0, 3.0]) == pytest.approx(t.ppf(0.975, 2) / math.sqrt(3))
    assert math.isnan(ci95([1.0]))


def _step_attainment(limit):
    def runner(data, where, base_dir):
        return 1.0 if data["workload"]["rate_scale"] <= limit[data["cluster"]["instances"]] else 0.5

    return runner


def test_goodput_per_configuration_within_tolerance(tmp_path):
    d = sweep_spec(
        **{
            "workload.rate_scale": [1.0, 2.0],
            "cluster.instances": [1, 2],
            "seed": [0, 1, 2],
        }
    )
    limits = {1: 3.7, 2: 9.1}
    g = goodput(d, "x.yaml", Path.cwd(), rel_tol=0.01, runner=_step_attainment(limits))
    assert g.rate_key == "workload.rate_scale" and g.keys == ["cluster.instances"]
    assert [r.label for r in g.rows] == ["instances=1", "instances=2"]
    for row, n in zip(g.rows, (1, 2), strict=True):
        assert row.seeds == (0, 1, 2) and row.gpus == n
        for rate in row.rates:
            assert rate <= limits[n] and limits[n] / rate <= 1.01 + 1e-12
        # offered rate: the arrival rate (2 req/s) x rate_scale; seeds agree -> CI 0
        assert row.mean_rps == pytest.approx(2.0 * row.rates[0])
        assert row.ci95_rps == 0.0
        assert row.per_gpu == pytest.approx(row.mean_rps / n)
    g.write_csv(tmp_path / "goodput.csv")
    rows = list(csv.reader((tmp_path / "goodput.csv").open()))
    assert rows[0] == [
        "label", "cluster.instances", "goodput_rps_mean", "goodput_rps_ci95",
        "goodput_per_gpu", "seeds", "gpus",
    ]  # fmt: skip
    assert rows[1][0] == "instances=1" and rows[1][-2:] == ["3", "1"]
    assert float(rows[2][2]) == g.rows[1].mean_rps


def test_goodput_takes_a_zip_whose_values_are_mappings():
    # a group's shape given whole (cluster.prefill: {instances: 1, tp: 2}) used
    # to stop the search with "unhashable type: 'dict'"
    d = sweep_spec(
        **{
            "workload.rate_scale": [1.0],
            "zip": [
                {
                    "tag.shape": ["small", "big"],
                    "cluster.instances": [1, 2],
                    "workload.lengths": [
                        {
                            "prompt": {"dist": "fixed", "value": n},
                            "output": {"dist": "fixed", "value": 4},
                        }
                        for n in (8, 16)
                    ],
                }
            ],
            "seed": [0],
        }
    )
    limits = {1: 3.7, 2: 9.1}
    g = goodput(d, "x.yaml", Path.cwd(), rel_tol=0.01, runner=_step_attainment(limits))
    assert [r.label for r in g.rows] == ["shape=small", "shape=big"]
    assert [r.gpus for r in g.rows] == [1, 2]
    assert g.rows[1].mean_rps == pytest.approx(2.0 * g.rows[1].rates[0])


def test_goodput_runs_the_simulation(tmp_path):
    d = copy.deepcopy(BASE)
    d["workload"]["max_requests"] = 60
    d["slo"] = {"ttft": "150 ms", "tpot": "50 ms"}
    g = goodput(d, "x.yaml", Path.cwd(), seeds=2, rel_tol=0.2, executor=Executor(jobs=2))
    (row,) = g.rows
    assert g.rate_key == "workload.arrival.rate" and row.seeds == (0, 1)
    assert 0 < row.mean_rps and row.bounded
    assert row.goodputs_rps == row.rates  # the arrival rate is the offered rate


# -- the command line ----------------------------------------------------------------
def _write(tmp_path, data) -> str:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


@pytest.mark.parametrize(
    "args, message",
    [
        (["sweep", "{spec_nosweep}"], "sweep: missing; twin sweep runs a spec with a sweep:"),
        (["sweep", "{spec}", "-j", "0"], "-j: '0' must be a positive integer or auto"),
        (["sweep", "{spec}", "--set", "sweep.engine.x=[1]"], "sweep run 0"),
        (["goodput", "{spec}", "--seeds", "0"], "--seeds: 0 must be a positive integer"),
        (["goodput", "{spec}", "--target", "2"], "--target: 2.0 must be in (0, 1]"),
    ],
)
def test_cli_errors(tmp_path, capsys, args, message):
    spec = _write(tmp_path, sweep_spec(**{"slo.ttft": ["1 s"]}))
    nosweep = tmp_path / "n.yaml"
    nosweep.write_text(yaml.safe_dump(BASE))
    argv = [a.format(spec=spec, spec_nosweep=nosweep) for a in args]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and err.count("\n") == 1 and message in err


def test_cli_sweep_and_goodput(tmp_path, capsys):
    spec = _write(tmp_path, sweep_spec(**{"slo.ttft": ["1 s", "2 s"]}))
    out = tmp_path / "o"
    assert main(["sweep", spec, "-j", "1", "--out", str(out)]) == 0
    assert "2 runs (2 run, 0 already done)" in capsys.readouterr().out
    assert main(["sweep", spec, "-j", "1", "--out", str(out)]) == 0
    assert "(0 run, 2 already done)" in capsys.readouterr().out
    # per-request rows on request, and the CDFs drawn from them
    more = tmp_path / "with-requests"
    assert main(["sweep", spec, "-j", "1", "--out", str(more), "--requests"]) == 0
    assert len(list((more / "requests").glob("*.csv"))) == 2
    assert (more / "plots" / "cdf.png").is_file(), capsys.readouterr()
    args = ["goodput", spec, "-j", "1", "--seeds", "1", "--rel-tol", "0.5", "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "slo.ttft=1 s" in text and (out / "goodput.csv").is_file()
    # the folder is plotted afterwards (goodput bars; no rate axis, so no attainment curve)
    assert (out / "plots" / "goodput.png").is_file() and str(out / "plots" / "goodput.svg") in text
    assert main([*args, "--no-plots"]) == 0 and "goodput.png" not in capsys.readouterr().out


def test_bundled_pool_ratio_expands(tmp_path, monkeypatch):
    # its data: traces are only checked to exist, not read, by the expansion
    for kind in ("code", "conv"):
        trace = tmp_path / f"traces/azure_llm_2023/AzureLLMInferenceTrace_{kind}.csv"
        trace.parent.mkdir(parents=True, exist_ok=True)
        trace.touch()
    monkeypatch.setenv("TWIN_DATA", str(tmp_path))
    text, where, base_dir = read_spec_text("pool-ratio")
    axes, runs = expand(parse_yaml(text, where), where, base_dir)
    assert len(runs) == 2 * 5 * 3 * 3 * 10
    assert {r.gpus for r in runs} == {12}
    label = "trace=code scheduler=disagg prefill=8 decode=4 slo.ttft=0.5 s slo.tpot=20 ms"
    assert runs[0].label == label
    pd = ("cluster.prefill.instances", "cluster.decode.instances")
    ratios = {tuple(r.params[k] for k in pd) for r in runs}
    assert ratios == {(8, 4), (9, 3), (6, 6), (4, 8), (None, None)}
    assert [r.params["workload.rate_scale"] for r in runs[:10]] == [
        0.5, 1, 2, 3, 4, 8, 16, 24, 48, 96,
    ]  # fmt: skip
