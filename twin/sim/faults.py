"""Failures and degradation: the spec's ``events:`` timeline and ``retry:`` policy.

Each entry of ``events:`` happens at its time ``at`` to one target, named by
the ids ``twin topo`` and the results use: ``instance``, ``node`` (every
instance on it), ``gpu`` (the instance holding it) or ``link`` (``"src ->
dst"``, a directed link of the topology by its vertex names):

- ``fail`` / ``recover`` an instance, a node or a GPU. A failed instance loses
  everything it holds (queued and running requests, the KV it computed and the
  blocks it reserved for KV on its way); it comes back empty.
- ``degrade`` (with a ``factor`` in (0, 1]) / ``restore`` a GPU, an instance or
  a node (each iteration of an instance on it takes 1/factor as long, from its
  next iteration; an instance runs at its slowest GPU), or a link (it carries
  factor x its capacity; the flows on it are re-shared at once).

Events that overlap compose (:mod:`twin.sim.health`): each changes only its
target's own state, and an instance is up only when it, its GPUs and their
nodes are, a link only when it and the NICs at its ends are; a speed or
bandwidth is the product of the degradations in force on them. A repair of
one part never heals another (recovering a NIC leaves a link that failed on
its own down; restoring a node leaves its GPU's own degradation in force;
recovering an instance on a node still down leaves it down), and an instance
added while the run goes (scaling) takes on the state of the parts it runs on.

A request whose attempt is lost is retried per ``retry:``: after
``backoff x backoff_factor^(attempt - 1)`` it goes back to the scheduler, which
routes it again, and its prompt and the tokens it had produced are prefilled
again (the lost work is recomputed); or it ends ``failed``, with the reason
``max_attempts`` (its attempts are used up) or ``retry_deadline`` (the retry
would start later than ``deadline`` after its arrival). While no instance that
prefills or none that decodes is up, requests wait for a recovery (up to the
deadline); those still waiting when nothing else can happen end ``failed``
with ``no_instance_up``. A hand-off waiting on a failed link with no other
path waits at most until the retry deadline, then is given up the same way
(``link_down`` when it cannot be retried). A hand-off whose decode instance
fails while the KV is still on the prefill side goes to another decode
instance instead (nothing is lost).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from twin._clock import at
from twin._declare import (
    NONNEG_INT,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    TEXT,
    anything,
    choice,
    declared,
    interval,
    read,
    schema,
    seconds,
)
from twin.errors import SpecError
from twin.scheduler import FaultEvent
from twin.sim.health import Health, Part

if TYPE_CHECKING:
    import numpy as np

    from twin.sim.ops import ClusterOps

ACTIONS = ("fail", "recover", "degrade", "restore")
TARGETS = ("instance", "node", "gpu", "link", "nic")
COMPONENTS = ("instance", "node", "gpu", "nic", "link")
REPAIR_DISTS = ("exponential", "fixed")
# The spawn key of the random failures' streams: distinct from the workload's
# and the scheduler's (children 0 and 1 of the spec seed), so that drawing
# failures, or changing their seed, never moves an arrival or a length.
FAILURES_KEY = 0xFA11


def label(action: str, target: str, name: int | str, factor: float | None = None) -> str:
    """An event in words: ``fail node 0``, ``degrade link n0.nic0 -> switch x0.25``."""
    x = f" x{factor:g}" if action == "degrade" and factor else ""
    return f"{action} {target} {name}{x}"


@dataclass(frozen=True)
class EventKeys:
    """One entry of ``events:``: at a time, an action on one target (give
    exactly one of instance, node, gpu, link)."""

    at_s: float = declared(
        None, seconds(positive=False), "when it happens (simulated time)", key="at",
        required="give the time of the event (e.g. at: 30 s)",
    )  # fmt: skip
    action: str = declared(
        None, choice(*ACTIONS), "fail | recover | degrade | restore",
        required="give one of fail, recover, degrade, restore",
    )  # fmt: skip
    instance: int | None = declared(None, NONNEG_INT, "target: an instance id", nullable=True)
    node: int | None = declared(
        None, NONNEG_INT, "target: a node (all its instances, or its GPUs)", nullable=True
    )
    gpu: int | None = declared(
        None, NONNEG_INT, "target: a GPU (global index; fails its instance)", nullable=True
    )
    link: str | None = declared(
        None, TEXT, "target: a directed topology link 'src -> dst' (degrade/restore)",
        nullable=True,
    )  # fmt: skip
    nic: str | None = declared(
        None, TEXT, "target: a NIC by its vertex name (every link to and from it)",
        nullable=True,
    )  # fmt: skip
    factor: float | None = declared(
        None, interval(0, 1, lo_open=True),
        "degrade: the share of speed or bandwidth left, in (0, 1]", nullable=True,
    )  # fmt: skip


@dataclass(frozen=True)
class RetryPolicy:
    """What becomes of a request whose instance fails under it (``retry:``)."""

    max_attempts: int = declared(
        3, POSITIVE_INT, "attempts in all, the first included (1: never retry)"
    )
    backoff_s: float = declared(
        "0 s", seconds(positive=False), "wait before the first retry", key="backoff"
    )
    backoff_factor: float = declared(
        2.0, POSITIVE_NUMBER, "each further retry waits this times longer"
    )
    deadline_s: float = declared(
        None, seconds(), "no retry starts later than this after the request's arrival "
        "(null: none)", key="deadline", unset=math.inf, nullable=True,
    )  # fmt: skip

    def delay_s(self, attempt: int) -> float:
        """The wait before the attempt after ``attempt`` (1-based)."""
        return self.backoff_s * self.backoff_factor ** (attempt - 1)


@dataclass(frozen=True)
class RandomKeys:
    """One class of random failures (an entry of ``failures.random``): every
    component of the class fails after an exponential time of mean ``mtbf``
    from its start or last repair, and is repaired ``repair`` later (its mean,
    with ``repair_dist: exponential``)."""

    component: str = declared(
        None, choice(*COMPONENTS),
        "instance | node | gpu | nic | link: each of them fails on its own (a link both ways)",
        required="give instance, node, gpu, nic or link",
    )  # fmt: skip
    mtbf_s: float = declared(
        None, seconds(), "mean time between failures of one component", key="mtbf",
        required="give the mean time between failures (e.g. mtbf: 10 min)",
    )  # fmt: skip
    repair_s: float = declared(
        None, seconds(), "time to repair (the mean, when exponential)", key="repair",
        required="give the time to repair (e.g. repair: 30 s)",
    )  # fmt: skip
    repair_dist: str = declared(
        "exponential", choice(*REPAIR_DISTS), "exponential | fixed repair times"
    )


@dataclass(frozen=True)
class FailureKeys:
    """Random failures (``failures:``), drawn from a stream of their own."""

    seed: int | None = declared(
        None, NONNEG_INT, "the failures' seed (null: the spec's seed)", nullable=True
    )
    random: Any = declared(
        None, anything(lambda: {"type": "array", "items": schema(RandomKeys)}),
        "classes of components that fail at random", nullable=True,
    )  # fmt: skip


def read_failures(value: Any, where: str) -> tuple[int | None, tuple[RandomKeys, ...], dict]:
    """``failures:`` checked: its seed, its classes and its resolved form."""
    r = read(FailureKeys, value, where)
    items = r.value.random or []
    if not isinstance(items, list):
        raise SpecError(f"{where}.random: {items!r} must be a list")
    classes = []
    written = []
    for i, item in enumerate(items):
        c = read(RandomKeys, item, f"{where}.random[{i}]")
        classes.append(c.value)
        written.append(c.written)
    return r.value.seed, tuple(classes), {"seed": r.value.seed, "random": written}


@dataclass(frozen=True, slots=True)
class Event:
    """A checked ``events:`` entry: its index in the list (for messages)."""

    index: int
    at_s: float
    action: str
    target: str
    name: int | str
    factor: float


def read_events(value: Any, where: str) -> tuple[tuple[Event, ...], list[dict[str, Any]]]:
    """``events:`` checked: the entries, and their resolved form."""
    if value is None:
        return (), []
    if not isinstance(value, list):
        raise SpecError(f"{where}: {value!r} must be a list of events")
    out: list[Event] = []
    written: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        at_ = f"{where}[{i}]"
        r = read(EventKeys, item, at_)
        e = r.value
        targets = [t for t in TARGETS if t in r.given]
        if len(targets) != 1:
            raise SpecError(
                f"{at_}: give exactly one target of {', '.join(TARGETS)}; got "
                f"{', '.join(targets) if targets else 'none'}"
            )
        target = targets[0]
        name: int | str = getattr(e, target)
        if target == "link":
            src, sep, dst = str(name).partition("->")
            if not sep or not src.strip() or not dst.strip():
                raise SpecError(f"{at_}.link: {name!r}; expected 'src -> dst' (vertex names)")
            name = f"{src.strip()} -> {dst.strip()}"
        if e.action == "degrade" and e.factor is None:
            raise SpecError(f"{at_}.factor: missing; degrade needs a factor in (0, 1]")
        if e.action != "degrade" and e.factor is not None:
            raise SpecError(f"{at_}.factor: {e.factor!r}; only degrade takes a factor")
        out.append(Event(i, e.at_s, e.action, target, name, e.factor or 1.0))
        w = {"at": r.written["at"], "action": e.action, target: name}
        if e.factor is not None:
            w["factor"] = r.written["factor"]
        written.append(w)
    return tuple(out), written


class Faults:
    """Carries out a run's ``events:`` on its cluster (``ops``): each at its
    time, in list order for the same time (their targets checked as the spec
    resolved: :mod:`twin.sim.layout`), and its random ``failures`` (drawn
    from ``failure_seed``, or the spec's ``seed``); ``topology`` is the
    cluster's (None without one)."""

    def __init__(
        self, ops: ClusterOps, events: Sequence[Event], failures: Sequence[RandomKeys],
        failure_seed: int | None, seed: int, topology: Any,
    ) -> None:  # fmt: skip
        self.ops = ops
        self.events = sorted(events, key=lambda e: (e.at_s, e.index))
        self.health = Health()
        self.applied: list[FaultEvent] = []
        self.random = failures
        self.seed = seed if failure_seed is None else failure_seed
        self.topology = topology

    def start(self) -> None:
        ops = self.ops
        for e in self.events:
            at(ops.env, e.at_s, self._applier(e))
        ids: dict[str, list[int | str]] = {
            "instance": list(range(len(ops.engines))),
            "node": list(sorted({k for p in ops.placements for k in self.nodes_of(p)})),
            "gpu": list(sorted(g for p in ops.placements for g in p.gpus)),
        }
        topo = self.topology
        if topo is not None:
            g = topo.graph
            ids["nic"] = [n for n in sorted(g.nodes) if g.nodes[n].get("type") == "nic"]
            # a link is a cable: one component for both directions, named u -> v with u < v
            ids["link"] = list(sorted({f"{min(u, v)} -> {max(u, v)}" for u, v in g.edges}))
        import numpy as np

        for ci, c in enumerate(self.random):
            for j, comp in enumerate(ids[c.component]):
                seq = np.random.SeedSequence(self.seed, spawn_key=(FAILURES_KEY, ci, j))
                self._next_failure(c, comp, np.random.default_rng(seq))

    # -- random failures -----------------------------------------------------------
    def _done(self) -> bool:
        """Whether random failures have nothing left to act on: every request
        arrived has ended, or waits for an instance to come back. A random
        failure cannot bring one back (a repair already due still comes), and
        new ones would keep the run going for ever."""
        return self.ops.settled()

    def _both_ways(self, c: RandomKeys, comp: int | str, action: str, now: float) -> None:
        """Apply ``action`` to one random component; a link in both directions."""
        self.apply(Event(-1, now, action, c.component, comp, 1.0))
        if c.component == "link":
            u, _, v = str(comp).partition(" -> ")
            if self.topology.graph.has_edge(v, u):
                self.apply(Event(-1, now, action, "link", f"{v} -> {u}", 1.0))

    def _next_failure(self, c: RandomKeys, comp: int | str, rng: np.random.Generator) -> None:
        when = self.ops.env.now + float(rng.exponential(c.mtbf_s))
        at(self.ops.env, when, lambda _ev: self._random_fail(c, comp, rng))

    def _random_fail(self, c: RandomKeys, comp: int | str, rng: np.random.Generator) -> None:
        if self._done():
            return  # nothing left to serve: no more failures
        now = self.ops.env.now
        self._both_ways(c, comp, "fail", now)
        repair = c.repair_s if c.repair_dist == "fixed" else float(rng.exponential(c.repair_s))

        def repaired(_ev: object) -> None:
            self._both_ways(c, comp, "recover", now + repair)
            if not self._done():
                self._next_failure(c, comp, rng)

        at(self.ops.env, now + repair, repaired)

    def log(self) -> list[dict[str, Any]]:
        """The events as they took effect, for the result's ``fault_log``:
        ``time_s``, ``action``, ``target``, ``name``, ``factor`` (degrade
        only) and the ``instances`` it changed."""
        out = []
        for e in self.applied:
            row: dict[str, Any] = {"time_s": e.time_s, "action": e.action, "target": e.target,
                                   "name": e.name}  # fmt: skip
            if e.action == "degrade":
                row["factor"] = e.factor
            row["instances"] = list(e.instances)
            out.append(row)
        return out

    def _applier(self, e: Event) -> Callable[[object], None]:
        return lambda _ev: self.apply(e)

    def nodes_of(self, p: Any) -> set[int]:
        """The nodes placement ``p``'s GPUs are on: its own node, or several for
        an expert-parallel instance that spans nodes."""
        topo = self.topology
        if topo is not None:  # an instance spans nodes only there (place_on_topology)
            return {topo.node_of(g) for g in p.gpus}
        return {p.node}

    def instances_of(self, e: Event) -> tuple[int, ...]:
        placements = self.ops.placements
        if e.target == "instance":
            return (int(e.name),)
        if e.target == "node":
            return tuple(p.instance for p in placements if e.name in self.nodes_of(p))
        if e.target == "gpu":
            return tuple(p.instance for p in placements if e.name in p.gpus)
        return ()

    def apply(self, e: Event) -> None:
        """``e`` changes its target's own state; every instance and link whose
        state, derived from the parts it depends on (twin.sim.health),
        changes with it fails, recovers or changes speed."""
        ops = self.ops
        covered = self.instances_of(e)
        links = self.links_of(e) if e.target in ("link", "nic") else []
        was = [self.instance_state(i) for i in covered]
        was_links = [self.link_state(src, dst) for src, dst in links]
        self.health.apply(e.action, (e.target, e.name), e.factor)
        changed = []
        for i, (was_up, was_speed) in zip(covered, was, strict=True):
            up, speed = self.instance_state(i)
            if speed != was_speed:
                ops.engines[i].set_speed(speed)
            if was_up and not up:
                ops.fail_instance(i)
            elif up and not was_up:
                ops.recover_instance(i)
            if (up, speed) != (was_up, was_speed):
                changed.append(i)
        if e.target == "node" and e.action == "fail":
            ops.lose_host_memory(int(e.name))  # host memory goes with the node
        if links:
            self._apply_links(links, was_links)
        event = FaultEvent(ops.env.now, e.action, e.target, e.name, e.factor, tuple(changed))
        self.applied.append(event)
        ops.fault_applied(event)

    def _apply_links(self, links: list[tuple[str, str]], was: list[tuple[bool, float]]) -> None:
        """The network takes the links' new derived states."""
        ops = self.ops
        failed = False
        for (src, dst), (was_up, was_factor) in zip(links, was, strict=True):
            up, factor = self.link_state(src, dst)
            if factor != was_factor:
                ops.scale_link(src, dst, factor)
            if was_up and not up:
                ops.fail_link(src, dst)
                failed = True
            elif up and not was_up:
                ops.recover_link(src, dst)
        if failed:
            ops.links_failed()  # a wait for the repair ends at the retry deadline

    def instance_state(self, i: int) -> tuple[bool, float]:
        """Whether instance ``i`` is up (it, each of its GPUs and their nodes
        are), and its speed: its own degradation times its slowest GPU's,
        each GPU's the product of its own and its node's (tensor- and
        pipeline-parallel ranks step together)."""
        p = self.ops.placements[i]
        topo = self.topology
        me: Part = ("instance", i)
        gpus = [(("gpu", g), ("node", topo.node_of(g) if topo else p.node)) for g in p.gpus]
        h = self.health
        up = h.up([me, *(part for pair in gpus for part in pair)])
        return up, h.factor([me]) * min((h.factor(pair) for pair in gpus), default=1.0)

    def link_state(self, src: str, dst: str) -> tuple[bool, float]:
        """Whether link ``src -> dst`` is up (it and the NICs at its ends are),
        and the share of its capacity it carries (their degradations' product)."""
        nodes = self.topology.graph.nodes
        parts: list[Part] = [("link", f"{src} -> {dst}")]
        parts += [("nic", v) for v in (src, dst) if nodes[v].get("type") == "nic"]
        return self.health.up(parts), self.health.factor(parts)

    def placed(self, i: int) -> None:
        """Instance ``i`` was added (scaling): it takes on the state of the
        parts it runs on (it comes up failed on a failed node, say)."""
        up, speed = self.instance_state(i)
        if speed != 1.0:
            self.ops.engines[i].set_speed(speed)
        if not up:
            self.ops.fail_instance(i)

    def links_of(self, e: Event) -> list[tuple[str, str]]:
        """The directed links a link or NIC target names."""
        if e.target == "link":
            src, _, dst = str(e.name).partition(" -> ")
            return [(src, dst)]
        g = self.topology.graph
        return sorted({(u, v) for u, v in g.in_edges(e.name)} | set(g.out_edges(e.name)))
