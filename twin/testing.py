"""Helpers for testing scheduling policies, built-in or your own.

Build a :class:`~twin.scheduler.ClusterView` by hand in a line or two and call
a policy's hooks on it, with no simulation running::

    from twin.testing import instance, make_view
    view = make_view(instance(0, role="prefill", queue_tokens=4000),
                     instance(1, role="prefill"), instance(2, role="decode"))
    assert MyPolicy().route(req, view).prefill == 1

and hold any policy to the promises every scheduler makes, the way
Gymnasium's ``check_env`` serves environment authors::

    from twin.testing import check_scheduler
    check_scheduler(MyPolicy)            # a class, a zero-argument factory or a name

``check_scheduler`` runs the policy on small bursty workloads, on a colocated
cluster and on a split one with a topology (with ``fabric=True`` also on a
split one whose hand-offs contend for a slow fabric; with ``models=True`` on
clusters of two models, each model's instances served by a policy of its
own), skipping only a cluster
that its setup refuses (with a ``SpecError``), and fails with an
``AssertionError`` that says which promise broke on which cluster.

A policy that reads the fabric (``view.handoff_estimate``) is unit-tested
with hand-built estimates: ``make_view(..., fabric={(0, 2): HandoffEstimate(0,
2, transfer_s=0.5)})``.

A hand-built view carries a seeded generator, ``view.rng`` (``make_view(...,
seed=1)`` picks another), as a simulation hands each policy its own stream.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import CodeType
from typing import Any

import numpy as np

from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import (
    ClusterView,
    FabricSnapshot,
    FabricView,
    HandoffEstimate,
    InstanceSnapshot,
    Role,
    Scheduler,
    get_scheduler,
)

__all__ = ["check_scheduler", "instance", "make_view", "scenario_requests"]


def instance(id: int, role: Role = "mixed", **fields: Any) -> InstanceSnapshot:
    """One hand-built instance; any :class:`InstanceSnapshot` field may be given."""
    return InstanceSnapshot(id, role=role, **fields)


def make_view(
    *instances: InstanceSnapshot,
    now: float = 0.0,
    seed: int = 0,
    fabric: FabricView | Mapping[tuple[int, int], HandoffEstimate] | None = None,
) -> ClusterView:
    """A cluster view of the given instances at time ``now``, its ``rng``
    seeded with ``seed``; ids must be 0..n-1. ``fabric``: a
    :class:`~twin.scheduler.FabricView`, or the hand-off estimate of each
    (prefill, decode) pair (a :class:`~twin.scheduler.FabricSnapshot`)."""
    ids = [i.id for i in instances]
    if ids != list(range(len(instances))):
        raise ValueError(f"instance ids must be 0..{len(instances) - 1} in order, not {ids}")
    if isinstance(fabric, Mapping):
        fabric = FabricSnapshot(fabric)
    return ClusterView(instances, now, rng=np.random.default_rng(seed), fabric=fabric)


# The two classes of traffic of the contract's runs with classes (check_scheduler(classes=...)).
CLASSES: list[dict[str, Any]] = [
    {"name": "interactive", "share": 0.6, "priority": 0, "slo": {"ttft": "1 s", "tpot": "50 ms"}},
    {"name": "batch", "share": 0.4, "priority": 1, "slo": {"ttft": "30 s", "tpot": "200 ms"}},
]


def scenario_requests(
    seed: int, n: int = 60, classes: bool = False, models: tuple[str, ...] = ()
) -> list[Request]:
    """A small, bursty, seeded request stream with short and long prompts,
    one-token outputs and simultaneous arrivals: the cases policies get wrong.
    ``classes``: each request of one of :data:`CLASSES`, drawn by share (after
    everything else, so the stream is otherwise the same); ``models``: each
    request names one of them, drawn evenly (after that)."""
    rng = np.random.default_rng(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += float(rng.choice([0.0, 0.0, 0.01, 0.2, 1.0]))
        prompt = int(rng.choice([1, 16, 300, 2000, 9000]))
        output = int(rng.choice([1, 2, 40, 300]))
        hashes = tuple(int(h) for h in rng.integers(0, 8, size=-(-prompt // 512)))
        out.append(Request(i, t, prompt, output, hashes, 512))
    if classes:
        draws = np.random.default_rng([seed, 1]).random(n)
        out = [
            replace(r, priority=c["priority"], traffic_class=c["name"])
            for r, u in zip(out, draws, strict=True)
            for c in [CLASSES[0] if u < CLASSES[0]["share"] else CLASSES[1]]
        ]
    if models:
        picks = np.random.default_rng([seed, 2]).integers(0, len(models), n)
        out = [replace(r, model=models[k]) for r, k in zip(out, picks, strict=True)]
    return out


# The fault timeline of the contract's optional run (check_scheduler(faults=True)):
# an instance fails and comes back, then a whole node.
FAULTS = [
    {"at": "2 s", "action": "fail", "instance": 0},
    {"at": "5 s", "action": "recover", "instance": 0},
    {"at": "8 s", "action": "fail", "node": 1},
    {"at": "10 s", "action": "recover", "node": 1},
]


# The contract's loaded fabric (check_scheduler(fabric=True)): one 25 Gb/s TCP
# NIC a node, so the hand-offs between the two nodes contend for it.
LOADED_FABRIC = "a100-eth25"

# The two models of the contract's clusters of several (check_scheduler(models=True)):
# each one's instances, colocated or split, and a stricter TTFT for the first.
MODELS: dict[str, dict[str, Any]] = {
    "chat": {"model": "llama-3.1-8b", "share": 0.6, "slo": {"ttft": "1 s"}},
    "code": {"model": "qwen2.5-7b", "share": 0.4},
}


def _spec(
    split: bool, faults: bool = False, fabric: bool = False, classes: bool = False,
    queue_policy: str | Mapping[str, Any] | None = None, models: bool = False,
) -> Any:  # fmt: skip
    from twin.sim.spec import resolve_spec

    topology = LOADED_FABRIC if fabric else "dgx-h100-ib400"
    cluster: dict[str, Any] = {"topology": topology, "nodes": 2, "tp": 4}
    if split:
        cluster.update(prefill=2, decode=2)
    else:
        cluster.update(instances=3)
    data: dict[str, Any] = {
        "name": "contract",
        "model": "llama-3.1-8b",
        "cluster": cluster,
        "engine": {"max_num_seqs": 8},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 1},
        "slo": {"ttft": "2 s", "tpot": "100 ms"},
    }  # fmt: skip
    if faults:
        data["events"] = FAULTS
    if classes:
        data["workload"]["classes"] = CLASSES
    if queue_policy is not None:
        data["engine"]["queue_policy"] = queue_policy
    if models:  # the same nodes, each model on half of them
        own = {"tp": 2, "prefill": 2, "decode": 2} if split else {"tp": 4, "instances": 2}
        data["cluster"] = {"topology": topology, "nodes": 2}
        data["models"] = {name: {**m, "cluster": own} for name, m in MODELS.items()}
        del data["model"]
    return resolve_spec(data, "contract", Path.cwd())


def _factory(policy: Any, params: dict[str, Any] | None) -> Callable[[], Any]:
    if isinstance(policy, str):
        cls = get_scheduler(policy)
        return lambda: cls(**(params or {}))
    if callable(policy):
        return lambda: policy(**(params or {}))
    raise TypeError(f"policy {policy!r}: expected a class, a factory or a registered name")


class _Refused(Exception):
    """The policy's setup refused the cluster (a SpecError raised inside it)."""


