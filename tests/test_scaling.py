"""Scaling actions (AddInstance, RemoveInstance), start-up costs, gpu_seconds
and the sla-planner policy."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedulers.sla_planner  # noqa: F401 - registers sla-planner
from schedulers.sla_planner import SlaPlanner
from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import (
    AddInstance,
    ClusterView,
    Plan,
    RemoveInstance,
    Route,
)
from twin.serving.cluster import Placement
from twin.sim.simulation import Simulation, run
from twin.sim.spec import resolve_spec
from twin.testing import check_scheduler


def FIXED(n: int) -> dict[str, object]:  # reads as a constant
    return {"dist": "fixed", "value": n}


BASE = {
    "model": "llama-3.1-8b",
    "gpu": "h100-sxm",
    "cluster": {"instances": 1, "tp": 1, "gpus_per_node": 2},
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
    "workload": {"lengths": {"prompt": FIXED(256), "output": FIXED(8)},
                 "arrival": {"process": "poisson", "rate": 1.0}, "max_requests": 1},
    "scaling": {"storage_bandwidth": "4 GB/s", "warmup": "2 s"},
}  # fmt: skip


def spec(**over: object) -> object:
    d = json.loads(json.dumps(BASE))
    d.update(over)
    return resolve_spec(d, "<test>", __import__("pathlib").Path.cwd())


@dataclass
class Scripted:
    """Routes each request to the newest accepting instance; its ticks play
    ``script`` (tick number -> actions)."""

    script: dict[int, list[object]]
    tick_s: float = 1.0
    _n: int = field(default=0, init=False)

    def setup(self, cluster: ClusterView) -> Plan:
        return Plan()

    def route(self, req: Request, view: ClusterView) -> Route:
        i = max(view.up(), key=lambda i: i.id)
        return Route(i.id, i.id)

    def tick(self, view: ClusterView) -> list[object]:
        self._n += 1
        return self.script.get(self._n, [])


@dataclass
class Watching(Scripted):
    """Scripted, keeping what each tick's view showed of the instances."""

    seen: list[list[tuple[int, str, bool]]] = field(default_factory=list)

    def tick(self, view: ClusterView) -> list[object]:
        self.seen.append([(i.id, i.state, i.accepting) for i in view.instances])
        return super().tick(view)


def test_add_instance_starts_after_weights_and_warmup() -> None:
    s = spec()
    reqs = [Request(0, 0.0, 256, 8), Request(1, 10.0, 256, 8)]
    log: list[tuple] = []
    sched = Watching({1: [AddInstance("mixed")]})
    sim = Simulation(s, requests=reqs, scheduler=sched, log=log)
    result = sim.run()
    # ready at 1 + 16.06 GB / 4 GB/s + 2 s = 7.015 s: starting at ticks 2..7, then serving
    assert sched.seen[0] == [(0, "serving", True)]
    assert sched.seen[1] == [(0, "serving", True), (1, "starting", False)]
    assert sched.seen[7] == [(0, "serving", True), (1, "serving", True)]
    startup = s.model.weight_bytes / 4e9 + 2.0
    ((asked, ready, inst),) = sim.scaler.started
    assert (asked, inst) == (1.0, 1) and ready == pytest.approx(1.0 + startup)
    assert sim.placements[1].gpus == (1,)  # the node's free GPU
    first = min(e[0] for e in log if e[1] == "iteration" and e[2] == 1)
    assert first == pytest.approx(10.0)  # request 1 went to the new instance
    rows = {r["id"]: r for r in result.instance_rows}
    assert rows[1]["iterations"] > 0
    end = sim.metrics.last_end_s
    assert result.summary["gpu_seconds"] == pytest.approx(end + (end - 1.0))


def test_remove_instance_drains_then_releases() -> None:
    s = spec(cluster={"instances": 2, "tp": 1, "gpus_per_node": 2})
    # request 0 runs on instance 1 (the newest); the tick at 0.01 s drains it
    reqs = [Request(0, 0.0, 256, 64), Request(1, 0.02, 256, 8)]
    ended: list[dict] = []
    sched = Scripted({1: [RemoveInstance(1)]}, tick_s=0.01)
    sim = Simulation(s, requests=reqs, scheduler=sched, on_row=ended.append)
    result = sim.run()
    by_id = {r["id"]: r for r in ended}
    assert by_id[0]["instance"] == 1 and by_id[1]["instance"] == 0  # no new work on 1
    ((asked, released, inst),) = sim.scaler.released
    finish = 0.0 + by_id[0]["e2e_s"]
    assert (asked, inst) == (0.01, 1) and released == pytest.approx(finish)
    assert sim.engines[1].state == "stopped" and not sim.view[1].accepting
    end = sim.metrics.last_end_s
    assert result.summary["gpu_seconds"] == pytest.approx(end + released)
    assert result.summary["completed"] == 2


