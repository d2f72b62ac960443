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
- preemptions and role changes as instants.

NOTE: tracing turns the engine's fast-forward off (as ``log=`` does), so each
decode step is a span of its own. Results are identical either way (a
property test holds fast-forward to stepping); only the run is slower.
Iteration times come from the instance's performance model as the engine
prices the batch, so a span's duration is exactly the time the engine waits.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import twin
from twin.errors import TwinError

if TYPE_CHECKING:
    import simpy

    from twin.net.flows import Transfer
    from twin.perf.iteration import Batch, PerfModel
    from twin.sim.simulation import Simulation

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


class _EngineTap:
    """Stands in for one engine's perf model and event log: remembers the
    last batch priced, and turns the engine's ``iteration`` log entry (made
    right after pricing, with nothing in between) into a span. Other entries
    pass through to the caller's log, if any."""

    __slots__ = ("_rec", "_env", "_perf", "_log", "_instance", "_last", "name", "sha256")

    def __init__(
        self,
        rec: TraceRecorder,
        env: simpy.Environment,
        instance: int,
        perf: PerfModel,
        log: list[tuple] | None,
    ) -> None:
        self._rec = rec
        self._env = env
        self._perf = perf
        self._log = log
        self._instance = instance
        self._last: tuple[Batch, float] | None = None
        self.name = perf.name
        self.sha256 = perf.sha256

    def iteration_time(self, batch: Batch) -> float:
        dt = self._perf.iteration_time(batch)
        self._last = (batch, dt)
        return dt

    def append(self, entry: tuple) -> None:
        if self._log is not None:
            self._log.append(entry)
        kind = entry[1]
        if kind == "iteration":
            assert self._last is not None
            batch, dt = self._last
            self._rec.iterations.append(
                IterationSpan(
                    self._instance,
                    self._env.now,
                    dt,
                    tuple(entry[3]),
                    batch.prefill_tokens,
                    batch.decode_count,
                )
            )
        elif kind == "preempt":
            self._rec.instants.append((self._env.now, self._instance, f"preempt {entry[3]}"))


class TraceRecorder:
    """Collects iteration and transfer spans of one run (see the module
    docstring). Give it to one :class:`~twin.sim.simulation.Simulation` only."""

    def __init__(self) -> None:
        self.iterations: list[IterationSpan] = []
        self.transfers: list[TransferSpan] = []
        self.instants: list[tuple[float, int, str]] = []  # (time s, instance, name)
        self.instances: list[dict[str, Any]] = []  # id, name, role, node, gpus
        self.name = ""
        self._role_changes: list[tuple[float, int, str, str]] = []
        self._gpu_owner: dict[str, str] = {}  # GPU name -> instance name
        self._gpu_node: dict[str, int] = {}

    # -- hooks the simulation calls ----------------------------------------------------
    def tap(
        self,
        env: simpy.Environment,
        instance: int,
        perf: PerfModel,
        log: list[tuple] | None,
    ) -> _EngineTap:
        """The perf model and log to give engine ``instance``."""
        return _EngineTap(self, env, instance, perf, log)

    def attach(self, sim: Simulation) -> None:
        """Learn the cluster's instances (names, roles after the policy's
        setup, placement) from the simulation, before it runs."""
        if self.instances:
            raise TwinError("a TraceRecorder records one simulation; make a new one per run")
        self.name = sim.spec.name
        topo = sim.spec.topology
        for eng, p in zip(sim.engines, sim.placements, strict=True):
            name = f"{ROLE_LETTER[eng.role]}{eng.id}"
            self.instances.append(
                {"id": eng.id, "name": name, "role": eng.role, "node": p.node, "gpus": p.gpus}
            )
            if topo is not None:
                for g in p.gpus:
                    self._gpu_owner[topo.gpus[g]] = name
        if topo is not None:
            for g, gname in enumerate(topo.gpus):
                self._gpu_node[gname] = topo.node_of(g)
        self._role_changes = sim.role_changes  # filled in as the run goes

    def transfer_done(self, t: Transfer) -> None:
        """Called by the network when transfer ``t`` is delivered."""
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
    for it in rec.iterations:
        a = _ns(it.start_s)
        b = _ns(it.start_s + it.dt_s)
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
        "otherData": {"tool": "pd-twin", "version": twin.__version__, "name": rec.name},
    }


def _instant(t_s: float, instance: int, name: str) -> dict[str, Any]:
    return {
        "ph": "i",
        "s": "t",
        "cat": "event",
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
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise TwinError(f"{path}: cannot write: {e.strerror}") from None
    return path
