"""What an instance's prompt queue costs: the iterations its waiting prompts
take, priced as the engine batches them, for a router's ``estimate_queue_s``.

:func:`queue_iterations_s` prices a list of prompts from scratch.
:class:`QueueCost` keeps the pricing of one engine's queue between calls:
requests join a first-come queue at its back, so a call after arrivals only packs and
prices the new prompts (and the last, still open, iteration they join); any
other change to what the pricing read (an iteration taking or finishing
prompt work, a preemption, a dropped request, a failure, the prefix cache,
the decodes riding along with chunked prefill, the batching limits) starts
it over. Every call gives the same figure, to the bit, as pricing the queue
from scratch would; a burst of ``n`` arrivals costs ``O(n)`` iteration
prices, not ``O(n x queue)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from twin.perf.iteration import Batch, PerfModel
from twin.serving.queuepolicy import PolicyQueue

if TYPE_CHECKING:
    from twin.serving.engine import Engine

QUEUE_HORIZON_ITERATIONS = 256
"""How many iterations' worth of queued tokens an instance view's queue
estimate batches and prices one by one; the rest it prices at their rate."""


def queue_iterations_s(
    perf: PerfModel,
    work: Sequence[tuple[int, int]],
    max_batched_tokens: int,
    *,
    chunked: bool = False,
    decode_count: int = 0,
    decode_context_sum: int = 0,
) -> list[float]:
    """The time of each iteration that computes ``work``, one ``(new tokens,
    cached tokens)`` pair per prompt in first-come order, batched as
    :class:`~twin.serving.engine.Engine` batches prefills: without chunking,
    whole prompts while they fit in ``max_batched_tokens`` (a longer one runs
    alone); with ``chunked``, a budget of ``max_batched_tokens`` less the
    ``decode_count`` running decodes, which ride along in every iteration.

    NOTE: KV blocks and ``max_num_seqs`` are taken to admit every prompt as
    its turn comes, and the decodes to stay as they are; a queue held back by
    a full KV cache takes longer than this.
    """
    packer = _Packer(perf, max_batched_tokens, chunked, decode_count, decode_context_sum)
    for need, cached in work:
        packer.add(need, cached)
    return packer.times()


class _Packer:
    """Prompts packed into iterations one at a time, first come first: the
    iterations closed so far (their times, and their sum from the left with
    the first one's halved when ``half_first``) and the last one, still open
    to the next prompt."""

    __slots__ = ("perf", "batched", "chunked", "decodes", "context_sum", "half_first",
                 "closed", "closed_sum", "chunks", "budget", "open_s")  # fmt: skip

    def __init__(
        self,
        perf: PerfModel,
        max_batched_tokens: int,
        chunked: bool,
        decode_count: int,
        decode_context_sum: int,
        half_first: bool = False,
    ) -> None:
        self.perf = perf
        self.chunked = chunked
        self.decodes = decode_count if chunked else 0
        self.context_sum = decode_context_sum if self.decodes else 0
        self.batched = max(max_batched_tokens - self.decodes, 1)  # each iteration's budget
        self.half_first = half_first
        self.closed: list[float] = []
        self.closed_sum = 0.0
        self.chunks: list[tuple[int, int]] = []  # the open iteration's prompt chunks
        self.budget = self.batched
        self.open_s: float | None = None  # the open iteration's time, once priced

    def _price(self, chunks: list[tuple[int, int]]) -> float:
        return self.perf.iteration_time(Batch(tuple(chunks), self.decodes, self.context_sum))

    def _close(self) -> None:
        t = self._price(self.chunks)
        self.closed.append(t)
        self.closed_sum += t / 2 if self.half_first and len(self.closed) == 1 else t
        self.chunks = []
        self.budget = self.batched

    def add(self, need: int, cached: int) -> None:
        """The next prompt: ``need`` tokens to compute, ``cached`` already held."""
        self.open_s = None
        while True:
            if not self.chunked and self.chunks and need > self.budget:
                self._close()  # a whole prompt that does not fit starts the next
                continue
            take = min(need, self.budget) if self.chunked else need
            self.chunks.append((take, cached))
            self.budget -= take
            if take < need:  # the rest of this prompt leads the next iteration
                self._close()
                need, cached = need - take, cached + take
                continue
            if self.budget <= 0:
                self._close()
            return

    def times(self) -> list[float]:
        """Every iteration's time, the open one last."""
        if not self.chunks:
            return list(self.closed)
        return [*self.closed, self._price(self.chunks)]

    def total(self) -> float:
        """The iterations' times summed from the left (as ``sum(times)``), the
        first halved when ``half_first``; the open one is priced once."""
        if not self.chunks:
            return self.closed_sum
        if self.open_s is None:
            self.open_s = self._price(self.chunks)
        t = self.open_s
        return self.closed_sum + (t / 2 if self.half_first and not self.closed else t)


class QueueCost:
    """One engine's queue estimate (see the module's docstring): what it
    read, and the pricing it kept."""

    __slots__ = ("_key", "_packer", "_priced", "_new", "_raw", "_computed", "_order")

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._packer: _Packer | None = None
        self._priced = 0  # queued requests priced, from the front
        self._new = 0  # tokens to compute, of the prompts being computed and those priced
        self._raw = 0  # prompt tokens of the queued requests priced
        self._computed = 0  # ... and of them, to compute
        self._order: list[Any] | None = None  # a policy queue's order, read at a restart

    def estimate_s(self, e: Engine) -> float:
        """Seconds until ``e`` has computed the prompts now queued or being
        computed (an iteration under way counts half)."""
        if not e.waiting and not e.prefilling:
            return 0.0
        e.sync()  # the decodes riding along, as stepping would show them now
        cfg = e.config
        cache = e.cache
        decode_load = e.decode_load() if cfg.chunked_prefill else None
        key: tuple[Any, ...] = (
            e.life, e.queue_changes, id(cache), cache.changes if cache is not None else 0,
            id(e.perf), cfg.max_batched_tokens, cfg.chunked_prefill, decode_load,
            QUEUE_HORIZON_ITERATIONS,
        )  # fmt: skip
        waiting = e.waiting
        if isinstance(waiting, PolicyQueue):
            # NOTE: a queue in a policy's order may take a join anywhere, so any
            # change starts the pricing over (O(queue) per change, not per call).
            key += (waiting.changes,)
        packer = self._packer
        if key != self._key or packer is None or len(e.waiting) < self._priced:
            count, context_sum = decode_load or (0, 0)
            packer = self._packer = _Packer(
                e.perf, cfg.max_batched_tokens, cfg.chunked_prefill, count, context_sum,
                half_first=bool(e.prefilling),
            )  # fmt: skip
            self._key = key
            self._priced = self._raw = self._computed = self._new = 0
            self._order = list(waiting) if isinstance(waiting, PolicyQueue) else None
            for s in e.prefilling:
                need = s.prefill_len - s.prefilled
                packer.add(need, s.prefilled)
                self._new += need
        horizon = QUEUE_HORIZON_ITERATIONS * cfg.max_batched_tokens
        order = self._order
        n = len(waiting)
        while self._priced < n and self._new < horizon:
            # the queue only grew at its back since: negative indices reach the
            # new ones without walking a deque from its front
            s = waiting[self._priced - n] if order is None else order[self._priced]
            hit = max(e.cached_prefix_tokens(s.req), s.preloaded_tokens)
            cached = min(hit, s.prefill_len - 1)
            packer.add(s.prefill_len - cached, cached)
            self._new += s.prefill_len - cached
            self._raw += s.prefill_len
            self._computed += s.prefill_len - cached
            self._priced += 1
        total = packer.total()
        raw, new = self._raw, self._new
        tail = e.waiting_tokens - raw  # prompt tokens past the horizon
        if tail > 0 and raw > 0 and new > 0:
            # NOTE: past the horizon the queue is priced at the priced part's
            # seconds per computed token and share of tokens to compute, which
            # keeps a long queue's estimate at O(horizon) work per call.
            total += tail * (self._computed / raw) * (total / new)
        return total
