"""Readers for public LLM request traces.

Each reader takes a path and yields the file's requests as
:class:`TraceRecord` in file order (``iter_*``, :func:`iter_trace`: a row at
a time, so a long trace streams in constant memory), or returns them as a
list (``read_*``, :func:`read_trace`), validated: arrival times are seconds
(float) and non-decreasing, token counts are integers >= 1. A streamed file
is checked as it is read, so a bad row raises when the stream reaches it. The
project never downloads; the caller passes a path (see ``shared/data/traces``
for the files and their provenance).

Supported formats (``format=`` names):

``azure``
    Azure LLM inference trace 2023 (Splitwise, ISCA'24):
    ``TIMESTAMP,ContextTokens,GeneratedTokens`` with wall-clock timestamps
    ``2023-11-16 18:15:46.6805900``; arrival = timestamp - first timestamp,
    computed in integer nanoseconds so the 7 fractional digits are exact
    (the fixed layout is read field by field; anything else that
    ``datetime.strptime`` accepts, ``2023-11-16 8:15:46`` say, goes through it).
``mooncake``
    Mooncake FAST'25 JSONL: ``timestamp`` (ms from trace start),
    ``input_length``, ``output_length``, ``hash_ids`` (512-token blocks).
``splitwise``
    splitwise-sim CSV: ``request_id,request_type,application_id,
    arrival_timestamp,batch_size,prompt_size,token_size``; seconds.
``vidur``
    Vidur processed trace: ``arrived_at`` (s), ``num_prefill_tokens``,
    ``num_decode_tokens``.
``inference-perf``
    inference-perf's ``per_request_lifecycle_metrics.json``, or those records
    reduced to CSV (gzipped or not); see :mod:`twin.workload.inference_perf`.
``aiperf``, ``vllm-bench``
    the successful requests of AIPerf's ``profile_export.jsonl`` and of a ``vllm
    bench serve --save-result --save-detailed`` JSON at their send times; see
    :mod:`twin.workload.measured`.
``lengths``
    Length-only CSV (ShareGPT / arXiv samples of Sarathi-Serve and Vidur):
    ``num_prefill_tokens,num_decode_tokens,...``; no times, so
    ``arrival_s`` is ``None`` and a synthetic arrival process must supply them.

Every error is a one-line :class:`~twin.errors.TraceError` naming the file,
the line, the column and the value, and saying what was expected.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from twin._check import is_int
from twin._io import open_text
from twin.errors import TraceError, UnknownNameError
from twin.workload.inference_perf import is_records_file
from twin.workload.inference_perf import iter_inference_perf as _inference_perf_records
from twin.workload.records import TraceRecord, parse_seconds, parse_tokens, where

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry in the Mooncake FAST'25 traces."""


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# The Azure traces' layout, ASCII digits only; what it does not match goes to strptime.
_AZURE_FIXED = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2})")
_EPOCH_DAY = date(1970, 1, 1).toordinal()


def _azure_ns(path: Path, line: int, column: str, raw: str) -> int:
    """Integer nanoseconds since the epoch (naive, read as UTC) of ``YYYY-MM-DD HH:MM:SS.f*``.

    The fixed layout is read field by field, exact in integers; any other
    text takes :func:`_azure_ns_strptime`, which gives the same value for
    every text both accept (``tests/test_traces.py`` checks both on every row
    of the Azure traces)."""
    s = raw.strip()
    whole, dot, frac = s.partition(".")
    m = _AZURE_FIXED.fullmatch(whole)
    if m is not None and (not dot or (len(frac) <= 9 and frac.isascii() and frac.isdigit())):
        try:
            day: int | None = date(int(m[1]), int(m[2]), int(m[3])).toordinal() - _EPOCH_DAY
        except ValueError:  # no such day: strptime says so
            day = None
        h, mi, sec = int(m[4]), int(m[5]), int(m[6])
        if day is not None and h < 24 and mi < 60 and sec < 60:
            epoch_s = day * 86_400 + h * 3_600 + mi * 60 + sec
            return epoch_s * 1_000_000_000 + (int(frac.ljust(9, "0")) if frac else 0)
    return _azure_ns_strptime(path, line, column, raw)


