"""The health of a cluster's parts under overlapping faults (DESIGN.md, Faults).

Each part (an instance, a node, a GPU, a NIC, a directed link) has a state of
its own, which only the events aimed at it change: ``fail`` / ``recover`` set
and clear its down flag, ``degrade`` sets its degradation (the share of speed
or bandwidth left; a later ``degrade`` of the same part replaces it) and
``restore`` clears it. What a part can do is derived from its own state and
the states of the parts it depends on: it is up only when it and all of them
are up, and its speed is the product of the degradations in force. So a
repair of one part never heals another: recovering a node leaves its failed
GPU failed, restoring a NIC leaves a link's own degradation in force.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

Part = tuple[str, int | str]  # ("node", 0), ("gpu", 3), ("nic", "n0.nic1"), ...


class Health:
    """The parts' own states; :meth:`up` and :meth:`factor` derive a
    component's from the parts it is made of and depends on."""

    def __init__(self) -> None:
        self.down: set[Part] = set()
        self.degraded: dict[Part, float] = {}

    def apply(self, action: str, part: Part, factor: float = 1.0) -> None:
        """``action`` (fail | recover | degrade | restore) to ``part``'s own state."""
        if action == "fail":
            self.down.add(part)
        elif action == "recover":
            self.down.discard(part)
        elif action == "degrade":
            self.degraded[part] = factor
        elif action == "restore":
            self.degraded.pop(part, None)
        else:
            raise ValueError(f"unknown action {action!r}")

    def up(self, parts: Iterable[Part]) -> bool:
        """Whether every one of ``parts`` is up (of its own)."""
        return not any(p in self.down for p in parts)

    def factor(self, parts: Iterable[Part]) -> float:
        """The product of the degradations in force on ``parts``."""
        return math.prod(self.degraded.get(p, 1.0) for p in parts)
