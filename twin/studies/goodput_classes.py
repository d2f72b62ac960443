"""Goodput per class of traffic (``workload.classes``).

A class's goodput is the largest request rate of that class at which its own
attainment (its requests against its SLO, ``summary.classes.<name>``) meets
its own target: the rate key is searched once more per class, the whole
workload scaled together (the classes keep their shares), and the rate found
is given as the class's share of the requests offered there. The searches run
beside the others, in the same rounds, and keep their probes in the same
store under a key of their own.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from twin.sim.classmetrics import class_slos
from twin.sim.spec import ExperimentSpec

SIDE = "class:"  # a class's search among a configuration's: "class:<name>"


def class_sides(spec: ExperimentSpec, target: float | None) -> dict[str, float]:
    """``{"class:<name>": its target}`` of the spec's classes (``target``: the
    one given for all); none without classes."""
    classes = spec.workload.classes
    if not classes:
        return {}
    slos = class_slos(spec.slo, classes)
    return {SIDE + c.name: slos[c.name].target if target is None else target for c in classes}


def class_shares(spec: ExperimentSpec) -> dict[str, float]:
    """Each class's share of the requests the spec's workload offers (the
    stream a run replays, drawn as the run draws it)."""
    from twin.workload.stream import iter_requests

    counts = Counter(
        r.traffic_class for r in iter_requests(spec.workload, np.random.default_rng(spec.seed))
    )
    n = sum(counts.values())
    return {c.name: counts[c.name] / n if n else 0.0 for c in spec.workload.classes}


def class_attainment(summary: Mapping[str, Any], name: str) -> float:
    """The attainment of class ``name`` in a run's summary (0 when none of its requests ran)."""
    att = summary["classes"][name]["slo_attainment"]
    return 0.0 if att is None else float(att)


def class_lines(rows: Sequence[Any]) -> list[str]:
    """Lines of the goodput table: each configuration's goodput per class."""
    out = []
    for r in rows:
        if not r.classes:
            continue
        each = ", ".join(
            f"{name} {'' if bounded else '>= '}{rps:.3f} (at {total:.3f} in all"
            + ("" if bounded else "; met at every rate tried") + ")"
            for name, rps, total, bounded in r.classes
        )  # fmt: skip
        out.append(f"{r.label or '(base)'}: goodput per class req/s: {each}")
    return out


def class_columns(rows: Sequence[Any]) -> list[str]:
    """The CSV's per-class columns, in the first classed row's order (none without classes)."""
    names = next((tuple(name for name, *_ in r.classes) for r in rows if r.classes), ())
    return [f"goodput_rps_{name}" for name in names]


def class_cells(row: Any, columns: Sequence[str]) -> list[float]:
    got = {f"goodput_rps_{name}": rps for name, rps, *_ in row.classes}
    return [got.get(c, math.nan) for c in columns]