def _azure_ns_strptime(path: Path, line: int, column: str, raw: str) -> int:
    """:func:`_azure_ns` by ``datetime.strptime``: the reference, and the path
    of texts outside the fixed layout (which it accepts or rejects with the
    error)."""
    s = raw.strip()
    whole, dot, frac = s.partition(".")
    expected = "expected a timestamp 'YYYY-MM-DD HH:MM:SS.fffffff'"
    if dot and not (frac.isdigit() and len(frac) <= 9):
        raise TraceError(f"{where(path, line, column)}: {raw!r} is not a timestamp; {expected}")
    try:
        dt = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        raise TraceError(
            f"{where(path, line, column)}: {raw!r} is not a timestamp; {expected}"
        ) from None
    epoch_s = (dt - datetime(1970, 1, 1, tzinfo=UTC)) // _ONE_SECOND
    return epoch_s * 1_000_000_000 + (int(frac.ljust(9, "0")) if frac else 0)


_ONE_SECOND = datetime(1970, 1, 1, 0, 0, 1) - datetime(1970, 1, 1)


class _Monotone:
    """Checks that arrival times never decrease, naming the offending line."""

    def __init__(self, path: Path, column: str) -> None:
        self.path, self.column = path, column
        self.last: float | None = None
        self.last_line = 0

    def check(self, line: int, t: float, raw: object) -> None:
        if self.last is not None and t < self.last:
            raise TraceError(
                f"{where(self.path, line, self.column)}: {raw!r} is earlier than line "
                f"{self.last_line}; expected non-decreasing arrival times"
            )
        self.last, self.last_line = t, line


# --------------------------------------------------------------------------- CSV plumbing


def _csv_rows(
    path: Path, required: Sequence[str], take: Sequence[str] | None = None
) -> Iterator[tuple[int, list[str]]]:
    """(line number, the raw values of the columns ``take``, default
    ``required``, in that order) for each data row; checks header and widths.
    Bytes that are not UTF-8 and rows the csv module refuses (a cell over its
    field limit, an unclosed quote at the end) are :class:`TraceError`."""
    with open_text(path, "trace", TraceError) as f:
        reader = csv.reader(f)
        try:
            yield from _csv_body(path, reader, required, take)
        except csv.Error as e:
            raise TraceError(
                f"{path}: line {reader.line_num}: not a CSV row the reader accepts ({e}); "
                f"expected at most {csv.field_size_limit():,} characters per cell"
                if "field limit" in str(e)
                else f"{path}: line {reader.line_num}: not valid CSV ({e})"
            ) from None


def _csv_body(
    path: Path, reader: Any, required: Sequence[str], take: Sequence[str] | None
) -> Iterator[tuple[int, list[str]]]:
    header = next(reader, None)
    expected = ", ".join(required)
    if header is None or not any(h.strip() for h in header):
        raise TraceError(f"{path}: empty file; expected a header line with columns {expected}")
    names = [h.strip() for h in header]
    missing = [c for c in required if c not in names]
    if missing:
        raise TraceError(
            f"{path}: line 1: missing column(s) {', '.join(missing)}; expected columns "
            f"{expected} (found {', '.join(names)})"
        )
    index = [names.index(c) for c in (required if take is None else take)]
    width = len(names)
    rows = 0
    start = reader.line_num + 1
    for row in reader:
        line, start = start, reader.line_num + 1
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != width:
            raise TraceError(
                f"{path}: line {line}: {len(row)} fields; expected {len(names)} "
                f"({', '.join(names)})"
            )
        rows += 1
        yield line, [row[i] for i in index]
    if rows == 0:
        raise TraceError(f"{path}: no requests after the header; expected at least one row")


# --------------------------------------------------------------------------- readers

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
SPLITWISE_COLUMNS = (
    "request_id",
    "request_type",
    "application_id",
    "arrival_timestamp",
    "batch_size",
    "prompt_size",
    "token_size",
)
VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
LENGTHS_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def iter_azure(path: str | Path) -> Iterator[TraceRecord]:
    """Azure LLM inference 2023 CSV; arrivals relative to the first row, exact to 1 ns."""
    path = Path(path)
    mono = _Monotone(path, "TIMESTAMP")
    t0: int | None = None
    for line, (stamp, prompt, output) in _csv_rows(path, AZURE_COLUMNS):
        ns = _azure_ns(path, line, "TIMESTAMP", stamp)
        if t0 is None:
            t0 = ns
        mono.check(line, ns, stamp)
        yield TraceRecord(
            (ns - t0) / 1e9,
            parse_tokens(path, line, "ContextTokens", prompt),
            parse_tokens(path, line, "GeneratedTokens", output),
        )