def _raised_in(error: BaseException, code: CodeType | None) -> bool:
    """Whether ``error`` was raised inside a call of the function whose code is
    ``code`` (directly, or by a helper it called)."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


def _setup_code(policy: Any) -> CodeType | None:
    fn = getattr(type(policy), "setup", None) or getattr(policy, "setup", None)
    fn = getattr(fn, "__func__", fn)
    return getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None


def _run(
    make: Callable[[], Any], split: bool, seed: int, faults: bool = False, fabric: bool = False,
    classes: bool = False, queue_policy: str | Mapping[str, Any] | None = None,
    models: bool = False,
) -> tuple[str, list[dict[str, Any]]]:  # fmt: skip
    from twin.sim.fleet import spec_policy
    from twin.sim.simulation import Simulation

    reqs = scenario_requests(seed, classes=classes, models=tuple(MODELS) if models else ())
    rows: list[dict[str, Any]] = []
    policy = make()
    try:
        spec = _spec(split, faults, fabric, classes, queue_policy, models)
        run_policy = spec_policy(spec, make) if models else policy
        sim = Simulation(spec, requests=reqs, on_row=rows.append, scheduler=run_policy)
    except SpecError as refusal:
        code = _setup_code(policy)  # None: a setup without Python code; trust the error
        if code is None or _raised_in(refusal, code):
            raise _Refused(str(refusal)) from refusal
        raise
    result = sim.run()  # the simulation itself checks routes, roles and block accounting
    ids = sorted(r["id"] for r in rows)
    assert ids == [r.id for r in reqs], (
        f"every request must end exactly once; ended ids differ from 0..{len(reqs) - 1}"
    )
    for r in rows:
        if r["status"] in ("rejected", "failed"):
            assert isinstance(r["reason"], str) and r["reason"], (
                f"request {r['id']} was {r['status']} without a reason"
            )
        else:
            assert r["arrival_s"] <= r["first_token_s"] <= r["finish_s"], (
                f"request {r['id']}: timestamps out of order"
            )
    s = result.summary
    assert s["completed"] + s["rejected"] + s.get("failed", 0) == len(reqs)
    if classes:
        _check_parts(result.to_dict()["summary"]["classes"], rows, "class", len(reqs))
    if models:
        _check_models(sim.view, rows)
        _check_parts(result.to_dict()["summary"]["models"], rows, "model", len(reqs))
    for e in sim.engines:
        assert e.kv.free == e.kv.total, f"instance {e.id} ended with KV blocks held"
    if sim.network is not None:
        ratio = sim.network.max_link_load_ratio
        assert ratio <= 1.0 + 1e-9, f"a link carried {ratio:.6f} x its capacity"
    return json.dumps(result.to_dict(), sort_keys=True, default=str), rows


def _check_parts(per: dict[str, Any], rows: list[dict[str, Any]], column: str, n: int) -> None:
    """Each class's (model's: ``column``) summary counts its own requests
    and their attainment against its SLO; together, all ``n``."""
    for name, c in per.items():
        mine = [r for r in rows if r[column] == name]
        assert c["requests"] == len(mine), f"{column} {name}: its requests are not its rows"
        met = sum(r["slo_met"] for r in mine)
        assert c["slo_attainment"] == (met / len(mine) if mine else None), (
            f"{column} {name}: attainment is not its rows' share that met its SLO"
        )
    assert sum(c["requests"] for c in per.values()) == n


def _check_models(view: ClusterView, rows: list[dict[str, Any]]) -> None:
    """Each request ran on its model's instances only."""
    from twin.sim.fleet import model_of

    of = [model_of(i) for i in view.instances]
    for r in rows:
        for key in ("instance", "prefill_instance", "decode_instance"):
            i = r[key]
            assert i is None or i < 0 or of[i] == r["model"], (
                f"request {r['id']} of model {r['model']!r} ran on instance {i} of {of[i]!r}"
            )


