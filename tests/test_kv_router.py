"""The kv-router policy against hand-built views, and the view's per-tier prefix."""

from __future__ import annotations

import pytest

from schedulers.kv_router import KVRouter
from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import build_scheduler
from twin.testing import instance, make_view

# 1,024 prompt tokens in two 512-token units, 16-token blocks: 64 blocks to prefill
REQ = Request(0, 0.0, 1024, 10, (7, 8), 512)


def _view(queued):
    """Instance 1 holds the request's prefix and has ``queued`` prompt tokens waiting."""
    held = frozenset({7, 8})
    return make_view(instance(0), instance(1, cached_hashes=held, queue_tokens=queued))


def test_the_instance_with_more_reuse_wins_until_its_load_outweighs_it():
    router = KVRouter()
    for queued in (0, 512, 1008, 1024, 1040):
        view = _view(queued)
        # cost = 1.0 x prefill blocks + active blocks: instance 0 pays 64 + 64,
        # instance 1 pays 0 + (queued + 1024) / 16
        assert router.cost(view[0], REQ) == 128.0
        assert router.cost(view[1], REQ) == (queued + 1024) / 16
    assert [router.route(REQ, _view(q)).prefill for q in (0, 512, 1008)] == [1, 1, 1]
    # at 1,024 queued tokens the costs tie (128), and the tie goes to the lower id;
    # past it instance 1's load outweighs its reuse
    assert [router.route(REQ, _view(q)).prefill for q in (1024, 1040)] == [0, 0]


def test_reuse_from_a_lower_tier_counts_at_its_weight():
    router = KVRouter()
    dram = instance(1, tier_hashes=(("dram", frozenset({7, 8})),))
    ssd = instance(2, tier_hashes=(("ssd", frozenset({7, 8})),))
    view = make_view(instance(0), dram, ssd)
    assert view[1].cached_prefix_by_tier(REQ) == {"hbm": 0, "dram": 1024, "ssd": 0}
    assert router.prefill_blocks(view[0], REQ) == 64
    assert router.prefill_blocks(view[1], REQ) == pytest.approx(0.1 * 64)
    assert router.prefill_blocks(view[2], REQ) == pytest.approx(0.4 * 64)
    assert router.route(REQ, view).prefill == 1
    # the HBM run continues below: one unit in HBM, the next in DRAM
    mixed = instance(0, cached_hashes=frozenset({7}), tier_hashes=(("dram", frozenset({8})),))
    assert mixed.cached_prefix_by_tier(REQ) == {"hbm": 512, "dram": 512, "ssd": 0}


def test_a_larger_overlap_weight_favours_reuse_over_load():
    view = _view(1040)
    assert KVRouter().route(REQ, view).prefill == 0
    assert KVRouter(overlap_score_weight=2.0).route(REQ, view).prefill == 1


def test_split_clusters_route_prefill_by_cost_and_decode_by_load():
    router = KVRouter()
    view = make_view(
        instance(0, role="prefill"), instance(1, role="prefill", cached_hashes=frozenset({7, 8})),
        instance(2, role="decode", free_blocks=100), instance(3, role="decode", free_blocks=900),
    )  # fmt: skip
    router.setup(view)
    assert router.route(REQ, view).prefill == 1 and router.route(REQ, view).decode is None
    assert router.pick_decode(REQ, view) == 3


def test_bad_parameters_and_clusters_are_refused():
    with pytest.raises(SpecError, match="scheduler.dram_weight"):
        build_scheduler("kv-router", {"dram_weight": -1})
    with pytest.raises(SpecError, match="kv-router"):
        KVRouter().setup(make_view(instance(0), instance(1, role="prefill")))


