"""Reading and writing files the way every command does.

Reading: :func:`read_text` decodes UTF-8 (a leading byte-order mark is
dropped) and turns an unreadable file or bytes that are not UTF-8 into one
:class:`~twin.errors.TwinError` line naming the file, the line and the byte.
:func:`not_utf8` gives that message for a reader that streams a file itself.

Writing: :func:`atomic_write` writes to a temporary name in the target's
folder and renames it over the target only when the block ends without an
error, so a run that fails or is interrupted part-way never leaves a partial
CSV or JSON under the name of a finished one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from twin.errors import TwinError

_BOM = "\ufeff"


def not_utf8(path: str | Path) -> str:
    """``"PATH: line N: byte 0xff is not UTF-8; expected UTF-8 text"`` for the
    first byte of ``path`` that does not decode (found by reading it again,
    a chunk at a time)."""
    line, carry = 1, b""
    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                data = carry + chunk
                carry = b""
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError as e:
                    line += data.count(b"\n", 0, e.start)
                    if e.reason != "unexpected end of data":
                        return f"{path}: line {line}: {_bad_byte(data, e.start)}"
                    if not chunk:
                        return f"{path}: line {line}: the file ends inside a UTF-8 character"
                    carry = data[e.start :]  # a character split by the chunk's end
                    continue
                line += data.count(b"\n")
                if not chunk:
                    return f"{path}: not UTF-8 text"
    except OSError as e:
        return f"{path}: cannot read: {e.strerror}"


def _bad_byte(data: bytes, at: int) -> str:
    return f"byte 0x{data[at]:02x} is not UTF-8; expected UTF-8 text"


def read_text(path: str | Path, what: str = "file", error: type[TwinError] = TwinError) -> str:
    """The text of a UTF-8 file, without a leading byte-order mark; ``error``
    (one line naming ``path``) when it cannot be read or is not UTF-8."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(not_utf8(path)) from None
    return text[1:] if text.startswith(_BOM) else text


def decode_text(data: bytes, where: str, error: type[TwinError] = TwinError) -> str:
    """:func:`read_text` for bytes already read from ``where``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(f"{where}: line {line}: {_bad_byte(data, e.start)}") from None
    return text[1:] if text.startswith(_BOM) else text


class AtomicFile:
    """A file open under a temporary name beside ``path``: :meth:`close` (or a
    clean exit from ``with``) renames it to ``path``; :meth:`discard` (or an
    exception, KeyboardInterrupt too, inside ``with``) removes it. So ``path``
    holds either its previous content or the whole new one, never a part.

    Text modes default to UTF-8 and ``newline=""``. An unwritable folder is a
    :class:`~twin.errors.TwinError` naming ``path``."""

    def __init__(self, path: str | Path, mode: str = "w", **kwargs: Any) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        if "b" not in mode:
            kwargs.setdefault("encoding", "utf-8")
            kwargs.setdefault("newline", "")
        try:
            self.file: IO[Any] = open(self.tmp, mode, **kwargs)  # noqa: SIM115 - see close
        except OSError as e:
            raise TwinError(f"{self.path}: cannot write: {e.strerror}") from None

    def write(self, data: Any) -> int:
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        """Finish: the temporary file becomes ``path``."""
        if self.file.closed:
            return
        self.file.close()
        try:
            os.replace(self.tmp, self.path)
        except OSError as e:
            self.tmp.unlink(missing_ok=True)
            raise TwinError(f"{self.path}: cannot write: {e.strerror}") from None

    def discard(self) -> None:
        """Give up: remove the temporary file, leave ``path`` as it was."""
        self.file.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is None:
            self.close()
        else:
            self.discard()


@contextmanager
def atomic_write(path: str | Path, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """:class:`AtomicFile` as a context manager yielding the open file."""
    with AtomicFile(path, mode, **kwargs) as f:
        yield f.file


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_write`."""
    with atomic_write(path) as f:
        f.write(text)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that takes a file name
    (``savefig``); renamed to ``path`` on a clean exit, removed otherwise. The
    temporary name keeps ``path``'s suffix, from which such writers pick a format."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (True where that cannot be told
    without harm: off POSIX, ``os.kill`` would end the process)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # there, but not ours to signal
        return True
    return True


# The temporary names of AtomicFile (.NAME.PID.tmp) and atomic_path (.STEM.PID.tmpSUFFIX).
_TMP_NAME = re.compile(r"^\..+\.(\d+)\.tmp(\.[^.]+)?$")


def remove_stale_tmp(folder: str | Path) -> list[Path]:
    """Remove from ``folder`` the temporary files of :func:`atomic_write` and
    :func:`atomic_path` whose writer is no longer running (a process killed
    outright runs no clean-up); returns them. Those of live processes, this
    one's included, stay."""
    gone: list[Path] = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:  # no folder yet: nothing left in it
        return gone
    for p in sorted(entries):
        m = _TMP_NAME.match(p.name)
        if m is None or not p.is_file():
            continue
        pid = int(m.group(1))
        if pid != os.getpid() and not pid_alive(pid):
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone
