"""What ran where and when, for a timeline: iterations per instance, KV
transfers per instance pair, written as a Chrome trace (ui.perfetto.dev).

A :class:`TraceRecorder` is handed to :class:`twin.sim.simulation.Simulation` as
``trace=``; after the run, :func:`write_chrome_trace` writes it::

    rec = TraceRecorder()
    Simulation(spec, trace=rec).run()
    write_chrome_trace(rec, "run.trace.json")

Recorded:

- an iteration span per engine iteration: instance, start and duration (s),
  the ids of the requests whose prompt chunks ran, their new prompt tokens and
  the number of decode sequences (kind ``prefill``, ``decode`` or ``mixed``);
- a transfer span per network transfer (KV hand-offs ``kv <id>``, pool
  fetches ``fetch <id>``): start, end, bytes, label, and the instances (or,
  for a pool fetch, the node) at its two ends;
- preemptions, role changes and instances going down or coming up
  (``down``, ``up``) as instants;
- failures, repairs, degradations and restorations (the spec's ``events:``
  and random failures) as instants named as the event (``fail node 0``,
  ``degrade gpu 3 x0.5``) on the track of each instance they changed; one
  that changes no instance (a link or a NIC) is a global instant;
- each instance's lifetime, from the run's start (or its coming up) to its
  going down (or the run's end, its last recorded moment), as a ``lifetime``
  span on its track (category ``lifetime``) under its iterations; an
  iteration cut short by a failure ends at the failure;
- per instance, three counters (:data:`COUNTERS`): ``kv blocks`` (KV blocks
  taken, prefix-cache blocks among them), ``queued`` (requests waiting for
  admission) and ``running`` (sequences admitted: computing a prompt or
  decoding). The recorder reads them off the engines the simulation hands it
  (:meth:`TraceRecorder.watch`) as the run starts and at each report that
  concerns an instance: a request joining its queue, an iteration's start
  (after its batch is formed), a request's end, a prompt done for a
  hand-off, a hand-off's transfer starting (on the decode side, which
  reserved the blocks as the prompt's last iteration started) and its KV
  landing (the prefill side frees them), the instance going down or up. A
  change between two reports shows at the second. A value is recorded only
  when it changes, and one
  instant keeps its last value only (:attr:`TraceRecorder.counters`);
- per hand-off, the iteration that finished the prompt and the first
  iteration that decoded it on the other side (:attr:`TraceRecorder.handoffs`).

The recorder is an :class:`~twin.serving.observer.Observer` that wants every
iteration: it turns the engines' fast-forward off (as the :class:`EventLog` of
``log=`` does), so each decode step is a span of its own. Results are identical either way (a
property test holds fast-forward to stepping); only the run is slower.
A span's duration is the iteration time the engine reports as it starts the
iteration, exactly the time it waits.

The trace-event format (the Trace Event Format document, as Perfetto's
JSON importer reads it): ``{"traceEvents": [...], "displayTimeUnit": "ms"}``;
timestamps in microseconds (rounded to the nanosecond). "M" events name
process 1 ``instances`` (a thread per instance, ``P0 prefill, node 0``, ...)
and process 2 ``links`` (a thread per ordered instance pair, ``P0 -> D1``).
On an instance's thread: "X" (complete) events, its lifetime and its
iterations (a pipeline's micro-batches overlap: those go to further lanes of
the instance, threads ``P0 prefill, node 0 #2``, ..., each with the
lifetime); "i" instants; "C" counter events named as the instance (``P0``)
with one numeric arg, the counter (``{"kv blocks": 12}``), which Perfetto
shows as the track ``P0 kv blocks``. Each transfer is an async slice, a "b"
and an "e" event with the same ``cat`` (``transfer``), ``id`` (its number in
start order, from 1) and ``name`` (the pair, ``P0 -> D1``, so that Perfetto
packs one pair's transfers into as few rows as overlap), its label
(``kv 17``), bytes and ends in the args of the "b". Each hand-off is a flow
arrow: an "s" event inside the prefill iteration's slice and an "f" event
(``"bp": "e"``, bound to the enclosing slice) inside the first decode
iteration's, with the same ``cat`` (``handoff``), ``id`` and ``name``
(``kv <request id>``); the transfer's slice lies between them in time on
the pair's track (flow events bind to thread slices, and one slice takes
part in many hand-offs, so the arrow joins the two iterations). Output is
deterministic: the same run gives the same bytes.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin import _version
from twin._io import write_text
from twin.errors import TwinError
from twin.net.flows import Transfer
from twin.net.topology import Topology
from twin.perf.iteration import Batch
from twin.request import Request
from twin.scheduler import FaultEvent
from twin.serving.observer import InstanceInfo, Observer, Outcome
from twin.serving.sequence import Sequence
from twin.sim.faults import label as event_label

if TYPE_CHECKING:
    from twin.serving.engine import Engine

PID_INSTANCES = 1
PID_LINKS = 2
ROLE_LETTER = {"prefill": "P", "decode": "D", "mixed": "M"}
COUNTERS = ("kv blocks", "queued", "running")  # per instance, see the module docstring


@dataclass(frozen=True, slots=True)
class IterationSpan:
    """One engine iteration: ``start_s`` to ``start_s + dt_s`` on ``instance``."""

    instance: int
    start_s: float
    dt_s: float
    prefill_ids: tuple[int, ...]
    prefill_tokens: int
    decode_count: int

    @property
    def kind(self) -> str:
        if not self.prefill_ids:
            return "decode"
        return "mixed" if self.decode_count else "prefill"


@dataclass(frozen=True, slots=True)
class TransferSpan:
    """One network transfer from ``src`` to ``dst`` (instance names such as
    ``P0``, or ``pool n1`` for a KV-pool fetch), ``start_s`` to ``end_s``."""

    label: str
    src: str
    dst: str
    start_s: float
    end_s: float
    size_bytes: float
    flows: int


class EventLog(Observer):
    """The run as a list of plain tuples ``(time s rounded to the ns, kind,
    instance, ...)``, appended to ``entries`` as things happen: ``arrive`` and
    ``reject`` (instance -1, request id), ``iteration`` (instance, the ids of
    the requests whose prompt chunks ran, the decode count), ``preempt``,
    ``handoff`` and ``finish`` (instance, request id), ``role`` (instance, new
    role). Exact traces of tiny scenarios are compared against it in tests."""

    wants_iterations = True

    def __init__(self, entries: list[tuple]) -> None:
        self.entries = entries

    def request_arrived(self, now: float, req: Request) -> None:
        self.entries.append((round(now, 9), "arrive", -1, req.id))

    def request_ended(
        self, now: float, instance: int, req: Request, seq: Sequence | None, outcome: Outcome,
        reason: str,
    ) -> None:  # fmt: skip
        kind = "finish" if outcome == "completed" else "reject" if outcome == "rejected" else "fail"
        self.entries.append((round(now, 9), kind, instance, req.id))

    def iteration_started(
        self, now: float, instance: int, dt: float, prefill_ids: tuple[int, ...], batch: Batch
    ) -> None:
        self.entries.append((round(now, 9), "iteration", instance, prefill_ids, batch.decode_count))

    def preempted(self, now: float, instance: int, req: Request) -> None:
        self.entries.append((round(now, 9), "preempt", instance, req.id))

    def prefilled(self, now: float, instance: int, req: Request) -> None:
        self.entries.append((round(now, 9), "handoff", instance, req.id))

    def role_changed(self, now: float, instance: int, old: str, new: str) -> None:
        self.entries.append((round(now, 9), "role", instance, new))


class TraceRecorder(Observer):
    """Collects iteration and transfer spans of one run (see the module
    docstring). Give it to one :class:`~twin.sim.simulation.Simulation` only."""

    wants_iterations = True

    def __init__(self) -> None:
        self.iterations: list[IterationSpan] = []
        self.transfers: list[TransferSpan] = []
        self.instants: list[tuple[float, int, str]] = []  # (time s, instance, name)
        self.instances: list[dict[str, Any]] = []  # id, name, role, node, gpus
        self.name = ""
        self._role_changes: list[tuple[float, int, str, str]] = []
        self._gpu_owner: dict[str, str] = {}  # GPU name -> instance name
        self._gpu_node: dict[str, int] = {}
        # (time s, label, instances changed) per failure, repair, degradation
        self.faults: list[tuple[float, str, tuple[int, ...]]] = []
        self.lifetimes: list[tuple[int, float, float]] = []  # (instance, up s, down s)
        self._up_since: dict[int, float] = {}
        self._downs: dict[int, list[float]] = {}
        self.end_s = 0.0  # the last moment recorded
        # (instance, counter) -> [(time ns, value)], one entry per change
        self.counters: dict[tuple[int, str], list[tuple[int, int]]] = {}
        # (request id, its prefill iteration, its first decode iteration): indices
        # into iterations, per hand-off whose KV landed and decoded
        self.handoffs: list[tuple[int, int, int]] = []
        self._engines: Seq[Engine] = ()
        self._gpu_instance: dict[str, int] = {}  # GPU name -> instance id
        self._open: dict[int, deque[int]] = {}  # instance -> its iterations in flight
        self._ending: dict[int, int] = {}  # instance -> the iteration that just ended
        self._prefill_of: dict[int, int] = {}  # request id -> the iteration ending its prompt
        self._landed: dict[int, list[int]] = {}  # instance -> request ids landed, not decoded

    def watch(self, engines: Seq[Engine]) -> None:
        """Read the counters off ``engines`` (indexed by instance id; the list
        may grow as instances start) during the run."""
        self._engines = engines

    # -- what the run reports ------------------------------------------------------------
    def run_started(
        self, name: str, instances: Seq[InstanceInfo], topology: Topology | None
    ) -> None:
        """Learn the cluster's instances (names, roles after the policy's setup,
        placement) before the run."""
        if self.instances:
            raise TwinError("a TraceRecorder records one simulation; make a new one per run")
        self.name = name
        self._topology = topology
        for inst in instances:
            self._describe(inst)
            self._up_since[inst.id] = 0.0
        if topology is not None:
            for g, gname in enumerate(topology.gpus):
                self._gpu_node[gname] = topology.node_of(g)
        for inst in instances:
            self._sample(0.0, inst.id)

    def _describe(self, inst: InstanceInfo) -> None:
        label = f"{ROLE_LETTER[inst.role]}{inst.id}"
        self.instances.append(
            {"id": inst.id, "name": label, "role": inst.role, "node": inst.node,
             "gpus": inst.gpus}
        )  # fmt: skip
        if self._topology is not None:
            for g in inst.gpus:
                self._gpu_owner[self._topology.gpus[g]] = label
                self._gpu_instance[self._topology.gpus[g]] = inst.id

    def _sample(self, now: float, instance: int) -> None:
        """Record the counters of ``instance`` that changed."""
        if not 0 <= instance < len(self._engines):
            return
        e = self._engines[instance]
        t = _ns(now)
        for name, value in zip(COUNTERS, (e.kv.used, len(e.waiting), len(e.running)), strict=True):
            track = self.counters.setdefault((instance, name), [])
            if track and track[-1][0] == t:
                track.pop()  # changed again at the same instant: the last value stands
            if not track or track[-1][1] != value:
                track.append((t, value))

    def _saw(self, t_s: float) -> None:
        if t_s > self.end_s:
            self.end_s = t_s

    def request_ended(
        self, now: float, instance: int, req: Request, seq: Sequence | None, outcome: Outcome,
        reason: str,
    ) -> None:  # fmt: skip
        self._saw(now)
        self._sample(now, instance)

    def request_queued(self, now: float, instance: int, req: Request) -> None:
        self._sample(now, instance)

    def iteration_started(
        self, now: float, instance: int, dt: float, prefill_ids: tuple[int, ...], batch: Batch
    ) -> None:
        k = len(self.iterations)
        self.iterations.append(
            IterationSpan(instance, now, dt, prefill_ids, batch.prefill_tokens, batch.decode_count)
        )
        self._open.setdefault(instance, deque()).append(k)
        self._saw(now + dt)
        self._sample(now, instance)
        landed = self._landed.get(instance)
        if landed:
            self._first_decodes(now, instance, k, landed)

    def _first_decodes(self, now: float, instance: int, k: int, landed: list[int]) -> None:
        """Iteration ``k`` starting now on ``instance`` is the first to give a
        token of the landed requests whose decode starts now (the engine's
        ``t_decode_start``; a recompute after a preemption counts)."""
        running = self._engines[instance].running if instance < len(self._engines) else {}
        keep = []
        for rid in landed:
            seq = running.get(rid)
            if seq is None or 0 <= seq.t_decode_start < now:
                continue  # lost or failed over before decoding here
            if seq.t_decode_start < 0:
                keep.append(rid)
            else:
                prefill = self._prefill_of.pop(rid, None)
                if prefill is not None:
                    self.handoffs.append((rid, prefill, k))
        landed[:] = keep

    def iteration_ended(self, now: float, instance: int) -> None:
        # micro-batches of a pipeline end in the order they started
        open_ = self._open.get(instance)
        if open_:
            self._ending[instance] = open_.popleft()

    def prefilled(self, now: float, instance: int, req: Request) -> None:
        if instance in self._ending:
            self._prefill_of[req.id] = self._ending[instance]
        self._sample(now, instance)

    def kv_landed(self, now: float, src: int, dst: int, req: Request) -> None:
        self._sample(now, src)
        self._sample(now, dst)
        if req.id in self._prefill_of:
            landed = self._landed.setdefault(dst, [])
            if req.id not in landed:
                landed.append(req.id)

    def transfer_started(self, now: float, transfer: Transfer) -> None:
        ends = transfer.flow_ends
        if ends and transfer.label.startswith("kv"):
            dst = self._gpu_instance.get(ends[0][1])
            if dst is not None:
                self._sample(now, dst)  # the blocks its KV lands in are reserved

    def preempted(self, now: float, instance: int, req: Request) -> None:
        self.instants.append((now, instance, f"preempt {req.id}"))

    def role_changed(self, now: float, instance: int, old: str, new: str) -> None:
        self._role_changes.append((now, instance, old, new))

    def instance_up(self, now: float, instance: int, info: InstanceInfo | None = None) -> None:
        if info is not None and all(i["id"] != instance for i in self.instances):
            self._describe(info)  # an instance started during the run
        self.instants.append((now, instance, "up"))
        self._up_since.setdefault(instance, now)
        self._saw(now)
        self._sample(now, instance)

    def instance_down(self, now: float, instance: int) -> None:
        self.instants.append((now, instance, "down"))
        start = self._up_since.pop(instance, None)
        if start is not None:
            self.lifetimes.append((instance, start, now))
        self._downs.setdefault(instance, []).append(now)
        self._saw(now)
        self._open.pop(instance, None)  # the iterations in flight never end
        self._landed.pop(instance, None)
        self._sample(now, instance)

    def fault_event(self, now: float, event: FaultEvent) -> None:
        what = event_label(event.action, event.target, event.name, event.factor)
        self.faults.append((now, what, event.instances))
        self._saw(now)

    def transfer_ended(self, now: float, transfer: Transfer) -> None:
        t = transfer
        ends = t.flow_ends
        assert t.end_s is not None
        src_gpu, dst_gpu = ends[0] if ends else ("", "")
        dst = self._gpu_owner.get(dst_gpu, dst_gpu or "?")
        if t.label.startswith("fetch"):
            src = f"pool n{self._gpu_node.get(src_gpu, '?')}"
        else:
            src = self._gpu_owner.get(src_gpu, src_gpu or "?")
        self.transfers.append(
            TransferSpan(t.label, src, dst, t.start_s, t.end_s, t.size_bytes, len(ends))
        )
        self._saw(now)

    def lifetime_spans(self) -> list[tuple[int, float, float]]:
        """(instance, up s, down s) per stretch each instance served, in the
        order they ended; one still up ends at :attr:`end_s`."""
        still = [(i, t, max(t, self.end_s)) for i, t in sorted(self._up_since.items())]
        return self.lifetimes + still

    @property
    def role_changes(self) -> list[tuple[float, int, str, str]]:
        """(time s, instance, old role, new role), as the moves took effect."""
        return list(self._role_changes)


# -- the Chrome trace-event format --------------------------------------------------------
def _ns(t_s: float) -> int:
    return round(t_s * 1e9)


def _us(ns: int) -> float | int:
    return ns // 1000 if ns % 1000 == 0 else ns / 1000


def _lanes(rec: TraceRecorder, bounds: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(instance, lane) per iteration: an instance's iterations in the fewest
    lanes in which none overlap (one lane but for a pipeline's micro-batches,
    which do), since the slices of one thread must nest."""
    ends: dict[int, list[int]] = {}  # instance -> per lane: the end (ns) of its last slice
    out = []
    for it, (a, b) in zip(rec.iterations, bounds, strict=True):
        lanes = ends.setdefault(it.instance, [])
        lane = next((k for k, e in enumerate(lanes) if e <= a), len(lanes))
        if lane == len(lanes):
            lanes.append(b)
        lanes[lane] = b
        out.append((it.instance, lane))
    return out


