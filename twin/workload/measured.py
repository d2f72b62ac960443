"""Readers for the per-request results of real serving benchmarks, as validation targets.

Each reader returns a :class:`MeasuredRun`: per successful request its send time (seconds
from the first request sent), prompt and output tokens, and what the client measured: TTFT,
TPOT and its largest inter-token gap. Failed requests are counted, not returned.

Formats (``format=`` names):

``vllm``
    ``vllm bench serve --save-result --save-detailed`` JSON (vllm/benchmarks/serve.py; also
    the older benchmarks/benchmark_serving.py): one object with per-request lists
    ``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls`` (a list of gaps per request, s),
    ``start_times`` (``time.perf_counter()`` at each send, s; any origin) and ``errors``
    (``""`` when the request succeeded). TPOT = sum(itls) / (output_lens - 1), as vLLM's
    ``(latency - ttft) / (output_len - 1)``; the largest gap is ``max(itls)``. A file saved
    without ``--save-detailed`` has no per-request lists and is refused.
``aiperf``
    AIPerf's ``profile_export.jsonl`` (ai-dynamo/aiperf): one JSON record per line with
    ``metadata.request_start_ns`` (epoch ns), ``metadata.benchmark_phase`` (records of other
    phases than ``profiling`` are skipped) and ``metrics`` of ``{value, unit}``:
    ``input_sequence_length``, ``output_sequence_length``, ``time_to_first_token``,
    ``inter_token_latency`` (the request's mean gap after the first token, its TPOT) and
    ``inter_chunk_latency`` (the gaps, a list; optional); ``error`` is null when the request
    succeeded.

NOTE: a streamed chunk can carry several tokens, so the gaps listed are between chunks; the
largest gap is the largest chunk gap, which equals the largest token gap when every chunk is
one token (vLLM's default stream).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twin._io import decode_text
from twin.errors import TraceError
from twin.request import Request

FORMATS = ("auto", "vllm", "aiperf")


@dataclass(frozen=True, slots=True)
class MeasuredRequest:
    """One successful request of a real run: seconds and tokens."""

    send_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float | None  # None for a one-token output
    max_itl_s: float | None  # None when the file lists no gaps, or for one token


@dataclass(frozen=True)
class MeasuredRun:
    """The successful requests of one real run, in send order, and what was left out."""

    path: str
    format: str
    sha256: str
    requests: tuple[MeasuredRequest, ...]
    failed: int

    def replay(self) -> list[Request]:
        """The requests as the twin takes them: ids in send order, arrival = send time."""
        return [
            Request(i, r.send_s, r.prompt_tokens, r.output_tokens)
            for i, r in enumerate(self.requests)
        ]


def _num(where: str, v: object, *, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise TraceError(f"{where}: {v!r} is not a finite number")
    if v < 0 or (positive and v == 0):
        raise TraceError(f"{where}: {v!r}; expected a number {'>' if positive else '>='} 0")
    return float(v)


def _int(where: str, v: object) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TraceError(f"{where}: {v!r}; expected an integer token count >= 0")
    return v


def _tpot(gaps_sum: float, n: int) -> float | None:
    return gaps_sum / (n - 1) if n > 1 else None


def read_vllm(path: str | Path) -> MeasuredRun:
    """A ``vllm bench serve --save-detailed`` result (see the module docstring)."""
    p = Path(path)
    data = _bytes(p)
    try:
        doc = json.loads(decode_text(data, str(p), TraceError))
    except ValueError as e:
        raise TraceError(f"{p}: not one JSON object ({e}); an --append-result file holds "
                         "several: keep one") from None  # fmt: skip
    if not isinstance(doc, dict):
        raise TraceError(f"{p}: a vLLM benchmark result is one JSON object")
    need = ("input_lens", "output_lens", "ttfts", "itls", "start_times")
    missing = [k for k in need if k not in doc]
    if missing:
        raise TraceError(
            f"{p}: no per-request {', '.join(missing)}: save the run with "
            "`vllm bench serve --save-result --save-detailed`"
        )
    n = len(doc["input_lens"]) if isinstance(doc["input_lens"], list) else -1
    errors = doc.get("errors", [""] * max(n, 0))
    for k in (*need, "errors"):
        v = doc[k] if k != "errors" else errors
        if not isinstance(v, list) or len(v) != n:
            raise TraceError(f"{p}: {k}: expected a list of {n} entries, one per request")
    rows = []
    failed = 0
    for i in range(n):
        w = f"{p}: request {i}"
        if errors[i]:
            failed += 1
            continue
        prompt = _int(f"{w}: input_lens", doc["input_lens"][i])
        out = _int(f"{w}: output_lens", doc["output_lens"][i])
        if prompt < 1 or out < 1:
            failed += 1
            continue
        gaps = doc["itls"][i]
        if not isinstance(gaps, list):
            raise TraceError(f"{w}: itls: {gaps!r}; expected a list of seconds")
        gs = [_num(f"{w}: itls", g) for g in gaps]
        rows.append((
            _num(f"{w}: start_times", doc["start_times"][i]), prompt, out,
            _num(f"{w}: ttfts", doc["ttfts"][i], positive=True),
            _tpot(math.fsum(gs), out), max(gs) if gs and out > 1 else None,
        ))  # fmt: skip
    return _run(p, "vllm", data, rows, failed)


_UNIT_S = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def _metric(where: str, metrics: Mapping[str, Any], key: str, *, time: bool) -> Any:
    m = metrics.get(key)
    if not isinstance(m, Mapping) or "value" not in m:
        raise TraceError(f"{where}: metrics.{key}: missing; expected {{value, unit}}")
    if not time:
        return m["value"]
    unit = m.get("unit")
    if unit not in _UNIT_S:
        raise TraceError(f"{where}: metrics.{key}.unit {unit!r}; expected one of ms, us, ns, s")
    v = m["value"]
    if isinstance(v, list):
        return [_num(f"{where}: metrics.{key}", x) * _UNIT_S[unit] for x in v]
    return _num(f"{where}: metrics.{key}", v) * _UNIT_S[unit]


def read_aiperf(path: str | Path) -> MeasuredRun:
    """An AIPerf ``profile_export.jsonl`` (see the module docstring)."""
    p = Path(path)
    data = _bytes(p)
    rows = []
    failed = 0
    starts: list[int] = []
    for line_no, line in enumerate(decode_text(data, str(p), TraceError).splitlines(), start=1):
        if not line.strip():
            continue
        w = f"{p}: line {line_no}"
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise TraceError(f"{w}: not JSON ({e})") from None
        meta = rec.get("metadata") if isinstance(rec, dict) else None
        if not isinstance(meta, dict):
            raise TraceError(f"{w}: no metadata; not an AIPerf profile_export.jsonl record")
        if meta.get("benchmark_phase", "profiling") != "profiling":
            continue
        start = meta.get("request_start_ns")
        if isinstance(start, bool) or not isinstance(start, int):
            raise TraceError(f"{w}: metadata.request_start_ns {start!r}; expected integer ns")
        metrics = rec.get("metrics")
        if (
            rec.get("error") is not None
            or not isinstance(metrics, dict)
            or meta.get("was_cancelled")
        ):
            failed += 1
            continue
        prompt = _int(f"{w}: input_sequence_length",
                      _metric(w, metrics, "input_sequence_length", time=False))  # fmt: skip
        out = _int(f"{w}: output_sequence_length",
                   _metric(w, metrics, "output_sequence_length", time=False))  # fmt: skip
        if prompt < 1 or out < 1:
            failed += 1
            continue
        ttft = _metric(w, metrics, "time_to_first_token", time=True)
        tpot = _metric(w, metrics, "inter_token_latency", time=True) if out > 1 else None
        gaps = (_metric(w, metrics, "inter_chunk_latency", time=True)
                if "inter_chunk_latency" in metrics else [])  # fmt: skip
        if not isinstance(gaps, list):
            gaps = [gaps]
        starts.append(start)
        rows.append((start, prompt, out, ttft, tpot, max(gaps) if gaps and out > 1 else None))
    t0 = min(starts, default=0)
    # integer nanoseconds from the first send, then seconds: exact up to the float
    rows = [((s - t0) / 1e9, *rest) for s, *rest in rows]
    return _run(p, "aiperf", data, rows, failed, origin=0.0)


def _bytes(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError as e:
        raise TraceError(f"{p}: cannot read: {e.strerror}") from None


def _run(p: Path, fmt: str, data: bytes, rows: Sequence[tuple[Any, ...]], failed: int,
         origin: float | None = None) -> MeasuredRun:  # fmt: skip
    if not rows:
        raise TraceError(f"{p}: no successful request ({failed} failed)")
    t0 = min(r[0] for r in rows) if origin is None else origin
    reqs = sorted(
        (MeasuredRequest(r[0] - t0, *r[1:]) for r in rows), key=lambda r: r.send_s
    )  # stable: equal send times keep file order
    return MeasuredRun(str(p), fmt, hashlib.sha256(data).hexdigest(), tuple(reqs), failed)


def detect(path: str | Path) -> str:
    """``aiperf`` when the first record is an object with ``metadata`` (and no vLLM lists),
    ``vllm`` for any other JSON object."""
    p = Path(path)
    text = decode_text(_bytes(p), str(p), TraceError).lstrip()
    first = text.split("\n", 1)[0]
    try:
        doc = json.loads(first)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("metadata"), dict) and "input_lens" not in doc:
        return "aiperf"
    if text.startswith("{"):
        return "vllm"
    raise TraceError(f"{p}: neither a vLLM benchmark JSON nor an AIPerf profile_export.jsonl")


def read_measured(path: str | Path, format: str = "auto") -> MeasuredRun:
    """The run of ``path`` in ``format`` (``auto``: :func:`detect`)."""
    if format not in FORMATS:
        raise TraceError(f"format {format!r}; expected one of {', '.join(FORMATS)}")
    fmt = detect(path) if format == "auto" else format
    return read_vllm(path) if fmt == "vllm" else read_aiperf(path)
