"""How sure a prediction is: split-conformal intervals from a perf model's held-out errors.

A *residual table* holds, per measured run, load stage and metric, the log-ratio
``log(predicted / measured)`` of a perf model's prediction for a run it was not
fitted to (leave-one-run-out when the model was fitted to these runs; any
prediction when nothing was fitted to them). ``twin validate runs --residuals
FILE`` writes one from its replays (:func:`from_pairs` takes the (predicted,
measured) pairs); a spec's ``perf.residuals`` names one (a path, or a mapping
``{path | rows, coverage}``) and the run then carries an interval beside each
headline figure.

The interval (split conformal prediction: Lei, G'Sell, Rinaldo, Tibshirani and
Wasserman, "Distribution-free predictive inference for regression", JASA 2018,
Sec. 2.2; Angelopoulos and Bates, "A gentle introduction to conformal prediction
and distribution-free uncertainty quantification", 2021, Sec. 1): with n scores
``r_1 <= ... <= r_n`` of one metric and coverage ``1 - a``, the lower bound of the
residual is ``r_(k_lo)``, ``k_lo = floor((n + 1) a / 2)`` (minus infinity when 0),
the upper one ``r_(k_hi)``, ``k_hi = ceil((n + 1) (1 - a / 2))`` (plus infinity
when above n): each one-sided bound misses a new exchangeable score with
probability at most ``a / 2``, so both hold with probability at least ``1 - a``.
A prediction ``x`` then reads as the measured value lying in
``[x exp(-r_hi), x exp(-r_lo)]``.

A score is one (run, stage): each load stage of a run is one deployment at one
load, as a ``twin run`` is; a run without per-stage rows gives its whole-run row.
Stages of one run share the deployment, so they are not independent: the
guarantee holds for exchangeable scores, and :func:`loo_coverage` measures what
it is on the table itself (each run's scores against the interval of the other
runs' scores).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twin._io import read_text
from twin.bundled import spec_file
from twin.errors import SpecError

COVERAGE = 0.8  # the default: 4 measured values in 5 inside
METRICS = ("e2e_mean", "e2e_p90", "e2e_p99", "ttft_mean", "ttft_p90", "ttft_p99", "itl_mean")

# The summary figure -> the measured metric whose residuals bound it. The
# measured reports give mean, p90 and p99 of TTFT and E2E, and for the tokens
# only itl_mean ((E2E mean - TTFT mean) / (mean output - 1), a mean TPOT): the
# median takes the mean's residuals, every TPOT figure itl_mean's.
FIGURES: dict[tuple[str, str], str] = {
    **{(f"{lat}_s", q): f"{lat}_{'mean' if q == 'p50' else q}"
       for lat in ("ttft", "e2e") for q in ("mean", "p50", "p90", "p99")},
    **{("tpot_s", q): "itl_mean" for q in ("mean", "p50", "p90", "p99")},
}  # fmt: skip
# The per-request latencies an attainment counts -> the metric that scales them.
SCALES = {"ttft": "ttft_mean", "tpot": "itl_mean"}


@dataclass(frozen=True)
class Residual:
    """One held-out prediction: run, stage (-1: the whole run), metric and
    ``log(predicted / measured)``."""

    run: str
    stage: int
    metric: str
    log_ratio: float


def from_pairs(pairs: Iterable[tuple[str, int, str, float, float]]) -> list[Residual]:
    """Residuals of (run, stage, metric, predicted, measured) pairs; a pair with a
    value that is not positive and finite (a twin that completed nothing) is left
    out, as it bounds nothing."""
    out = []
    for run, stage, metric, p, a in pairs:
        if p > 0 and a > 0 and math.isfinite(p) and math.isfinite(a):
            out.append(Residual(run, stage, metric, math.log(p / a)))
    return out


@dataclass(frozen=True)
class Residuals:
    """A residual table, where it came from, and the coverage its intervals take."""

    rows: tuple[Residual, ...]
    source: str
    coverage: float = COVERAGE

    def scores(self, metric: str, *, leave_out: str | None = None) -> list[float]:
        """The sorted scores of ``metric``: one per (run, stage), a run's whole-run
        row only where it has no stage rows; ``leave_out``: without that run's."""
        staged = {r.run for r in self.rows if r.metric == metric and r.stage >= 0}
        return sorted(
            r.log_ratio for r in self.rows
            if r.metric == metric and r.run != leave_out and (r.stage >= 0) == (r.run in staged)
        )  # fmt: skip

    def runs(self) -> list[str]:
        return sorted({r.run for r in self.rows})

    def sha256(self) -> str:
        """The rows' digest (as :meth:`to_dict` writes them): ties a result to its table."""
        rows = json.dumps(self.to_dict()["rows"], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(rows.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "coverage": self.coverage,
            "rows": [
                {"run": r.run, "stage": r.stage, "metric": r.metric,
                 "log_ratio": round(r.log_ratio, 6)}
                for r in self.rows
            ],
        }  # fmt: skip


def bounds(scores: Sequence[float], coverage: float) -> tuple[float, float]:
    """The split-conformal bounds ``(r_lo, r_hi)`` of the residual at ``coverage``
    from sorted ``scores`` (module docstring); an infinite bound where there are
    too few scores for that tail."""
    n = len(scores)
    a = 1.0 - coverage
    eps = 1e-9  # (n + 1) a / 2 exact in decimals (0.8 -> a = 0.19999999999999996)
    k_lo = math.floor((n + 1) * a / 2 + eps)
    k_hi = math.ceil((n + 1) * (1 - a / 2) - eps)
    lo = scores[k_lo - 1] if k_lo >= 1 else -math.inf
    hi = scores[k_hi - 1] if k_hi <= n else math.inf
    return lo, hi


def interval(x: float, r: tuple[float, float]) -> tuple[float, float]:
    """Where the measured value of a prediction ``x`` lies, given residual bounds
    ``r`` (``r_lo``, ``r_hi``): ``[x exp(-r_hi), x exp(-r_lo)]``."""
    lo, hi = r
    low = x * math.exp(-hi) if hi < math.inf else 0.0
    return low, x * math.exp(-lo) if lo > -math.inf else math.inf


def latency_bounds(table: Residuals) -> dict[str, tuple[float, float]] | None:
    """Per latency of :data:`SCALES` (``ttft``, ``tpot``) the residual bounds that
    scale a request's, or ``None`` when the table lacks the scores of either."""
    out = {}
    for lat, metric in SCALES.items():
        scores = table.scores(metric)
        if not scores:
            return None
        out[lat] = bounds(scores, table.coverage)
    return out


@dataclass(frozen=True)
class Coverage:
    """Over the runs of a table, one metric: how many held-out scores fell inside
    the interval of the other runs' scores (``inside`` of ``n``)."""

    metric: str
    inside: int
    n: int

    @property
    def share(self) -> float:
        return self.inside / self.n if self.n else math.nan


def loo_coverage(table: Residuals, coverage: float | None = None) -> list[Coverage]:
    """Per metric of :data:`METRICS` the table has, leaving each run out in turn:
    its scores against the bounds of the other runs' (``coverage``: the table's
    unless given). A measured value lies in ``[x exp(-r_hi), x exp(-r_lo)]``
    exactly when its score lies in ``[r_lo, r_hi]``."""
    c = table.coverage if coverage is None else coverage
    out = []
    for m in METRICS:
        inside = n = 0
        for run in table.runs():
            held = Residuals(tuple(r for r in table.rows if r.run == run), table.source)
            own = held.scores(m)
            if not own:
                continue
            lo, hi = bounds(table.scores(m, leave_out=run), c)
            inside += sum(lo <= s <= hi for s in own)
            n += len(own)
        if n:
            out.append(Coverage(m, inside, n))
    return out


def _coverage(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise SpecError(f"{where}: {value!r}; expected a number between 0 and 1 (exclusive)")
    return float(value)


def _rows(value: Any, where: str) -> tuple[Residual, ...]:
    if not isinstance(value, list) or not value:
        raise SpecError(f"{where}: {value!r}; expected a non-empty list of rows")
    out = []
    for i, row in enumerate(value):
        w = f"{where}[{i}]"
        if not isinstance(row, Mapping) or set(row) != {"run", "stage", "metric", "log_ratio"}:
            raise SpecError(f"{w}: {row!r}; expected a mapping of run, stage, metric, log_ratio")
        if row["metric"] not in METRICS:
            raise SpecError(f"{w}.metric: {row['metric']!r}; expected one of {', '.join(METRICS)}")
        r = row["log_ratio"]
        if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r):
            raise SpecError(f"{w}.log_ratio: {r!r}; expected a finite number")
        if isinstance(row["stage"], bool) or not isinstance(row["stage"], int):
            raise SpecError(f"{w}.stage: {row['stage']!r}; expected an integer")
        out.append(Residual(str(row["run"]), row["stage"], row["metric"], float(r)))
    return tuple(out)


def read_residuals(value: Any, where: str, base_dir: Path | None = None) -> Residuals:
    """``perf.residuals``: a file path (YAML or JSON of :meth:`Residuals.to_dict`),
    or a mapping of ``path`` or ``rows``, with an optional ``coverage``
    (default: the file's, else 80%)."""
    spec: Mapping[str, Any] = {"path": value} if isinstance(value, str) else value
    if not isinstance(spec, Mapping) or ("path" in spec) == ("rows" in spec):
        raise SpecError(f"{where}: {value!r}; expected a file path or a mapping with path or rows")
    unknown = set(spec) - {"path", "rows", "coverage", "source"}
    if unknown:
        raise SpecError(
            f"{where}: unknown key {sorted(unknown)[0]!r}; expected path, rows, coverage, source"
        )
    doc: Mapping[str, Any] = spec
    source = str(spec.get("source", "inline"))
    if "path" in spec:
        from twin.yamlio import load_text

        path = spec_file(spec["path"], f"{where}.path", base_dir)
        if not path.is_file():
            raise SpecError(f"{where}.path: {str(path)!r} is not a file")
        doc = load_text(read_text(path, "residual table", SpecError), str(path))
        if not isinstance(doc, Mapping) or "rows" not in doc:
            raise SpecError(f"{path}: expected a mapping with rows (a residual table)")
        where, source = str(path), str(doc.get("source", path.name))
    coverage = spec.get("coverage", doc.get("coverage", COVERAGE))
    return Residuals(
        _rows(doc["rows"], f"{where}.rows"), source, _coverage(coverage, f"{where}.coverage")
    )
