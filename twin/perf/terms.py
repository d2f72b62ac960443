"""Checks of the performance models' terms, each refusing a bad value in one
:class:`~twin.errors.SpecError` that names the term (``roofline: mfu=1.2 must
be a number in (0, 1]``)."""

from __future__ import annotations

from twin._check import is_number
from twin.errors import SpecError


def check_fraction(name: str, v: float) -> float:
    """``v`` as a float when it is a number in (0, 1]."""
    if not is_number(v) or not 0.0 < v <= 1.0:
        raise SpecError(f"roofline: {name}={v!r} must be a number in (0, 1]")
    return float(v)


def positive_float_or(v: float, name: str) -> float:
    """``v`` as a float when it is a finite number > 0, else a :class:`SpecError`."""
    if not is_number(v) or not 0.0 < v < float("inf"):
        raise SpecError(f"roofline: {name}={v!r} must be a finite number > 0")
    return float(v)


def check_nonneg(name: str, v: float) -> float:
    """``v`` as a float when it is a finite number >= 0."""
    if not is_number(v) or not 0.0 <= v < float("inf"):
        raise SpecError(f"roofline: {name}={v!r} must be a finite number >= 0")
    return float(v)
