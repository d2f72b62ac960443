"""``twin validate run RUN`` and ``twin validate runs DIR``: the twin against measured
inference-perf runs (:mod:`twin.studies.realrun`).

Each run is replayed through the spec :func:`~twin.studies.runs.read_run` builds
from it (the default perf model, nothing fitted per run) and scored per stage and for
the whole run with the published definitions. ``stage_requests`` keeps only the first
N requests sent in each stage (for speed; the server then meets each stage's later
sends idle, so a capped run can only read lower than the full one under load); a
capped run says so in its report.

Over runs (:func:`summarize`): per (stage, metric) and for the whole run per metric,
the mean and the median absolute percentage error over the runs scored, the mean
signed error, and the run with the largest error.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twin.errors import TwinError
from twin.studies.realrun import (
    METRICS,
    WHOLE,
    RealRun,
    Score,
    score,
    stage_of,
    twin_metrics,
)


@dataclass(frozen=True)
class RunScore:
    """One replayed run: how many requests the twin replayed and completed, per
    (stage, metric) its :class:`~twin.studies.realrun.Score`, and how many succeeded
    in the measured run (of all it sent; a capped replay sends fewer)."""

    key: str
    overloaded: bool
    replayed: int
    completed: int
    stage_requests: int | None
    scores: dict[tuple[int, str], Score]
    measured_completed: int | None = None  # succeeded in the run (None: not recorded)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["scores"] = [
            {"stage": s, "metric": m, **dataclasses.asdict(v)} for (s, m), v in self.scores.items()
        ]
        return out


def _capped(requests: Iterator[Any], run: RealRun, n: int) -> Iterator[Any]:
    """The first ``n`` requests sent in each stage of ``run``, renumbered 0, 1, ..."""
    seen: dict[int, int] = {}
    i = 0
    for r in requests:
        s = stage_of(r.arrival_s, run.stages)
        if seen.get(s, 0) >= n:
            continue
        seen[s] = seen.get(s, 0) + 1
        yield dataclasses.replace(r, id=i)
        i += 1


def replay(
    run: RealRun, *, stage_requests: int | None = None, overrides: Sequence[str] = ()
) -> RunScore:
    """Replay ``run`` through its spec (``overrides``: ``key.path=value`` as ``--set``)."""
    import copy

    import numpy as np

    from twin.sim.simulation import Simulation
    from twin.sim.spec import apply_overrides, resolve_spec
    from twin.workload.stream import iter_requests

    if stage_requests is not None and stage_requests < 1:
        raise TwinError(f"--stage-requests: {stage_requests}; expected an integer >= 1")
    data = copy.deepcopy(run.spec)
    apply_overrides(data, overrides)
    loaded = resolve_spec(data, run.key, Path.cwd())
    requests = None
    if stage_requests is not None:
        # the stream Simulation draws (its workload generator: the seed's first child)
        rng = np.random.default_rng(np.random.SeedSequence(loaded.seed).spawn(2)[0])
        requests = list(_capped(iter_requests(loaded.workload, rng), run, stage_requests))
    rows: list[dict[str, Any]] = []
    Simulation(loaded, requests=requests, on_row=rows.append).run()
    predicted = twin_metrics(rows, run.stages, output_means=run.output_means())
    done = sum(1 for r in rows if r.get("status") == "completed")
    return RunScore(run.key, run.overloaded, len(rows), done, stage_requests,
                    score(predicted, run.actual), run.completed)  # fmt: skip


def _stage_name(s: int) -> str:
    return "run" if s == WHOLE else f"stage {s}"


def format_run(r: RunScore) -> str:
    """A table: per stage and metric the twin's value, the measured one, the errors."""
    cap = f", first {r.stage_requests} per stage" if r.stage_requests else ""
    lines = [
        f"{r.key}: {r.replayed} requests replayed{cap}, {r.completed} completed by the twin"
        + (f" ({r.measured_completed} in the run)" if r.measured_completed is not None else "")
        + (" (overloaded in the run: not an accuracy target)" if r.overloaded else ""),
        f"{'stage':<8} {'metric':<10} {'twin':>11} {'measured':>11} {'MAPE':>9} {'signed':>9}",
    ]
    lines.append("-" * len(lines[-1]))
    for (s, m), v in r.scores.items():
        lines.append(
            f"{_stage_name(s):<8} {m:<10} {v.predicted * 1e3:>8.1f} ms {v.actual * 1e3:>8.1f} ms "
            f"{v.mape:>8.1f}% {v.signed:>+8.1f}%"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class MetricSummary:
    """Over runs, one metric of one stage (-1: the whole run): runs scored, mean and
    median MAPE, mean signed error, and the worst run with its MAPE."""

    stage: int
    metric: str
    runs: int
    mean: float
    median: float
    signed_mean: float
    worst: str
    worst_mape: float


def summarize(
    results: Sequence[RunScore], *, include_overloaded: bool = False
) -> list[MetricSummary]:
    """Per (stage, metric), over ``results`` (overloaded runs left out unless asked)."""
    pool = [r for r in results if include_overloaded or not r.overloaded]
    keys = sorted({k for r in pool for k in r.scores}, key=lambda k: (k[0], METRICS.index(k[1])))
    out = []
    for s, m in keys:
        got = [(r.key, r.scores[(s, m)]) for r in pool if (s, m) in r.scores]
        mapes = [v.mape for _, v in got]
        worst = max(got, key=lambda kv: kv[1].mape)
        out.append(MetricSummary(s, m, len(got), statistics.fmean(mapes), statistics.median(mapes),
                                 statistics.fmean(v.signed for _, v in got), worst[0],
                                 worst[1].mape))  # fmt: skip
    return out


def format_summary(rows: Sequence[MetricSummary], n_runs: int, left_out: int) -> str:
    """One table over runs: per stage and metric the mean and median MAPE, the mean
    signed error, the worst run."""
    lines = [
        f"{n_runs} runs scored"
        + (f" ({left_out} overloaded runs left out; --all adds them)" if left_out else ""),
        f"{'stage':<8} {'metric':<10} {'runs':>4} {'mean':>8} {'median':>8} {'signed':>8}"
        "  worst run",
    ]
    lines.append("-" * (len(lines[-1]) + 30))
    for r in rows:
        lines.append(
            f"{_stage_name(r.stage):<8} {r.metric:<10} {r.runs:>4} {r.mean:>7.1f}% "
            f"{r.median:>7.1f}% {r.signed_mean:>+7.1f}%  {r.worst} ({r.worst_mape:.1f}%)"
        )
    return "\n".join(lines)
