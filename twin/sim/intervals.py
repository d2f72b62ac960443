"""A run's headline figures with the intervals of its perf model's residuals.

Each latency figure of the summary (TTFT, TPOT and E2E mean, p50, p90, p99) gets
the split-conformal interval of :mod:`twin.perf.residuals` from the scores of the
measured metric that bounds it (:data:`~twin.perf.residuals.FIGURES`).

SLO attainment is counted again with every request's TTFT and TPOT scaled by the
residual bounds of ``ttft_mean`` and ``itl_mean``: by ``exp(-r_lo)`` (the slowest
the measured latencies are likely to be) for the low end, by ``exp(-r_hi)`` for
the high end. This assumes the model's error is one factor per latency shared by
every request of the deployment (the residuals are of whole-run figures, so they
say nothing about how it varies from request to request); attainment falls as
latencies grow, so the two counts bound the attainment of any factors inside
both intervals. Rejected requests are misses at either end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from twin.perf.residuals import FIGURES, Residuals, bounds, interval, latency_bounds


def _bound(x: float) -> float | None:
    """A bound for JSON: ``None`` where it is unbounded."""
    return None if math.isinf(x) else x


def attainment_scales(table: Residuals) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The (TTFT, TPOT) factors of the low and of the high attainment, or ``None``
    when the table lacks the scores of either latency."""
    r = latency_bounds(table)
    if r is None:
        return None
    slow = (math.exp(-r["ttft"][0]), math.exp(-r["tpot"][0]))
    fast = (math.exp(-r["ttft"][1]), math.exp(-r["tpot"][1]))
    return slow, fast


def summary_intervals(
    summary: Mapping[str, Any], table: Residuals, attainment: tuple[float, float] | None
) -> dict[str, Any]:
    """The ``intervals`` key of a run's summary: the coverage, the residual source,
    per figure ``{lo, hi}`` (``None``: unbounded), and the metrics with no scores."""
    out: dict[str, Any] = {
        "coverage": table.coverage,
        "source": table.source,
        "runs": len(table.runs()),
        "sha256": table.sha256(),
    }
    missing = set()
    for (key, q), metric in FIGURES.items():
        x = summary.get(key, {}).get(q)
        if x is None:
            continue
        scores = table.scores(metric)
        if not scores:
            missing.add(metric)
            continue
        lo, hi = interval(x, bounds(scores, table.coverage))
        out.setdefault(key, {})[q] = {"lo": _bound(lo), "hi": _bound(hi)}
    if attainment is not None:
        out["slo_attainment"] = {"lo": attainment[0], "hi": attainment[1]}
    if missing:
        out["no_residuals"] = sorted(missing)
    return out
