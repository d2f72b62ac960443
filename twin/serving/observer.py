"""What happens in a run, reported as it happens.

The engines, the network and the simulation's control loop report through one
:class:`Observer`; the metrics, the Chrome trace and the event log subscribe to
it, and so can a user's own code (``Simulation(spec, observers=[...])``). An
observer only listens: it never changes what happens.

Reports come in simulated time (``now``, seconds) and name instances by id and
requests by :class:`~twin.request.Request` (or by the
:class:`~twin.serving.sequence.Sequence` that served them). Per-iteration
reports (:meth:`Observer.iteration_started`, :meth:`Observer.iteration_ended`)
go only to observers that set ``wants_iterations``; an engine with such an
observer steps every decode iteration instead of fast-forwarding over quiet
stretches (the results are the same, the run slower).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # names for annotations only: the topology pulls in networkx
    from twin.net.flows import Transfer
    from twin.net.topology import Topology
    from twin.perf.iteration import Batch
    from twin.request import Request
    from twin.scheduler import FaultEvent
    from twin.serving.sequence import Sequence as Seq

__all__ = ["Broadcast", "InstanceInfo", "Observer", "Outcome", "broadcast"]

Outcome = Literal["completed", "rejected", "failed"]


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """One serving instance as the run starts: its id, role after the policy's
    setup, node and GPUs (indices into the topology's GPU list)."""

    id: int
    role: str
    node: int
    gpus: tuple[int, ...]


class Observer:
    """Listens to a run. Every report does nothing here; override the ones you need."""

    wants_iterations: bool = False

    # -- the run -------------------------------------------------------------------------
    def run_started(
        self, name: str, instances: Sequence[InstanceInfo], topology: Topology | None
    ) -> None:
        """The cluster is built and the policy has set it up; nothing has arrived."""

    # -- requests ------------------------------------------------------------------------
    def request_arrived(self, now: float, req: Request) -> None:
        """``req`` arrived at the router."""

    def request_ended(
        self, now: float, instance: int, req: Request, seq: Seq | None, outcome: Outcome,
        reason: str,
    ) -> None:  # fmt: skip
        """``req`` ended, once and for good: ``completed`` on ``instance`` (``seq``
        holds its timestamps), or ``rejected``/``failed`` with a ``reason``
        (``instance`` -1 and ``seq`` None when the router rejected it)."""

    # -- engines -------------------------------------------------------------------------
    def request_queued(self, now: float, instance: int, req: Request) -> None:
        """``req`` joined ``instance``'s queue of prompts to compute (routed
        there, retried, or its prefix loaded from a KV pool)."""

    def iteration_started(
        self, now: float, instance: int, dt: float, prefill_ids: tuple[int, ...], batch: Batch
    ) -> None:
        """An iteration of ``dt`` seconds starts on ``instance``: prompt chunks of
        the requests ``prefill_ids`` and ``batch.decode_count`` decode sequences
        (only to observers with ``wants_iterations``)."""

    def iteration_ended(self, now: float, instance: int) -> None:
        """The iteration in progress on ``instance`` ended (``wants_iterations`` only)."""

    def preempted(self, now: float, instance: int, req: Request) -> None:
        """``req`` lost its KV blocks on ``instance`` and waits to be recomputed."""

    def prefilled(self, now: float, instance: int, req: Request) -> None:
        """``req``'s prompt is done on prefill ``instance``; its KV waits to move."""

    def kv_landed(self, now: float, src: int, dst: int, req: Request) -> None:
        """``req``'s KV has moved from ``src`` to ``dst``: ``src`` freed the blocks
        it held, and ``req`` decodes on ``dst`` from its next iteration."""

    # -- the network ---------------------------------------------------------------------
    def transfer_started(self, now: float, transfer: Transfer) -> None:
        """A transfer (KV hand-off ``kv <id>``, pool fetch ``fetch <id>``) starts."""

    def transfer_ended(self, now: float, transfer: Transfer) -> None:
        """Its last byte has arrived."""

    # -- the control loop ----------------------------------------------------------------
    def role_changed(self, now: float, instance: int, old: str, new: str) -> None:
        """``instance`` moved from role ``old`` to ``new`` (its start-up cost paid)."""

    def instance_up(self, now: float, instance: int, info: InstanceInfo | None = None) -> None:
        """``instance`` serves again (repaired, or started: then ``info`` describes
        it). Every instance of :meth:`run_started` is up from the start."""

    def instance_down(self, now: float, instance: int) -> None:
        """``instance`` stopped serving (failed, or released): it lost what it held
        and serves nothing until it is up again."""

    # -- failures and degradation --------------------------------------------------------
    def fault_event(self, now: float, event: FaultEvent) -> None:
        """A failure, repair, degradation or restoration (an ``events:`` entry,
        or a random failure or its repair) took effect; the instances it took
        down or brought up were reported first."""


class Broadcast(Observer):
    """Hands every report to each of ``observers``, in their order."""

    def __init__(self, observers: Iterable[Observer]) -> None:
        self.observers = tuple(observers)
        self.wants_iterations = any(o.wants_iterations for o in self.observers)
        self._iter = tuple(o for o in self.observers if o.wants_iterations)

    def run_started(
        self, name: str, instances: Sequence[InstanceInfo], topology: Topology | None
    ) -> None:
        for o in self.observers:
            o.run_started(name, instances, topology)

    def request_arrived(self, now: float, req: Request) -> None:
        for o in self.observers:
            o.request_arrived(now, req)

    def request_ended(
        self, now: float, instance: int, req: Request, seq: Seq | None, outcome: Outcome,
        reason: str,
    ) -> None:  # fmt: skip
        for o in self.observers:
            o.request_ended(now, instance, req, seq, outcome, reason)

    def request_queued(self, now: float, instance: int, req: Request) -> None:
        for o in self.observers:
            o.request_queued(now, instance, req)

    def iteration_started(
        self, now: float, instance: int, dt: float, prefill_ids: tuple[int, ...], batch: Batch
    ) -> None:
        for o in self._iter:
            o.iteration_started(now, instance, dt, prefill_ids, batch)

    def iteration_ended(self, now: float, instance: int) -> None:
        for o in self._iter:
            o.iteration_ended(now, instance)

    def preempted(self, now: float, instance: int, req: Request) -> None:
        for o in self.observers:
            o.preempted(now, instance, req)

    def prefilled(self, now: float, instance: int, req: Request) -> None:
        for o in self.observers:
            o.prefilled(now, instance, req)

    def kv_landed(self, now: float, src: int, dst: int, req: Request) -> None:
        for o in self.observers:
            o.kv_landed(now, src, dst, req)

    def transfer_started(self, now: float, transfer: Transfer) -> None:
        for o in self.observers:
            o.transfer_started(now, transfer)

    def transfer_ended(self, now: float, transfer: Transfer) -> None:
        for o in self.observers:
            o.transfer_ended(now, transfer)

    def role_changed(self, now: float, instance: int, old: str, new: str) -> None:
        for o in self.observers:
            o.role_changed(now, instance, old, new)

    def instance_up(self, now: float, instance: int, info: InstanceInfo | None = None) -> None:
        for o in self.observers:
            o.instance_up(now, instance, info)

    def instance_down(self, now: float, instance: int) -> None:
        for o in self.observers:
            o.instance_down(now, instance)

    def fault_event(self, now: float, event: FaultEvent) -> None:
        for o in self.observers:
            o.fault_event(now, event)


def broadcast(observers: Iterable[Observer]) -> Observer:
    """One observer for several: the only one itself, else a :class:`Broadcast`."""
    obs = tuple(observers)
    return obs[0] if len(obs) == 1 else Broadcast(obs)
