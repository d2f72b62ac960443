"""Measured iteration times: a profile table (splitwise-sim's ``perf_model.csv``
or the native CSV) interpolated, and DistServe's fitted latency model.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import statistics
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from twin._check import is_int, is_number
from twin._io import decode_text
from twin.errors import ProfileError, TwinError
from twin.perf.gpus import get_gpu
from twin.perf.iteration import VECTOR_STEPS, Batch
from twin.perf.llm import get_model

if TYPE_CHECKING:
    import numpy as np


def _read_bytes(path: Path, where: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ProfileError(f"{where}: cannot read profile: {e.strerror}") from None


class _Grid:
    """Piecewise-linear interpolation over rows ``k -> (xs, ys)``.

    Inside a row: linear in ``x``; below the first ``x``: clamped to the first
    value; above the last: ``above="proportional"`` scales the last value by
    ``x / x_last`` (time per token stays at the last measured rate),
    ``above="clamp"`` holds it. Across rows: linear in ``k`` between the two
    bracketing rows; below the first row clamped; above the last row
    ``extrapolate_k`` continues the slope of the last two rows (else clamps).
    """

    __slots__ = ("_ks", "_rows", "_above", "_extra_k")

    def __init__(
        self, points: dict[tuple[int, int], float], above: str, extrapolate_k: bool
    ) -> None:
        rows: dict[int, list[tuple[int, float]]] = {}
        for (k, x), y in points.items():
            rows.setdefault(k, []).append((x, y))
        self._ks = sorted(rows)
        self._rows = [
            ([float(x) for x, _ in sorted(rows[k])], [y for _, y in sorted(rows[k])])
            for k in self._ks
        ]
        self._above = above
        self._extra_k = extrapolate_k

    def _row(self, i: int, x: float) -> float:
        xs, ys = self._rows[i]
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] * x / xs[-1] if self._above == "proportional" else ys[-1]
        j = bisect_right(xs, x)
        x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def __call__(self, k: float, x: float) -> float:
        ks = self._ks
        if k <= ks[0]:
            return self._row(0, x)
        if k >= ks[-1]:
            if not self._extra_k or len(ks) == 1 or k == ks[-1]:
                return self._row(len(ks) - 1, x)
            i = len(ks) - 1
        else:
            i = bisect_right(ks, k)
            if ks[i - 1] == k:
                return self._row(i - 1, x)
        y0, y1 = self._row(i - 1, x), self._row(i, x)
        return y0 + (y1 - y0) * (k - ks[i - 1]) / (ks[i] - ks[i - 1])

    def _rows_many(self, i: int, x: np.ndarray) -> np.ndarray:
        """:meth:`_row` of each element of ``x``, the same operations elementwise."""
        import numpy as np

        xs, ys = self._rows[i]
        if len(xs) == 1:
            out = np.full(x.shape, ys[0])
        else:
            xa, ya = np.array(xs), np.array(ys)
            j = np.clip(np.searchsorted(xa, x, side="right"), 1, len(xs) - 1)
            x0, y0 = xa[j - 1], ya[j - 1]
            out = y0 + (ya[j] - y0) * (x - x0) / (xa[j] - x0)
        top = ys[-1] * x / xs[-1] if self._above == "proportional" else ys[-1]
        out = np.where(x >= xs[-1], top, out)
        return np.where(x <= xs[0], ys[0], out)

    def many(self, k: float, x: np.ndarray) -> np.ndarray:
        """``self(k, v)`` for each ``v`` of ``x``, the same operations elementwise."""
        ks = self._ks
        if k <= ks[0]:
            return self._rows_many(0, x)
        if k >= ks[-1]:
            if not self._extra_k or len(ks) == 1 or k == ks[-1]:
                return self._rows_many(len(ks) - 1, x)
            i = len(ks) - 1
        else:
            i = bisect_right(ks, k)
            if ks[i - 1] == k:
                return self._rows_many(i - 1, x)
        y0, y1 = self._rows_many(i - 1, x), self._rows_many(i, x)
        return y0 + (y1 - y0) * (k - ks[i - 1]) / (ks[i] - ks[i - 1])


def _same_name(a: str, b: str, lookup: Callable[[str], object]) -> bool:
    """Whether two spellings name the same catalog entry (``llama2-70b`` and
    ``llama-2-70b``, ``h100-80gb`` and ``h100-sxm``); names outside the catalog
    must match exactly."""
    if a == b:
        return True
    try:
        return lookup(a) == lookup(b)
    except TwinError:
        return False


class ProfileTable:
    """Iteration times interpolated from a measured table.

    Prefill: the time of ``B`` prompts of ``P`` tokens each, by ``(B, B x P)``;
    decode: the time of one step of ``B`` sequences at context ``C`` each,
    by ``(B, C)``. Interpolation is piecewise linear (see :class:`_Grid`):

    - prefill: linear in total tokens within a batch size; above the largest
      measured total, the last per-token rate continues (proportional); below
      the smallest, clamped. Linear between measured batch sizes; above the
      largest, that batch size's curve over total tokens is used.
    - decode: linear in mean context, clamped at both ends; linear between
      batch sizes, continuing the slope of the last two beyond the largest.

    A batch's prefill chunks ``(n, c)`` count as ``len(prefill)`` prompts of
    ``sum(n)`` tokens in all. NOTE: cached context ``c`` is ignored, since
    the tables are measured without prefix caching; a long cached prefix
    makes real chunks slower than priced here.

    NOTE: a mixed batch (prefill chunks and decode sequences together) is
    priced as the prefill part plus the extra a decode batch of ``B`` costs
    over a decode batch of one, ``prefill + decode(B) - decode(1)``: the
    weights are read once, so the decode part adds only its marginal cost.

    Formats (``fmt``):

    - ``splitwise``: splitwise-sim's ``perf_model.csv`` (times in ms), rows
      selected by ``model``, ``hardware`` and ``tp``; repeated runs reduced to
      their median; decode context = ``prompt_size + token_size // 2``.
    - ``native``: CSV with header ``phase,batch_size,tokens,context,time_s``;
      ``prefill`` rows give ``B`` prompts of ``tokens`` each (context 0),
      ``decode`` rows ``B`` sequences at ``context`` each (tokens 1); times in
      seconds; repeated keys reduced to their median.
    """

    __slots__ = ("name", "sha256", "pp", "_prefill", "_decode", "_decode1")

    def __init__(
        self,
        name: str,
        sha256: str | None,
        prefill: dict[tuple[int, int], float],
        decode: dict[tuple[int, int], float],
        *,
        pp: int = 1,
    ) -> None:
        """``prefill`` maps ``(batch size, prompt tokens each)`` and ``decode``
        maps ``(batch size, context each)`` to seconds; each needs >= 1 point.
        ``pp``: the pipeline stages the instance splits the layers into (see
        :meth:`stage_times`)."""
        if not is_int(pp) or pp < 1:
            raise ProfileError(f"profile {name}: pp={pp!r} must be a positive integer")
        self.pp = int(pp)
        if not prefill or not decode:
            raise ProfileError(
                f"profile {name}: needs both prefill and decode points "
                f"(got {len(prefill)} prefill, {len(decode)} decode)"
            )
        for (b, x), t in (*prefill.items(), *decode.items()):
            if b < 1 or x < 0 or not t > 0 or not math.isfinite(t):
                raise ProfileError(
                    f"profile {name}: bad point batch_size={b}, tokens/context={x}, time={t!r}"
                )
        self.name = name
        self.sha256 = sha256
        self._prefill = _Grid({(b, b * p): t for (b, p), t in prefill.items()},
                              "proportional", extrapolate_k=False)  # fmt: skip
        self._decode = _Grid(dict(decode), "clamp", extrapolate_k=True)
        self._decode1 = 0.0
        self._decode1 = self._decode(1, min(c for _, c in decode))

    def prefill_time(self, batch_size: int, total_tokens: int) -> float:
        """Seconds for ``batch_size`` prompts of ``total_tokens`` tokens in all."""
        return self._prefill(batch_size, total_tokens)

    def decode_time(self, batch_size: int, context_sum: int) -> float:
        """Seconds for one decode step of ``batch_size`` sequences, ``context_sum`` in all."""
        return self._decode(batch_size, context_sum / batch_size)

    def stage_times(self, batch: Batch) -> tuple[float, float]:
        """Seconds ``batch`` holds the first pipeline stage and each later one:
        the table's time split evenly over ``pp`` stages. NOTE: a table measured
        without pipeline parallelism has no stage-to-stage sends in it; they are
        not added."""
        t = self.iteration_time(batch) / self.pp
        return t, t

    def iteration_time(self, batch: Batch) -> float:
        """Seconds for ``batch`` (see the class docstring for mixed batches)."""
        n = batch.decode_count
        if not batch.prefill:
            return self._decode(n, batch.decode_context_sum / n) if n else 0.0
        t = self._prefill(len(batch.prefill), batch.prefill_tokens)
        if n:
            d = self._decode(n, batch.decode_context_sum / n) - self._decode(
                1, batch.decode_context_sum / n
            )
            t += d if d > 0.0 else 0.0
        return t

    def decode_steps(self, count: int, context_sum: int, n: int) -> list[float]:
        """Seconds of ``n`` decode-only iterations of ``count`` sequences, their
        contexts summing to ``context_sum`` in the first and ``count`` more in each
        next one: :meth:`iteration_time` of each, to the last bit."""
        stop = context_sum + n * count
        if n < VECTOR_STEPS:
            dec = self._decode
            return [dec(count, c / count) for c in range(context_sum, stop, count)]
        import numpy as np

        ctx = np.arange(context_sum, stop, count, dtype=np.int64)
        return self._decode.many(count, ctx / count).tolist()  # type: ignore[no-any-return]

    @classmethod
    def from_splitwise(
        cls, path: Path, model: str, hardware: str, tp: int, *, where: str = "", pp: int = 1
    ) -> ProfileTable:
        """Rows of splitwise-sim's ``perf_model.csv`` for one (model, hardware, TP)."""
        where = where or str(path)
        data = _read_bytes(path, where)
        prefill: dict[tuple[int, int], list[float]] = {}
        decode: dict[tuple[int, int], list[float]] = {}
        combos: set[tuple[str, str, int]] = set()
        try:
            for r in csv.DictReader(io.StringIO(decode_text(data, where, ProfileError))):
                combo = (r["model"], r["hardware"], int(r["tensor_parallel"]))
                combos.add(combo)
                same = _same_name(combo[0], model, get_model) and _same_name(
                    combo[1], hardware, get_gpu
                )
                if combo[2] != tp or not same:
                    continue
                p, b, t = int(r["prompt_size"]), int(r["batch_size"]), int(r["token_size"])
                prefill.setdefault((b, p), []).append(float(r["prompt_time"]) / 1e3)
                decode.setdefault((b, p + t // 2), []).append(float(r["token_time"]) / 1e3)
        except (KeyError, ValueError, TypeError, csv.Error) as e:
            raise ProfileError(f"{where}: not a splitwise-sim perf_model.csv ({e!r})") from None
        if not prefill:
            known = ", ".join(f"{m}/{h}/tp{t}" for m, h, t in sorted(combos))
            raise ProfileError(
                f"{where}: no rows for model={model!r} hardware={hardware!r} tp={tp}; "
                f"available: {known or '(none)'}"
            )
        return cls(
            f"profile:{Path(path).name}:{model}@{hardware}x{tp}",
            hashlib.sha256(data).hexdigest(),
            {k: statistics.median(v) for k, v in prefill.items()},
            {k: statistics.median(v) for k, v in decode.items()},
            pp=pp,
        )

    @classmethod
    def from_native(cls, path: Path, *, where: str = "", pp: int = 1) -> ProfileTable:
        """A native CSV (``phase,batch_size,tokens,context,time_s``; see the class docstring)."""
        prefill, decode, sha = read_native(path, where=where)
        return cls(f"profile:{Path(path).name}", sha, prefill, decode, pp=pp)


# The integer columns of a native table and their least values: a batch holds
# a sequence or more, a row times a token or more, a context is never negative.
_NATIVE_INTS = (("batch_size", 1), ("tokens", 1), ("context", 0))


def _native_int(where: str, line: int, row: dict[str, str], col: str, low: int) -> int:
    raw = row[col]
    try:
        value = int(raw)
    except ValueError:
        raise ProfileError(
            f"{where}: line {line}: column {col}: {raw!r} is not an integer; expected >= {low}"
        ) from None
    if value < low:
        raise ProfileError(f"{where}: line {line}: column {col}: {value} must be >= {low}")
    return value


def _native_time(where: str, line: int, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ProfileError(
            f"{where}: line {line}: column time_s: {raw!r}; expected a time in seconds, "
            "finite and > 0"
        )
    return value


def read_native(
    path: Path, *, where: str = ""
) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float], str]:
    """The points of a native CSV: prefill ``(batch size, prompt tokens) -> s``, decode
    ``(batch size, context) -> s`` (repeated keys reduced to their median), and its sha256."""
    where = where or str(path)
    data = _read_bytes(Path(path), where)
    cols = ["phase", "batch_size", "tokens", "context", "time_s"]
    prefill: dict[tuple[int, int], list[float]] = {}
    decode: dict[tuple[int, int], list[float]] = {}
    reader = csv.DictReader(io.StringIO(decode_text(data, where, ProfileError), newline=""))
    rows = []
    try:
        for r in reader:
            rows.append((reader.line_num, r))
    except csv.Error as e:
        raise ProfileError(f"{where}: line {reader.line_num}: not valid CSV ({e})") from None
    if reader.fieldnames is None or list(reader.fieldnames) != cols:
        raise ProfileError(f"{where}: header {reader.fieldnames!r}; expected {','.join(cols)}")
    if not rows:
        raise ProfileError(f"{where}: no rows; expected a prefill or decode time per line")
    for line, r in rows:
        if None in r or None in r.values():  # DictReader: cells past the header, or short of it
            cells = len(cols) + len(r.get(None) or ()) - sum(v is None for v in r.values())
            raise ProfileError(f"{where}: line {line}: {cells} cells; the header has {len(cols)}")
        b, n, c = (_native_int(where, line, r, col, low) for col, low in _NATIVE_INTS)
        t = _native_time(where, line, r["time_s"])
        if r["phase"] == "prefill":
            prefill.setdefault((b, n), []).append(t)
        elif r["phase"] == "decode":
            decode.setdefault((b, c), []).append(t)
        else:
            raise ProfileError(
                f"{where}: line {line}: phase {r['phase']!r}; expected prefill or decode"
            )
    return (
        {k: statistics.median(v) for k, v in prefill.items()},
        {k: statistics.median(v) for k, v in decode.items()},
        hashlib.sha256(data).hexdigest(),
    )


# simdistserve's costs outside the fitted JSON, at LLMServe/DistServe commit 82831f1 (the snapshot
# the shared fit comes from; see ../shared/data/profiles/distserve/PROVENANCE.md):
# - DISTSERVE_OVERHEAD_S: simdistserve/base/worker.py, Worker.add_ray_overhead, ``base_overhead =
#   2`` (ms): once per iteration, on the first pipeline stage (do_prefill and do_decode add it when
#   is_first_in_pipeline).
# - DISTSERVE_TOKEN_OVERHEAD_S: the same function, ``k = 0.0001`` (ms) per token of
#   ``sum(current_context_len)`` over the iteration's requests (a prompt's length; a decoding
#   request's prompt plus the tokens it has produced).
# - DISTSERVE_PREFILL_OVERHEAD_S: simdistserve/estimators/time_estimator.py, get_prefill_time,
#   ``pp_const = 1 * pp`` (ms): added to every pipeline stage of a prefill iteration, so pp x 1 ms
#   per stage (get_decode_time sets its pp_const to 0).
DISTSERVE_OVERHEAD_S = 2e-3
DISTSERVE_TOKEN_OVERHEAD_S = 1e-7
DISTSERVE_PREFILL_OVERHEAD_S = 1e-3


class DistServeFit:
    """DistServe's fitted latency model (``simdistserve``), coefficients in ms.

    prefill = A + B x sum(len) + C x sum(len^2); decode = A + B x sum(context)
    + C x batch, with the small-batch coefficients when batch < threshold and
    the large-batch ones otherwise. A prefill chunk ``(n, c)`` contributes
    ``n`` to sum(len) and ``n (n + 2c)`` to sum(len^2) (the attention work of
    ``n`` new tokens after ``c`` cached ones, which is ``n^2`` without cache).
    A decode sequence's context is the batch's ``decode_context_sum`` share,
    which counts the token fed in, as simdistserve's ``current_context_len + 1``.
    NOTE: a mixed batch is priced as prefill + decode, as if run back to back,
    with one iteration's overheads; DistServe itself never mixes phases.

    On top of the fit, the costs simdistserve adds outside it (the
    ``DISTSERVE_*`` constants; all 0 unless given, so the bare fit is what
    DistServe's profiler measured): ``overhead_s`` per iteration,
    ``token_overhead_s`` per context token of every sequence in the batch
    (a chunk ``(n, c)`` counts ``n + c``, a decode sequence its context less
    the token fed in) and ``prefill_overhead_s`` x ``pp`` per pipeline stage
    of an iteration with prefill work.

    Pipeline parallelism as simdistserve prices it: with ``pp`` stages each
    stage runs fit / pp (plus the prefill term); the first stage also pays
    ``overhead_s`` and the token term. :meth:`stage_times` gives the two
    stage times, :meth:`iteration_time` their sum over the ``pp`` stages
    (the batch's latency through the pipeline).
    """

    __slots__ = (
        "name", "sha256", "prefill", "decode_small", "decode_large", "threshold", "pp",
        "overhead_s", "token_overhead_s", "prefill_overhead_s",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        sha256: str | None,
        prefill: tuple[float, float, float],
        decode_small: tuple[float, float, float],
        decode_large: tuple[float, float, float],
        threshold: int,
        *,
        pp: int = 1,
        overhead_s: float = 0.0,
        token_overhead_s: float = 0.0,
        prefill_overhead_s: float = 0.0,
    ) -> None:
        self.name, self.sha256 = name, sha256
        self.prefill = tuple(float(x) for x in prefill)
        self.decode_small = tuple(float(x) for x in decode_small)
        self.decode_large = tuple(float(x) for x in decode_large)
        self.threshold = int(threshold)
        if not is_int(pp) or pp < 1:
            raise ProfileError(f"{name}: pp={pp!r} must be a positive integer")
        self.pp = int(pp)
        for label, v in (("overhead_s", overhead_s), ("token_overhead_s", token_overhead_s),
                         ("prefill_overhead_s", prefill_overhead_s)):  # fmt: skip
            if not is_number(v) or not 0.0 <= v < math.inf:
                raise ProfileError(f"{name}: {label}={v!r} must be a finite number >= 0")
        self.overhead_s = float(overhead_s)
        self.token_overhead_s = float(token_overhead_s)
        self.prefill_overhead_s = float(prefill_overhead_s)

    @classmethod
    def from_json(
        cls,
        path: Path,
        model: str,
        tp: int,
        *,
        where: str = "",
        pp: int = 1,
        overhead_s: float = 0.0,
        token_overhead_s: float = 0.0,
        prefill_overhead_s: float = 0.0,
    ) -> DistServeFit:
        """Coefficients of ``model`` (as keyed in the file, e.g. ``facebook/opt-13b``) at TP;
        the keywords as in the class docstring."""
        where = where or str(path)
        data = _read_bytes(Path(path), where)
        try:
            doc = json.loads(decode_text(data, where, ProfileError))
        except ValueError as e:
            raise ProfileError(f"{where}: not JSON ({e})") from None
        entry = None
        if isinstance(doc, dict):
            key = next((k for k in doc if _same_name(k, model, get_model)), model)
            entry = doc.get(key, {}).get(str(tp)) if isinstance(doc.get(key), dict) else None
        if entry is None:
            known = ", ".join(
                f"{m} tp{t}" for m in sorted(doc) if isinstance(doc[m], dict) for t in doc[m]
            )
            raise ProfileError(
                f"{where}: no fit for model={model!r} tp={tp}; available: {known or '(none)'}"
            )
        try:
            return cls(
                f"distserve:{Path(path).name}:{model}x{tp}" + (f"pp{pp}" if pp > 1 else ""),
                hashlib.sha256(data).hexdigest(),
                tuple(entry["prefill"]),
                tuple(entry["decoding_smallbs"]),
                tuple(entry["decoding_largebs"]),
                entry["decoding_large_small_bs_threshold"],
                pp=pp,
                overhead_s=overhead_s,
                token_overhead_s=token_overhead_s,
                prefill_overhead_s=prefill_overhead_s,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"{where}: {model} tp{tp}: malformed fit ({e!r})") from None

    def stage_times(self, batch: Batch) -> tuple[float, float]:
        """Seconds ``batch`` holds the first pipeline stage and each later one."""
        ms = 0.0
        tokens = 0  # simdistserve's sum(current_context_len)
        if batch.prefill:
            a, b, c = self.prefill
            s1 = 0
            s2 = 0
            for n, cached in batch.prefill:
                s1 += n
                s2 += n * (n + 2 * cached)
                tokens += n + cached
            ms += a + b * s1 + c * s2
        n = batch.decode_count
        if n:
            a, b, c = self.decode_small if n < self.threshold else self.decode_large
            ms += a + b * batch.decode_context_sum + c * n
            tokens += batch.decode_context_sum - n
        pp = self.pp
        rest = ms * 1e-3 / pp
        if batch.prefill:
            rest += self.prefill_overhead_s * pp
        return rest + self.overhead_s + self.token_overhead_s * tokens, rest

    def decode_steps(self, count: int, context_sum: int, n: int) -> list[float]:
        """Seconds of ``n`` decode-only iterations of ``count`` sequences, their
        contexts summing to ``context_sum`` in the first and ``count`` more in each
        next one: :meth:`iteration_time` of each, the same float operations in the
        same order (so the same bits)."""
        a, b, c = self.decode_small if count < self.threshold else self.decode_large
        pp = self.pp
        later = pp - 1
        oh, toh = self.overhead_s, self.token_overhead_s
        stop = context_sum + n * count
        if n < VECTOR_STEPS:
            out = []
            for ctx in range(context_sum, stop, count):
                rest = (0.0 + (a + b * ctx + c * count)) * 1e-3 / pp
                out.append(rest + oh + toh * (ctx - count) + later * rest)
            return out
        import numpy as np

        ctx_a = np.arange(context_sum, stop, count, dtype=np.int64)
        rest_a = (0.0 + (a + b * ctx_a.astype(np.float64) + c * count)) * 1e-3 / pp
        first = rest_a + oh + toh * (ctx_a - count).astype(np.float64)
        return (first + later * rest_a).tolist()  # type: ignore[no-any-return]

    def iteration_time(self, batch: Batch) -> float:
        """Seconds for ``batch`` through every stage, per the fitted formulas and overheads."""
        if batch.is_empty:
            return 0.0
        first, rest = self.stage_times(batch)
        return first + (self.pp - 1) * rest
