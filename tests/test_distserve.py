"""DistServe: the runtime policy on hand-built views, and the planner."""

from __future__ import annotations

import pytest

from schedulers.distserve import DistServe
from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import Route
from twin.testing import check_scheduler, instance, make_view

REQ = Request(0, 0.0, 500, 20)


# -- runtime -------------------------------------------------------------------------
def test_prefill_goes_to_the_shortest_queue_in_tokens_then_requests_then_id():
    view = make_view(
        instance(0, "prefill", queue_tokens=4000, queue_requests=1),
        instance(1, "prefill", queue_tokens=900, queue_requests=3),
        instance(2, "prefill", queue_tokens=900, queue_requests=2),
        instance(3, "prefill", queue_tokens=900, queue_requests=2, running_requests=9),
        instance(4, "decode"),
    )
    policy = DistServe()
    policy.setup(view)
    # Running requests do not count: a prefill instance's queue is its waiting prompts.
    assert policy.route(REQ, view) == Route(2)


def test_decode_goes_to_the_least_loaded_then_most_free_blocks_then_id():
    view = make_view(
        instance(0, "prefill"),
        instance(1, "decode", running_requests=5, queue_requests=0, free_blocks=900),
        instance(2, "decode", running_requests=3, queue_requests=1, free_blocks=100),
        instance(3, "decode", running_requests=2, queue_requests=2, free_blocks=500),
        instance(4, "decode", running_requests=4, queue_requests=0, free_blocks=500),
    )
    policy = DistServe()
    policy.setup(view)
    assert policy.route(REQ, view) == Route(0)  # the decode side is chosen later
    assert policy.pick_decode(REQ, view) == 3


def test_pair_node_keeps_the_hand_off_inside_the_prefill_node():
    view = make_view(
        instance(0, "prefill", node=0, queue_tokens=100),
        instance(1, "decode", node=0, running_requests=9),
        instance(2, "prefill", node=1, queue_tokens=50),
        instance(3, "decode", node=1, running_requests=7),
        instance(4, "decode", node=0, running_requests=1),
    )
    policy = DistServe(pair="node")
    policy.setup(view)
    assert policy.route(REQ, view) == Route(2)
    assert policy.pick_decode(REQ, view) == 3  # node 1's only decode, though 4 is idler
    assert DistServe().pick_decode(REQ, view) == 4


def test_setup_refuses_a_colocated_cluster_and_says_what_to_do():
    view = make_view(instance(0), instance(1))
    with pytest.raises(SpecError, match="only mixed instances; give cluster.prefill"):
        DistServe().setup(view)
    with pytest.raises(ValueError, match="pair: 'nodes'"):
        DistServe(pair="nodes")


def test_distserve_keeps_the_contract_on_a_split_cluster():
    assert check_scheduler("distserve") == "split"
    assert check_scheduler(DistServe, {"pair": "node"}) == "split"


# -- planner -------------------------------------------------------------------------
def _spec(topology="dgx-h100-ib400", nodes=1, **slo):
    from pathlib import Path

    from twin.sim.spec import resolve_spec

    data = {
        "model": "llama-3.1-8b",
        "cluster": {"topology": topology, "nodes": nodes, "prefill": 1, "decode": 1},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 1},
        "engine": {"max_num_seqs": 16},  # small batches: tiny samples reach saturation
        "perf": {"kind": "roofline", "engine": "distserve"},  # the preset of these plans
        "slo": {"ttft": "1 s", "tpot": "50 ms", **slo},
    }  # fmt: skip
    return resolve_spec(data, "plan.yaml", Path.cwd())


def _fixed(prompt, output, n=40):
    """``n`` requests of fixed lengths; no arrival pattern, so the planner spaces them evenly."""
    return [Request(i, 0.0, prompt, output) for i in range(n)]


def _plan(spec, sample, **kw):
    from twin.studies.planner import plan_distserve

    kw.setdefault("max_gpus_per_instance", 2)
    kw.setdefault("max_decode_requests", 200)
    kw.setdefault("iterations", 3)
    return plan_distserve(spec, sample=sample, **kw)


def _prefill_share(plan):
    p = plan.n_prefill * plan.prefill.gpus
    return p / (p + plan.n_decode * plan.decode.gpus)


def test_long_prompts_with_short_outputs_get_more_prefill_gpus():
    spec = _spec()
    long_prompt = _plan(spec, _fixed(3000, 8))
    long_output = _plan(spec, _fixed(100, 400))
    assert _prefill_share(long_prompt) > 0.5 > _prefill_share(long_output)
    for plan in (long_prompt, long_output):
        assert plan.gpus_used <= 8 and plan.placement == "packed"
        assert plan.prefill.goodput_rps > 0 and plan.decode.goodput_rps > 0
        assert "Algorithm 1" in plan.explain()


def test_a_slow_fabric_keeps_pairs_inside_a_node_and_a_fast_one_places_freely():
    sample = _fixed(4000, 16)
    slow = _plan(_spec("a100-eth25", nodes=2), sample)
    assert slow.affinity == "low" and slow.placement == "interleaved" and slow.pair == "node"
    assert slow.n_prefill % 2 == 0 and slow.n_decode % 2 == 0  # the same unit on both nodes
    assert "low node affinity" in slow.explain()
    fast = _plan(_spec("dgx-h100-ib400", nodes=2), sample)
    assert fast.affinity == "high" and fast.placement == "packed" and fast.pair == "any"
    assert fast.handoff_s < slow.handoff_s


