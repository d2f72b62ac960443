"""What a sweep's knees can and cannot say: a knee at the highest rate tried
is censored (the configuration met the target at every rate, its true knee
lies above), none at all is censored below; and an attainment that never
reaches the target because requests are rejected at every rate (longer than
the context, more KV than an instance holds) shows a cap, not a load effect.
The attainment figure marks censored knees apart and the sweep report lists
these notes (:func:`knee_notes`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from twin.viz.attainment import attainment_series, knee
from twin.viz.canvas import RATE_UNIT, _float


def _rejected_share(rows: Sequence[Mapping[str, str]]) -> tuple[float, dict[str, int]] | None:
    """The least share of requests a label's runs rejected, and those runs'
    reasons summed; None without the columns."""
    shares: list[float] = []
    reasons: dict[str, int] = {}
    for r in rows:
        n, rej = _float(r.get("requests")), _float(r.get("rejected"))
        if not n or rej is None:
            return None
        shares.append(rej / n)
        try:
            why = json.loads(r.get("rejected_by_reason") or "{}")
        except ValueError:
            why = {}
        for k, v in (why if isinstance(why, dict) else {}).items():
            reasons[k] = reasons.get(k, 0) + int(v)
    return (min(shares), reasons) if shares else None


def knee_notes(rows: list[dict[str, str]], target: float, where: str = "runs.csv") -> list[str]:
    """One line per kind of censored knee and per configuration whose
    attainment a rejection cap holds under the target."""
    rate_col, series = attainment_series(rows, where)
    unit = RATE_UNIT[rate_col]
    above, below, capped = [], [], []
    for label, pts in series.items():
        rates = [p[0] for p in pts]
        k = knee(rates, [p[1] for p in pts], target)
        if k is not None and k == max(rates):  # censored above
            above.append(label)
        elif k is None:
            below.append(label)
        best = max(p[1] for p in pts)
        if best < target:
            rej = _rejected_share([r for r in rows if (r.get("label") or "all") == label])
            if rej is not None and rej[0] > 1.0 - target:
                capped.append((label, rej[0], rej[1]))
    notes = []
    if above:
        top = max(p[0] for pts in series.values() for p in pts)
        notes.append(
            f"{len(above)} of {len(series)} configurations met the target at every rate "
            f"tried: their knee is censored (at or above {top:g}{unit}, the highest rate; "
            f"sweep higher rates to find it): {', '.join(above)}"
        )
    if below:
        low = min(p[0] for pts in series.values() for p in pts)
        notes.append(
            f"{len(below)} of {len(series)} configurations missed the target at every rate "
            f"tried: their knee is censored (below {low:g}{unit}, the lowest rate): "
            + ", ".join(below)
        )
    for label, share, reasons in capped:
        why = ", ".join(f"{k} {v:,}" for k, v in sorted(reasons.items())) or "rejections"
        notes.append(
            f"{label}: a cap binds: at least {share:.1%} of its requests are rejected at every "
            f"rate ({why} over its runs), more than the {1.0 - target:.0%} the target lets "
            "miss, so no rate can meet it; a model or engine.max_model_len that fits the "
            "traffic lifts the cap"
        )
    return notes
