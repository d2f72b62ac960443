"""Workloads: which requests arrive when, from a trace or a generator.

A :class:`WorkloadSpec` (frozen; built from YAML by
:meth:`WorkloadSpec.from_mapping`) names either a trace file or synthetic
lengths, an optional arrival process, and bounds. :func:`iter_requests` turns
it into a lazy stream of :class:`~twin.request.Request` with ids 0, 1, 2, ...
in arrival order (ties in file order) and non-decreasing ``arrival_s``.

Randomness: ``iter_requests`` spawns two child streams from the generator it
is given, one for arrival gaps and one for lengths, so changing the arrival
rate leaves the sequence of lengths unchanged (common random numbers across
a rate sweep). Synthetic draws happen in fixed-size chunks, so a stream of
any length is produced in constant memory. A trace is read as the stream
goes (a bad row raises when the stream reaches it); a repeated one keeps its
first pass in a few flat arrays (about 40 bytes a row, plus 8 a prefix hash)
to replay the copies from.

YAML (the mapping under ``workload:``)::

    trace: path/to/trace.csv      # a trace file, or `lengths:` below (exactly one)
    format: auto                  # auto | azure | mooncake | splitwise | vidur | lengths
    #                               | inference-perf (its per-request records) | aiperf
    #                               | vllm-bench (twin.workload.measured)
    arrival: {process: poisson, rate: 5.0}         # req/s
    #        {process: gamma, rate: 5.0, cv: 2.0}  # cv of inter-arrival gaps
    lengths: azure-conv           # bundled table: azure-conv | azure-code
    #  {shared_prefix: {groups: 10, users: 10, system_prompt_len: 100, question_len: 447,
    #                   output_len: 248, multi_turn: false}}   # inference-perf's
    #  {prompt: {dist: lognormal, median: 1020, sigma: 1.0, min: 2, max: 14050},
    #   output: {dist: fixed, value: 128}}         # lognormal: median|mean, sigma|cv
    #  {empirical: path.csv, format: auto}         # rows drawn with replacement
    #  {empirical: path.csv, max_total_tokens: 2047}  # rows of prompt + output <= 2047 only
    rate_scale: 1.0               # arrival times divided by it (2.0 = twice the rate)
    rate: 12.5                    # trace only, instead of rate_scale: replay at 12.5 req/s
    rate_schedule: {kind: steps, points: [[0 s, 1.0], [10 min, 2.0]]}  # m(t) on the rate
    #  {kind: linear, points: [[0 s, 0.5], [30 min, 2.0]]}   # straight between points
    #  {kind: diurnal, period: 24 h, min: 0.3, max: 1.0, peak: 14 h}
    #  {kind: bursts, on: 30 s, off: 90 s, high: 4.0, low: 1.0}
    duration: 600 s               # keep arrivals with arrival_s < duration (after scaling)
    max_requests: 1000            # keep at most this many requests
    output_tokens: 248            # trace only: every output this long (ignore_eos runs)
    prefixes: {shared_prefix: {...}}  # trace only: prefix hashes from that workload
    repeat: false                 # loop a finite trace until duration/max_requests
    skip: 0                       # start at this request (a later window; it arrives at 0)
    prefix_block_tokens: 512      # tokens per hash id (Mooncake traces; default 512)
    priority: {0: 0.2, 1: 0.8}    # each request's priority (lower first): a share each,
    #                               drawn per request; or one integer for all (default 0)
    classes: [{name: interactive, share: 0.7, priority: 0, slo: {ttft: 1 s}}, ...]
    #                               classes of traffic (twin.workload.classes)
    timeout: 300 s                # a client gives up on a request not finished this long
    #                               after it was sent (failed, reason timeout; null: never)

``arrival`` is required for ``lengths:`` and for length-only traces; for a
timed trace it replaces the trace's times (lengths keep the file order).

The time of a request is made in this order: the source time (trace or
arrival process), ``skip`` (drop the first requests, shift the rest to start
at 0), ``/ rate_scale``, then the ``rate_schedule`` warp
(:mod:`twin.workload.schedule`: ``t = M^-1(u)``) on the simulation's clock,
then ``duration`` on the warped time. The schedule's time 0 is the first kept
request's, so every ``skip`` window sees the same schedule.
Relative paths resolve against ``base_dir`` (the spec file's folder)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from twin import yamlio
from twin._check import check_keys, duration, is_int, is_number
from twin._declare import (
    BOOL,
    NONNEG_INT,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    anything,
    choice,
    declared,
    keys,
    seconds,
)
from twin._io import read_text
from twin.bundled import spec_file
from twin.errors import SpecError, TraceError
from twin.request import Request, Session
from twin.units import parse_duration
from twin.workload.arrivals import (
    _CHUNK,
    ArrivalProcess,
    GammaArrivals,
    PoissonArrivals,
    _positive,
    arrival_times,
)
from twin.workload.classes import (
    CLASSES_SCHEMA,
    TrafficClass,
    check_classes,
    draw_labels,
    parse_classes,
    trace_labels,
)
from twin.workload.lengths import (
    BUNDLED_TABLES,
    EmpiricalLengths,
    IndependentLengths,
    LengthSampler,
    bundled_table,
    bundled_table_path,
    int_tokens,
    parse_marginal,
)
from twin.workload.schedule import (
    KINDS,
    RATE_SCHEDULE_SCHEMA,
    RateSchedule,
    parse_rate_schedule,
)
from twin.workload.sessions import Sessions, sessions_schema
from twin.workload.shared_prefix import SCHEMA as SHARED_PREFIX_SCHEMA
from twin.workload.shared_prefix import SharedPrefix
from twin.workload.traces import (
    ITERATORS,
    MOONCAKE_BLOCK_TOKENS,
    READERS,
    TIMED_FORMATS,
    TraceRecord,
    detect_format,
    file_sha256,
    iter_mooncake,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "EmpiricalFile",
    "WorkloadSpec",
    "file_sha256",
    "iter_requests",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class EmpiricalFile:
    """Lengths drawn with replacement from the rows of a trace or length-only CSV."""

    path: Path
    format: str = "auto"
    # rows whose prompt + output exceeds it are left out (None: every row)
    max_total_tokens: int | None = None


Lengths = str | IndependentLengths | EmpiricalFile | SharedPrefix | Sessions
_FORMATS = ("auto", *READERS)
_POSITIVE = {"type": "number", "exclusiveMinimum": 0}
_MARGINAL = {
    "oneOf": [
        {"type": "object", "required": ["dist", "value"], "additionalProperties": False,
         "properties": {"dist": {"const": "fixed"}, "value": {"type": "integer", "minimum": 1}}},
        {"type": "object", "required": ["dist"], "additionalProperties": False,
         "properties": {"dist": {"const": "lognormal"},
                        **{k: _POSITIVE for k in ("median", "mean", "cv")},
                        "sigma": {"type": "number", "minimum": 0},
                        **{k: {"type": "integer", "minimum": 1} for k in ("min", "max")}}},
    ]
}  # fmt: skip
_RATE = {"type": "number", "exclusiveMinimum": 0, "description": "requests/s"}
ARRIVAL_SCHEMA = {
    "oneOf": [
        {"type": "object", "required": ["process", "rate"], "additionalProperties": False,
         "properties": {"process": {"const": "poisson"}, "rate": _RATE}},
        {"type": "object", "required": ["process", "rate", "cv"], "additionalProperties": False,
         "properties": {"process": {"const": "gamma"}, "rate": _RATE,
                        "cv": _POSITIVE}},
    ]
}  # fmt: skip
LENGTHS_SCHEMA = {
    "anyOf": [
        {"enum": list(BUNDLED_TABLES)},
        {"type": "object", "required": ["prompt", "output"], "additionalProperties": False,
         "properties": {"prompt": _MARGINAL, "output": _MARGINAL}},
        {"type": "object", "required": ["empirical"], "additionalProperties": False,
         "properties": {"empirical": {"type": "string"}, "format": {"enum": list(_FORMATS)},
                        "max_total_tokens": {"type": "integer", "minimum": 1}}},
        {"type": "object", "required": ["shared_prefix"], "additionalProperties": False,
         "properties": {"shared_prefix": SHARED_PREFIX_SCHEMA}},
        sessions_schema(_MARGINAL),
    ]
}  # fmt: skip
PREFIXES_SCHEMA = {
    "type": "object", "required": ["shared_prefix"], "additionalProperties": False,
    "properties": {"shared_prefix": SHARED_PREFIX_SCHEMA},
}  # fmt: skip


PRIORITY_SCHEMA = {
    "anyOf": [
        {"type": "integer"},
        {"type": "object", "additionalProperties": {"type": "number", "exclusiveMinimum": 0}},
    ]
}


def parse_priority(value: object, where: str) -> int | tuple[tuple[int, float], ...]:
    """``workload.priority``: an integer, or a mapping of integers (or their
    digits, as JSON writes keys) to positive shares."""
    if is_int(value):
        return int(value)  # type: ignore[call-overload]
    if isinstance(value, Mapping) and value:
        out = []
        for k, w in value.items():
            if isinstance(k, str) and k.lstrip("-").isdigit():
                k = int(k)  # a JSON spec's keys are strings
            if not is_int(k) or not is_number(w) or not w > 0 or not math.isfinite(w):
                raise SpecError(
                    f"{where}: {k!r}: {w!r}; expected an integer priority and a share > 0"
                )
            out.append((int(k), float(w)))
        return tuple(out)
    raise SpecError(
        f"{where}: {value!r} must be an integer or a mapping of priorities to shares "
        "({0: 0.2, 1: 0.8})"
    )


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """What arrives: a trace file or synthetic lengths, an arrival process, bounds.

    Exactly one of ``trace`` and ``lengths``. ``lengths`` is a bundled table name
    (``azure-conv``), an :class:`~twin.workload.lengths.IndependentLengths` or an
    :class:`EmpiricalFile`. ``duration_s`` and ``max_requests`` bound the
    stream; a synthetic or repeated workload must have at least one of them.
    """

    # The YAML side of each field, for the spec's key list and its JSON Schema;
    # WorkloadSpec.from_mapping reads them (nested alternatives, its own messages).
    trace: Path | None = declared(
        None, anything({"type": "string"}), "a trace file, relative to the spec's folder"
    )
    format: str = declared("auto", choice(*_FORMATS), "the trace's format: " + " | ".join(_FORMATS))
    arrival: ArrivalProcess | None = declared(
        None, anything(ARRIVAL_SCHEMA), "{process: poisson, rate} or {process: gamma, rate, cv}"
    )
    lengths: Lengths | None = declared(
        None, anything(LENGTHS_SCHEMA),
        "instead of trace: a bundled table, {prompt, output}, {empirical: path} or "
        "{shared_prefix: {groups, users, system_prompt_len, question_len, output_len, "
        "multi_turn}} (inference-perf's, with prefix hashes)",
    )  # fmt: skip
    rate_scale: float = declared(
        1.0, POSITIVE_NUMBER, "arrival times divided by it (2.0 = twice the rate)"
    )
    duration_s: float | None = declared(
        None, seconds(), "keep arrivals before this time (after scaling)", key="duration"
    )
    max_requests: int | None = declared(None, POSITIVE_INT, "keep at most this many requests")
    repeat: bool = declared(False, BOOL, "loop a finite trace until duration or max_requests")
    prefix_block_tokens: int = declared(
        MOONCAKE_BLOCK_TOKENS, POSITIVE_INT, "tokens per prefix hash (Mooncake hash_ids)"
    )
    skip: int = declared(
        0, NONNEG_INT,
        "start at this request of the stream (a later window); it arrives at time 0",
    )  # fmt: skip
    rate_schedule: RateSchedule | None = declared(
        None, anything(RATE_SCHEDULE_SCHEMA),
        "a multiplier on the arrival rate over time, by time warping: {kind: "
        + " | ".join(KINDS) + ", ...}",
    )  # fmt: skip
    output_tokens: int | None = declared(
        None, POSITIVE_INT,
        "trace only: every request's output length in place of the trace's (a load "
        "generator that asks for N tokens with ignore_eos gets exactly N)",
    )  # fmt: skip
    prefixes: SharedPrefix | None = declared(
        None, anything(PREFIXES_SCHEMA),
        "trace only, for a trace that records no prefixes: {shared_prefix: {...}}; request "
        "n takes the prefix hashes of that workload's request n (its full blocks that fit)",
    )  # fmt: skip
    priority: int | tuple[tuple[int, float], ...] = declared(
        0, anything(PRIORITY_SCHEMA, parse_priority),
        "each request's priority, lower first: an integer, or {priority: share} drawn per request",
    )  # fmt: skip
    rate: float | None = declared(
        None, POSITIVE_NUMBER,
        "timed trace only, instead of rate_scale: replay it at this many requests/s on "
        "average (its times scaled by rate / its own rate over the requests replayed)",
    )  # fmt: skip
    classes: tuple[TrafficClass, ...] = declared(
        (), anything(CLASSES_SCHEMA),
        "classes of traffic, each with its priority and SLO: [{name, share, priority, "
        "slo: {ttft, tpot, target}, lengths}]; without shares, the trace's class column",
    )  # fmt: skip
    timeout_s: float | None = declared(
        None, seconds(),
        "the client gives up on a request not finished this long after it was sent: its work "
        "stops, its KV is freed, it ends failed (reason timeout); null: never",
        key="timeout",
    )  # fmt: skip

    def __post_init__(self) -> None:  # noqa: C901
        if (self.trace is None) == (self.lengths is None):
            raise SpecError("give exactly one of trace and lengths")
        if self.format not in _FORMATS:
            raise SpecError(
                f"format {self.format!r} unknown; expected one of {', '.join(_FORMATS)}"
            )
        if self.trace is None and self.format != "auto":
            raise SpecError("format applies to trace only")
        if self.prefixes is not None and self.trace is None:
            raise SpecError("prefixes applies to trace only (lengths: {shared_prefix} has its own)")
        if self.output_tokens is not None and (
            self.trace is None or not is_int(self.output_tokens) or self.output_tokens < 1
        ):
            raise SpecError(
                f"output_tokens(={self.output_tokens!r}) must be an integer >= 1, with a trace"
            )
        if isinstance(self.lengths, str) and self.lengths not in BUNDLED_TABLES:
            raise SpecError(
                f"lengths {self.lengths!r} unknown; expected one of {', '.join(BUNDLED_TABLES)} "
                "or a mapping with prompt/output or empirical"
            )
        if self.lengths is not None and self.arrival is None:
            raise SpecError("synthetic lengths need an arrival process (arrival: {process: ...})")
        if self.trace is not None and self.format == "lengths" and self.arrival is None:
            raise SpecError(
                "a length-only trace needs an arrival process (arrival: {process: ...})"
            )
        _positive("rate_scale", self.rate_scale)
        if self.rate is not None:
            _positive("rate", self.rate)
            if self.trace is None or self.arrival is not None:
                raise SpecError(
                    "rate replays a timed trace at that rate; an arrival process has its own "
                    "(arrival.rate)"
                )
            if self.rate_scale != 1.0:
                raise SpecError(f"rate {self.rate!r} and rate_scale {self.rate_scale!r}: give "
                                "rate (requests/s) or rate_scale (x the trace's), not both; a "
                                "null removes one (--set workload.rate_scale=null)")  # fmt: skip
        if self.duration_s is not None:
            _positive("duration", self.duration_s)
        if self.timeout_s is not None:
            _positive("timeout", self.timeout_s)
        if self.max_requests is not None and (
            not is_int(self.max_requests) or self.max_requests < 1
        ):
            raise SpecError(f"max_requests(={self.max_requests!r}) must be an integer >= 1")
        if not is_int(self.skip) or self.skip < 0:
            raise SpecError(f"skip(={self.skip!r}) must be an integer >= 0")
        if isinstance(self.lengths, Sessions):
            self.lengths.check_stream(self.skip, [c.lengths for c in self.classes])
        if not isinstance(self.repeat, bool):
            raise SpecError(f"repeat(={self.repeat!r}) must be true or false")
        if not is_int(self.prefix_block_tokens) or self.prefix_block_tokens < 1:
            raise SpecError(
                f"prefix_block_tokens(={self.prefix_block_tokens!r}) must be an integer >= 1"
            )
        if self.classes:
            check_classes(self.classes, trace=self.trace is not None, priority=self.priority)
            if any(isinstance(c.lengths, SharedPrefix) for c in self.classes):
                raise SpecError(
                    "classes: a class's lengths are a table, {prompt, output} or "
                    "{empirical: path}; shared_prefix goes in workload.lengths"
                )
        unbounded = self.lengths is not None or self.repeat
        if unbounded and self.duration_s is None and self.max_requests is None:
            what = "a synthetic workload" if self.lengths is not None else "repeat: true"
            raise SpecError(f"{what} needs duration or max_requests to end the stream")

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_mapping(  # noqa: C901
        cls, m: Mapping[str, object], where: str = "workload", base_dir: Path | None = None
    ) -> WorkloadSpec:
        """Build from the YAML mapping under ``workload:``; errors are prefixed by ``where``."""
        names = keys(cls)
        if not isinstance(m, Mapping):
            raise SpecError(f"{where}: {m!r} is not a mapping; expected keys {', '.join(names)}")
        _no_unknown(m, names, where)
        kw: dict[str, object] = {}
        try:
            if "trace" in m:
                kw["trace"] = spec_file(m["trace"], f"{where}.trace", base_dir)
            if "format" in m:
                kw["format"] = m["format"]
            if "arrival" in m:
                kw["arrival"] = _scoped(_arrival, m["arrival"], f"{where}.arrival")
            if "lengths" in m:
                kw["lengths"] = _lengths(m["lengths"], f"{where}.lengths", base_dir)
            if "rate_scale" in m:
                kw["rate_scale"] = m["rate_scale"]
            if m.get("rate") is not None:
                kw["rate"] = m["rate"]
            if m.get("rate_schedule") is not None:
                kw["rate_schedule"] = parse_rate_schedule(
                    m["rate_schedule"], f"{where}.rate_schedule"
                )
            if m.get("duration") is not None:
                try:
                    kw["duration_s"] = parse_duration(m["duration"])
                except SpecError as e:
                    raise SpecError(f"{where}.duration: {e}") from None
            if m.get("max_requests") is not None:
                kw["max_requests"] = m["max_requests"]
            if m.get("timeout") is not None:
                kw["timeout_s"] = duration(m["timeout"], f"{where}.timeout")
            if m.get("prefixes") is not None:
                kw["prefixes"] = _scoped(_prefixes, m["prefixes"], f"{where}.prefixes")
            if m.get("output_tokens") is not None:
                kw["output_tokens"] = m["output_tokens"]
            if "repeat" in m:
                kw["repeat"] = m["repeat"]
            if "skip" in m:
                kw["skip"] = m["skip"]
            if "prefix_block_tokens" in m:
                kw["prefix_block_tokens"] = m["prefix_block_tokens"]
            if "priority" in m:
                kw["priority"] = parse_priority(m["priority"], f"{where}.priority")
            if m.get("classes") is not None:
                kw["classes"] = parse_classes(
                    m["classes"], f"{where}.classes", lambda v, at: _lengths(v, at, base_dir)
                )
            return cls(**kw)  # type: ignore[arg-type]
        except SpecError as e:
            msg = str(e)
            raise SpecError(msg if msg.startswith(where) else f"{where}: {msg}") from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> WorkloadSpec:
        """Read the ``workload:`` mapping of a YAML file; paths relative to its folder."""
        path = Path(path)
        doc = yamlio.load(read_text(path, "workload", SpecError))
        if not isinstance(doc, Mapping) or "workload" not in doc:
            raise SpecError(f"{path}: expected a top-level 'workload:' mapping")
        return cls.from_mapping(doc["workload"], f"{path}: workload", path.parent)

    def check_files(self, where: str = "workload") -> None:
        """Refuse a trace or empirical table that is not a file, naming its key
        and how to point at one (``--set KEY=PATH``, or ``TWIN_DATA`` for a
        ``data:`` path)."""
        empirical = self.lengths.path if isinstance(self.lengths, EmpiricalFile) else None
        for key, path in (("trace", self.trace), ("lengths.empirical", empirical)):
            if path is not None and not path.is_file():
                k = f"{where.rpartition(': ')[2]}.{key}"
                raise SpecError(
                    f"{where}.{key}: {path}: no such file; --set {k}=PATH "
                    "(or a data: path, with TWIN_DATA=DIR)"
                )

    def sources(self) -> list[Path]:
        """Files this workload reads (trace, empirical lengths, bundled table,
        and those of the classes' own lengths), for hashing."""
        return [
            *_length_sources(self.lengths, self.trace),
            *(p for c in self.classes for p in _length_sources(c.lengths, None)),
        ]

    def source_hashes(self) -> dict[str, str]:
        """``{path: sha256}`` of :meth:`sources`."""
        return {str(p): file_sha256(p) for p in self.sources()}


def _length_sources(lengths: object, trace: Path | None) -> list[Path]:
    if trace is not None:
        return [trace]
    if isinstance(lengths, EmpiricalFile):
        return [lengths.path]
    if isinstance(lengths, str):
        return [bundled_table_path(lengths)]
    return []


def _scoped(parse: Callable[[object, str], T], value: object, where: str) -> T:
    """``parse(value, where)``, with ``where`` prefixed to any SpecError lacking it."""
    try:
        return parse(value, where)
    except SpecError as e:
        msg = str(e)
        raise SpecError(msg if msg.startswith(where) else f"{where}: {msg}") from None


def _no_unknown(m: Mapping[str, object], keys: tuple[str, ...], where: str) -> None:
    check_keys(m, where, (), keys)


def _arrival(value: object, where: str) -> ArrivalProcess:
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: {value!r} is not a mapping; expected {{process: poisson, rate}}")
    process = value.get("process")
    if process == "poisson":
        _no_unknown(value, ("process", "rate"), where)
        return PoissonArrivals(_positive("rate", _required(value, "rate", where)))
    if process == "gamma":
        _no_unknown(value, ("process", "rate", "cv"), where)
        rate = _positive("rate", _required(value, "rate", where))
        return GammaArrivals(rate, _positive("cv", _required(value, "cv", where)))
    if "process" not in value:
        raise SpecError(f"{where}.process: missing; expected one of poisson, gamma")
    raise SpecError(f"{where}.process: {process!r} unknown; expected one of poisson, gamma")


def _required(m: Mapping[str, object], key: str, where: str) -> object:
    if key not in m:
        raise SpecError(f"{where}: missing key {key!r}")
    return m[key]


def _lengths(value: object, where: str, base_dir: Path | None) -> Lengths:
    if isinstance(value, str):
        return value
    if not isinstance(value, Mapping):
        raise SpecError(
            f"{where}: {value!r} is not a table name or mapping; expected one of "
            f"{', '.join(BUNDLED_TABLES)}, {{prompt: ..., output: ...}} or {{empirical: path}}"
        )
    if "shared_prefix" in value:
        _no_unknown(value, ("shared_prefix",), where)
        return SharedPrefix.from_mapping(value["shared_prefix"], f"{where}.shared_prefix")
    if "sessions" in value:
        _no_unknown(value, ("sessions",), where)
        law = functools.partial(_scoped, parse_marginal)
        return Sessions.from_mapping(value["sessions"], f"{where}.sessions", law)
    if "empirical" in value:
        _no_unknown(value, ("empirical", "format", "max_total_tokens"), where)
        fmt = value.get("format", "auto")
        if fmt not in _FORMATS:
            raise SpecError(
                f"{where}.format: {fmt!r} unknown; expected one of {', '.join(_FORMATS)}"
            )
        return EmpiricalFile(
            spec_file(value["empirical"], f"{where}.empirical", base_dir),
            str(fmt),
            int_tokens(value, "max_total_tokens", where, None),
        )
    _no_unknown(value, ("prompt", "output"), where)
    return IndependentLengths(
        _scoped(parse_marginal, _required(value, "prompt", where), f"{where}.prompt"),
        _scoped(parse_marginal, _required(value, "output", where), f"{where}.output"),
    )


def _prefixes(value: object, where: str) -> SharedPrefix:
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: {value!r} is not a mapping; expected {{shared_prefix: {{...}}}}")
    check_keys(value, where, ("shared_prefix",))
    return SharedPrefix.from_mapping(value["shared_prefix"], f"{where}.shared_prefix")


def _sampler(lengths: str | IndependentLengths | EmpiricalFile) -> LengthSampler:
    if isinstance(lengths, str):
        return bundled_table(lengths)
    if isinstance(lengths, EmpiricalFile):
        return EmpiricalLengths.from_file(lengths.path, lengths.format, lengths.max_total_tokens)
    return lengths


# A request before its id and scaling: (source time, prompt tokens, output tokens,
# prefix hashes, tokens per hash); the time is None in a length-only source.
Row = tuple[float | None, int, int, tuple[int, ...], int]


def _sampled(sampler: LengthSampler, rng: np.random.Generator) -> Iterator[Row]:
    while True:
        prompts, outputs = sampler.sample(rng, _CHUNK)
        for p, o in zip(prompts.tolist(), outputs.tolist(), strict=True):
            yield None, p, o, (), 0


def _records(spec: WorkloadSpec, fmt: str) -> Iterator[TraceRecord]:
    assert spec.trace is not None
    if fmt == "mooncake":
        return iter_mooncake(spec.trace, spec.prefix_block_tokens)
    return ITERATORS[fmt](spec.trace)


class _Pass:
    """One pass over a trace, kept compact to replay it: times, lengths and
    tokens per hash in flat arrays, every row's prefix hashes in one flat
    array (a list should one not fit in 64 bits) cut by ``ends``."""

    __slots__ = ("times", "prompts", "outputs", "block_tokens", "hashes", "ends")

    def __init__(self) -> None:
        self.times = array("d")
        self.prompts = array("q")
        self.outputs = array("q")
        self.block_tokens = array("q")
        self.hashes: array[int] | list[int] = array("q")
        self.ends = array("q")

    def add(self, r: TraceRecord) -> None:
        self.times.append(math.nan if r.arrival_s is None else r.arrival_s)
        self.prompts.append(r.prompt_tokens)
        self.outputs.append(r.output_tokens)
        self.block_tokens.append(r.prefix_block_tokens)
        if r.prefix_hashes:
            try:
                self.hashes.extend(r.prefix_hashes)
            except OverflowError:
                self.hashes = [*self.hashes, *r.prefix_hashes]
        self.ends.append(len(self.hashes))

    def __len__(self) -> int:
        return len(self.times)


def _trace_rows(spec: WorkloadSpec, fmt: str, own_times: bool) -> Iterator[Row]:
    """The trace's rows as the file gives them, then, when ``spec.repeat``,
    copies ``k = 1, 2, ...`` of the first pass: with ``own_times`` (the
    trace's times are the arrivals) shifted by ``k`` periods
    (:func:`_repeat_period`).

    NOTE: copy k shifts every prefix hash by k * (max hash + 1), so copies share
    no prefix blocks and the repeated stream keeps the trace's own prefix-hit
    ratio instead of turning every later copy into a full cache hit.
    """
    if not spec.repeat:
        for r in _records(spec, fmt):
            yield (
                r.arrival_s,
                r.prompt_tokens,
                r.output_tokens,
                r.prefix_hashes,
                (r.prefix_block_tokens),
            )
        return
    one = _Pass()
    for r in _records(spec, fmt):
        one.add(r)
        yield r.arrival_s, r.prompt_tokens, r.output_tokens, r.prefix_hashes, r.prefix_block_tokens
    assert spec.trace is not None
    period = _repeat_period(one, spec.trace) if own_times else 0.0
    stride = 1 + max(one.hashes, default=-1)
    n = len(one)
    times, prompts, outputs, block, flat, ends = (
        one.times, one.prompts, one.outputs, one.block_tokens, one.hashes, one.ends
    )  # fmt: skip
    for k in itertools.count(1):
        shift, off = k * period, k * stride
        lo = 0
        for i in range(n):
            hi = ends[i]
            hashes = tuple(h + off for h in flat[lo:hi]) if hi > lo else ()
            lo = hi
            t = times[i] + shift if own_times else None
            yield t, prompts[i], outputs[i], hashes, block[i]


def _repeat_period(one: _Pass, path: Path) -> float:
    """The shift between copies of a repeated trace: ``span * n / (n - 1)``, ``span =
    t_last - t_first``: one mean inter-arrival gap more, so copies join at the trace's rate."""
    first, last = one.times[0], one.times[-1]
    if len(one) < 2 or last <= first:
        raise TraceError(f"{path}: cannot repeat a trace whose arrivals span 0 s")
    return (last - first) * len(one) / (len(one) - 1)


def _shared_prefix(sp: SharedPrefix, rng: np.random.Generator) -> Iterator[Row]:
    for p, o, h, b in sp.stream(rng):
        yield None, p, o, h, b


def _with_prefixes(
    rows: Iterator[Row], sp: SharedPrefix, rng: np.random.Generator
) -> Iterator[Row]:
    """``rows`` with request n's prefix hashes those of ``sp``'s request n, cut to
    the blocks that fit in the row's prompt."""
    for (t, p, o, _, _), (_, _, h, b) in zip(rows, sp.stream(rng)):  # noqa: B905 (endless)
        yield t, p, o, h[: p // b], b


def _with_output(rows: Iterator[Row], output: int) -> Iterator[Row]:
    """``rows`` with every output length set to ``output``."""
    for t, p, _, h, b in rows:
        yield t, p, output, h, b


def _timed(times: Iterator[float], rows: Iterator[Row]) -> Iterator[Row]:
    """``rows`` with their times replaced by ``times`` (an arrival process)."""
    for t, (_, p, o, h, b) in zip(times, rows):  # noqa: B905 (either may end first)
        yield t, p, o, h, b


Timed = tuple[float, int, int, tuple[int, ...], int]  # a Row whose time is known


def _warped(rows: Iterator[Timed], schedule: RateSchedule) -> Iterator[Timed]:
    """``rows`` with each time ``u`` moved to ``schedule.inverse(u)``, ``_CHUNK`` at a time."""
    import numpy as np

    while True:
        chunk = list(itertools.islice(rows, _CHUNK))
        if not chunk:
            return
        times = schedule.inverse(np.fromiter((r[0] for r in chunk), np.float64, len(chunk)))
        for t, (_, p, o, h, b) in zip(times.tolist(), chunk, strict=True):
            yield t, p, o, h, b


def own_rate(spec: WorkloadSpec) -> float | None:
    """A timed trace's own rate in requests/s: ``(n - 1) / (last - first)``
    arrival time over the requests a run replays (from ``skip``, at most
    ``max_requests``, one pass); None for an arrival process, a trace of
    fewer than two requests or one whose requests all arrive at once."""
    if spec.trace is None or spec.arrival is not None:
        return None
    fmt = detect_format(spec.trace) if spec.format == "auto" else spec.format
    if fmt not in TIMED_FORMATS:
        return None
    once = dataclasses.replace(spec, repeat=False)  # a repeated trace's rate is its pass's
    rows = itertools.islice(_trace_rows(once, fmt, own_times=True), spec.skip, None)
    if spec.max_requests is not None:
        rows = itertools.islice(rows, spec.max_requests)
    n, first, last = 0, 0.0, 0.0
    for t, *_ in rows:
        if n == 0:
            first = float(t)  # type: ignore[arg-type]  # a timed trace's rows are timed
        last = float(t)  # type: ignore[arg-type]
        n += 1
    return (n - 1) / (last - first) if n > 1 and last > first else None


def time_scale(spec: WorkloadSpec) -> float:
    """What the stream divides the source's times by: ``rate_scale``, or for
    ``rate:`` that rate over the trace's own (:func:`own_rate`)."""
    if spec.rate is None:
        return spec.rate_scale
    native = own_rate(spec)
    if native is None:
        raise SpecError(
            f"workload.rate: {spec.trace} has no rate of its own to scale (fewer than two "
            "requests, or all at one time); give an arrival process instead"
        )
    return spec.rate / native


def trace_rates(spec: WorkloadSpec) -> dict[str, float] | None:
    """A trace replayed at its own times: its own rate (:func:`own_rate`) and
    the rate replayed (own x :func:`time_scale`), in requests/s; None for an
    arrival process or a trace without a rate of its own."""
    own = own_rate(spec)
    if own is None:
        return None
    return {"own": own, "replayed": own * time_scale(spec)}


def iter_requests(  # noqa: C901
    spec: WorkloadSpec, rng: np.random.Generator, end: dict[str, float] | None = None
) -> Iterator[Request]:
    """The requests of ``spec`` in arrival order, lazily, with ids 0, 1, 2, ...

    A trace file is read as the stream goes (a repeated one keeps its first
    pass, compact); synthetic streams are drawn in chunks. ``arrival_s`` is
    the source time divided by ``rate_scale``; the stream stops at the
    first arrival ``>= duration_s``, after
    ``max_requests`` requests, or when a non-repeated trace ends. ``skip``
    drops the first requests of the stream and shifts the rest so that the
    first kept one arrives at 0; ids, ``duration_s`` and ``max_requests``
    count from it. A ``rate_schedule`` then warps the scaled time ``u`` to
    ``M^-1(u)`` (see the module docstring for the order), a chunk at a time.
    ``rate`` sets the scale instead (:func:`time_scale`). When the source runs
    out first (a trace's end, not ``duration_s`` or ``max_requests``),
    ``end["ran_out_s"]`` is set to the last arrival's time.
    """
    arrival_rng, length_rng = rng.spawn(2)
    rows: Iterator[Row]
    sessions: deque[Session] = deque()  # of the rows drawn, in order (a session workload)
    if spec.trace is not None:
        fmt = detect_format(spec.trace) if spec.format == "auto" else spec.format
        if fmt not in TIMED_FORMATS and spec.arrival is None:
            raise TraceError(
                f"{spec.trace}: a {fmt} trace has no arrival times; give arrival: {{process: ...}}"
            )
        if spec.repeat and spec.duration_s is None and spec.max_requests is None:
            raise SpecError("repeat: true needs duration or max_requests to end the stream")
        rows = _trace_rows(spec, fmt, own_times=spec.arrival is None)
        if spec.output_tokens is not None:
            rows = _with_output(rows, spec.output_tokens)
        if spec.prefixes is not None:
            rows = _with_prefixes(rows, spec.prefixes, length_rng)
        if spec.arrival is not None:
            rows = _timed(arrival_times(spec.arrival, arrival_rng), rows)
    else:
        assert spec.lengths is not None and spec.arrival is not None
        source = _synthetic(spec.lengths, length_rng, sessions)
        rows = _timed(arrival_times(spec.arrival, arrival_rng), source)

    labels = _labels(spec, rng, fmt if spec.trace is not None else "")
    t0 = 0.0
    if spec.skip:
        skipped = sum(1 for _ in itertools.islice(rows, spec.skip))
        if labels is not None:
            next(itertools.islice(labels, skipped, skipped), None)  # theirs too
        first = next(rows, None)
        if first is None:  # only a finite trace ends; a run of no request is no run
            raise SpecError(
                f"workload.skip: {spec.skip:,} is past the end of the trace {spec.trace}, "
                f"which holds {skipped:,} requests"
            )
        t0 = first[0]  # type: ignore[assignment]  # every row is timed by now
        rows = itertools.chain((first,), rows)
    limit = spec.max_requests
    scale = time_scale(spec)
    scaled: Iterator[Timed] = (
        ((t - t0) / scale, p, o, h, b)  # type: ignore[operator]  # every row is timed by now
        for t, p, o, h, b in rows
    )
    if spec.rate_schedule is not None:
        scaled = _warped(scaled, spec.rate_schedule)
    duration = spec.duration_s
    priorities = _priorities(spec.priority, rng)
    own = _class_lengths(spec.classes, rng) if labels is not None else []
    last = 0.0
    for i, (arrival_s, p, o, h, b) in enumerate(scaled):
        if limit is not None and i >= limit:
            return
        if duration is not None and arrival_s >= duration:
            return
        if arrival_s == math.inf:  # the schedule ends at 0: nothing arrives any more
            return
        sess = sessions.popleft() if sessions else None
        rid = sess.first_id if sess is not None else i
        if labels is None:
            yield Request(rid, arrival_s, p, o, h, b, next(priorities), session=sess)
        else:
            k = next(labels)
            c = spec.classes[k]
            lengths = own[k]
            if lengths is not None:
                _, p, o, h, b = next(lengths)
            yield Request(rid, arrival_s, p, o, h, b, c.priority, c.name, sess)
        last = arrival_s
    if end is not None and spec.trace is not None:
        end["ran_out_s"] = last


def _synthetic(
    lengths: Lengths, rng: np.random.Generator, sessions: deque[Session]
) -> Iterator[Row]:
    """The rows of synthetic ``lengths`` (a session workload's turn 0s, each
    session to ``sessions`` as it is drawn)."""
    if isinstance(lengths, Sessions):
        return lengths.first_turns(rng, sessions)
    if isinstance(lengths, SharedPrefix):
        return _shared_prefix(lengths, rng)
    return _sampled(_sampler(lengths), rng)


def _labels(spec: WorkloadSpec, rng: np.random.Generator, fmt: str) -> Iterator[int] | None:
    """Each request's class (its index in ``spec.classes``) in source order:
    drawn by share from a stream of its own (spawned after the arrival and
    length streams), or the trace's class column; None without classes."""
    if not spec.classes:
        return None
    if spec.classes[0].share is None:
        assert spec.trace is not None
        return trace_labels(spec.classes, spec.trace, fmt, spec.repeat)
    (draws,) = rng.spawn(1)
    return draw_labels(spec.classes, draws, _CHUNK)


def _class_lengths(
    classes: tuple[TrafficClass, ...], rng: np.random.Generator
) -> list[Iterator[Row] | None]:
    """Each class's own lengths (None: the workload's), each from a stream of its own."""
    streams = rng.spawn(len(classes))
    return [
        None if c.lengths is None else _sampled(_sampler(c.lengths), g)
        for c, g in zip(classes, streams, strict=True)
    ]


def _priorities(
    priority: int | tuple[tuple[int, float], ...], rng: np.random.Generator
) -> Iterator[int]:
    """Each request's priority: one for all, or drawn by share from a stream of
    its own (spawned after the arrival and length streams, which stay as they are)."""
    if isinstance(priority, int):
        return itertools.repeat(priority)
    import numpy as np

    (draws,) = rng.spawn(1)
    values = np.array([v for v, _ in priority])
    shares = np.array([w for _, w in priority])
    shares = shares / shares.sum()
    return (int(v) for _ in itertools.count() for v in draws.choice(values, _CHUNK, p=shares))
