"""When requests arrive: Poisson or Gamma (bursty) processes at a rate, drawn from a
seeded generator in fixed-size chunks so that a seed gives one stream.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from twin._check import is_number
from twin.errors import SpecError

if TYPE_CHECKING:
    import numpy as np

_CHUNK = 4096  # draws per numpy call; fixed so that a seed gives one stream


def _positive(name: str, x: object) -> float:
    if not is_number(x) or not math.isfinite(x) or x <= 0:
        raise SpecError(f"{name}(={x!r}) must be a number > 0")
    return float(x)


@dataclass(frozen=True, slots=True)
class PoissonArrivals:
    """Exponential inter-arrival gaps with mean ``1 / rate_per_s``."""

    rate_per_s: float

    def __post_init__(self) -> None:
        _positive("rate", self.rate_per_s)

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.standard_exponential(n) / self.rate_per_s


@dataclass(frozen=True, slots=True)
class GammaArrivals:
    """Gamma inter-arrival gaps with mean ``1 / rate_per_s`` and coefficient of variation ``cv``.

    Shape ``k = 1 / cv^2``; ``cv = 1`` is Poisson, ``cv > 1`` burstier, ``cv < 1`` smoother.
    """

    rate_per_s: float
    cv: float

    def __post_init__(self) -> None:
        _positive("rate", self.rate_per_s)
        _positive("cv", self.cv)

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        k = 1.0 / (self.cv * self.cv)
        return rng.standard_gamma(k, n) / (k * self.rate_per_s)


ArrivalProcess = PoissonArrivals | GammaArrivals


def arrival_times(process: ArrivalProcess, rng: np.random.Generator) -> Iterator[float]:
    """Endless arrival times in seconds, the first one gap after 0."""
    import numpy as np

    t = 0.0
    while True:
        times = t + np.cumsum(process.gaps(rng, _CHUNK))
        yield from times.tolist()
        t = float(times[-1])
