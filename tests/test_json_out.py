"""``--json PATH|-``: pure JSON on stdout with ``-`` (the text on stderr), the
same document in a file, for run, compare, kv, handoff, topo, plan, provision."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from twin.cli import main

RUN = {
    "name": "json-out",
    "model": "llama-3.1-8b",
    "cluster": {"instances": 1, "tp": 1},
    "workload": {
        "lengths": "azure-conv",
        "arrival": {"process": "poisson", "rate": 2.0},
        "max_requests": 10,
    },
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}
PLAN = {
    "model": "llama-3.1-8b",
    "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "prefill": 1, "decode": 1},
    "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                 "max_requests": 40},
    "engine": {"max_num_seqs": 16},
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}  # fmt: skip
PROVISION = {
    "model": "llama-3.1-8b",
    "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "tp": 4, "prefill": 1, "decode": 1},
    "scheduler": "splitwise",
    "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 5},
                 "max_requests": 1000},
    "slo": {"ttft": "500 ms", "tpot": "40 ms"},
}  # fmt: skip


def _spec(tmp_path: Path, data: dict, name: str = "spec.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _both(capsys, tmp_path: Path, argv: list[str]) -> tuple[dict, str]:
    """Run ``argv`` with ``--json -`` (stdout must be JSON alone) and with
    ``--json FILE``; the same document both ways. Returns it and the text."""
    assert main([*argv, "--json", "-"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    path = tmp_path / "out.json"
    assert main([*argv, "--json", str(path)]) == 0
    text = capsys.readouterr().out
    assert json.loads(path.read_text()) == doc
    assert err == text  # the readable text moved to stderr, unchanged
    return doc, text


def test_run_json_to_stdout(tmp_path, capsys):
    spec = _spec(tmp_path, RUN)
    doc, text = _both(capsys, tmp_path, ["run", spec])
    assert list(doc) == ["header", "summary", "instances", "links", "timeline"]
    assert doc["summary"]["requests"] == 10 and "json-out" in text
    assert doc["header"]["spec"]["name"] == "json-out"
    # --quiet: nothing on stderr either
    assert main(["run", spec, "--json", "-", "-q"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["summary"] == doc["summary"] and err == ""


def test_compare_json_to_stdout(tmp_path, capsys):
    data = {**RUN, "compare": {"one": {}, "two": {"cluster.instances": 2}}}
    doc, text = _both(capsys, tmp_path, ["run", _spec(tmp_path, data)])
    assert doc["header"]["labels"] == ["one", "two"] and list(doc["runs"]) == ["one", "two"]
    assert "one" in text and "two" in text


def test_kv_json(tmp_path, capsys):
    doc, text = _both(capsys, tmp_path, ["kv", "llama-3.1-8b", "--tokens", "1000"])
    # 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes (bf16)
    assert doc["bytes_per_token"] == 2 * 32 * 8 * 128 * 2 == 131_072
    assert doc["blocks"] == 63 and doc["tokens_allocated"] == 1008
    assert doc["kv_bytes"] == 1008 * 131_072 and doc["bytes_per_block"] == 16 * 131_072
    assert doc["model"] == "llama-3.1-8b" and doc["bytes_per_element"] == 2
    assert f"{doc['kv_bytes']:,} B" in text


def test_handoff_json(tmp_path, capsys):
    argv = ["handoff", "llama-3.1-8b", "--tokens", "1000", "--topology", "dgx-h100-ib400"]
    doc, text = _both(capsys, tmp_path, argv)
    assert doc["kv_bytes"] == 1000 * 131_072 and doc["placement"] == "cross-node"
    assert doc["transfer_s"] > doc["bytes_s"] > 0 and f"{doc['kv_bytes']:,} B" in text
    # --json alone still prints the JSON to stdout
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == doc


def test_topo_json(tmp_path, capsys):
    doc, text = _both(capsys, tmp_path, ["topo", "dgx-h100-ib400", "--nodes", "2"])
    assert (doc["name"], doc["nodes"], doc["gpus"], doc["nics"]) == ("dgx-h100-ib400", 2, 16, 16)
    assert doc["node_groups"][0]["nodes"] == [0, 1]
    assert doc["node_groups"][0]["description"] in text
    # each direction of a GPU's 400 Gb/s NIC: 50 GB/s x the link's efficiency
    eff = doc["links"]["infiniband"]["efficiency"]
    assert doc["injection_bytes_s"]["min"] == pytest.approx(50e9 * eff)
    assert doc["bisection_bytes_s"] == pytest.approx(8 * 50e9 * eff)
    assert doc["bisection_cut"] == {"by": "node", "first_half": [0, 0], "second_half": [1, 1]}
    assert [(p["src_gpu"], p["dst_gpu"]) for p in doc["paths"]] == [(0, 1), (0, 8)]
    assert sum(v["count"] for v in doc["links"].values()) == 96  # directed: 32 each kind


def test_plan_json(tmp_path, capsys, monkeypatch):
    import functools

    from twin.studies import planner

    # the real planner over a smaller search (TP1 only, fewer bisection steps)
    small = dict(max_gpus_per_instance=1, max_decode_requests=100, iterations=3)
    monkeypatch.setattr(
        planner, "plan_distserve", functools.partial(planner.plan_distserve, **small)
    )
    argv = ["plan", _spec(tmp_path, PLAN), "-j", "1", "--sample", "30", "--replicates", "1"]
    doc, text = _both(capsys, tmp_path, argv)
    assert doc["model"] == "llama-3.1-8b" and doc["topology"] == "dgx-h100-ib400"
    pre, dec = doc["prefill"], doc["decode"]
    assert pre["role"] == "prefill" and dec["role"] == "decode"
    assert doc["gpus_used"] == pre["instances"] * pre["gpus"] + dec["instances"] * dec["gpus"]
    # one node: the deployment's goodput is its slower phase's
    assert doc["capacity_rps"] == pytest.approx(
        min(pre["instances"] * pre["goodput_rps"], dec["instances"] * dec["goodput_rps"])
    )
    assert doc["spec_overrides"]["cluster"]["prefill"]["instances"] == pre["instances"]
    assert doc["slo"] == {"ttft_s": 1.0, "tpot_s": 0.05, "target": 0.9}
    assert {(c["role"], c["tp"], c["pp"]) for c in doc["candidates"]} >= {
        ("prefill", pre["tp"], pre["pp"]),
        ("decode", dec["tp"], dec["pp"]),
    }
    assert f"{doc['gpus_used']} GPUs" in text and "# paste into the spec:" in text
    assert math.isfinite(doc["capacity_rps"])


def test_provision_json(tmp_path, capsys):
    spec = _spec(tmp_path, PROVISION)
    argv = ["provision", spec, "--power", "6 kW", "--sample", "40", "--replicates", "1", "-j", "1"]
    doc, text = _both(capsys, tmp_path, argv)
    assert [(c["prefill"], c["decode"]) for c in doc["candidates"]] == [(1, 1)]
    best = doc["best"]
    assert best == doc["candidates"][0] and best["power_w"] == 8 * 700  # 8 H100 SXM at TDP
    assert best["goodput_ci95"] is None  # one sample: no interval
    assert best["goodputs_rps"] == [best["goodput_rps"]]
    assert doc["prefill_group"] == {"tp": 4, "pp": 1, "template": None}
    assert doc["budget"] in text and doc["sample"] == 40


def test_an_unwritable_json_path_fails_before_the_work(tmp_path, capsys):
    bad = str(tmp_path / "no" / "x.json")
    for argv in (
        ["plan", _spec(tmp_path, PLAN), "--json", bad],
        ["provision", _spec(tmp_path, PROVISION), "--json", bad],
        ["kv", "llama-3.1-8b", "--json", bad],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("twin: error: ") and err.count("\n") == 1 and "x.json" in err


def test_bench_json_to_stdout(capsys):
    assert main(["bench", "--sizes", "20", "--config", "colocated", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)["rows"]
    assert [(r["config"], r["requests"]) for r in rows] == [("colocated", 20)]
    assert rows[0]["completed"] <= 20 and "colocated" in err and "CPU s" in err
