"""Key paths into spec data: what ``--set``, compare entries and sweep keys name.

A key path is dotted (``engine.block_size``); an item of a list is named by
its index, from 0, dotted or in brackets (``workload.classes.0.share`` and
``workload.classes[0].share`` are the same item).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from twin.errors import SpecError

_INDEX = re.compile(r"\[(\d+)\]")


def key_path_parts(path: str, where: str) -> list[str | int]:
    """The steps of a key path: ``a.b[0].c`` is ``['a', 'b', 0, 'c']``; a
    dotted step of digits (``a.b.0.c``) stays a string, an index when it
    meets a list."""
    parts: list[str | int] = []
    for piece in path.split("."):
        name = _INDEX.sub("", piece)
        if not piece or "[" in name or "]" in name or not (name or piece.startswith("[")):
            raise SpecError(
                f"{where}: {path!r} is not a key path (expected e.g. cluster.tp or "
                "workload.classes[0].share)"
            )
        if name:
            parts.append(name)
        parts.extend(int(k) for k in _INDEX.findall(piece))
    if isinstance(parts[0], int):
        raise SpecError(f"{where}: {path!r} is not a key path (it starts with an index)")
    return parts


def dotted(path: str) -> str:
    """``path`` with its list indexes dotted (``a[0].b`` is ``a.0.b``), so that
    the two spellings of one path compare equal."""
    return _INDEX.sub(r".\1", path)


def _shown(parts: Sequence[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")


def _index(node: list[Any], part: str | int, above: str, where: str) -> int:
    """Step ``part`` of a path into the list ``node`` (at ``above``): an index in range."""
    if isinstance(part, str) and not part.isdigit():
        raise SpecError(f"{where}: {above} is a list; name an item by its index ({above}[0])")
    k = int(part)
    if k >= len(node):
        raise SpecError(
            f"{where}: {above} has {len(node)} item(s); index {k} is out of range "
            f"(0..{len(node) - 1})"
        )
    return k


def set_key_path(data: dict[str, Any], path: str, value: Any, where: str) -> None:
    """Set (``None``: delete) the key path ``path`` of ``data`` in place.
    Mappings on the way that are missing are made (except to delete); a list
    is stepped into by index, which must be in range; ``where`` opens each
    error's line."""
    parts = key_path_parts(path, where)
    node: Any = data
    for i, part in enumerate(parts):
        above = _shown(parts[:i])
        if isinstance(node, list):
            key: Any = _index(node, part, above, where)
        elif isinstance(part, int):
            raise SpecError(f"{where}: {above} is a mapping, not a list; [{part}] indexes a list")
        else:
            key = part
        if i == len(parts) - 1:
            if value is not None:
                node[key] = value
            elif isinstance(node, list):
                del node[key]
            else:
                node.pop(key, None)
            return
        nxt = node[key] if isinstance(node, list) else node.get(key)
        if nxt is None and value is None:
            return  # removing below a key that is not there: nothing to do
        here, indexed = _shown(parts[: i + 1]), isinstance(parts[i + 1], int)
        if nxt is None and indexed:
            raise SpecError(f"{where}: {here} is not set; [{parts[i + 1]}] indexes a list")
        if nxt is None:
            nxt = node[key] = {}
        elif isinstance(nxt, str) and part == "scheduler":
            nxt = node[key] = {"name": nxt}
        elif not isinstance(nxt, dict | list):
            raise SpecError(f"{where}: {here} is {nxt!r}, not a {'list' if indexed else 'mapping'}")
        node = nxt
