"""Parse quantities with units into SI floats.

Internally pd-twin works in seconds, bytes, bytes/s and FLOP/s. YAML inputs
may give strings with units; bits and bytes, and decimal (GB) and binary (GiB)
prefixes, are kept exact: ``"400 Gbps"`` is 50e9 bytes/s, ``"80 GiB"`` is
80 * 2**30 bytes. A bare number is taken as already in the base unit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from twin.errors import UnitError

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_QUANTITY = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-z/]*)\s*$")

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}

_DURATION = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}


def _alternatives(names: Iterable[str]) -> str:
    """A regex alternation of ``names``, longest first (``min`` before ``s``)."""
    return "|".join(sorted((n for n in names if n), key=lambda n: (-len(n), n)))


# The strings parse_duration and parse_bytes take, as JSON Schema (ECMA-262) patterns.
DURATION_PATTERN = rf"^\s*{_NUMBER}\s*(?:{_alternatives(_DURATION)})?\s*$"
SIZE_PATTERN = rf"^\s*{_NUMBER}\s*(?:(?:{_alternatives({**_DECIMAL, **_BINARY})})?[Bb])?\s*$"


def _split(value: object, what: str, expected: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not {what}; expected {expected}")
    if isinstance(value, int | float):
        return float(value), ""
    if not isinstance(value, str):
        raise UnitError(f"{value!r} is not {what}; expected {expected}")
    m = _QUANTITY.match(value)
    if not m:
        raise UnitError(f"{value!r} is not {what}; expected {expected}")
    return float(m.group(1)), m.group(2)


def _finite(x: float, value: object, what: str) -> float:
    if not math.isfinite(x):
        raise UnitError(f"{value!r} is not a finite {what}")
    return x


def parse_duration(value: object) -> float:
    """Seconds from ``2``, ``"2 s"``, ``"50ms"``, ``"10 us"``, ``"1 min"``, ``"1h"``."""
    expected = "a number with one of " + ", ".join(_DURATION)
    x, unit = _split(value, "a duration", expected)
    if unit == "":
        return _finite(x, value, "duration")
    if unit not in _DURATION:
        raise UnitError(f"{value!r} is not a duration; expected {expected}")
    return _finite(x * _DURATION[unit], value, "duration")


def _prefix_factor(prefix: str) -> float | None:
    if prefix in _BINARY:
        return _BINARY[prefix]
    if prefix in _DECIMAL:
        return _DECIMAL[prefix]
    return None


def parse_bytes(value: object) -> float:
    """Bytes from ``1024``, ``"80 GiB"``, ``"80 GB"`` (decimal), ``"512 Mib"`` (bits)."""
    expected = "a number with a unit such as B, KiB, MiB, GiB, TiB, kB, MB, GB, TB, Gb, Gib"
    x, unit = _split(value, "a size", expected)
    if unit == "":
        return _finite(x, value, "size")
    for suffix, scale in (("B", 1.0), ("b", 0.125)):
        if unit.endswith(suffix):
            factor = _prefix_factor(unit[: -len(suffix)])
            if factor is not None:
                return _finite(x * factor * scale, value, "size")
    raise UnitError(f"{value!r} is not a size; expected {expected}")


def parse_bandwidth(value: object) -> float:
    """Bytes per second from ``"400 Gbps"`` (bits), ``"25 GB/s"`` (bytes), ``"900 GiB/s"``.

    ``bps`` and ``b/s`` are bits per second; ``Bps`` and ``B/s`` are bytes per second.
    """
    expected = "a number with a unit such as Gbps, Gb/s, GB/s, GiB/s, MB/s, Tbps"
    x, unit = _split(value, "a bandwidth", expected)
    if unit == "":
        return _finite(x, value, "bandwidth")
    for suffix, scale in (("bps", 0.125), ("b/s", 0.125), ("Bps", 1.0), ("B/s", 1.0)):
        if unit.endswith(suffix):
            factor = _prefix_factor(unit[: -len(suffix)])
            if factor is not None:
                return _finite(x * factor * scale, value, "bandwidth")
    raise UnitError(f"{value!r} is not a bandwidth; expected {expected}")


def parse_flops(value: object) -> float:
    """FLOP/s from ``989e12``, ``"989 TFLOPS"``, ``"1.98 PFLOP/s"``."""
    expected = "a number with a unit such as TFLOPS, TFLOP/s, PFLOPS"
    x, unit = _split(value, "a compute rate", expected)
    if unit == "":
        return _finite(x, value, "compute rate")
    for suffix in ("FLOPS", "FLOP/s", "flops", "flop/s"):
        if unit.endswith(suffix):
            factor = _DECIMAL.get(unit[: -len(suffix)])
            if factor is not None:
                return _finite(x * factor, value, "compute rate")
    raise UnitError(f"{value!r} is not a compute rate; expected {expected}")


def format_bytes(n: float) -> str:
    """Human form with binary prefixes, exact to 3 decimals: ``1.250 GiB``."""
    for unit, scale in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.3f} {unit}"
    return f"{n:,.0f} B"
