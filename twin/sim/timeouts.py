"""Client time-outs (``workload.timeout``): a client that gives up on its request.

A load generator waits a bounded time for each request; past it, it closes the
connection and records the request as failed (inference-perf: aiohttp's total
time-out, 300 s by default, ``shared/data/realruns/PROVENANCE.md``), and the
server aborts the request, freeing its KV. :class:`ClientTimeouts` gives every
request one event at ``arrival + timeout``. If the request has not ended by then,
its current attempt stops wherever it is (waiting for an instance, waiting to be
retried, loading its prefix, queued, prefilling, its KV moving, decoding): its
work stops and its KV blocks are freed at that instant, and it ends failed with
reason ``timeout``. A request that ended before its time-out is left alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twin._clock import at
from twin.serving.abandon import abandon
from twin.serving.observer import Observer
from twin.serving.sequence import DECODE, DONE, HANDOFF, INCOMING, LOST, PREFILL, WAITING

if TYPE_CHECKING:
    from twin.request import Request
    from twin.serving.sequence import Sequence
    from twin.sim.ops import ClusterOps

TIMEOUT = "timeout"  # the failure reason


class ClientTimeouts(Observer):
    """The time-outs of one run, carried out on its cluster (``ops``).
    :meth:`follow` is told of each attempt of a request as it is made (the first
    names its time-out); as an observer, it forgets a request once it ended."""

    def __init__(self, ops: ClusterOps, timeout_s: float) -> None:
        self.ops = ops
        self.timeout_s = timeout_s
        self.current: dict[int, Sequence] = {}  # request id -> its latest attempt

    def follow(self, seq: Sequence) -> None:
        """``seq`` is its request's attempt from now (its first: its time-out is set)."""
        rid = seq.req.id
        if rid not in self.current:
            when = seq.req.arrival_s + self.timeout_s
            at(self.ops.env, when, lambda _ev: self._expire(rid))
        self.current[rid] = seq

    def request_ended(
        self, now: float, instance: int, req: Request, seq: Any, outcome: Any, reason: str
    ) -> None:
        self.current.pop(req.id, None)

    def _expire(self, rid: int) -> None:
        seq = self.current.pop(rid, None)
        if seq is None or seq.state == DONE:
            return  # it ended before its time-out
        ops = self.ops
        instance = self._stop(seq)
        if instance is None:
            return  # it had finished by now (a stretch under way applied its last step)
        seq.lost_tokens += ops.kv_tokens(seq)
        if instance >= 0:  # the time its attempt ran on an instance is lost
            seq.lost_s += ops.env.now - seq.t_attempt
        seq.state = LOST  # a load or a retry that lands later finds it so
        seq.epoch += 1
        ops.end_failed(seq, instance, TIMEOUT)

    def _stop(self, seq: Sequence) -> int | None:
        """Stop ``seq``'s work where it is and free what it holds; the instance
        that held it (-1: none), or None when it had finished by now."""
        ops = self.ops
        if ops.unpark(seq):
            return -1
        state = seq.state
        instance = -1
        if state == HANDOFF:
            instance = seq.prefill_instance
        elif state in (PREFILL, DECODE, INCOMING) or (state == WAITING and seq.instance >= 0):
            instance = seq.instance
        # else: waiting to be retried, or loading its prefix (a tier, a KV pool)
        if instance >= 0:
            engine = ops.engines[instance]
            if engine.up and not abandon(engine, seq):
                return None
        ops.drop_handoff(seq)  # its transfer stops; a decode side's reservation is freed
        return instance
