"""The policy API: what a scheduler sees, what it decides, and how it is found.

A scheduler is a small object with hooks. It sees read-only views of the
cluster (what a real router could know) and returns decision dataclasses; it
never touches SimPy or engine internals, so it can be unit-tested against a
hand-built :class:`ClusterView` with no simulation running.

The hooks are Protocols: :class:`Scheduler` (``setup``, ``route``) is
required; :class:`PicksDecode` (``pick_decode``) and :class:`Ticks` (``tick``
every ``tick_s``) are optional, and a policy that has them says so by naming
them among its bases, so that mypy checks their signatures.
:func:`decode_hook` and :func:`tick_hook` find them on a policy object by
name, as the simulation does.

Each run hands the policy its own random stream, :attr:`ClusterView.rng`,
spawned from the run's seed; a policy draws from it and never seeds its own.

Policies register by name with :func:`register`; third-party packages add
theirs through the ``twin.schedulers`` entry-point group, whose entries are
imported on the first lookup (the built-in policies are listed there too).

A policy module needs nothing of twin beyond this module, ``twin.request``,
``twin.errors`` and ``twin.testing``: the helpers it shares with others
(:func:`require_split`, :func:`duration_s`) are here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

from twin._check import is_int as is_int  # re-exported: policies validate with it
from twin._check import is_number
from twin.errors import (
    DuplicateRegistrationError,
    PluginError,
    SpecError,
    UnitError,
    UnknownSchedulerError,
)
from twin.request import Request
from twin.units import parse_duration

if TYPE_CHECKING:  # numpy loads when a view is made, not when a spec is checked
    import numpy as np

Role = Literal["mixed", "prefill", "decode"]
"""What an instance does: both phases (``mixed``), prompts only (``prefill``)
or token generation only (``decode``). Results carry these strings."""
ROLES: tuple[Role, ...] = ("mixed", "prefill", "decode")
ENTRY_POINT_GROUP = "twin.schedulers"


# -- decisions -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Route:
    """Serve the request: prefill on instance ``prefill``; decode on ``decode``,
    or, when ``decode`` is ``None``, on the same instance (colocated) or on the
    one ``pick_decode`` names once the prefill is done (disaggregated).
    ``fetch_from`` names a node whose KV pool holds a prefix of the prompt:
    it is loaded over the network before the prefill, which then computes
    only the rest (needs ``cluster.kv_pool``)."""

    prefill: int
    decode: int | None = None
    fetch_from: int | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse the request at arrival; ``reason`` is reported per request."""

    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """The cluster layout a policy asks for at setup: a role per instance id,
    and per-instance batching limits that replace the spec's ``engine`` values
    on those instances (machine-level scheduling: a prompt machine batching up
    to 2,048 tokens, a token machine running as many sequences as fit)."""

    roles: Mapping[int, Role] = field(default_factory=dict)
    max_batched_tokens: Mapping[int, int] = field(default_factory=dict)
    max_num_seqs: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SetRole:
    """A ``tick`` action: instance ``instance`` takes role ``role``.

    The change takes effect ``cost_s`` seconds later (the cost of the move);
    until then the instance keeps its old role and serves as before. Work
    already on the instance keeps its plan: queued prompts whose KV was to
    move still move, KV on its way still lands, and what the instance holds
    it decodes to the end. A second ``SetRole`` for an instance whose move is
    pending replaces it, except one to the same role, which is ignored (so a
    policy may repeat itself every tick without restarting the move).
    """

    instance: int
    role: Role
    cost_s: float = 0.0