def test_the_plan_is_deterministic_and_its_overrides_run():
    from pathlib import Path

    from twin.sim.simulation import Simulation
    from twin.sim.spec import resolve_spec

    spec = _spec()
    sample = _fixed(800, 64)
    first, second = _plan(spec, sample), _plan(spec, sample)
    assert first == second and first.explain() == second.explain()
    over = first.to_spec_overrides()
    assert over["transfer"]["handoff"] == "pull" and over["scheduler"]["name"] == "distserve"
    data = {**dict(spec.resolved), **over}
    data.pop("gpu")
    run = resolve_spec(data, "planned.yaml", Path.cwd())
    reqs = [Request(i, i * 0.05, 800, 64) for i in range(40)]
    result = Simulation(run, requests=reqs).run()
    assert result.summary["completed"] == 40


def test_target_rate_replicates_to_reach_it():
    spec = _spec(nodes=1)
    plan = _plan(spec, _fixed(800, 64), target_rate=200.0)
    assert plan.n_prefill * plan.prefill.goodput_rps >= 200
    assert plan.n_decode * plan.decode.goodput_rps >= 200
    assert plan.nodes >= 1 and plan.to_spec_overrides()["cluster"]["nodes"] == plan.nodes


def test_plan_needs_a_topology():
    from pathlib import Path

    from twin.sim.spec import resolve_spec
    from twin.studies.planner import plan_distserve

    data = {"model": "llama-3.1-8b", "workload": {"lengths": "azure-conv", "max_requests": 1,
            "arrival": {"process": "poisson", "rate": 1}}}  # fmt: skip
    with pytest.raises(SpecError, match="cluster.topology: missing"):
        plan_distserve(resolve_spec(data, "p.yaml", Path.cwd()), sample=_fixed(10, 10))


def test_twin_plan_without_a_topology_says_so(capsys):
    from twin.cli import main

    assert main(["plan", "quickstart", "--sample", "20"]) == 2
    assert "cluster.topology: missing" in capsys.readouterr().err


def test_a_plan_is_the_same_when_its_searches_run_in_parallel(tiny_plan_spec):
    from twin.studies.planner import plan_distserve
    from twin.studies.sweep import Executor

    spec = tiny_plan_spec
    kw = dict(max_gpus_per_instance=2, max_decode_requests=100, iterations=3, sample_size=30)
    serial = plan_distserve(spec, replicates=2, **kw)
    parallel = plan_distserve(spec, replicates=2, executor=Executor(jobs=2), **kw)
    assert len(serial.candidates) == 6 and len(serial.capacity_samples) == 2
    assert parallel == serial and parallel.explain() == serial.explain()


def test_a_prefill_search_the_sample_cannot_saturate_stops_at_the_instance_throughput():
    """20 prompts under a 5 s TTFT SLO never queue for 5 s whatever the rate, so
    the search meets the target up to its bracket; the goodput is then the
    instance's throughput with the sample queued at once, the knee a long run
    shows (every request in time below it, many late above it), not the
    bracket's top (which a decode probe would size its prefill feed on)."""
    from twin.studies.planner import _MAX_BRACKET, _Planner, _search

    spec = _spec(ttft="5 s")
    sample = _fixed(2000, 4, n=20)
    limits = (1, 3, 200, 1)
    rate, unbounded, _ = _search(spec, sample, limits, "prefill", 1, 1, None)
    pl = _Planner(spec, sample, *limits)
    cap = pl.prefill_capacity(1, 1)
    assert unbounded and rate == cap < pl.base_rate * 2.0**_MAX_BRACKET
    long = _Planner(spec, _fixed(2000, 4, n=2000), *limits)
    assert long.prefill_attainment(1, 1, 0.8 * cap) == 1.0
    assert long.prefill_attainment(1, 1, 1.5 * cap) < spec.slo.target


def test_a_decode_search_the_sample_cannot_saturate_stops_at_the_instance_throughput():
    """The same for a decode instance whose full batch keeps TPOT in the SLO:
    only the requests waiting for it miss, and 20 of them never wait 1 s. On so
    few requests the throughput is measured low (the last batch part full), so
    the long run's knee lies above it but below twice it."""
    from twin.studies.planner import _MAX_BRACKET, Candidate, _Planner, _search

    spec = _spec(ttft="1 s", tpot="1 s")
    sample = _fixed(200, 16, n=20)
    feed = Candidate("prefill", 1, 1, 1e4)
    rate, unbounded, _ = _search(spec, sample, (1, 3, 20, 1), "decode", 1, 1, feed)
    pl = _Planner(spec, sample, 1, 3, 20)
    cap = pl.decode_capacity(1, 1, feed)
    assert unbounded and rate == cap < pl.base_rate * 2.0**_MAX_BRACKET
    long = _Planner(spec, _fixed(200, 16, n=2000), 1, 3, 2000)
    assert long.decode_attainment(1, 1, feed, 0.8 * cap) == 1.0
    assert long.decode_attainment(1, 1, feed, 2 * cap) < spec.slo.target
