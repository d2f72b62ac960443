"""Sessions: turns sent closed loop, their prefix reuse, their metrics, and
the session-affinity router."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import schedulers.session_affinity  # noqa: F401 - registers it when not installed
from twin.errors import SpecError
from twin.sim.simulation import Simulation, run
from twin.sim.spec import resolve_spec
from twin.workload.lengths import FixedLength
from twin.workload.sessions import Sessions, ThinkTime


def _spec(**over: Any) -> dict[str, Any]:
    sessions = {
        "turns": {"dist": "fixed", "value": 2},
        "first_prompt": {"dist": "fixed", "value": 100},
        "growth": {"dist": "fixed", "value": 30},
        "output": {"dist": "fixed", "value": 20},
        "think": {"dist": "fixed", "value": 1.0},
        "system_prompt_len": 32,
    }
    sessions.update(over.pop("sessions", {}))
    spec: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "gpu": "h100-sxm",
        "cluster": {"instances": 1, "tp": 1},
        "engine": {"prefix_caching": True},
        "scheduler": "colocated",
        "workload": {
            "arrival": {"process": "poisson", "rate": 1.0},
            "max_requests": 1,
            "lengths": {"sessions": sessions},
        },
        "slo": {"ttft": "1 s", "tpot": "100 ms"},
    }
    for k, v in over.items():
        spec[k] = v
    return spec


def _run(data: dict[str, Any], **kw: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    spec = resolve_spec(json.loads(json.dumps(data)), "sessions.yaml", Path.cwd())
    rows: list[dict[str, Any]] = []
    res = Simulation(spec, on_row=rows.append, **kw).run()
    return res.summary, sorted(rows, key=lambda r: r["id"])


def test_two_turns_the_second_sent_after_the_answer_and_think_time_hits_the_first_prompt():
    log: list[tuple] = []
    summary, rows = _run(_spec(), log=log)
    first, second = rows
    assert [r["id"] for r in rows] == [0, 1] and all(r["status"] == "completed" for r in rows)
    # turn 1 is sent 1 s (the think time) after turn 0's answer has come back
    assert second["arrival_s"] == first["finish_s"] + 1.0
    # its prompt: turn 0's prompt (32 + 100), its answer (20) and the new part (30)
    assert (first["prompt_tokens"], second["prompt_tokens"]) == (132, 182)
    # turn 0's full prompt blocks (132 // 16 = 8 blocks of 16) are cached: turn 1 hits them
    assert first["hbm_hit_tokens"] == 0 and second["hbm_hit_tokens"] == 8 * 16
    s = summary["sessions"]
    assert (s["started"], s["completed"], s["abandoned"], s["turns_completed"]) == (1, 1, 0, 2)
    assert s["duration_s"]["mean"] == second["finish_s"] - first["arrival_s"]
    assert set(s["ttft_by_turn_s"]) == {"0", "1"}

    # the exact event trace: turn 1 arrives when turn 0 has finished and 1 s has passed
    def turn(i: int) -> list[tuple]:
        decode = [("iteration", 0, (), 1)] * 19  # 20 tokens: one from the prompt's step
        return [("arrive", -1, i), ("iteration", 0, (i,), 0), *decode, ("finish", 0, i)]

    assert [e[1:] for e in log] == turn(0) + turn(1)
    t_finish0 = next(e[0] for e in log if e[1:] == ("finish", 0, 0))
    assert next(e[0] for e in log if e[1:] == ("arrive", -1, 1)) == round(t_finish0 + 1.0, 9)


def test_a_turn_that_does_not_complete_ends_its_session():
    # a 4,096-token context: turn 2 would need 132 + 2 * (20 + 2000) + ... tokens
    data = _spec(
        sessions={
            "turns": {"dist": "fixed", "value": 4},
            "growth": {"dist": "fixed", "value": 2000},
        },
        engine={"prefix_caching": True, "max_model_len": 4096, "oversized": "reject"},
    )
    summary, rows = _run(data)
    assert [r["status"] for r in rows] == ["completed", "completed", "rejected"]
    assert rows[-1]["reason"] == "context_length"
    s = summary["sessions"]
    assert (s["started"], s["completed"], s["abandoned"], s["turns_completed"]) == (1, 0, 1, 2)
    assert summary["requests"] == 3  # turn 3 is never sent


def test_sessions_are_drawn_when_they_start_and_the_run_is_deterministic():
    data = _spec(
        sessions={
            "turns": {"dist": "lognormal", "median": 3, "sigma": 0.6},
            "output": {"dist": "lognormal", "median": 40, "sigma": 0.5},
            "think": {"dist": "exponential", "mean": 0.5},
        },
    )
    data["workload"]["max_requests"] = 30
    data["workload"]["arrival"]["rate"] = 5.0
    a = _run(data)
    b = _run(data)
    assert a == b
    summary, rows = a
    s = summary["sessions"]
    assert s["started"] == 30 and s["completed"] + s["abandoned"] == 30
    assert summary["requests"] == len(rows) == s["turns_completed"] + s["abandoned"]
    # a session's turns take consecutive ids and each turn's prompt holds the last
    by_id = {r["id"]: r for r in rows}
    assert sorted(by_id) == list(range(len(rows)))


def test_session_affinity_keeps_a_session_on_one_instance_and_hits_more():
    data = _spec(
        cluster={"instances": 4, "tp": 1},
        sessions={"turns": {"dist": "fixed", "value": 4}, "think": {"dist": "fixed", "value": 0.2}},
    )
    data["workload"]["max_requests"] = 40
    data["workload"]["arrival"]["rate"] = 8.0
    data["scheduler"] = "session-affinity"
    summary, rows = _run(data)
    assert summary["sessions"]["completed"] == 40
    for first in range(0, len(rows), 4):  # ids: 4 consecutive turns a session
        assert len({r["instance"] for r in rows[first : first + 4]}) == 1
    sticky = sum(r["hbm_hit_tokens"] for r in rows)
    data["scheduler"] = {"name": "colocated", "routing": "round_robin"}
    _, spread = _run(data)
    assert sticky > sum(r["hbm_hit_tokens"] for r in spread)


def test_hashes_share_the_system_prompt_and_nothing_else():
    ss = Sessions(
        FixedLength(1), FixedLength(64), FixedLength(1), FixedLength(1), ThinkTime("fixed"),
        system_prompt_len=32, block_tokens=16,
    )  # fmt: skip
    a, b = ss.hashes(0, 96), ss.hashes(1, 96)
    assert a[:2] == b[:2] and not set(a[2:]) & set(b[2:])
    assert ss.hashes(0, 128)[:6] == a  # a longer prompt of the session extends it
    names = {h for s in range(50) for h in ss.hashes(s, 400)}
    assert len(names) == 2 + 50 * (25 - 2)  # distinct names for distinct blocks


def test_think_times_follow_their_law():
    rng = np.random.default_rng(0)
    assert ThinkTime("fixed", 2.0).draw(rng, 3) == [2.0, 2.0, 2.0]
    exp = ThinkTime.from_mapping({"dist": "exponential", "mean": 2.0}, "think")
    assert np.mean(exp.draw(rng, 20_000)) == pytest.approx(2.0, rel=0.03)
    logn = ThinkTime.from_mapping({"dist": "lognormal", "mean": 3.0, "cv": 0.5}, "think")
    assert np.mean(logn.draw(rng, 40_000)) == pytest.approx(3.0, rel=0.03)


@pytest.mark.parametrize(
    ("sessions", "message"),
    [
        ({"think": {"dist": "gamma"}}, "think.dist: 'gamma' unknown"),
        ({"think": {"dist": "fixed", "value": -1}}, "think.value: -1 is not a number of seconds"),
        ({"turns": 3}, "turns: 3 is not a mapping"),
        ({"typo": 1}, "typo"),
    ],
)
def test_bad_session_keys_are_named(sessions, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        resolve_spec(_spec(sessions=sessions), "s.yaml", Path.cwd())


def test_skip_is_refused_with_sessions():
    data = _spec()
    data["workload"]["skip"] = 3
    with pytest.raises(SpecError, match="skip applies to a stream of requests"):
        resolve_spec(data, "s.yaml", Path.cwd())


@pytest.mark.parametrize(
    ("retention", "tiers", "hbm", "dram"),
    [
        ({"policy": "keep"}, None, 8 * 16, 0),  # the whole prompt of turn 0 is reused
        ({"policy": "drop"}, None, 2 * 16, 0),  # the shared system prompt only
        ({"policy": "ttl", "ttl": "2 s"}, None, 8 * 16, 0),  # back within the TTL
        ({"policy": "ttl", "ttl": "0.5 s"}, None, 2 * 16, 0),  # after it: let go
        ({"policy": "offload"}, {"dram": "1 GB"}, 2 * 16, 6 * 16),  # from host memory
    ],
)
def test_retention_between_turns(retention, tiers, hbm, dram):
    # turn 0: 32 system + 100 tokens (8 full blocks, 2 of them the system prompt's);
    # turn 1 comes 1 s after turn 0's answer
    data = _spec(engine={"prefix_caching": True, "session_retention": retention})
    if tiers is not None:
        data["kv_tiers"] = tiers
    summary, rows = _run(data)
    second = rows[1]
    assert (second["hbm_hit_tokens"], second["dram_hit_tokens"]) == (hbm, dram)
    assert (
        summary["sessions"]["completed"] == 1
        and summary["sessions"]["retention"] == (retention["policy"])
    )


def test_a_retention_policy_of_ones_own_is_asked_at_each_turn_end():
    asked = []

    class DropAfterTurnOne:
        def decide(self, session):
            asked.append(session.turn)
            return ("drop", 0.0) if session.turn >= 1 else ("keep", 0.0)

    data = _spec(sessions={"turns": {"dist": "fixed", "value": 3}})
    summary, rows = _run(data, retention=DropAfterTurnOne())
    assert asked == [0, 1, 2]
    assert rows[1]["hbm_hit_tokens"] > 2 * 16 and rows[2]["hbm_hit_tokens"] == 2 * 16
    assert summary["sessions"]["retention"] == "DropAfterTurnOne"


@pytest.mark.parametrize(
    ("retention", "caching", "message"),
    [
        ({"policy": "offload"}, True, "give kv_tiers"),
        ({"policy": "drop"}, False, "prefix_caching: true"),
        ({"policy": "ttl"}, True, "policy: ttl needs one"),
        ({"policy": "forever"}, True, "'forever' unknown"),
    ],
)
def test_a_retention_without_what_it_acts_on_is_refused(retention, caching, message):
    engine = {"prefix_caching": caching, "session_retention": retention}
    with pytest.raises(SpecError, match=message):
        resolve_spec(_spec(engine=engine), "s.yaml", Path.cwd())


def test_retention_needs_sessions():
    data = _spec(engine={"prefix_caching": True, "session_retention": {"policy": "drop"}})
    data["workload"] = {"arrival": {"process": "poisson", "rate": 1.0}, "max_requests": 3,
                        "lengths": {"prompt": {"dist": "fixed", "value": 100},
                                    "output": {"dist": "fixed", "value": 10}}}  # fmt: skip
    with pytest.raises(SpecError, match="acts between a session's turns"):
        resolve_spec(data, "s.yaml", Path.cwd())


def test_a_session_whose_turn_times_out_is_abandoned():
    data = _spec(sessions={"turns": {"dist": "fixed", "value": 3}})
    data["workload"]["timeout"] = "10 ms"  # shorter than any turn
    summary, rows = _run(data)
    assert [(r["status"], r["reason"]) for r in rows] == [("failed", "timeout")]
    assert summary["sessions"]["abandoned"] == 1


def test_sessions_whose_turns_wait_on_a_node_that_never_comes_back_end_the_run():
    """Every instance's node fails for good while random GPU failures go on:
    the turns wait for an instance to come back, no later turn can arrive,
    so random failures stop and the waiting turns end failed (before, the
    sessions kept the arrivals open and the failures went on for ever)."""
    import signal

    data = {
        "model": "llama-3.1-8b", "seed": 2, "scheduler": "disagg",
        "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "tp": 1,
                    "prefill": {"instances": 1}, "decode": {"instances": 1}},
        "workload": {"arrival": {"process": "poisson", "rate": 5.0}, "max_requests": 6,
                     "lengths": {"sessions": {
                         "turns": {"dist": "fixed", "value": 3},
                         "first_prompt": {"dist": "fixed", "value": 300},
                         "growth": {"dist": "fixed", "value": 100},
                         "output": {"dist": "fixed", "value": 60},
                         "think": {"dist": "fixed", "value": 0.2}}}},
        "events": [{"at": 0.5, "action": "fail", "node": 0}],
        "failures": {"random": [{"component": "gpu", "mtbf": "3 s", "repair": "0.4 s"}]},
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }  # fmt: skip

    def hung(*_: object) -> None:
        raise AssertionError("the run did not end")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        s = run(data).summary
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert s["failed"] > 0 and s["completed"] + s["failed"] + s["rejected"] == s["requests"]
