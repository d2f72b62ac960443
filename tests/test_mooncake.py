"""Mooncake's conductor: cache-aware routing and early rejection, on hand-built
views and end to end with prefix caches and KV pools."""

from __future__ import annotations

from pathlib import Path

import pytest

import schedulers.mooncake  # noqa: F401 - registers the policy when not installed
from twin import yamlio
from twin.request import Request
from twin.scheduler import ClusterView, InstanceSnapshot, Objectives, Route, build_scheduler
from twin.sim.simulation import Simulation
from twin.sim.spec import resolve_spec

REQ = Request(0, 0.0, 4096, 100, tuple(range(8)), 512)


def view(prefills, decodes, *, ttft=10.0, tpot=1.0, pools=None):
    instances = [InstanceSnapshot(i, role="prefill", **kw) for i, kw in enumerate(prefills)]
    instances += [
        InstanceSnapshot(len(prefills) + j, role="decode", **kw) for j, kw in enumerate(decodes)
    ]
    return ClusterView(
        instances, 0.0, Objectives(ttft, tpot), (lambda req: pools) if pools else None
    )


def policy(**params):
    return build_scheduler("mooncake", params)


def test_the_prefill_instance_holding_the_prefix_wins_at_equal_load():
    v = view([{}, {"cached_hashes": frozenset(range(6))}], [{}])
    assert policy().route(REQ, v) == Route(1, 2)


def test_a_long_queue_outweighs_a_cached_prefix():
    v = view([{}, {"cached_hashes": frozenset(range(6)), "queue_tokens": 50_000}], [{}])
    assert policy().route(REQ, v).prefill == 0


def test_a_longer_prefix_in_a_pool_is_fetched():
    v = view([{}, {}], [{}], pools={3: 7 * 512})
    assert policy().route(REQ, v) == Route(0, 2, fetch_from=3)
    # too little to be worth a fetch
    assert policy(min_fetch_tokens=8192).route(REQ, v).fetch_from is None


def test_early_rejection_fires_exactly_when_the_ttft_estimate_crosses_the_slo():
    p = policy()
    estimate = 4096 * 1e-4  # InstanceSnapshot prices 0.1 ms per prompt token, empty queue
    assert p.prefill_choice(REQ, view([{}], [{}]))[0] == pytest.approx(estimate)
    assert p.route(REQ, view([{}], [{}], ttft=estimate * 1.001)) == Route(0, 1)
    assert p.route(REQ, view([{}], [{}], ttft=estimate * 0.999)).reason == "predicted_ttft"
    assert policy(early_rejection="off").route(REQ, view([{}], [{}], ttft=1e-6)) == Route(0, 1)


def test_decode_overload_rejects_and_prediction_counts_finishes():
    busy = [{"running_requests": 300, "decode_s_per_seq": 1e-4}]  # 0.02 + 301 x 0.1 ms = 50.1 ms
    at_arrival = policy(early_rejection="arrival")
    assert at_arrival.route(REQ, view([{}], busy, tpot=0.05)).reason == "predicted_decode_overload"
    # with a long prefill ahead (TTFT ~ 4 s), most of the running requests will have finished
    slow = [{"prefill_s_per_token": 1e-3}]
    predicted = policy(early_rejection="predicted", expected_output_tokens=64)
    assert predicted.route(REQ, view(slow, busy, tpot=0.05)) == Route(0, 1)
    assert at_arrival.route(REQ, view(slow, busy, tpot=0.05)).reason == "predicted_decode_overload"


def test_a_full_decode_instance_rejects_now_but_not_when_it_will_have_drained():
    full = [{"running_requests": 3, "free_blocks": 0}]  # 16,000 KV tokens, all held
    slow = [{"prefill_s_per_token": 1e-3}]  # the prompt reaches decode in ~4 s
    arrival = policy(early_rejection="arrival", expected_output_tokens=64)
    predicted = policy(early_rejection="predicted", expected_output_tokens=64)
    assert arrival.route(REQ, view(slow, full)).reason == "predicted_decode_overload"
    # 64 steps of ~20 ms: what runs now is done long before this prompt arrives
    assert predicted.route(REQ, view(slow, full)) == Route(0, 1)


