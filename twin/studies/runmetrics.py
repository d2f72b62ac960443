"""The published metrics of measured serving runs, for the twin's side and the score.

Per load stage (a request belongs to the stage during which it was sent; one sent
after the last stage's end to the last stage) and for the whole run (-1), over
completed requests: E2E and TTFT mean, p90 and p99 (numpy's linear percentiles, as
inference-perf's reports), and ``itl_mean = (E2E mean - TTFT mean) / (mean output -
1)`` (``shared/data/realruns/PROVENANCE.md``). :func:`score` gives per (stage, metric)
the absolute percentage error and the signed one.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from twin.errors import TwinError

METRICS = ("e2e_mean", "e2e_p90", "e2e_p99", "ttft_mean", "ttft_p90", "ttft_p99", "itl_mean")
WHOLE = -1  # the stage index of the whole run


def _rows(result: Any) -> Iterable[Mapping[str, Any]]:
    """The request rows of a :class:`twin.Result` (kept by ``twin.run``), or ``result``
    itself when it is the rows."""
    if not hasattr(result, "request_rows"):
        return result  # type: ignore[no-any-return]
    if result.request_rows is None:
        raise TwinError("twin_metrics: the result kept no request rows (keep_requests=True)")
    return result.request_rows  # type: ignore[no-any-return]


def stage_of(t: float, stages: tuple[tuple[float, float], ...]) -> int:
    """The stage during which a request sent at ``t`` s was sent (after the last
    stage's end: the last stage)."""
    starts = np.cumsum([0.0] + [d for _, d in stages[:-1]])
    return max(0, bisect_right(starts.tolist(), t) - 1)


def twin_metrics(
    result: Any,
    stages: tuple[tuple[float, float], ...],
    *,
    output_means: Mapping[int, float] | None = None,
) -> dict[int, dict[str, float]]:
    """The metrics of the module over the completed requests of ``result`` (a
    :class:`twin.Result` with its requests, or an iterable of request rows), per stage
    of ``stages`` and for the whole run (-1). ``output_means`` (per stage) replaces the
    twin's own mean output in ``itl_mean``'s denominator: pass the measured run's
    (:meth:`RealRun.output_means`) so both sides divide by the same count."""
    groups: dict[int, list[tuple[float, float, int]]] = {WHOLE: []}
    for r in _rows(result):
        if r.get("status") != "completed":
            continue
        item = (float(r["e2e_s"]), float(r["ttft_s"]), int(r["output_tokens"]))
        groups[WHOLE].append(item)
        groups.setdefault(stage_of(float(r["arrival_s"]), stages), []).append(item)
    out: dict[int, dict[str, float]] = {}
    for s, items in sorted(groups.items()):
        if not items:
            continue
        a = np.asarray(items, dtype=float)
        e2e, ttft, outs = a[:, 0], a[:, 1], a[:, 2]
        m = {
            "e2e_mean": float(e2e.mean()),
            "e2e_p90": float(np.percentile(e2e, 90)),
            "e2e_p99": float(np.percentile(e2e, 99)),
            "ttft_mean": float(ttft.mean()),
            "ttft_p90": float(np.percentile(ttft, 90)),
            "ttft_p99": float(np.percentile(ttft, 99)),
        }
        n = (output_means or {}).get(s, float(outs.mean()))
        if n > 1:
            m["itl_mean"] = (m["e2e_mean"] - m["ttft_mean"]) / (n - 1)
        out[s] = m
    return out


@dataclass(frozen=True)
class Score:
    """One (stage, metric): the twin's value, the measured one (s), the absolute
    percentage error ``|p - a| / a x 100`` and the signed one ``(p - a) / a x 100``."""

    predicted: float
    actual: float
    mape: float
    signed: float


def score(
    predicted: Mapping[int, Mapping[str, float]], actual: Mapping[int, Mapping[str, float]]
) -> dict[tuple[int, str], Score]:
    """Per (stage, metric) that both sides have (stage order, then :data:`METRICS`)."""
    out = {}
    for s in sorted(set(predicted) & set(actual)):
        for m in METRICS:
            if m in predicted[s] and m in actual[s]:
                p, a = predicted[s][m], actual[s][m]
                signed = (p - a) / a * 100 if a else math.inf
                out[(s, m)] = Score(p, a, abs(signed), signed)
    return out