def _queue_policy(
    value: str | Mapping[str, Any] | None, params: Mapping[str, Any] | None
) -> str | dict[str, Any] | None:
    """``engine.queue_policy`` from check_scheduler's arguments, checked (a
    bad one is the caller's error, not the scheduler's)."""
    from twin.serving.queuepolicy import parse_choice

    where = "check_scheduler(queue_policy=...)"
    if params is not None:
        if not isinstance(value, str):
            raise SpecError(
                f"check_scheduler(queue_policy_params=...): {dict(params)!r} goes with a "
                f"queue policy name, not {value!r}"
            )
        value = {"name": value, **params}
    if value is None:
        return None
    spec_form = value if isinstance(value, str) else dict(value)
    parse_choice(spec_form, where)
    return spec_form


def _kind(split: bool) -> str:
    return "split" if split else "colocated"


def _attempt(
    make: Callable[[], Any], split: bool, seed: int, *, may_refuse: bool, faults: bool = False,
    fabric: bool = False, **kw: Any,
) -> tuple[str, list[dict[str, Any]]]:  # fmt: skip
    """One contract run; a failure becomes an ``AssertionError`` naming the
    cluster, except a refusal at setup when ``may_refuse``."""
    try:
        return _run(make, split, seed, faults, fabric, **kw)
    except _Refused as e:
        if may_refuse:
            raise
        raise AssertionError(
            f"on the {_kind(split)} cluster, setup refused the cluster it had accepted "
            f"(seed {seed}): {e}"
        ) from e
    except AssertionError as failed:
        raise AssertionError(f"on the {_kind(split)} cluster: {failed}") from failed
    except Exception as error:  # the simulation's checks, or the policy's own failure
        raise AssertionError(
            f"on the {_kind(split)} cluster: {type(error).__name__}: {error}"
        ) from error


