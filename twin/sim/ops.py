"""What failures and scaling may do to a running cluster: a narrow protocol.

:mod:`twin.sim.faults`, :mod:`twin.sim.scaling` and
:mod:`twin.sim.timeouts` act through a :class:`ClusterOps` (the
:class:`~twin.sim.simulation.Simulation` is one) and import nothing of the
run itself: they read the cluster's engines and placements, fail and
restore instances and links, add an instance, end a request, and say what
happened; how a lost request is retried, a hand-off re-routed or an
observer told stays with the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import simpy

from twin.scheduler import FaultEvent
from twin.serving.cluster import Placement
from twin.serving.engine import Engine
from twin.serving.sequence import Sequence as Sequence_


class ClusterOps(Protocol):
    """The operations failures and scaling carry out on a cluster."""

    @property
    def env(self) -> simpy.Environment:
        """The run's clock and event queue."""
        ...

    @property
    def engines(self) -> Sequence[Engine]:
        """Every instance's engine, by id (added instances included)."""
        ...

    @property
    def placements(self) -> Sequence[Placement]:
        """Where each instance runs, by id."""
        ...

    # -- failures ------------------------------------------------------------------
    def fail_instance(self, i: int) -> None:
        """Instance ``i`` fails now: what it held, and what was bound to it, is
        lost (each request retried or ended failed)."""
        ...

    def recover_instance(self, i: int) -> None:
        """Instance ``i`` serves again, empty."""
        ...

    def fail_link(self, src: str, dst: str) -> None:
        """Link ``src -> dst`` carries nothing from now (its flows re-route or wait)."""
        ...

    def recover_link(self, src: str, dst: str) -> None:
        """Link ``src -> dst`` carries again."""
        ...

    def scale_link(self, src: str, dst: str, factor: float) -> None:
        """Link ``src -> dst`` carries ``factor`` x its capacity."""
        ...

    def links_failed(self) -> None:
        """Links just failed: the hand-offs they leave waiting wait at most
        until their requests' retry deadlines."""
        ...

    def lose_host_memory(self, node: int) -> None:
        """Node ``node`` failed: what its host memory held (a KV pool) is gone."""
        ...

    def fault_applied(self, event: FaultEvent) -> None:
        """``event`` took effect: observers and the policy are told."""
        ...

    def settled(self) -> bool:
        """Every request arrived has ended or waits for an instance, and no
        more arrive: random failures have nothing left to act on."""
        ...

    # -- requests ------------------------------------------------------------------
    def kv_tokens(self, seq: Sequence_) -> int:
        """Tokens whose KV ``seq`` had computed (lost when its attempt stops)."""
        ...

    def unpark(self, seq: Sequence_) -> bool:
        """Take ``seq`` out of the requests waiting for an instance to come
        back; whether it was one of them."""
        ...

    def drop_handoff(self, seq: Sequence_) -> None:
        """Stop ``seq``'s KV transfer, if any, and free what a decode side
        reserved for it."""
        ...

    def end_failed(self, seq: Sequence_, instance: int, reason: str) -> None:
        """``seq``'s request ends failed now, for ``reason``, on ``instance``
        (-1: none)."""
        ...

    # -- scaling -------------------------------------------------------------------
    def add_instance(
        self, placement: Placement, role: str, tp: int, pp: int, ep: int, dp: int, model: str = ""
    ) -> Engine:
        """A new instance at ``placement``, starting (not serving), built as the
        spec's are, in the state of the parts it runs on; ``model`` the model
        it serves on a cluster of several."""
        ...

    def instance_started(self, i: int) -> None:
        """Added instance ``i`` is done starting and serves."""
        ...

    def instance_stopped(self, i: int) -> None:
        """Instance ``i``, which was up, released its GPUs."""
        ...

    def capacity_changed(self) -> None:
        """Instances started or began draining: admission limits follow."""
        ...
