"""Reading and writing files the way every command does.

Reading: every reader of the project (CSV, JSON, JSONL, YAML) reads through
here: :func:`read_text` (a whole file), :func:`decode_text` (bytes already
read), :func:`open_text` (streamed) and :func:`read_csv` (a table). All
decode :data:`ENCODING`, UTF-8 with a leading byte-order mark dropped, and
turn an unreadable file or bytes that are not UTF-8 into one
:class:`~twin.errors.TwinError` line naming the file, the line and the byte
(:func:`not_utf8` gives that message).

Writing: :func:`atomic_write` writes to a temporary name in the target's
folder and renames it over the target only when the block ends without an
error, so a run that fails or is interrupted part-way never leaves a partial
CSV or JSON under the name of a finished one. :func:`check_outputs` finds a
bad output path (a folder, a file in a missing or unwritable folder, two
outputs naming one file, an output naming an input) before any work, and
leaves nothing behind.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from twin.errors import TwinError

ENCODING = "utf-8-sig"
"""How every file is read: UTF-8, a leading byte-order mark (which spreadsheet
programs and Windows editors write) dropped; written files carry none."""


def with_label(path: str | Path, label: str) -> Path:
    """``path`` for one entry of several runs: ``out/req.csv`` ->
    ``out/req-LABEL.csv`` (characters other than letters, digits, ``.``, ``_``
    and ``-`` in the label become ``_``)."""
    p = Path(path)
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", label)
    return p.with_name(f"{p.stem}-{safe}{p.suffix}")


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
        return data.decode(ENCODING)
    except UnicodeDecodeError:
        raise error(not_utf8(path)) from None


def decode_text(data: bytes, where: str, error: type[TwinError] = TwinError) -> str:
    """:func:`read_text` for bytes already read from ``where``."""
    try:
        return data.decode(ENCODING)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(f"{where}: line {line}: {_bad_byte(data, e.start)}") from None


@contextmanager
def open_text(
    path: str | Path, what: str = "file", error: type[TwinError] = TwinError
) -> Iterator[IO[str]]:
    """``path`` open for reading a line at a time, as :func:`read_text` reads
    it (lines end as in the file: ``newline=""``, what the csv module wants);
    ``error`` when it cannot be opened or, while read, holds bytes that are not
    UTF-8."""
    try:
        f = open(path, encoding=ENCODING, newline="")  # closed below
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror}") from None
    with f:
        try:
            yield f
        except UnicodeDecodeError:
            raise error(not_utf8(path)) from None


def read_csv(
    path: str | Path, what: str = "CSV", error: type[TwinError] = TwinError
) -> tuple[list[str], list[list[str]]]:
    """The header and the rows of a CSV file (blank lines skipped); ``error``
    naming the file and the line for an empty file, a row with more or fewer
    cells than the header, or text the csv module refuses."""
    reader = csv.reader(io.StringIO(read_text(path, what, error), newline=""))
    rows = []
    try:
        header = next(reader, None)
        if header is None:
            raise error(f"{path}: empty; expected a {what} with a header line")
        for row in reader:
            if row and len(row) != len(header):
                raise error(
                    f"{path}: line {reader.line_num}: {len(row)} cells; the header "
                    f"(line 1) has {len(header)}"
                )
            if row:
                rows.append(row)
    except csv.Error as e:
        raise error(f"{path}: line {reader.line_num}: not valid CSV ({e})") from None
    return header, rows


def _file_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot name an output file (it names a folder), or None."""
    text = str(path)
    if text.endswith(("/", os.sep)) or Path(text).name in ("", ".", ".."):
        return "names a folder; expected a file name"
    if Path(text).is_dir():
        return "is a folder; expected a file name"
    return None


def _folder_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be (or become) an output folder, or None."""
    p = Path(path)
    for up in (p, *p.parents):
        if up.is_dir():
            if not os.access(up, os.W_OK | os.X_OK):
                return f"cannot write: {str(up)!r} is not writable"
            return None
        if up.exists():
            where = "" if up == p else f"is inside {str(up)!r}, which "
            return f"{where}is a file; expected a folder"
    return None


def _same_file(a: str | Path, b: str | Path) -> bool:
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def check_outputs(
    files: Iterable[tuple[str, str | None]],
    folders: Iterable[tuple[str, str | None]] = (),
    inputs: Iterable[tuple[str, str]] = (),
) -> None:
    """Refuse, before any work, output paths that the writers would fail on
    or that would lose data: ``files`` and ``folders`` are ``(flag, path)``
    (``None`` or ``-``, stdout: skipped), ``inputs`` ``(what, path)`` of the
    files the command reads. One :class:`~twin.errors.TwinError` line names
    the flag and the path. A file output must name a file in a writable
    folder (tried by creating and removing a temporary file beside it, so a
    refused or later failing command leaves no file), differ from every other
    output and from every input; a folder output must be a folder, or be
    creatable."""
    seen: list[tuple[str, str]] = []
    for flag, path in files:
        if path is None or path == "-":
            continue
        problem = _file_problem(path)
        if problem:
            raise TwinError(f"{flag}: {path!r} {problem}")
        for other, earlier in seen:
            if _same_file(path, earlier):
                raise TwinError(f"{flag}: {path!r} is also {other}'s file; give each its own")
        for what, source in inputs:
            if _same_file(path, source):
                raise TwinError(f"{flag}: {path!r} is the input {what}; an output cannot be it")
        folder = Path(path).parent
        if not folder.is_dir():
            raise TwinError(f"{flag}: {path!r}: no folder {str(folder)!r}; create it first")
        try:
            AtomicFile(path).discard()
        except TwinError as e:
            raise TwinError(f"{flag}: {e}") from None
        seen.append((flag, path))
    for flag, path in folders:
        if path is not None:
            problem = _folder_problem(path)
            if problem:
                raise TwinError(f"{flag}: {path!r} {problem}")


class AtomicFile:
    """A file open under a temporary name beside ``path``: :meth:`close` (or a
    clean exit from ``with``) renames it to ``path``; :meth:`discard` (or an
    exception, KeyboardInterrupt too, inside ``with``) removes it. So ``path``
    holds either its previous content or the whole new one, never a part.

    Text modes default to UTF-8 and ``newline=""``. An unwritable folder is a
    :class:`~twin.errors.TwinError` naming ``path``."""

    def __init__(self, path: str | Path, mode: str = "w", **kwargs: Any) -> None:
        problem = _file_problem(path)
        if problem:
            raise TwinError(f"{path}: {problem}")
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        if "b" not in mode:
            kwargs.setdefault("encoding", "utf-8")
            kwargs.setdefault("newline", "")
        try:
            self.file: IO[Any] = open(self.tmp, mode, **kwargs)  # see close
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
    problem = _file_problem(path)
    if problem:
        raise TwinError(f"{path}: {problem}")
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
