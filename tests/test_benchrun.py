"""Measured runs of ``vllm bench serve`` and AIPerf as ``twin validate run`` and
``twin calibrate --runs`` read them (twin/studies/benchrun.py), on the SYNTHETIC
fixtures of tests/fixtures/benchruns/ (the same 25 requests in both formats; see
tests/fixtures/README.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from twin.cli import main
from twin.errors import TwinError
from twin.studies.runs import read_run, read_runs
from twin.workload.measured import read_measured
from twin.workload.traces import detect_format, read_trace

FIXTURES = Path(__file__).parent / "fixtures" / "benchruns"
VLLM = FIXTURES / "vllm-llama31-8b-qps4.synthetic.json"
AIPERF = FIXTURES / "aiperf-llama31-8b"


def test_both_formats_read_as_the_same_run():
    v = read_run(VLLM, gpu="h100-sxm")
    a = read_run(AIPERF, gpu="H100")  # the data's GPU names are taken too
    for run, fmt, timeout in ((v, "vllm-bench", "21600 s"), (a, "aiperf", "600 s")):
        w = run.spec["workload"]
        assert (w["format"], w["timeout"]) == (fmt, timeout)
        assert run.spec["model"] == "meta-llama/Llama-3.1-8B-Instruct"
        assert run.spec["gpu"] == "h100-sxm" and run.spec["cluster"]["tp"] == 1
        assert not run.overloaded  # 1 of 25 failed, median TTFT well under 10 s
        assert detect_format(w["trace"]) == fmt
    assert v.spec["engine"]["max_num_seqs"] == 64  # from --metadata max_num_seqs=64
    assert "max_num_seqs" not in a.spec["engine"]  # AIPerf does not record the server's
    assert v.stages[0] == pytest.approx(a.stages[0], rel=1e-6)
    for s in (-1, 0):
        assert v.actual[s] == pytest.approx(a.actual[s], rel=1e-6)
    # by the published definitions, over the 24 successful requests: E2E is TTFT plus
    # TPOT x (output - 1), as both tools define TPOT
    reqs = read_measured(VLLM).requests
    e2e = np.array([r.ttft_s + r.tpot_s * (r.output_tokens - 1) for r in reqs])
    ttft = np.array([r.ttft_s for r in reqs])
    out = np.array([r.output_tokens for r in reqs])
    m = v.actual[-1]
    assert len(reqs) == 24
    assert m["e2e_mean"] == pytest.approx(e2e.mean()) and m["ttft_p99"] == pytest.approx(
        np.percentile(ttft, 99)
    )
    assert m["itl_mean"] == pytest.approx((e2e.mean() - ttft.mean()) / (out.mean() - 1))
    trace = read_trace(VLLM)
    assert [t.arrival_s for t in trace] == [r.send_s for r in reqs]
    assert [t.arrival_s for t in read_trace(AIPERF / "profile_export.jsonl")] == pytest.approx(
        [t.arrival_s for t in trace], abs=1e-6
    )


def test_validate_run_and_calibrate_take_them(capsys):
    assert main(["validate", "run", str(VLLM), "--gpu", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "24 requests replayed, 24 completed by the twin (24 in the run)" in out
    assert "ttft_p99" in out
    assert [r.key for r in read_runs(FIXTURES, gpu="h100-sxm")] == [
        "aiperf-llama31-8b", "vllm-llama31-8b-qps4.synthetic",
    ]  # fmt: skip
    assert main(["calibrate", "--runs", str(FIXTURES), "--gpu", "h100-sxm",
                 "--fit", "overhead_s"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "in sample over 2 runs" in out and "perf:\n  kind: roofline" in out


def _bad_vllm(tmp_path: Path, **changes) -> Path:
    doc = json.loads(VLLM.read_text())
    doc.update(changes)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_concurrency": 8}, "bad.json: max_concurrency: 8; the twin replays"),
        ({"request_rate": "inf"}, "bad.json: request_rate: 'inf'; the twin replays"),
        ({"tensor_parallel_size": "two"}, "bad.json: tensor_parallel_size: 'two' is not an"),
        ({"max_num_seqs": "0"}, "bad.json: max_num_seqs: '0' is not an integer > 0"),
        ({"start_times": [1.0]}, "bad.json: start_times: expected a list of 25 entries"),
        ({"model_id": "no-such/model"}, "bad.json: model 'no-such/model' is not in the catalog"),
    ],
)
def test_a_bad_vllm_result_is_a_one_line_error(tmp_path, capsys, changes, message):
    path = _bad_vllm(tmp_path, **changes)
    assert main(["validate", "run", str(path), "--gpu", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and err.count("\n") == 1, err
    assert message in err, err


def test_a_bad_aiperf_export_is_a_one_line_error(tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(AIPERF, d)
    summary = json.loads((d / "profile_export_aiperf.json").read_text())
    summary["input_config"]["endpoint"]["timeout_seconds"] = -1
    (d / "profile_export_aiperf.json").write_text(json.dumps(summary))
    assert main(["validate", "run", str(d), "--gpu", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert "profile_export_aiperf.json: input_config.endpoint: timeout_seconds: -1" in err
    (d / "profile_export_aiperf.json").unlink()
    with pytest.raises(TwinError, match="no profile_export_aiperf.json beside"):
        read_run(d, gpu="h100-sxm")
    lines = (d / "profile_export.jsonl").read_text().splitlines()
    rec = json.loads(lines[2])
    rec["metadata"]["request_start_ns"] = "soon"
    lines[2] = json.dumps(rec)
    (d / "profile_export.jsonl").write_text("\n".join(lines))
    assert main(["validate", "run", str(d), "--gpu", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert "profile_export.jsonl: line 3: metadata.request_start_ns 'soon'" in err, err
    assert err.count("\n") == 1
    with pytest.raises(TwinError, match="GPU"):
        read_run(VLLM)
