"""A pure build: one function makes the cluster complete from a resolved
spec, each part given its collaborators as it is made; failures and scaling
act on it through a narrow protocol (twin.sim.ops), not the Simulation."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import simpy

import schedulers.disagg  # noqa: F401 - registers the built-ins when not installed
import twin
from twin.scheduler import build_scheduler
from twin.serving.cluster import Placement
from twin.serving.observer import broadcast
from twin.serving.sequence import Sequence
from twin.sim.build import build_cluster
from twin.sim.spec import load_spec

SIM = Path(twin.__file__).parent / "sim"

# Records a run's modules update as it goes (a request's attempt, a timeline
# window, a sleeping tick's watch, the run's own counters): not parts of the
# cluster.
RECORDS = {"s", "seq", "old", "w", "win"}
OWN_COUNTERS = {"metrics"}


def _spec():
    sets = [
        "engine.prefix_caching=true", "kv_tiers.dram=1 TB", "cluster.kv_pool=64 GiB",
        "cluster.nodes=5", "workload.max_requests=5",
    ]  # fmt: skip
    return load_spec("disagg", sets)


def test_build_cluster_gives_every_part_its_collaborators_as_it_is_made():
    spec = _spec()
    env = simpy.Environment()
    lost: list[tuple[Sequence, int]] = []
    stranded = []
    waiting = []
    scheduler = build_scheduler(spec.scheduler, spec.scheduler_params)
    c = build_cluster(
        spec, env, broadcast([]), scheduler, np.random.default_rng(0),
        on_lost=lambda seq, i: lost.append((seq, i)),
        on_stranded=lambda e, seq: stranded.append((e, seq)),
        on_waiting=waiting.append,
    )  # fmt: skip
    n = len(spec.placements)
    assert [e.id for e in c.engines] == list(range(n)) == [v.id for v in c.view.instances]
    assert c.placements == list(spec.placements)
    assert c.network is not None and c.network.reroute is not None
    assert c.handoff is not None and c.handoff.engines is c.engines
    assert len(c.handoff.gpus) == len(c.handoff.pending) == n
    assert c.handoff.on_stranded is not None and c.handoff.on_waiting is not None
    assert c.pools is not None and c.tiers is not None
    for e in c.engines:
        assert e.hooks is c.handoff and e.cache is not None
        assert e.cache.tiers is not None and c.tiers.chains[e.id] is e.cache.tiers
        assert e.up and e.state == "serving"
    c.handoff.on_stranded(c.engines[0], "s")
    c.handoff.on_waiting("w")
    for e in c.engines:  # a sequence handed to an instance that is down goes to on_lost
        assert e.on_lost is not None
        e.on_lost(f"seq{e.id}")  # type: ignore[arg-type]
    assert lost == [(f"seq{i}", i) for i in range(n)]
    assert stranded == [(c.engines[0], "s")] and waiting == ["w"]
    free = Placement(n, 4, tuple(range(32, 40)))  # the fifth node's GPUs
    added = c.add_instance(free, "decode", 8, 1, starting=True)
    assert added.id == n and not added.up and added.state == "starting"
    assert c.view[n].id == n and len(c.handoff.pending) == n + 1
    added.started()
    assert added.up and added.state == "serving"


def _modules() -> list[tuple[str, ast.Module]]:
    return [(p.name, ast.parse(p.read_text(), str(p))) for p in sorted(SIM.glob("*.py"))]


def _root(node: ast.expr) -> tuple[str | None, int]:
    """The name an attribute chain starts from, and the chain's length."""
    depth = 0
    while isinstance(node, ast.Attribute | ast.Subscript):
        depth += isinstance(node, ast.Attribute)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), depth


def _set_elsewhere(target: ast.expr) -> bool:
    """Whether ``target`` sets an attribute of another object than ``self``
    (or a record): ``eng.on_lost = ...``, ``self.handoff.on_stranded = ...``."""
    if not isinstance(target, ast.Attribute):
        return False
    root, depth = _root(target)
    if root == "self":
        inner = target.value
        return depth > 1 and not (
            isinstance(inner, ast.Attribute) and inner.attr in OWN_COUNTERS and depth == 2
        )
    return root not in RECORDS


def test_nothing_in_twin_sim_sets_an_attribute_of_a_part_after_it_is_made():
    found = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            found += [
                f"{name}:{node.lineno}: {ast.unparse(t)}" for t in targets if _set_elsewhere(t)
            ]
    assert not found, "\n".join(found)


def test_faults_scaling_and_time_outs_act_through_the_protocol_only():
    for name, tree in _modules():
        if name not in ("faults.py", "scaling.py", "timeouts.py"):
            continue
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert "twin.sim.simulation" not in imported, name
        assert "twin.sim.ops" in imported, name
        private = [
            f"{name}:{n.lineno}: {ast.unparse(n)}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and n.attr.startswith("_")
            and not n.attr.startswith("__")
            and _root(n) != ("self", 1)
        ]
        assert not private, "\n".join(private)


def test_the_checks_see_what_they_look_for():
    bad = ast.parse("eng.on_lost = f\nself.handoff.on_stranded = g\nself.x = 1\ns.state = 2")
    targets = [n.targets[0] for n in ast.walk(bad) if isinstance(n, ast.Assign)]
    assert [_set_elsewhere(t) for t in targets] == [True, True, False, False]
    reach = ast.parse("sim._parked").body[0]
    assert isinstance(reach, ast.Expr) and _root(reach.value) == ("sim", 1)