def test_the_bundled_tier_comparison_resolves_every_variant():
    from pathlib import Path

    from twin.sim.spec import parse_yaml, read_spec_text
    from twin.studies.compare import compare_entries, compare_specs

    root = Path(__file__).resolve().parent.parent
    text, where, _ = read_spec_text("compare-kv-tiers")
    data = parse_yaml(text, where)
    entries = compare_entries(data, where)
    policies = ["round-robin", "least-loaded", "kv-router", "llm-d", "mooncake"]
    assert list(entries) == [p + t for p in policies for t in ("", "+tiers")] + ["mooncake+pool"]
    synthetic = (
        "workload={lengths: azure-conv, max_requests: 5, arrival: {process: poisson, rate: 1}}"
    )
    _, specs = compare_specs(data, where, root, [synthetic])
    for label, spec in specs.items():
        assert (spec.kv_tiers is not None) == label.endswith("+tiers")
        assert (spec.kv_pool_bytes is not None) == (label == "mooncake+pool")
        assert sum(g.count * g.tp * g.pp for g in spec.groups) == 32
        assert spec.engine.prefix_caching
    assert specs["kv-router+tiers"].kv_tiers.dram_bytes == 1e12
    assert specs["llm-d"].scheduler_params == {"mode": "llm-d"}
    assert specs["mooncake+pool"].kv_pool_ssd.capacity_bytes == 4e12


def test_the_tier_plot_of_a_compare_file(tmp_path):
    import json

    pytest.importorskip("matplotlib")
    from twin.errors import TwinError
    from twin.viz.kvtiers import plot_kv_tiers

    def run(hit, dram):
        tiers = {"kv_tiers": {"dram": {"hit_rate": dram}}} if dram is not None else {}
        return {"summary": {"prefix_hit_rate": hit, "slo_attainment": 0.9, **tiers}}

    doc = {"header": {}, "runs": {"a": run(0.1, None), "a+tiers": run(0.2, 0.05)}}
    path = tmp_path / "cmp.json"
    path.write_text(json.dumps(doc))
    written = plot_kv_tiers(path, tmp_path / "out")
    assert [p.name for p in written] == ["out.png", "out.svg", "out.pdf"] and all(
        p.stat().st_size for p in written
    )
    path.write_text(json.dumps({"summary": {}}))
    with pytest.raises(TwinError, match="not the --json file of a compare spec"):
        plot_kv_tiers(path, tmp_path / "out")


def test_the_reuse_plot_splits_a_pools_ssd_hits_from_its_dram_and_hbm_hits():
    pytest.importorskip("matplotlib")
    from twin.viz.kvtiers import kv_reuse_shares, kv_tiers_figure

    def pool(dram, ssd):
        return {"dram": {"hit_rate": dram}, "ssd": {"hit_rate": ssd}}

    runs = {
        "mooncake": {"summary": {"prefix_hit_rate": 0.25, "slo_attainment": 0.5}},
        "mooncake+tiers": {"summary": {"prefix_hit_rate": 0.5, "slo_attainment": 0.75,
                                       "kv_tiers": {"dram": {"hit_rate": 0.125},
                                                    "ssd": {"hit_rate": 0.0625}}}},
        "mooncake+pool": {"summary": {"prefix_hit_rate": 0.625, "slo_attainment": 1.0,
                                      "kv_pool": pool(0.25, 0.125)}},
    }  # fmt: skip
    shares = kv_reuse_shares(runs)
    # the pool's 25% and 12.5% are its own bars; HBM is the rest of the reuse
    assert shares == {
        "HBM": [25.0, 31.25, 25.0],
        "DRAM": [0.0, 12.5, 0.0],
        "SSD": [0.0, 6.25, 0.0],
        "pool DRAM": [0.0, 0.0, 25.0],
        "pool SSD": [0.0, 0.0, 12.5],
    }
    # the figure stacks those bars, in that order, under each run's reuse
    top, bottom = kv_tiers_figure(runs).axes[:2]
    drawn = {c.get_label(): [bar.get_height() for bar in c] for c in top.containers}
    assert drawn == shares
    columns = zip(*top.containers, strict=True)
    tops = [max(bar.get_y() + bar.get_height() for bar in col) for col in columns]
    assert tops == [25.0, 50.0, 62.5]
    assert [bar.get_height() for bar in bottom.containers[0]] == [50.0, 75.0, 100.0]
    # without any pool, no pool bars (and the remote store's only with one)
    assert list(kv_reuse_shares({"a": runs["mooncake+tiers"]})) == ["HBM", "DRAM", "SSD"]


