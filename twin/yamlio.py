"""YAML reading with YAML 1.2 numbers and booleans and no duplicate keys.

PyYAML follows YAML 1.1, where ``8e9`` and ``1.5e9`` are strings (an exponent
needs a dot and a sign there). People write them as numbers, so the loader
here reads every YAML 1.2 float as a float. YAML 1.1 also reads ``on``,
``off``, ``yes``, ``no``, ``y`` and ``n`` as booleans, so a mapping with the
keys ``on:`` and ``off:`` (a ``bursts`` rate schedule) would have the keys
``True`` and ``False``; here, as in YAML 1.2, only ``true`` and ``false``
(also ``True``, ``TRUE``, ``False``, ``FALSE``) are booleans, and the rest
are strings.

A mapping that gives one key twice is an error (YAML 1.2 requires unique
keys; PyYAML would silently keep the last), so a spec never runs with a value
its author did not mean. Keys a ``<<`` merge brings in may be overridden, as
YAML's merge-key rule says.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class Loader(yaml.SafeLoader):
    """A safe loader that also reads ``8e9``, ``1.5e9`` and ``1e-4`` as floats,
    takes only ``true``/``false`` as booleans and refuses a key given twice in
    one mapping. Every YAML the project reads goes through it (:func:`load`)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=False)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader reports it
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first at line {first.start_mark.line + 1}); "
                        "each key may appear once in a mapping",
                        key_node.start_mark,
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


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


_BOOL = "tag:yaml.org,2002:bool"
# YAML 1.1's booleans out (in a table of this class's own) ...
Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in Loader.yaml_implicit_resolvers.items()
}
# ... and YAML 1.2's core schema booleans in.
Loader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load(text: str) -> Any:
    """Parse YAML text; raises ``yaml.YAMLError`` on bad input."""
    return yaml.load(text, Loader=Loader)  # Loader is a SafeLoader


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