def test_prediction_counts_what_is_still_in_prefill_on_its_way_to_decode():
    # Mooncake section 7.3-7.4: the decode instance looks empty now, but every
    # request routed before this one will have landed there by the time this
    # one does; each holds 4,096 + 256 KV tokens, and three fill 16,000.
    v = view([{"queue_s": 5.0}], [{}])
    arrival, predicted = policy(early_rejection="arrival"), policy(early_rejection="predicted")
    a = [arrival.route(REQ, v) for _ in range(4)]
    p = [predicted.route(REQ, v) for _ in range(4)]
    assert a == [Route(0, 1)] * 4
    assert p[:3] == [Route(0, 1)] * 3 and p[3].reason == "predicted_decode_overload"
    # once they have joined, the view shows them and the conductor counts them once
    later = view([{"queue_s": 5.0}], [{"running_requests": 3, "free_blocks": 184}])
    held = (1000 - 184) * 16
    assert predicted.predicted_load(later[1], REQ, 6.0, 0.0) == (4, held + 4352)


def test_the_queue_estimate_of_a_hand_built_instance():
    assert InstanceSnapshot(0, queue_tokens=2000).estimate_queue_s() == pytest.approx(0.2)
    assert InstanceSnapshot(0, queue_tokens=2000, queue_s=7.0).estimate_queue_s() == 7.0
    # the conductor adds its own prefill to the queue estimate
    v = view([{"queue_tokens": 50_000, "queue_s": 1.0}], [{}])
    assert policy().prefill_choice(REQ, v)[0] == pytest.approx(1.0 + 4096 * 1e-4)


def test_parameters_are_checked():
    with pytest.raises(Exception, match="early_rejection: 'sometimes'"):
        policy(early_rejection="sometimes")
    with pytest.raises(Exception, match="early_rejection: False"):
        policy(early_rejection=False)
    # a bare `off` in a spec is the string (specs are read with YAML 1.2 booleans)
    assert policy(**yamlio.load("early_rejection: off")).early_rejection == "off"


def spec(**over):
    data = {
        "model": "llama-3.1-8b",
        "cluster": {
            "topology": "dgx-h100-ib400", "nodes": 2, "kv_pool": "64 GiB",
            "prefill": {"instances": 2, "tp": 4}, "decode": {"instances": 2, "tp": 4},
        },
        "engine": {"prefix_caching": True},
        "scheduler": "mooncake",
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 1},
        "slo": {"ttft": "2 s", "tpot": "100 ms"},
    }  # fmt: skip
    data.update(over)
    return resolve_spec(data, "mooncake.yaml", Path.cwd())


def conversation(n, *, turns=4, gap=0.05, prompt=4096):
    """Multi-turn chats: each turn's prompt extends the last one's prefix."""
    reqs, t = [], 0.0
    for i in range(n):
        chat, turn = divmod(i, turns)
        units = prompt // 512 + turn
        hashes = tuple(chat * 1000 + k for k in range(units))
        reqs.append(Request(i, t, units * 512, 32, hashes, 512))
        t += gap
    return reqs


def test_prefixes_are_reused_from_caches_and_pools_end_to_end():
    rows: list[dict] = []
    sim = Simulation(spec(), requests=conversation(40), on_row=rows.append)
    s = sim.run().summary
    assert s["completed"] + s["rejected"] == 40
    assert s["prefix_hit_rate"] > 0.3
    assert s["kv_bytes_fetched"] >= 0
    # a reused prefix shortens the prefill: later turns compute only their new unit
    later = [r for r in rows if r["status"] == "completed" and r["id"] % 4 == 3]
    first = [r for r in rows if r["status"] == "completed" and r["id"] % 4 == 0]
    assert min(r["prefill_s"] for r in first) > max(r["prefill_s"] for r in later)