def _iter_timed_csv(
    path: Path, columns: Sequence[str], time_col: str, prompt_col: str, output_col: str
) -> Iterator[TraceRecord]:
    mono = _Monotone(path, time_col)
    take = (time_col, prompt_col, output_col)
    for line, (raw_t, prompt, output) in _csv_rows(path, columns, take):
        t = parse_seconds(path, line, time_col, raw_t)
        mono.check(line, t, raw_t)
        yield TraceRecord(
            t,
            parse_tokens(path, line, prompt_col, prompt),
            parse_tokens(path, line, output_col, output),
        )


def iter_splitwise(path: str | Path) -> Iterator[TraceRecord]:
    """splitwise-sim CSV; ``arrival_timestamp`` in seconds, kept as given."""
    return _iter_timed_csv(
        Path(path), SPLITWISE_COLUMNS, "arrival_timestamp", "prompt_size", "token_size"
    )


def iter_vidur(path: str | Path) -> Iterator[TraceRecord]:
    """Vidur processed trace; ``arrived_at`` in seconds since the first request."""
    return _iter_timed_csv(
        Path(path), VIDUR_COLUMNS, "arrived_at", "num_prefill_tokens", "num_decode_tokens"
    )


def iter_lengths(path: str | Path) -> Iterator[TraceRecord]:
    """Length-only CSV (ShareGPT, arXiv); every record has ``arrival_s=None``."""
    path = Path(path)
    for line, (prompt, output) in _csv_rows(path, LENGTHS_COLUMNS):
        yield TraceRecord(
            None,
            parse_tokens(path, line, "num_prefill_tokens", prompt),
            parse_tokens(path, line, "num_decode_tokens", output),
        )


