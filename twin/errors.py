"""The one exception hierarchy of pd-twin.

Every error a user can cause (a bad spec, an unknown name, a malformed trace,
a request that cannot fit) is a :class:`TwinError`. The CLI prints its message
on one line and exits with status 2; anything else is a bug in pd-twin.

Messages name the file, the entry and the offending value, and list what was
expected, e.g. ``spec.yaml: slo.ttft: '1 parsec' is not a duration; expected
a number with one of s, ms, us, ns, min, h``.
"""

from __future__ import annotations

from collections.abc import Iterable
from difflib import get_close_matches


class TwinError(Exception):
    """Base class of every error caused by user input or configuration."""


class SpecError(TwinError):
    """An experiment spec, a topology or another YAML input is invalid."""


class UnitError(SpecError):
    """A quantity with a unit (``"400 Gbps"``, ``"2 ms"``) could not be parsed."""


class TraceError(TwinError):
    """A workload trace is malformed: bad columns, negative or decreasing times."""


class ProfileError(TwinError):
    """A performance profile is malformed or does not cover a requested point."""


class CapacityError(TwinError):
    """A model, a batch or a request cannot fit in the memory it is given."""


class UnknownNameError(TwinError, KeyError):
    """A lookup in a catalog or registry missed; the message suggests close names
    and, given ``where``, starts with where the name came from."""

    def __init__(
        self, kind: str, name: str, known: Iterable[str], where: str = "", close_to: str = ""
    ) -> None:
        known = sorted(known)
        close = get_close_matches(close_to or name, known, n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        msg = f"unknown {kind} {name!r}.{hint} Known: {', '.join(known) or '(none)'}"
        super().__init__(f"{where}: {msg}" if where else msg)
        self.kind = kind
        self.name = name
        self.known = known

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return str(self.args[0])


class UnknownSchedulerError(UnknownNameError):
    """No scheduler is registered under the requested name."""

    def __init__(self, name: str, known: Iterable[str], where: str = "") -> None:
        super().__init__("scheduler", name, known, where)


class DuplicateRegistrationError(TwinError):
    """Two plugins tried to register under the same name."""


class PluginError(TwinError):
    """A third-party plugin (an entry point) could not be loaded."""
