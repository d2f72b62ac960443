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
cluster and, when its setup refuses one, on a split cluster with a topology,
and fails with an ``AssertionError`` that says which promise broke.

A hand-built view carries a seeded generator, ``view.rng`` (``make_view(...,
seed=1)`` picks another), as a simulation hands each policy its own stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from twin.errors import TwinError
from twin.request import Request
from twin.scheduler import ClusterView, InstanceSnapshot, Role, Scheduler, get_scheduler

__all__ = ["check_scheduler", "instance", "make_view", "scenario_requests"]


def instance(id: int, role: Role = "mixed", **fields: Any) -> InstanceSnapshot:
    """One hand-built instance; any :class:`InstanceSnapshot` field may be given."""
    return InstanceSnapshot(id, role=role, **fields)


def make_view(*instances: InstanceSnapshot, now: float = 0.0, seed: int = 0) -> ClusterView:
    """A cluster view of the given instances at time ``now``, its ``rng``
    seeded with ``seed``; ids must be 0..n-1."""
    ids = [i.id for i in instances]
    if ids != list(range(len(instances))):
        raise ValueError(f"instance ids must be 0..{len(instances) - 1} in order, not {ids}")
    return ClusterView(instances, now, rng=np.random.default_rng(seed))


def scenario_requests(seed: int, n: int = 60) -> list[Request]:
    """A small, bursty, seeded request stream with short and long prompts,
    one-token outputs and simultaneous arrivals: the cases policies get wrong."""
    rng = np.random.default_rng(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += float(rng.choice([0.0, 0.0, 0.01, 0.2, 1.0]))
        prompt = int(rng.choice([1, 16, 300, 2000, 9000]))
        output = int(rng.choice([1, 2, 40, 300]))
        hashes = tuple(int(h) for h in rng.integers(0, 8, size=-(-prompt // 512)))
        out.append(Request(i, t, prompt, output, hashes, 512))
    return out


def _spec(split: bool) -> Any:
    from twin.sim.spec import resolve_spec

    cluster: dict[str, Any] = {"topology": "dgx-h100-ib400", "nodes": 2, "tp": 4}
    if split:
        cluster.update(prefill=2, decode=2)
    else:
        cluster.update(instances=3)
    data = {
        "name": "contract",
        "model": "llama-3.1-8b",
        "cluster": cluster,
        "engine": {"max_num_seqs": 8},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 1},
        "slo": {"ttft": "2 s", "tpot": "100 ms"},
    }  # fmt: skip
    return resolve_spec(data, "contract", Path.cwd())


def _factory(policy: Any, params: dict[str, Any] | None) -> Callable[[], Any]:
    if isinstance(policy, str):
        cls = get_scheduler(policy)
        return lambda: cls(**(params or {}))
    if callable(policy):
        return lambda: policy(**(params or {}))
    raise TypeError(f"policy {policy!r}: expected a class, a factory or a registered name")


def _run(make: Callable[[], Any], split: bool, seed: int) -> tuple[str, list[dict[str, Any]]]:
    from twin.sim.simulation import Simulation

    reqs = scenario_requests(seed)
    rows: list[dict[str, Any]] = []
    sim = Simulation(_spec(split), requests=reqs, on_row=rows.append, scheduler=make())
    result = sim.run()  # the simulation itself checks routes, roles and block accounting
    ids = sorted(r["id"] for r in rows)
    assert ids == [r.id for r in reqs], (
        f"every request must end exactly once; ended ids differ from 0..{len(reqs) - 1}"
    )
    for r in rows:
        if r["status"] == "rejected":
            assert isinstance(r["reason"], str) and r["reason"], (
                f"request {r['id']} was rejected without a reason"
            )
        else:
            assert r["arrival_s"] <= r["first_token_s"] <= r["finish_s"], (
                f"request {r['id']}: timestamps out of order"
            )
    s = result.summary
    assert s["completed"] + s["rejected"] == len(reqs)
    for e in sim.engines:
        assert e.kv.free == e.kv.total, f"instance {e.id} ended with KV blocks held"
    return json.dumps(result.to_dict(), sort_keys=True, default=str), rows


def check_scheduler(
    policy: Any, params: dict[str, Any] | None = None, seeds: tuple[int, ...] = (0, 1)
) -> str:
    """Run the scheduler contract on ``policy`` (a class, a factory or a
    registered name). Returns the cluster kind it ran on, ``"colocated"`` or
    ``"split"``; raises ``AssertionError`` naming the broken promise.

    The promises: the policy has the required hooks (a :class:`Scheduler`);
    setup accepts the cluster (a colocated one, or else a split
    one); every decision names existing instances whose roles fit; every
    request ends exactly once, completed or rejected with a reason; no KV block
    leaks; and two runs of the same inputs give identical results.
    """
    make = _factory(policy, params)
    probe = make()
    missing = [h for h in ("setup", "route") if not callable(getattr(probe, h, None))]
    assert isinstance(probe, Scheduler) and not missing, (
        f"{type(probe).__name__} has no {' or '.join(missing)}(); a scheduler needs setup and route"
    )
    split = False
    try:
        _run(make, False, seeds[0])
    except TwinError as colocated_error:
        split = True
        try:
            _run(make, True, seeds[0])
        except TwinError as e:
            raise AssertionError(
                f"the policy ran on neither cluster: colocated: {colocated_error}; split: {e}"
            ) from e
    for seed in seeds:
        first = _run(make, split, seed)
        second = _run(make, split, seed)
        assert first == second, f"two runs with seed {seed} gave different results"
    return "split" if split else "colocated"
