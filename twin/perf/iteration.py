"""Iteration-time models: how long one forward pass of a batch takes.

One interface, :class:`PerfModel`: ``iteration_time(batch) -> seconds`` for
the set of prefill chunks and decode sequences that run together in one
forward pass on one instance (with its tensor/pipeline parallelism fixed at
construction). The implementations: :mod:`twin.perf.roofline` and the measured
tables of :mod:`twin.perf.tables`; :mod:`twin.perf.build` makes one from a spec.

An instance with pipeline parallelism (:class:`Pipelined`) also says how long
a batch holds each stage, so that an engine can keep up to ``pp`` micro-batches
in flight: ``iteration_time`` is then a batch's latency through all stages.

A stretch of decode-only steps of one batch (the same sequences, each one token
longer per step) is priced in one call, :func:`decode_steps`: a model with a
``decode_steps(count, context_sum, n)`` method gives the ``n`` step times at
once (closed form per step, vectorised for long stretches), bit-identical to
calling ``iteration_time`` step by step; any other model is called step by step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# Stretches of at least this many decode steps are priced with numpy: below it
# the fixed cost of some twenty array operations is more than a plain loop.
VECTOR_STEPS = 80


@dataclass(frozen=True, slots=True)
class Batch:
    """What runs in one iteration.

    ``prefill`` holds one ``(new_tokens, cached_tokens)`` pair per prefill
    chunk: the tokens computed in this pass and the tokens of the same
    sequence already in the KV cache (earlier chunks, or a prefix-cache hit).
    Decode sequences are summarized by their count and the sum of their
    context lengths (tokens whose KV each one reads), which is all a model
    needs and keeps the engine's per-iteration work O(1) in the batch size.
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode_count: int = 0
    decode_context_sum: int = 0

    @property
    def prefill_tokens(self) -> int:
        return sum(n for n, _ in self.prefill)

    @property
    def is_empty(self) -> bool:
        return not self.prefill and self.decode_count == 0


class PerfModel(Protocol):
    """Anything that prices an iteration. ``sha256`` names the data it was built
    from (a profile table), or is ``None`` for an analytical model."""

    name: str
    sha256: str | None

    def iteration_time(self, batch: Batch) -> float: ...


@runtime_checkable
class Pipelined(Protocol):
    """A perf model of an instance whose layers are split into ``pp`` pipeline stages.

    ``stage_times(batch) -> (first, later)``: the seconds ``batch`` holds the
    first stage and each later stage (a later stage's time includes receiving
    the activations from the one before). ``iteration_time`` equals
    ``first + (pp - 1) x later``, the batch's latency through the pipeline;
    the next micro-batch may enter the first stage once ``first`` has passed.
    """

    pp: int

    def stage_times(self, batch: Batch) -> tuple[float, float]: ...


def pipeline_stages(perf: PerfModel) -> int:
    """The pipeline stages an engine may overlap micro-batches across: ``perf.pp``
    for a :class:`Pipelined` model, else 1."""
    return int(perf.pp) if isinstance(perf, Pipelined) else 1


DecodeSteps = Callable[[int, int, int], list[float]]


def decode_steps(perf: PerfModel) -> DecodeSteps:
    """``f(count, context_sum, n)``: the seconds of ``n`` successive decode-only
    iterations of ``count`` sequences whose contexts sum to ``context_sum`` in the
    first and grow by ``count`` per iteration, equal to the last bit to
    ``perf.iteration_time(Batch((), count, context_sum + k * count))`` for
    ``k = 0 .. n-1``. The model's own ``decode_steps`` where it has one."""
    own = getattr(perf, "decode_steps", None)
    if own is not None:
        return own  # type: ignore[no-any-return]
    timed = perf.iteration_time

    def stepped(count: int, context_sum: int, n: int) -> list[float]:
        return [timed(Batch((), count, context_sum + k * count)) for k in range(n)]

    return stepped


StageSteps = Callable[[int, int, int], tuple[list[float], list[float]]]


def stage_steps(perf: PerfModel) -> StageSteps:
    """``f(count, context_sum, n)`` for a :class:`Pipelined` model: the stage
    times (first, later) of ``n`` successive decode-only micro-batches of
    ``count`` sequences whose contexts sum to ``context_sum`` in the first and
    grow by ``count`` per micro-batch, as two lists, equal to the last bit to
    ``perf.stage_times(Batch((), count, context_sum + k * count))`` for
    ``k = 0 .. n-1``. The model's own ``stage_steps`` where it has one."""
    own = getattr(perf, "stage_steps", None)
    if own is not None:
        return own  # type: ignore[no-any-return]
    assert isinstance(perf, Pipelined)
    timed = perf.stage_times

    def stepped(count: int, context_sum: int, n: int) -> tuple[list[float], list[float]]:
        pairs = [timed(Batch((), count, context_sum + k * count)) for k in range(n)]
        return [a for a, _ in pairs], [b for _, b in pairs]

    return stepped
