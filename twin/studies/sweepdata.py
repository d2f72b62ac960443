"""A sweep folder as data: ``twin.load_sweep(DIR)`` and the Parquet files a sweep writes.

The folder is the layout of twin/studies/sweep.py. ``runs.csv`` is always
there; ``runs.parquet`` holds the same columns, typed, when pyarrow was
importable. Both read back as the same frame: a column's kind comes from
all its cells (twin/sim/frames.py, ``parse_csv_columns``): int64 (nullable
``Int64`` where a run has no value), float64, bool or string; lists and
mappings (swept values, ``rejected_by_reason``) stay their JSON text.
Per-request files (``requests/<run_id>.csv`` or ``.parquet``) are typed by
the fixed per-request kinds (``twin.sim.frames.REQUEST_KINDS``).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from twin._io import read_csv
from twin.errors import TwinError
from twin.sim import frames


def runs_columns(d: Path) -> tuple[dict[str, list[Any]], dict[str, str]]:
    """``d/runs.csv`` as typed columns and their kinds."""
    path = d / "runs.csv"
    if not path.is_file():
        raise TwinError(f"{d}: no runs.csv; not a sweep folder (twin sweep SPEC --out DIR)")
    header, rows = read_csv(path, "runs.csv")
    return frames.parse_csv_columns(header, rows, text=("run_id", "label"))


def write_runs_parquet(d: Path) -> Path:
    """``d/runs.parquet`` from ``d/runs.csv`` (the same columns, typed)."""
    cols, kinds = runs_columns(d)
    return frames.write_parquet(d / "runs.parquet", cols, kinds)


def write_requests_parquet(d: Path, run_id: str, csv_text: str) -> Path:
    """``d/<run_id>.parquet``: a run's per-request CSV text, typed, rows in the
    CSV's order (the order the requests ended)."""
    rows = csv.DictReader(io.StringIO(csv_text))
    cols = frames.request_columns(rows)
    meta = {"pd-twin.run_id": run_id}
    return frames.write_parquet(d / f"{run_id}.parquet", cols, frames.REQUEST_KINDS, meta)


def _request_rows(d: Path, run_id: str) -> dict[str, list[Any]] | None:
    """The typed per-request columns of run ``run_id``, from its Parquet file
    when pyarrow can read it, else its CSV; None when neither is there."""
    pq_path = d / "requests" / f"{run_id}.parquet"
    if pq_path.is_file() and frames.have_pyarrow():
        cols, _ = frames.read_parquet_columns(pq_path)
        return cols
    csv_path = d / "requests" / f"{run_id}.csv"
    if not csv_path.is_file():
        return None
    header, rows = read_csv(csv_path, "per-request CSV")
    return frames.request_columns(dict(zip(header, r, strict=False)) for r in rows)


def load_sweep(d: str | Path, *, requests: bool = False) -> Any:
    """The runs of sweep folder ``d`` as a pandas DataFrame, one row per run in
    run order: ``run_id``, the swept keys (dotted paths), ``label``, every
    summary metric (``ttft_s.p99``, ``slo_attainment``, ...), ``gpus``.

    With ``requests=True``, every run's per-request rows instead (``twin sweep
    --requests``), concatenated in run order, each run's in id order, the
    run's ``run_id``, swept keys and ``label`` as the first columns. A run
    without per-request files is an error that names it."""
    d = Path(d)
    if not d.is_dir():
        raise TwinError(f"{d}: not a folder")
    cols, kinds = runs_columns(d)
    if not requests:
        return frames.frame(cols, kinds)
    keys = [c for c in cols if c == "run_id" or c == "label" or c in _swept(cols)]
    out: dict[str, list[Any]] = {c: [] for c in keys}
    out.update({c: [] for c in frames.REQUEST_COLUMNS})
    for i, run_id in enumerate(cols["run_id"]):
        rows = _request_rows(d, str(run_id))
        if rows is None:
            raise TwinError(
                f"{d}: run {run_id} has no requests/{run_id}.csv; sweep with --requests"
            )
        order = sorted(range(len(rows["id"])), key=rows["id"].__getitem__)
        for c in keys:
            out[c].extend([cols[c][i]] * len(order))
        for c in frames.REQUEST_COLUMNS:
            out[c].extend(rows[c][j] for j in order)
    return frames.frame(out, {**{c: kinds[c] for c in keys}, **frames.REQUEST_KINDS})


def _swept(cols: dict[str, list[Any]]) -> list[str]:
    """The swept-key columns of runs.csv: those between run_id and label."""
    names = list(cols)
    return names[names.index("run_id") + 1 : names.index("label")]
