"""Queue policies: the order in which one instance admits the prompts it holds.

An instance keeps the requests routed to it in a queue and, at each
iteration, continues the prompts it has begun, then admits from the head of
the queue while the head fits (its KV blocks, a running slot, the token
budget); a head that does not fit stops admission (head-of-line blocking, as
vLLM's scheduler does). A queue policy decides which request is the head.

A policy is an object with one required method, ``key(item)``: the sort key
of a queued request (smaller is served first). It is asked once, when the
request joins the queue (it arrives, or it is preempted and waits to be
recomputed); requests of equal keys keep first come, first served order, in
which a preempted request rejoins ahead of those waiting (vLLM re-queues it
at the front). Keys of one policy must compare with each other (numbers, or
tuples of numbers). ``item`` is a :class:`Queued`, a read-only view.

Optional: ``victim(running)`` (:class:`PicksVictim`) picks the decoding
request to preempt when a decode step finds no free KV block, from those of
the batch in admission order; without it the most recently admitted one goes
(vLLM's FCFS choice). With classes of traffic (``workload.classes``) the
engine first narrows ``running`` to the lowest class among them (the largest
priority), under every policy.

The shipped policies: ``fcfs`` (the default: arrival order), ``priority``
(the request's ``priority``, lower first, as vLLM's ``--scheduling-policy
priority``; ties by arrival time, and the preemption victim is the running
request of the lowest priority, the latest arrival among equals, as vLLM
does; an arrival never preempts running work) and ``shortest-prompt-first``
(the fewest prompt tokens to compute first; ties first come, first served).

Policies register by name with :func:`register_queue_policy`, or through the
``twin.queue_policies`` entry-point group; a spec picks one with
``engine.queue_policy: <name>`` or ``{name: <name>, <param>: <value>}``
(the parameters of a dataclass policy).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Sequence as Sequence_
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from twin.errors import DuplicateRegistrationError, SpecError, UnknownNameError
from twin.request import Request
from twin.scheduler import Objectives, _qualname, instantiate, load_plugins

ENTRY_POINT_GROUP = "twin.queue_policies"
DEFAULT = "fcfs"


class Queued(Protocol):
    """What a queue policy may read of a request an instance holds."""

    @property
    def req(self) -> Request:
        """The request as it arrived (``priority``, ``traffic_class``, ``arrival_s``,
        lengths)."""
        ...

    @property
    def prefill_len(self) -> int:
        """Prompt tokens to compute when admitted: the prompt, plus the tokens
        produced before a preemption (they are recomputed)."""
        ...

    @property
    def slo(self) -> Objectives:
        """The latency objectives of the request's class of traffic: its
        ``ttft_s`` and ``tpot_s`` (``workload.classes[i].slo``; what a class
        leaves out, and every request without classes, has the spec's
        ``slo:``; ``inf`` when not set). An earliest-deadline-first key is
        ``item.req.arrival_s + item.slo.ttft_s``."""
        ...

    @property
    def preemptions(self) -> int:
        """Times it was preempted here or before."""
        ...

    @property
    def t_arrival(self) -> float:
        """When the instance received it, seconds from the start of the run."""
        ...


@runtime_checkable
class QueuePolicy(Protocol):
    """The required hook: the sort key of a request joining the queue."""

    def key(self, item: Queued) -> Any: ...


@runtime_checkable
class PicksVictim(Protocol):
    """Optional hook: the request to preempt among ``running`` (the decoding
    requests of the batch, in admission order; never empty)."""

    def victim(self, running: Sequence_[Queued]) -> Queued: ...


# -- the shipped policies --------------------------------------------------------------
_registry: dict[str, type[QueuePolicy]] = {}
_entry_points_loaded = False
P = TypeVar("P", bound=QueuePolicy)


def register_queue_policy(name: str) -> Callable[[type[P]], type[P]]:
    """Class decorator: make the policy available as ``engine.queue_policy: {name}``.
    A second registration of the name by another class is an error."""

    def deco(cls: type[P]) -> type[P]:
        other = _registry.get(name)
        if other is not None and _qualname(other) != _qualname(cls):
            raise DuplicateRegistrationError(
                f"queue policy {name!r} is already registered by {_qualname(other)}; "
                f"{_qualname(cls)} cannot take the name"
            )
        _registry[name] = cls
        return cls

    return deco


@register_queue_policy("fcfs")
@dataclass(frozen=True)
class FirstComeFirstServed:
    """Arrival order; a preempted request rejoins at the front."""

    def key(self, item: Queued) -> int:
        return 0


@register_queue_policy("priority")
@dataclass(frozen=True)
class Priority:
    """The request's ``priority``, lower first; ties by arrival time. The
    preemption victim is the lowest priority, the latest arrival among equals."""

    def key(self, item: Queued) -> tuple[int, float]:
        return item.req.priority, item.req.arrival_s

    def victim(self, running: Sequence_[Queued]) -> Queued:
        # max keeps the first of equals: scan the latest admitted first
        return max(reversed(running), key=self.key)


@register_queue_policy("shortest-prompt-first")
@dataclass(frozen=True)
class ShortestPromptFirst:
    """The fewest prompt tokens to compute first; ties first come, first served."""

    def key(self, item: Queued) -> int:
        return item.prefill_len


# -- the registry --------------------------------------------------------------------
def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    load_plugins(ENTRY_POINT_GROUP, "queue policy", _registry, _add)


def _add(name: str, cls: type[QueuePolicy]) -> None:
    register_queue_policy(name)(cls)


def queue_policy_names() -> list[str]:
    """Every registered queue policy name, sorted."""
    _load_entry_points()
    return sorted(_registry)


def get_queue_policy(name: str, where: str = "") -> type[QueuePolicy]:
    """The policy class registered as ``name``; a miss suggests close names."""
    if name not in _registry:  # the shipped ones need no entry-point lookup
        _load_entry_points()
    try:
        return _registry[name]
    except KeyError:
        raise UnknownNameError("queue policy", name, _registry, where) from None


def build_queue_policy(
    name: str, params: Mapping[str, Any] | None = None, where: str = "engine.queue_policy"
) -> QueuePolicy:
    """Policy ``name`` made with ``params`` (checked against its dataclass fields)."""
    cls = get_queue_policy(name, where)
    policy = instantiate(cls, "queue policy", name, params or {}, where)
    if not callable(getattr(policy, "key", None)):
        raise SpecError(f"{where}: queue policy {name!r} has no key(item) method")
    return policy


@dataclass(frozen=True)
class QueuePolicyChoice:
    """The spec's ``engine.queue_policy``: a registered name and its parameters."""

    name: str = DEFAULT
    params: Mapping[str, Any] | None = None

    def build(self) -> QueuePolicy:
        return build_queue_policy(self.name, self.params)


