"""inference-perf's per-request records as a trace (``format: inference-perf``).

inference-perf (kubernetes-sigs/inference-perf, the load generator of llm-d and of
BLIS's measured runs) writes ``per_request_lifecycle_metrics.json`` when its report
asks for ``request_lifecycle.per_request``: a JSON list with one object per request,
``start_time`` and ``end_time`` (seconds on the client's monotonic clock), ``request``
(the HTTP body as a JSON string: ``prompt``, ``max_tokens``, ``ignore_eos``, ...),
``info`` (``input_tokens`` and ``output_tokens`` counted by re-tokenising the text,
``output_token_times``; newer versions nest them under
``request_metrics.text.input_tokens`` and ``response_metrics``) and ``error`` (null,
or the failure). The records are written in completion order; this reader sorts them
by send time.

The same records reduced to one CSV row each (``index, arrival_s, input_tokens,
output_tokens, has_error, ttft_s, e2e_s``; gzipped or not, as in
``shared/data/realruns/traces/``) read the same way.

Per request: ``arrival_s`` is the send time from the first send; ``prompt_tokens``
the recorded input count; ``output_tokens`` the request's ``max_tokens`` when its body
set ``ignore_eos`` (the server then produces exactly that many; the recorded count is
the streamed text re-tokenised, which reads low: 195-209 for a requested 247-251 with
Llama-2-7B), else the recorded count. The reduced CSV keeps no body, so its output is
the recorded count; a spec replays such a run with ``workload.output_tokens`` set to
the profile's ``output_len``.

A request that failed in the run (a client time-out, a refusal) was sent and loaded
the server, so it is replayed too; its counts are not recorded (0), so it takes the
median prompt and output of the run's requests that have both; so does a request whose
streamed text re-tokenised to 0 tokens (these files are one run's records: thousands
of rows, read whole).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from twin._check import is_int, is_number
from twin._io import read_text
from twin.errors import TraceError
from twin.workload.records import TraceRecord, parse_seconds, parse_tokens

CSV_COLUMNS = (
    "index",
    "arrival_s",
    "input_tokens",
    "output_tokens",
    "has_error",
    "ttft_s",
    "e2e_s",
)


@dataclass(frozen=True, slots=True)
class Record:
    """One request of an inference-perf run: send time (s from the first send),
    counts (0 when not recorded), whether it failed, the measured TTFT and E2E
    (seconds, client side; ``nan`` when not recorded)."""

    send_s: float
    prompt_tokens: int
    output_tokens: int
    failed: bool
    ttft_s: float
    e2e_s: float


def _open_text(path: Path) -> io.TextIOBase:
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        if gz:
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
        return io.StringIO(read_text(path, "trace", TraceError), newline="")
    except OSError as e:
        raise TraceError(f"{path}: cannot read trace: {e.strerror}") from None


def is_records_file(path: str | Path, first: str = "") -> bool:
    """Whether ``path`` looks like inference-perf's records: the JSON's file name, or
    a (gzipped) CSV whose header has this format's columns."""
    path = Path(path)
    if path.name.endswith("per_request_lifecycle_metrics.json"):
        return True
    if not first:
        try:
            with _open_text(path) as f:
                first = f.readline(1 << 16)
        except (TraceError, OSError, UnicodeDecodeError, EOFError):
            return False
    return set(CSV_COLUMNS[1:5]) <= {c.strip() for c in first.split(",")}


def read_records(path: str | Path) -> list[Record]:
    """The run's requests in send order (see the module)."""
    path = Path(path)
    try:
        with _open_text(path) as f:
            text = f.read()
    except (UnicodeDecodeError, EOFError, OSError, gzip.BadGzipFile) as e:
        raise TraceError(f"{path}: cannot read inference-perf records: {e}") from None
    if text.lstrip().startswith("["):
        records = _json_records(path, text)
    else:
        records = _csv_records(path, text)
    if not records:
        raise TraceError(f"{path}: no requests; expected at least one record")
    records.sort(key=lambda r: r.send_s)
    t0 = records[0].send_s
    return [replace(r, send_s=r.send_s - t0) for r in records]


def _number(path: Path, where: str, raw: object) -> float:
    """A JSON number (finite)."""
    if not is_number(raw) or not math.isfinite(raw):  # type: ignore[arg-type]
        raise TraceError(f"{path}: {where}: {raw!r} is not a finite number")
    return float(raw)  # type: ignore[arg-type]


