"""What an engine's collaborators see of it, and what it tells the KV hand-off.

The engine (:mod:`twin.serving.engine`) imports its collaborators (the planner,
the decode fast-forwards, the fault handling, the two sides of a hand-off);
they reach back to it through :class:`EngineLike` only, so no module of
``twin/serving`` imports one that imports it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Sequence_
from typing import Any, NamedTuple, Protocol

import simpy

from twin.perf.iteration import Batch, DecodeSteps, PerfModel, StageSteps
from twin.request import Request
from twin.serving.config import EngineConfig
from twin.serving.decodebatch import DecodeBatch
from twin.serving.kvcache import BlockManager, PrefixCache
from twin.serving.observer import Observer
from twin.serving.queuepolicy import PolicyQueue, QueuePolicy
from twin.serving.sequence import Sequence
from twin.serving.speculative import Speculation

Chunks = list[tuple[Sequence, int]]


class Plan(NamedTuple):
    """One iteration as planned: its ``batch`` (None when it only decodes: the
    decode batch's aggregate, which a stretch prices without building it; an
    empty batch when there is nothing to do), the prompt ``chunks`` it
    computes (sequence, tokens) and whether it ``decodes``."""

    batch: Batch | None
    chunks: Chunks
    decodes: bool


class EngineHooks(Protocol):
    """What an engine tells the KV hand-off of a disaggregated cluster."""

    def on_prefill_start(self, engine: Any, seq: Sequence, dt: float) -> None:
        """The iteration that completes ``seq``'s prompt starts; it lasts ``dt`` s."""

    def on_prefilled(self, engine: Any, seq: Sequence) -> None:
        """``seq``'s prompt is done; its KV waits here (state HANDOFF)."""

    def on_blocks_freed(self, engine: Any) -> None:
        """Blocks came free on ``engine``: pending reservations may fit now."""


class PlannerLike(Protocol):
    """The planner, as a fast-forward and the receiving side see it."""

    @property
    def preempted(self) -> bool: ...

    def plan(self) -> Plan: ...

    def note_decode_start(self, chunks: Chunks, decoding: bool, now: float) -> None: ...

    def fits(self, hits: Sequence_[int], need: int) -> bool: ...

    def make_room(self, hits: Sequence_[int], need: int) -> bool: ...


class KeepsBlocks(Protocol):
    """A fast-forward, as the receiving side sees it."""

    def keeps(self, blocks: int) -> bool: ...


class TakesLandings(KeepsBlocks, Protocol):
    """The single-stage fast-forward: its stretch may take in a KV landing."""

    @property
    def stretch(self) -> object | None: ...

    def lands(self, seq: Sequence) -> bool: ...


class EngineLike(Protocol):
    """An engine, as its collaborators see it (:class:`~twin.serving.engine.Engine`)."""

    # what it is and what it is made of
    @property
    def env(self) -> simpy.Environment: ...
    @property
    def id(self) -> int: ...
    @property
    def config(self) -> EngineConfig: ...
    @property
    def pp(self) -> int: ...
    @property
    def perf(self) -> PerfModel: ...
    @property
    def spec(self) -> Speculation | None: ...
    @property
    def observer(self) -> Observer: ...
    @property
    def iteration_observer(self) -> Observer | None: ...
    @property
    def hooks(self) -> EngineHooks | None: ...
    @property
    def on_prompt(self) -> Callable[[Any, Sequence], None] | None: ...
    @property
    def queue_policy(self) -> QueuePolicy: ...
    @property
    def planner(self) -> PlannerLike: ...
    @property
    def ff(self) -> TakesLandings | None: ...
    @property
    def pf(self) -> KeepsBlocks | None: ...

    # what it holds
    kv: BlockManager
    cache: PrefixCache | None
    lanes: list[DecodeBatch]

    @property
    def batch(self) -> DecodeBatch: ...
    @property
    def lane(self) -> int: ...
    @property
    def waiting(self) -> deque[Any] | PolicyQueue: ...
    @property
    def running(self) -> dict[int, Sequence]: ...
    @property
    def prefilling(self) -> list[Sequence]: ...
    @property
    def landed(self) -> list[Sequence]: ...
    @property
    def handoff(self) -> dict[int, tuple[Sequence, int, list[int]]]: ...
    @property
    def reserved(self) -> dict[int, tuple[int, list[int]]]: ...
    @property
    def running_requests(self) -> int: ...

    # its counters, state and prices
    @property
    def life(self) -> int: ...

    queue_changes: int
    waiting_tokens: int
    iterations: int
    busy_s: float
    preemptions: int
    up: bool
    speed: float
    watch: Any
    stage_free: list[float]
    flight: list[tuple[float, bool] | None]
    claim_no: list[int]
    claims: int
    iteration_time: Callable[[Batch], float]
    decode_steps: DecodeSteps
    stage_steps: StageSteps | None

    def cacheable(self, req: Request) -> tuple[int, ...]: ...
    def waiting_moved(self, tokens: int) -> None: ...
    def written_down(self, blocks: int) -> None: ...
    def interrupt(self) -> None: ...
    def poke(self) -> None: ...
    def blocks_freed(self) -> None: ...
    def sync_blocks(self) -> None: ...
    def held(self) -> list[Sequence]: ...
    def stop_loops(self) -> None: ...
    def start_loops(self) -> None: ...
    def use_lane(self, lane: int) -> None: ...
    def idle(self) -> simpy.Event: ...
    def iteration_starts(self, batch: Batch, chunks: Chunks, dt: float) -> None: ...
    def finish(self, s: Sequence, now: float) -> None: ...
    def complete(self, chunks: Chunks, decoded: bool, now: float | None = None) -> None: ...
