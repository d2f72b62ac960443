"""Disaggregated serving end to end: KV hand-off over the topology."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedulers.colocated  # registers the built-ins when not installed
import schedulers.disagg  # noqa: F401
from twin.errors import SpecError
from twin.net.topology import load_topology
from twin.perf.llm import get_model
from twin.request import Request
from twin.sim.simulation import Simulation
from twin.sim.spec import resolve_spec

L8 = get_model("llama-3.1-8b")
# The hand-off's fixed costs off: what is left is the bytes over the network.
BYTES_ONLY = {"control_rtt": 0, "registration": 0, "per_descriptor": 0, "router_hop": 0}


def split_spec(**over):
    data = {
        "model": "llama-3.1-8b",
        "cluster": {
            "topology": "dgx-h100-ib400",
            "nodes": 2,
            "prefill": {"instances": 1, "tp": 8},
            "decode": {"instances": 1, "tp": 8},
        },
        "scheduler": "disagg",
        "workload": {
            "lengths": "azure-conv",
            "arrival": {"process": "poisson", "rate": 4.0},
            "max_requests": 80,
        },
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return resolve_spec(data, "split.yaml", Path.cwd())


def run(spec, requests=None):
    rows: list[dict] = []
    sim = Simulation(spec, requests=requests, on_row=rows.append)
    result = sim.run()
    return sim, result, {r["id"]: r for r in rows}


def test_a_split_cluster_serves_everything_and_moves_every_prompt():
    sim, result, rows = run(split_spec())
    s = result.summary
    assert s["completed"] == s["requests"] == 80
    expected = sum(r["prompt_tokens"] for r in rows.values()) * L8.kv_bytes_per_token()
    assert s["kv_bytes_transferred"] == expected
    assert s["transfer_s"]["p50"] > 0
    assert all(r["prefill_instance"] == 0 and r["decode_instance"] == 1 for r in rows.values())
    assert all(e.kv.free == e.kv.total for e in sim.engines)
    assert sim.network.max_link_load_ratio <= 1 + 1e-9
    assert result.link_rows and all(
        0 <= link["utilization"] <= 1 + 1e-9 for link in result.link_rows
    )


def test_one_request_transfer_time_is_latency_plus_bytes_over_bandwidth():
    """Cross-node, TP8 to TP8: eight shards, each over its own 400 Gb/s NIC."""
    topo = load_topology("dgx-h100-ib400", nodes=2)
    spec = split_spec(transfer=BYTES_ONLY)
    sim, _, rows = run(spec, requests=[Request(0, 0.0, 4000, 4)])
    r = rows[0]
    shard = 4000 * L8.kv_bytes_per_token() / 8
    path = topo.path(0, 8)
    expect = topo.latency_s(path) + shard / topo.bottleneck_bytes_s(path)
    assert r["transfer_s"] == pytest.approx(expect, rel=1e-9)
    assert r["transfer_wait_s"] == 0.0  # push: decode blocks reserved before the prompt ended
    # TTFT at decode = queue + prefill + transfer: the idle decode side takes the
    # request up as it lands and releases token 1; its 3 steps give tokens 2-4.
    parts = r["queue_s"] + r["prefill_s"] + r["transfer_wait_s"] + r["transfer_s"]
    assert r["ttft_s"] == pytest.approx(parts, rel=1e-9)
    assert r["first_token_s"] == pytest.approx(r["prefill_done_s"] + r["transfer_s"], rel=1e-9)
    assert r["tpot_s"] == pytest.approx((r["finish_s"] - r["first_token_s"]) / 3, rel=1e-9)


def test_ttft_at_prefill_excludes_the_hand_off():
    reqs = [Request(0, 0.0, 4000, 4)]
    _, _, at_decode = run(split_spec(), requests=reqs)
    _, _, at_prefill = run(split_spec(slo={"ttft": "1 s", "ttft_at": "prefill"}), requests=reqs)
    a, b = at_decode[0], at_prefill[0]
    assert b["ttft_s"] == pytest.approx(b["queue_s"] + b["prefill_s"])
    assert a["ttft_s"] > b["ttft_s"]
    assert b["max_itl_s"] >= b["transfer_s"]  # the client waits through the hand-off for token 2


def test_same_node_beats_cross_node():
    reqs = [Request(0, 0.0, 8000, 2)]
    cl = {"prefill": {"instances": 1, "tp": 4}, "decode": {"instances": 1, "tp": 4}}
    tr = BYTES_ONLY
    _, _, packed = run(
        split_spec(cluster={**cl, "placement": "packed"}, transfer=tr), requests=reqs
    )
    _, _, cross = run(
        split_spec(
            cluster={**cl, "prefill": {"instances": 2, "tp": 4}, "placement": "packed"}, transfer=tr
        ),
        requests=reqs,
    )
    # packed: P0 and D0 share node 0 (NVLink); with two prefill instances first, D0 is on node 1
    # 360 GB/s usable NVLink against 49.1 GB/s usable NDR InfiniBand (ConnectX-7) per shard
    assert packed[0]["transfer_s"] < cross[0]["transfer_s"] / 7


def test_layerwise_hides_most_of_the_transfer():
    reqs = [Request(0, 0.0, 8000, 2)]
    _, _, ser = run(split_spec(transfer=BYTES_ONLY), requests=reqs)
    _, _, lw = run(split_spec(transfer={"mode": "layerwise", **BYTES_ONLY}), requests=reqs)
    assert lw[0]["transfer_s"] < ser[0]["transfer_s"] / 4
    assert lw[0]["ttft_s"] < ser[0]["ttft_s"]


def test_pull_waits_for_decode_memory_in_the_prefill_instance():
    spec = split_spec(transfer={"handoff": "pull"})
    sim, result, rows = run(spec)
    assert result.summary["completed"] == 80
    assert all(e.kv.free == e.kv.total for e in sim.engines)


def test_colocated_and_disagg_run_the_same_trace():
    colo = resolve_spec(
        {
            "model": "llama-3.1-8b",
            "cluster": {"topology": "dgx-h100-ib400", "nodes": 2, "instances": 2, "tp": 8},
            "workload": split_spec().resolved["workload"],
            "slo": {"ttft": "1 s", "tpot": "50 ms"},
        },
        "colo.yaml",
        Path.cwd(),
    )
    _, a, _ = run(colo)
    _, b, _ = run(split_spec())
    assert a.summary["requests"] == b.summary["requests"] == 80
    assert a.summary["kv_bytes_transferred"] == 0.0 < b.summary["kv_bytes_transferred"]


def test_split_roles_need_a_split_policy_and_a_topology():
    with pytest.raises(SpecError, match="'colocated' serves each request on one instance"):
        Simulation(split_spec(scheduler="colocated"))
    with pytest.raises(SpecError, match=r"cluster\.topology: missing"):
        resolve_spec(
            {"model": "llama-3.1-8b", "cluster": {"prefill": 1, "decode": 1},
             "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                          "max_requests": 3}},
            "x.yaml", Path.cwd(),
        )  # fmt: skip
    with pytest.raises(SpecError, match="layerwise.*needs handoff: push"):
        split_spec(transfer={"mode": "layerwise", "handoff": "pull"})
    with pytest.raises(SpecError, match=r"need 24 GPUs .* has 16 GPUs"):
        Simulation(split_spec(cluster={"prefill": {"instances": 2, "tp": 8}}))


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 0.2), st.integers(1, 6000), st.integers(1, 60)),
             min_size=1, max_size=25),
    st.sampled_from(["push", "pull"]),
    st.sampled_from(["serialized", "layerwise"]),
    st.sampled_from([4, 8]),
    st.booleans(),
)  # fmt: skip
def test_hand_off_invariants(items, handoff, mode, tp, multi_nic):
    if mode == "layerwise" and handoff == "pull":
        handoff = "push"
    t = 0.0
    reqs = []
    for i, (gap, p, o) in enumerate(items):
        t += gap
        reqs.append(Request(i, t, p, o))
    spec = split_spec(
        cluster={"prefill": {"instances": 2, "tp": tp}, "decode": {"instances": 1, "tp": tp},
                 "placement": "interleaved", "nodes": 3},
        engine={"max_num_seqs": 4},
        transfer={"mode": mode, "handoff": handoff, "multi_nic": multi_nic},
    )  # fmt: skip
    sim, result, rows = run(spec, requests=reqs)
    assert sorted(rows) == list(range(len(reqs)))
    assert result.summary["completed"] == len(reqs)
    assert all(e.kv.free == e.kv.total for e in sim.engines)
    net = sim.network
    assert net.max_link_load_ratio <= 1 + 1e-9
    assert net.bytes_delivered == pytest.approx(net.bytes_sent, rel=1e-9)
    expected = sum(r.prompt_tokens for r in reqs if r.output_tokens > 1) * L8.kv_bytes_per_token()
    assert result.summary["kv_bytes_transferred"] == expected
    for r in rows.values():
        assert r["arrival_s"] <= r["first_token_s"] <= r["finish_s"]


def test_mixed_node_templates_give_each_instance_its_gpu(tmp_path):
    nics = "nics: {count: 8, kind: infiniband, bandwidth: 400 Gbps}"
    (tmp_path / "hetero.yaml").write_text(
        "name: hetero\n"
        "templates:\n"
        f"  fast: {{gpu: h100-sxm, gpus: 8, {nics}}}\n"
        f"  capped: {{gpu: h100-80gb-pcap, gpus: 8, {nics}}}\n"
        "nodes:\n  - {template: fast, count: 1}\n  - {template: capped, count: 1}\n"
    )
    spec = split_spec(cluster={"topology": str(tmp_path / "hetero.yaml"), "nodes": None})
    sim, result, _ = run(spec)
    names = [e.perf.name for e in sim.engines]
    assert names == ["roofline:llama-3.1-8b@h100-sxmx8", "roofline:llama-3.1-8b@h100-80gb-pcapx8"]
    assert result.summary["completed"] == 80
    assert "h100-80gb-pcap" in result.header["spec"]["gpu"]


def test_handoff_estimate_matches_the_formula_and_layerwise_leaves_one_layer():
    from twin.studies.handoff import handoff_estimate

    l70 = get_model("llama-2-70b")
    topo = load_topology("a100-eth25")
    est = handoff_estimate(l70, 4096, topo, tp=8, placement="cross-node")
    kv = 4096 * 2 * 80 * 8 * 128 * 2
    assert est["kv_bytes"] == kv
    path = topo.path(0, 8)
    # all eight shards share the node's one 25 Gb/s NIC (TCP on the wire: 0.94)
    assert est["bytes_s"] == pytest.approx(topo.latency_s(path) + kv / (25e9 / 8 * 0.94), rel=1e-9)
    assert est["transfer_s"] == pytest.approx(est["bytes_s"] + est["fixed"]["before_s"], rel=1e-12)
    lw = handoff_estimate(l70, 4096, topo, tp=8, mode="layerwise", prefill_s=1.0)
    one_layer = kv / 80 / (25e9 / 8 * 0.94)
    assert lw["bytes_s"] == pytest.approx(one_layer + topo.latency_s(path), rel=1e-6)
    assert lw["transfer_s"] == pytest.approx(lw["bytes_s"] + lw["fixed"]["after_s"], rel=1e-12)
    same = handoff_estimate(l70, 4096, topo, tp=4, placement="same-node")
    assert same["bytes_s"] < est["bytes_s"] / 50


def test_twin_handoff_json(capsys):
    import json

    from twin.cli import main

    assert main(["handoff", "llama-2-70b", "--tokens", "1000", "--topology", "dgx-h100-ib400",
                 "--tp", "8", "--json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {"kv_bytes", "transfer_s", "path", "bottleneck_bytes_s"}
    assert doc["kv_bytes"] == 1000 * 327_680 and doc["bottleneck_bytes_s"] == pytest.approx(
        50e9 * 0.982
    )
    assert main(["handoff", "llama-2-70b", "--tokens", "1000", "--topology", "dgx-h100-box"]) == 2
    assert "has one node" in capsys.readouterr().err


def test_links_csv_gives_utilization_over_time(capsys, tmp_path):
    import csv

    from twin.cli import main

    out = tmp_path / "links.csv"
    code = main(["run", "disagg", "--set", "workload.max_requests=60", "--links-csv", str(out),
                 "--link-bucket", "2 s", "-q"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    rows = list(csv.DictReader(out.open()))
    assert rows and set(rows[0]) == {"src", "dst", "t_s", "bytes", "utilization"}
    assert all(
        float(r["t_s"]) % 2.0 == 0.0 and 0 <= float(r["utilization"]) <= 1 + 1e-9 for r in rows
    )
    assert main(["run", "disagg", "--links-csv", str(out), "--link-bucket", "0 s"]) == 2
