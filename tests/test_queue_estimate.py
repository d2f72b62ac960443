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
from twin.serving import cluster
from twin.serving.cluster import queue_iterations_s
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
        monkeypatch.setattr(cluster, "QUEUE_HORIZON_ITERATIONS", horizon)
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
