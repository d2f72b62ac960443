"""Files shipped with pd-twin and usable by name: experiment specs and topologies;
and the public data folder, which is not shipped, found by :func:`find_data_dir`.

Installed, they live in the packages ``twin.data.experiments`` and
``twin.data.topologies``; in a source checkout, in ``experiments/`` and
``topologies/`` at the top of the tree.

A spec names a file of the public data folder (traces, length tables) with a
``data:`` path, ``trace: data:traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv``:
the part after ``data:`` is relative to the folder :func:`find_data_dir` finds
(``$TWIN_DATA``, else ``./shared/data``, else ``../shared/data``, from the
working directory). The spec (and its hash) then says nothing about where
the data lies on one machine.
"""

from __future__ import annotations

import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from twin.errors import SpecError, TwinError

KINDS = ("experiments", "topologies")
DATA_PREFIX = "data:"


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


def package_text(name: str) -> str:
    """The text of ``name``, a data file the package ships in ``twin/data``."""
    return resources.files("twin.data").joinpath(name).read_text(encoding="utf-8")


def _data_dir() -> tuple[Path | None, str]:
    """The data folder (None when none is found) and where it came from."""
    env = os.environ.get("TWIN_DATA")
    if env:
        if not Path(env).is_dir():
            raise TwinError(f"TWIN_DATA={env!r}: not a directory")
        return Path(env), f"$TWIN_DATA={env}"
    for base, name in ((Path.cwd(), "./shared/data"), (Path.cwd().parent, "../shared/data")):
        if (base / "shared" / "data").is_dir():
            return base / "shared" / "data", name
    return None, "$TWIN_DATA unset, neither ./shared/data nor ../shared/data exists"


def find_data_dir(explicit: str | None = None) -> Path:
    """The shared data directory: ``explicit``, else ``$TWIN_DATA``, else
    ``./shared/data`` or ``../shared/data`` relative to the working directory."""
    if explicit:
        p = Path(explicit)
        if not p.is_dir():
            raise TwinError(f"--data {explicit!r}: not a directory")
        return p
    found, _ = _data_dir()
    if found is None:
        raise TwinError(
            "shared data not found in ./shared/data or ../shared/data; "
            "pass --data DIR or set TWIN_DATA"
        )
    return found


def is_data_path(value: object) -> bool:
    return isinstance(value, str) and value.startswith(DATA_PREFIX)


def data_path(value: str, where: str) -> Path:
    """The file a ``data:REL`` path names, which must exist; ``where`` is the
    spec key (``FILE: workload.trace``), named in the error with how to fix it."""
    rel = value[len(DATA_PREFIX) :].strip().lstrip("/")
    key = where.rpartition(": ")[2]
    fix = f"set TWIN_DATA=DIR or --set {key}=PATH"
    if not rel:
        raise SpecError(f"{where}: {value!r}: expected data:RELATIVE/PATH in the data folder")
    root, source = _data_dir()
    if root is None:
        raise SpecError(f"{where}: {value!r}: no data folder ({source}); {fix}")
    path = root / rel
    if not path.is_file():
        raise SpecError(f"{where}: {value!r}: no such file {path} (data folder {source}); {fix}")
    return path


def spec_file(value: object, where: str, base_dir: Path | None) -> Path:
    """The file a spec key names (``workload.trace``, ``perf.path``, ...): a
    ``data:REL`` path in the data folder (:func:`data_path`, which must exist),
    else the path with ``~`` expanded, relative to ``base_dir`` (the spec's
    folder) unless absolute. ``where`` is the key, for the messages."""
    if not isinstance(value, str | Path) or not str(value).strip():
        raise SpecError(f"{where}: {value!r} is not a file path")
    if is_data_path(value):
        return data_path(str(value), where)
    p = Path(value).expanduser()
    return p if p.is_absolute() or base_dir is None else base_dir / p
