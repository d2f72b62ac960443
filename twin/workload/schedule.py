"""Rate schedules: a multiplier ``m(t) >= 0`` on the arrival rate over time.

A schedule scales the instantaneous arrival rate of the stream: at time ``t``
requests arrive at ``m(t)`` times the base rate (the arrival process's
``rate``, or a trace's own, times ``rate_scale``). It is applied by time
warping: with the cumulative multiplier ``M(t) = integral_0^t m(s) ds``, an
arrival the base stream puts at time ``u`` arrives at ``t = M^-1(u)``.

- Poisson arrivals at rate ``r`` become exactly the nonhomogeneous Poisson
  process of intensity ``r m(t)``: the count in ``[a, b)`` is Poisson with
  mean ``r (M(b) - M(a))``.
- Gamma arrivals become a renewal process in warped time: the gaps measured in
  ``M`` (expected arrivals at the base rate) are gamma with the given ``cv``,
  so where ``m`` changes slowly against a gap the stream looks locally like a
  gamma process at rate ``r m(t)`` with that ``cv``; the expected count up to
  ``t`` is the gamma renewal function at ``r M(t)`` (``r M(t)`` plus a bounded
  term that vanishes at ``cv = 1``).
- A trace keeps its order and its gaps are stretched where ``m < 1`` and
  squeezed where ``m > 1``: replayed through ``m = 2`` it arrives twice as
  fast.

The inverse is the right one, ``M^-1(u) = sup {t : M(t) <= u}``: no request
arrives inside a window whose multiplier is 0 (it waits for the window's
end), and when the multiplier stays 0 to the end the stream ends there
(``inf``). The schedule draws nothing at random.

The forms (the mapping under ``workload.rate_schedule``):

``{kind: steps, points: [[0 s, 1.0], [10 min, 2.0]]}``
    piecewise constant: ``m = m_i`` from ``t_i`` up to the next point, the last
    value held after the last point.
``{kind: linear, points: [[0 s, 0.5], [30 min, 2.0]]}``
    piecewise linear between the points, the last value held after the last.
``{kind: diurnal, period: 24 h, min: 0.3, max: 1.0, peak: 14 h}``
    a sinusoid between ``min`` and ``max`` of that period, at ``max`` at time
    ``peak`` (default ``0 s``) and every period after.
``{kind: bursts, on: 30 s, off: 90 s, high: 4.0, low: 1.0}``
    ``high`` for ``on``, then ``low`` (default 1.0) for ``off``, repeated from 0.

Points are ``[time, multiplier]`` with times from 0 s (the first point is at
0 s) strictly increasing. ``M`` and ``M^-1`` are closed form per piece and
take numpy arrays; the diurnal ``M^-1`` solves ``M(t) = u`` within a period
by Newton steps kept inside a shrinking bracket (bisection where a step
leaves it) until a step is under ``max(1e-9 s, 4 eps period)``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from twin._check import check_keys, duration, is_number
from twin.errors import SpecError
from twin.units import DURATION_PATTERN

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "KINDS",
    "RATE_SCHEDULE_SCHEMA",
    "Bursts",
    "Diurnal",
    "Piecewise",
    "RateSchedule",
    "parse_rate_schedule",
]

KINDS = ("steps", "linear", "diurnal", "bursts")
_NEWTON_TOL_S = 1e-9  # seconds; a Newton step under this (or 4 eps x period) ends the solve
_NEWTON_MAX = 80  # bisection alone halves a period to 1e-9 s within 64 steps


def _as_array(x: Any) -> np.ndarray:
    import numpy as np

    return np.asarray(x, dtype=np.float64)


def _from_zero(x: Any) -> np.ndarray:
    """``x`` as a float array, negative values (before the schedule's 0) taken as 0."""
    import numpy as np

    return np.maximum(_as_array(x), 0.0)


@dataclass(frozen=True, slots=True)
class Piecewise:
    """``steps`` (constant from each point to the next) or ``linear`` (straight
    between points); after the last point its multiplier holds."""

    kind: str
    times_s: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.kind not in ("steps", "linear"):
            raise SpecError(f"kind {self.kind!r} is not steps or linear")
        if not self.times_s or len(self.times_s) != len(self.values):
            raise SpecError("points: give at least one [time, multiplier]")
        if self.times_s[0] != 0:
            raise SpecError(
                f"points[0]: the first point is at {self.times_s[0]!r} s; it must be at 0 s"
            )
        for i in range(1, len(self.times_s)):
            if not self.times_s[i] > self.times_s[i - 1]:
                raise SpecError(
                    f"points[{i}]: time {self.times_s[i]!r} s is not after the previous "
                    f"point's {self.times_s[i - 1]!r} s; times must increase"
                )
        for i, v in enumerate(self.values):
            if not (is_number(v) and math.isfinite(v) and v >= 0):
                raise SpecError(f"points[{i}]: multiplier {v!r} must be a number >= 0")
        if not any(v > 0 for v in self.values):
            raise SpecError("every multiplier is 0: no request would ever arrive")

    def _knots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Piece starts, start values, slopes (per s; 0 for steps and the last
        piece) and ``M`` at each piece's start."""
        import numpy as np

        t = _as_array(self.times_s)
        v = _as_array(self.values)
        slope = np.zeros_like(v)
        if self.kind == "linear" and len(t) > 1:
            slope[:-1] = np.diff(v) / np.diff(t)
        mass = v[:-1] * np.diff(t) + 0.5 * slope[:-1] * np.diff(t) ** 2
        return t, v, slope, np.concatenate(([0.0], np.cumsum(mass)))

    def rate(self, t: Any) -> np.ndarray:
        """``m(t)``."""
        import numpy as np

        t = _from_zero(t)
        knots, v, slope, _ = self._knots()
        i = np.searchsorted(knots, t, side="right") - 1
        return np.maximum(v[i] + slope[i] * (t - knots[i]), 0.0)

    def cumulative(self, t: Any) -> np.ndarray:
        """``M(t)``."""
        import numpy as np

        t = _from_zero(t)
        knots, v, slope, m0 = self._knots()
        i = np.searchsorted(knots, t, side="right") - 1
        s = t - knots[i]
        return m0[i] + v[i] * s + 0.5 * slope[i] * s * s

    def inverse(self, u: Any) -> np.ndarray:
        """``M^-1(u)``; ``inf`` past the total of a schedule ending at 0."""
        import numpy as np

        u = _from_zero(u)
        knots, v, slope, m0 = self._knots()
        i = np.searchsorted(m0, u, side="right") - 1
        r = np.maximum(u - m0[i], 0.0)
        a, k = v[i], slope[i]
        # s solves k s^2 / 2 + a s = r; this form has no cancellation (a >= 0)
        root = np.sqrt(np.maximum(a * a + 2.0 * k * r, 0.0))
        den = a + root
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.where(den > 0, 2.0 * r / den, np.where(r > 0, np.inf, 0.0))
        out = knots[i] + s
        if v[-1] == 0:  # held at 0 after the last point: nothing arrives at or past the total
            out = np.where(u >= m0[-1], np.inf, out)
        return out


@dataclass(frozen=True, slots=True)
class Diurnal:
    """``m(t) = mid + amp cos(2 pi (t - peak) / period)`` between ``low`` and ``high``."""

    period_s: float
    low: float
    high: float
    peak_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.period_s) and self.period_s > 0):
            raise SpecError(f"period: {self.period_s!r} s must be > 0")
        if not 0 <= self.low <= self.high:
            raise SpecError(f"min: {self.low!r} must be >= 0 and <= max ({self.high!r})")
        if not self.high > 0:
            raise SpecError(f"max: {self.high!r} must be > 0, else no request would ever arrive")

    def _shape(self) -> tuple[float, float, float]:
        mid, amp = 0.5 * (self.high + self.low), 0.5 * (self.high - self.low)
        return mid, amp, 2 * math.pi / self.period_s

    def rate(self, t: Any) -> np.ndarray:
        import numpy as np

        mid, amp, w = self._shape()
        return mid + amp * np.cos(w * (_as_array(t) - self.peak_s))

    def cumulative(self, t: Any) -> np.ndarray:
        import numpy as np

        t = _from_zero(t)
        mid, amp, w = self._shape()
        p = self.peak_s
        return mid * t + (amp / w) * (np.sin(w * (t - p)) + math.sin(w * p))

    def inverse(self, u: Any) -> np.ndarray:
        import numpy as np

        u = _from_zero(u)
        mid, _, _ = self._shape()
        per = mid * self.period_s  # M(t + period) = M(t) + per
        k = np.floor(u / per)
        target = np.clip(u - k * per, 0.0, per)
        lo = np.zeros_like(target)
        hi = np.full_like(target, self.period_s)
        t = target / mid
        tol = max(_NEWTON_TOL_S, 4 * np.finfo(np.float64).eps * self.period_s)
        for _ in range(_NEWTON_MAX):
            f = self.cumulative(t) - target
            lo = np.where(f <= 0, t, lo)
            hi = np.where(f > 0, t, hi)
            m = self.rate(t)
            with np.errstate(divide="ignore", invalid="ignore"):
                step = np.where(m > 0, t - f / m, np.nan)
            ok = (step >= lo) & (step <= hi)
            nxt = np.where(ok, step, 0.5 * (lo + hi))
            done = np.abs(nxt - t) < tol
            t = nxt
            if bool(done.all()):
                break
        return k * self.period_s + t


