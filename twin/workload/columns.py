"""A column of names in a trace: each request's class of traffic (``class``,
:mod:`twin.workload.classes`) or the model it asks for (``model``, on a
cluster of several models).

A CSV trace (azure, splitwise, vidur, lengths) carries it as a column, a
Mooncake JSON line as a key; the other formats carry none. Every value must
be one of the names declared; an error names the file, line, column and
value.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from twin._io import open_text
from twin.errors import TraceError
from twin.workload.traces import _csv_rows, detect_format

CSV_FORMATS = ("azure", "splitwise", "vidur", "lengths")
"""The trace formats whose rows may carry a named column (besides Mooncake's keys)."""


@dataclass(frozen=True, slots=True)
class NameColumn:
    """A trace column that names a request's ``noun`` among those ``owner``
    declares (``"class"``, ``"workload.classes"``)."""

    column: str
    noun: str
    owner: str


def column_labels(
    path: Path, fmt: str, col: NameColumn, index: Mapping[str, int], repeat: bool
) -> Iterator[int]:
    """Each row's name in ``col`` as its index in ``index``, in file order;
    again from the top for each copy when ``repeat``."""
    passes = itertools.count() if repeat else range(1)
    return itertools.chain.from_iterable(_column(path, fmt, col, index) for _ in passes)


def request_labels(
    path: Path, fmt: str, col: NameColumn, index: Mapping[str, int], repeat: bool, skip: int
) -> Iterator[int]:
    """:func:`column_labels` of the requests a workload replays: ``fmt`` may
    be ``auto``, and the first ``skip`` rows are dropped as the stream drops
    them, so that the k-th label is request k's."""
    fmt = detect_format(path) if fmt == "auto" else fmt
    return itertools.islice(column_labels(path, fmt, col, index, repeat), skip, None)


def _column(path: Path, fmt: str, col: NameColumn, index: Mapping[str, int]) -> Iterator[int]:
    if fmt == "mooncake":
        rows = _json_rows(path, col)
    elif fmt in CSV_FORMATS:
        rows = ((line, cells[0]) for line, cells in _csv_rows(path, (col.column,)))
    else:
        raise TraceError(
            f"{path}: a {fmt} trace carries no {col.column!r} column; give each of "
            f"{col.owner} a share"
        )
    for line, name in rows:
        k = index.get(name.strip()) if isinstance(name, str) else None
        if k is None:
            raise TraceError(
                f"{path}: line {line}: column {col.column}: {name!r} is not a {col.noun} of "
                f"{col.owner}; expected one of {', '.join(index)}"
            )
        yield k


def _json_rows(path: Path, col: NameColumn) -> Iterator[tuple[int, object]]:
    with open_text(path, "trace", TraceError) as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
                continue  # the trace's own reader names the line
            if not isinstance(obj, dict) or col.column not in obj:
                raise TraceError(
                    f"{path}: line {line}: no key {col.column!r}; {col.owner} without "
                    f"shares takes each request's {col.noun} from it"
                )
            yield line, obj[col.column]