@dataclass(frozen=True, slots=True)
class AddInstance:
    """A ``tick`` action: start a new instance of ``role`` with ``tp`` x ``pp``
    GPUs, on free GPUs of one node (``node`` when given, else of ``template``
    when given, else the first node with room).

    It pays a start-up cost before it serves (the spec's ``scaling:`` keys:
    the weights loaded from storage or from a peer over the network, plus the
    engine's warm-up); meanwhile its view's ``state`` is ``"starting"`` and it
    takes no work. Its id is the next one (``len(view.instances)``); ids are
    never reused. With no free GPUs for it, the action is an error.

    ``model`` is the run's to set: on a cluster of several models, the model
    of the policy that asked (a policy leaves it out).
    """

    role: Role
    tp: int = 1
    pp: int = 1
    node: int | None = None
    template: str | None = None
    model: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class RemoveInstance:
    """A ``tick`` action: drain instance ``instance``, then release its GPUs.

    From now on it takes no new work (its view's ``accepting`` is False and
    ``state`` is ``"draining"``; routing to it is an error); what it holds
    (queued, running, KV waiting to move or on its way to it) it finishes,
    then its GPUs are released (``state`` ``"stopped"``). Removing an
    instance already draining or stopped is ignored.
    """

    instance: int


Action = SetRole | AddInstance | RemoveInstance
"""What ``tick`` may return."""

INSTANCE_STATES = ("starting", "serving", "draining", "stopped")
"""An instance's life under scaling: ``starting`` (paying its start-up cost),
``serving``, ``draining`` (finishing what it holds, taking nothing new) and
``stopped`` (its GPUs released). A failed instance is ``serving`` but not up."""