def test_routing_to_a_draining_instance_is_an_error() -> None:
    s = spec(cluster={"instances": 2, "tp": 1, "gpus_per_node": 2})

    @dataclass
    class Bad(Scripted):
        def route(self, req: Request, view: ClusterView) -> Route:
            return Route(1, 1)

    # request 1 arrives while request 0 (64 tokens) still runs on the draining instance
    reqs = [Request(0, 0.0, 256, 64), Request(1, 0.05, 256, 8)]
    with pytest.raises(SpecError, match="draining"):
        Simulation(s, requests=reqs, scheduler=Bad({1: [RemoveInstance(1)]}, tick_s=0.01)).run()


def test_remove_last_instance_is_refused() -> None:
    with pytest.raises(SpecError, match="no serving instance"):
        Simulation(spec(), requests=[Request(0, 0.0, 256, 64)],
                   scheduler=Scripted({1: [RemoveInstance(0)]}, tick_s=0.01)).run()  # fmt: skip


def test_no_free_gpus_is_an_error() -> None:
    s = spec(cluster={"instances": 1, "tp": 2, "gpus_per_node": 2})
    sched = Scripted({1: [AddInstance("mixed", tp=4)]}, tick_s=0.01)
    with pytest.raises(SpecError, match="free GPUs in one node"):
        Simulation(s, requests=[Request(0, 0.0, 256, 64)], scheduler=sched).run()


def test_weights_over_the_network_from_a_peer() -> None:
    s = spec(
        cluster={"topology": "dgx-h100-ib400", "nodes": 3, "tp": 8,
                 "prefill": {"instances": 1}, "decode": {"instances": 1}},
        scheduler="disagg",
        scaling={"weights_from": "network", "warmup": "1 s"},
    )  # fmt: skip
    sim = Simulation(s, requests=[Request(0, 0.0, 256, 8)])
    topo = s.topology
    where = Placement(2, 2, topo.gpus_of_node(2))  # the free node
    bw = max(topo.bottleneck_bytes_s(topo.path(p.gpus[0], where.gpus[0])) for p in sim.placements)
    assert bw < 5e9 * 100  # an inter-node path, not NVLink
    assert sim.scaler.startup_s(where) == pytest.approx(s.model.weight_bytes / bw + 1.0)
    storage = Simulation(spec(scaling={"warmup": "1 s"}), requests=[])
    assert storage.scaler.startup_s(where) == pytest.approx(s.model.weight_bytes / 5e9 + 1.0)


def test_bad_scaling_key() -> None:
    with pytest.raises(SpecError, match="scaling"):
        spec(scaling={"storage_bandwidth": "fast"})
    with pytest.raises(SpecError, match="weights_from"):
        spec(scaling={"weights_from": "tape"})


def _step_requests(low: float, high: float, t_step: float, end: float) -> list[Request]:
    out, t, i = [], 0.0, 0
    while t < end:
        out.append(Request(i, t, 512, 32))
        i += 1
        t += 1.0 / (low if t < t_step else high)
    return out


def test_planner_adds_capacity_within_interval_and_startup_and_keeps_budget() -> None:
    s = spec(
        cluster={"topology": "dgx-h100-ib400", "nodes": 1, "tp": 1,
                 "prefill": {"instances": 1}, "decode": {"instances": 1}},
        scheduler={"name": "sla-planner", "adjustment_interval": "5 s", "max_gpus": 6},
    )  # fmt: skip
    t_step, interval = 20.0, 5.0
    sim = Simulation(s, requests=_step_requests(2.0, 200.0, t_step, 60.0))
    sim.run()
    startup = s.model.weight_bytes / 4e9 + 2.0
    added = [x for x in sim.scaler.started if x[0] >= t_step]
    assert added, "no capacity added after the step"
    asked, ready, _ = added[0]
    # the step falls on a tick, so the next tick (one interval later) sees a whole
    # interval of the new load and asks for it; it serves after the start-up cost
    # (a step inside an interval is seen in full one tick later: two intervals)
    assert asked == pytest.approx(t_step + interval) and ready == pytest.approx(asked + startup)
    # GPUs held never exceed the budget
    times = sorted({a for a, _, _ in sim.scaler.alloc.values()})
    for t in times:
        held = sum(g for a, r, g in sim.scaler.alloc.values() if a <= t and (r is None or r > t))
        assert held <= 6


@pytest.mark.parametrize("predictor", ["constant", "moving-average", "seasonal"])
def test_planner_predictors(predictor: str) -> None:
    p = SlaPlanner(predictor=predictor, period="10 s", adjustment_interval="5 s", window=2)
    p._history.extend([(1.0, 10.0, 1.0), (3.0, 30.0, 3.0), (5.0, 50.0, 5.0)])
    want = {"constant": (5.0, 50.0, 5.0), "moving-average": (4.0, 40.0, 4.0),
            "seasonal": (3.0, 30.0, 3.0)}  # fmt: skip
    assert p.predict() == want[predictor]


