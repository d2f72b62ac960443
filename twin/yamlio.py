"""YAML reading with YAML 1.2 numbers.

PyYAML follows YAML 1.1, where ``8e9`` and ``1.5e9`` are strings (an exponent
needs a dot and a sign there). People write them as numbers, so the loader
here reads every YAML 1.2 float as a float.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class Loader(yaml.SafeLoader):
    """A safe loader that also reads ``8e9``, ``1.5e9`` and ``1e-4`` as floats."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)
        |[-+]?(?:[0-9][0-9_]*)\.[0-9_]*
        |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load(text: str) -> Any:
    """Parse YAML text; raises ``yaml.YAMLError`` on bad input."""
    return yaml.load(text, Loader=Loader)  # noqa: S506 - Loader is a SafeLoader


def load_text(text: str, where: str) -> Any:
    """Parse YAML text; a syntax error becomes a one-line
    :class:`~twin.errors.SpecError` naming ``where`` and the line and column."""
    from twin.errors import SpecError

    try:
        return load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{where}: not valid YAML{at}: {problem}") from None
