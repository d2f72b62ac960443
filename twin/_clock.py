"""Time in the model: events at an absolute instant, and the order of events that
fall on the same instant.

SimPy orders its queue by ``(time, priority, event id)``. Two priorities name
what the model needs of that order:

- :data:`ARRIVAL`: a request's arrival is seen before anything else that falls
  on the same instant, so that it can join the batch formed then;
- :data:`ORDINARY`: everything else (iteration ends, transfers landing, timers);
  ties among them keep the order in which they were scheduled.

SimPy schedules by delay only (``now + delay``), and ``now + (when - now)`` can
miss ``when`` by one ulp. Fast-forward must land exactly on the instants that
stepping reaches, and an idle path must take exactly latency + size / rate, so
:func:`at` pushes onto SimPy's queue directly. SimPy cannot take an event back
once scheduled; :func:`move` brings one of :func:`at`'s forward instead (a
fast-forwarded stretch cut short ends earlier), so that no stale event is left
to fire, and :func:`cancel` takes one off the queue (a pipelined stretch ended
early). :func:`arm` schedules (or schedules again) a pending event that a
process already waits on, at a place among same-instant events taken earlier
with :func:`slot` (a sleeping tick keeps the place its timeout would have had),
or now. This module is the one place that touches SimPy's private
``Environment._queue`` and ``_eid`` (SimPy 4.x; the dependency is pinned to
that major version).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import simpy

__all__ = [
    "ARRIVAL",
    "ORDINARY",
    "Arrival",
    "arm",
    "arrival_at",
    "at",
    "cancel",
    "move",
    "place",
    "slot",
]

ARRIVAL = simpy.core.URGENT
ORDINARY = simpy.core.NORMAL


class Arrival(simpy.events.Event):
    """A timeout of ``delay`` seconds at :data:`ARRIVAL` priority."""

    def __init__(self, env: simpy.Environment, delay: float) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, ARRIVAL, delay)


def arrival_at(env: simpy.Environment, when: float) -> simpy.Event:
    """An event at the absolute time ``when`` at :data:`ARRIVAL` priority: a
    request that arrives at ``t`` is admitted at ``t`` itself, where
    ``Arrival(env, t - now)`` can land an ulp away (after ``now``, ``t - now``
    is exact only while ``t < 2 now``: sparse arrivals miss)."""
    ev = simpy.Event(env)
    ev._ok = True
    ev._value = None
    heapq.heappush(env._queue, (when, ARRIVAL, next(env._eid), ev))  # type: ignore[attr-defined]
    return ev


def at(
    env: simpy.Environment,
    when: float,
    callback: Callable[[simpy.Event], None] | None = None,
) -> simpy.Event:
    """An event that fires at the absolute time ``when`` (:data:`ORDINARY`
    priority), calling ``callback`` if one is given."""
    ev = simpy.Event(env)
    ev._ok = True
    ev._value = None
    if callback is not None:
        ev.callbacks.append(callback)  # type: ignore[union-attr]
    heapq.heappush(env._queue, (when, ORDINARY, next(env._eid), ev))  # type: ignore[attr-defined]
    return ev


def place(env: simpy.Environment) -> Callable[[float, Callable[[simpy.Event], None]], None]:
    """A place in the order of same-instant events, taken now: calling the
    result with ``(when, callback)`` later schedules an event at ``when`` that
    fires among the events of that instant as one scheduled now would (as a
    timeout made now would, had it been made). One call at most."""
    eid = next(env._eid)  # type: ignore[attr-defined]

    def schedule(when: float, callback: Callable[[simpy.Event], None]) -> None:
        ev = simpy.Event(env)
        ev._ok = True
        ev._value = None
        ev.callbacks.append(callback)  # type: ignore[union-attr]
        heapq.heappush(env._queue, (when, ORDINARY, eid, ev))  # type: ignore[attr-defined]

    return schedule


def slot(env: simpy.Environment) -> int:
    """A place in the order of same-instant events, taken now, for :func:`arm`."""
    return next(env._eid)  # type: ignore[attr-defined]


def arm(env: simpy.Environment, ev: simpy.Event, when: float, place: int | None = None) -> None:
    """Make ``ev``, a plain event not yet triggered (a process may be waiting
    on it), fire at ``when``, ordered among the events of that instant as one
    scheduled when ``place`` was taken (:func:`slot`), or now; rearmed, it
    fires at the new ``when`` only."""
    queue = env._queue  # type: ignore[attr-defined]
    eid = next(env._eid) if place is None else place  # type: ignore[attr-defined]
    if ev._value is not simpy.events.PENDING:  # armed before: take it back
        _take_back(queue, ev)
    ev._ok = True
    ev._value = None
    heapq.heappush(queue, (when, ORDINARY, eid, ev))


def move(env: simpy.Environment, ev: simpy.Event, when: float) -> None:
    """Make ``ev``, scheduled by :func:`at` and not yet fired, fire at ``when``
    instead, ordered among the events of that instant as if scheduled now."""
    queue = env._queue  # type: ignore[attr-defined]
    for i, entry in enumerate(queue):
        if entry[3] is ev:
            queue[i] = (when, ORDINARY, next(env._eid), ev)  # type: ignore[attr-defined]
            heapq.heapify(queue)
            return
    raise AssertionError(f"move: {ev!r} is not scheduled")


def cancel(env: simpy.Environment, ev: simpy.Event) -> None:
    """Take ``ev``, scheduled by :func:`at` and not yet fired, off the queue: it
    never fires (a fast-forwarded stretch ended early needs no end)."""
    if not _take_back(env._queue, ev):  # type: ignore[attr-defined]
        raise AssertionError(f"cancel: {ev!r} is not scheduled")


def _take_back(queue: list, ev: simpy.Event) -> bool:
    """Remove ``ev``'s entry from SimPy's queue; whether it was there."""
    for i, entry in enumerate(queue):
        if entry[3] is ev:
            queue[i] = queue[-1]
            queue.pop()
            heapq.heapify(queue)
            return True
    return False