def _json_count(path: Path, where: str, raw: object) -> int:
    """A JSON token count: an integer >= 0 (0 or absent: not recorded)."""
    if raw is None:
        return 0
    if not is_int(raw) or raw < 0:  # type: ignore[operator]
        raise TraceError(f"{path}: {where}: {raw!r} is not a token count (an integer >= 0)")
    return int(raw)  # type: ignore[call-overload]


def _csv_count(path: Path, line: int, column: str, raw: str) -> int:
    """A CSV token count: ``0`` (not recorded) or an integer >= 1."""
    return 0 if raw.strip() in ("0", "0.0") else parse_tokens(path, line, column, raw)


def _csv_records(path: Path, text: str) -> list[Record]:
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in CSV_COLUMNS[1:5] if c not in header]
    if missing:
        raise TraceError(
            f"{path}: line 1: missing column(s) {', '.join(missing)}; expected inference-perf "
            f"records with columns {', '.join(CSV_COLUMNS)} or a per_request_lifecycle_metrics.json"
        )
    col = {c: header.index(c) for c in CSV_COLUMNS if c in header}
    out = []
    for line, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise TraceError(f"{path}: line {line}: {len(row)} fields; expected {len(header)}")

        def cell(c: str, row: list[str] = row) -> str:
            return row[col[c]] if c in col else "nan"

        failed = cell("has_error").strip().lower() in ("1", "true")
        out.append(
            Record(
                parse_seconds(path, line, "arrival_s", cell("arrival_s")),
                _csv_count(path, line, "input_tokens", cell("input_tokens")),
                _csv_count(path, line, "output_tokens", cell("output_tokens")),
                failed,
                float(cell("ttft_s") or "nan"),
                float(cell("e2e_s") or "nan"),
            )
        )
    return out


def _json_records(path: Path, text: str) -> list[Record]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, list):
        raise TraceError(f"{path}: expected a JSON list of request records")
    return [_json_record(path, i, r) for i, r in enumerate(doc)]


def _json_record(path: Path, i: int, r: object) -> Record:
    where = f"record {i}"
    if not isinstance(r, Mapping) or "start_time" not in r:
        raise TraceError(f"{path}: {where}: expected an object with start_time, info, request")
    start = _number(path, f"{where}: start_time", r["start_time"])
    end = (
        _number(path, f"{where}: end_time", r.get("end_time", math.nan))
        if "end_time" in r
        else math.nan
    )
    info = r.get("info") or {}
    if not isinstance(info, Mapping):
        raise TraceError(f"{path}: {where}: info: {info!r} is not an object")
    # newer inference-perf nests the counts: request_metrics.text.input_tokens,
    # response_metrics.output_tokens and .output_token_times
    req_m, resp_m = _sub(info, "request_metrics"), _sub(info, "response_metrics")
    raw_in = info.get("input_tokens", _sub(req_m, "text").get("input_tokens"))
    prompt = _json_count(path, f"{where}: info.input_tokens", raw_in)
    raw_out = info.get("output_tokens", resp_m.get("output_tokens"))
    output = _json_count(path, f"{where}: info.output_tokens", raw_out)
    body = _body(r.get("request"))
    if (
        body.get("ignore_eos") is True
        and is_int(body.get("max_tokens"))
        and body["max_tokens"] >= 1
    ):
        output = int(body["max_tokens"])
    times = info.get("output_token_times") or resp_m.get("output_token_times") or []
    ttft = (
        float(times[0]) - start
        if isinstance(times, list) and times and is_number(times[0])
        else math.nan
    )
    return Record(start, prompt, output, r.get("error") is not None, ttft, end - start)


def _sub(m: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = m.get(key)
    return v if isinstance(v, Mapping) else {}


def _body(raw: Any) -> Mapping[str, Any]:
    if isinstance(raw, Mapping):
        return raw
    if isinstance(raw, str):
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError:
            return {}
        return doc if isinstance(doc, Mapping) else {}
    return {}


def iter_inference_perf(path: str | Path) -> Iterator[TraceRecord]:
    """The records of ``path`` as trace records (send order); a count not recorded
    (0) is the median of the recorded ones (see the module)."""
    path = Path(path)
    records = read_records(path)
    ok = [r for r in records if r.prompt_tokens >= 1 and r.output_tokens >= 1]
    if not ok:
        raise TraceError(f"{path}: no request with both token counts recorded; cannot replay")
    fill_prompt = int(statistics.median_low([r.prompt_tokens for r in ok]))
    fill_output = int(statistics.median_low([r.output_tokens for r in ok]))
    for r in records:
        yield TraceRecord(r.send_s, r.prompt_tokens or fill_prompt, r.output_tokens or fill_output)
