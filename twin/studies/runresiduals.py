"""The residual table of measured runs replayed (``twin validate runs``), and how
often the measured values fell inside their leave-one-run-out intervals.

:func:`table_of` turns replayed runs (:class:`~twin.studies.validate_realrun.RunScore`,
or the ``runs`` of ``twin validate runs --json`` read back) into a
:class:`~twin.perf.residuals.Residuals`; ``twin validate runs DIR --residuals OUT``
writes it for a spec's ``perf.residuals`` and prints :func:`format_coverage`: per
metric, each run's measured values against the interval of the other runs'
residuals (:func:`twin.perf.residuals.loo_coverage`).

The replays predict each run with nothing fitted to it, so their residuals are
held out as they stand; a preset fitted to the same runs must give its
leave-one-run-out predictions instead (:func:`twin.perf.residuals.from_pairs`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from twin._io import read_text
from twin.errors import TwinError
from twin.perf.residuals import COVERAGE, Coverage, Residuals, from_pairs, loo_coverage
from twin.studies.validate_realrun import RunScore


def table_of(
    runs: Sequence[RunScore] | Sequence[Mapping[str, Any]], source: str,
    coverage: float = COVERAGE,
) -> Residuals:  # fmt: skip
    """The residuals of replayed runs (scored runs, or their ``to_dict()``)."""
    pairs = []
    for r in runs:
        if isinstance(r, RunScore):
            pairs += [(r.key, s, m, v.predicted, v.actual) for (s, m), v in r.scores.items()]
        else:
            pairs += [(r["key"], int(v["stage"]), v["metric"], float(v["predicted"]),
                       float(v["actual"])) for v in r["scores"]]  # fmt: skip
    return Residuals(tuple(from_pairs(pairs)), source, coverage)


def read_scored(path: str | Path) -> list[dict[str, Any]]:
    """The runs of a ``twin validate runs --json`` output file."""
    try:
        doc = json.loads(read_text(path, "validation output"))
        runs = doc["runs"]
        for r in runs:
            r["key"], r["scores"]  # the keys a table needs
    except (ValueError, KeyError, TypeError) as e:
        raise TwinError(
            f"{path}: not the output of twin validate runs --json ({type(e).__name__}: {e})"
        ) from None
    return list(runs)


def format_coverage(rows: Sequence[Coverage], table: Residuals) -> str:
    """Per metric: the held-out values inside their interval, of how many."""
    lines = [
        f"{table.coverage * 100:.0f}% prediction intervals, each run held out "
        f"(its values against the interval of the other {len(table.runs()) - 1} runs' residuals)",
        f"{'metric':<10} {'inside':>6} {'of':>4} {'share':>7}",
    ]
    lines += [f"{c.metric:<10} {c.inside:>6} {c.n:>4} {c.share * 100:>6.1f}%" for c in rows]
    return "\n".join(lines)


def write_table(table: Residuals, path: str | Path) -> None:
    from twin._io import write_text

    write_text(path, json.dumps(table.to_dict(), indent=1) + "\n")


def loo_table(
    runs: Sequence[Any], held_terms: Mapping[str, Mapping[str, float]],
    stage_requests: int | None, source: str,
    perf_block: Callable[[Mapping[str, float]], dict[str, Any]],
) -> Residuals:  # fmt: skip
    """The leave-one-run-out residuals of a fit (``twin calibrate --runs``): each run
    (:class:`~twin.studies.realrun.RealRun`) replayed with the terms fitted to the
    others (``held_terms``, by run key), set by the ``perf:`` block ``perf_block``
    makes of them (:func:`twin.studies.calibrate_runs.perf_block`)."""
    import dataclasses

    from twin.studies.validate_realrun import replay

    scored = []
    for run in runs:
        terms = held_terms[run.key]
        spec = {**run.spec, "perf": perf_block(terms)}
        if "client_latency_s" in terms:  # the client's share fitted with the others
            client = f"{terms['client_latency_s']!r} s"
            spec["slo"] = {**run.spec.get("slo", {}), "client_latency": client}
        scored.append(replay(dataclasses.replace(run, spec=spec), stage_requests=stage_requests))
    return table_of(scored, source)


def report_table(table: Residuals, path: str | Path) -> None:
    """Write ``table`` to ``path`` and print its held-out coverage on stderr."""
    import sys

    if len(table.runs()) < 2:
        raise TwinError(f"{path}: residuals of {len(table.runs())} run bound nothing")
    write_table(table, path)
    print(format_coverage(loo_coverage(table), table), file=sys.stderr)
    print(f"written: {path}", file=sys.stderr)
