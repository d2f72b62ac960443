"""The version of pd-twin and the sha256 of its own source (results carry both)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pd-twin")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"


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
