"""The shell examples of README.md and the documentation pages as a reader
would paste them: every command line that starts with ``twin `` in a fenced
block, with what the block shows after it (tests/test_readme_commands.py runs
them).

A block either prompts (``$ twin ...``, then the output the README shows) or
lists bare commands (``twin ...`` lines). A prompted command may continue on
lines ending in a backslash. ``$ cat FILE`` followed by text is a file the
reader is shown, and has, before the next command runs."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SHELL = ("", "bash", "sh", "shell", "console")


@dataclass(frozen=True)
class Example:
    """One ``twin`` command of the README: the line it starts on, the command
    as written, the output shown after it, and the files ``$ cat`` showed
    before it in its block."""

    line: int
    command: str
    shown: str
    files: tuple[tuple[str, str], ...] = ()
    page: str = "README.md"

    @property
    def error(self) -> str | None:
        """The ``twin: error:`` line the README shows for it, if it shows one."""
        for ln in self.shown.splitlines():
            if ln.startswith("twin: error: "):
                return ln
        return None


def examples(readme: Path, page: str = "README.md") -> list[Example]:
    """The examples of one page (``page``: its name in test ids)."""
    text = readme.read_text(encoding="utf-8")
    out: list[Example] = []
    for m in _FENCE.finditer(text):
        if m.group(1) not in SHELL:
            continue
        first = text.count("\n", 0, m.start(2)) + 1
        lines = m.group(2).splitlines()
        if any(ln.startswith("$ ") for ln in lines):
            out += [replace(e, page=page) for e in _prompted(lines, first)]
        else:
            out += [Example(first + i, ln.strip(), "", page=page) for i, ln in enumerate(lines)
                    if ln.startswith("twin ")]  # fmt: skip
    return out


def _prompted(lines: list[str], first: int) -> list[Example]:
    """The commands of a block of ``$ `` prompts, each with its output."""
    out: list[Example] = []
    files: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        start, cmd = i, lines[i][2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd[:-1] + " " + lines[i].strip()
        i += 1
        shown = []
        while i < len(lines) and not lines[i].startswith("$ "):
            shown.append(lines[i])
            i += 1
        if cmd.startswith("cat ") and shown:
            files.append((cmd[4:].strip(), "\n".join(shown) + "\n"))
        elif cmd.startswith("twin "):
            out.append(Example(first + start, cmd, "\n".join(shown),
                               tuple(files)))  # fmt: skip
    return out
