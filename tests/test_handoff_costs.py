"""The hand-off's fixed costs and the prefix-aware hand-off, checked exactly."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_disagg import BYTES_ONLY, L8, run, split_spec

from twin.cli import main
from twin.errors import SpecError
from twin.net.topology import load_topology
from twin.request import Request
from twin.serving.handoff import HandoffCosts

KV = L8.kv_bytes_per_token()  # 131,072 B
COSTS = {"control_rtt": "300 us", "registration": "50 us", "per_descriptor": "1 us",
         "router_hop": "2 ms", "descriptors": "block"}  # fmt: skip


# -- fixed costs ----------------------------------------------------------------------


def test_a_serialized_hand_off_is_its_fixed_parts_plus_latency_plus_bytes_over_bandwidth():
    """TP8 to TP8 across two nodes: 4,000 tokens are 250 blocks, 250 x 2 (K, V) x
    32 layers = 16,000 descriptors on each source GPU (the eight post in parallel)."""
    topo = load_topology("dgx-h100-ib400", nodes=2)
    _, result, rows = run(split_spec(transfer=COSTS), requests=[Request(0, 0.0, 4000, 4)])
    r = rows[0]
    fixed = 300e-6 + 50e-6 + 16_000 * 1e-6 + 2e-3
    path = topo.path(0, 8)
    wire = topo.latency_s(path) + 4000 * KV / 8 / topo.bottleneck_bytes_s(path)
    assert r["transfer_s"] == pytest.approx(fixed + wire, rel=1e-9)
    parts = (r["handoff_control_s"], r["handoff_registration_s"], r["handoff_descriptors_s"],
             r["handoff_router_s"])  # fmt: skip
    assert parts == pytest.approx((300e-6, 50e-6, 16e-3, 2e-3), rel=1e-12)
    assert (r["kv_bytes_moved"], r["kv_bytes_saved"]) == (4000 * KV, 0.0)
    ttft = r["queue_s"] + r["prefill_s"] + r["transfer_wait_s"] + r["transfer_s"]
    assert r["ttft_s"] == pytest.approx(ttft, rel=1e-9)
    assert result.summary["transfer_s"]["max"] == pytest.approx(fixed + wire, rel=1e-9)


def test_a_descriptor_per_layer_region_posts_two_per_layer_whatever_the_blocks():
    """``descriptors: layer`` (the default): 2 (K, V) x 32 layers per source GPU."""
    _, _, rows = run(
        split_spec(transfer={**COSTS, "descriptors": "layer"}),
        requests=[Request(0, 0.0, 4000, 4)],
    )
    assert rows[0]["handoff_descriptors_s"] == pytest.approx(64 * 1e-6, rel=1e-12)


def test_without_fixed_costs_nothing_but_the_bytes_is_charged():
    _, _, rows = run(split_spec(transfer=BYTES_ONLY), requests=[Request(0, 0.0, 4000, 4)])
    r = rows[0]
    assert (r["handoff_control_s"], r["handoff_descriptors_s"], r["handoff_router_s"]) == (0, 0, 0)


@pytest.mark.parametrize("per_descriptor_us", [0.2, 20.0])
def test_a_layerwise_residual_adds_the_router_hop_and_the_descriptors_left_unhidden(
    per_descriptor_us,
):
    """8,000 tokens: 500 blocks, so a layer's descriptors take c = 500 x 2 x the
    per-descriptor cost. At 0.2 us (c = 0.2 ms) each layer's posting hides behind
    the next layer's compute and only the last one shows; at 20 us (c = 20 ms >
    one layer) posting falls behind: it ends layer_s + 32 c after the start."""
    reqs = [Request(0, 0.0, 8000, 2)]
    base = run(split_spec(transfer={"mode": "layerwise", **BYTES_ONLY}), requests=reqs)[2][0]
    tr = {"mode": "layerwise", "control_rtt": "100 us", "registration": "0 s",
          "per_descriptor": f"{per_descriptor_us} us", "router_hop": "2 ms",
          "descriptors": "block"}  # fmt: skip
    r = run(split_spec(transfer=tr), requests=reqs)[2][0]
    layer_s = r["prefill_s"] / L8.layers  # the prompt is one iteration
    assert 100e-6 < layer_s  # the control round trip hides behind the first layer
    c = 500 * 2 * per_descriptor_us * 1e-6
    tail = c if c <= layer_s else layer_s + L8.layers * c - r["prefill_s"]
    assert r["transfer_s"] == pytest.approx(base["transfer_s"] + 2e-3 + tail, rel=1e-9)
    assert r["handoff_descriptors_s"] == pytest.approx(32 * c, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-6, 1e-2), st.floats(0, 1e-2), st.integers(1, 96))
def test_the_posting_tail_is_the_closed_form_of_posting_layer_by_layer(layer_s, c, layers):
    costs = HandoffCosts(0.0, 0.0, layers, c, 0.0, layers, layer_s)  # c per layer
    t = 0.0
    for layer in range(1, layers + 1):  # layer l exists at l x layer_s; posts one by one
        t = max(t, layer * layer_s) + c
    assert costs.after_s == pytest.approx(t - layers * layer_s, rel=1e-9, abs=1e-15)


def test_bad_cost_values_name_the_key():
    with pytest.raises(SpecError, match=r"transfer\.router_hop: '-1 ms' must be >= 0"):
        split_spec(transfer={"router_hop": "-1 ms"})
    with pytest.raises(SpecError, match=r"transfer\.per_descriptor: 'fast' is not a duration"):
        split_spec(transfer={"per_descriptor": "fast"})


def test_twin_handoff_prints_each_part(capsys):
    args = ["handoff", "llama-3.1-8b", "--tokens", "4000", "--topology", "dgx-h100-ib400",
            "--nodes", "2", "--tp", "8", "--control-rtt", "300 us", "--registration", "50 us",
            "--per-descriptor", "1 us", "--router-hop", "2 ms",
            "--descriptors", "block"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert ("control round trip 0.300 ms, registration 0.050 ms, 16,000 descriptors x 1.000 us "
            "= 16.000 ms, router hop 2.000 ms") in out  # fmt: skip
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fixed"]["before_s"] == pytest.approx(0.3e-3 + 0.05e-3 + 16e-3 + 2e-3)
    assert doc["transfer_s"] == pytest.approx(doc["fixed"]["before_s"] + doc["bytes_s"])
    # the same hand-off in a run takes what twin handoff says
    _, _, rows = run(split_spec(transfer=COSTS), requests=[Request(0, 0.0, 4000, 4)])
    assert rows[0]["transfer_s"] == pytest.approx(doc["transfer_s"], rel=1e-9)
    assert main([*args[:-4], "--router-hop", "soon"]) == 2  # without "2 ms --descriptors block"
    assert "twin: error: twin handoff: --router-hop: 'soon' is not a duration" in (
        capsys.readouterr().err
    )


# -- the prefix-aware hand-off --------------------------------------------------------


def shared_prefix_requests() -> list[Request]:
    """Three prompts that start with the same two 512-token units (hashes 11, 12)."""
    return [
        Request(0, 0.0, 1024, 4, prefix_hashes=(11, 12), prefix_block_tokens=512),
        Request(1, 1.0, 1500, 4, prefix_hashes=(11, 12), prefix_block_tokens=512),
        # all of it held, but a prompt's last token always moves: one unit does
        Request(2, 2.0, 1024, 4, prefix_hashes=(11, 12), prefix_block_tokens=512),
    ]


def test_a_prefix_the_decode_side_holds_crosses_once():
    spec = split_spec(engine={"prefix_caching": True}, transfer={"descriptors": "block"})
    sim, result, rows = run(spec, requests=shared_prefix_requests())
    moved = [rows[i]["kv_bytes_moved"] for i in range(3)]
    saved = [rows[i]["kv_bytes_saved"] for i in range(3)]
    assert moved == [1024 * KV, (1500 - 1024) * KV, 512 * KV]
    assert saved == [0.0, 1024 * KV, 512 * KV]
    s = result.summary
    assert s["kv_bytes_transferred"] == (1024 + 476 + 512) * KV
    assert s["kv_bytes_saved"] == (1024 + 512) * KV
    assert sim.network.bytes_delivered == pytest.approx(s["kv_bytes_transferred"], rel=1e-12)
    # descriptors cover only the blocks that move: 476 tokens are 30 blocks
    assert rows[1]["handoff_descriptors_s"] == pytest.approx(30 * 2 * 32 * 2e-6, rel=1e-12)
    assert all(rows[i]["decode_instance"] == 1 for i in range(3))


def test_without_prefix_caching_on_the_decode_side_nothing_is_saved():
    _, result, rows = run(split_spec(), requests=shared_prefix_requests())
    assert [rows[i]["kv_bytes_saved"] for i in range(3)] == [0.0, 0.0, 0.0]
    assert result.summary["kv_bytes_saved"] == 0.0
    assert result.summary["kv_bytes_transferred"] == (1024 + 1500 + 1024) * KV


def test_the_summary_reports_the_bytes_saved(capsys):
    code = main(["run", "disagg", "--set", "workload.max_requests=20", "--set",
                 "engine.prefix_caching=true"])  # fmt: skip
    assert code == 0
    assert "moved" in capsys.readouterr().out  # azure-conv has no prefix hashes: none saved


@settings(max_examples=12, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 0.3), st.integers(1, 4), st.integers(0, 700),
                       st.integers(2, 40)), min_size=1, max_size=20),
    st.sampled_from(["serialized", "layerwise"]),
)  # fmt: skip
def test_prefix_aware_hand_offs_conserve_bytes_and_blocks(items, mode):
    """Prompts of 1-4 shared units plus a tail: every byte is moved or saved,
    every block is free at the end (the run checks it), links stay in capacity."""
    t = 0.0
    reqs = []
    for i, (gap, units, tail, out) in enumerate(items):
        t += gap
        hashes = tuple(range(units))  # a chain: unit k's hash is k, whatever came before
        reqs.append(Request(i, t, units * 512 + tail, out, hashes, 512))
    spec = split_spec(
        cluster={"prefill": {"instances": 2, "tp": 8}, "decode": {"instances": 1, "tp": 8},
                 "placement": "interleaved", "nodes": 3},
        engine={"prefix_caching": True, "max_num_seqs": 4},
        transfer={"mode": mode},
    )  # fmt: skip
    sim, result, rows = run(spec, requests=reqs)
    s = result.summary
    assert s["completed"] == len(reqs)
    assert (
        s["kv_bytes_transferred"] + s["kv_bytes_saved"] == sum(r.prompt_tokens for r in reqs) * KV
    )
    assert sim.network.bytes_delivered == pytest.approx(s["kv_bytes_transferred"], rel=1e-9)
    assert sim.network.max_link_load_ratio <= 1 + 1e-9
    for r in rows.values():
        assert r["kv_bytes_moved"] > 0  # at least the prompt's last token moves
