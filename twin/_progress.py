"""Progress of the commands that take a while, on stderr.

:class:`Progress` counts completed units (runs, probes, candidates, fits) and,
when its stream is a terminal, draws a tqdm bar with the count, the elapsed
time and an estimate of the time left. When the stream is not a terminal
(a pipe, a file, a notebook) or ``quiet`` is set it prints nothing and tqdm
is never imported, so it costs nothing. It writes only to its stream (stderr
by default), never to stdout, and changes no output file::

    with Progress(len(jobs), "runs") as bar:
        for i, result in executor.run(jobs):
            ...
            bar.update()
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import IO, Any

__all__ = ["Progress"]


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # a closed or detached stream
        return False


class Progress:
    """A bar of ``total`` units named ``unit`` (``None``: a count without a
    total), ``initial`` of them done already (a resumed sweep's), on
    ``stream`` (default ``sys.stderr``) when it is a terminal, not ``quiet``
    and there is something to count (``total`` not 0); ``desc`` heads the line."""

    def __init__(
        self,
        total: int | None,
        unit: str,
        *,
        desc: str = "",
        initial: int = 0,
        quiet: bool = False,
        stream: IO[str] | None = None,
    ) -> None:
        stream = sys.stderr if stream is None else stream
        self.done = initial
        self._bar: Any = None
        if quiet or total == 0 or not _is_terminal(stream):
            return
        from tqdm import tqdm

        self._bar = tqdm(
            total=total,
            initial=initial,
            unit=f" {unit}",
            desc=desc or None,
            file=stream,
            leave=True,
            # ETA from the recent pace; units of one command differ in length
            smoothing=0.3,
        )

    @property
    def shown(self) -> bool:
        """Whether a bar is drawn."""
        return self._bar is not None

    def update(self, n: int = 1) -> None:
        """``n`` more units done."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def note(self, text: str) -> None:
        """Show ``text`` after the counts (e.g. ``12 runs`` of a search)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
