"""Flow-level network: transfers as flows sharing directed links max-min fairly.

What moves is in :mod:`twin.net.transfer` (flows, transfers), the sharing in
:mod:`twin.net.maxmin` (progressive filling), the failed and degraded links in
:mod:`twin.net.linkfaults`; this module holds the :class:`Network` that keeps
the flows in flight and re-shares them as things change.

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
  recomputed whenever a flow starts, finishes sending, or a cap or a link
  changes, and are constant in between, so the next flow to finish is known
  exactly. A recomputation covers only the connected component of links and
  flows the change touches (flows that share a link, transitively): the
  others cannot change rate. One SimPy event is scheduled for the next
  instant a flow finishes; when a recomputation moves that instant it bumps a
  generation counter, and an event from an older generation is ignored (SimPy
  events cannot be cancelled). No event per byte or packet.
- Groups. The flows of one transfer with the same size, cap and path latency
  (the TP shards of a KV hand-off, each on its own NIC rail) move as one
  group: one entry in progressive filling, counted on each link once per flow
  that crosses it, and one event when they finish. A group stays whole only
  while flow-by-flow filling would give its flows one rate; at the first
  re-share where it would not (one rail degraded, or shared with another
  transfer), it is split into its flows for good. Rates are always those of
  the flows taken one by one.
- Lone groups. A group alone in its component (no other flow on its links)
  finishes without changing any other rate, so no event marks its finish:
  its delivery is planned as its rate is set, and it stops sending as time
  passes its finish (the next change brings the network up to then first, in
  order). Anything that joins its component re-shares it and the plan is
  dropped. A hand-off on an otherwise idle fabric thus costs one event. A
  group alone on its links is also kept out of the index of who sends on
  which link until something reaches one of them, so that such a hand-off
  costs no bookkeeping per link as it starts and ends (only the rates' and
  bytes' own arithmetic, the same operations in the same order).
- Completion. A flow's last byte leaves when its bytes, integrated over its
  rates, are sent; it is delivered its path latency (sum of link latencies)
  later. The latency does not hold bandwidth: a flow stops sharing links when
  its last byte leaves. A transfer is done (``Transfer.done`` succeeds with
  the transfer) when every flow is delivered. One flow on an idle path thus
  takes exactly ``latency + size / min(bottleneck usable, cap)``
  (:meth:`Network.idle_time_s`).
- Link figures. A link's bytes and busy time are the integral of the rates
  of the flows on it, and its load is their sum: a flow that leaves a link
  (moved to another path when a link fails, cancelled, or done sending)
  takes its rate off the link at that instant, and the flows still on it are
  re-shared without it.
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

Progressive filling costs O(k x path length x rounds) for k groups in the
component re-shared, at most k rounds; fine for tens to hundreds of
concurrent flows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable
from collections.abc import Sequence as Seq
from operator import attrgetter, is_

import simpy

from twin._clock import at, place
from twin.errors import SpecError
from twin.net.linkfaults import LinkFaults, Rerouter
from twin.net.maxmin import _fill, _fill_one
from twin.net.transfer import (
    FlowSpec,
    LinkLike,
    Transfer,
    TransferObserver,
    _alone,
    _count,
    _Flow,
    _groups,
    _Key,
    _LinkState,
    _meets,
    _name,
    _Shape,
)

_path_of = attrgetter("path")
_size_of = attrgetter("size_bytes")
_usable_of = attrgetter("usable")
_fid_of = attrgetter("fid")
_finish_of = attrgetter("finish_at")
_finish_fid_of = attrgetter("finish_at", "fid")
_due_seq_of = attrgetter("_due", "_seq")


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


class Network:
    """The flows in flight on one environment and the links they have used.

    The flows of a transfer that start with the same size, cap and path
    latency move as one flow group (the shards of a KV hand-off): one entry
    in the max-min computation, counted once on each link per flow that
    crosses it, and one event when they finish. A group that max-min would
    part (its flows' paths fill at different levels: a degraded link under
    one of them) is split into its flows from then on, so rates are always
    those of flow-by-flow sharing. A change (a start, a finish, a cap, a link
    failing, degraded or restored) re-shares only the connected component of
    links and flows it touches (:func:`max_min_rates`).
    """

    def __init__(
        self,
        env: simpy.Environment,
        series_bucket_s: float | None = None,
        observer: TransferObserver | None = None,
        reroute: Rerouter | None = None,
    ) -> None:
        """``series_bucket_s``: also keep each link's bytes per time bucket of
        this width (seconds), for utilization over time. ``observer``: told of
        each transfer as it starts and when it is done. ``reroute``: given by
        whoever knows the topology, (first vertex, last vertex, failed links)
        -> another path for a flow that avoids them, or None."""
        if series_bucket_s is not None and not series_bucket_s > 0.0:
            raise SpecError(f"series bucket (={series_bucket_s!r} s) must be > 0")
        self.env = env
        self.series_bucket_s = series_bucket_s
        self.observer = observer
        self._flows: dict[int, _Flow] = {}  # sending groups, in creation order
        self._on_link: dict[_Key, dict[int, _Flow]] = {}  # link -> sending groups on it
        self._busy: dict[_Key, _LinkState] = {}  # the links of _on_link, in its order
        # Sending groups alone on their links (no other group on any of them),
        # by fid: kept out of _on_link until something reaches their links
        # (_wake), so that a lone transfer costs no bookkeeping per link.
        self._parked: dict[int, _Flow] = {}
        # id of a keys tuple -> (the tuple, its link states, those of its
        # distinct links, whether each link occurs once); states are never replaced
        self._states: dict[int, tuple[tuple[_Key, ...], tuple, tuple, bool]] = {}
        self._links: dict[_Key, _LinkState] = {}
        self._faults = LinkFaults()  # the links down and degraded, and the reroute hook
        self._faults.reroute = reroute
        self._next_transfer = 0
        self._next_flow = 0
        self._gen = 0
        self._armed = math.inf  # when the finish event of generation _gen fires
        # Groups alone in their component, by fid: their finish moves no other
        # rate, so no event marks it; their delivery is planned instead, and
        # they stop sending (are retired) as time passes their finish.
        self._lazy: dict[int, _Flow] = {}
        self._plans = 0
        # Delayed starts whose delivery is planned ahead (their links were
        # idle and nothing else was due on them): they start, in order, as
        # the network is next brought up to their start (see start).
        self._ahead: list[Transfer] = []
        self._deferred = 0
        self._timed: list[Transfer] = []  # delayed starts with an event at their instant
        # id of the first path tuple of a delayed start -> (its path tuples, _shape's answer)
        self._shapes: dict[int, tuple[tuple[tuple[LinkLike, ...], ...], _Shape | None]]
        self._shapes = {}
        # id of a shape -> (the shape, its cap, _capacity_gen, links registered, its
        # rate alone or None, and whether its links were all registered then):
        # what _predict found for it
        self._alone: dict[int, tuple[_Shape, float | None, int, int, float | None, bool]] = {}
        self._capacity_gen = 0  # bumped whenever a link's capacity changes
        # id of a group's link states -> (them, _capacity_gen, the least usable of them)
        self._least: dict[int, tuple[tuple[_LinkState, ...], int, float]] = {}
        # id of a path tuple -> (the tuple, its link keys, its latency), its links registered
        self._paths: dict[int, tuple[tuple[LinkLike, ...], tuple[_Key, ...], float]] = {}
        self._last = env.now  # rates are integrated up to here
        self._sent = 0.0
        self._first_start: float | None = None
        self._last_end: float | None = None
        self._in_flight = 0  # transfers not done
        self.bytes_delivered = 0.0
        self.max_link_load_ratio = 0.0

    @property
    def reroute(self) -> Rerouter | None:
        """(first vertex, last vertex, failed links) -> another path for a flow
        that avoids them, or None; given by whoever knows the topology
        (:attr:`twin.net.linkfaults.LinkFaults.reroute`)."""
        return self._faults.reroute

    @reroute.setter
    def reroute(self, hook: Rerouter | None) -> None:
        self._faults.reroute = hook

    # -- input -------------------------------------------------------------------
    def start(
        self,
        flows: Seq[FlowSpec],
        label: str = "",
        *,
        delay_s: float = 0.0,
        guard: Callable[[], bool] | None = None,
        on_start: Callable[[Transfer], None] | None = None,
    ) -> Transfer:
        """Start a transfer of ``flows`` now, or ``delay_s`` seconds from now
        (a fixed cost paid before the first byte); they share links from then.

        A delayed transfer starts then as if ``start`` were called at that
        instant (its id, ``start_s`` and the observer's ``transfer_started``
        are those of that instant), unless ``guard()`` is False then or it was
        cancelled meanwhile: then it never starts, and nothing is reported.
        ``on_start(transfer)`` is called as it starts. When its links are idle
        as it is asked for, its delivery is planned at once, so that the delay
        and the transfer cost one event together; anything that reaches its
        links before it starts drops that plan and it starts at its instant,
        as any other (``guard`` is then asked; a planned one relies on
        :meth:`cancel` instead, which whoever loses its reason to move calls).
        """
        flows = tuple(flows)
        if delay_s > 0.0:
            return self._defer(flows, label, delay_s, guard, on_start)
        if self._ahead:  # delayed starts due by now come first (and take their ids)
            self._catch_up(self.env.now)
        t = Transfer(self, self._next_transfer, label, sum(f.size_bytes for f in flows))
        self._next_transfer += 1
        self._open(t, flows, self.env.now, advance=True)
        if on_start is not None:
            on_start(t)
        return t

    def _open(self, t: Transfer, flows: tuple[FlowSpec, ...], now: float, advance: bool) -> None:
        """The flows of ``t`` start at ``now`` (with ``advance``, the network is
        brought up to ``now`` first; without, it is there already)."""
        probe = t._probe
        routes = [] if probe is not None and probe[2] else [self._route(s.path) for s in flows]
        if self._first_start is None:
            self._first_start = now
        self._in_flight += 1
        if not flows:
            if self.observer is not None:
                self.observer.transfer_started(now, t)
            self._finish_transfer(t)
            return
        if advance:  # (delayed starts due now but asked for after t wait their turn)
            self._catch_up(now, t._seq if t._seq else None)
            self._integrate(now)
        if self._faults.down:
            flows = tuple(
                spec
                if (path := self._faults.rerouted(spec.path)) is spec.path
                else FlowSpec(path, spec.size_bytes, spec.rate_cap_bytes_s)
                for spec in flows
            )
            routes = [self._route(spec.path) for spec in flows]
        base = self._next_flow
        self._next_flow += len(flows)
        new = []
        if probe is not None and not self._faults.down:  # as predicted: one group, no reroute
            probe[0].fid = base
            groups = [probe[0]]
        else:
            groups = _groups(t, base, flows, routes)
        for f in groups:
            t._flows.append(f)
            t._left += 1
            if f.size <= f.tol:
                self._drain(f, now)
            else:
                self._add(f)
                new.append(f)
        if self.observer is not None:
            self.observer.transfer_started(now, t)
        self._settle(now, new)
        t._probe = None

    # -- delayed starts ----------------------------------------------------------
    def _defer(
        self,
        flows: tuple[FlowSpec, ...],
        label: str,
        delay_s: float,
        guard: Callable[[], bool] | None,
        on_start: Callable[[Transfer], None] | None,
    ) -> Transfer:
        t = Transfer(self, -1, label, sum(map(_size_of, flows)))
        t._specs, t._guard, t._on_start = flows, guard, on_start
        self._deferred += 1
        t._seq = self._deferred
        t._due = due = self.env.now + delay_s  # where a timeout of delay_s falls
        t.start_s = due
        # The place a timeout made now would take among the events of its
        # instant, kept for when it needs the event after all (_drop_plan).
        t._slot = place(self.env)
        deliver = self._predict(t, flows, due)
        if deliver is None:
            self._timed.append(t)
            t._slot(due, lambda _ev: self._fire_due(t))
            return t
        self._plans += 1
        plan = self._plans
        t._pre = (deliver, plan)
        self._ahead.append(t)
        at(self.env, deliver, lambda _ev: self._pre_fire(t, plan))
        return t

    def _shape(self, flows: tuple[FlowSpec, ...]) -> _Shape | None:
        """What :meth:`_predict` needs of ``flows``' paths, kept for path tuples
        used again (a hand-off's are); None when a flow is local or the flows'
        latencies differ (more than one group)."""
        sig = id(flows[0].path)  # kept by the first path, checked against all
        got = self._shapes.get(sig)
        if (
            got is not None
            and len(got[0]) == len(flows)
            and all(map(is_, got[0], map(_path_of, flows)))
        ):
            return got[1]
        paths = tuple(map(_path_of, flows))
        routes = [self._keys(spec.path) for spec in flows]
        lat = routes[0][1]
        shape: _Shape | None = None
        if all(keys and latency == lat for keys, latency in routes):
            members = [keys for keys, _ in routes]
            keys = tuple(k for m in members for k in m)
            links: dict[_Key, LinkLike] = {}
            for spec in flows:
                for ln in spec.path:
                    links.setdefault((ln.src, ln.dst), ln)
            shape = (
                tuple(range(len(flows))), [spec.path for spec in flows], members, keys,
                _count(keys), lat, tuple(links.items()),
            )  # fmt: skip
        if len(self._shapes) >= 4096:
            self._shapes.clear()
        self._shapes[sig] = (paths, shape)
        return shape

    def _keys(self, path: tuple[LinkLike, ...]) -> tuple[tuple[_Key, ...], float]:
        """``path``'s link keys and latency, as :meth:`_route` gives them, but
        with no link registered."""
        got = self._paths.get(id(path))
        if got is not None and got[0] is path:
            return got[1], got[2]
        return tuple((ln.src, ln.dst) for ln in path), sum(ln.latency_s for ln in path)

    def _predict(self, t: Transfer, flows: tuple[FlowSpec, ...], due: float) -> float | None:  # noqa: C901
        """When ``flows``, started at ``due``, would be delivered, if that can
        be told now: no link down, one group of one size on links that no
        group sends on and no other delayed start will use, that group alone
        filled in one round. None otherwise."""
        if self._faults.down or not flows:
            return None
        self._catch_up(self.env.now)  # groups that have finished leave their links
        shape = self._shape(flows)
        if shape is None:
            return None
        index, paths, members, keys, mult, lat, links = shape
        # (a view of its links: isdisjoint then goes over the shorter, often no link)
        if not self._on_link.keys().isdisjoint(mult.keys()):
            return None
        for g in self._parked.values():
            if not g.mult.keys().isdisjoint(mult):
                return None
        spec = flows[0]
        size, cap = spec.size_bytes, spec.rate_cap_bytes_s
        for other in flows:
            if other.size_bytes != size or other.rate_cap_bytes_s != cap:
                return None  # more than one group
        for p in self._ahead:
            if _meets(p, mult):
                return None
        for p in self._timed:
            if _meets(p, mult):
                return None
        f = _Flow(0, t, index, paths, members, float(size), cap, lat, keys, mult)
        if f.size <= f.tol:
            return None
        # The group's rate alone on its links, which changes only with the links'
        # capacities (a factor, a failure) or a link registered since: kept per shape.
        registered = self._links
        seen = self._alone.get(id(shape))
        if (
            seen is not None
            and seen[0] is shape
            and seen[1] == cap
            and seen[2] == self._capacity_gen
            and seen[3] == len(registered)
        ):
            rate, every = seen[4], seen[5]
        else:
            rate = None
            every = True
            capacity = {}
            for k, ln in links:
                st = registered.get(k)
                if st is None:  # as _register will make it
                    every = False
                    u = ln.usable_bytes_s
                    factor = self._faults.factors.get(k, 1.0)
                    capacity[k] = u if factor == 1.0 else u * factor
                elif st.base != ln.usable_bytes_s:
                    break  # an error, raised as it starts
                else:
                    capacity[k] = st.usable
            else:
                rates, bad = _fill_one(f, capacity)
                if bad < 0 and 0.0 < rates[0] < math.inf:
                    rate = rates[0]
            if len(self._alone) >= 4096:
                self._alone.clear()
            self._alone[id(shape)] = (
                shape, cap, self._capacity_gen, len(registered), rate, every,
            )  # fmt: skip
        if rate is None:
            return None
        # the group it starts as (unless a link goes down meanwhile), its rate,
        # and whether its links are registered already (links stay registered)
        t._probe = (f, rate, every)
        t._links = mult
        return due + f.remaining / rate + f.latency

    def _fire_due(self, t: Transfer) -> None:
        """A delayed start's instant, when no delivery is planned for it. The
        delayed starts due at this instant and asked for before it start
        first, in order, as their own events would have (one whose plan was
        dropped has its event behind)."""
        if t._due is None or t.cancelled:
            return
        now = self.env.now
        first = [p for p in self._timed if p._due == now and p._seq <= t._seq]
        for p in sorted(first, key=lambda p: p._seq):
            self._timed.remove(p)
            p._due = None
            if p._guard is not None and not p._guard():
                p.cancelled = True  # its reason to move is gone: it never starts
                continue
            # those planned ahead due before it, or now and asked for first
            self._catch_up(now, p._seq)
            self._begin(p, now, advance=True)

    def _begin(self, t: Transfer, now: float, advance: bool) -> None:
        t.id = self._next_transfer
        self._next_transfer += 1
        t.start_s = now
        on_start = t._on_start  # read first: a transfer of no flows finishes in _open
        self._open(t, t._specs, now, advance)
        if on_start is not None:
            on_start(t)

    def _pre_fire(self, t: Transfer, plan: int) -> None:
        """The planned delivery of a delayed start (see start)."""
        if t._due is not None:  # nothing brought the network to its start yet
            if t._pre is None or t._pre[1] != plan or t.cancelled:
                return
            self._catch_up(t._due)
        for f in t._flows:
            if f.plan == plan:
                self._planned(f, plan)
                return

    def _drop_plan(self, t: Transfer) -> None:
        """Something reached the links of delayed start ``t`` before it
        started: its planned delivery no longer holds; it starts at its instant."""
        self._ahead.remove(t)
        self._timed.append(t)
        t._pre = None
        assert t._due is not None and t._due > self.env.now and t._slot is not None
        t._slot(t._due, lambda _ev: self._fire_due(t))

    def cancel(self, t: Transfer) -> None:
        """Stop transfer ``t`` now (an end of it failed): its flows stop sending
        and release their share of every link; bytes already in flight are
        dropped; ``t.done`` never succeeds."""
        if t.cancelled or t.end_s is not None:
            return
        now = self.env.now
        if t._due is not None and (t._due > now or t not in self._ahead):
            # not started: it never will, and nothing of it is reported
            t.cancelled = True
            t._pre = None
            for waiting in (self._ahead, self._timed):
                if t in waiting:
                    waiting.remove(t)
            return
        self._advance(now)  # (a delayed start due by now starts first)
        t.cancelled = True
        keys: list[_Key] = []
        for f in t._flows:
            if f.sending:
                self._remove(f)
                keys.extend(f.keys)
            f.sending = False
            f.plan = 0
        t.end_s = now
        self._in_flight -= 1
        self._last_end = now if self._last_end is None else max(self._last_end, now)
        if self.observer is not None:
            self.observer.transfer_ended(now, t)
        self._reshare(now, (), keys)

    def fail_link(self, src: str, dst: str) -> None:
        """Link ``src -> dst`` fails now: each flow on it moves to another path
        when there is one (leaving its old links, which are re-shared), else
        waits (at rate 0) for the repair."""
        self._set_down((src, dst), True)

    def recover_link(self, src: str, dst: str) -> None:
        """Link ``src -> dst`` carries again; the flows waiting on it resume."""
        self._set_down((src, dst), False)

    def _set_down(self, key: _Key, down: bool) -> None:
        self._capacity_gen += 1
        now = self.env.now
        self._advance(now)
        if down:
            self._faults.down.add(key)
        else:
            self._faults.down.discard(key)
        for t in [t for t in self._ahead if _meets(t, (key,))]:
            self._drop_plan(t)
        s = self._links.get(key)
        if s is not None:
            s.usable = self._faults.usable(s)
        keys = [key]
        if down:
            self._wake((key,))
            for f in list(self._on_link.get(key, {}).values()):
                new = [
                    self._faults.rerouted(p) if key in m else p
                    for p, m in zip(f.paths, f.members, strict=True)
                ]
                if all(q is p for q, p in zip(new, f.paths, strict=True)):
                    continue
                # A flow that moves leaves its group: each goes its own way.
                for g, path in zip(self._split(f), new, strict=True):
                    if path is g.paths[0]:
                        continue
                    for link in path:
                        self._register(link)
                    self._remove(g)
                    # the links it leaves: their loads drop, and the groups
                    # still on them are re-shared without it
                    keys.extend(g.keys)
                    g.paths = [path]
                    g.members = [tuple((ln.src, ln.dst) for ln in path)]
                    g.keys = g.members[0]
                    g.mult = _count(g.keys)
                    g.latency = sum(ln.latency_s for ln in path)
                    self._add(g)
                    keys.extend(g.keys)
        self._settle(now, (), keys)

    def waits(self, t: Transfer) -> bool:
        """Whether a flow of ``t`` still sending waits on a failed link."""
        if not self._faults.down or t.cancelled or t.end_s is not None:
            return False
        self._catch_up(self.env.now)
        return any(self._faults.blocks(f.keys) for f in t._flows if f.sending)

    @property
    def stuck(self) -> list[Transfer]:
        """Transfers with a flow that waits on a failed link, in start order."""
        self._catch_up(self.env.now)
        out: dict[int, Transfer] = {}
        for f in self._flows.values():
            if self._faults.blocks(f.keys):
                out.setdefault(f.transfer.id, f.transfer)
        return [out[k] for k in sorted(out)]

    def scale_link(self, src: str, dst: str, factor: float) -> None:
        """From now on link ``src -> dst`` carries ``factor`` x its capacity
        (1 restores it); the flows on it are re-shared at once."""
        key = (src, dst)
        self._capacity_gen += 1
        if self._ahead:  # delayed starts due by now started before, on the old factor
            self._catch_up(self.env.now)
            for t in [t for t in self._ahead if _meets(t, (key,))]:
                self._drop_plan(t)
        if factor == 1.0:
            self._faults.factors.pop(key, None)
        else:
            self._faults.factors[key] = factor
        s = self._links.get(key)
        if s is None:
            return  # applied when a flow first takes it
        now = self.env.now
        self._advance(now)
        s.usable = self._faults.usable(s)
        self._settle(now, (), [key])

    def idle_time_s(self, flows: Seq[FlowSpec]) -> float:
        """Time ``flows`` would take on an idle network (0 for no flows)."""
        return max((f.idle_time_s for f in flows), default=0.0)

    # -- statistics ------------------------------------------------------------------
    @property
    def bytes_sent(self) -> float:
        """Bytes that have left their senders: the integral of the flow rates."""
        self._catch_up(self.env.now)
        dt = self.env.now - self._last
        return self._sent + dt * sum(f.rate * f.n for f in self._flows.values())

    def link_loads(self, links: Iterable[LinkLike]) -> list[tuple[float, float, int]]:
        """For each of ``links``: its usable rate now (degradation applied, 0
        while it is down), the sum of the rates of the flows sending on it,
        and how many flows send on it (a group's once per member that
        crosses it): the aggregates the sharing keeps, O(1) a link. Lone
        groups that finished by now leave their links first, as for
        :meth:`rates`; nothing else changes (a delayed start due now is left
        to its own event)."""
        self._catch_up(self.env.now, 0)
        out = []
        for link in links:
            s = self._links.get((link.src, link.dst))
            if s is None:  # never used: idle, at the capacity it would be given
                key = (link.src, link.dst)
                usable = 0.0 if key in self._faults.down else link.usable_bytes_s
                out.append((usable * self._faults.factors.get(key, 1.0), 0.0, 0))
            else:
                out.append((s.usable, s.load if s.flows else 0.0, s.flows))
        return out

    def rates(self) -> dict[tuple[int, int], float]:
        """Current rate (bytes/s) of every flow still sending, keyed by
        (transfer id, flow index), in creation order."""
        self._catch_up(self.env.now)
        out = {(f.transfer.id, i): f.rate for f in self._flows.values() for i in f.index}
        return dict(sorted(out.items()))

    def groups(self) -> list[tuple[int, tuple[int, ...]]]:
        """The flow groups still sending, in creation order: (transfer id,
        the indices of its flows that move as one)."""
        self._catch_up(self.env.now)
        return [(f.transfer.id, f.index) for f in self._flows.values()]

    def link_stats(self) -> list[dict]:
        """Per directed link that carried traffic, sorted by (src, dst): bytes,
        busy_s (time with a positive rate), peak_rate_bytes_s, and utilization =
        bytes / (usable x span), span from the first transfer's start to the
        last one's end (or now, while transfers are in flight)."""
        now = self.env.now
        self._catch_up(now)
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
            s = self._links[key] = _LinkState(link, self._faults.factors.get(key, 1.0))
            if key in self._faults.down:
                s.usable = 0.0
        elif s.base != link.usable_bytes_s:
            raise SpecError(
                f"link {_name(link)}: usable capacity {link.usable_bytes_s!r} bytes/s, but "
                f"this network already has {s.usable!r} for {_name(link)}; "
                "links are identified by (src, dst)"
            )

    def _route(self, path: tuple[LinkLike, ...]) -> tuple[tuple[_Key, ...], float]:
        """``path``'s link keys and latency, its links registered (remembered
        for the path tuples used again, as a hand-off's are)."""
        got = self._paths.get(id(path))
        if got is not None and got[0] is path:
            return got[1], got[2]
        for link in path:
            self._register(link)
        if len(self._paths) >= 4096:  # paths built afresh each time: keep it small
            self._paths.clear()
        keys = tuple((link.src, link.dst) for link in path)
        latency = sum(link.latency_s for link in path)
        self._paths[id(path)] = (path, keys, latency)
        return keys, latency

    def _add(self, f: _Flow) -> None:
        self._flows[f.fid] = f
        on = self._on_link
        if self._ahead:
            for t in [t for t in self._ahead if _meets(t, f.mult)]:
                self._drop_plan(t)
        keys = f.keys
        got = self._states.get(id(keys))
        if got is None or got[0] is not keys:
            links = self._links
            ustates = tuple(links[k] for k in f.mult)
            got = (keys, tuple(links[k] for k in keys), ustates, len(keys) == len(ustates))
            if len(self._states) >= 4096:
                self._states.clear()
            self._states[id(keys)] = got
        _, f.states, f.ustates, f.flat = got
        for s, m in zip(f.ustates, f.mult.values(), strict=True):
            s.flows += m
        woke = self._wake(f.mult) if self._parked else False
        if not woke and on.keys().isdisjoint(f.mult.keys()):
            self._parked[f.fid] = f  # alone on its links
            return
        self._enter(f)

    def _enter(self, f: _Flow) -> None:
        """Put group ``f`` on its links in ``_on_link``."""
        on = self._on_link
        busy = self._busy
        fid = f.fid
        for k, s in zip(f.mult, f.ustates, strict=True):
            d = on.get(k)
            if d is None:
                on[k] = {fid: f}
                busy[k] = s
            else:
                d[fid] = f

    def _wake(self, keys: Iterable[_Key]) -> bool:
        """Put the parked groups on a link of ``keys`` (a dict or tuple) on
        their links in ``_on_link``; whether there was one."""
        hit = [g for g in self._parked.values() if not g.mult.keys().isdisjoint(keys)]
        for g in hit:
            del self._parked[g.fid]
            self._enter(g)
        return bool(hit)

    def _remove(self, f: _Flow) -> None:
        del self._flows[f.fid]
        for s, m in zip(f.ustates, f.mult.values(), strict=True):
            s.flows -= m
        self._lazy.pop(f.fid, None)
        if self._parked.pop(f.fid, None) is not None:
            return
        on = self._on_link
        for k in f.mult:
            d = on[k]
            del d[f.fid]
            if not d:
                del on[k]
                del self._busy[k]

    def _split(self, f: _Flow) -> list[_Flow]:
        """Replace group ``f`` by one group per flow (same state); returns them."""
        if f.n == 1:
            return [f]
        parts = f.split()
        f.plan = 0
        self._remove(f)
        for g in parts:
            self._add(g)
        self._flows = dict(sorted(self._flows.items()))  # creation order again
        t = f.transfer
        i = t._flows.index(f)
        t._flows[i : i + 1] = parts
        t._left += len(parts) - 1
        return parts

    def _set_cap(self, t: Transfer, cap: float | None) -> None:
        now = self.env.now
        self._advance(now)
        for f in t._flows:
            if f.sending:
                f.cap = cap
        self._settle(now, [f for f in t._flows if f.sending])

    def _advance(self, now: float) -> None:
        """Bring the network to ``now``: retire the lone groups that finished
        since, then integrate the current rates."""
        self._catch_up(now)
        self._integrate(now)

    def _catch_up(self, now: float, seq: int | None = None) -> None:
        """Retire the lone groups whose finish is at or before ``now``, in
        order, integrating up to each finish as its own event would have."""
        lazy = self._lazy
        ahead = self._ahead
        while lazy or ahead:
            if ahead:
                if len(ahead) == 1:
                    t = ahead[0]
                else:
                    t = min(ahead, key=_due_seq_of)
                due = t._due
                assert due is not None
                if (due < now or (due == now and (seq is None or t._seq < seq))) and (
                    not lazy or due < min(map(_finish_of, lazy.values()))
                ):
                    # A delayed start with its delivery planned: it starts
                    # now, at its instant, as its own event would have.
                    ahead.remove(t)
                    t._due = None
                    self._integrate(due)
                    self._begin(t, due, advance=False)
                    continue
            if not lazy:
                return
            if len(lazy) == 1:
                f = next(iter(lazy.values()))
            else:
                f = min(lazy.values(), key=_finish_fid_of)
            if f.finish_at > now:
                return
            self._integrate(f.finish_at)
            self._remove(f)
            for s in f.ustates:
                s.load = 0.0
            f.sending = False
            f.rate = 0.0
            f.remaining = 0.0

    def _integrate(self, now: float) -> None:
        """Integrate the current rates from the last update to ``now``."""
        dt = now - self._last
        self._last = now
        if dt <= 0.0:
            return
        w = self.series_bucket_s
        parked = self._parked
        for f in self._flows.values():
            r = f.rate
            if r <= 0.0:
                continue
            moved = r * dt
            f.remaining -= moved
            self._sent += moved * f.n
            if w is None and f.flat and f.fid in parked:
                # Its links are its own, each crossed once, so each one's load
                # is its rate: bytes and busy time in one pass (each link's
                # figures are its own, so the order across links is free).
                for s in f.states:
                    s.bytes += moved
                    s.busy_s += dt
                continue
            for s in f.states:
                s.bytes += moved
        for s in self._busy.values():
            if s.load > 0.0:
                s.busy_s += dt
                if w is not None:
                    _spread(s.series, now - dt, now, s.load, w)
        for f in parked.values():  # (their links are nobody else's)
            if w is None and f.flat and f.rate > 0.0:
                continue  # done above
            for s in f.ustates:
                if s.load > 0.0:
                    s.busy_s += dt
                    if w is not None:
                        _spread(s.series, now - dt, now, s.load, w)

    def _settle(self, now: float, changed: Seq[_Flow] = (), keys: Seq[_Key] = ()) -> None:
        """Retire the groups whose last byte has left, then re-share what they
        and ``changed`` (groups) and ``keys`` (links) touch, and arm the one
        event for the next such instant."""
        done = []
        for f in self._flows.values():
            if not f.keys and f.cap is None:  # local and uncapped: instant
                self._sent += f.remaining * f.n
                done.append(f)
            elif f.finish_at <= now or f.remaining <= f.tol:
                done.append(f)
        keys = list(keys)
        for f in done:
            f.plan = 0
            self._remove(f)
            keys.extend(f.keys)
            self._drain(f, now)
        self._reshare(now, changed, keys)

    def _reshare(self, now: float, changed: Seq[_Flow], keys: Seq[_Key]) -> None:  # noqa: C901
        """Max-min over each connected component that holds a group of
        ``changed`` or a link of ``keys``; the others keep their rates."""
        links = self._links
        on = self._on_link
        if not keys and len(changed) == 1:  # one group: often alone on its links
            f = changed[0]
            if f.sending and f.keys and (f.fid in self._parked or _alone(f, on)):
                self._share(now, [f], f.mult)
                self._arm()
                return
        seen: set[int] = set()
        seen_k: set[_Key] = set()
        todo = list(keys)
        for f in changed:
            if f.sending:
                if f.keys:
                    todo.extend(f.keys)
                else:  # local: a component of its own
                    self._share(now, [f], [])
        if self._parked:
            self._wake(todo)  # found below through _on_link, as the others
        for k0 in todo:
            if k0 in seen_k:
                continue
            seen_k.add(k0)
            if k0 not in on:  # nothing on it any more
                s = links.get(k0)
                if s is not None:
                    s.load = 0.0
                continue
            comp: list[_Flow] = []
            comp_k = [k0]
            stack = [k0]
            while stack:
                for fid, f in on[stack.pop()].items():
                    if fid in seen:
                        continue
                    seen.add(fid)
                    comp.append(f)
                    for k in f.mult:
                        if k not in seen_k:
                            seen_k.add(k)
                            comp_k.append(k)
                            stack.append(k)
            self._share(now, comp, comp_k)
        self._arm()

    def _share(self, now: float, comp: list[_Flow], keys: Collection[_Key]) -> None:  # noqa: C901
        """Max-min rates of the groups ``comp``, one component over links ``keys``."""
        links = self._links
        if len(comp) == 1:
            pre = comp[0].transfer._pre
        else:
            comp.sort(key=_fid_of)
            pre = None
        for f in comp:
            f.transfer._pre = None
            if f.plan:  # its planned delivery no longer holds
                f.plan = 0
                self._lazy.pop(f.fid, None)
        probe = comp[0].transfer._probe if pre is not None else None
        if probe is not None and probe[0] is comp[0]:
            # a delayed start as predicted: alone, on the capacities it
            # was predicted on (a change to them dropped the plan)
            rates = [probe[1]]
        else:
            capacity = {k: links[k].usable for k in keys}
            while True:
                if len(comp) == 1:
                    rates, bad = _fill_one(comp[0], capacity)
                else:
                    rates, bad = _fill(
                        [f.keys for f in comp],
                        [f.cap for f in comp],
                        capacity,
                        [f.members if f.n > 1 else None for f in comp],
                    )
                if bad < 0:
                    break
                parts = self._split(comp[bad])
                comp[bad : bad + 1] = parts
        if len(comp) == 1 and comp[0].flat:
            # One group over links it crosses once each (``keys`` are its
            # links): each link's load is its rate, as summing would give.
            self._share_flat(now, comp[0], rates[0], pre)
            return
        for k in keys:
            links[k].load = 0.0
        for f, r in zip(comp, rates, strict=True):
            # local uncapped groups were drained in _settle, so r is finite
            f.rate = r
            f.finish_at = now + f.remaining / r if r > 0.0 else math.inf
            for k in f.keys:
                links[k].load += r
        top = self.max_link_load_ratio
        for k in keys:
            s = links[k]
            load = s.load
            if load > 0.0:
                if load > s.peak:  # max(), without the call
                    s.peak = load
                ratio = load / s.usable if s.usable > 0.0 else math.inf
                if ratio > top:
                    top = ratio
        self.max_link_load_ratio = top
        if len(comp) == 1 and comp[0].finish_at < math.inf:
            # Alone: its finish changes no other rate. Its delivery is planned
            # now, and nothing marks the finish itself unless something joins.
            f = comp[0]
            self._lazy[f.fid] = f
            if pre is not None and pre[0] == f.finish_at + f.latency and f.transfer._left == 1:
                f.plan = pre[1]  # the delivery planned as it was asked for (start)
                return
            self._plans += 1
            f.plan = plan = self._plans
            at(self.env, f.finish_at + f.latency, lambda _ev: self._planned(f, plan))

    def _share_flat(self, now: float, f: _Flow, r: float, pre: tuple[float, int] | None) -> None:
        """The rest of :meth:`_share` for one group ``f`` of rate ``r`` that
        crosses each of its links once: the same values, one pass."""
        f.rate = r
        f.finish_at = now + f.remaining / r if r > 0.0 else math.inf
        ustates = f.ustates
        if r > 0.0:
            for s in ustates:
                s.load = r
                if r > s.peak:
                    s.peak = r
            if ustates:
                # the largest of r / usable is r over the least usable (a
                # rounded quotient falls as its divisor grows), kept per set of
                # links until a capacity changes
                seen = self._least.get(id(ustates))
                if seen is not None and seen[0] is ustates and seen[1] == self._capacity_gen:
                    u = seen[2]
                else:
                    u = min(map(_usable_of, ustates))
                    if len(self._least) >= 4096:
                        self._least.clear()
                    self._least[id(ustates)] = (ustates, self._capacity_gen, u)
                ratio = r / u if u > 0.0 else math.inf
                if ratio > self.max_link_load_ratio:
                    self.max_link_load_ratio = ratio
        else:
            for s in ustates:
                s.load = r
        if f.finish_at < math.inf:
            self._lazy[f.fid] = f
            if pre is not None and pre[0] == f.finish_at + f.latency and f.transfer._left == 1:
                f.plan = pre[1]
                return
            self._plans += 1
            f.plan = plan = self._plans
            at(self.env, f.finish_at + f.latency, lambda _ev: self._planned(f, plan))

    def _arm(self) -> None:
        """Make the one finish event fire at the earliest finish, unless it does."""
        earliest = min((f.finish_at for f in self._flows.values() if not f.plan), default=math.inf)
        if earliest == self._armed:
            return
        self._gen += 1
        self._armed = earliest
        if earliest < math.inf:
            gen = self._gen
            at(self.env, earliest, lambda _ev: self._on_finish(gen))

    def _on_finish(self, gen: int) -> None:
        if gen != self._gen:
            return  # made stale by a later re-share
        self._armed = math.inf
        now = self.env.now
        self._advance(now)
        self._settle(now)

    # -- delivery --------------------------------------------------------------------
    def _planned(self, f: _Flow, plan: int) -> None:
        """The planned delivery of lone group ``f``, unless a re-share changed it."""
        if f.plan != plan:
            return
        self._catch_up(f.finish_at)
        self._deliver(f)

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
        self.bytes_delivered += f.size * f.n
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
        for fn in t._then:
            fn(t)
        if t._done is not None:
            t._done.succeed(t)
        # What only a transfer under way needs goes now, so that a finished
        # transfer is freed as soon as nobody holds it, not left in a cycle
        # with its groups (and the callbacks' owners, a hand-off's sequence,
        # with it) to the garbage collector: its groups let go of it (nothing
        # reads it from them once the last is delivered) and its callbacks go.
        for f in t._flows:
            del f.transfer
        t._then.clear()
        t._guard = t._on_start = t._slot = None