# -- views ---------------------------------------------------------------------------
@runtime_checkable
class InstanceView(Protocol):
    """What a router may know about one serving instance. Read-only.

    Token and block counts are integers; times are seconds. ``role`` is one
    of :data:`ROLES` (typed ``str`` so that the engine's own view fits).
    """

    @property
    def id(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def node(self) -> int: ...
    @property
    def gpus(self) -> tuple[int, ...]: ...
    @property
    def block_size(self) -> int: ...
    @property
    def total_blocks(self) -> int: ...
    @property
    def free_blocks(self) -> int: ...
    @property
    def queue_requests(self) -> int: ...
    @property
    def queue_tokens(self) -> int: ...
    @property
    def running_requests(self) -> int: ...
    @property
    def up(self) -> bool:
        """Whether the instance serves (False from its failure to its recovery:
        routing to it then is an error)."""
        ...

    @property
    def accepting(self) -> bool:
        """Whether new work may be routed here: up, and neither starting nor
        draining nor stopped."""
        ...

    @property
    def state(self) -> str:
        """One of :data:`INSTANCE_STATES`."""
        ...

    def estimate_prefill_s(self, tokens: int, cached: int = 0) -> float:
        """Time one prefill of ``tokens`` new tokens after ``cached`` cached ones
        would take alone on this instance."""
        ...

    def estimate_decode_s(self, count: int, context_sum: int) -> float:
        """Time of one decode step of ``count`` sequences with ``context_sum``
        context tokens in all, on this instance; decoding speculatively, a
        verify step's time over the tokens it emits on average (per-token
        time, what an inter-token-latency target compares with)."""
        ...

    def estimate_queue_s(self) -> float:
        """Seconds until the prompts queued on this instance, and those it is
        computing, are done: the queue priced as the iterations its engine
        would batch it into (first come, first served, up to the instance's
        token budget per iteration, in chunks with chunked prefill), each
        timed by the perf model, with what the prefix cache holds now taken
        off. A prompt sent here now starts after about this long. 0 when
        nothing waits."""
        ...

    def cached_prefix_tokens(self, req: Request) -> int:
        """Prompt tokens of ``req`` this instance's prefix cache holds (0 without one)."""
        ...

    def estimate_fetch_s(self, node: int, tokens: int, req: Request | None = None) -> float:
        """Time to load ``tokens`` tokens of KV from ``node``'s KV pool to this
        instance on an idle network; with ``req`` (whose first ``tokens``
        prompt tokens they are), the part the pool holds on its SSD is priced
        at the SSD's read, without it all as if in the pool's DRAM."""
        ...

    # Views of this project also have ``cached_prefix_by_tier(req) -> dict``:
    # prompt tokens of ``req`` the instance would reuse from each KV tier
    # (``"hbm"``, ``"dram"``, ``"ssd"``, and ``"remote"`` with a remote store;
    # the leading run in HBM, then its continuation below), the estimate a
    # router keeps from KV events. It is
    # not part of the protocol, so views written before it still conform.
    # Likewise ``cached_idle_blocks``: KV blocks only the prefix cache holds
    # (evictable; not among ``free_blocks``), 0 where a view lacks it.


@dataclass(frozen=True, slots=True)
class InstanceSnapshot:
    """A hand-built :class:`InstanceView`, for tests of a policy and for tools.

    ``prefill_s_per_token`` prices ``estimate_prefill_s`` linearly;
    ``estimate_queue_s`` is ``queue_s`` when given, else the queued tokens at
    that price.
    """

    id: int
    role: Role = "mixed"
    node: int = 0
    gpus: tuple[int, ...] = (0,)
    block_size: int = 16
    total_blocks: int = 1000
    free_blocks: int = 1000
    queue_requests: int = 0
    queue_tokens: int = 0
    running_requests: int = 0
    prefill_s_per_token: float = 1e-4
    decode_s_base: float = 0.02
    decode_s_per_seq: float = 1e-4
    cached_hashes: frozenset[int] = frozenset()
    fetch_s_per_token: float = 1e-6
    queue_s: float | None = None
    up: bool = True
    state: str = "serving"
    # the prefix units held below HBM: (tier name, hashes), top tier first
    tier_hashes: tuple[tuple[str, frozenset[int]], ...] = ()
    cached_idle_blocks: int = 0  # of the used blocks, those only the prefix cache holds
    model: str = ""  # the model it serves on a cluster of several ("": the only one)

    @property
    def accepting(self) -> bool:
        return self.up and self.state == "serving"

    def estimate_prefill_s(self, tokens: int, cached: int = 0) -> float:
        return tokens * self.prefill_s_per_token

    def estimate_queue_s(self) -> float:
        if self.queue_s is not None:
            return self.queue_s
        return self.queue_tokens * self.prefill_s_per_token

    def estimate_decode_s(self, count: int, context_sum: int) -> float:
        return self.decode_s_base + count * self.decode_s_per_seq

    def cached_prefix_tokens(self, req: Request) -> int:
        n = 0
        for h in req.prefix_hashes:
            if h not in self.cached_hashes:
                break
            n += 1
        return min(n * req.prefix_block_tokens, req.prompt_tokens)

    def estimate_fetch_s(self, node: int, tokens: int, req: Request | None = None) -> float:
        return tokens * self.fetch_s_per_token

    def cached_prefix_by_tier(self, req: Request) -> dict[str, int]:
        """Prompt tokens per tier: ``hbm``, ``dram``, ``ssd`` and each other tier
        ``tier_hashes`` names (``remote``, say)."""
        out = {"hbm": 0, "dram": 0, "ssd": 0}
        out.update((name, 0) for name, _ in self.tier_hashes if name not in out)
        tier = "hbm"
        for h in req.prefix_hashes:
            if h not in self.cached_hashes:
                tier = next((name for name, held in self.tier_hashes if h in held), "")
                if not tier:
                    break
            elif tier != "hbm":
                break  # HBM holds only a leading run
            out[tier] += req.prefix_block_tokens
        return out


@dataclass(frozen=True, slots=True)
class LinkLoad:
    """One directed link of the fabric as it is now: its usable rate (bytes/s,
    degradation applied, 0 while it is down), the sum of the rates of the
    flows sending on it and how many flows send on it."""

    src: str
    dst: str
    usable_bytes_s: float
    load_bytes_s: float = 0.0
    flows: int = 0

    @property
    def utilisation(self) -> float:
        """Load over usable rate (1 on a link that is down)."""
        if self.usable_bytes_s <= 0.0:
            return 1.0
        return self.load_bytes_s / self.usable_bytes_s


@dataclass(frozen=True, slots=True)
class HandoffEstimate:
    """What moving one request's KV from instance ``prefill`` to ``decode``
    would cost if it started now, at the current link loads.

    ``bytes`` would cross (``flows`` flows: one per source GPU, or per NIC
    with ``multi_nic``); ``saved_tokens`` prompt tokens (``saved_bytes``)
    would not, as the decode side's prefix cache holds them. The bytes take
    ``transfer_s`` (first byte to last delivered), each flow at the max-min
    rate the network would give it now; ``rate_bytes_s`` is the rate of the
    flow delivered last and ``bottleneck`` the link that holds it (None when
    nothing crosses a link). ``fixed_s`` is the hand-off's fixed costs
    (control round trip, registration, descriptors, router hop), as a
    serialized hand-off pays them. ``links`` is each link of the paths with
    its load now; ``rail_aligned`` says that every flow between nodes leaves
    and enters through NICs of the same number (the same rail).

    NOTE: the rate is the one the transfer would start with (the new flows'
    instantaneous max-min share, before the flows already there are
    reallocated; :mod:`twin.net.whatif`); flows that start or end meanwhile
    change it."""

    prefill: int
    decode: int
    bytes: float = 0.0
    saved_tokens: int = 0
    saved_bytes: float = 0.0
    flows: int = 0
    rate_bytes_s: float = float("inf")
    bottleneck: LinkLoad | None = None
    transfer_s: float = 0.0
    fixed_s: float = 0.0
    links: tuple[LinkLoad, ...] = ()
    rail_aligned: bool = True

    @property
    def total_s(self) -> float:
        """The hand-off's time: fixed costs plus the bytes."""
        return self.fixed_s + self.transfer_s

    @property
    def utilisation(self) -> float:
        """The highest utilisation among ``links`` (0 with none)."""
        return max((ln.utilisation for ln in self.links), default=0.0)


@runtime_checkable
class FabricView(Protocol):
    """The network between the instances as a router may know it: the
    hand-off a pair would pay now, and the load on the links it would take."""

    def handoff(self, prefill: int, decode: int, req: Request) -> HandoffEstimate: ...

    def path_links(self, prefill: int, decode: int) -> tuple[LinkLoad, ...]: ...


@dataclass(frozen=True, slots=True)
class FabricSnapshot:
    """A hand-built :class:`FabricView`, for tests of a policy: the estimate
    of each (prefill, decode) pair, whatever the request; a pair not given
    moves nothing (instances of one GPU, say)."""

    estimates: Mapping[tuple[int, int], HandoffEstimate] = field(default_factory=dict)

    def handoff(self, prefill: int, decode: int, req: Request) -> HandoffEstimate:
        return self.estimates.get((prefill, decode)) or HandoffEstimate(prefill, decode)

    def path_links(self, prefill: int, decode: int) -> tuple[LinkLoad, ...]:
        got = self.estimates.get((prefill, decode))
        return got.links if got is not None else ()


@dataclass(frozen=True, slots=True)
class Objectives:
    """The run's latency objectives, seconds (``inf`` when not set)."""

    ttft_s: float = float("inf")
    tpot_s: float = float("inf")


class ClusterView:
    """The instances of a cluster, the current time, the latency objectives and
    (with KV pools) where prompt prefixes are kept, as a policy sees them.

    ``rng`` is the policy's own random stream: a simulation passes the
    scheduler stream it spawns from the run's seed, so the same seed gives the
    same draws; a view built without one gets ``default_rng(0)``.

    ``fabric`` (a :class:`FabricView`) prices hand-offs between instances at
    the current link loads; a cluster without a topology (where KV moves at
    no cost) has none, and :meth:`handoff_estimate` is then None.
    """

    __slots__ = ("instances", "_now", "slo", "_pools", "rng", "fabric")

    def __init__(
        self,
        instances: Sequence[InstanceView],
        now: Callable[[], float] | float = 0.0,
        slo: Objectives | None = None,
        pools: Callable[[Request], dict[int, int]] | None = None,
        rng: np.random.Generator | None = None,
        fabric: FabricView | None = None,
    ):
        self.instances: tuple[InstanceView, ...] = tuple(instances)
        self.fabric = fabric
        self._now = now
        self.slo = slo or Objectives()
        self._pools = pools
        if rng is None:
            import numpy as np

            rng = np.random.default_rng(0)
        self.rng: np.random.Generator = rng

    def pool_prefix_tokens(self, req: Request) -> dict[int, int]:
        """Node -> prompt tokens of ``req`` whose KV that node's pool holds
        (nodes holding none left out; empty without KV pools)."""
        return self._pools(req) if self._pools is not None else {}

    def handoff_estimate(self, prefill: int, decode: int, req: Request) -> HandoffEstimate | None:
        """What moving ``req``'s KV from instance ``prefill`` to ``decode``
        would cost if it started now (:class:`HandoffEstimate`), from the
        network model itself; None without a fabric. O(path length) a call,
        however many flows are in flight."""
        return self.fabric.handoff(prefill, decode, req) if self.fabric is not None else None

    def path_links(self, prefill: int, decode: int) -> tuple[LinkLoad, ...]:
        """Each link a hand-off from ``prefill`` to ``decode`` would take, with
        its load now (empty without a fabric, or when nothing would cross)."""
        return self.fabric.path_links(prefill, decode) if self.fabric is not None else ()

    @property
    def now(self) -> float:
        return self._now() if callable(self._now) else self._now

    def of_role(self, *roles: Role) -> tuple[InstanceView, ...]:
        """The instances of ``roles`` that take new work: up, and not starting,
        draining or stopped (a view without ``accepting`` takes it when up)."""
        return tuple(i for i in self.instances if i.role in roles and _accepting(i))

    def up(self) -> tuple[InstanceView, ...]:
        """The instances that take new work (see :meth:`of_role`)."""
        return tuple(i for i in self.instances if _accepting(i))

    def in_state(self, *states: str) -> tuple[InstanceView, ...]:
        """The instances in ``states`` (:data:`INSTANCE_STATES`; a view
        without ``state`` is ``serving``)."""
        return tuple(i for i in self.instances if getattr(i, "state", "serving") in states)

    def grow(self, instance: InstanceView) -> None:
        """A new instance's view, added by the cluster's build as it makes the
        instance (at the start, or scaling): the list grows, ids stay in order.
        A policy reads the view; it never grows it."""
        assert instance.id == len(self.instances)
        self.instances = (*self.instances, instance)

    def __getitem__(self, instance_id: int) -> InstanceView:
        return self.instances[instance_id]

    def __len__(self) -> int:
        return len(self.instances)


def _accepting(i: InstanceView) -> bool:
    accepting = getattr(i, "accepting", None)
    return bool(getattr(i, "up", True) if accepting is None else accepting)


# -- the protocols -------------------------------------------------------------------
@runtime_checkable
class Scheduler(Protocol):
    """The required hooks: ``setup`` once, before the first request, and
    ``route`` at each arrival. The optional ones are :class:`PicksDecode` and
    :class:`Ticks`."""

    def setup(self, cluster: ClusterView) -> Plan: ...

    def route(self, req: Request, view: ClusterView) -> Route | Reject: ...


@runtime_checkable
class PicksDecode(Protocol):
    """Optional hook: the decode instance of ``req``, asked when its prefill is
    done and ``route`` left ``decode`` open."""

    def pick_decode(self, req: Request, view: ClusterView) -> int: ...


@runtime_checkable
class Ticks(Protocol):
    """Optional hook: periodic actions (:class:`SetRole`, :class:`AddInstance`,
    :class:`RemoveInstance`), asked every ``tick_s`` seconds (> 0) from the
    start of the run while requests remain to arrive or to finish.

    A policy whose ``tick`` depends only on what the view shows (and on its
    own state, changed only by its hooks), not on ``view.now`` nor on how many
    ticks came before, may say so with a ``tick_on_change`` attribute set to
    True (:func:`ticks_on_change`): after a tick that returned nothing, the
    control loop then skips the ticks at which the cluster cannot have
    changed. The ticks that are left fall on the same ``tick_s`` grid and
    decide the same. Without it (an interval-counting planner, say), every
    tick is called.

    Such a policy may also have a ``tick_watch(view)`` method, asked right
    after a tick that returned nothing (:func:`watch_hook`): a
    :class:`TickWatch` of the thresholds its decision turns on, or None when
    it cannot name them. The control loop then asks no tick until one of those
    comparisons changes its truth value, or an instance changes role, goes
    down or up, or changes state; the next tick is the first one of the grid
    at or after that change, so the ticks skipped are exactly ones that would
    have returned nothing."""

    tick_s: float

    def tick(self, view: ClusterView) -> Sequence[Action]: ...


@dataclass(frozen=True, slots=True)
class TickWatch:
    """What a tick that returned nothing turns on (see :class:`Ticks`): it
    would return nothing again while, for each instance id here,
    ``queue_tokens > queue_tokens_above[id]`` and ``free_blocks <=
    free_blocks_at_most[id]`` keep the truth values they have now, and no
    instance changes role, health or state."""

    queue_tokens_above: Mapping[int, int] = field(default_factory=dict)
    free_blocks_at_most: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """One event of the spec's ``events:`` timeline, as it takes effect:
    ``action`` fail | recover | degrade | restore, ``target`` instance | node |
    gpu | link and ``name`` its id (a link: ``"src -> dst"``), ``factor`` the
    degradation (1 otherwise), and ``instances`` the instances it changed."""

    time_s: float
    action: str
    target: str
    name: int | str
    factor: float = 1.0
    instances: tuple[int, ...] = ()


@runtime_checkable
class OnEvent(Protocol):
    """Optional hook: told of each ``events:`` entry after it took effect
    (the view shows the instances' new health); what it returns is ignored."""

    def on_event(self, event: FaultEvent, view: ClusterView) -> None: ...


def event_hook(scheduler: object) -> OnEvent | None:
    return scheduler if isinstance(scheduler, OnEvent) else None


def decode_hook(scheduler: object) -> PicksDecode | None:
    """``scheduler`` as a :class:`PicksDecode` when it has ``pick_decode``, else None."""
    return scheduler if isinstance(scheduler, PicksDecode) else None


def tick_hook(scheduler: object, name: str) -> Ticks | None:
    """``scheduler`` as a :class:`Ticks` when it has a ``tick`` hook, else None.

    A policy with ``tick`` but no usable ``tick_s`` is an error, not a policy
    that never ticks; ``name`` is how the message calls it.
    """
    if not callable(getattr(scheduler, "tick", None)):
        return None
    tick_s = getattr(scheduler, "tick_s", None)
    if not is_number(tick_s) or not math.isfinite(tick_s) or tick_s <= 0:
        raise SpecError(
            f"scheduler {name!r} has tick() but tick_s is {tick_s!r}; "
            "expected the seconds between ticks, > 0"
        )
    assert isinstance(scheduler, Ticks)
    return scheduler


def ticks_on_change(scheduler: object) -> bool:
    """Whether the policy's ``tick`` reads only the cluster's state, so that a
    tick that returned nothing need not be repeated until the state changes
    (its ``tick_on_change`` attribute is True; see :class:`Ticks`)."""
    return getattr(scheduler, "tick_on_change", False) is True


def watch_hook(scheduler: object) -> Callable[[ClusterView], TickWatch | None] | None:
    """The policy's ``tick_watch`` (see :class:`Ticks`) when it ticks on
    change and has one, else None."""
    fn = getattr(scheduler, "tick_watch", None)
    return fn if callable(fn) and ticks_on_change(scheduler) else None


# -- helpers for policies ------------------------------------------------------------
def require_split(cluster: ClusterView, scheduler: str, hint: str = "") -> None:
    """The setup check of a policy that serves the two phases apart: raise
    :class:`~twin.errors.SpecError` unless ``cluster`` has prefill and decode
    instances. ``scheduler`` is the policy's registered name; ``hint`` ends
    the message (a pointer to a tool, say)."""
    if cluster.of_role("prefill") and cluster.of_role("decode"):
        return
    roles = " and ".join(sorted({i.role for i in cluster.instances})) or "no"
    raise SpecError(
        f"scheduler {scheduler!r} needs prefill and decode instances, but the cluster has "
        f"only {roles} instances; give cluster.prefill and cluster.decode{hint}"
    )


def duration_s(value: float | str, name: str, *, positive: bool = False) -> float:
    """Seconds from the policy parameter ``name``, a number of seconds or a
    duration string (``0.05``, ``"50 ms"``). ``ValueError`` naming the
    parameter when it is not a duration, is negative or, with ``positive``, zero."""
    try:
        s = parse_duration(value)
    except UnitError as e:  # the unit parser says what was wrong
        raise ValueError(f"{name}: {e}") from None
    if s < 0 or (positive and s == 0):
        raise ValueError(f"{name}: {value!r} must be {'>' if positive else '>='} 0")
    return s


# -- the registry --------------------------------------------------------------------
_registry: dict[str, type[Scheduler]] = {}
_entry_points_loaded = False

S = TypeVar("S", bound=Scheduler)


def register(name: str) -> Callable[[type[S]], type[S]]:
    """Class decorator: make the policy available as ``scheduler: {name: ...}``.

    The class must be a :class:`Scheduler` (mypy checks it at the decorator).
    A second registration of the same name by another class is an error.
    """

    def deco(cls: type[S]) -> type[S]:
        _add(name, cls)
        return cls

    return deco


def _add(name: str, cls: type[Scheduler]) -> None:
    other = _registry.get(name)
    if other is not None and other is not cls and _qualname(other) != _qualname(cls):
        raise DuplicateRegistrationError(
            f"scheduler {name!r} is already registered by {_qualname(other)}; "
            f"{_qualname(cls)} cannot take the name"
        )
    _registry[name] = cls


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def entry_points(group: str) -> Any:
    """:func:`importlib.metadata.entry_points`, imported on the first lookup:
    the module costs tens of milliseconds that a ``twin`` call without a
    policy lookup does not pay."""
    from importlib.metadata import entry_points as found

    return found(group=group)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    load_plugins(ENTRY_POINT_GROUP, "scheduler", _registry, _add)


def load_plugins(
    group: str, kind: str, known: Mapping[str, type], add: Callable[[str, Any], None]
) -> None:
    """Register with ``add`` each class of entry-point ``group`` whose name is
    not ``known`` yet; one that fails to load is a :class:`PluginError`
    naming the ``kind`` (a scheduler, a queue policy) and the entry."""
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            obj = ep.load()
        except Exception as e:  # a broken plugin must not hide behind a traceback
            raise PluginError(
                f"{kind} entry point {ep.name!r} ({ep.value}) failed to load: "
                f"{type(e).__name__}: {e}"
            ) from e
        if isinstance(obj, type) and ep.name not in known:
            add(ep.name, obj)


def scheduler_names() -> list[str]:
    """Every registered policy name, sorted."""
    _load_entry_points()
    return sorted(_registry)


def get_scheduler(name: str) -> type[Scheduler]:
    """The policy class registered as ``name``; a miss suggests close names."""
    _load_entry_points()
    try:
        return _registry[name]
    except KeyError:
        raise UnknownSchedulerError(name, _registry) from None


def build_scheduler(name: str, params: Mapping[str, Any], where: str = "scheduler") -> Scheduler:
    """Instantiate policy ``name`` with ``params``, checking the names of the
    parameters against the policy's dataclass fields. A policy refuses a value
    with a ``ValueError("<param>: ...")``; the message then names
    ``<where>.<param>``."""
    return instantiate(get_scheduler(name), "scheduler", name, params, where)


C = TypeVar("C")


def instantiate(cls: type[C], kind: str, name: str, params: Mapping[str, Any], where: str) -> C:
    """``cls(**params)``, the ``kind`` registered as ``name`` (a scheduler, a
    queue policy), with the names of the parameters checked against its
    dataclass fields; an error names ``<where>.<param>``."""
    if dataclasses.is_dataclass(cls):
        known = [f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]
        for key in params:
            if key not in known:
                raise SpecError(
                    f"{where}.{key}: unknown parameter of {kind} {name!r}; "
                    f"expected one of {', '.join(known) or '(none)'}"
                )
    try:
        return cls(**params)
    except (TypeError, ValueError) as e:
        key, sep, rest = str(e).partition(": ")
        if sep and key in params:
            raise SpecError(f"{where}.{key}: {rest}") from None
        raise SpecError(f"{where}: {kind} {name!r}: {e}") from None


def describe(cls: type) -> str:
    """First line of a policy's docstring."""
    doc = (cls.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""
