"""An instance's faults: its speed (a throttled GPU) and its failure.

A failure loses everything the instance holds (:meth:`Faults.fail`); it comes
back empty (:meth:`Faults.recover`). A slowed instance runs each iteration
1/speed as long, from the next one (:meth:`Faults.set_speed`).
"""

from __future__ import annotations

from collections.abc import Callable

from twin.perf.iteration import Batch, DecodeSteps, StageSteps, decode_steps, stage_steps
from twin.serving.decodebatch import DecodeBatch
from twin.serving.kvcache import BlockManager, PrefixCache
from twin.serving.ports import EngineLike
from twin.serving.sequence import DECODE, Sequence

_Stages = tuple[list[float], list[float]]


def _slowed(times: _Stages, speed: float) -> _Stages:
    """Stage times at ``speed`` x the perf model's rate."""
    return [a / speed for a in times[0]], [b / speed for b in times[1]]


class Faults:
    """The fault handling of one engine."""

    __slots__ = ("engine",)

    def __init__(self, engine: EngineLike) -> None:
        self.engine = engine

    def set_speed(self, speed: float) -> None:
        """Run at ``speed`` x the perf model's rate from the next iteration
        (the one in progress keeps its length); 1 is nominal."""
        eng = self.engine
        eng.interrupt()
        eng.speed = speed
        self.price_at(speed)

    def price_at(self, speed: float) -> None:
        """Set the engine's prices at ``speed``: seconds one iteration of a
        batch takes (the perf model's own methods at speed 1: no wrapper on the
        hot path); of a stretch of decode-only steps of one batch, in one call;
        and, pipelined, the stage times of such micro-batches of one lane."""
        eng = self.engine
        timed = eng.perf.iteration_time if eng.spec is None else eng.spec.iteration_time
        iteration_time: Callable[[Batch], float] = (
            timed if speed == 1.0 else (lambda batch: timed(batch) / speed)
        )
        steps = decode_steps(eng.perf)
        stepped: DecodeSteps = (
            steps if speed == 1.0 else (lambda c, x, n: [d / speed for d in steps(c, x, n)])
        )
        staged = stage_steps(eng.perf) if eng.pp > 1 else None
        staged_at: StageSteps | None = (
            staged
            if staged is None or speed == 1.0
            else (lambda c, x, n: _slowed(staged(c, x, n), speed))
        )
        eng.iteration_time = iteration_time
        eng.decode_steps = stepped
        eng.stage_steps = staged_at

    def fail(self) -> list[Sequence]:
        """The instance fails now: everything it holds is gone. Returns the
        sequences it held (:meth:`~twin.serving.engine.Engine.held`), their
        produced-token counts and last-token times brought up to the last step that ended; the KV
        reserved there for incoming hand-offs is dropped with the rest. The
        iteration in progress never ends; the instance comes back empty
        (:meth:`recover`)."""
        eng = self.engine
        eng.interrupt()  # a stretch ends where the step in progress would have
        for s in eng.running.values():
            if s.state == DECODE:
                eng.lanes[s.lane].settle(s)
        lost = eng.held()
        eng.up = False
        if eng.watch is not None:
            eng.watch.changed(eng)
        eng.stop_loops()
        eng.queue_changes += 1
        eng.waiting.clear()
        eng.waiting_tokens = 0
        eng.running.clear()
        eng.prefilling.clear()
        eng.handoff.clear()
        eng.landed.clear()
        eng.reserved.clear()
        pp = eng.pp
        eng.lanes = [DecodeBatch(eng.kv.block_size, k, eng.spec) for k in range(pp)]
        eng.use_lane(0)
        eng.stage_free = [0.0] * pp
        eng.flight = [None] * pp
        eng.claim_no = [0] * pp
        old = eng.kv
        eng.kv = BlockManager(old.total, old.block_size, old.watermark, peak_used=old.peak_used)
        if eng.cache is not None:
            eng.cache.forget_writes()  # its writes under way held blocks of the old life
            tiers = eng.cache.tiers  # the tiers below stay
            eng.cache = PrefixCache(eng.kv, tiers, on_freed=eng.written_down)
        return lost

    def recover(self) -> None:
        """The instance serves again, empty, from now."""
        eng = self.engine
        eng.up = True
        if eng.watch is not None:
            eng.watch.changed(eng)
        eng.start_loops()
