"""``twin validate run SPEC --against RESULTS``: the twin against a real serving run.

The successful requests of the real run (:mod:`twin.workload.measured`: vLLM's ``bench
serve`` detailed JSON or AIPerf's ``profile_export.jsonl``) are replayed through the spec's
deployment, each arriving at its send time (seconds from the first send) with its measured
prompt and output lengths, in place of the spec's workload. Per metric, over the requests
both completed: TTFT, TPOT and ITL (each request's largest inter-token gap, the tail ITL of
DESIGN.md; a run that lists no gaps has none), the real and the twin's mean, p50, p90 and
p99 (numpy's linear percentiles), the relative error of each, (twin - real) / real, and the
two-sample Kolmogorov-Smirnov distance between the two sets of values.

NOTE: the real TTFT includes what the client pays outside the engine (HTTP, tokenising,
detokenising, the stream), which the twin does not model; a constant offset in TTFT is that.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from twin.workload.measured import MeasuredRun, read_measured

METRICS = ("ttft", "tpot", "itl")
STATS = ("mean", "p50", "p90", "p99")


def ks_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical
    CDFs of ``a`` and ``b``, sup_x |F_a(x) - F_b(x)|, evaluated at every value of either."""
    if not len(a) or not len(b):
        raise ValueError("ks_distance: both samples need at least one value")
    x, y = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    at = np.concatenate([x, y])
    fa = np.searchsorted(x, at, side="right") / x.size
    fb = np.searchsorted(y, at, side="right") / y.size
    return float(np.max(np.abs(fa - fb)))


def stats(values: Sequence[float]) -> dict[str, float]:
    """Mean, p50, p90, p99 of ``values``."""
    v = np.asarray(values, float)
    return {
        "mean": float(v.mean()),
        "p50": float(np.percentile(v, 50)),
        "p90": float(np.percentile(v, 90)),
        "p99": float(np.percentile(v, 99)),
    }


@dataclass(frozen=True)
class MetricComparison:
    metric: str
    count: int
    real: dict[str, float]
    twin: dict[str, float]
    rel_error: dict[str, float]
    ks: float


@dataclass(frozen=True)
class RunComparison:
    spec: str
    results: str
    format: str
    sha256: str
    replayed: int
    failed_in_run: int
    not_completed: int
    metrics: list[MetricComparison]

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "results": self.results,
            "format": self.format,
            "results_sha256": self.sha256,
            "replayed": self.replayed,
            "failed_in_run": self.failed_in_run,
            "not_completed_by_twin": self.not_completed,
            "metrics": {
                m.metric: {
                    "count": m.count,
                    "real": m.real,
                    "twin": m.twin,
                    "rel_error": m.rel_error,
                    "ks": m.ks,
                }
                for m in self.metrics
            },  # fmt: skip
        }


def _rel(twin: float, real: float) -> float:
    return (twin - real) / real if real != 0 else (0.0 if twin == 0 else math.inf)


def compare(run: MeasuredRun, rows: Iterable[dict[str, Any]], spec_name: str = "") -> RunComparison:
    """Compare ``run`` with the twin's per-request ``rows`` (``on_row`` of a replay of
    :meth:`MeasuredRun.replay`, ids = positions in ``run.requests``)."""
    done = {r["id"]: r for r in rows if r.get("status") == "completed"}
    pairs: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in METRICS}
    for i, real in enumerate(run.requests):
        row = done.get(i)
        if row is None:
            continue
        pairs["ttft"][0].append(real.ttft_s)
        pairs["ttft"][1].append(float(row["ttft_s"]))
        if real.tpot_s is not None and row["tpot_s"] != "":
            pairs["tpot"][0].append(real.tpot_s)
            pairs["tpot"][1].append(float(row["tpot_s"]))
        if real.max_itl_s is not None and row["max_itl_s"] != "":
            pairs["itl"][0].append(real.max_itl_s)
            pairs["itl"][1].append(float(row["max_itl_s"]))
    out = []
    for k in METRICS:
        a, b = pairs[k]
        if not a:
            continue
        sa, sb = stats(a), stats(b)
        out.append(MetricComparison(k, len(a), sa, sb, {s: _rel(sb[s], sa[s]) for s in STATS},
                                    ks_distance(a, b)))  # fmt: skip
    return RunComparison(spec_name, run.path, run.format, run.sha256, len(run.requests),
                         run.failed, len(run.requests) - len(done), out)  # fmt: skip


def validate_run(
    spec: str, against: str, *, overrides: Sequence[str] = (), format: str = "auto"
) -> RunComparison:
    """Replay the requests of ``against`` through ``spec`` and compare (see the module)."""
    from twin.sim.simulation import Simulation
    from twin.sim.spec import load_spec

    run = read_measured(against, format)
    loaded = load_spec(spec, tuple(overrides))
    rows: list[dict[str, Any]] = []
    Simulation(loaded, requests=run.replay(), on_row=rows.append).run()
    return compare(run, rows, spec)


_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL (max per request)"}


def format_comparison(c: RunComparison) -> str:
    """A fixed-width table: per metric and statistic the real value, the twin's, the error."""
    lines = [
        f"{c.results} ({c.format}, sha256 {c.sha256[:12]}): {c.replayed} requests replayed "
        f"through {c.spec}; {c.failed_in_run} failed in the run (left out), "
        f"{c.not_completed} not completed by the twin",
        f"{'metric':<22} {'stat':<5} {'real':>11} {'twin':>11} {'error':>8}",
    ]
    lines.append("-" * len(lines[-1]))
    for m in c.metrics:
        for i, s in enumerate(STATS):
            name = f"{_NAMES[m.metric]} n={m.count}" if i == 0 else ""
            lines.append(f"{name:<22} {s:<5} {m.real[s] * 1e3:>8.2f} ms {m.twin[s] * 1e3:>8.2f} ms"
                         f" {m.rel_error[s]:>+8.1%}")  # fmt: skip
        lines.append(f"{'':<22} {'KS':<5} {m.ks:>11.3f}")
    return "\n".join(lines)
