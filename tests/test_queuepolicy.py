"""Queue policies inside an instance: the order they admit in, exact traces of
each shipped policy (preemption and its re-queue among them), the queue
against a deque, the registry, the spec, and a policy written from the policies guide."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from helpers import small_spec
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import Auditing, run_engine

import twin
from twin.errors import DuplicateRegistrationError, SpecError, TwinError, UnknownNameError
from twin.request import Request
from twin.serving.cluster import EngineView
from twin.serving.engine import EngineConfig
from twin.serving.queuecost import queue_iterations_s
from twin.serving.queuepolicy import (
    PolicyQueue,
    Queued,
    QueuePolicyChoice,
    build_queue_policy,
    queue_policy_names,
    register_queue_policy,
)
from twin.serving.sequence import Sequence
from twin.sim.simulation import Simulation
from twin.workload.stream import WorkloadSpec, iter_requests

POLICIES_PAGE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "policies.md"
SHIPPED = ["fcfs", "priority", "shortest-prompt-first"]


def config(policy: str, **kw) -> EngineConfig:
    return EngineConfig(queue_policy=QueuePolicyChoice(policy), **kw)


# -- the order of admission ------------------------------------------------------------
# One running sequence at a time, one token each: the log shows the admission order.
QUEUED = [
    Request(0, 0.0, 100, 1),
    Request(1, 0.001, 80, 1, priority=2),
    Request(2, 0.002, 20, 1, priority=1),
    Request(3, 0.003, 10, 1, priority=1),
]


@pytest.mark.parametrize(
    ("policy", "order", "ends"),
    [
        ("fcfs", [0, 1, 2, 3], [0.02, 0.038, 0.05, 0.061]),
        ("priority", [0, 2, 3, 1], [0.02, 0.032, 0.043, 0.061]),  # ties by arrival
        ("shortest-prompt-first", [0, 3, 2, 1], [0.02, 0.031, 0.043, 0.061]),
    ],
)
def test_each_policy_admits_in_its_order_exact_trace(policy, order, ends):
    log: list[tuple] = []
    run_engine(QUEUED, config=config(policy, max_num_seqs=1), log=log)
    # Linear: 10 ms + 0.1 ms a prompt token; each request's one token ends it
    want = []
    start = 0.0
    for rid, end in zip(order, ends, strict=True):
        want += [(start, "iteration", 0, (rid,), 0), (end, "finish", 0, rid)]
        start = end
    assert [(pytest.approx(e[0]), *e[1:]) for e in log] == want


# Six blocks of 4 tokens: the decodes run out and one is preempted, then recomputed.
# r0 (priority 1) is admitted alone; r1 and r2 (priority 0) join it at the next step.
PREEMPTED = [
    Request(0, 0.0, 8, 9, priority=1),
    Request(1, 0.001, 8, 9, priority=0),
    Request(2, 0.002, 4, 2, priority=0),
]
TRACES = {
    # the most recently admitted (r2) goes first, then r1, which rejoins the
    # queue AHEAD of r2: both are admitted again together, r1 first
    "fcfs": [
        (0.0, "iteration", 0, (0,), 0),
        (0.0108, "iteration", 0, (1, 2), 0),
        (0.022, "preempt", 0, 2),
        (0.022, "iteration", 0, (), 2),
        (0.034, "iteration", 0, (), 2),
        (0.046, "iteration", 0, (), 2),
        (0.058, "iteration", 0, (), 2),
        (0.07, "preempt", 0, 1),
        (0.07, "iteration", 0, (), 1),
        (0.081, "iteration", 0, (), 1),
        (0.092, "iteration", 0, (), 1),
        (0.103, "iteration", 0, (), 1),
        (0.114, "finish", 0, 0),
        (0.114, "iteration", 0, (1, 2), 0),
        (0.1258, "finish", 0, 2),
        (0.1258, "iteration", 0, (), 1),
        (0.1368, "iteration", 0, (), 1),
        (0.1478, "iteration", 0, (), 1),
        (0.1588, "finish", 0, 1),
    ],
    # the lowest priority (r0) is the victim though admitted first, twice
    "priority": [
        (0.0, "iteration", 0, (0,), 0),
        (0.0108, "iteration", 0, (1, 2), 0),
        (0.022, "preempt", 0, 0),
        (0.022, "iteration", 0, (), 2),
        (0.034, "finish", 0, 2),
        (0.034, "iteration", 0, (0,), 0),
        (0.0449, "iteration", 0, (), 2),
        (0.0569, "iteration", 0, (), 2),
        (0.0689, "iteration", 0, (), 2),
        (0.0809, "preempt", 0, 0),
        (0.0809, "iteration", 0, (), 1),
        (0.0919, "iteration", 0, (), 1),
        (0.1029, "iteration", 0, (), 1),
        (0.1139, "iteration", 0, (), 1),
        (0.1249, "finish", 0, 1),
        (0.1249, "iteration", 0, (0,), 0),
        (0.1362, "iteration", 0, (), 1),
        (0.1472, "iteration", 0, (), 1),
        (0.1582, "iteration", 0, (), 1),
        (0.1692, "finish", 0, 0),
    ],
    # r2's 4 tokens are admitted before r1's 8; the victim is the latest admitted (r1)
    "shortest-prompt-first": [
        (0.0, "iteration", 0, (0,), 0),
        (0.0108, "iteration", 0, (2, 1), 0),
        (0.022, "preempt", 0, 1),
        (0.022, "iteration", 0, (), 2),
        (0.034, "finish", 0, 2),
        (0.034, "iteration", 0, (1,), 0),
        (0.0449, "iteration", 0, (), 2),
        (0.0569, "iteration", 0, (), 2),
        (0.0689, "iteration", 0, (), 2),
        (0.0809, "preempt", 0, 1),
        (0.0809, "iteration", 0, (), 1),
        (0.0919, "iteration", 0, (), 1),
        (0.1029, "iteration", 0, (), 1),
        (0.1139, "iteration", 0, (), 1),
        (0.1249, "finish", 0, 0),
        (0.1249, "iteration", 0, (1,), 0),
        (0.1362, "iteration", 0, (), 1),
        (0.1472, "iteration", 0, (), 1),
        (0.1582, "iteration", 0, (), 1),
        (0.1692, "finish", 0, 1),
    ],
}


@pytest.mark.parametrize("policy", SHIPPED)
def test_preemption_and_its_requeue_follow_the_policy_exact_trace(policy):
    log: list[tuple] = []
    cfg = config(policy, block_size=4, watermark=0.0)
    eng, done = run_engine(PREEMPTED, blocks=6, config=cfg, log=log, perf=Auditing())
    assert [(pytest.approx(e[0]), *e[1:]) for e in log] == TRACES[policy]
    assert sorted(s.req.id for s in done) == [0, 1, 2]
    assert eng.kv.free == eng.kv.total


def test_a_higher_priority_arrival_waits_for_blocks_rather_than_preempting():
    """As vLLM's priority scheduling: admission never preempts running work."""
    log: list[tuple] = []
    # r0 takes 4 of 6 blocks, then 5; r1's prompt needs 3: it waits for r0's end
    reqs = [Request(0, 0.0, 16, 5, priority=5), Request(1, 0.001, 12, 2, priority=0)]
    cfg = config("priority", block_size=4, watermark=0.0)
    run_engine(reqs, blocks=6, config=cfg, log=log)
    assert not any(e[1] == "preempt" for e in log)
    admitted = [e[3] for e in log if e[1] == "iteration" and e[3]]
    assert admitted == [(0,), (1,)]
    assert [e[3] for e in log if e[1] == "finish"] == [0, 1]


