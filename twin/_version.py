"""The version of pd-twin and the sha256 of its own source (results carry both).

``__version__`` is looked up on first use: :mod:`importlib.metadata` costs
tens of milliseconds, which every ``twin`` call would pay otherwise."""

from typing import Any

__version__: str  # set by __getattr__ on first use


def _lookup_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pd-twin")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0+source"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value = _lookup_version()
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module 'twin._version' has no attribute {name!r}")


def code_sha256() -> str:
    """sha256 of the simulator's own source (the ``twin`` and ``schedulers``
    packages), so that a stored result is reused only by the code that made it."""
    global _code_sha
    if _code_sha is None:
        import hashlib
        from pathlib import Path

        h = hashlib.sha256()
        root = Path(__file__).resolve().parent
        for pkg in (root, root.parent / "schedulers"):
            for path in sorted(pkg.rglob("*.py")):
                h.update(path.relative_to(pkg.parent).as_posix().encode())
                h.update(path.read_bytes())
        _code_sha = h.hexdigest()
    return _code_sha


_code_sha: str | None = None
