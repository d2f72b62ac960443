"""Classes of traffic: interactive chat, batch jobs, agents on one cluster.

``workload.classes`` lists the classes a workload's requests belong to, each
with its own priority, SLO and, for synthetic lengths, its own lengths::

    classes:
      - {name: interactive, share: 0.7, priority: 0, slo: {ttft: 1 s, tpot: 50 ms}}
      - {name: batch, share: 0.3, priority: 1, slo: {ttft: 30 s, tpot: 200 ms},
         lengths: {prompt: {dist: fixed, value: 4000}, output: {dist: fixed, value: 400}}}

A request's class is drawn by ``share`` (from a stream of its own, so the
arrival times and the workload's lengths stay what they are without
classes), or, when no class has a share, read from the trace's ``class``
column (the ``class`` key of a Mooncake JSON line): every value must name a
class. A class's ``priority`` becomes the request's (lower first: the
``priority`` queue policy serves it first, and preemption takes the running
request of the lowest class first); ``slo`` keys left out take the spec's
``slo:``; ``lengths`` (synthetic workloads only) replaces the workload's
``lengths`` for the class's requests, drawn from its own stream.

NOTE: classes share one arrival process: a class's arrivals are the
workload's thinned by its share (for Poisson arrivals, a Poisson process of
``share x rate`` each). A class with arrivals of its own shape (a batch
submitted at once) is not expressed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin._check import check_keys, duration, fraction, is_int, is_number
from twin.errors import SpecError
from twin.workload.columns import NameColumn, column_labels

if TYPE_CHECKING:
    import numpy as np

CLASS_COLUMN = "class"
"""The trace column (the Mooncake JSON key) that names each request's class."""
CLASS_NAMES = NameColumn(CLASS_COLUMN, "class", "workload.classes")


def _duration(what: str) -> dict[str, Any]:
    return {"type": ["string", "number"], "x-unit": "s",
            "description": f"{what} (default: the spec's slo)"}  # fmt: skip


CLASSES_SCHEMA = {
    "type": "array", "minItems": 1,
    "items": {
        "type": "object", "required": ["name"], "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "minLength": 1, "description": "the class's name"},
            "share": {"type": "number", "exclusiveMinimum": 0,
                      "description": "its share of the requests, drawn per request (none: "
                                     "the trace's class column)"},
            "priority": {"type": "integer", "default": 0,
                         "description": "lower first: the priority queue policy's order; "
                                        "preemption takes the largest first"},
            "slo": {"type": "object", "additionalProperties": False,
                    "description": "the class's SLO; keys left out are the spec's slo",
                    "properties": {
                        "ttft": _duration("time to first token"),
                        "tpot": _duration("time per output token"),
                        "target": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                                   "description": "the attainment its goodput is judged by "
                                                  "(default: the spec's slo.target)"}}},
            "lengths": {"description": "synthetic workloads: the class's own lengths, as "
                                      "workload.lengths (a table, {prompt, output}, "
                                      "{empirical})"},
        },
    },
}  # fmt: skip
_KEYS = ("name", "share", "priority", "slo", "lengths")


@dataclass(frozen=True, slots=True)
class TrafficClass:
    """One class of traffic. ``share`` None: the trace's ``class`` column
    names its requests. ``ttft_s``, ``tpot_s``, ``target`` None: the spec's
    ``slo:``. ``lengths`` None: the workload's."""

    name: str
    priority: int = 0
    share: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    target: float | None = None
    lengths: Any = None


def parse_classes(
    value: object, where: str, parse_lengths: Callable[[object, str], Any]
) -> tuple[TrafficClass, ...]:
    """``workload.classes``: a non-empty list of classes with distinct names,
    all with a share or none; ``parse_lengths`` reads a class's ``lengths``."""
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise SpecError(
            f"{where}: {value!r} must be a non-empty list of classes "
            "([{name: interactive, share: 0.7, priority: 0, slo: {ttft: 1 s}}, ...])"
        )
    out: list[TrafficClass] = []
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise SpecError(f"{at}: {item!r} is not a mapping; expected keys {', '.join(_KEYS)}")
        check_keys(item, at, ("name",), _KEYS)
        name = item["name"]
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise SpecError(f"{at}.name: {name!r} must be a non-empty name without spaces around")
        if any(c.name == name for c in out):
            raise SpecError(f"{at}.name: {name!r} is given twice; class names must differ")
        share = item.get("share")
        if share is not None and (not is_number(share) or not 0 < share < math.inf):
            raise SpecError(f"{at}.share: {share!r} must be a number > 0")
        priority = item.get("priority", 0)
        if not is_int(priority):
            raise SpecError(f"{at}.priority: {priority!r} must be an integer (lower first)")
        ttft, tpot, target = _slo(item.get("slo", {}), f"{at}.slo")
        lengths = None
        if item.get("lengths") is not None:
            lengths = parse_lengths(item["lengths"], f"{at}.lengths")
        out.append(
            TrafficClass(
                name,
                int(priority),
                None if share is None else float(share),
                ttft,
                tpot,
                target,
                lengths,
            )  # fmt: skip
        )
    if len({c.share is None for c in out}) > 1:
        raise SpecError(
            f"{where}: give every class a share (drawn by share) or none (the trace's "
            f"{CLASS_COLUMN!r} column names each request's class)"
        )
    return tuple(out)


def _slo(value: object, where: str) -> tuple[float | None, float | None, float | None]:
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: {value!r} is not a mapping; expected keys ttft, tpot, target")
    check_keys(value, where, (), ("ttft", "tpot", "target"))
    ttft, tpot, target = (value.get(k) for k in ("ttft", "tpot", "target"))
    return (
        None if ttft is None else duration(ttft, f"{where}.ttft"),
        None if tpot is None else duration(tpot, f"{where}.tpot"),
        None if target is None else fraction(target, f"{where}.target"),
    )


def check_classes(
    classes: tuple[TrafficClass, ...], *, trace: bool, priority: object, where: str = ""
) -> None:
    """The rules that tie ``classes`` to the rest of the workload."""
    at = f"{where}classes"
    if priority != 0:
        raise SpecError(
            f"{at}: each class has its own priority; workload.priority {priority!r} goes with "
            "no classes"
        )
    if not trace and classes[0].share is None:
        raise SpecError(f"{at}: synthetic lengths draw each request's class: give each a share")
    for i, c in enumerate(classes):
        if trace and c.lengths is not None:
            raise SpecError(
                f"{at}[{i}].lengths: a trace gives each request's lengths; a class's own "
                "lengths go with synthetic lengths (workload.lengths)"
            )


def draw_labels(
    classes: tuple[TrafficClass, ...], rng: np.random.Generator, chunk: int
) -> Iterator[int]:
    """Each request's class (its index in ``classes``) drawn by share, ``chunk`` at a time."""
    import numpy as np

    shares = np.array([c.share for c in classes], dtype=np.float64)
    p = shares / shares.sum()
    n = len(classes)
    return (int(k) for _ in itertools.count() for k in rng.choice(n, chunk, p=p))


def trace_labels(
    classes: tuple[TrafficClass, ...], path: Path, fmt: str, repeat: bool
) -> Iterator[int]:
    """Each row's class (its index in ``classes``) from the trace's ``class``
    column, in file order; again from the top for each copy when ``repeat``."""
    index = {c.name: i for i, c in enumerate(classes)}
    return column_labels(path, fmt, CLASS_NAMES, index, repeat)