@dataclass(frozen=True, slots=True)
class Bursts:
    """``high`` for ``on_s``, then ``low`` for ``off_s``, repeated from time 0."""

    on_s: float
    off_s: float
    high: float
    low: float = 1.0

    def __post_init__(self) -> None:
        for name, x in (("on", self.on_s), ("off", self.off_s)):
            if not (math.isfinite(x) and x > 0):
                raise SpecError(f"{name}: {x!r} s must be > 0")
        for name, x in (("high", self.high), ("low", self.low)):
            if not (is_number(x) and math.isfinite(x) and x >= 0):
                raise SpecError(f"{name}: {x!r} must be a number >= 0")
        if self.high == 0 and self.low == 0:
            raise SpecError("high and low are both 0: no request would ever arrive")

    def rate(self, t: Any) -> np.ndarray:
        import numpy as np

        s = np.mod(_as_array(t), self.on_s + self.off_s)
        return np.where(s < self.on_s, self.high, self.low)

    def cumulative(self, t: Any) -> np.ndarray:
        import numpy as np

        t = _from_zero(t)
        period = self.on_s + self.off_s
        k = np.floor(t / period)
        s = t - k * period
        burst = self.high * np.minimum(s, self.on_s) + self.low * np.maximum(s - self.on_s, 0.0)
        return k * (self.high * self.on_s + self.low * self.off_s) + burst

    def inverse(self, u: Any) -> np.ndarray:
        import numpy as np

        u = _from_zero(u)
        period = self.on_s + self.off_s
        per = self.high * self.on_s + self.low * self.off_s
        k = np.floor(u / per)
        r = np.clip(u - k * per, 0.0, per)
        in_burst = self.high * self.on_s
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.where(
                (r < in_burst) | (self.low == 0),
                r / self.high if self.high > 0 else 0.0,
                self.on_s + (r - in_burst) / self.low,
            )
        return k * period + s


