"""What the flow-level network moves: a :class:`FlowSpec` (bytes on a path of
:class:`LinkLike` links, an optional rate cap), a :class:`Transfer` (flows started
together, done when the last is delivered), and the network's own records of a
flow group and a link (``_Flow``, ``_LinkState``); :mod:`twin.net.flows` holds
the :class:`~twin.net.flows.Network` that shares the links among them."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any, Protocol

import simpy

from twin.errors import SpecError

REL_DONE = 1e-9  # remaining / size below which a flow is done
ABS_DONE = 1e-6  # bytes


class LinkLike(Protocol):
    """A directed link as the network sees it (``twin.net.topology.Link`` fits).
    An optional ``hop`` attribute, False for a shared cap that is not a step
    along the path, is read with ``getattr`` (default True)."""

    @property
    def src(self) -> str: ...

    @property
    def dst(self) -> str: ...

    @property
    def latency_s(self) -> float: ...

    @property
    def usable_bytes_s(self) -> float:
        """Capacity times protocol efficiency, bytes/s."""
        ...


def _name(link: LinkLike) -> str:
    return f"{link.src} -> {link.dst}"


def _check_cap(cap: float | None, where: str) -> None:
    if cap is not None and not cap >= 0.0:  # NaN fails too
        raise SpecError(f"{where}: rate_cap_bytes_s={cap!r} must be >= 0 or None")


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """``size_bytes`` to move along ``path`` (links chained src to dst), at most
    ``rate_cap_bytes_s`` (None: uncapped)."""

    path: tuple[LinkLike, ...]
    size_bytes: float
    rate_cap_bytes_s: float | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.size_bytes < math.inf):
            raise SpecError(f"flow: size_bytes={self.size_bytes!r} must be finite and >= 0")
        _check_cap(self.rate_cap_bytes_s, "flow")
        prev: LinkLike | None = None
        prev_i = -1
        for i, link in enumerate(self.path):
            u = link.usable_bytes_s
            if not (0.0 < u < math.inf):
                raise SpecError(
                    f"link {_name(link)}: usable capacity {u!r} bytes/s must be finite and > 0"
                )
            if not (0.0 <= link.latency_s < math.inf):
                raise SpecError(
                    f"link {_name(link)}: latency_s={link.latency_s!r} must be finite and >= 0"
                )
            if not getattr(link, "hop", True):
                continue  # a shared cap, not a step: the chain runs over the others
            if prev is not None and prev.dst != link.src:
                raise SpecError(
                    f"path does not chain: link {prev_i} ({_name(prev)}) ends at {prev.dst!r} "
                    f"but link {i} ({_name(link)}) starts at {link.src!r}"
                )
            prev, prev_i = link, i

    def resized(self, size_bytes: float) -> FlowSpec:
        """This flow with ``size_bytes`` instead (its path and cap are checked
        already, so only the size is)."""
        if not (0.0 <= size_bytes < math.inf):
            raise SpecError(f"flow: size_bytes={size_bytes!r} must be finite and >= 0")
        new = _new(FlowSpec)
        _put_path(new, self.path)
        _put_size(new, size_bytes)
        _put_cap(new, self.rate_cap_bytes_s)
        return new

    @property
    def latency_s(self) -> float:
        """Sum of the path's link latencies, s."""
        return sum(link.latency_s for link in self.path)

    @property
    def idle_time_s(self) -> float:
        """Time to deliver on an idle network: latency + size / min(bottleneck, cap)."""
        rate = min((link.usable_bytes_s for link in self.path), default=math.inf)
        if self.rate_cap_bytes_s is not None:
            rate = min(rate, self.rate_cap_bytes_s)
        if self.size_bytes <= ABS_DONE:  # dust counts as nothing, as in the network
            return self.latency_s
        if rate == 0.0:
            return math.inf
        return self.latency_s + self.size_bytes / rate


_new = object.__new__
# FlowSpec.resized: a frozen copy, made without re-checking its path (through
# the slots' own descriptors, as object.__setattr__ would set them)
_put_path = vars(FlowSpec)["path"].__set__
_put_size = vars(FlowSpec)["size_bytes"].__set__
_put_cap = vars(FlowSpec)["rate_cap_bytes_s"].__set__


_Key = tuple[str, str]
# flow indices, paths, each flow's link keys, all of them, each link's count,
# latency, and each distinct (key, link): the one group of a delayed start
_Shape = tuple[
    tuple[int, ...],
    list,
    list,
    tuple[_Key, ...],
    dict[_Key, int],
    float,
    tuple[tuple[_Key, Any], ...],
]


