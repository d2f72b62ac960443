"""Measured inference-perf runs: the reader (run folders and the realruns layout), the
metrics with the published definitions, the score, and `twin validate run|runs`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from twin.cli import main
from twin.errors import TwinError
from twin.studies.realrun import score, stage_of, twin_metrics
from twin.studies.runs import read_run, read_runs
from twin.workload.inference_perf import read_records
from twin.workload.traces import detect_format, read_trace

TRACED = "20260217-155451-llama-2-7b-tp1-codegen"
AGGREGATE = "64-qwen2-5-7b-instruct-tp1-roleplay-1-1"


def _row(t: float, e2e: float, ttft: float, out: int = 11, status: str = "completed") -> dict:
    return {"arrival_s": t, "e2e_s": e2e, "ttft_s": ttft, "output_tokens": out, "status": status}


def test_stage_of_assigns_by_send_time_and_keeps_late_sends_in_the_last_stage():
    stages = ((5.0, 600.0), (10.0, 600.0))
    assert [stage_of(t, stages) for t in (0.0, 599.999, 600.0, 1199.0, 1203.9)] == [0, 0, 1, 1, 1]
    assert stage_of(5000.0, ((1.0, 10.0),)) == 0


def test_twin_metrics_by_the_published_definitions():
    stages = ((1.0, 10.0), (2.0, 10.0))
    rows = [_row(1.0, 2.0, 0.2), _row(2.0, 4.0, 0.4), _row(12.0, 3.0, 0.1),
            _row(13.0, 99.0, 9.0, status="rejected")]  # fmt: skip
    m = twin_metrics(rows, stages)
    assert sorted(m) == [-1, 0, 1]
    assert m[0]["e2e_mean"] == pytest.approx(3.0)
    assert m[0]["e2e_p90"] == pytest.approx(np.percentile([2.0, 4.0], 90))
    assert m[0]["ttft_mean"] == pytest.approx(0.3)
    assert m[0]["itl_mean"] == pytest.approx((3.0 - 0.3) / 10)  # (E2E - TTFT) / (11 - 1)
    assert m[1]["e2e_mean"] == pytest.approx(3.0) and m[1]["ttft_p99"] == pytest.approx(0.1)
    assert m[-1]["e2e_mean"] == pytest.approx(3.0) and m[-1]["ttft_mean"] == pytest.approx(0.7 / 3)
    # the measured run's output count as the denominator
    m2 = twin_metrics(rows, stages, output_means={0: 6.0})
    assert m2[0]["itl_mean"] == pytest.approx(2.7 / 5) and m2[1]["itl_mean"] == m[1]["itl_mean"]


def test_score_gives_absolute_and_signed_percentages():
    s = score({0: {"e2e_mean": 1.2, "ttft_mean": 0.05}, 1: {"e2e_mean": 1.0}},
              {0: {"e2e_mean": 1.0, "ttft_mean": 0.1}})  # fmt: skip
    assert set(s) == {(0, "e2e_mean"), (0, "ttft_mean")}
    assert s[(0, "e2e_mean")].mape == pytest.approx(20.0)
    assert s[(0, "e2e_mean")].signed == pytest.approx(20.0)
    assert s[(0, "ttft_mean")].signed == pytest.approx(-50.0)
    assert s[(0, "ttft_mean")].mape == pytest.approx(50.0)


# --------------------------------------------------------------------------- a run folder


def _lifecycle(e2e: float, ttft: float, out_mean: float, ok: int = 3, bad: int = 0) -> dict:
    return {
        "successes": {
            "count": ok,
            "latency": {
                "request_latency": {"mean": e2e, "p90": e2e * 1.1, "p99": e2e * 1.2},
                "time_to_first_token": {"mean": ttft, "p90": ttft * 2, "p99": ttft * 3,
                                        "median": ttft},
            },
            "output_len": {"mean": out_mean},
        },
        "failures": {"count": bad},
    }  # fmt: skip


def _record(start: float, prompt: int, out: int, *, error: bool = False) -> dict:
    body = {"prompt": "x", "max_tokens": 8, "ignore_eos": True}
    return {
        "start_time": 1000.0 + start, "end_time": 1001.0 + start, "request": json.dumps(body),
        "response": None, "info": {"input_tokens": prompt, "output_tokens": out,
                                   "output_token_times": [1000.25 + start]},
        "error": {"error_type": "timeout", "error_msg": ""} if error else None,
    }  # fmt: skip


def make_run_folder(
    root: Path, *, with_records: bool = True, name: str = "run-a", failed: int = 0
) -> Path:
    d = root / name
    (d / "results").mkdir(parents=True)
    (d / "exp-config.yaml").write_text(
        "model: meta-llama/Llama-2-7b-hf\ntensor_parallelism: 1\nmax_model_len: 4096\n"
        "max_num_batched_tokens: 2048\nmax_num_seqs: 64\n"
    )
    profile = {
        "data": {"type": "shared_prefix", "shared_prefix": {
            "num_unique_system_prompts": 2, "num_users_per_system_prompt": 3,
            "system_prompt_len": 32, "question_len": 20, "output_len": 8,
            "enable_multi_turn_chat": True}},
        "load": {"type": "constant",
                 "stages": [{"rate": 1, "duration": 4}, {"rate": 2, "duration": 4}]},
    }  # fmt: skip
    (d / "profile.yaml").write_text(json.dumps(profile))
    res = d / "results"
    summary = _lifecycle(1.0, 0.1, 7.0, bad=failed)
    (res / "summary_lifecycle_metrics.json").write_text(json.dumps(summary))
    (res / "stage_0_lifecycle_metrics.json").write_text(json.dumps(_lifecycle(0.8, 0.05, 7.0)))
    (res / "stage_1_lifecycle_metrics.json").write_text(json.dumps(_lifecycle(1.2, 0.15, 7.0)))
    if with_records:  # completion order, not send order
        recs = [_record(5.0, 60, 5), _record(0.0, 58, 6), _record(2.5, 0, 0, error=True)]
        (res / "per_request_lifecycle_metrics.json").write_text(json.dumps(recs))
    return d


def test_reads_an_inference_perf_run_folder(tmp_path):
    d = make_run_folder(tmp_path)
    with pytest.raises(TwinError, match="GPU"):
        read_run(d)
    run = read_run(d, gpu="h100-sxm")
    assert run.key == "run-a" and run.stages == ((1.0, 4.0), (2.0, 4.0)) and not run.overloaded
    assert run.completed == 3  # the summary report's successes.count
    assert run.actual[-1]["e2e_mean"] == 1.0 and run.actual[1]["ttft_p90"] == pytest.approx(0.3)
    assert run.actual[0]["itl_mean"] == pytest.approx((0.8 - 0.05) / 6)
    assert run.output_means()[0] == pytest.approx(7.0)
    eng = run.spec["engine"]
    assert (eng["max_num_seqs"], eng["max_batched_tokens"], eng["max_model_len"]) == (
        64,
        2048,
        4096,
    )
    assert eng["prefix_caching"] and eng["chunked_prefill"] and eng["block_size"] == 16
    assert eng["gpu_memory_utilization"] == 0.9  # vLLM's default, not stated in the folder
    w = run.spec["workload"]
    assert w["format"] == "inference-perf" and w["output_tokens"] == 8
    assert w["prefixes"]["shared_prefix"] == {
        "groups": 2, "users": 3, "system_prompt_len": 32, "question_len": 20, "output_len": 8,
        "multi_turn": True,
    }  # fmt: skip
    # the records: send order, times from the first send, max_tokens under ignore_eos,
    # the failed request with the median recorded counts
    recs = read_records(w["trace"])
    assert [r.send_s for r in recs] == [0.0, 2.5, 5.0]
    assert [r.failed for r in recs] == [False, True, False]
    assert recs[0].ttft_s == pytest.approx(0.25) and recs[0].e2e_s == pytest.approx(1.0)
    assert detect_format(w["trace"]) == "inference-perf"
    trace = read_trace(w["trace"])
    assert [(t.prompt_tokens, t.output_tokens) for t in trace] == [(58, 8), (58, 8), (60, 8)]


def test_a_run_folder_without_records_replays_the_profile(tmp_path):
    run = read_run(make_run_folder(tmp_path, with_records=False), gpu="h100-sxm")
    w = run.spec["workload"]
    assert w["arrival"] == {"process": "poisson", "rate": 1.0} and w["duration"] == "8 s"
    assert w["rate_schedule"] == {"kind": "steps", "points": [["0 s", 1.0], ["4 s", 2.0]]}
    assert w["lengths"]["shared_prefix"]["multi_turn"] is True
    assert [r.key for r in read_runs(tmp_path, gpu="h100-sxm")] == ["run-a"]


def test_reduced_csv_records_read_gzipped(tmp_path):
    import gzip

    p = tmp_path / "t.csv.gz"
    with gzip.open(p, "wt") as f:
        f.write("index,arrival_s,input_tokens,output_tokens,has_error,ttft_s,e2e_s\n"
                "0,0.0,100,9,0,0.1,1.0\n1,0.5,0,0,1,,\n2,1.5,102,0,0,0.1,1.0\n")  # fmt: skip
    assert detect_format(p) == "inference-perf"
    assert [(t.arrival_s, t.prompt_tokens, t.output_tokens) for t in read_trace(p)] == [
        (0.0, 100, 9), (0.5, 100, 9), (1.5, 102, 9)
    ]  # fmt: skip
    bad = tmp_path / "bad.csv"
    bad.write_text("index,arrival_s,input_tokens,output_tokens,has_error\n0,soon,1,1,0\n")
    with pytest.raises(TwinError, match=r"bad.csv: line 2: column arrival_s: 'soon'"):
        read_trace(bad, "inference-perf")


# --------------------------------------------------------------------------- the data


def _spec_accepted(run, tmp_path: Path, capsys) -> dict:
    p = tmp_path / f"{run.key}.yaml"
    p.write_text(json.dumps(run.spec))  # JSON is YAML
    assert main(["spec", str(p)]) == 0
    return json.loads(capsys.readouterr().out)["spec"]


@pytest.fixture
def realruns(shared_data: Path) -> Path:
    data = shared_data / "realruns"
    if not (data / "manifest.csv").is_file():
        pytest.skip(f"{data}: no realruns data (manifest.csv)")
    return data


def test_a_traced_and_an_aggregate_only_run_of_the_data_make_specs_twin_accepts(
    realruns, tmp_path, capsys
):
    data = realruns
    traced = read_run(data / "runs" / TRACED)
    assert traced.key == TRACED and traced.stages == ((5.0, 600.0), (10.0, 600.0))
    assert traced.actual[-1]["e2e_mean"] == pytest.approx(2.0807397430955556)
    resolved = _spec_accepted(traced, tmp_path, capsys)
    assert resolved["workload"]["output_tokens"] == 247
    assert resolved["cluster"]["tp"] == 1 and resolved["gpu"] == "h100-sxm"
    agg = read_run(data / AGGREGATE)
    assert agg.stages == ((6.0, 1200.0),) and not agg.overloaded
    from twin.perf.llm import get_model

    qwen = get_model(agg.spec["model"])  # the catalog's row (a config.json row) or inline
    assert qwen.layers == 28 and qwen.params == pytest.approx(7.6e9, rel=0.01)  # 7.61B
    resolved = _spec_accepted(agg, tmp_path, capsys)
    assert resolved["workload"]["lengths"]["shared_prefix"]["question_len"] == 600
    assert len(read_runs(data)) == 21


def test_validate_run_prints_the_table_for_a_traced_run(realruns, capsys):
    data = realruns
    assert main(["validate", "run", str(data / "runs" / TRACED), "--stage-requests", "60"]) == 0
    out = capsys.readouterr().out
    assert "120 requests replayed, first 60 per stage" in out
    for name in ("run      e2e_mean", "stage 0  ttft_p99", "stage 1  itl_mean"):
        assert name in out
    assert main(["validate", "run", str(data / "runs" / TRACED), "--stage-requests", "60",
                 "--json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["replayed"] == 120 and all(math.isfinite(s["mape"]) for s in doc["scores"])


# --------------------------------------------------------------------------- over runs


def _scored(key: str, e2e_signed: float, *, overloaded: bool = False):
    from twin.studies.realrun import Score
    from twin.studies.validate_realrun import RunScore

    a = 1.0
    p = a * (1 + e2e_signed / 100)
    s = {(-1, "e2e_mean"): Score(p, a, abs(e2e_signed), e2e_signed)}
    return RunScore(key, overloaded, 10, 10, None, s)


def test_summarize_gives_mean_median_signed_and_the_worst_run():
    from twin.studies.validate_realrun import format_summary, summarize

    results = [_scored("a", 10.0), _scored("b", -30.0), _scored("c", 20.0),
               _scored("x", 900.0, overloaded=True)]  # fmt: skip
    (row,) = summarize(results)
    assert (row.stage, row.metric, row.runs) == (-1, "e2e_mean", 3)
    assert row.mean == pytest.approx(20.0) and row.median == pytest.approx(20.0)
    assert row.signed_mean == pytest.approx(0.0)
    assert (row.worst, row.worst_mape) == ("b", pytest.approx(30.0))
    (every,) = summarize(results, include_overloaded=True)
    assert every.runs == 4 and every.worst == "x"
    text = format_summary([row], 3, 1)
    assert "3 runs scored (1 overloaded runs left out; --all adds them)" in text
    assert "b (30.0%)" in text


def test_validate_runs_replays_every_run_folder_and_prints_one_table(tmp_path, capsys):
    make_run_folder(tmp_path)
    assert main(["validate", "runs", str(tmp_path), "--gpu", "h100-sxm", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["key"] for r in doc["runs"]] == ["run-a"] and doc["runs"][0]["replayed"] == 3
    pairs = {(r["stage"], r["metric"]) for r in doc["summary"]}
    assert pairs >= {(-1, "e2e_mean"), (1, "itl_mean")}
    make_run_folder(tmp_path, name="run-b", failed=1)  # 1 of 4 failed: overloaded
    assert read_run(tmp_path / "run-b", gpu="h100-sxm").overloaded
    assert main(["validate", "runs", str(tmp_path), "--gpu", "h100-sxm"]) == 0
    assert "1 runs scored (1 overloaded runs left out; --all adds them)" in capsys.readouterr().out
    assert main(["validate", "runs", str(tmp_path), "--gpu", "h100-sxm", "--all", "--json"]) == 0
    assert [r["key"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["run-a", "run-b"]
    assert main(["validate", "runs", str(tmp_path)]) == 2
    assert "--gpu" in capsys.readouterr().err
    assert main(["validate", "run", str(tmp_path / "run-a"), "--gpu", "h100-sxm",
                 "--stage-requests", "0"]) == 2  # fmt: skip
    assert "--stage-requests: 0; expected an integer >= 1" in capsys.readouterr().err


def test_newer_records_nest_their_counts_and_without_ignore_eos_keep_the_recorded_output(
    tmp_path,
):
    rec = {
        "start_time": 10.0, "end_time": 12.0, "request": json.dumps({"max_tokens": 50}),
        "info": {"request_metrics": {"text": {"input_tokens": 33}},
                 "response_metrics": {"output_tokens": 41, "output_token_times": [10.5, 11.0]}},
        "error": None,
    }  # fmt: skip
    p = tmp_path / "per_request_lifecycle_metrics.json"
    p.write_text(json.dumps([rec]))
    (r,) = read_records(p)
    assert (r.send_s, r.prompt_tokens, r.output_tokens, r.failed) == (0.0, 33, 41, False)
    assert (r.ttft_s, r.e2e_s) == (0.5, 2.0)
    assert detect_format(p) == "inference-perf"


def test_a_bad_manifest_is_a_one_line_error(tmp_path, capsys):
    cols = ("key,model,gpu,tp,max_num_seqs,max_num_batched_tokens,system_prompt_len,"
            "question_len,output_len,stages")  # fmt: skip
    (tmp_path / "manifest.csv").write_text(f"{cols}\nk1,llama-2-7b,H100,1,8,64,16,16,4,[[1 2]]\n")
    assert main(["validate", "run", str(tmp_path / "k1")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and "manifest.csv: k1: stages: '[[1 2]]'" in err
    (tmp_path / "manifest.csv").write_text("key,model\nk1,llama-2-7b\n")
    assert main(["validate", "runs", str(tmp_path)]) == 2
    assert "manifest.csv: line 1: missing column(s) gpu, tp" in capsys.readouterr().err
    (tmp_path / "manifest.csv").write_text(f'{cols}\nk1,llama-2-7b,TPU,1,8,64,16,16,4,"[[1, 2]]"\n')
    assert main(["validate", "run", str(tmp_path / "k1")]) == 2
    assert "gpu: 'TPU' unknown" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        # parameter counts of the Hugging Face model pages (safetensors metadata)
        ("01-ai__Yi-34B", 34.39),
        ("Qwen__Qwen2.5-7B-Instruct", 7.62),
        ("codellama__CodeLlama-34b-Instruct-hf", 33.74),
        ("mistralai__Mistral-Nemo-Instruct-2407", 12.25),
        # 109B with its vision encoder; the language model alone is 107.8B
        ("RedHatAI__Llama-4-Scout-17B-16E-Instruct-FP8-dynamic", 107.8),
    ],
)
def test_inline_models_from_config_json_count_their_parameters(realruns, name, billions):
    from twin.perf.llm import get_model
    from twin.studies.realrun import model_mapping

    config = json.loads((realruns / "models" / f"{name}.json").read_text())
    m = model_mapping(config, name, name, fp8="FP8" in name)
    assert m["params"] / 1e9 == pytest.approx(billions, rel=0.005)
    spec = get_model(m)
    assert spec.layers == config.get("text_config", config)["num_hidden_layers"]
    if "FP8" in name:
        assert spec.weight_dtype_bytes == 1 and spec.experts == 16 and spec.shared_experts == 1


def test_the_client_time_out_comes_from_the_run_config(tmp_path):
    """inference-perf's ``load.request_timeout``, or aiohttp's 300 s when it is
    null or left out."""
    run = read_run(make_run_folder(tmp_path, with_records=False), gpu="h100-sxm")
    assert run.spec["workload"]["timeout"] == "300 s"  # profile.yaml leaves it out
    d = make_run_folder(tmp_path, name="run-b")
    profile = json.loads((d / "profile.yaml").read_text())
    profile["load"]["request_timeout"] = 60
    (d / "profile.yaml").write_text(json.dumps(profile))
    assert read_run(d, gpu="h100-sxm").spec["workload"]["timeout"] == "60 s"
    profile["load"]["request_timeout"] = "soon"
    (d / "profile.yaml").write_text(json.dumps(profile))
    with pytest.raises(TwinError, match=r"run-b: load.request_timeout: 'soon'"):
        read_run(d, gpu="h100-sxm")


def test_the_overloaded_runs_of_the_data_time_out_at_300_s(realruns):
    """They state ``request_timeout: null`` (their failed requests end 300 to 301 s
    after their sends); a run without a load generator config states none."""
    overloaded = [r for r in read_runs(realruns) if r.overloaded]
    assert len(overloaded) == 4
    assert {r.spec["workload"].get("timeout") for r in overloaded} == {"300 s"}
    # 4800 sent, 4068 failed (the manifest): the report sets the twin's count beside it
    assert overloaded[0].completed == 4800 - 4068
    assert "timeout" not in read_run(realruns / AGGREGATE).spec["workload"]