def parse_choice(value: Any, where: str) -> QueuePolicyChoice:
    """``engine.queue_policy`` from YAML: a name, or ``{name: ..., <param>: ...}``;
    the policy is made once here so that a bad name or parameter is refused
    when the spec is read."""
    if isinstance(value, str):
        choice = QueuePolicyChoice(value)
    elif isinstance(value, dict) and isinstance(value.get("name"), str):
        params = {k: v for k, v in value.items() if k != "name"}
        choice = QueuePolicyChoice(value["name"], params)
    else:
        raise SpecError(
            f"{where}: {value!r} must be a queue policy name or a mapping with a name; "
            f"expected one of {', '.join(queue_policy_names())}"
        )
    build_queue_policy(choice.name, choice.params, where)
    return choice


SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
    ]
}


# -- the queue -----------------------------------------------------------------------
class PolicyQueue:
    """An instance's waiting requests in ``policy``'s order, with the part of
    a deque's interface the engine uses: ``append`` (an arrival),
    ``appendleft`` (a preempted request, ahead of its equals), the head
    ``[0]`` and ``popleft``, ``remove``, ``clear``, and iteration in order."""

    __slots__ = ("_heap", "_key", "_back", "_front", "changes")

    def __init__(self, policy: QueuePolicy) -> None:
        self._heap: list[tuple[Any, int, Any]] = []
        self.changes = 0  # every change of the queue (a join may land anywhere in it)
        self._key = policy.key
        self._back = 0  # the next arrival's place among equal keys
        self._front = 0  # ... and the next preempted one's, ahead of all before it

    def append(self, item: Any) -> None:
        self.changes += 1
        heapq.heappush(self._heap, (self._key(item), self._back, item))
        self._back += 1

    def appendleft(self, item: Any) -> None:
        self.changes += 1
        self._front -= 1
        heapq.heappush(self._heap, (self._key(item), self._front, item))

    def __getitem__(self, index: int) -> Any:
        if index != 0 or not self._heap:
            raise IndexError("a policy queue gives its head only")
        return self._heap[0][2]

    def popleft(self) -> Any:
        self.changes += 1
        return heapq.heappop(self._heap)[2]

    def remove(self, item: Any) -> None:
        self.changes += 1
        heap = self._heap
        i = next(k for k, e in enumerate(heap) if e[2] is item)
        heap[i] = heap[-1]
        heap.pop()
        heapq.heapify(heap)

    def clear(self) -> None:
        self.changes += 1
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Any]:
        return (e[2] for e in sorted(self._heap, key=lambda e: (e[0], e[1])))


def waiting_queue(policy: QueuePolicy) -> deque[Any] | PolicyQueue:
    """The queue an engine keeps its waiting requests in: a plain deque for
    first come, first served (the same order, at a deque's cost), else a
    :class:`PolicyQueue`."""
    return deque() if type(policy) is FirstComeFirstServed else PolicyQueue(policy)
