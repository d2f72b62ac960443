"""Files shipped with pd-twin and usable by name: experiment specs and topologies.

Installed, they live in the packages ``twin.data.experiments`` and
``twin.data.topologies``; in a source checkout, in ``experiments/`` and
``topologies/`` at the top of the tree.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

KINDS = ("experiments", "topologies")


def bundled_dir(kind: str) -> Traversable:
    """The folder of bundled ``kind`` files (``experiments`` or ``topologies``)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}; expected one of {', '.join(KINDS)}")
    # A source checkout reads its own files, even when another checkout is the
    # editable install that ``twin.data.*`` resolves to.
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / kind).is_dir():
        return root / kind
    try:
        return resources.files(f"twin.data.{kind}")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / kind


def bundled_names(kind: str) -> list[str]:
    """Names (file stems) of the bundled YAML files of ``kind``."""
    root = bundled_dir(kind)
    if not root.is_dir():
        return []
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def bundled_text(kind: str, name: str) -> str:
    return (bundled_dir(kind) / f"{name}.yaml").read_text(encoding="utf-8")