def test_the_occupancy_plot_of_a_compare_file(tmp_path):
    import json

    pytest.importorskip("matplotlib")
    from twin.viz.kvtiers import plot_kv_tier_occupancy

    occ = {"window_s": 10.0, "mean_bytes": [0.0, 2e9], "peak_bytes": [1e9, 3e9]}
    tiers = {"dram": {"hit_rate": 0.1, "occupancy": occ}, "ssd": {"occupancy": occ}}
    doc = {"runs": {"a": {"summary": {}}, "a+tiers": {"summary": {"kv_tiers": tiers}}}}
    path = tmp_path / "cmp.json"
    path.write_text(json.dumps(doc))
    written = plot_kv_tier_occupancy(path, tmp_path / "occ")
    assert [p.name for p in written] == ["occ.png", "occ.svg", "occ.pdf"]
    path.write_text(json.dumps({"runs": {"a": {"summary": {}}}}))
    assert plot_kv_tier_occupancy(path, tmp_path / "none") == []  # no tiers: no figure


def _llmd_view(q1=2, free1=600):
    """Three instances: 0 idle-ish with nothing cached, 1 with the whole prefix,
    2 with its first unit; queues 4, ``q1``, 0 and free blocks 1000, ``free1``, 200."""
    return make_view(
        instance(0, queue_requests=4, free_blocks=1000),
        instance(1, queue_requests=q1, free_blocks=free1, cached_hashes=frozenset({7, 8})),
        instance(2, queue_requests=0, free_blocks=200, cached_hashes=frozenset({7})),
    )


def test_llm_d_mode_weighs_its_three_scorers_with_their_default_weights():
    router = KVRouter(mode="llm-d")
    assert (router.prefix_weight, router.queue_weight, router.kv_utilization_weight) == (3, 2, 2)
    view = _llmd_view()
    cand = list(view.of_role("mixed"))
    # prefix: the share of the prompt held; queue: (max - q) / (max - min) over 4, 2, 0;
    # KV: 1 - used share
    assert [router.prefix_score(i, REQ) for i in cand] == [0.0, 1.0, 0.5]
    assert router.queue_scores(cand) == {0: 0.0, 1: 0.5, 2: 1.0}
    assert [router.kv_score(i) for i in cand] == [1.0, 0.6, 0.2]
    # 3 x prefix + 2 x queue + 2 x KV: 2.0, 3 + 1 + 1.2, 1.5 + 2 + 0.4
    assert router.scores(cand, REQ) == pytest.approx({0: 2.0, 1: 5.2, 2: 3.9})
    assert router.route(REQ, view).prefill == 1
    # instance 1's queue grows to 6 (queue score 0) and its KV fills to 70%:
    # 3 + 0 + 0.6 = 3.6 falls below instance 2's 3.9
    assert router.scores(list(_llmd_view(6, 300).of_role("mixed")), REQ)[1] == pytest.approx(3.6)
    assert router.route(REQ, _llmd_view(6, 300)).prefill == 2
    # the dynamo mode on the same view weighs blocks instead: instance 0 costs
    # 64 + 64, instance 1 its 700 used blocks + 64
    assert KVRouter().route(REQ, _llmd_view(6, 300)).prefill == 0


def test_llm_d_mode_equal_queues_score_one_and_ties_go_to_the_lowest_id():
    router = KVRouter(mode="llm-d")
    view = make_view(instance(0, queue_requests=3), instance(1, queue_requests=3))
    assert router.queue_scores(list(view.of_role("mixed"))) == {0: 1.0, 1: 1.0}
    assert router.route(REQ, view).prefill == 0
    # a prefix in DRAM counts as held
    dram = instance(1, tier_hashes=(("dram", frozenset({7, 8})),))
    assert router.route(REQ, make_view(instance(0), dram)).prefill == 1


def test_llm_d_mode_on_a_split_cluster_picks_decode_by_queue_and_kv():
    router = KVRouter(mode="llm-d")
    view = make_view(
        instance(0, role="prefill"), instance(1, role="prefill", cached_hashes=frozenset({7, 8})),
        instance(2, role="decode", queue_requests=0, free_blocks=100),
        instance(3, role="decode", queue_requests=1, free_blocks=900),
    )  # fmt: skip
    router.setup(view)
    assert router.route(REQ, view).prefill == 1 and router.route(REQ, view).decode is None
    # decode 2: 2 x 1 + 2 x 0.1 = 2.2; decode 3: 2 x 0 + 2 x 0.9 = 1.8
    assert router.pick_decode(REQ, view) == 2
    assert router.scores(list(view.of_role("decode")), REQ, prefix=False) == pytest.approx(
        {2: 2.2, 3: 1.8}
    )