def _count(keys: tuple[_Key, ...]) -> dict[_Key, int]:
    """Each link of ``keys`` (in first-use order) and how many times it occurs."""
    out: dict[_Key, int] = {}
    for k in keys:
        out[k] = out.get(k, 0) + 1
    return out


class _LinkState:
    __slots__ = (
        "src", "dst", "base", "usable", "bytes", "busy_s", "load", "peak", "series", "flows",
    )  # fmt: skip

    def __init__(self, link: LinkLike, factor: float = 1.0) -> None:
        self.src = link.src
        self.dst = link.dst
        self.base = link.usable_bytes_s  # as built; ``usable`` is that x a degradation factor
        self.usable = self.base if factor == 1.0 else self.base * factor
        self.bytes = 0.0
        self.busy_s = 0.0
        self.load = 0.0  # sum of the current rates, bytes/s
        self.peak = 0.0
        self.series: dict[int, float] = {}  # time bucket -> bytes (when a bucket width is set)
        self.flows = 0  # flows sending on it, a group's once per member that crosses it


class _Flow:
    """A flow group: flows ``index`` of one transfer, started together with the
    same size, cap and path latency, each moving at ``rate``, so that they
    finish together with one event (see :class:`Network`). ``members`` holds
    each flow's links and ``paths`` its path; ``keys`` all of them, a link
    once per flow that crosses it, which is how max-min counts it."""

    __slots__ = (
        "fid", "transfer", "index", "members", "paths", "keys", "n", "size", "remaining", "cap",
        "rate", "finish_at", "latency", "tol", "sending", "plan", "mult", "states", "ustates",
        "flat",
    )  # fmt: skip

    def __init__(
        self,
        fid: int,
        transfer: Transfer,
        index: tuple[int, ...],
        paths: list[tuple[LinkLike, ...]],
        members: list[tuple[_Key, ...]],
        size: float,
        cap: float | None,
        latency: float,
        keys: tuple[_Key, ...] | None = None,
        mult: dict[_Key, int] | None = None,
    ) -> None:
        self.fid = fid  # the creation number of its first flow
        self.transfer = transfer
        self.index = index
        self.paths = paths
        self.members = members
        # (``keys`` and ``mult`` given: those of ``members``, never changed in place)
        self.keys = tuple(k for m in self.members for k in m) if keys is None else keys
        self.mult = _count(self.keys) if mult is None else mult
        self.n = len(index)
        self.size = size  # of each flow
        self.remaining = size
        self.cap = cap
        self.rate = 0.0
        self.finish_at = math.inf
        self.latency = latency
        self.tol = max(REL_DONE * size, ABS_DONE)
        self.sending = True
        self.plan = 0  # the delivery planned while it is alone (0: none), see Network
        # The link states of ``keys`` (one per key) and of ``mult`` (one per
        # link), and whether each link occurs once: set as it joins (Network._add).
        self.states: tuple[_LinkState, ...] = ()
        self.ustates: tuple[_LinkState, ...] = ()
        self.flat = True

    def split(self) -> list[_Flow]:
        """One group per flow, in the state this one is in."""
        out = []
        base = self.fid - self.index[0]
        for i, p, m in zip(self.index, self.paths, self.members, strict=True):
            f = _Flow(base + i, self.transfer, (i,), [p], [m], self.size, self.cap, self.latency)
            f.remaining, f.rate, f.finish_at = self.remaining, self.rate, self.finish_at
            out.append(f)
        return out


class _Net(Protocol):
    """What a transfer asks of its network (:class:`twin.net.flows.Network`)."""

    env: simpy.Environment

    def _set_cap(self, t: Transfer, cap: float | None) -> None: ...


