"""Results as data: typed columns, pandas DataFrames and Parquet files.

A run's tables (per request, per instance, per link, per window) are lists of
plain rows; this module types them and hands them to pandas or pyarrow. Both
are the ``data`` extra (``pip install 'pd-twin[data]'``) and are imported
inside the functions that need them only, so a run that never asks for a
frame or a Parquet file never loads them.

Column kinds: ``int`` (int64), ``int?`` (nullable Int64: ``<NA>`` where a row
has no value), ``float`` (float64, NaN where missing), ``bool``, ``bool?``,
``str`` (pandas ``string``, ``<NA>`` where missing) and ``object`` (lists,
mappings). A missing value is always NA or NaN, never ``""``. The kinds of
the per-request table are fixed (:data:`REQUEST_KINDS`), whatever the rows
hold; those of other tables are read from their values (:func:`infer_kinds`,
:func:`parse_csv_columns`).

Parquet files are written with pyarrow alone, deterministically: the same
rows give the same bytes (no timestamps; the schema's metadata holds only
``pd-twin.kinds`` and what the caller gives, e.g. the spec's sha256).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from twin.errors import TwinError
from twin.sim.metrics import CLASS_COLUMN, MODEL_COLUMN, REQUEST_COLUMNS

INSTALL = "pip install 'pd-twin[data]'"

_INT_COLUMNS = ("id", "prompt_tokens", "output_tokens", "preemptions", "attempts", "lost_tokens")
_OTHER_KINDS = {
    "status": "str",
    "reason": "str?",  # none for a completed request
    "instance": "int?",  # none for a rejected request
    "prefill_instance": "int?",
    "decode_instance": "int?",
    "slo_met": "bool",
    "hbm_hit_tokens": "int?",  # none for a request that did not complete
    "dram_hit_tokens": "int?",
    "ssd_hit_tokens": "int?",
    "pool_hit_tokens": "int?",
}

# The per-request table (twin/sim/metrics.py's rows, ``--requests-csv``):
# counts are int64, the instances nullable, times and bytes float64 (NaN
# where a request has none), slo_met bool.
REQUEST_KINDS: dict[str, str] = {
    c: "int" if c in _INT_COLUMNS else _OTHER_KINDS.get(c, "float") for c in REQUEST_COLUMNS
}

ROW_GROUP = 65_536  # rows per Parquet row group of a streamed per-request file


def pandas() -> Any:
    """The pandas module, or a TwinError saying how to install it."""
    try:
        import pandas as pd
    except ImportError:
        raise TwinError(f"results as DataFrames need pandas: {INSTALL}") from None
    return pd


def pyarrow() -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``, or a TwinError saying how to install them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise TwinError(f"Parquet files need pyarrow: {INSTALL}") from None
    return pa, pq


def have_pyarrow() -> bool:
    """Whether pyarrow (and its Parquet module) can be imported."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


# -- typing values -------------------------------------------------------------------
def coerce(kind: str, value: Any) -> Any:
    """``value`` (a Python value or a CSV cell) as a value of column kind
    ``kind``; None for a missing one (None or "")."""
    if value is None or value == "":
        return None
    base = kind.rstrip("?")
    if base == "int":
        return int(value)
    if base == "float":
        return float(value)
    if base == "bool":
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true")
        return bool(value)
    if base == "str":
        return str(value)
    return value