# -- the queue against a deque ---------------------------------------------------------
class Const:
    def key(self, item) -> int:
        return 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["append", "appendleft", "pop", "remove"]), max_size=40))
def test_a_queue_of_equal_keys_is_the_engines_deque(ops):
    """Equal keys keep first come, first served with a preempted one in front:
    exactly the deque the engine keeps under FCFS."""
    q, d = PolicyQueue(Const()), deque()
    n = 0
    for op in ops:
        if op == "append" or op == "appendleft":
            getattr(q, op)(n)
            getattr(d, op)(n)
            n += 1
        elif d and op == "pop":
            assert q.popleft() == d.popleft()
        elif d:
            victim = d[len(d) // 2]
            q.remove(victim)
            d.remove(victim)
        assert list(q) == list(d) and len(q) == len(d) and bool(q) == bool(d)
        if d:
            assert q[0] == d[0]


def test_a_preempted_request_rejoins_by_its_key_then_ahead_of_its_equals():
    """Under ``priority`` a preempted request of low priority waits behind the
    higher-priority ones queued, and ahead of an equal one that arrived at the
    same instant; under FCFS it goes to the front."""

    def item(rid: int, priority: int) -> Sequence:
        return Sequence(Request(rid, 0.5, 10, 1, priority=priority), 0.5)

    a, b, c, back = item(0, 0), item(1, 2), item(2, 2), item(3, 2)
    for name, want in [("priority", [a, back, b, c]), ("fcfs", [back, a, b, c])]:
        q = PolicyQueue(build_queue_policy(name))
        for s in (a, b, c):
            q.append(s)
        q.appendleft(back)  # preempted: rejoins
        assert list(q) == want, name
        assert [q.popleft() for _ in range(4)] == want


# -- the queue estimate -----------------------------------------------------------------
def test_the_queue_estimate_prices_the_queue_in_the_policys_order():
    """Without chunking, a prompt that does not fit the iteration's token
    budget starts the next one, so the order changes the estimate: each
    policy's is the pricing of its own order."""
    # FCFS: [500], [900], [500]; shortest first: [500, 500], [900]
    reqs = [Request(0, 0.0, 500, 1), Request(1, 0.0, 900, 1), Request(2, 0.0, 500, 1)]
    got = {}
    for policy in ("fcfs", "shortest-prompt-first"):
        eng, _ = run_engine([], config=config(policy, max_batched_tokens=1000))
        for r in reqs:
            eng.waiting.append(Sequence(r, 0.0))
            eng.waiting_tokens += r.prompt_tokens
        order = [s.req.prompt_tokens for s in eng.waiting]
        want = sum(queue_iterations_s(eng.perf, [(n, 0) for n in order], 1000, chunked=False))
        view = EngineView(eng, None)  # type: ignore[arg-type]  # no placement is read
        got[policy] = (order, view.estimate_queue_s(), want)
    assert got["fcfs"][0] == [500, 900, 500]
    assert got["shortest-prompt-first"][0] == [500, 500, 900]
    for _, estimate, want in got.values():
        assert estimate == pytest.approx(want)
    assert got["fcfs"][1] == pytest.approx(got["shortest-prompt-first"][1] + 0.01)  # one base


# -- the registry and the spec ---------------------------------------------------------
def test_the_shipped_policies_are_registered():
    assert set(SHIPPED) <= set(queue_policy_names())


def test_an_unknown_policy_suggests_close_names():
    with pytest.raises(UnknownNameError, match=r"Did you mean 'priority'"):
        build_queue_policy("priorty")
    with pytest.raises(UnknownNameError, match=r"test.yaml: engine.queue_policy: unknown queue"):
        small_spec(engine={"queue_policy": "shortest-prompt"})


def test_a_name_taken_by_another_class_is_refused():
    @dataclass(frozen=True)
    class Other:
        def key(self, item) -> int:
            return 0

    with pytest.raises(DuplicateRegistrationError, match="'priority' is already registered"):
        register_queue_policy("priority")(Other)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"name": "fcfs", "depth": 2}, r"engine.queue_policy.depth: unknown parameter"),
        (3, r"engine.queue_policy: 3 must be a queue policy name"),
        ({"priority": 1}, r"must be a queue policy name or a mapping with a name"),
    ],
)
def test_a_bad_queue_policy_in_a_spec_is_one_error(value, message):
    with pytest.raises(SpecError, match=message):
        small_spec(engine={"queue_policy": value})


def test_the_resolved_spec_names_a_queue_policy_only_when_given():
    assert "queue_policy" not in small_spec().resolved["engine"]
    given = small_spec(engine={"queue_policy": "priority"}).resolved["engine"]
    assert given["queue_policy"] == "priority"


def test_workload_priorities_are_drawn_by_share_from_their_own_stream():
    base = {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 5}}
    plain = WorkloadSpec.from_mapping(base | {"max_requests": 2000})
    mixed = WorkloadSpec.from_mapping(base | {"max_requests": 2000, "priority": {0: 1, 3: 3}})
    a = list(iter_requests(plain, np.random.default_rng(1)))
    b = list(iter_requests(mixed, np.random.default_rng(1)))
    # arrivals and lengths as without priorities
    assert [(r.arrival_s, r.prompt_tokens) for r in a] == [
        (r.arrival_s, r.prompt_tokens) for r in b
    ]
    assert {r.priority for r in a} == {0}
    share = np.mean([r.priority == 3 for r in b])
    assert share == pytest.approx(0.75, abs=0.03)
    constant = WorkloadSpec.from_mapping(base | {"max_requests": 5, "priority": -2})
    assert {r.priority for r in iter_requests(constant, np.random.default_rng(1))} == {-2}


@pytest.mark.parametrize("value", ["high", {0: 0}, {"a": 1}, {}, 1.5])
def test_a_bad_workload_priority_is_one_error(value):
    with pytest.raises(SpecError, match=r"workload.priority: "):
        small_spec(
            workload={
                "lengths": "azure-conv",
                "arrival": {"process": "poisson", "rate": 4},
                "max_requests": 5,
                "priority": value,
            }
        )


# -- a policy written from the policies guide (docs/guides/policies.md) ------------------
def _readme_example(index: int = 0) -> str:
    """The guide's queue policies, in order: shortest-job-first, earliest-deadline-first."""
    text = POLICIES_PAGE.read_text(encoding="utf-8")
    section = text.split("### Queue order inside an instance", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    return blocks[index]


def test_a_policy_written_from_the_readme_serves_in_its_order():
    scope: dict = {"__name__": "readme"}
    exec(compile(_readme_example(), "docs/guides/policies.md", "exec", dont_inherit=True), scope)
    assert "shortest-job-first" in queue_policy_names()
    # prompt + output: r2 (30 + 5) before r1 (10 + 30), then r3 (60 + 1)
    reqs = [
        Request(0, 0.0, 50, 1),
        Request(1, 0.001, 10, 30),
        Request(2, 0.002, 30, 5),
        Request(3, 0.003, 60, 1),
    ]
    log: list[tuple] = []
    run_engine(reqs, config=config("shortest-job-first", max_num_seqs=1), log=log)
    admitted = [e[3][0] for e in log if e[1] == "iteration" and e[3]]
    assert admitted == [0, 2, 1, 3]
    # with a parameter, from a spec, in a whole run
    spec = small_spec(
        requests=40, rate=20.0,
        engine={"queue_policy": {"name": "shortest-job-first", "output_weight": 0.5}},
    )  # fmt: skip
    result = Simulation(spec).run().to_dict()
    assert result["summary"]["completed"] == 40
    with pytest.raises(TwinError, match=r"queue_policy.weight: unknown parameter"):
        small_spec(engine={"queue_policy": {"name": "shortest-job-first", "weight": 1}})


# -- a request's class objectives (Queued.slo) ----------------------------------------------
SLO_CLASSES = [
    {"name": "interactive", "share": 0.5, "priority": 0, "slo": {"ttft": "500 ms"}},
    {"name": "batch", "share": 0.5, "priority": 0, "slo": {"ttft": "60 s", "tpot": "200 ms"}},
]


def _class_run(policy: str, classes: list | None, reqs: list[Request]) -> list[dict]:
    workload = {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1.0},
                "max_requests": len(reqs)}  # fmt: skip
    if classes is not None:
        workload["classes"] = classes
    spec = small_spec(
        cluster={"instances": 1, "tp": 1}, workload=workload,
        engine={"max_num_seqs": 1, "queue_policy": policy},
    )  # fmt: skip
    rows: list[dict] = []
    Simulation(spec, requests=reqs, on_row=rows.append).run()
    return rows


@register_queue_policy("test-records-slo")
@dataclass(frozen=True)
class RecordsSlo:
    def key(self, item: Queued) -> int:
        SEEN_SLO.append((item.req.traffic_class, item.slo.ttft_s, item.slo.tpot_s))
        return 0


SEEN_SLO: list[tuple[str, float, float]] = []


def test_a_queue_policy_reads_each_requests_class_objectives():
    reqs = [Request(i, 0.001 * i, 50, 2, traffic_class=c)
            for i, c in enumerate(["batch", "interactive", "batch"])]  # fmt: skip
    SEEN_SLO.clear()
    _class_run("test-records-slo", SLO_CLASSES, reqs)
    # interactive leaves tpot to the spec's slo (50 ms); batch gives both
    assert set(SEEN_SLO) == {("batch", 60.0, 0.2), ("interactive", 0.5, 0.05)}
    SEEN_SLO.clear()
    _class_run("test-records-slo", None, [replace(r, traffic_class="") for r in reqs])
    assert set(SEEN_SLO) == {("", 1.0, 0.05)}  # without classes: the spec's slo


def test_earliest_deadline_first_from_the_guide_serves_the_tight_class_first():
    scope: dict = {"__name__": "readme"}  # as tests/test_public.py runs the pages' Python
    code = compile(_readme_example(1), "docs/guides/policies.md", "exec", dont_inherit=True)
    exec(code, scope)
    # one sequence at a time: request 0 runs, then the queue's order decides
    classes = ["batch", "batch", "interactive", "batch"]
    reqs = [Request(i, 0.001 * i, 300, 2, traffic_class=c) for i, c in enumerate(classes)]

    def order(policy: str) -> list[int]:
        rows = _class_run(policy, SLO_CLASSES, reqs)
        return [r["id"] for r in sorted(rows, key=lambda r: r["first_token_s"])]

    assert order("fcfs") == [0, 1, 2, 3]
    assert order("earliest-deadline-first") == [0, 2, 1, 3]


def test_the_public_face_offers_the_queue_policy_api():
    assert twin.register_queue_policy is register_queue_policy
    assert {"Queued", "QueuePolicy", "PicksVictim", "register_queue_policy"} <= set(twin.__all__)


def test_entry_points_bring_queue_policies_and_a_broken_one_is_one_error(monkeypatch):
    from test_scheduler import FakeEntryPoint

    import twin.scheduler as sched
    import twin.serving.queuepolicy as qp
    from twin.errors import PluginError

    @dataclass(frozen=True)
    class Longest:
        def key(self, item) -> int:
            return -item.prefill_len

    groups: dict[str, list] = {"twin.queue_policies": [FakeEntryPoint("longest", Longest)]}
    monkeypatch.setattr(qp, "_registry", dict(qp._registry))
    monkeypatch.setattr(qp, "_entry_points_loaded", False)
    monkeypatch.setattr(sched, "entry_points", lambda group: groups.get(group, []))
    assert isinstance(build_queue_policy("longest"), Longest)
    assert "longest" in queue_policy_names()
    monkeypatch.setattr(qp, "_entry_points_loaded", False)
    groups["twin.queue_policies"] = [FakeEntryPoint("oops", ImportError("no module 'x'"))]
    with pytest.raises(PluginError, match=r"queue policy entry point 'oops' .* ImportError"):
        build_queue_policy("anything-unknown")