def test_llm_d_mode_keeps_the_contract_and_checks_its_parameters():
    from twin.testing import check_scheduler

    assert check_scheduler("kv-router", {"mode": "llm-d"}) == "both"
    with pytest.raises(SpecError, match="scheduler.mode: 'sglang'"):
        build_scheduler("kv-router", {"mode": "sglang"})
    with pytest.raises(SpecError, match="scheduler.queue_weight"):
        build_scheduler("kv-router", {"mode": "llm-d", "queue_weight": "high"})


def test_llm_d_mode_counts_blocks_only_the_prefix_cache_holds_as_free():
    # vLLM's KV-cache usage, which llm-d's scorer reads, counts an idle cached
    # block free (it is evictable): 1 - (free + idle cached) / total
    router = KVRouter(mode="llm-d")
    warm = instance(0, free_blocks=600, cached_idle_blocks=300)
    assert router.kv_score(warm) == pytest.approx(0.9)
    assert router.kv_score(instance(1, free_blocks=600)) == pytest.approx(0.6)


def test_an_engine_view_reports_the_idle_blocks_of_its_prefix_cache():
    import simpy

    from twin.perf.iteration import Batch
    from twin.serving.cluster import EngineView, Placement
    from twin.serving.engine import Engine, EngineConfig
    from twin.serving.kvcache import BlockManager
    from twin.serving.observer import Observer
    from twin.serving.sequence import Sequence

    class Flat:
        name, sha256 = "flat", None

        def iteration_time(self, b: Batch) -> float:
            return 0.01

    env = simpy.Environment()
    eng = Engine(env, 0, Flat(), BlockManager(8, 16),
                 EngineConfig(prefix_caching=True, watermark=0.0), Observer())  # fmt: skip
    # a 64-token prompt of 4 one-block units, one output token: its blocks stay cached
    eng.submit(Sequence(Request(0, 0.0, 64, 1, (1, 2, 3, 4), 16), 0.0))
    env.run()
    view = EngineView(eng, Placement(0, 0, (0,)))
    assert (view.free_blocks, view.cached_idle_blocks, view.total_blocks) == (4, 4, 8)
    assert KVRouter(mode="llm-d").kv_score(view) == 1.0  # nothing in use


def test_dynamo_mode_counts_only_the_blocks_of_requests_as_active():
    # Dynamo's active blocks are its requests' ("Router Design"): a block only
    # the prefix cache holds is not one of them
    router = KVRouter()
    warm = instance(1, free_blocks=700, cached_idle_blocks=300, cached_hashes=frozenset({7, 8}))
    assert router.active_blocks(warm, REQ) == 64  # 0 held by requests + 1,024 / 16
    busy = instance(2, free_blocks=700, cached_idle_blocks=100)
    assert router.active_blocks(busy, REQ) == 200 + 64
    # the warm instance reuses the whole prompt and its cached blocks weigh nothing
    assert router.cost(warm, REQ) == 64.0
    assert router.route(REQ, make_view(instance(0), warm)).prefill == 1
    # on a split cluster the decode pick ignores idle cached blocks likewise
    view = make_view(
        instance(0, role="prefill"),
        instance(1, role="decode", free_blocks=500, cached_idle_blocks=450),
        instance(2, role="decode", free_blocks=900),
    )
    assert router.pick_decode(REQ, view) == 1


def test_dynamo_mode_prices_a_remote_store_hit_at_its_weight_not_as_recompute():
    router = KVRouter()
    # one unit in DRAM, the next only in the remote store below it
    remote = instance(1, tier_hashes=(("dram", frozenset({7})), ("remote", frozenset({8}))))
    assert remote.cached_prefix_by_tier(REQ)["remote"] == 512
    assert router.prefill_blocks(remote, REQ) == pytest.approx((0.1 * 512 + 0.1 * 512) / 16)
    assert router.route(REQ, make_view(instance(0), remote)).prefill == 1
    # the weight is a parameter, checked as the others
    slow = KVRouter(remote_weight=1.0)
    assert slow.prefill_blocks(remote, REQ) == pytest.approx((0.1 * 512 + 512) / 16)
    with pytest.raises(SpecError, match="scheduler.remote_weight"):
        build_scheduler("kv-router", {"remote_weight": -0.5})
