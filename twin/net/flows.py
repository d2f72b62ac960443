"""Flow-level network: transfers as flows sharing directed links max-min fairly.

A transfer (:meth:`Network.start`) is one or more flows, each a number of bytes
on a path of directed links (one flow per TP shard, or per NIC when several are
aggregated). The network knows nothing of how the graph is built: a link is
anything with ``src``, ``dst``, ``latency_s`` and ``usable_bytes_s`` (capacity
times protocol efficiency), see :class:`LinkLike`. Links are identified by
``(src, dst)``: two links with the same ends and different capacities are a
:class:`~twin.errors.SpecError`. A link with ``hop`` False is a capacity shared
by every flow that lists it without being a step along the path (a node's NIC
ceiling, ``twin.net.topology``): it may sit anywhere in the path, and the path
must chain over its other links.

Semantics:

- Rates. Active flows share links max-min fairly: progressive filling over the
  directed links on their paths, each flow also held to its own cap. Rates are
  recomputed whenever a flow starts, finishes sending, or a cap changes, and
  are constant in between, so the next flow to finish is known exactly. One
  SimPy event is scheduled for that instant; a recomputation bumps a
  generation counter, and an event from an older generation is ignored (SimPy
  events cannot be cancelled). No event per byte or packet.
- Completion. A flow's last byte leaves when its bytes, integrated over its
  rates, are sent; it is delivered its path latency (sum of link latencies)
  later. The latency does not hold bandwidth: a flow stops sharing links when
  its last byte leaves. A transfer is done (``Transfer.done`` succeeds with
  the transfer) when every flow is delivered. One flow on an idle path thus
  takes exactly ``latency + size / min(bottleneck usable, cap)``
  (:meth:`Network.idle_time_s`).
- Edge cases. A zero-size flow (at most 1e-6 bytes) is delivered after its
  path latency. A transfer with no flows is done at once. A flow with an
  empty path is local: instant when uncapped, ``size / cap`` when capped. A
  cap of 0 stalls a flow until :meth:`Transfer.set_cap` lifts it.
- Determinism. Flows are kept in creation order, links in first-use order
  (reports sort them by ``(src, dst)``); nothing iterates a set.
- Floats. Remaining bytes are decremented by rate x elapsed. A flow is done
  at its computed finish instant, or when ``|remaining| <= 1e-9 x size`` (or
  below 1e-6 bytes), so none lingers on rounding dust. ``bytes_sent`` is the
  integral of the rates and so checks the bookkeeping against
  ``bytes_delivered`` (sizes of delivered flows).

NOTE: fluid flows, no packets: no slow start, no congestion-control dynamics,
no head-of-line blocking; fair sharing is the ideal that RDMA and TCP
approach, so contended transfers come out somewhat optimistic.

Progressive filling costs O(k x path length x rounds) for k active flows, at
most k rounds; fine for tens to hundreds of concurrent flows (about 1.5 ms a
re-share with 400 flows on a two-tier fabric).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol, TypeVar

import simpy

from twin._clock import at
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


K = TypeVar("K", bound=Hashable)


def max_min_rates(
    paths: Seq[Seq[K]], caps: Seq[float | None], capacity: dict[K, float]
) -> list[float]:
    """Max-min fair rates by progressive filling.

    Flow ``i`` crosses links ``paths[i]`` and may not exceed ``caps[i]``
    (None: uncapped). All unfrozen flows rise together to the level at which a
    link fills or a cap is met; the flows held there freeze; repeat. A flow
    with no links and no cap gets ``inf``. Every round freezes at least one
    flow, so there are at most ``len(paths)`` rounds.
    """
    n = len(paths)
    rate = [0.0] * n
    frozen = [False] * n
    users: dict[K, list[int]] = {}
    for i, p in enumerate(paths):
        for k in p:
            users.setdefault(k, []).append(i)
    left = {k: capacity[k] for k in users}  # capacity not taken by frozen flows
    count = {k: len(v) for k, v in users.items()}  # unfrozen flows on the link
    open_links = list(users)  # links with unfrozen flows
    cap_of = [math.inf if c is None else c for c in caps]
    capped = [i for i in range(n) if cap_of[i] < math.inf]  # ... unfrozen
    todo = n
    while todo:
        level = math.inf
        for k in open_links:
            share = left[k] / count[k]
            if share < level:
                level = share
        for i in capped:
            if cap_of[i] < level:
                level = cap_of[i]
        if level == math.inf:  # only flows with neither links nor caps remain
            for i in range(n):
                if not frozen[i]:
                    rate[i] = math.inf
            break
        level = max(level, 0.0)  # rounding may leave a link a hair below zero
        hold: list[int] = []
        for k in open_links:
            # A link within rounding of the level is full too: freeze its flows.
            if left[k] / count[k] <= level * (1.0 + 1e-12):
                hold.extend(i for i in users[k] if not frozen[i])
        hold.extend(i for i in capped if cap_of[i] <= level)
        for i in hold:
            if frozen[i]:
                continue  # on two full links
            frozen[i] = True
            rate[i] = level
            todo -= 1
            for k in paths[i]:
                left[k] -= level
                count[k] -= 1
        open_links = [k for k in open_links if count[k]]
        capped = [i for i in capped if not frozen[i]]
    return rate


def _spread(series: dict[int, float], t0: float, t1: float, rate: float, width: float) -> None:
    """Add ``rate`` x time over ``[t0, t1)`` to the buckets of ``width`` it covers."""
    while t0 < t1:
        b = math.floor(t0 / width)
        end = min(t1, (b + 1) * width)
        if end <= t0:  # float edge: t0 sits on a boundary
            b += 1
            end = min(t1, (b + 1) * width)
        series[b] = series.get(b, 0.0) + rate * (end - t0)
        t0 = end


class _LinkState:
    __slots__ = ("src", "dst", "base", "usable", "bytes", "busy_s", "load", "peak", "series")

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


class _Flow:
    __slots__ = (
        "fid",
        "transfer",
        "index",
        "keys",
        "size",
        "remaining",
        "cap",
        "rate",
        "finish_at",
        "latency",
        "tol",
        "sending",
        "path",
    )

    def __init__(self, fid: int, transfer: Transfer, index: int, spec: FlowSpec) -> None:
        self.fid = fid
        self.transfer = transfer
        self.index = index
        self.keys = tuple((link.src, link.dst) for link in spec.path)
        self.size = float(spec.size_bytes)
        self.remaining = self.size
        self.cap = spec.rate_cap_bytes_s
        self.rate = 0.0
        self.finish_at = math.inf
        self.latency = spec.latency_s
        self.tol = max(REL_DONE * self.size, ABS_DONE)
        self.sending = True
        self.path: tuple[LinkLike, ...] | None = spec.path


class Transfer:
    """A set of flows started together; ``done`` succeeds (with the transfer)
    when the last of them is delivered, at ``end_s``."""

    __slots__ = (
        "id", "label", "done", "start_s", "end_s", "size_bytes", "cancelled", "_net", "_flows",
        "_left",
    )  # fmt: skip

    def __init__(self, net: Network, tid: int, label: str, size_bytes: float) -> None:
        self.id = tid
        self.label = label
        self.done: simpy.Event = net.env.event()
        self.start_s: float = net.env.now
        self.end_s: float | None = None
        self.size_bytes = size_bytes
        self.cancelled = False  # stopped by Network.cancel: ``done`` never succeeds
        self._net = net
        self._flows: list[_Flow] = []
        self._left = 0  # flows not yet delivered

    @property
    def flow_ends(self) -> tuple[tuple[str, str], ...]:
        """(first vertex, last vertex) of each flow's path, in flow order (a
        local flow, with no links, is left out)."""
        return tuple((f.keys[0][0], f.keys[-1][1]) for f in self._flows if f.keys)

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


class Network:
    """The flows in flight on one environment and the links they have used."""

    def __init__(
        self,
        env: simpy.Environment,
        series_bucket_s: float | None = None,
        observer: TransferObserver | None = None,
    ) -> None:
        """``series_bucket_s``: also keep each link's bytes per time bucket of
        this width (seconds), for utilization over time. ``observer``: told of
        each transfer as it starts and when it is done."""
        if series_bucket_s is not None and not series_bucket_s > 0.0:
            raise SpecError(f"series bucket (={series_bucket_s!r} s) must be > 0")
        self.env = env
        self.series_bucket_s = series_bucket_s
        self.observer = observer
        self._flows: dict[int, _Flow] = {}  # sending, in creation order
        self._links: dict[tuple[str, str], _LinkState] = {}
        self._factors: dict[tuple[str, str], float] = {}  # degraded links: (src, dst) -> factor
        self._down: set[tuple[str, str]] = set()  # failed links: they carry nothing
        # (first vertex, last vertex, failed links) -> another path for a flow
        # that avoids them, or None; given by whoever knows the topology.
        self.reroute: Callable[[str, str, frozenset], tuple[LinkLike, ...] | None] | None = None
        self._used: list[_LinkState] = []  # links under the flows now sending
        self._next_transfer = 0
        self._next_flow = 0
        self._gen = 0
        self._last = env.now  # rates are integrated up to here
        self._sent = 0.0
        self._first_start: float | None = None
        self._last_end: float | None = None
        self._in_flight = 0  # transfers not done
        self.bytes_delivered = 0.0
        self.max_link_load_ratio = 0.0

    # -- input -------------------------------------------------------------------
    def start(self, flows: Seq[FlowSpec], label: str = "") -> Transfer:
        """Start a transfer of ``flows`` now; they share links from this instant."""
        flows = tuple(flows)
        for spec in flows:
            for link in spec.path:
                self._register(link)
        now = self.env.now
        t = Transfer(self, self._next_transfer, label, sum(f.size_bytes for f in flows))
        self._next_transfer += 1
        if self._first_start is None:
            self._first_start = now
        self._in_flight += 1
        if not flows:
            if self.observer is not None:
                self.observer.transfer_started(now, t)
            self._finish_transfer(t)
            return t
        self._advance(now)
        if self._down:
            flows = tuple(
                spec
                if (path := self._rerouted(spec.path)) is spec.path
                else FlowSpec(path, spec.size_bytes, spec.rate_cap_bytes_s)
                for spec in flows
            )
            for spec in flows:
                for link in spec.path:
                    self._register(link)
        for i, spec in enumerate(flows):
            f = _Flow(self._next_flow, t, i, spec)
            self._next_flow += 1
            t._flows.append(f)
            t._left += 1
            if f.size <= f.tol:
                self._drain(f, now)
            else:
                self._flows[f.fid] = f
        if self.observer is not None:
            self.observer.transfer_started(now, t)
        self._settle(now)
        return t

    def cancel(self, t: Transfer) -> None:
        """Stop transfer ``t`` now (an end of it failed): its flows stop sending
        and release their share of every link; bytes already in flight are
        dropped; ``t.done`` never succeeds."""
        if t.cancelled or t.end_s is not None:
            return
        now = self.env.now
        self._advance(now)
        t.cancelled = True
        for f in t._flows:
            f.sending = False
            self._flows.pop(f.fid, None)
        t.end_s = now
        self._in_flight -= 1
        self._last_end = now if self._last_end is None else max(self._last_end, now)
        if self.observer is not None:
            self.observer.transfer_ended(now, t)
        self._reshare(now)

    def _usable(self, s: _LinkState) -> float:
        key = (s.src, s.dst)
        if key in self._down:
            return 0.0
        f = self._factors.get(key, 1.0)
        return s.base if f == 1.0 else s.base * f

    def _rerouted(self, path: tuple[LinkLike, ...]) -> tuple[LinkLike, ...]:
        """``path``, or another that avoids the failed links when it crosses one
        and there is one (else it waits on ``path`` for the repair)."""
        if not self._down or self.reroute is None:
            return path
        keys = [(ln.src, ln.dst) for ln in path]
        if not any(k in self._down for k in keys):
            return path
        hops = [ln for ln in path if getattr(ln, "hop", True)]
        new = self.reroute(hops[0].src, hops[-1].dst, frozenset(self._down))
        return path if new is None else new

    def fail_link(self, src: str, dst: str) -> None:
        """Link ``src -> dst`` fails now: each flow on it moves to another path
        when there is one, else waits (at rate 0) for the repair."""
        self._set_down((src, dst), True)

    def recover_link(self, src: str, dst: str) -> None:
        """Link ``src -> dst`` carries again; the flows waiting on it resume."""
        self._set_down((src, dst), False)

    def _set_down(self, key: tuple[str, str], down: bool) -> None:
        now = self.env.now
        self._advance(now)
        if down:
            self._down.add(key)
        else:
            self._down.discard(key)
        s = self._links.get(key)
        if s is not None:
            s.usable = self._usable(s)
        if down:
            for f in self._flows.values():
                if key in f.keys and f.path is not None:
                    new = self._rerouted(f.path)
                    if new is not f.path:
                        for link in new:
                            self._register(link)
                        f.path = new
                        f.keys = tuple((ln.src, ln.dst) for ln in new)
                        f.latency = sum(ln.latency_s for ln in new)
        self._settle(now)

    def waits(self, t: Transfer) -> bool:
        """Whether a flow of ``t`` still sending waits on a failed link."""
        if not self._down or t.cancelled or t.end_s is not None:
            return False
        return any(k in self._down for f in t._flows if f.sending for k in f.keys)

    @property
    def stuck(self) -> list[Transfer]:
        """Transfers with a flow that waits on a failed link, in start order."""
        out: dict[int, Transfer] = {}
        for f in self._flows.values():
            if any(k in self._down for k in f.keys):
                out.setdefault(f.transfer.id, f.transfer)
        return [out[k] for k in sorted(out)]

    def scale_link(self, src: str, dst: str, factor: float) -> None:
        """From now on link ``src -> dst`` carries ``factor`` x its capacity
        (1 restores it); the flows on it are re-shared at once."""
        key = (src, dst)
        if factor == 1.0:
            self._factors.pop(key, None)
        else:
            self._factors[key] = factor
        s = self._links.get(key)
        if s is None:
            return  # applied when a flow first takes it
        now = self.env.now
        self._advance(now)
        s.usable = self._usable(s)
        self._settle(now)

    def idle_time_s(self, flows: Seq[FlowSpec]) -> float:
        """Time ``flows`` would take on an idle network (0 for no flows)."""
        return max((f.idle_time_s for f in flows), default=0.0)

    # -- statistics ------------------------------------------------------------------
    @property
    def bytes_sent(self) -> float:
        """Bytes that have left their senders: the integral of the flow rates."""
        dt = self.env.now - self._last
        return self._sent + dt * sum(f.rate for f in self._flows.values())

    def rates(self) -> dict[tuple[int, int], float]:
        """Current rate (bytes/s) of every flow still sending, keyed by
        (transfer id, flow index), in creation order."""
        return {(f.transfer.id, f.index): f.rate for f in self._flows.values()}

    def link_stats(self) -> list[dict]:
        """Per directed link that carried traffic, sorted by (src, dst): bytes,
        busy_s (time with a positive rate), peak_rate_bytes_s, and utilization =
        bytes / (usable x span), span from the first transfer's start to the
        last one's end (or now, while transfers are in flight)."""
        now = self.env.now
        dt = now - self._last
        end = self._last_end if self._in_flight == 0 and self._last_end is not None else now
        span = end - self._first_start if self._first_start is not None else 0.0
        out = []
        for key in sorted(self._links):
            s = self._links[key]
            b = s.bytes + s.load * dt
            if b <= 0.0:
                continue
            busy = s.busy_s + (dt if s.load > 0.0 else 0.0)
            out.append(
                {
                    "src": s.src,
                    "dst": s.dst,
                    "usable_bytes_s": s.base,
                    "bytes": b,
                    "busy_s": busy,
                    "utilization": b / (s.base * span) if span > 0.0 else 0.0,
                    "peak_rate_bytes_s": s.peak,
                }
            )
            if self.series_bucket_s is not None:
                w = self.series_bucket_s
                series = dict(s.series)
                if s.load > 0.0 and dt > 0.0:
                    _spread(series, self._last, now, s.load, w)
                out[-1]["series"] = [
                    [b * w, series[b], series[b] / (s.base * w)] for b in sorted(series)
                ]
        return out

    # -- sharing ---------------------------------------------------------------------
    def _register(self, link: LinkLike) -> None:
        key = (link.src, link.dst)
        s = self._links.get(key)
        if s is None:
            s = self._links[key] = _LinkState(link, self._factors.get(key, 1.0))
            if key in self._down:
                s.usable = 0.0
        elif s.base != link.usable_bytes_s:
            raise SpecError(
                f"link {_name(link)}: usable capacity {link.usable_bytes_s!r} bytes/s, but "
                f"this network already has {s.usable!r} for {_name(link)}; "
                "links are identified by (src, dst)"
            )

    def _set_cap(self, t: Transfer, cap: float | None) -> None:
        now = self.env.now
        self._advance(now)
        for f in t._flows:
            if f.sending:
                f.cap = cap
        self._settle(now)

    def _advance(self, now: float) -> None:
        """Integrate the current rates from the last update to ``now``."""
        dt = now - self._last
        self._last = now
        if dt <= 0.0:
            return
        links = self._links
        for f in self._flows.values():
            r = f.rate
            if r <= 0.0:
                continue
            moved = r * dt
            f.remaining -= moved
            self._sent += moved
            for k in f.keys:
                links[k].bytes += moved
        w = self.series_bucket_s
        for s in self._used:
            if s.load > 0.0:
                s.busy_s += dt
                if w is not None:
                    _spread(s.series, now - dt, now, s.load, w)

    def _settle(self, now: float) -> None:
        """Retire the flows whose last byte has left, then re-share and arm the
        one event for the next such instant."""
        done = []
        for f in self._flows.values():
            if not f.keys and f.cap is None:  # local and uncapped: instant
                self._sent += f.remaining
                done.append(f)
            elif f.finish_at <= now or f.remaining <= f.tol:
                done.append(f)
        for f in done:
            del self._flows[f.fid]
            self._drain(f, now)
        self._reshare(now)

    def _reshare(self, now: float) -> None:
        self._gen += 1
        for s in self._used:
            s.load = 0.0
        flows = list(self._flows.values())
        links = self._links
        # Only the links under active flows: the work does not grow with the graph.
        capacity = {k: links[k].usable for f in flows for k in f.keys}
        self._used = [links[k] for k in capacity]
        if not flows:
            return
        rates = max_min_rates([f.keys for f in flows], [f.cap for f in flows], capacity)
        earliest = math.inf
        for f, r in zip(flows, rates, strict=True):
            # local uncapped flows were drained in _settle, so r is finite
            f.rate = r
            f.finish_at = now + f.remaining / r if r > 0.0 else math.inf
            earliest = min(earliest, f.finish_at)
            for k in f.keys:
                links[k].load += r
        for s in self._used:
            if s.load > 0.0:
                s.peak = max(s.peak, s.load)
                ratio = s.load / s.usable if s.usable > 0.0 else math.inf
                self.max_link_load_ratio = max(self.max_link_load_ratio, ratio)
        if earliest < math.inf:
            gen = self._gen
            at(self.env, earliest, lambda _ev: self._on_finish(gen))

    def _on_finish(self, gen: int) -> None:
        if gen != self._gen:
            return  # made stale by a later re-share
        now = self.env.now
        self._advance(now)
        self._settle(now)

    # -- delivery --------------------------------------------------------------------
    def _drain(self, f: _Flow, now: float) -> None:
        """``f``'s last byte has left; it arrives ``f.latency`` later."""
        f.sending = False
        f.rate = 0.0
        f.remaining = 0.0
        at(self.env, now + f.latency, lambda _ev: self._deliver(f))

    def _deliver(self, f: _Flow) -> None:
        t = f.transfer
        if t.cancelled:
            return
        self.bytes_delivered += f.size
        t._left -= 1
        if t._left == 0:
            self._finish_transfer(t)

    def _finish_transfer(self, t: Transfer) -> None:
        now = self.env.now
        t.end_s = now
        self._in_flight -= 1
        self._last_end = now if self._last_end is None else max(self._last_end, now)
        if self.observer is not None:
            self.observer.transfer_ended(now, t)
        t.done.succeed(t)
