"""Link faults as the flow-level network sees them: which directed links are
down (they carry nothing) or degraded (a factor on their capacity), the
capacity that leaves each, and where a flow goes instead of a failed link.

:class:`~twin.net.flows.Network` holds one :class:`LinkFaults`; its
``fail_link``, ``recover_link`` and ``scale_link`` change it and re-share the
flows the change touches. A flow on a failed link moves to the path
:attr:`LinkFaults.reroute` gives (set by whoever knows the topology), or waits
at rate 0 for the repair. A degradation multiplies the link's capacity as
built (``usable_bytes_s``); restoring it (factor 1) never heals a failure, nor
a repair a degradation."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from twin.net.transfer import LinkLike, _Key, _LinkState

# (first vertex, last vertex, failed links) -> another path that avoids them, or None
Rerouter = Callable[[str, str, frozenset], tuple[LinkLike, ...] | None]


class LinkFaults:
    """The links down and degraded now (``down``: (src, dst) keys;
    ``factors``: (src, dst) -> factor, only those not 1) and the ``reroute``
    hook (None: a flow on a failed link waits)."""

    __slots__ = ("down", "factors", "reroute")

    def __init__(self) -> None:
        self.factors: dict[_Key, float] = {}  # degraded links: (src, dst) -> factor
        self.down: set[_Key] = set()  # failed links: they carry nothing
        self.reroute: Rerouter | None = None

    def usable(self, s: _LinkState) -> float:
        """Bytes/s link ``s`` carries now: 0 when down, else its capacity as
        built times its degradation factor."""
        key = (s.src, s.dst)
        if key in self.down:
            return 0.0
        f = self.factors.get(key, 1.0)
        return s.base if f == 1.0 else s.base * f

    def rerouted(self, path: tuple[LinkLike, ...]) -> tuple[LinkLike, ...]:
        """``path``, or another that avoids the failed links when it crosses one
        and there is one (else it waits on ``path`` for the repair)."""
        if not self.down or self.reroute is None:
            return path
        keys = [(ln.src, ln.dst) for ln in path]
        if not any(k in self.down for k in keys):
            return path
        hops = [ln for ln in path if getattr(ln, "hop", True)]
        new = self.reroute(hops[0].src, hops[-1].dst, frozenset(self.down))
        return path if new is None else new

    def blocks(self, keys: Iterable[_Key]) -> bool:
        """Whether a link of ``keys`` is down."""
        return any(k in self.down for k in keys)