def iter_mooncake(
    path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> Iterator[TraceRecord]:
    """Mooncake JSONL; ``timestamp`` ms -> s; ``hash_ids`` -> ``prefix_hashes``."""
    path = Path(path)
    mono = _Monotone(path, "timestamp")
    with open_text(path, "trace", TraceError) as f:
        yield from _mooncake_body(path, f, block_tokens, mono)


def _mooncake_body(path: Path, f: Any, block_tokens: int, mono: _Monotone) -> Iterator[TraceRecord]:
    rows = 0
    for line, text in enumerate(f, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceError(
                f"{path}: line {line}: not valid JSON ({e.msg}); expected one object per line "
                f"with keys {', '.join(MOONCAKE_KEYS)}"
            ) from None
        if not isinstance(obj, dict):
            raise TraceError(
                f"{path}: line {line}: {type(obj).__name__} is not a JSON object; expected "
                f"keys {', '.join(MOONCAKE_KEYS)}"
            )
        missing = [k for k in MOONCAKE_KEYS if k not in obj]
        if missing:
            raise TraceError(
                f"{path}: line {line}: missing key(s) {', '.join(missing)}; expected keys "
                f"{', '.join(MOONCAKE_KEYS)}"
            )
        t = parse_seconds(path, line, "timestamp", obj["timestamp"], per_s=1000)
        mono.check(line, t, obj["timestamp"])
        hashes = obj["hash_ids"]
        if not isinstance(hashes, list) or not all(is_int(h) for h in hashes):
            raise TraceError(
                f"{where(path, line, 'hash_ids')}: {str(hashes)[:60]!r} is not a list of integers"
            )
        rows += 1
        yield TraceRecord(
            t,
            parse_tokens(path, line, "input_length", obj["input_length"]),
            parse_tokens(path, line, "output_length", obj["output_length"]),
            tuple(hashes),
            block_tokens,
        )
    if not rows:
        raise TraceError(
            f"{path}: empty file; expected JSON lines with keys {', '.join(MOONCAKE_KEYS)}"
        )


def read_azure(path: str | Path) -> list[TraceRecord]:
    """:func:`iter_azure`, as a list."""
    return list(iter_azure(path))


def read_splitwise(path: str | Path) -> list[TraceRecord]:
    """:func:`iter_splitwise`, as a list."""
    return list(iter_splitwise(path))


def read_vidur(path: str | Path) -> list[TraceRecord]:
    """:func:`iter_vidur`, as a list."""
    return list(iter_vidur(path))


def read_lengths(path: str | Path) -> list[TraceRecord]:
    """:func:`iter_lengths`, as a list."""
    return list(iter_lengths(path))


def read_mooncake(path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[TraceRecord]:
    """:func:`iter_mooncake`, as a list."""
    return list(iter_mooncake(path, block_tokens))


def iter_inference_perf(path: str | Path) -> Iterator[TraceRecord]:
    """inference-perf's per-request records (:mod:`twin.workload.inference_perf`)."""
    return _inference_perf_records(path)


def read_inference_perf(path: str | Path) -> list[TraceRecord]:
    """:func:`iter_inference_perf`, as a list."""
    return list(iter_inference_perf(path))


def read_aiperf(path: str | Path) -> list[TraceRecord]:
    """AIPerf's successful requests (:mod:`twin.workload.measured`)."""
    return _measured(path, "aiperf")


def read_vllm_bench(path: str | Path) -> list[TraceRecord]:
    """A detailed ``vllm bench serve`` result's successful requests."""
    return _measured(path, "vllm")


def _measured(path: str | Path, fmt: str) -> list[TraceRecord]:
    from twin.workload.measured import read_measured

    run = read_measured(path, fmt)
    return [TraceRecord(r.send_s, r.prompt_tokens, r.output_tokens) for r in run.requests]


ITERATORS: dict[str, Callable[[Path], Iterator[TraceRecord]]] = {
    "azure": iter_azure,
    "inference-perf": iter_inference_perf,
    "aiperf": lambda p: iter(read_aiperf(p)),
    "vllm-bench": lambda p: iter(read_vllm_bench(p)),
    "mooncake": iter_mooncake,
    "splitwise": iter_splitwise,
    "vidur": iter_vidur,
    "lengths": iter_lengths,
}
"""Streaming reader per format name."""

READERS: dict[str, Callable[[Path], list[TraceRecord]]] = {
    "azure": read_azure,
    "inference-perf": read_inference_perf,
    "aiperf": read_aiperf,
    "vllm-bench": read_vllm_bench,
    "mooncake": read_mooncake,
    "splitwise": read_splitwise,
    "vidur": read_vidur,
    "lengths": read_lengths,
}
"""Reader per format name; ``auto`` (see :func:`detect_format`) picks one of these."""

TIMED_FORMATS = frozenset(
    {"aiperf", "azure", "inference-perf", "mooncake", "splitwise", "vidur", "vllm-bench"}
)


def detect_format(path: str | Path) -> str:
    """The format of a trace file, from its extension and first line."""
    path = Path(path)
    if path.name.endswith(".gz") or path.name.endswith("per_request_lifecycle_metrics.json"):
        if is_records_file(path):
            return "inference-perf"
    with open_text(path, "trace", TraceError) as f:
        first = f.readline(1 << 16).strip()  # a header, not a whole file without newlines
    if '"request_start_ns"' in first:
        return "aiperf"
    if first.startswith("{") and '"input_lens"' in first and '"start_times"' in first:
        return "vllm-bench"
    if path.suffix in (".jsonl", ".json") or first.startswith("{"):
        return "mooncake"
    if not first:
        raise TraceError(f"{path}: empty file; expected a trace with a header line")
    cols = {c.strip() for c in first.split(",")}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= cols:
        return "azure"
    if {"arrival_timestamp", "prompt_size", "token_size"} <= cols:
        return "splitwise"
    if "arrived_at" in cols:
        return "vidur"
    if is_records_file(path, first):
        return "inference-perf"
    if {"num_prefill_tokens", "num_decode_tokens"} <= cols:
        return "lengths"
    raise TraceError(
        f"{path}: line 1: cannot tell the trace format from header {first[:120]!r}; expected "
        "the columns of one of azure (TIMESTAMP,ContextTokens,GeneratedTokens), splitwise "
        "(arrival_timestamp,prompt_size,token_size,...), vidur (arrived_at,num_prefill_tokens,"
        "num_decode_tokens), lengths (num_prefill_tokens,num_decode_tokens), inference-perf "
        "(arrival_s,input_tokens,output_tokens,has_error,...), or a .jsonl Mooncake trace; "
        "or give format: explicitly"
    )


def iter_trace(path: str | Path, format: str = "auto") -> Iterator[TraceRecord]:
    """Stream a trace in the named format (``auto`` detects it, at once)."""
    path = Path(path)
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in ITERATORS:
        raise UnknownNameError("trace format", fmt, [*ITERATORS, "auto"])
    return ITERATORS[fmt](path)


def read_trace(path: str | Path, format: str = "auto") -> list[TraceRecord]:
    """Read a trace in the named format (``auto`` detects it)."""
    return list(iter_trace(path, format))
