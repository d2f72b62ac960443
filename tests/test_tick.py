"""The periodic tick hook and its actions: SetRole, per-instance batching limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

import schedulers.disagg  # noqa: F401 - registers the built-ins when not installed
from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import Plan, Route, SetRole
from twin.sim.simulation import Simulation
from twin.sim.spec import resolve_spec


def spec(prefill=1, decode=1):
    data = {
        "model": "llama-3.1-8b",
        "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "tp": 4,
                    "prefill": prefill, "decode": decode},
        "scheduler": "disagg",
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 1},
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }  # fmt: skip
    return resolve_spec(data, "tick.yaml", Path.cwd())


@dataclass
class Scripted:
    """Routes like the split baseline; ``script`` maps a tick number to its actions."""

    tick_s: float = 0.1
    script: dict = field(default_factory=dict)
    plan: Plan = field(default_factory=Plan)
    ticks: list = field(default_factory=list)

    def setup(self, cluster):
        return self.plan

    def route(self, req, view):
        p = min(view.of_role("prefill", "mixed"), key=lambda i: (i.queue_tokens, i.id))
        return Route(p.id, p.id) if p.role == "mixed" else Route(p.id)

    def pick_decode(self, req, view):
        return min(view.of_role("decode", "mixed"), key=lambda i: (i.running_requests, i.id)).id

    def tick(self, view):
        self.ticks.append(round(view.now, 9))
        return self.script.get(len(self.ticks), [])


def run(policy, reqs, sp=None, log=None):
    rows = []
    sim = Simulation(sp or spec(), requests=reqs, scheduler=policy, on_row=rows.append, log=log)
    result = sim.run()
    return sim, result, {r["id"]: r for r in rows}


# spaced arrivals, then a burst at 0.4 s that queues
REQS = [Request(i, 0.05 * min(i, 8), 3000, 30) for i in range(12)]


def test_ticks_come_every_tick_s_and_stop_once_all_work_is_done():
    policy = Scripted(tick_s=0.1)
    sim, result, rows = run(policy, REQS)
    assert result.summary["completed"] == 12
    last = max(r["finish_s"] for r in rows.values())
    assert policy.ticks == [pytest.approx(0.1 * k) for k in range(1, len(policy.ticks) + 1)]
    assert policy.ticks[-1] < last <= policy.ticks[-1] + 0.1 + 1e-9
    assert sim.role_changes == []


def test_set_role_takes_effect_after_its_cost():
    log: list = []
    policy = Scripted(script={1: [SetRole(1, "mixed", 0.25)]})
    sim, result, rows = run(policy, REQS, log=log)
    assert [e for e in log if e[1] == "role"] == [(0.35, "role", 1, "mixed")]
    assert sim.role_changes == [(pytest.approx(0.35), 1, "decode", "mixed")]
    assert sim.engines[1].role == "mixed"
    # once mixed, instance 1 takes prompts and serves them itself
    late = [r for r in rows.values() if r["arrival_s"] > 0.35 and r["prefill_instance"] == 1]
    assert late and all(r["decode_instance"] == 1 for r in late)
    assert result.summary["completed"] == 12


def test_repeating_a_pending_move_does_not_restart_it_and_a_new_one_replaces_it():
    same = Scripted(script={k: [SetRole(1, "mixed", 0.25)] for k in (1, 2, 3)})
    sim, _, _ = run(same, REQS)
    assert [(round(t, 9), i, r) for t, i, _, r in sim.role_changes] == [(0.35, 1, "mixed")]
    other = Scripted(script={1: [SetRole(0, "mixed", 0.3)], 2: [SetRole(0, "prefill")]})
    sim, _, _ = run(other, REQS)  # the second cancels the first: back to its own role
    assert sim.role_changes == [] and sim.engines[0].role == "prefill"


def test_instances_switching_with_work_in_flight_finish_it():
    # t=0.1: the prefill instance turns mixed with hand-offs queued and moving;
    # t=0.2: the decode instance turns mixed while decoding; t=0.4 and 0.5 both
    # go back. Every request ends, every block comes back (the run checks).
    reqs = [Request(i, 0.01 * i, 2500 + 100 * i, 40) for i in range(20)]
    policy = Scripted(script={1: [SetRole(0, "mixed")], 2: [SetRole(1, "mixed")],
                              4: [SetRole(0, "prefill")], 5: [SetRole(1, "decode")]})  # fmt: skip
    sim, result, rows = run(policy, reqs)
    assert result.summary["completed"] == 20
    assert [(i, r) for _, i, _, r in sim.role_changes] == [
        (0, "mixed"), (1, "mixed"), (0, "prefill"), (1, "decode")]  # fmt: skip
    # Routed to instance 0 as a prefill instance: they keep their hand-off, to
    # where pick_decode names, which may now be instance 0 itself: then the KV
    # stays where it is (no transfer, no second reservation).
    before = [r for r in rows.values() if r["arrival_s"] <= 0.1]
    assert all(r["prefill_instance"] == 0 for r in before)
    assert {r["decode_instance"] for r in before} == {0, 1}
    assert all((r["transfer_s"] == "") == (r["decode_instance"] == 0) for r in before)
    # routed while instance 0 was mixed: served there, nothing moved
    during = [r for r in rows.values() if 0.1 < r["arrival_s"] < 0.4]
    assert during and all(r["decode_instance"] == r["prefill_instance"] for r in during)
    assert all(e.kv.free == e.kv.total for e in sim.engines)


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (SetRole(7, "mixed"), r"scheduler 'Scripted': SetRole\(.*\) names instance 7"),
        (SetRole(0, "prompt"), "gives role 'prompt'; expected one of mixed, prefill, decode"),
        (SetRole(0, "mixed", -1.0), "cost_s -1.0 must be >= 0"),
        ("mixed", "tick\\(\\) returned 'mixed'; expected SetRole"),
        (
            SetRole(0, "decode"),
            r"needs instances that prefill .* \(after moving instance 0 from prefill to decode\)",
        ),
    ],
)
def test_bad_actions_are_spec_errors_naming_the_scheduler(action, message):
    with pytest.raises(SpecError, match=message):
        run(Scripted(script={1: [action]}), REQS)


def test_a_tick_hook_needs_a_positive_tick_s():
    with pytest.raises(SpecError, match="'Scripted' has tick\\(\\) but tick_s is 0"):
        Simulation(spec(), scheduler=Scripted(tick_s=0))


def test_plan_sets_per_instance_batching_limits():
    plan = Plan(max_batched_tokens={0: 2048}, max_num_seqs={1: 5000})
    sim = Simulation(spec(), scheduler=Scripted(plan=plan))
    a, b = sim.engines
    assert (a.config.max_batched_tokens, a.config.max_num_seqs) == (2048, 256)
    assert (b.config.max_batched_tokens, b.config.max_num_seqs) == (8192, 5000)
    log: list = []
    reqs = [Request(i, 0.0, 1000, 2) for i in range(5)]
    run(Scripted(plan=plan), reqs, log=log)
    batches = [e[3] for e in log if e[1] == "iteration" and e[2] == 0 and e[3]]
    assert batches[:3] == [(0, 1), (2, 3), (4,)]  # FCFS, at most 2,048 prompt tokens
    with pytest.raises(SpecError, match="sets max_num_seqs of instance 1 to 0"):
        Simulation(spec(), scheduler=Scripted(plan=Plan(max_num_seqs={1: 0})))
    with pytest.raises(SpecError, match="sets max_batched_tokens of instance 9"):
        Simulation(spec(), scheduler=Scripted(plan=Plan(max_batched_tokens={9: 10})))


# -- skipping ticks while nothing can change -------------------------------------------


@dataclass
class OnChange(Scripted):
    """A scripted policy that declares its tick reads only the cluster state."""

    tick_on_change: bool = True


# three requests far apart: the cluster is idle most of the time
SPARSE = [Request(0, 0.0, 3000, 30), Request(1, 5.02, 3000, 30), Request(2, 10.0, 3000, 30)]


def test_ticks_while_the_cluster_is_idle_are_skipped_on_the_same_grid():
    every = Scripted(tick_s=0.05)
    sim_a, result_a, rows_a = run(every, SPARSE)
    skip = OnChange(tick_s=0.05)
    sim_b, result_b, rows_b = run(skip, SPARSE)
    assert result_b.to_dict() == result_a.to_dict() and rows_b == rows_a
    # the ticks left are ticks of the same grid: exactly the same instants
    assert set(skip.ticks) < set(every.ticks)
    assert sim_a.control.tick_calls == len(every.ticks) > 200
    assert sim_b.control.tick_calls == len(skip.ticks) < len(every.ticks) / 4
    # an idle stretch ends at the first tick at or after the next arrival
    grid = sorted(every.ticks)
    after = [t for t in grid if t >= 5.02][0]
    assert after in skip.ticks and not [t for t in skip.ticks if 1.0 < t < 5.0]


def test_a_tick_that_acts_is_not_skipped_and_moves_come_at_the_same_times():
    # tick 3 acts while the first request is served; the move lands, and the
    # idle stretches around it are skipped
    script = {3: [SetRole(1, "mixed", 0.01)]}
    every = Scripted(tick_s=0.05, script=dict(script))
    sim_a, result_a, _ = run(every, SPARSE)
    skip = OnChange(tick_s=0.05, script=dict(script))
    sim_b, result_b, _ = run(skip, SPARSE)
    assert sim_b.role_changes == sim_a.role_changes != []
    assert result_b.to_dict() == result_a.to_dict()
    assert sim_b.control.tick_calls < sim_a.control.tick_calls / 4


def test_splitwise_moves_the_same_machines_at_the_same_times_with_fewer_ticks():
    from schedulers.splitwise import Splitwise
    from tests.test_splitwise import bursty_spec

    def go(skip: bool):
        sp = bursty_spec(move_cost="10 ms")
        policy = Splitwise(mixed_threshold_tokens=4096, move_cost="10 ms")
        policy.tick_on_change = skip
        sim = Simulation(sp, scheduler=policy)
        return sim, sim.run()

    sim_a, result_a = go(False)
    sim_b, result_b = go(True)
    assert any(new == "mixed" for _, _, _, new in sim_a.role_changes)
    assert sim_b.role_changes == sim_a.role_changes
    assert result_b.to_dict() == result_a.to_dict()
    assert sim_b.control.tick_calls < sim_a.control.tick_calls


def test_a_policy_that_counts_intervals_is_asked_every_tick():
    from schedulers.sla_planner import SlaPlanner
    from schedulers.splitwise import Splitwise
    from twin.scheduler import ticks_on_change

    assert ticks_on_change(Splitwise()) and not ticks_on_change(SlaPlanner())
    assert not ticks_on_change(Scripted())
