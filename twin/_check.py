"""Small validators shared by the spec readers (models, hardware, perf).

Each raises :class:`twin.errors.SpecError` with a message that names where the
value came from (``spec.yaml: model.layers``), the value, and what was expected.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from difflib import get_close_matches

from twin.errors import SpecError


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


def positive_int(value: object, where: str) -> int:
    """An ``int`` (not a bool) greater than zero; an integral float such as
    ``8.0e9`` counts."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{where}: {value!r} must be a positive integer")
    return value


def positive_float(value: object, where: str) -> float:
    """A finite number greater than zero."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{where}: {value!r} must be a positive number")
    x = float(value)
    if not math.isfinite(x) or x <= 0:
        raise SpecError(f"{where}: {value!r} must be a positive number")
    return x


def nonneg_float(value: object, where: str) -> float:
    """A finite number greater than or equal to zero."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{where}: {value!r} must be a number >= 0")
    x = float(value)
    if not math.isfinite(x) or x < 0:
        raise SpecError(f"{where}: {value!r} must be a number >= 0")
    return x


def fraction(value: object, where: str) -> float:
    """A number in (0, 1]."""
    x = positive_float(value, where)
    if x > 1.0:
        raise SpecError(f"{where}: {value!r} must be in (0, 1]")
    return x