class Transfer:
    """A set of flows started together; ``done`` succeeds (with the transfer)
    when the last of them is delivered, at ``end_s``, and the callbacks given
    to :meth:`then` are called then, in the same event."""

    __slots__ = (
        "id", "label", "_done", "_then", "start_s", "end_s", "size_bytes", "cancelled", "_net",
        "_flows", "_left", "_due", "_specs", "_guard", "_on_start", "_pre", "_seq", "_slot",
        "_probe", "_links",
    )  # fmt: skip

    def __init__(self, net: _Net, tid: int, label: str, size_bytes: float) -> None:
        self.id = tid
        self.label = label
        self._done: simpy.Event | None = None  # made when asked for
        self._then: list[Callable[[Transfer], None]] = []
        self.start_s: float = net.env.now
        self.end_s: float | None = None
        self.size_bytes = size_bytes
        self.cancelled = False  # stopped by Network.cancel: ``done`` never succeeds
        self._net = net
        self._flows: list[_Flow] = []  # its flow groups
        self._left = 0  # groups not yet delivered
        # A delayed start (Network.start with delay_s): when its flows start
        # (None once they have), what they are, what must still hold then,
        # who is told as they start, and the delivery planned ahead with its
        # plan number (None: none planned, or dropped).
        self._due: float | None = None
        self._specs: tuple[FlowSpec, ...] = ()
        self._guard: Callable[[], bool] | None = None
        self._on_start: Callable[[Transfer], None] | None = None
        self._pre: tuple[float, int] | None = None
        self._seq = 0  # delayed starts in the order they were asked for
        # where its instant's event goes among that instant's, if it needs one
        self._slot: Callable[[float, Callable[[simpy.Event], None]], None] | None = None
        # its group and rate as predicted, and whether its links were registered
        self._probe: tuple[_Flow, float, bool] | None = None
        self._links: set[_Key] | dict[_Key, int] | None = None  # the links it will take

    @property
    def done(self) -> simpy.Event:
        """Succeeds with the transfer when it is done (an event of its own:
        waiting on it costs one more SimPy event than :meth:`then`)."""
        if self._done is None:
            self._done = self._net.env.event()
            if self.end_s is not None and not self.cancelled:
                self._done.succeed(self)
        return self._done

    def then(self, callback: Callable[[Transfer], None]) -> None:
        """Call ``callback(transfer)`` when the transfer is done, at once as its
        last byte lands (or, if it is done already, in an event of its own now)."""
        if self.end_s is not None:
            if not self.cancelled:
                ev = self._net.env.event()
                ev.callbacks.append(lambda _ev: callback(self))  # type: ignore[union-attr]
                ev.succeed(self)
            return
        self._then.append(callback)

    @property
    def flow_ends(self) -> tuple[tuple[str, str], ...]:
        """(first vertex, last vertex) of each flow's path, in flow order (a
        local flow, with no links, is left out)."""
        ends = sorted((i, m) for f in self._flows for i, m in zip(f.index, f.members, strict=True))
        return tuple((m[0][0], m[-1][1]) for _, m in ends if m)

    def set_cap(self, cap_bytes_s: float | None) -> None:
        """Cap every flow still sending at ``cap_bytes_s`` from now (None lifts
        the cap), and re-share. Layer-wise streaming caps a KV transfer at the
        rate prefill produces KV, then lifts the cap when prefill ends."""
        _check_cap(cap_bytes_s, f"transfer {self.id} {self.label!r}")
        self._net._set_cap(self, cap_bytes_s)

    def __repr__(self) -> str:
        return (
            f"Transfer(id={self.id}, label={self.label!r}, "
            f"start_s={self.start_s}, end_s={self.end_s})"
        )


class TransferObserver(Protocol):
    """Told of each transfer as it starts and once it is done
    (``twin.serving.observer.Observer`` fits)."""

    def transfer_started(self, now: float, transfer: Transfer) -> None: ...

    def transfer_ended(self, now: float, transfer: Transfer) -> None: ...


def _groups(
    t: Transfer, base: int, flows: Seq[FlowSpec], routes: Seq[tuple[tuple[_Key, ...], float]]
) -> list[_Flow]:
    """The flow groups of ``flows`` (transfer ``t``, creation numbers from
    ``base``; ``routes``: each one's link keys and latency): flows with the
    same size, cap and path latency start as one (local flows, with no links,
    only with local ones), in order of first flow."""
    by: dict[tuple, list[int]] = {}
    for i, (spec, (keys, lat)) in enumerate(zip(flows, routes, strict=True)):
        by.setdefault((spec.size_bytes, spec.rate_cap_bytes_s, lat, bool(keys)), []).append(i)
    return [
        _Flow(
            base + idx[0],
            t,
            tuple(idx),
            [flows[i].path for i in idx],
            [routes[i][0] for i in idx],
            float(size),
            cap,
            lat,
        )  # fmt: skip
        for (size, cap, lat, _), idx in by.items()
    ]


def _alone(f: _Flow, on: dict[_Key, dict[int, _Flow]]) -> bool:
    """Whether group ``f`` is the only one sending on each of its links."""
    for k in f.mult:
        if len(on[k]) != 1:
            return False
    return True


def _meets(t: Transfer, keys: Iterable[_Key]) -> bool:
    """Whether delayed start ``t``'s flows cross a link of ``keys``."""
    mine = t._links
    if mine is None:
        mine = t._links = {(ln.src, ln.dst) for spec in t._specs for ln in spec.path}
    return not (mine.keys() if isinstance(mine, dict) else mine).isdisjoint(keys)
