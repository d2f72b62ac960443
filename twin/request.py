"""The request: what a workload produces and every other part reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request as it arrives at the cluster.

    ``arrival_s`` is seconds from the start of the run. ``prefix_hashes`` are
    the hashes of the prompt's leading blocks (Mooncake's ``hash_ids``), used by
    prefix-aware policies; empty when the trace has none. ``prefix_block_tokens``
    is the number of prompt tokens each hash covers (512 in the Mooncake trace).
    ``priority`` orders it under the ``priority`` queue policy (lower first,
    as vLLM's priority scheduling; 0 unless the workload gives one).
    ``traffic_class`` names its class of traffic (``workload.classes``; empty
    without classes): its SLO, and its priority, which is the class's.
    ``session`` places it in a session of turns (:mod:`twin.workload.sessions`):
    None for a request on its own. ``model`` names the model it asks for on
    a cluster of several (``models:``; empty on a cluster of one).
    """

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_hashes: tuple[int, ...] = ()
    prefix_block_tokens: int = 0
    priority: int = 0
    traffic_class: str = ""
    session: Session | None = None
    model: str = ""


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of a session: its prompt and answer tokens, and the think
    time before the next turn is sent (unused on the last)."""

    prompt_tokens: int
    output_tokens: int
    think_s: float


@dataclass(frozen=True, slots=True)
class Session:
    """What a request of a session carries: the session's index, its turn
    ``turn`` of ``turns``, and the request id of turn 0 (turn ``t`` is
    ``first_id + t``)."""

    index: int
    turn: int
    first_id: int
    turns: tuple[Turn, ...]

    @property
    def last(self) -> bool:
        return self.turn == len(self.turns) - 1

    def next(self) -> Session:
        return Session(self.index, self.turn + 1, self.first_id, self.turns)