def _twice(make: Callable[[], Any], split: bool, seed: int, what: str, **kw: Any) -> None:
    """Two runs of the same inputs (``kw``: faults, a loaded fabric) give one result."""
    a = _attempt(make, split, seed, may_refuse=False, **kw)
    b = _attempt(make, split, seed, may_refuse=False, **kw)
    assert a == b, f"on the {_kind(split)} cluster{what}, two runs differ"


def check_scheduler(
    policy: Any,
    params: dict[str, Any] | None = None,
    seeds: tuple[int, ...] = (0, 1),
    *,
    faults: bool = False,
    fabric: bool = False,
    classes: bool = False,
    queue_policy: str | Mapping[str, Any] | None = None,
    queue_policy_params: Mapping[str, Any] | None = None,
    models: bool = False,
) -> str:
    """Run the scheduler contract on ``policy`` (a class, a factory or a
    registered name) on a colocated and on a split cluster. Returns where it
    ran: ``"colocated"``, ``"split"`` or ``"both"``; raises ``AssertionError``
    naming the broken promise and the cluster it broke on.

    A policy may refuse a cluster it is not made for, and only at setup, with
    a :class:`~twin.errors.SpecError` (:func:`~twin.scheduler.require_split`
    raises one); it must accept at least one of the two. On every cluster it
    accepts, the promises are: the policy has the required hooks (a
    :class:`Scheduler`) and the optional ones its routes need (a route that
    leaves the decode instance open on a split cluster needs ``pick_decode``);
    every decision names existing instances whose roles fit; every request
    ends exactly once, completed or rejected with a reason; no KV block leaks;
    and two runs of the same inputs give identical results. Any other failure,
    a ``SpecError`` raised after setup included, breaks the contract.

    ``faults``: also run each accepted cluster through :data:`FAULTS` (an
    instance, then a node, fails and recovers): the policy must route only to
    instances that are up (``InstanceView.up``; ``ClusterView.of_role`` and
    ``up()`` list only those), and every request still ends exactly once,
    completed, rejected or failed with a reason.

    ``fabric``: also run the split cluster on :data:`LOADED_FABRIC`, where the
    hand-offs between the nodes contend for one slow NIC a node (what a
    policy reading ``ClusterView.handoff_estimate`` sees change under load):
    the same promises, and no link ever carries more than its capacity.

    ``classes``: the requests are of two classes of traffic (:data:`CLASSES`,
    with their own SLOs and priorities); each class's summary must count its
    own requests and their attainment against its SLO. ``queue_policy``: the
    instances' queue policy (``engine.queue_policy``; default FCFS), as a spec
    gives it: a registered name, or ``{"name": ..., <param>: <value>}``; or a
    name with ``queue_policy_params`` (``{<param>: <value>}``). An unknown
    name, or a parameter the policy does not take, raises a
    :class:`~twin.errors.TwinError` before anything runs.

    ``models``: two models (:data:`MODELS`) share the nodes, a policy each: decisions
    name its model's instances, each model's summary its requests and attainment."""
    qp = _queue_policy(queue_policy, queue_policy_params)
    kw: dict[str, Any] = {"classes": classes, "queue_policy": qp, "models": models}
    make = _factory(policy, params)
    probe = make()
    missing = [h for h in ("setup", "route") if not callable(getattr(probe, h, None))]
    assert isinstance(probe, Scheduler) and not missing, (
        f"{type(probe).__name__} has no {' or '.join(missing)}(); a scheduler needs setup and route"
    )
    accepted: list[bool] = []
    refusals: list[str] = []
    for split in (False, True):
        try:
            first = _attempt(make, split, seeds[0], may_refuse=True, **kw)
        except _Refused as e:
            refusals.append(f"{_kind(split)}: {e}")
            continue
        accepted.append(split)
        for seed in seeds:
            if seed != seeds[0]:
                first = _attempt(make, split, seed, may_refuse=False, **kw)
            second = _attempt(make, split, seed, may_refuse=False, **kw)
            assert first == second, (
                f"on the {_kind(split)} cluster, two runs with seed {seed} gave different results"
            )
        if faults:
            _twice(make, split, seeds[0], " with faults", faults=True, **kw)
        if fabric and split:
            _twice(make, split, seeds[0], " with a loaded fabric", fabric=True, **kw)
    assert accepted, f"the policy's setup refused both clusters: {'; '.join(refusals)}"
    return _kind(accepted[0]) if len(accepted) == 1 else "both"
