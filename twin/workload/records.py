"""One request as a trace file gives it, and the checked fields every trace
reader parses (token counts, times), each error naming the file, line,
column and value."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from twin._check import is_int, is_number
from twin.errors import TraceError


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request as a trace file gives it, before ids and scaling.

    ``arrival_s`` is seconds from the trace start (``None`` in length-only
    files). ``prefix_hashes`` and ``prefix_block_tokens`` are as in
    :class:`twin.request.Request` (empty and 0 when the trace has none).
    """

    arrival_s: float | None
    prompt_tokens: int
    output_tokens: int
    prefix_hashes: tuple[int, ...] = ()
    prefix_block_tokens: int = 0


def where(path: Path, line: int, column: str) -> str:
    return f"{path}: line {line}: column {column}"


def parse_tokens(path: Path, line: int, column: str, raw: object) -> int:
    """A token count: an integer >= 1 (``"12"``; ``"12.0"`` too, as pandas writes it)."""
    if type(raw) is str or type(raw) is int:  # the common case, at once (int() strips spaces)
        try:
            n = int(raw)
        except ValueError:
            pass
        else:
            if n >= 1:
                return n
    value: object = raw
    if isinstance(raw, str):
        s = raw.strip()
        try:
            value = int(s)
        except ValueError:
            try:
                value = float(s)
            except ValueError:
                value = raw
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not is_int(value):
        raise TraceError(f"{where(path, line, column)}: {raw!r} is not an integer token count")
    if value < 1:
        raise TraceError(f"{where(path, line, column)}: {raw!r} tokens; expected an integer >= 1")
    return value


def parse_seconds(path: Path, line: int, column: str, raw: object, per_s: int = 1) -> float:
    """A non-negative finite time in units of ``1/per_s`` seconds, as seconds."""
    value: object = raw
    if isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            value = raw
    if not is_number(value) or not math.isfinite(value):
        raise TraceError(f"{where(path, line, column)}: {raw!r} is not a number")
    if value < 0:
        raise TraceError(f"{where(path, line, column)}: {raw!r} is negative; expected a time >= 0")
    return float(value) / per_s
