"""The control loop: the roles instances take at setup and as the run goes.

A policy's :meth:`setup` returns a :class:`~twin.scheduler.Plan` (roles and
per-instance limits), applied before anything arrives. A policy with a
``tick`` hook is called every ``tick_s`` seconds while requests remain, and may
return :class:`~twin.scheduler.SetRole` actions: an instance moves to another
role after the action's start-up cost (``cost_s``), a later move of the same
instance replacing one still on its way. Every role change is checked (the
cluster keeps instances that prefill and instances that decode) and reported
to the observer.

A policy that ticks on change (:func:`~twin.scheduler.ticks_on_change`) is not
asked again while the cluster cannot have changed: after a tick that returned
nothing, with no instance holding work (nothing queued, running, moving or
reserved, so nothing the view shows changes with time) and none draining
(whose release a tick checks), the state stays as it is until the next
scheduled event, and the next tick is the first one of the grid at or after
it. Ticks fall on the same instants as without the skip (the grid is
``tick_s`` added tick after tick, as the timeouts add it), and a tick at the
instant of that event still comes after it, as it would have.

Under load something changes at nearly every tick, so a policy that ticks on
change may also name what its decision turns on (``tick_watch``, a
:class:`~twin.scheduler.TickWatch`): after a tick that returned nothing, with
no move on its way and no instance starting or draining, the loop sleeps and
each instance watches its thresholds (queued prompt tokens at every change of
the queue, free KV blocks at every allocation and release, and, for a decode
stretch that takes its blocks as time passes, the first step by whose start
its blocks could have crossed), and wakes the loop on a change of truth value
or of role or health. The next tick is the first of the grid at or after that
change; the grid's next instant keeps the place among same-instant events
that its timeout, made at the tick, would have had.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from typing import Any

import simpy

from twin._check import is_int, is_number
from twin._clock import arm, at, slot
from twin.errors import SpecError
from twin.scheduler import (
    AddInstance,
    ClusterView,
    Plan,
    RemoveInstance,
    SetRole,
    TickWatch,
    tick_hook,
    ticks_on_change,
    watch_hook,
)
from twin.serving.engine import ROLES, Engine
from twin.serving.fastforward import Stretch
from twin.serving.kvcache import BlockManager
from twin.serving.observer import Observer
from twin.sim.scaling import Scaler


def check_roles(engines: Sequence[Engine], has_topology: bool, name: str) -> None:
    """The roles instances have now can serve: a split needs a topology, and
    some instance prefills while some instance decodes."""
    roles = {e.role for e in engines}
    if roles - {"mixed"} and not has_topology:
        raise SpecError(
            f"scheduler {name!r} splits prefill and decode; the cluster needs a topology "
            "for the KV cache to travel over (cluster.topology)"
        )
    if not roles & {"prefill", "mixed"} or not roles & {"decode", "mixed"}:
        raise SpecError(
            f"scheduler {name!r}: the cluster has roles {sorted(roles)}; it needs instances "
            "that prefill (prefill or mixed) and instances that decode (decode or mixed)"
        )


def apply_plan(plan: Plan, engines: Sequence[Engine], has_topology: bool, name: str) -> None:
    """Give the instances the roles and limits of the policy's setup, checked."""
    for inst_id, role in plan.roles.items():
        if not 0 <= inst_id < len(engines):
            raise SpecError(f"scheduler {name!r}: setup names instance {inst_id}")
        if role not in ROLES:
            raise SpecError(
                f"scheduler {name!r}: setup gives instance {inst_id} role {role!r}; "
                f"expected one of {', '.join(ROLES)}"
            )
        engines[inst_id].set_role(role)
    for key in ("max_batched_tokens", "max_num_seqs"):
        for inst_id, value in getattr(plan, key).items():
            if not (isinstance(inst_id, int) and 0 <= inst_id < len(engines)):
                raise SpecError(f"scheduler {name!r}: setup sets {key} of instance {inst_id!r}")
            if not is_int(value) or value <= 0:
                raise SpecError(
                    f"scheduler {name!r}: setup sets {key} of instance {inst_id} to "
                    f"{value!r}; expected a positive integer"
                )
            engines[inst_id].set_limits(**{key: value})
    check_roles(engines, has_topology, name)


