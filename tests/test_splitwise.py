"""Splitwise: JSQ over prompt, token and mixed pools; machine flow; provisioning."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import schedulers.splitwise  # registers the policy when not installed
from schedulers.splitwise import Splitwise
from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import Route, SetRole, build_scheduler
from twin.sim.simulation import Simulation
from twin.sim.spec import resolve_spec
from twin.testing import check_scheduler, instance, make_view

REQ = Request(0, 0.0, 1000, 50)


def pools(**over):
    """Two prompt machines (0, 1) and two token machines (2, 3)."""
    fields = {
        0: dict(role="prefill"), 1: dict(role="prefill"),
        2: dict(role="decode"), 3: dict(role="decode"),
    }  # fmt: skip
    for k, v in over.items():
        fields[int(k[1:])].update(v)
    return make_view(*(instance(i, **fields[i]) for i in range(4)))


def test_route_joins_the_shortest_prompt_queue_and_picks_the_token_machine_with_it():
    sw = Splitwise()
    view = pools(i0=dict(queue_tokens=3000, queue_requests=2), i1=dict(queue_tokens=1000),
                 i2=dict(free_blocks=500), i3=dict(free_blocks=900))  # fmt: skip
    assert sw.route(REQ, view) == Route(1, 3)
    view = pools(i0=dict(queue_tokens=500, queue_requests=1), i1=dict(queue_tokens=1000),
                 i2=dict(free_blocks=900), i3=dict(free_blocks=800))  # fmt: skip
    assert sw.route(REQ, view) == Route(0, 2)


def test_a_burst_at_arrival_spreads_over_the_token_machines_until_its_kv_lands():
    sw = Splitwise(expected_output_tokens=0)
    sw.setup(pools())
    # 1000 prompt tokens = 63 blocks; 0.1 s of prefill at 1e-4 s a token
    big = Request(1, 0.0, 1000, 50)
    view = pools(i2=dict(free_blocks=100), i3=dict(free_blocks=90))
    assert [sw.route(big, view).decode for _ in range(3)] == [2, 3, 2]
    # expected to have landed (and be counted by the machines themselves) by now
    later = make_view(*view.instances, now=1.0)
    assert sw.route(big, later).decode == 2


def test_memory_need_is_sized_from_the_expected_output_not_the_true_one():
    sw = Splitwise(expected_output_tokens=600)
    short, long = Request(1, 0.0, 1000, 1), Request(2, 0.0, 1000, 100_000)
    # 1600 tokens = 100 blocks: only the mixed machine fits, whatever the true length
    view = pools(i1=dict(role="mixed", free_blocks=100), i2=dict(free_blocks=99),
                 i3=dict(free_blocks=99))  # fmt: skip
    assert sw.pick_decode(short, view) == sw.pick_decode(long, view) == 1
    assert Splitwise(expected_output_tokens=0).pick_decode(long, view) == 2


class _Unseen:
    """A request whose output length may not be read."""

    def __init__(self, req: Request) -> None:
        self._req = req

    def __getattr__(self, name: str):
        if name == "output_tokens":
            raise AssertionError("the policy read the true output length")
        return getattr(self._req, name)


def test_the_policy_never_reads_the_true_output_length():
    tree = ast.parse(Path(schedulers.splitwise.__file__).read_text())
    read = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and n.attr == "output_tokens"]  # fmt: skip
    assert read == []
    sw = Splitwise(mixed_threshold_tokens=4000)
    sw.setup(pools())
    req: Any = _Unseen(Request(7, 0.0, 900, 10_000))
    long = dict(queue_tokens=5000, queue_requests=3)
    for view in (pools(), pools(i0=long, i1=long, i3=dict(role="mixed")),
                 pools(i2=dict(free_blocks=1), i3=dict(free_blocks=1))):  # fmt: skip
        assert isinstance(sw.route(req, view), Route)
        sw.pick_decode(req, view)


def test_a_backed_up_prompt_pool_overflows_to_mixed_machines_served_whole():
    sw = Splitwise(mixed_threshold_tokens=4000)
    long = dict(queue_tokens=5000, queue_requests=3)
    view = pools(i0=long, i1=long, i3=dict(role="mixed"))
    assert sw.route(REQ, view) == Route(3, 3)
    # every queue long: the shortest one still takes it
    view = pools(i0=long, i1=dict(queue_tokens=4500, queue_requests=2),
                 i3=dict(role="mixed", queue_tokens=6000, queue_requests=2))  # fmt: skip
    assert sw.route(REQ, view) == Route(1, 2)


def test_pick_decode_by_memory_then_pending_work():
    sw = Splitwise()
    view = pools(i2=dict(free_blocks=500), i3=dict(free_blocks=800))
    assert sw.pick_decode(REQ, view) == 3
    view = pools(i2=dict(running_requests=4), i3=dict(running_requests=2))
    assert sw.pick_decode(REQ, view) == 3
    # the token pool cannot hold it (1000 + 128 expected tokens = 71 blocks): a mixed one can
    view = pools(i1=dict(role="mixed", free_blocks=100), i2=dict(free_blocks=60),
                 i3=dict(free_blocks=50))  # fmt: skip
    assert sw.pick_decode(REQ, view) == 1
    view = pools(i2=dict(free_blocks=60), i3=dict(free_blocks=50))
    assert sw.pick_decode(REQ, view) == 2  # nowhere fits: the most free memory, and wait


def test_tick_moves_a_token_machine_to_mixed_past_the_threshold_and_back_when_drained():
    sw = Splitwise(mixed_threshold_tokens=4000, move_cost="20 ms", tick_interval="50 ms")
    assert sw.tick_s == 0.05
    sw.setup(pools())
    long = dict(queue_tokens=5000, queue_requests=3)
    busy = pools(i0=long, i1=long, i2=dict(running_requests=5), i3=dict(running_requests=1))
    assert sw.tick(busy) == [SetRole(3, "mixed", 0.02)]
    assert sw.tick(busy) == []  # the move is under way
    moved = pools(i0=long, i1=long, i3=dict(role="mixed", queue_requests=1, queue_tokens=900))
    assert sw.tick(moved) == []  # pool still backed up, and it has work
    drained_but_needed = pools(i0=long, i1=long, i3=dict(role="mixed"))
    assert sw.tick(drained_but_needed) == []
    calm = pools(i3=dict(role="mixed"))
    assert sw.tick(calm) == [SetRole(3, "decode", 0.02)]
    still_busy = pools(i3=dict(role="mixed", running_requests=2))
    sw2 = Splitwise()
    sw2.setup(pools())
    assert sw2.tick(still_busy) == []


def test_tick_lends_a_prompt_machine_when_the_token_pool_is_out_of_memory():
    sw = Splitwise(token_free_threshold=0.1)
    sw.setup(pools())
    full = dict(free_blocks=50)
    view = pools(i0=dict(free_blocks=700), i1=dict(free_blocks=900), i2=full, i3=full)
    assert sw.tick(view) == [SetRole(1, "mixed", 0.0)]
    back = pools(i1=dict(role="mixed"))
    assert sw.tick(back) == [SetRole(1, "prefill", 0.0)]


def test_setup_keeps_the_pools_and_sets_per_phase_batching():
    sw = Splitwise(prompt_token_limit=1024)
    plan = sw.setup(pools(i2=dict(total_blocks=5000), i3=dict(total_blocks=7000)))
    assert plan.roles == {}
    assert plan.max_batched_tokens == {0: 1024, 1: 1024}
    assert plan.max_num_seqs == {2: 5000, 3: 7000}
    with pytest.raises(
        SpecError, match=r"needs prefill and decode .*\(its prompt and token machines\)"
    ):
        sw.setup(make_view(instance(0), instance(1)))


def test_parameters_are_checked():
    with pytest.raises(SpecError, match="tick_interval"):
        build_scheduler("splitwise", {"tick_interval": "0 ms"})
    with pytest.raises(SpecError, match="move_cost"):
        build_scheduler("splitwise", {"move_cost": "soon"})
    with pytest.raises(SpecError, match="expected_output_tokens"):
        build_scheduler("splitwise", {"expected_output_tokens": -1})
    with pytest.raises(SpecError, match="prompt_token_limit"):
        build_scheduler("splitwise", {"prompt_token_limit": 0})
    assert build_scheduler("splitwise", {"move_cost": "1 s"}).move_cost_s == 1.0


def test_splitwise_keeps_the_contract():
    assert check_scheduler("splitwise") == "split"


def bursty_spec(events=(), **sched):
    data = {
        "model": "llama-3.1-8b",
        "cluster": {"topology": "dgx-h100-ib400", "nodes": 2, "tp": 4, "prefill": 2, "decode": 2},
        "scheduler": {"name": "splitwise", "mixed_threshold_tokens": 4096, **sched},
        "transfer": {"mode": "layerwise"},
        "workload": {"lengths": "azure-code",
                     "arrival": {"process": "gamma", "rate": 30, "cv": 4},
                     "max_requests": 400},
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }  # fmt: skip
    if events:
        data["events"] = list(events)
    return resolve_spec(data, "splitwise.yaml", Path.cwd())


DOWN_AND_BACK = [{"at": "4 s", "action": "fail", "instance": 3},
                 {"at": "7 s", "action": "recover", "instance": 3}]  # fmt: skip


def test_end_to_end_a_burst_moves_machines_and_everything_completes():
    sim = Simulation(bursty_spec(move_cost="10 ms"))
    result = sim.run()
    assert result.summary["completed"] == 400
    moves = sim.role_changes
    assert any(new == "mixed" for _, _, _, new in moves)
    assert any(old == "mixed" for _, _, old, _ in moves)  # and back when drained
    assert all(i in (2, 3) for _, i, _, _ in moves)  # token machines helped the prompt pool
    assert [e.config.max_batched_tokens for e in sim.engines[:2]] == [2048, 2048]
    assert all(e.kv.free == e.kv.total for e in sim.engines)
    again = Simulation(bursty_spec(move_cost="10 ms")).run()
    assert again.to_dict() == result.to_dict()


PROVISION_SPEC = {
    "model": "llama-3.1-8b",
    "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "tp": 4, "prefill": 1, "decode": 1},
    "scheduler": "splitwise",
    "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 5},
                 "max_requests": 1000},
    "slo": {"ttft": "500 ms", "tpot": "40 ms"},
}  # fmt: skip


def test_provisioning_finds_the_best_split_and_is_deterministic():
    from twin.studies.provision import provision

    # 80 requests: the two splits' goodputs differ (at 40 both meet the SLO at every rate)
    a = provision(PROVISION_SPEC, "p.yaml", Path.cwd(), gpus=12, sample=80, replicates=2)
    assert [(c.prefill, c.decode, c.gpus) for c in a.candidates] == [(1, 2, 12), (2, 1, 12)]
    assert a.best in a.candidates
    assert a.best.goodput_rps == max(c.goodput_rps for c in a.candidates) > 0
    assert a.best.goodput_rps > min(c.goodput_rps for c in a.candidates)
    assert a.candidates[0].power_w == 12 * 700  # H100 SXM TDP from the catalog
    b = provision(PROVISION_SPEC, "p.yaml", Path.cwd(), gpus=12, sample=80, replicates=2)
    assert a == b
    # 2 x 4 x 700 W fits 6 kW, a third instance does not
    w = provision(PROVISION_SPEC, "p.yaml", Path.cwd(), power_w=6000, sample=40, replicates=1)
    assert [(c.prefill, c.decode) for c in w.candidates] == [(1, 1)]


def test_provision_cli_prints_a_table_and_errors_on_one_line(tmp_path, capsys):
    import yaml

    from twin.cli import main

    path = tmp_path / "split.yaml"
    path.write_text(yaml.safe_dump(PROVISION_SPEC))
    assert (
        main(["provision", str(path), "--power", "6 kW", "--sample", "40", "--replicates", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert "budget 6,000 W" in out and "<- best" in out and "best: 1 prefill + 1 decode" in out
    assert main(["provision", str(path), "--power", "3 kW"]) == 2
    assert "holds no prefill + decode pair" in capsys.readouterr().err
    assert main(["provision", str(path), "--power", "lots"]) == 2
    assert "--power: 'lots' is not a power" in capsys.readouterr().err


def test_provisioning_is_the_same_when_its_searches_run_in_parallel():
    from twin.studies.provision import format_provision, provision
    from twin.studies.sweep import Executor

    kw = dict(gpus=12, sample=40, replicates=2)
    serial = provision(PROVISION_SPEC, "p.yaml", Path.cwd(), **kw)
    parallel = provision(PROVISION_SPEC, "p.yaml", Path.cwd(), executor=Executor(jobs=2), **kw)
    assert [len(c.goodputs_rps) for c in serial.candidates] == [2, 2]
    assert parallel == serial and format_provision(parallel) == format_provision(serial)


@pytest.mark.parametrize(
    ("sched", "lent"),
    [
        ({"move_cost": "10 ms"}, (2, 3)),  # queues past the mark: token machines help
        # token memory short of the mark (queues never past it): prompt machines help
        ({"token_free_threshold": 0.999, "mixed_threshold_tokens": 10**9}, (0, 1)),
    ],
)
def test_ticks_asleep_on_their_thresholds_decide_as_ticking_every_interval(sched, lent):
    runs = []
    for watch in (False, True):
        sw = Splitwise(**{"mixed_threshold_tokens": 4096, **sched})
        sw.tick_on_change = watch  # without it every tick of the grid is asked
        rows: list = []
        # with memory short, a token machine fails and comes back: the pools change
        events = [] if "move_cost" in sched else DOWN_AND_BACK
        sim = Simulation(bursty_spec(events, **sched), scheduler=sw, on_row=rows.append)
        runs.append((sim, sim.run(), rows))
    (every, res_every, rows_every), (watched, res_watched, rows_watched) = runs
    assert res_watched.to_dict() == res_every.to_dict() and rows_watched == rows_every
    assert watched.role_changes == every.role_changes
    assert every.role_changes and {i for _, i, _, _ in every.role_changes} <= set(lent)
    assert watched.control.tick_calls < every.control.tick_calls


def test_what_is_on_its_way_to_a_token_machine_lands_as_a_list_would_say():
    import random

    from schedulers.splitwise import _OnWay

    rng = random.Random(7)
    way, plain = _OnWay(), []
    now = 0.0
    for _ in range(2000):
        if rng.random() < 0.6:
            due, blocks = now + rng.choice([0.0, rng.random()]), rng.randint(1, 50)
            way.add(due, blocks)
            plain.append((due, blocks))
        else:
            now += rng.random() * 0.3
            plain = [s for s in plain if s[0] > now]
            assert way.land(now) == bool(plain)
            assert (len(way.due), way.blocks) == (len(plain), sum(b for _, b in plain))
