"""Small validators shared by the spec readers (models, hardware, perf, specs).

Each raises :class:`twin.errors.SpecError` with a message that names where the
value came from (``spec.yaml: model.layers``), the value, and what was expected.
YAML's ``true`` is an ``int`` to Python; none of these takes a bool for a number.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from difflib import get_close_matches
from typing import TypeGuard

from twin.errors import SpecError, UnitError
from twin.units import parse_bytes, parse_duration

# Bounds on sizes, checked before anything is allocated for them: a typo such
# as ``instances: 1e8`` is refused at once instead of exhausting memory. Each
# sits far above the largest real deployment it stands for.
MAX_GPUS = 200_000
"""GPUs in one simulated cluster or topology: twice xAI's Colossus (100,000
H100 GPUs, the largest cluster publicly described, 2024)."""
MAX_NODES = MAX_GPUS
"""Nodes of a topology: no node has fewer than one GPU."""
MAX_GPUS_PER_NODE = 1_024
"""GPUs in one node (one scale-up domain): about twice the largest NVLink
domain announced, NVIDIA's Rubin Ultra NVL576 (576 GPUs, GTC 2025)."""


def at_most(value: int, bound: int, where: str, what: str) -> None:
    """Refuse a count above one of the bounds above, saying which."""
    if value > bound:
        raise SpecError(
            f"{where}: {value} {what} is over the limit of {bound:,}; a value this large "
            "is almost certainly a typo (see the bounds in twin/_check.py)"
        )


def entry(where: str, key: str) -> str:
    """``"spec.yaml: model"`` + ``"layers"`` -> ``"spec.yaml: model.layers"``."""
    if not where:
        return key
    return f"{where}.{key}" if ":" in where else f"{where}: {key}"


def check_keys(
    mapping: Mapping[str, object],
    where: str,
    required: Collection[str],
    optional: Collection[str] = (),
) -> None:
    """Every required key present, no key outside ``required | optional``."""
    allowed = list(required) + [k for k in optional if k not in required]
    for key in mapping:
        if key not in allowed:
            close = get_close_matches(str(key), allowed, n=2, cutoff=0.6)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise SpecError(
                f"{where or 'mapping'}: unknown key {key!r}.{hint} "
                f"Expected one of {', '.join(allowed)}"
            )
    missing = [k for k in required if k not in mapping]
    if missing:
        raise SpecError(
            f"{where or 'mapping'}: missing {', '.join(repr(k) for k in missing)}; "
            f"required keys are {', '.join(required)}"
        )


def is_int(value: object) -> TypeGuard[int]:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """An ``int`` or a ``float`` that is not a ``bool``."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def positive_int(value: object, where: str) -> int:
    """An ``int`` (not a bool) greater than zero; an integral float such as
    ``8.0e9`` counts."""
    value = _whole(value)
    if is_int(value) and value > 0:
        return value
    raise SpecError(f"{where}: {value!r} must be a positive integer")


def nonneg_int(value: object, where: str) -> int:
    """An ``int`` (not a bool) greater than or equal to zero; an integral float counts."""
    value = _whole(value)
    if is_int(value) and value >= 0:
        return value
    raise SpecError(f"{where}: {value!r} must be a non-negative integer")


def positive_float(value: object, where: str) -> float:
    """A finite number greater than zero."""
    if not is_number(value):
        raise SpecError(f"{where}: {value!r} must be a positive number")
    x = float(value)
    if not math.isfinite(x) or x <= 0:
        raise SpecError(f"{where}: {value!r} must be a positive number")
    return x


def nonneg_float(value: object, where: str) -> float:
    """A finite number greater than or equal to zero."""
    if not is_number(value):
        raise SpecError(f"{where}: {value!r} must be a number >= 0")
    x = float(value)
    if not math.isfinite(x) or x < 0:
        raise SpecError(f"{where}: {value!r} must be a number >= 0")
    return x


def interval_text(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> str:
    """``"(0, 1]"`` and the like."""
    return f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


def in_interval(
    value: object, where: str, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
) -> float:
    """A number between ``lo`` and ``hi``, each end included unless it is open."""
    text = interval_text(lo, hi, lo_open=lo_open, hi_open=hi_open)
    if not is_number(value):
        raise SpecError(f"{where}: {value!r} must be a number in {text}")
    x = float(value)
    if not ((lo < x if lo_open else lo <= x) and (x < hi if hi_open else x <= hi)):
        raise SpecError(f"{where}: {value!r} must be in {text}")
    return x


def fraction(value: object, where: str) -> float:
    """A number in (0, 1]."""
    return in_interval(value, where, 0.0, 1.0, lo_open=True)


def boolean(value: object, where: str) -> bool:
    """``true`` or ``false``, nothing that merely looks like one."""
    if not isinstance(value, bool):
        raise SpecError(f"{where}: {value!r} must be true or false")
    return value


def one_of(value: object, where: str, choices: Collection[object]) -> object:
    """One of ``choices`` (compared with ``==``; a bool never matches a number)."""
    if not any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in choices):
        raise SpecError(f"{where}: {value!r}; expected one of {', '.join(map(str, choices))}")
    return value


def duration(value: object, where: str, *, positive: bool = True) -> float:
    """Seconds from a number or a string with a unit (``"50 ms"``); > 0, or >= 0."""
    return _quantity(parse_duration, value, where, positive)


def size(value: object, where: str, *, positive: bool = False) -> float:
    """Bytes from a number or a string with a unit (``"2 GiB"``); >= 0, or > 0."""
    return _quantity(parse_bytes, value, where, positive)


def _quantity(parse: Callable[[object], float], value: object, where: str, positive: bool) -> float:
    try:
        x = parse(value)
    except UnitError as e:
        raise SpecError(f"{where}: {e}") from None
    if x < 0 or (positive and x == 0):
        raise SpecError(f"{where}: {value!r} must be {'>' if positive else '>='} 0")
    return x