RateSchedule = Piecewise | Diurnal | Bursts

_DURATION_SCHEMA = {
    "anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": DURATION_PATTERN}]
}
_MULT = {"type": "number", "minimum": 0}
_POINTS = {
    "type": "array", "minItems": 1,
    "items": {"type": "array", "prefixItems": [_DURATION_SCHEMA, _MULT],
              "minItems": 2, "maxItems": 2},
}  # fmt: skip
RATE_SCHEDULE_SCHEMA = {
    "oneOf": [
        {"type": "object", "required": ["kind", "points"], "additionalProperties": False,
         "properties": {"kind": {"enum": ["steps", "linear"]}, "points": _POINTS}},
        {"type": "object", "required": ["kind", "period", "min", "max"],
         "additionalProperties": False,
         "properties": {"kind": {"const": "diurnal"}, "period": _DURATION_SCHEMA,
                        "min": _MULT, "max": _MULT, "peak": _DURATION_SCHEMA}},
        {"type": "object", "required": ["kind", "on", "off", "high"],
         "additionalProperties": False,
         "properties": {"kind": {"const": "bursts"}, "on": _DURATION_SCHEMA,
                        "off": _DURATION_SCHEMA, "high": _MULT, "low": _MULT}},
    ]
}  # fmt: skip

