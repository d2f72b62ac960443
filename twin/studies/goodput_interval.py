"""Goodput's prediction interval, from the perf model's residuals (``perf.residuals``).

Under the assumption of :mod:`twin.sim.intervals` (the model's error is one factor
per latency, shared by every request), a request whose measured latencies are its
predicted ones times ``f`` meets an SLO ``S`` exactly when its predicted ones meet
``S / f``. So the low end of goodput is the goodput searched with the SLOs
``S exp(r_lo)`` (TTFT by ``ttft_mean``'s residual bound, TPOT by ``itl_mean``'s:
the latencies as slow as the measured ones are likely to be), the high end the one
searched with ``S exp(r_hi)``; each search runs beside the point's, at the same
seeds. Seeds and model error combine as an envelope: the low end is the smallest
of the seeds' low ends, the high end the largest of their high ends, so the
interval covers the spread of the seeds as well as the model's error. A bound
with too few residuals for its tail is unbounded: the low end is then 0 req/s and
the high end none, without a search.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

from twin.perf.residuals import SCALES, latency_bounds
from twin.sim.simulation import spec_residuals
from twin.sim.spec import ExperimentSpec

SIDES = ("lo", "hi")


def slo_sides(spec: ExperimentSpec) -> tuple[dict[str, dict[str, float] | None], float | None]:
    """Per side, the SLOs (s) its search meets (``None``: unbounded, no search),
    and the coverage; ``({}, None)`` when the perf model has no residuals or they
    lack the scores of TTFT or TPOT."""
    table = spec_residuals(spec)
    if table is None:
        return {}, None
    r = latency_bounds(table)
    if r is None:
        return {}, None
    slo = {"ttft": spec.slo.ttft_s, "tpot": spec.slo.tpot_s}
    out: dict[str, dict[str, float] | None] = {}
    for i, side in enumerate(SIDES):
        if any(math.isinf(r[lat][i]) for lat in SCALES):
            out[side] = None
            continue
        out[side] = {
            k: v * math.exp(r[k][i]) for k, v in slo.items() if not math.isinf(v)
        }  # fmt: skip
    return out, table.coverage


def with_slo(data: Mapping[str, Any], slo: Mapping[str, float]) -> dict[str, Any]:
    """A copy of the spec ``data`` with ``slo.ttft`` / ``slo.tpot`` set (seconds)."""
    d = copy.deepcopy(dict(data))
    d["slo"] = {**d.get("slo", {}), **slo}
    return d


def envelope(
    sides: Mapping[str, Any], lo_rps: Sequence[float], hi: Sequence[tuple[float, bool]]
) -> tuple[float, float | None]:
    """The interval over seeds: the smallest low end (0 without a low search), the
    largest high end (``None`` without a high search or where one met the target
    at every rate tried)."""
    low = min(lo_rps) if sides.get("lo") is not None else 0.0
    if sides.get("hi") is None or not all(b for _, b in hi):
        return low, None
    return low, max(r for r, _ in hi)


def interval_lines(rows: Sequence[Any]) -> list[str]:
    """The goodput table's lines of intervals (none without residuals)."""
    out = []
    for r in rows:
        if r.interval is None:
            continue
        lo, hi = r.interval
        top = "unbounded" if hi is None else f"{hi:.3f}"
        out.append(
            f"{r.label or '(base)'}: {r.coverage * 100:.0f}% prediction interval "
            f"{lo:.3f} - {top} req/s (the perf model's residuals, envelope over seeds)"
        )
    return out
