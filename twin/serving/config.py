"""The batching and memory policy of one serving instance (the spec's ``engine:``)."""

from __future__ import annotations

from dataclasses import dataclass

from twin._check import is_int
from twin._declare import (
    BOOL,
    FRACTION,
    POSITIVE_INT,
    anything,
    choice,
    declared,
    interval,
    nbytes,
)
from twin.errors import SpecError
from twin.serving.queuepolicy import DEFAULT as DEFAULT_QUEUE_POLICY
from twin.serving.queuepolicy import SCHEMA as QUEUE_POLICY_SCHEMA
from twin.serving.queuepolicy import QueuePolicyChoice, parse_choice
from twin.serving.speculative import SCHEMA as SPECULATIVE_SCHEMA
from twin.serving.speculative import SpeculativeConfig
from twin.serving.speculative import parse as parse_speculative
from twin.workload.sessions import RETENTION_SCHEMA, Retention

# A request no instance can ever hold: stop the run, or reject it; ``truncate``
# also shortens a request longer than the context instead of rejecting it.
OVERSIZED = ("error", "reject", "truncate")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Batching and memory policy of one instance (the spec's ``engine:``).

    ``max_batched_tokens`` caps the prefill tokens of one iteration (without
    chunking a single longer prompt still runs, alone) or, with
    ``chunked_prefill``, all tokens of one iteration (decodes count one each).
    ``watermark`` is the share of blocks kept back from new admissions.
    ``prefix_caching`` keeps finished prompts' KV for reuse by later requests
    with the same leading prefix hashes (see :class:`~twin.serving.kvcache.PrefixCache`).
    ``fast_forward`` lets the engine cover a stretch of decode steps in which
    nothing can change with one event (see :mod:`twin.serving.fastforward`); the results are
    those of stepping. The memory terms size the KV cache
    (:func:`~twin.serving.kvcache.kv_capacity_blocks`); ``oversized`` says what
    becomes of a request that can never fit. ``max_model_len`` (tokens, prompt
    plus output) lowers the model's context (``None``: the model's own); a
    longer request is rejected (``context_length``, as vLLM refuses it), or
    with ``oversized: truncate`` served truncated (:func:`twin.sim.simulation.truncate`).

    Each field is declared once, with its YAML key, default and help; the
    spec reader, the JSON Schema and the README check all read it from here.
    """

    block_size: int = declared(16, POSITIVE_INT, "tokens per KV block")
    max_num_seqs: int = declared(
        256, POSITIVE_INT, "running sequences per instance (per micro-batch lane with pp > 1)"
    )
    max_batched_tokens: int = declared(
        8192, POSITIVE_INT, "prefill tokens per iteration (2048 with chunked_prefill)",
        nullable=True,
    )  # fmt: skip
    chunked_prefill: bool = declared(
        False, BOOL, "decodes first, prompt chunks fill the token budget"
    )
    watermark: float = declared(
        0.01, interval(0, 1, hi_open=True), "share of KV blocks kept back from new admissions"
    )
    gpu_memory_utilization: float = declared(
        0.9, FRACTION, "share of each GPU's memory the instance may use"
    )
    activation_reserve_bytes: float = declared(
        "2 GiB", nbytes(), "per GPU, besides weights and KV", key="activation_reserve"
    )
    oversized: str = declared(
        "error", choice(*OVERSIZED),
        "a request that can never fit: error | reject | truncate (see max_model_len)",
    )  # fmt: skip
    fast_forward: bool = declared(
        True, BOOL,
        "cover quiet decode stretches with one event (same results); a speculative instance steps",
    )  # fmt: skip
    prefix_caching: bool = declared(
        False, BOOL, "keep prompts' KV for requests with the same leading prefix hashes"
    )
    max_model_len: int | None = declared(
        None, POSITIVE_INT, "longest prompt + output in tokens (null: the model's context)",
        nullable=True,
    )  # fmt: skip
    queue_policy: QueuePolicyChoice = declared(
        DEFAULT_QUEUE_POLICY, anything(QUEUE_POLICY_SCHEMA, parse_choice),
        "the order prompts are admitted in: fcfs | priority | shortest-prompt-first, "
        "or {name, ...parameters} (twin.serving.queuepolicy)",
        keep=True,
    )  # fmt: skip

    speculative: SpeculativeConfig | None = declared(
        None, anything(SPECULATIVE_SCHEMA, parse_speculative),
        "speculative decoding: {method: draft|eagle|mtp|ngram, k, acceptance: a number, "
        "a list per position or a measured figure's name, draft} (twin.serving.speculative)",
        nullable=True, keep=True,
    )  # fmt: skip
    session_retention: Retention = declared(
        {"policy": "keep"}, anything(RETENTION_SCHEMA, Retention.from_mapping),
        "a session's KV between its turns: {policy: keep | drop | ttl | offload, ttl} "
        "(twin.workload.sessions.Retention)",
        keep=True,
    )  # fmt: skip

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_batched_tokens"):
            v = getattr(self, name)
            if not is_int(v) or v <= 0:
                raise SpecError(f"engine.{name}: {v!r} must be a positive integer")
        if not 0.0 <= self.watermark < 1.0:
            raise SpecError(f"engine.watermark: {self.watermark!r} must be in [0, 1)")
