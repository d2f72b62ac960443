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
    """

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_hashes: tuple[int, ...] = ()
    prefix_block_tokens: int = 0
    priority: int = 0
    traffic_class: str = ""