def request_columns(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Per-request rows (dicts keyed by :data:`REQUEST_COLUMNS`, Python values
    or CSV cells) as typed columns."""
    cols: dict[str, list[Any]] = {c: [] for c in REQUEST_COLUMNS}
    # each row's class of traffic and model, in a run with classes, of several models
    labels: dict[str, list[Any]] = {CLASS_COLUMN: [], MODEL_COLUMN: []}
    for row in rows:
        for c, kind in REQUEST_KINDS.items():
            cols[c].append(coerce(kind, row.get(c)))
        for c, values in labels.items():
            values.append(row.get(c))
    for c, values in labels.items():
        if any(v is not None for v in values):
            cols[c] = [None if v is None else str(v) for v in values]
    return cols


def infer_kind(values: Sequence[Any]) -> str:
    """The kind of a column of Python values (None: missing)."""
    present = [v for v in values if v is not None]
    missing = "?" if len(present) < len(values) else ""
    if not present:
        return "float"
    if all(isinstance(v, bool) for v in present):
        return "bool" + missing
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "int" + missing
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return "float"
    if all(isinstance(v, str) for v in present):
        return "str" + missing
    return "object"


def records_columns(
    rows: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, list[Any]], dict[str, str]]:
    """Rows of Python values as columns (every key any row has, in first-seen
    order) and their kinds."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    cols = {n: [row.get(n) for row in rows] for n in names}
    return cols, {n: infer_kind(v) for n, v in cols.items()}


def _parse_all(cells: Sequence[str], parse: Any) -> list[Any] | None:
    out: list[Any] = []
    for c in cells:
        if c == "":
            out.append(None)
            continue
        try:
            out.append(parse(c))
        except ValueError:
            return None
    return out


def _bool(cell: str) -> bool:
    if cell not in ("True", "False"):
        raise ValueError(cell)
    return cell == "True"


def parse_csv_columns(
    header: Sequence[str], rows: Sequence[Sequence[str]], text: Iterable[str] = ()
) -> tuple[dict[str, list[Any]], dict[str, str]]:
    """CSV cells as typed columns, each column's kind read from all its cells:
    int if every non-empty cell is one, else float, else bool (True/False),
    else str (the cells as written); the columns named in ``text`` are str
    whatever they hold (ids). An empty cell is missing."""
    cols: dict[str, list[Any]] = {}
    kinds: dict[str, str] = {}
    as_text = set(text)
    for j, name in enumerate(header):
        cells = [r[j] if j < len(r) else "" for r in rows]
        missing = "?" if any(c == "" for c in cells) else ""
        parsers = () if name in as_text else (("int", int), ("float", float), ("bool", _bool))
        for kind, parse in parsers:
            values = _parse_all(cells, parse)
            if values is not None and any(v is not None for v in values):
                cols[name] = values
                kinds[name] = kind + ("" if kind == "float" else missing)
                break
        else:
            if all(c == "" for c in cells):
                cols[name], kinds[name] = [None] * len(cells), "float"
            else:
                cols[name] = [None if c == "" else c for c in cells]
                kinds[name] = "str" + missing
    return cols, kinds


# -- pandas ---------------------------------------------------------------------------
def frame(columns: Mapping[str, Sequence[Any]], kinds: Mapping[str, str]) -> Any:
    """A DataFrame of typed columns (see the module's docstring for the dtypes)."""
    pd = pandas()
    import numpy as np

    data: dict[str, Any] = {}
    for name, values in columns.items():
        kind = kinds[name]
        if kind == "int":
            data[name] = np.array(values, dtype=np.int64)
        elif kind == "int?":
            data[name] = pd.array(values, dtype="Int64")
        elif kind == "float":
            data[name] = np.array([math.nan if v is None else v for v in values], dtype=np.float64)
        elif kind == "bool":
            data[name] = np.array(values, dtype=bool)
        elif kind == "bool?":
            data[name] = pd.array(values, dtype="boolean")
        elif kind.startswith("str"):
            data[name] = pd.array(values, dtype="string")
        else:
            data[name] = pd.Series(list(values), dtype=object)
    n = len(next(iter(columns.values()))) if columns else 0
    return pd.DataFrame(data, index=pd.RangeIndex(n))


def requests_frame(rows: Iterable[Mapping[str, Any]]) -> Any:
    """Per-request rows as a DataFrame in id order, typed by :data:`REQUEST_KINDS`."""
    cols = request_columns(rows)
    order = sorted(range(len(cols["id"])), key=cols["id"].__getitem__)
    kinds = REQUEST_KINDS | {c: "str" for c in (CLASS_COLUMN, MODEL_COLUMN) if c in cols}
    return frame({c: [v[i] for i in order] for c, v in cols.items()}, kinds)


def records_frame(rows: Sequence[Mapping[str, Any]], empty: Sequence[str] = ()) -> Any:
    """Rows of Python values as a DataFrame, each column typed by its values;
    without rows, a frame of no rows and the columns ``empty`` (float64)."""
    if not rows:
        return frame({c: [] for c in empty}, dict.fromkeys(empty, "float"))
    cols, kinds = records_columns(rows)
    return frame(cols, kinds)


# -- Parquet --------------------------------------------------------------------------
_ARROW = {"int": "int64", "float": "float64", "bool": "bool_", "str": "string"}


def arrow_schema(kinds: Mapping[str, str], metadata: Mapping[str, str] | None = None) -> Any:
    """The pyarrow schema of columns of ``kinds`` (``object`` ones are written as
    JSON text), with ``pd-twin.kinds`` and ``metadata`` in its metadata."""
    pa, _ = pyarrow()
    fields = [
        pa.field(n, getattr(pa, _ARROW.get(k.rstrip("?"), "string"))()) for n, k in kinds.items()
    ]
    meta = {"pd-twin.kinds": json.dumps(dict(kinds), separators=(",", ":"))}
    meta.update(metadata or {})
    return pa.schema(fields, metadata=meta)


def _arrow_table(columns: Mapping[str, Sequence[Any]], schema: Any) -> Any:
    pa, _ = pyarrow()
    kinds = json.loads(schema.metadata[b"pd-twin.kinds"])
    arrays = []
    for f in schema:
        values = columns[f.name]
        if kinds[f.name] == "object":
            values = [None if v is None else json.dumps(v, sort_keys=True) for v in values]
        arrays.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _open_writer(path: str | Path, schema: Any) -> Any:
    _, pq = pyarrow()
    try:
        return pq.ParquetWriter(str(path), schema, compression="zstd")
    except OSError as e:
        raise TwinError(f"{path}: cannot write: {e}") from None


def write_parquet(
    path: str | Path,
    columns: Mapping[str, Sequence[Any]],
    kinds: Mapping[str, str],
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write typed columns as one Parquet file (to a temporary name, then renamed)."""
    import os

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    schema = arrow_schema(kinds, metadata)
    writer = _open_writer(tmp, schema)
    try:
        writer.write_table(_arrow_table(columns, schema), row_group_size=ROW_GROUP)
    finally:
        writer.close()
    os.replace(tmp, path)
    return path


class RequestParquet:
    """Per-request rows streamed to a Parquet file as they come (``on_row``),
    a row group every :data:`ROW_GROUP` rows, in the order given (the order
    requests end, as ``--requests-csv`` writes them); ``classes``: the rows
    carry a class column (a run with ``workload.classes``)."""

    def __init__(
        self, path: str | Path, metadata: Mapping[str, str] | None = None, classes: bool = False,
        models: bool = False,
    ) -> None:  # fmt: skip
        self.path = Path(path)
        # a run with classes of traffic (of several models): the class (model) column last
        kinds = REQUEST_KINDS | ({CLASS_COLUMN: "str"} if classes else {})
        kinds |= {MODEL_COLUMN: "str"} if models else {}
        self._schema = arrow_schema(kinds, metadata)
        self._writer = _open_writer(self.path, self._schema)
        self._rows: list[Mapping[str, Any]] = []

    def add(self, row: Mapping[str, Any]) -> None:
        self._rows.append(row)
        if len(self._rows) >= ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            table = _arrow_table(request_columns(self._rows), self._schema)
            self._writer.write_table(table, row_group_size=ROW_GROUP)
            self._rows = []

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def abort(self) -> None:
        """The run failed: close the file and remove it."""
        self._writer.close()
        self.path.unlink(missing_ok=True)


def read_parquet_columns(path: str | Path) -> tuple[dict[str, list[Any]], dict[str, str]]:
    """A Parquet file this module wrote, back as typed columns and their kinds."""
    _, pq = pyarrow()
    try:
        table = pq.read_table(str(path))
    except OSError as e:
        raise TwinError(f"{path}: cannot read: {e}") from None
    meta = table.schema.metadata or {}
    if b"pd-twin.kinds" not in meta:
        raise TwinError(f"{path}: not a pd-twin Parquet file (no pd-twin.kinds metadata)")
    kinds = json.loads(meta[b"pd-twin.kinds"])
    cols = {n: table.column(n).to_pylist() for n in table.column_names}
    for n, k in kinds.items():
        if k == "object":
            cols[n] = [None if v is None else json.loads(v) for v in cols[n]]
    return cols, kinds


# -- the summary ----------------------------------------------------------------------
def flatten(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Summary metrics with nested mappings flattened by dots (``ttft_s.p99``);
    the free-form ``rejected_by_reason`` stays one value (a mapping), so the
    keys never vary with what a run rejected."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key != "rejected_by_reason":
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out