class ControlLoop:
    """Ticks the policy and carries out its role moves.

    ``done()`` tells whether every request has arrived and ended (the loop
    then stops); ``on_roles`` is called after each role change takes effect.
    """

    def __init__(
        self,
        env: simpy.Environment,
        scheduler: object,
        name: str,
        view: ClusterView,
        engines: Sequence[Engine],
        has_topology: bool,
        observer: Observer,
        *,
        arrivals_done: Callable[[], bool],
        all_ended: Callable[[], bool],
        on_roles: Callable[[], None],
        scaler: Scaler | None = None,
    ) -> None:
        self.env = env
        self.scheduler = scheduler
        self.name = name
        self.view = view
        self.engines = engines
        self.has_topology = has_topology
        self.observer = observer
        self.ticks = tick_hook(scheduler, name)
        self.tick_s = None if self.ticks is None else float(self.ticks.tick_s)
        self.skips = self.ticks is not None and ticks_on_change(self.ticks)
        self.watch = watch_hook(self.ticks) if self.ticks is not None else None
        # while asleep on a watch: the event the ticker waits on, the grid's
        # next instant and its place, and the instant the event is armed for
        self._sleep: simpy.Event | None = None
        self._next = 0.0
        self._slot = 0
        self._wake_at = math.inf
        self.tick_calls = 0  # ticks the policy was asked for
        self._arrivals_done = arrivals_done
        self._all_ended = all_ended
        self._on_roles = on_roles
        # instance -> (role it is moving to, move number); role_changes lists
        # (time, instance, old role, new role) as the moves take effect.
        self.moving: dict[int, tuple[str, int]] = {}
        self._moves = 0
        self.role_changes: list[tuple[float, int, str, str]] = []
        self.scaler = scaler  # carries out AddInstance and RemoveInstance

    def start(self) -> None:
        if self.tick_s is not None:
            self.env.process(self._ticker())

    def _ticker(self) -> Generator[simpy.Event, Any, None]:
        """Call the policy's ``tick`` every ``tick_s`` while requests remain to
        arrive or to end; stop once none do (or nothing else is scheduled, so a
        stuck run still ends and fails its conservation check)."""
        env = self.env
        assert self.ticks is not None and self.tick_s is not None
        tick_s = self.tick_s
        wait: simpy.Event = env.timeout(tick_s)
        while True:
            yield wait
            if self._sleep is not None:
                self._unwatch()
            arrived = self._arrivals_done()
            if (arrived and self._all_ended()) or (
                arrived and env.peek() == math.inf and not self.moving
            ):
                return
            if self.scaler is not None:
                self.scaler.recheck()
            self.tick_calls += 1
            actions = self.ticks.tick(self.view)
            for action in actions or ():
                self.act(action)
            if self.watch is not None and not actions and self._can_sleep():
                watch = self.watch(self.view)
                if watch is not None:
                    wait = self._sleep_on(watch)
                    continue
            if self.skips and not actions and self._quiet():
                # Nothing changes before the next event: the first tick of the
                # grid at or after it decides what every earlier one would.
                when, first = env.now + tick_s, env.peek()
                if when < first < math.inf:
                    while when < first:
                        when += tick_s
                    wait = at(env, when)
                    continue
            wait = env.timeout(tick_s)

    def _can_sleep(self) -> bool:
        """No move on its way and every instance serving or stopped: then only
        the instances' own changes, which they report, can change the view."""
        return not self.moving and all(e.state in ("serving", "stopped") for e in self.engines)

    def _sleep_on(self, watch: TickWatch) -> simpy.Event:
        """Watch ``watch``'s thresholds; the event the ticker then waits on."""
        env = self.env
        self._sleep = ev = simpy.Event(env)
        self._slot = slot(env)  # where the next tick's timeout would have been made
        assert self.tick_s is not None
        self._next = env.now + self.tick_s
        self._wake_at = math.inf
        queue, free = watch.queue_tokens_above, watch.free_blocks_at_most
        for e in self.engines:
            w = _Watch(self, queue.get(e.id), free.get(e.id))
            e.watch_changes(w)
            if w.free_at_most is not None:
                e.sync()
                w.free_was = e.kv.free <= w.free_at_most
                e.watch_blocks(w)
            if w.queue_above is not None:
                w.queue_was = e.waiting_tokens > w.queue_above
        return ev

    def _unwatch(self) -> None:
        self._sleep = None
        for e in self.engines:
            e.unwatch()

    def wake(self, when: float) -> None:
        """Something a sleeping tick turns on changed, or may have by ``when``:
        tick at the first instant of the grid at or after it."""
        if self._sleep is None:
            return
        tick_s = self.tick_s
        assert tick_s is not None
        g = self._next
        while g < when:
            g += tick_s
        if g >= self._wake_at:
            return
        arm(self.env, self._sleep, g, self._slot if g == self._next else None)
        self._wake_at = g

    def _quiet(self) -> bool:
        """Whether the view can change only at an event: no instance holds
        work (a decode stretch's state moves with time) or is draining."""
        return not any(e.holds_work() or e.state == "draining" for e in self.engines)

    def act(self, action: object) -> None:
        name, n = self.name, len(self.engines)
        if isinstance(action, AddInstance) and self.scaler is not None:
            self.scaler.add(action)
            return
        if isinstance(action, RemoveInstance) and self.scaler is not None:
            self.scaler.remove(action)
            return
        if not isinstance(action, SetRole):
            raise SpecError(
                f"scheduler {name!r}: tick() returned {action!r}; expected SetRole, "
                "AddInstance or RemoveInstance"
            )
        i, role, cost = action.instance, action.role, action.cost_s
        if not is_int(i) or not 0 <= i < n:
            raise SpecError(f"scheduler {name!r}: {action} names instance {i!r}; instances are "
                            f"0..{n - 1}")  # fmt: skip
        if getattr(self.engines[i], "state", "serving") != "serving":
            raise SpecError(
                f"scheduler {name!r}: {action}: instance {i} is {self.engines[i].state}"
            )
        if role not in ROLES:
            raise SpecError(
                f"scheduler {name!r}: {action} gives role {role!r}; expected one of "
                f"{', '.join(ROLES)}"
            )
        if not is_number(cost) or not 0 <= cost < math.inf:
            raise SpecError(f"scheduler {name!r}: {action}: cost_s {cost!r} must be >= 0 seconds")
        pending = self.moving.get(i)
        if pending is not None and pending[0] == role:
            return  # already on its way
        if pending is None and self.engines[i].role == role:
            return
        self._moves += 1
        move = self._moves
        self.moving[i] = (role, move)
        if cost == 0:
            self._take_role(i, role, move)
        else:
            self.env.timeout(cost).callbacks.append(lambda _ev: self._take_role(i, role, move))

    def _take_role(self, i: int, role: str, move: int) -> None:
        if self.moving.get(i, (None, -1))[1] != move:
            return  # replaced by a later move
        del self.moving[i]
        eng = self.engines[i]
        old = eng.role
        if old == role:
            return
        eng.set_role(role)
        try:
            check_roles(self.engines, self.has_topology, self.name)
        except SpecError as e:
            eng.set_role(old)
            raise SpecError(f"{e} (after moving instance {i} from {old} to {role})") from None
        self._on_roles()
        now = self.env.now
        self.role_changes.append((now, i, old, role))
        self.observer.role_changed(now, i, old, role)