_KEYS = {
    "steps": (("kind", "points"), ()),
    "linear": (("kind", "points"), ()),
    "diurnal": (("kind", "period", "min", "max"), ("peak",)),
    "bursts": (("kind", "on", "off", "high"), ("low",)),
}


_NAMES_KEY = re.compile(r"^[a-z]+(\[\d+\])?:")


def _multiplier(value: object, where: str) -> float:
    if not (is_number(value) and math.isfinite(value) and value >= 0):
        raise SpecError(f"{where}: {value!r} must be a number >= 0")
    return float(value)


def _point(value: object, where: str) -> tuple[float, float]:
    if isinstance(value, Mapping) or not isinstance(value, list | tuple) or len(value) != 2:
        raise SpecError(f"{where}: {value!r} is not a [time, multiplier] pair")
    t = duration(value[0], f"{where} time", positive=False)
    return t, _multiplier(value[1], f"{where} multiplier")


def parse_rate_schedule(value: object, where: str) -> RateSchedule:
    """The schedule of a ``rate_schedule`` mapping; errors start with ``where``."""
    if not isinstance(value, Mapping):
        raise SpecError(
            f"{where}: {value!r} is not a mapping; expected {{kind: {' | '.join(KINDS)}, ...}}"
        )
    kind = value.get("kind")
    if not isinstance(kind, str) or kind not in _KEYS:
        got = "missing" if "kind" not in value else f"{kind!r} unknown"
        raise SpecError(f"{where}.kind: {got}; expected one of {', '.join(KINDS)}")
    required, optional = _KEYS[str(kind)]
    check_keys(value, where, required, optional)
    try:
        if kind in ("steps", "linear"):
            raw = value["points"]
            if not isinstance(raw, list | tuple) or not raw:
                raise SpecError(f"points: {raw!r} is not a list of [time, multiplier] pairs")
            pts = [_point(p, f"{where}.points[{i}]") for i, p in enumerate(raw)]
            return Piecewise(str(kind), tuple(t for t, _ in pts), tuple(m for _, m in pts))
        if kind == "diurnal":
            return Diurnal(
                duration(value["period"], f"{where}.period"),
                _multiplier(value["min"], f"{where}.min"),
                _multiplier(value["max"], f"{where}.max"),
                duration(value.get("peak", 0), f"{where}.peak", positive=False),
            )
        return Bursts(
            duration(value["on"], f"{where}.on"),
            duration(value["off"], f"{where}.off"),
            _multiplier(value["high"], f"{where}.high"),
            _multiplier(value.get("low", 1.0), f"{where}.low"),
        )
    except SpecError as e:
        msg = str(e)
        if not msg.startswith(where):  # "key: ..." names a key of the schedule
            msg = f"{where}{'.' if _NAMES_KEY.match(msg) else ': '}{msg}"
        raise SpecError(msg) from None
