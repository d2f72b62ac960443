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
  iteration cut short by a failure ends at the failure.

The recorder is an :class:`~twin.serving.observer.Observer` that wants every
iteration: it turns the engines' fast-forward off (as the :class:`EventLog` of
``log=`` does), so each decode step is a span of its own. Results are identical either way (a
property test holds fast-forward to stepping); only the run is slower.
A span's duration is the iteration time the engine reports as it starts the
iteration, exactly the time it waits.

The trace-event format: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``;
"X" (complete) events carry ``ts`` and ``dur`` in microseconds (rounded to
the nanosecond), "i" events are instants, "M" events name process 1
``instances`` (a thread per instance, ``P0 prefill``, ...) and process 2
``links`` (a thread per ordered instance pair, ``P0 -> D1``; transfers that
overlap in time on one pair go to further lanes, ``P0 -> D1 #2``, since the
spans of one thread must nest). Output is deterministic: the same run gives
the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

PID_INSTANCES = 1
PID_LINKS = 2
ROLE_LETTER = {"prefill": "P", "decode": "D", "mixed": "M"}


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

    def _describe(self, inst: InstanceInfo) -> None:
        label = f"{ROLE_LETTER[inst.role]}{inst.id}"
        self.instances.append(
            {"id": inst.id, "name": label, "role": inst.role, "node": inst.node,
             "gpus": inst.gpus}
        )  # fmt: skip
        if self._topology is not None:
            for g in inst.gpus:
                self._gpu_owner[self._topology.gpus[g]] = label

    def _saw(self, t_s: float) -> None:
        if t_s > self.end_s:
            self.end_s = t_s

    def request_ended(
        self, now: float, instance: int, req: Request, seq: Sequence | None, outcome: Outcome,
        reason: str,
    ) -> None:  # fmt: skip
        self._saw(now)

    def iteration_started(
        self, now: float, instance: int, dt: float, prefill_ids: tuple[int, ...], batch: Batch
    ) -> None:
        self.iterations.append(
            IterationSpan(instance, now, dt, prefill_ids, batch.prefill_tokens, batch.decode_count)
        )
        self._saw(now + dt)

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

    def instance_down(self, now: float, instance: int) -> None:
        self.instants.append((now, instance, "down"))
        start = self._up_since.pop(instance, None)
        if start is not None:
            self.lifetimes.append((instance, start, now))
        self._downs.setdefault(instance, []).append(now)
        self._saw(now)

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


def _lanes(spans: list[TransferSpan]) -> list[tuple[str, TransferSpan]]:
    """(thread name, span): transfers on one instance pair, greedily packed
    into the fewest lanes in which none overlap, in start order."""
    out = []
    by_pair: dict[str, list[TransferSpan]] = {}
    for s in spans:
        by_pair.setdefault(f"{s.src} -> {s.dst}", []).append(s)
    for pair in sorted(by_pair):
        ends: list[int] = []  # per lane: end (ns) of its last span
        for s in sorted(by_pair[pair], key=lambda s: (s.start_s, s.end_s, s.label)):
            a = _ns(s.start_s)
            lane = next((k for k, e in enumerate(ends) if e <= a), len(ends))
            if lane == len(ends):
                ends.append(0)
            ends[lane] = _ns(s.end_s)
            out.append((pair if lane == 0 else f"{pair} #{lane + 1}", s))
    return out


def chrome_trace(rec: TraceRecorder) -> dict[str, Any]:
    """The recorder's spans as a Chrome trace-event document (a dict)."""
    events: list[dict[str, Any]] = []

    def meta(pid: int, tid: int, what: str, name: str, sort: int) -> None:
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": what, "args": {"name": name}})
        key = "process_sort_index" if what == "process_name" else "thread_sort_index"
        args = {"sort_index": sort}
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": key, "args": args})

    meta(PID_INSTANCES, 0, "process_name", "instances", PID_INSTANCES)
    for inst in rec.instances:
        label = f"{inst['name']} {inst['role']}, node {inst['node']}"
        meta(PID_INSTANCES, inst["id"] + 1, "thread_name", label, inst["id"])
    body: list[dict[str, Any]] = []
    names = {inst["id"]: inst["name"] for inst in rec.instances}
    for i, up_s, down_s in rec.lifetime_spans():
        a, b = _ns(up_s), _ns(down_s)
        body.append(
            {"ph": "X", "cat": "lifetime", "name": "lifetime", "pid": PID_INSTANCES,
             "tid": i + 1, "ts": _us(a), "dur": _us(b - a),
             "args": {"instance": names.get(i, str(i))}}
        )  # fmt: skip
    downs = {i: sorted(ts) for i, ts in rec._downs.items()}
    for it in rec.iterations:
        a = _ns(it.start_s)
        end_s = it.start_s + it.dt_s
        cut = next((d for d in downs.get(it.instance, ()) if it.start_s <= d < end_s), None)
        b = _ns(end_s if cut is None else cut)  # cut short by a failure
        body.append(
            {
                "ph": "X",
                "cat": "iteration",
                "name": it.kind,
                "pid": PID_INSTANCES,
                "tid": it.instance + 1,
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
    lanes = _lanes(rec.transfers)
    if lanes:
        meta(PID_LINKS, 0, "process_name", "links", PID_LINKS)
    tids: dict[str, int] = {}
    for thread, s in lanes:
        if thread not in tids:
            tids[thread] = len(tids) + 1
            meta(PID_LINKS, tids[thread], "thread_name", thread, tids[thread])
        a, b = _ns(s.start_s), _ns(s.end_s)
        body.append(
            {
                "ph": "X",
                "cat": "transfer",
                "name": s.label,
                "pid": PID_LINKS,
                "tid": tids[thread],
                "ts": _us(a),
                "dur": _us(b - a),
                "args": {"bytes": s.size_bytes, "flows": s.flows, "src": s.src, "dst": s.dst},
            }
        )
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


def write_chrome_trace(rec: TraceRecorder, path: str | Path) -> Path:
    """Write the recorder as Chrome trace-event JSON, one event per line
    (deterministic bytes); open it in ui.perfetto.dev or chrome://tracing."""
    doc = chrome_trace(rec)
    path = Path(path)
    dumps: Callable[[Any], str] = lambda x: json.dumps(x, sort_keys=True)  # noqa: E731
    lines = ",\n".join(dumps(e) for e in doc["traceEvents"])
    text = (
        '{"traceEvents": [\n' + lines + "\n],\n"
        f'"displayTimeUnit": {dumps(doc["displayTimeUnit"])},\n'
        f'"otherData": {dumps(doc["otherData"])}\n}}\n'
    )
    try:
        write_text(path, text)  # under a temporary name, then renamed
    except OSError as e:
        raise TwinError(f"{path}: cannot write: {e.strerror}") from None
    return path
