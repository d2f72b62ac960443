"""A streaming distribution of one latency: exact values (8 bytes each, in a
flat array) up to ``exact_limit``, then logarithmic buckets of relative
width 0.2% (quantiles then are within 0.1% of the exact ones; count, mean,
min and max stay exact). :mod:`twin.sim.metrics` keeps one per metric of a
run, :mod:`twin.sim.timeline` one per window."""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Iterable

QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))


# Up to this many values a quantile is taken in plain Python (_linear_quantile):
# numpy.quantile's fixed cost (~0.1 ms) is more than sorting them.
_SHORT = 1024


def _linear_quantile(values: Iterable[float], q: float) -> float:
    """``numpy.quantile(values, q)`` (method ``"linear"``) of finite or infinite
    values: the same float operations (virtual index ``(n - 1) q``, numpy's
    two-sided linear interpolation), so the same bits."""
    s = sorted(values)
    n = len(s)
    v = (n - 1) * q
    if v >= n - 1:  # numpy takes the last value on both sides
        return _lerp(s[-1], s[-1], v + 1.0)
    lo = math.floor(v)
    return _lerp(s[lo], s[lo + 1], v - lo)


def _selected_quantile(values: array[float], q: float) -> float:
    """:func:`_linear_quantile` of many values: the two order statistics it
    reads are selected (``numpy.partition`` of a copy) instead of sorting them
    all. The same bits as ``numpy.quantile``, without its ``numpy.unique`` of
    the indexes, which imports ``numpy.ma`` (some 20 ms) on a first call."""
    import numpy as np

    x = np.array(values, dtype=np.float64)
    n = len(x)
    v = (n - 1) * q
    if v >= n - 1:
        top = float(x.max())
        return _lerp(top, top, v + 1.0)
    lo = math.floor(v)
    x.partition((lo, lo + 1))
    return _lerp(float(x[lo]), float(x[lo + 1]), v - lo)


def _lerp(a: float, b: float, g: float) -> float:
    """numpy's linear interpolation between ``a`` and ``b`` at ``g`` (from the
    nearer end: the same bits as ``numpy.quantile``)."""
    d = b - a
    if g >= 0.5:
        return b - d * (1 - g)
    return a + d * g


class Distribution:
    """Count, mean, min, max and quantiles of a stream of non-negative floats."""

    __slots__ = ("count", "total", "min", "max", "_exact", "_buckets", "exact_limit")

    _GAMMA = 1.002
    _LOG_GAMMA = math.log(_GAMMA)

    def __init__(self, exact_limit: int = 200_000) -> None:
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf
        self._exact: array[float] | None = array("d")
        self._buckets: Counter[int] | None = None  # made when the exact values fold
        self.exact_limit = exact_limit

    def add(self, x: float) -> None:
        self.count += 1
        self.total += x
        if x < self.min:
            self.min = x
        if x > self.max:
            self.max = x
        exact = self._exact
        if exact is not None:
            exact.append(x)
            if self.count > self.exact_limit:  # while exact, it holds every value
                self._fold()
        else:
            assert self._buckets is not None
            self._buckets[self._bucket(x)] += 1

    def _fold(self) -> Counter[int]:
        """The exact values into buckets (from now on, every value goes to one)."""
        if self._buckets is None:
            self._buckets = Counter()
        if self._exact is not None:
            for v in self._exact:
                self._buckets[self._bucket(v)] += 1
            self._exact = None
        return self._buckets

    def merge(self, other: Distribution) -> None:
        """Fold ``other``'s values into this one (as if each had been added)."""
        if other.count == 0:
            return
        if self._exact is not None and other._exact is not None:
            self.count += other.count
            self.total += other.total
            self.min = min(self.min, other.min)
            self.max = max(self.max, other.max)
            self._exact.extend(other._exact)
            if len(self._exact) > self.exact_limit:
                self._fold()
            return
        buckets = self._fold()
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        buckets.update(other._fold())

    def _bucket(self, x: float) -> int:
        if x <= 1e-12:
            return -(10**9)
        return math.ceil(math.log(x) / self._LOG_GAMMA)

    def quantile(self, q: float) -> float:
        if self.count == 0:
            return math.nan
        if self._exact is not None:
            if self.total == self.total:  # no NaN among them
                if self.count <= _SHORT:
                    return _linear_quantile(self._exact, q)
                return _selected_quantile(self._exact, q)
            import numpy as np

            return float(np.quantile(np.asarray(self._exact), q))
        rank = q * (self.count - 1)
        seen = 0
        buckets = self._buckets
        assert buckets is not None
        for b in sorted(buckets):
            seen += buckets[b]
            if seen > rank:
                if b == -(10**9):
                    return 0.0
                value = 2.0 * self._GAMMA**b / (self._GAMMA + 1.0)
                return min(max(value, self.min), self.max)
        return self.max

    def summary(self) -> dict[str, float | None]:
        if self.count == 0:
            return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
        out: dict[str, float | None] = {"mean": self.total / self.count}
        for name, q in QUANTILES:
            out[name] = self.quantile(q)
        out["max"] = self.max
        return out