def test_overload_is_met_with_early_rejection():
    reqs = conversation(200, turns=1, gap=0.001, prompt=8192)
    on = Simulation(spec(), requests=reqs).run().summary
    off = (
        Simulation(spec(scheduler={"name": "mooncake", "early_rejection": "off"}), requests=reqs)
        .run()
        .summary
    )
    assert on["rejected"] > 0 and off["rejected"] == 0
    assert set(on["rejected_by_reason"]) <= {"predicted_ttft", "predicted_decode_overload"}
    # rejecting early spends less prefill on requests that miss anyway
    assert on["wasted_prefill_tokens"] < off["wasted_prefill_tokens"]


def test_mooncake_trace_replay(shared_data):
    trace = shared_data / "traces/mooncake_fast25/conversation_trace.jsonl"
    s = spec(
        workload={"trace": str(trace), "max_requests": 150},
        engine={"prefix_caching": True, "oversized": "reject"},
        slo={"ttft": "30 s", "tpot": "100 ms"},
    )
    result = Simulation(s).run().summary
    assert result["requests"] == 150
    # the most any cache could reuse: every whole unit seen before, in arrival order
    import json

    seen: set[int] = set()
    hit = total = 0
    with trace.open() as f:
        for _, line in zip(range(150), f, strict=False):
            d = json.loads(line)
            whole = d["hash_ids"][: d["input_length"] // 512]
            k = next((i for i, h in enumerate(whole) if h not in seen), len(whole))
            hit += min(k * 512, d["input_length"] - 1)
            total += d["input_length"]
            seen.update(whole)
    assert 0.5 * hit / total < result["prefix_hit_rate"] <= hit / total


def test_predicted_and_arrival_rejection_part_ways_when_decode_is_the_bottleneck():
    # three prefill instances feed one decode instance: at each arrival the
    # decode side looks as loaded as it is now, while the prompts already in
    # prefill will all have joined it by the time this one does (section 7.3)
    def run(mode):
        data = {
            "model": "llama-3.1-8b",
            "cluster": {"topology": "dgx-h100-ib400", "nodes": 1,
                        "prefill": {"instances": 3, "tp": 2}, "decode": {"instances": 1, "tp": 2}},
            "scheduler": {"name": "mooncake", "early_rejection": mode},
            "perf": {"kind": "roofline", "engine": "distserve"},  # the TPOT bounds below are its
            "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                         "max_requests": 1},
            "slo": {"ttft": "10 s", "tpot": "20 ms"},
        }  # fmt: skip
        reqs = [Request(i, 0.02 * i, 8192, 256) for i in range(300)]
        return Simulation(resolve_spec(data, "d.yaml", Path.cwd()), requests=reqs).run().summary

    arrival, predicted = run("arrival"), run("predicted")
    assert predicted["rejected"] > arrival["rejected"]
    assert set(predicted["rejected_by_reason"]) == {"predicted_decode_overload"}
    # what arrival-time rejection lets in overloads the decode instance later
    assert arrival["tpot_s"]["p99"] > 0.024 and predicted["tpot_s"]["p99"] < 0.021
    assert predicted["slo_attainment"] > arrival["slo_attainment"] + 0.05
    assert predicted["wasted_prefill_tokens"] < arrival["wasted_prefill_tokens"]


def test_a_fetch_estimate_prices_the_tokens_the_fetch_loads_at_most_the_prompt_less_one():
    # the pool holds the whole 4,096-token prompt; a fetch loads 4,095 (the last
    # token is always computed), so the estimate prices 4,095 tokens of fetch
    # (1 us each) and a 1-token prefill (100 us)
    v = view([{}], [{}], pools={3: 8 * 512})
    ttft, p, fetch = policy().prefill_choice(REQ, v)
    assert (p, fetch) == (0, 3)
    assert ttft == pytest.approx(4095 * 1e-6 + 1e-4, rel=1e-12)
