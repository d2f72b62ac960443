"""Whole runs: specs in, results out; determinism and conservation end to end."""

from __future__ import annotations

import json

import helpers
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedulers.colocated  # noqa: F401 - registers the built-ins when not installed
from twin.errors import CapacityError
from twin.request import Request
from twin.sim.simulation import Simulation

SUMMARY_KEYS = {
    "requests",
    "completed",
    "rejected",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "slo_attainment",
    "throughput_rps",
    "output_tokens_per_s",
    "simulated_s",
}


def small_spec(**over):
    return helpers.small_spec(**over)


def test_summary_has_the_stable_keys_and_conserves_requests():
    result = Simulation(small_spec()).run()
    s = result.summary
    assert SUMMARY_KEYS <= set(result.to_dict()["summary"])  # the JSON's nested keys
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(s[key]) >= {"mean", "p50", "p90", "p99"}
    assert s["requests"] == 200 == s["completed"] + s["rejected"]
    assert 0.0 <= s["slo_attainment"] <= 1.0
    assert s["ttft_s"]["p50"] <= s["ttft_s"]["p99"]
    assert result.header["spec_sha256"] and result.header["spec"]["cluster"]["instances"] == 2


def test_same_spec_twice_gives_identical_json_and_rows():
    outs = []
    for _ in range(2):
        rows: list[dict] = []
        result = Simulation(small_spec(), on_row=rows.append).run()
        outs.append((json.dumps(result.to_dict(), sort_keys=True), json.dumps(rows)))
    assert outs[0] == outs[1]


def test_another_seed_gives_another_run():
    a = Simulation(small_spec()).run().summary
    b = Simulation(small_spec(seed=1)).run().summary
    assert a["ttft_s"] != b["ttft_s"]


def test_a_request_that_can_never_fit_is_an_error_or_a_rejection():
    # Within Llama-3.1-8B's context (131,072), beyond the KV memory left at 30%.
    huge = [Request(0, 0.0, 100, 10), Request(1, 0.5, 120_000, 10)]
    small = {"gpu_memory_utilization": 0.3}
    with pytest.raises(CapacityError, match=r"request 1: prompt 120000 \+ output 10 tokens need"):
        Simulation(small_spec(engine=small), requests=huge).run()
    spec = small_spec(engine={**small, "oversized": "reject"})
    s = Simulation(spec, requests=huge).run().summary
    assert s["completed"] == 1 and s["rejected_by_reason"] == {"exceeds_kv_capacity": 1}
    assert s["slo_attainment"] <= 0.5  # a rejected request is a miss


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 0.5), st.integers(1, 3000), st.integers(1, 300)),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 3),
    st.booleans(),
    st.sampled_from(["least_loaded", "round_robin"]),
)
def test_every_request_ends_once_whatever_the_cluster(items, instances, chunked, routing):
    t = 0.0
    reqs = []
    for i, (gap, p, o) in enumerate(items):
        t += gap
        reqs.append(Request(i, t, p, o))
    spec = small_spec(
        cluster={"instances": instances, "tp": 1},
        engine={"chunked_prefill": chunked, "max_num_seqs": 8},
        scheduler={"name": "colocated", "routing": routing},
    )
    rows: list[dict] = []
    sim = Simulation(spec, requests=reqs, on_row=rows.append)
    s = sim.run().summary
    assert sorted(r["id"] for r in rows) == list(range(len(reqs)))
    assert s["completed"] == len(reqs)
    assert all(e.kv.free == e.kv.total for e in sim.engines)
    assert all(r["first_token_s"] <= r["finish_s"] for r in rows)


@pytest.mark.parametrize("chunked", [False, True])
def test_fast_forward_changes_nothing_but_the_event_count(chunked):
    results = {}
    for ff in (False, True):
        spec = small_spec(
            cluster={"instances": 3, "tp": 1},
            engine={"fast_forward": ff, "chunked_prefill": chunked},
            workload={
                "lengths": "azure-conv",
                "arrival": {"process": "gamma", "rate": 3.0, "cv": 3},
                "max_requests": 300,
            },
        )
        rows: list[dict] = []
        sim = Simulation(spec, on_row=rows.append)
        res = sim.run()
        results[ff] = (res.summary, res.instance_rows, rows, sim.events)
    assert results[True][:3] == results[False][:3]
    assert results[True][3] < results[False][3] / 2
