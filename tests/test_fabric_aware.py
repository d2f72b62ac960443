"""The topology-aware router: pairings known by hand, on hand-built views and in a run."""

from __future__ import annotations

import numpy as np
import pytest
from test_disagg import split_spec

import schedulers.fabric_aware  # noqa: F401 - registers the built-ins when not installed
from schedulers.fabric_aware import FabricAware
from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import (
    ClusterView,
    FabricSnapshot,
    HandoffEstimate,
    LinkLoad,
    Route,
    build_scheduler,
)
from twin.sim.simulation import Simulation
from twin.testing import instance

REQ = Request(7, 0.0, 2000, 100)


def view(*instances, estimates=None):
    fabric = FabricSnapshot(estimates or {})
    return ClusterView(instances, 0.0, rng=np.random.default_rng(0), fabric=fabric)


def est(p, d, seconds, aligned=True):
    spine = LinkLoad("leaf0", "spine", 25e9, 25e9, 8)
    return HandoffEstimate(p, d, bytes=1e9, flows=4, transfer_s=seconds, rail_aligned=aligned,
                           links=(spine,), bottleneck=spine)  # fmt: skip


TWO_BY_TWO = (
    instance(0, role="prefill", queue_s=0.0),
    instance(1, role="prefill", queue_s=0.3),
    instance(2, role="decode"),
    instance(3, role="decode"),
)


def test_the_pair_whose_hand_off_avoids_the_loaded_spine_wins():
    """Prefill 0 is free and prefill 1 queues 0.3 s; from 0 only decode 3
    avoids a loaded spine (2 s), from 1 both are cheap: 0 -> 3 is best (0.01 s
    against 0.31 s and 2 s), as load-only routing would not see."""
    v = view(*TWO_BY_TWO, estimates={
        (0, 2): est(0, 2, 2.0), (0, 3): est(0, 3, 0.01),
        (1, 2): est(1, 2, 0.01), (1, 3): est(1, 3, 0.01)})  # fmt: skip
    policy = FabricAware()
    assert policy.route(REQ, v) == Route(0)
    assert policy.pick_decode(REQ, v) == 3
    assert FabricAware(decide="arrival").route(REQ, v) == Route(0, 3)


def test_when_every_hand_off_is_cheap_the_queue_decides():
    v = view(*TWO_BY_TWO, estimates={(p, d): est(p, d, 0.001) for p in (0, 1) for d in (2, 3)})
    assert FabricAware(decide="arrival").route(REQ, v) == Route(0, 2)


def test_a_hand_off_dearer_than_a_queue_sends_the_prompt_to_the_queue():
    v = view(*TWO_BY_TWO, estimates={
        (0, 2): est(0, 2, 1.0), (0, 3): est(0, 3, 1.0),
        (1, 2): est(1, 2, 0.01), (1, 3): est(1, 3, 0.5)})  # fmt: skip
    assert FabricAware(decide="arrival").route(REQ, v) == Route(1, 2)


def test_among_equal_costs_the_rail_aligned_pair_goes_first():
    v = view(*TWO_BY_TWO, estimates={
        (0, 2): est(0, 2, 0.01, aligned=False), (0, 3): est(0, 3, 0.01),
        (1, 2): est(1, 2, 0.01), (1, 3): est(1, 3, 0.01)})  # fmt: skip
    assert FabricAware(decide="arrival").route(REQ, v) == Route(0, 3)


def test_decode_load_weighs_against_a_cheaper_hand_off():
    """Decode 2 is one hand-off millisecond cheaper but runs 60 requests;
    256 steps there cost more than the millisecond."""
    busy = (*TWO_BY_TWO[:2], instance(2, role="decode", running_requests=60),
            instance(3, role="decode"))  # fmt: skip
    v = view(*busy, estimates={(p, d): est(p, d, 0.001 * (d - 1)) for p in (0, 1) for d in (2, 3)})
    assert FabricAware(decide="arrival").route(REQ, v) == Route(0, 3)


def test_a_decode_side_without_room_for_the_prompt_goes_last():
    full = (*TWO_BY_TWO[:3], instance(3, role="decode", free_blocks=10))
    v = view(*full, estimates={
        (0, 2): est(0, 2, 2.0), (0, 3): est(0, 3, 0.01),
        (1, 2): est(1, 2, 2.0), (1, 3): est(1, 3, 0.01)})  # fmt: skip
    assert FabricAware(decide="arrival").route(REQ, v) == Route(0, 2)


def test_without_a_fabric_it_pairs_by_queue_and_decode_load():
    v = ClusterView(TWO_BY_TWO, 0.0)
    assert FabricAware(decide="arrival").route(REQ, v) == Route(0, 2)