def test_planner_bad_parameters() -> None:
    with pytest.raises(SpecError, match="predictor"):
        Simulation(spec(scheduler={"name": "sla-planner", "predictor": "arima"}))
    with pytest.raises(SpecError, match="period"):
        Simulation(spec(scheduler={"name": "sla-planner", "predictor": "seasonal"}))


def test_planner_contract() -> None:
    assert check_scheduler("sla-planner", {"adjustment_interval": 0.5}, faults=True) == "both"


def test_planner_is_deterministic() -> None:
    d = {
        **BASE,
        "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "tp": 1,
                    "prefill": {"instances": 1}, "decode": {"instances": 1}},
        "scheduler": {"name": "sla-planner", "adjustment_interval": "2 s", "max_gpus": 4},
        "workload": {"lengths": {"prompt": FIXED(512), "output": FIXED(32)},
                     "arrival": {"process": "poisson", "rate": 60.0}, "duration": "20 s"},
    }  # fmt: skip
    a, b = run(d).to_dict(), run(d).to_dict()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a["summary"]["gpu_seconds"] > 0


def test_compare_table_has_gpu_seconds_when_a_run_scales() -> None:
    from pathlib import Path

    from twin.studies.compare import run_compare

    data = {
        **json.loads(json.dumps(BASE)),
        "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "tp": 1,
                    "prefill": {"instances": 1}, "decode": {"instances": 1}},
        "workload": {"lengths": {"prompt": FIXED(512), "output": FIXED(32)},
                     "arrival": {"process": "poisson", "rate": 60.0}, "duration": "20 s"},
        "compare": {
            "static": {"scheduler": "distserve"},
            "planner": {"scheduler.name": "sla-planner", "scheduler.adjustment_interval": "2 s",
                        "scheduler.max_gpus": 4},
        },
    }  # fmt: skip
    result = run_compare(data, "<test>", Path.cwd())
    static, planner = result.runs["static"].summary, result.runs["planner"].summary
    # both give scaling: (from BASE); the static one holds its 2 GPUs throughout
    assert static["gpu_seconds"] == pytest.approx(2 * static["simulated_s"])
    assert planner["gpu_seconds"] > 2 * planner["simulated_s"]  # it added capacity
    head = result.format_table().splitlines()[2]
    assert head.split()[-1] == "GPU-s"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    low=st.floats(0.5, 20.0),
    high=st.floats(20.0, 150.0),
    t_step=st.floats(2.0, 15.0),
    budget=st.integers(2, 5),
    down=st.booleans(),
)
def test_planner_keeps_its_budget_over_random_steps(
    low: float, high: float, t_step: float, budget: int, down: bool
) -> None:
    s = spec(
        cluster={"topology": "dgx-h100-ib400", "nodes": 1, "tp": 1,
                 "prefill": {"instances": 1}, "decode": {"instances": 1}},
        scheduler={"name": "sla-planner", "adjustment_interval": "2 s", "max_gpus": budget},
        scaling={"storage_bandwidth": "16 GB/s", "warmup": "1 s"},
    )  # fmt: skip
    a, b = (high, low) if down else (low, high)
    sim = Simulation(s, requests=_step_requests(a, b, t_step, 25.0))
    sim.run()  # checks conservation: every request ended once, no block held
    alloc = sim.scaler.alloc.values()
    for t in sorted({start for start, _, _ in alloc}):
        assert sum(g for a0, r, g in alloc if a0 <= t and (r is None or r > t)) <= budget
    ids = [e.id for e in sim.engines]
    assert ids == list(range(len(ids)))  # never reused


def test_an_instance_whose_node_fails_while_it_starts_comes_up_down() -> None:
    # instance 0 on node 0 (GPU 0), instance 1 on node 0 (GPU 1) added at 1 s;
    # node 0 fails at 2 s (instance 1 still starting) and recovers at 60 s
    s = spec(
        cluster={"instances": 2, "tp": 1, "gpus_per_node": 3},
        events=[{"at": "2 s", "action": "fail", "node": 0},
                {"at": "60 s", "action": "recover", "node": 0}],
    )  # fmt: skip
    reqs = [Request(0, 0.0, 256, 8), Request(1, 70.0, 256, 8)]
    sim = Simulation(s, requests=reqs, scheduler=Scripted({1: [AddInstance("mixed")]}))
    result = sim.run()
    ((_, ready, inst),) = sim.scaler.started
    assert inst == 2 and sim.placements[2].node == 0
    assert ready < 60.0 and sim.engines[2].state == "serving"
    # down from its start (a failed node) until the repair, then it serves request 1
    assert result.summary["completed"] == 2
    assert sim.engines[2].iterations > 0
    assert sim.engines[2].life == 1  # it failed once: as it came up on the failed node