def chrome_trace(rec: TraceRecorder) -> dict[str, Any]:  # noqa: C901
    """The recorder's spans as a Chrome trace-event document (a dict)."""
    events: list[dict[str, Any]] = []

    def meta(pid: int, tid: int, what: str, name: str, sort: int) -> None:
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": what, "args": {"name": name}})
        key = "process_sort_index" if what == "process_name" else "thread_sort_index"
        args = {"sort_index": sort}
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": key, "args": args})

    downs = {i: sorted(ts) for i, ts in rec._downs.items()}
    bounds: list[tuple[int, int]] = []  # per iteration: its slice (ns)
    for it in rec.iterations:
        a = _ns(it.start_s)
        end_s = it.start_s + it.dt_s
        cut = next((d for d in downs.get(it.instance, ()) if it.start_s <= d < end_s), None)
        bounds.append((a, _ns(end_s if cut is None else cut)))  # cut short by a failure
    lanes = _lanes(rec, bounds)
    meta(PID_INSTANCES, 0, "process_name", "instances", PID_INSTANCES)
    labels = {}
    for inst in rec.instances:
        labels[inst["id"]] = f"{inst['name']} {inst['role']}, node {inst['node']}"
        meta(PID_INSTANCES, inst["id"] + 1, "thread_name", labels[inst["id"]], inst["id"])
    extra = sorted({(i, lane) for i, lane in lanes if lane})  # a pipeline's overlapping batches
    extra_tid = {key: 2 + max(labels, default=0) + n for n, key in enumerate(extra)}
    for (i, lane), tid in extra_tid.items():
        meta(PID_INSTANCES, tid, "thread_name", f"{labels.get(i, i)} #{lane + 1}", i)

    def tid_of(i: int, lane: int) -> int:
        return i + 1 if lane == 0 else extra_tid[(i, lane)]

    body: list[dict[str, Any]] = []
    names = {inst["id"]: inst["name"] for inst in rec.instances}
    for i, up_s, down_s in rec.lifetime_spans():
        a, b = _ns(up_s), _ns(down_s)
        for tid in [i + 1, *(t for (j, _), t in extra_tid.items() if j == i)]:
            body.append(
                {"ph": "X", "cat": "lifetime", "name": "lifetime", "pid": PID_INSTANCES,
                 "tid": tid, "ts": _us(a), "dur": _us(b - a),
                 "args": {"instance": names.get(i, str(i))}}
            )  # fmt: skip
    for k, it in enumerate(rec.iterations):
        a, b = bounds[k]
        body.append(
            {
                "ph": "X",
                "cat": "iteration",
                "name": it.kind,
                "pid": PID_INSTANCES,
                "tid": tid_of(*lanes[k]),
                "ts": _us(a),
                "dur": _us(b - a),
                "args": {
                    "prefill_ids": list(it.prefill_ids),
                    "prefill_tokens": it.prefill_tokens,
                    "decode": it.decode_count,
                },
            }
        )
    for t_s, i, what in rec.instants:
        body.append(_instant(t_s, i, what))
    for t_s, i, old, new in rec.role_changes:
        body.append(_instant(t_s, i, f"role {old} -> {new}"))
    for t_s, what, ids in rec.faults:
        if ids:
            body.extend(_instant(t_s, i, what, "fault") for i in ids)
        else:  # a link or a NIC: no instance's track
            body.append(_instant(t_s, -1, what, "fault") | {"s": "g"})
    for (i, counter), track in sorted(rec.counters.items()):
        for t, value in track:
            body.append(
                {"ph": "C", "name": names.get(i, str(i)), "pid": PID_INSTANCES, "tid": i + 1,
                 "ts": _us(t), "args": {counter: value}}
            )  # fmt: skip
    for n, (rid, p, d) in enumerate(rec.handoffs, 1):
        # inside each slice, so that both ends bind to it
        for k, ph in ((p, "s"), (d, "f")):
            a, b = bounds[k]
            flow = {"ph": ph, "cat": "handoff", "name": f"kv {rid}", "id": n,
                    "pid": PID_INSTANCES, "tid": tid_of(*lanes[k]),
                    "ts": _us(a + (b - a) // 2)}  # fmt: skip
            body.append(flow | {"bp": "e"} if ph == "f" else flow)
    spans = sorted(rec.transfers, key=lambda s: (_ns(s.start_s), _ns(s.end_s), s.label))
    if spans:
        meta(PID_LINKS, 0, "process_name", "links", PID_LINKS)
    tids: dict[str, int] = {}
    for n, s in enumerate(spans, 1):
        pair = f"{s.src} -> {s.dst}"
        if pair not in tids:
            tids[pair] = len(tids) + 1
            meta(PID_LINKS, tids[pair], "thread_name", pair, tids[pair])
        where = {"cat": "transfer", "name": pair, "id": n, "pid": PID_LINKS, "tid": tids[pair]}
        args = {"label": s.label, "bytes": s.size_bytes, "flows": s.flows, "src": s.src,
                "dst": s.dst}  # fmt: skip
        body.append({"ph": "b", **where, "ts": _us(_ns(s.start_s)), "args": args})
        body.append({"ph": "e", **where, "ts": _us(_ns(s.end_s))})
    # Per thread in time order; for equal times the order recorded (stable sort).
    body.sort(key=lambda e: (e["pid"], e["tid"], e["ts"]))
    return {
        "traceEvents": events + body,
        "displayTimeUnit": "ms",
        "otherData": {"tool": "pd-twin", "version": _version.__version__, "name": rec.name},
    }


def _instant(t_s: float, instance: int, name: str, cat: str = "event") -> dict[str, Any]:
    return {
        "ph": "i",
        "s": "t",
        "cat": cat,
        "name": name,
        "pid": PID_INSTANCES,
        "tid": instance + 1,
        "ts": _us(_ns(t_s)),
    }


def chrome_trace_text(rec: TraceRecorder) -> str:
    """The recorder as Chrome trace-event JSON text, one event per line
    (deterministic: the same run gives the same text)."""
    doc = chrome_trace(rec)
    dumps: Callable[[Any], str] = lambda x: json.dumps(x, sort_keys=True)  # noqa: E731
    lines = ",\n".join(dumps(e) for e in doc["traceEvents"])
    return (
        '{"traceEvents": [\n' + lines + "\n],\n"
        f'"displayTimeUnit": {dumps(doc["displayTimeUnit"])},\n'
        f'"otherData": {dumps(doc["otherData"])}\n}}\n'
    )


def write_chrome_trace(rec: TraceRecorder, path: str | Path) -> Path:
    """Write the recorder as Chrome trace-event JSON, one event per line
    (deterministic bytes); open it in ui.perfetto.dev or chrome://tracing."""
    path = Path(path)
    text = chrome_trace_text(rec)
    try:
        write_text(path, text)  # under a temporary name, then renamed
    except OSError as e:
        raise TwinError(f"{path}: cannot write: {e.strerror}") from None
    return path