class _Watch:
    """One instance's part of a sleeping tick's :class:`TickWatch`: the
    thresholds it watches and their truth values when the loop went to sleep."""

    __slots__ = ("loop", "queue_above", "queue_was", "free_at_most", "free_was")

    def __init__(
        self, loop: ControlLoop, queue_above: int | None, free_at_most: float | None
    ) -> None:
        self.loop = loop
        self.queue_above = queue_above
        self.queue_was = False
        self.free_at_most = free_at_most
        self.free_was = False

    def changed(self, eng: Engine) -> None:
        """Its role or health changed."""
        self.loop.wake(eng.env.now)

    def queue(self, eng: Engine) -> None:
        """Its queued prompt tokens changed."""
        q = self.queue_above
        if q is not None and (eng.waiting_tokens > q) != self.queue_was:
            self.loop.wake(eng.env.now)

    def free(self, kv: BlockManager) -> None:
        """Its free blocks changed."""
        f = self.free_at_most
        if f is not None and (kv.free <= f) != self.free_was:
            self.loop.wake(self.loop.env.now)

    def stretch(self, eng: Engine, st: Stretch) -> None:
        """A decode stretch under way, whose steps take their blocks as their
        starts pass, with no event: wake by the start of the first step by
        which they could have taken enough to cross (each sequence takes at
        most one block per ``block_size`` steps)."""
        f = self.free_at_most
        if f is None or self.free_was:
            return  # at or under it: only a release, at an event, can cross back
        room = eng.kv.free - math.floor(f)  # blocks to take to cross
        count = len(eng.running)
        if count <= 0:
            return
        bs = eng.kv.block_size
        # m more steps take at most count * (m // bs + 1) blocks
        m = max(1, bs * (-(-room // count) - 1))
        i = st.begun + m - 1  # the step whose start could see it crossed
        if i < st.stop:
            self.loop.wake(st.ends[i - 1] if i > 0 else eng.env.now)
