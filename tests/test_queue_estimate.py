"""The instance view's queue estimate: the waiting prompts priced as the
iterations the engine batches them into, and checked against what a run does."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

import schedulers.mooncake  # noqa: F401 - registers the policy when not installed
from twin.perf.iteration import Batch
from twin.request import Request
from twin.scheduler import build_scheduler
from twin.serving import cluster, queuecost
from twin.serving.queuecost import queue_iterations_s
from twin.sim.simulation import Simulation
from twin.sim.spec import resolve_spec


@dataclass
class Recorder:
    """One second per iteration; keeps the batches it was asked to price."""

    name: str = "recorder"
    sha256: str | None = None
    batches: list[Batch] = field(default_factory=list)

    def iteration_time(self, batch: Batch) -> float:
        self.batches.append(batch)
        return 1.0


def test_whole_prompts_batch_up_to_the_token_budget_and_a_longer_one_runs_alone():
    perf = Recorder()
    work = [(5000, 0), (3000, 100), (9000, 0), (100, 0)]
    assert queue_iterations_s(perf, work, 8192) == [1.0, 1.0, 1.0]
    assert [b.prefill for b in perf.batches] == [
        ((5000, 0), (3000, 100)), ((9000, 0),), ((100, 0),)
    ]  # fmt: skip
    assert all(b.decode_count == 0 for b in perf.batches)


def test_chunked_prefill_fills_each_budget_and_carries_the_decodes():
    perf = Recorder()
    work = [(3000, 0), (1500, 500)]
    times = queue_iterations_s(
        perf, work, 2048, chunked=True, decode_count=48, decode_context_sum=48_000
    )
    assert times == [1.0, 1.0, 1.0]  # 4,500 tokens in budgets of 2,048 - 48
    assert [b.prefill for b in perf.batches] == [
        ((2000, 0),), ((1000, 2000), (1000, 500)), ((500, 1500),)
    ]  # fmt: skip
    assert all((b.decode_count, b.decode_context_sum) == (48, 48_000) for b in perf.batches)
    assert queue_iterations_s(perf, [], 2048) == []


def spec(engine):
    data = {
        "model": "llama-3.1-8b",
        "cluster": {
            "topology": "dgx-h100-ib400", "nodes": 1,
            "prefill": {"instances": 1, "tp": 2}, "decode": {"instances": 1, "tp": 2},
        },
        "engine": engine,
        "scheduler": {"name": "mooncake", "early_rejection": "off"},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 1},
        "slo": {"ttft": "30 s", "tpot": "100 ms"},
    }  # fmt: skip
    return resolve_spec(data, "queue.yaml", Path.cwd())


@pytest.mark.parametrize(
    ("engine", "horizon"),
    [
        ({}, None),
        ({"chunked_prefill": True, "max_batched_tokens": 2048}, None),
        # past a short horizon the rest of the queue is priced at its rate
        ({"chunked_prefill": True, "max_batched_tokens": 2048}, 8),
    ],
    ids=["whole", "chunked", "chunked-short-horizon"],
)
def test_the_estimate_matches_when_the_engine_gets_to_a_prompt(engine, horizon, monkeypatch):
    if horizon is not None:
        monkeypatch.setattr(queuecost, "QUEUE_HORIZON_ITERATIONS", horizon)
    # a burst of long prompts, one at a time a little apart: each arrival finds
    # a queue, and the estimate says when the prefill instance will get to it
    reqs = [Request(i, 0.01 * i, [6000, 12000, 3000, 20000][i % 4], 4) for i in range(24)]
    policy = build_scheduler("mooncake", {"early_rejection": "off"})
    estimates: dict[int, float] = {}

    @dataclass
    class Watching:
        def setup(self, cluster):
            return policy.setup(cluster)

        def route(self, req, view):
            estimates[req.id] = view.now + view[0].estimate_queue_s()
            return policy.route(req, view)

    rows: list[dict] = []
    Simulation(spec(engine), requests=reqs, scheduler=Watching(), on_row=rows.append).run()
    started = {r["id"]: r["scheduled_s"] for r in rows}
    late = [r for r in reqs if started[r.id] - r.arrival_s > 1.0]
    assert len(late) > 15  # the queue is long for most of them
    for r in late:
        # without chunks a prompt starts with the next iteration, which the
        # queue ahead of it may end early; chunks start it within its last one
        assert estimates[r.id] == pytest.approx(started[r.id], rel=0.1), r.id


# -- the estimate kept between calls -----------------------------------------------
def _priced_from_scratch(perf, work, budget, chunked, decodes, context_sum):
    """The iterations' times as the estimate priced them before it was kept
    between calls (an independent reference of queue_iterations_s)."""
    left = [list(w) for w in work]
    decodes = decodes if chunked else 0
    out, k = [], 0
    while k < len(left):
        room, chunks = max(budget - decodes, 1), []
        while k < len(left) and room > 0:
            need, cached = left[k]
            if not chunked and chunks and need > room:
                break
            take = min(need, room) if chunked else need
            chunks.append((take, cached))
            room -= take
            if take < need:
                left[k] = [need - take, cached + take]
                break
            k += 1
        out.append(
            perf.iteration_time(Batch(tuple(chunks), decodes, context_sum if decodes else 0))
        )
    return out


def _estimate_from_scratch(e):
    """The whole queue priced again at each call, as the estimate once was."""
    if not e.waiting and not e.prefilling:
        return 0.0
    e.sync()
    cfg = e.config
    work = [(s.prefill_len - s.prefilled, s.prefilled) for s in e.prefilling]
    horizon = queuecost.QUEUE_HORIZON_ITERATIONS * cfg.max_batched_tokens
    new = sum(n for n, _ in work)
    raw = computed = 0
    for s in e.waiting:
        if new >= horizon:
            break
        cached = min(max(e.cached_prefix_tokens(s.req), s.preloaded_tokens), s.prefill_len - 1)
        work.append((s.prefill_len - cached, cached))
        new += s.prefill_len - cached
        raw += s.prefill_len
        computed += s.prefill_len - cached
    count, context_sum = e.decode_load()
    times = _priced_from_scratch(
        e.perf, work, cfg.max_batched_tokens, cfg.chunked_prefill, count, context_sum
    )
    if e.prefilling:
        times[0] /= 2
    total = sum(times)
    tail = e.waiting_tokens - raw
    if tail > 0 and raw > 0 and new > 0:
        total += tail * (computed / raw) * (total / new)
    return total


def split_spec(scheduler, engine=None, events=None, workload=None):
    priority = {"priority": {0: 1, 1: 3}} if (engine or {}).get("queue_policy") else {}
    data = {
        "model": "llama-3.1-8b", "seed": 3,
        "cluster": {"topology": "dgx-h100-ib400", "nodes": 2, "tp": 4, "prefill": 2, "decode": 2},
        "scheduler": scheduler, "transfer": {"mode": "layerwise"},
        "engine": engine or {},
        "workload": workload or {"lengths": "azure-code",
                                 "arrival": {"process": "gamma", "rate": 40, "cv": 4},
                                 "max_requests": 300, **priority},
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }  # fmt: skip
    if events:
        data["events"] = events
        data["retry"] = {"max_attempts": 3}
    return resolve_spec(data, "kept.yaml", Path.cwd())


FAULTS = [{"at": "2 s", "action": "fail", "instance": 0},
          {"at": "4 s", "action": "recover", "instance": 0},
          {"at": "1 s", "action": "degrade", "gpu": 1, "factor": 0.5}]  # fmt: skip


@pytest.mark.parametrize(
    ("scheduler", "engine", "events"),
    [
        ({"name": "splitwise", "mixed_threshold_tokens": 4096, "move_cost": "10 ms"}, None, None),
        ({"name": "splitwise"}, {"chunked_prefill": True}, FAULTS),
        ({"name": "mooncake"}, {"chunked_prefill": True, "max_batched_tokens": 1024}, FAULTS),
        ({"name": "splitwise"}, {"queue_policy": "shortest-prompt-first"}, None),
        ({"name": "mooncake"}, {"chunked_prefill": True, "queue_policy": "priority"}, FAULTS),
    ],
    ids=[
        "splitwise",
        "splitwise-chunked-faults",
        "mooncake-chunked-faults",
        "splitwise-shortest-first",
        "mooncake-priority-faults",
    ],  # fmt: skip
)
def test_the_kept_estimate_is_the_estimate_from_scratch_at_every_call(
    scheduler, engine, events, monkeypatch
):
    kept = cluster.EngineView.estimate_queue_s
    calls = []

    def both(view):
        got = kept(view)
        assert got == _estimate_from_scratch(view._engine), view.id  # to the bit
        calls.append(got)
        return got

    monkeypatch.setattr(cluster.EngineView, "estimate_queue_s", both)
    result = Simulation(split_spec(scheduler, engine, events)).run()
    assert result.summary["completed"] > 250
    assert len(calls) > 150 and sum(c > 0 for c in calls) > 100  # queues were priced


def test_the_kept_estimate_with_prefix_cache_hits(shared_data, monkeypatch):
    trace = shared_data / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
    workload = {"trace": str(trace), "format": "mooncake", "max_requests": 250, "rate_scale": 4}
    kept = cluster.EngineView.estimate_queue_s
    hits = []

    def both(view):
        got = kept(view)
        assert got == _estimate_from_scratch(view._engine), view.id
        return got

    monkeypatch.setattr(cluster.EngineView, "estimate_queue_s", both)
    spec = split_spec({"name": "mooncake"}, {"prefix_caching": True, "oversized": "reject"},
                      workload=workload)  # fmt: skip
    result = Simulation(spec, on_row=lambda r: hits.append(r["hbm_hit_tokens"] or 0)).run()
    assert result.summary["completed"] > 100 and sum(h > 0 for h in hits) > 20


def _estimate_prices(n, monkeypatch):
    """iteration_time calls the queue estimates make while ``n`` requests
    arrive at once on one prompt machine."""
    from twin.perf.roofline import Roofline

    inside, count = [False], [0]
    price = Roofline.iteration_time

    def counted(self, batch):
        count[0] += inside[0]
        return price(self, batch)

    estimate = cluster.EngineView.estimate_queue_s

    def watched(view):
        inside[0] = True
        try:
            return estimate(view)
        finally:
            inside[0] = False

    monkeypatch.setattr(Roofline, "iteration_time", counted)
    monkeypatch.setattr(cluster.EngineView, "estimate_queue_s", watched)
    reqs = [Request(i, 0.0, [900, 2500, 400, 1200][i % 4], 8) for i in range(n)]
    spec = split_spec({"name": "splitwise", "mixed_threshold_tokens": 10**9})
    Simulation(spec, requests=reqs).run()
    return count[0]


def test_a_burst_prices_each_arrival_once_not_the_whole_queue(monkeypatch):
    small, large = _estimate_prices(300, monkeypatch), _estimate_prices(900, monkeypatch)
    assert small <= 3 * 300 and large <= 3 * 900, (small, large)
    assert large <= 3.3 * small  # linear: three times the burst, three times the prices