def test_a_retried_request_is_placed_by_decode_load():
    busy = (*TWO_BY_TWO[:2], instance(2, role="decode", running_requests=5),
            instance(3, role="decode"))  # fmt: skip
    assert FabricAware().pick_decode(REQ, view(*busy)) == 3


def test_bad_parameters_name_the_key():
    with pytest.raises(SpecError, match=r"scheduler\.decide: 'later'"):
        build_scheduler("fabric-aware", {"decide": "later"})
    with pytest.raises(SpecError, match=r"scheduler\.expected_output_tokens: 0 must be"):
        build_scheduler("fabric-aware", {"expected_output_tokens": 0})


def test_in_a_run_the_decode_instance_behind_the_faster_nics_takes_the_kv():
    """Mixed NICs: the prefill node and decode node 1 have 8 x 400 Gb/s,
    decode node 2 one 100 Gb/s NIC. With decode idle on both, the known best
    pairing is the 400 Gb/s node; load-only routing takes the lower id."""
    topo = {"templates": {
        "fast": {"gpu": "h100-sxm", "gpus": 8,
                 "nics": {"count": 8, "kind": "infiniband", "bandwidth": "400 Gbps"}},
        "slow": {"gpu": "h100-sxm", "gpus": 8,
                 "nics": {"count": 1, "kind": "infiniband", "bandwidth": "100 Gbps"}}},
        "nodes": [{"template": "fast", "count": 1}, {"template": "slow", "count": 1},
                  {"template": "fast", "count": 1}]}  # fmt: skip
    cluster = {"topology": topo, "nodes": None, "prefill": {"instances": 1, "tp": 8},
               "decode": {"instances": 2, "tp": 8}}  # fmt: skip
    reqs = [Request(0, 0.0, 8000, 4)]
    chosen = {}
    for name in ("fabric-aware", "disagg"):
        rows: list[dict] = []
        Simulation(split_spec(cluster=cluster, scheduler=name), requests=reqs,
                   on_row=rows.append).run()  # fmt: skip
        chosen[name] = (rows[0]["decode_instance"], rows[0]["transfer_s"])
    assert chosen["disagg"][0] == 1 and chosen["fabric-aware"][0] == 2
    assert chosen["fabric-aware"][1] < chosen["disagg"][1] / 4


def test_a_weight_of_zero_leaves_the_fabric_out():
    v = view(*TWO_BY_TWO, estimates={
        (0, 2): est(0, 2, 2.0), (0, 3): est(0, 3, 0.01),
        (1, 2): est(1, 2, 0.01), (1, 3): est(1, 3, 0.01)})  # fmt: skip
    assert FabricAware(decide="arrival", handoff_weight=0).route(REQ, v) == Route(0, 2)
    with pytest.raises(SpecError, match=r"scheduler\.handoff_weight: -1 must be"):
        build_scheduler("fabric-aware", {"handoff_weight": -1})


def test_in_a_run_the_second_hand_off_avoids_the_nics_the_first_one_fills():
    """One 25 Gb/s NIC a node; prefill 0 and 1 on nodes 0 and 1, decode 2
    and 3 on node 2, decode 4 on node 3. Request 0's 60k-token KV goes 0 -> 2
    and fills the NICs of nodes 0 and 2 for 2.7 s. Request 1 is paired while
    it moves, with every candidate idle but decode 2: the known best pair is
    1 -> 4, the only one whose NICs are free; load-only routing takes the
    lowest ids, 0 -> 3, through both full NICs."""
    cluster = {"topology": "a100-eth25", "nodes": 4, "placement": "packed",
               "prefill": {"instances": 2, "tp": 8},
               "decode": {"instances": 3, "tp": 4}}  # fmt: skip
    reqs = [Request(0, 0.0, 60_000, 4), Request(1, 3.0, 2_000, 4)]
    out = {}
    for name in ("fabric-aware", "disagg"):
        rows: list[dict] = []
        Simulation(split_spec(cluster=cluster, scheduler=name), requests=reqs,
                   on_row=rows.append).run()  # fmt: skip
        out[name] = {r["id"]: (r["prefill_instance"], r["decode_instance"], r["transfer_s"])
                     for r in rows}  # fmt: skip
    fa, lo = out["fabric-aware"], out["disagg"]
    assert fa[0][:2] == lo[0][:2] == (0, 2)
    assert fa[1][:2] == (1, 4) and lo[1][:2] == (0, 3)
    # alone on its NICs it moves at twice the rate it gets beside request 0
    assert fa[1][2] < lo[1][2] * 0.6
