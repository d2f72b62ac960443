"""The client side of sessions: each turn is sent when the previous answer is
back and its think time has passed (closed loop), and what a session took.

A session's turns are drawn when it starts (:mod:`twin.workload.sessions`);
this observer sends turn ``t + 1`` at the end of turn ``t`` plus turn ``t``'s
think time, one event per turn. A turn that is rejected or fails ends its
session (the client gives up). The summary's ``sessions`` section counts the
sessions started, completed (every turn) and abandoned, the time a completed
session took (turn 0's arrival to its last answer), and the TTFT of each turn
index, which shows what keeping a session's KV between turns buys.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import simpy

from twin._clock import arrival_at, at
from twin.request import Request
from twin.serving.observer import Observer, Outcome
from twin.serving.retention import cached_stamps, let_go
from twin.sim.metrics import Distribution
from twin.workload.sessions import Retention

if TYPE_CHECKING:
    from twin.serving.engine import Engine
    from twin.serving.sequence import Sequence
    from twin.workload.sessions import Sessions


class SessionDriver(Observer):
    """Sends the later turns of every session through ``send`` and keeps what
    its sessions took. ``live`` counts the sessions with a turn under way or
    due: the arrivals are over only when it is 0."""

    def __init__(
        self,
        env: simpy.Environment,
        sessions: Sessions,
        send: Callable[[Request], None],
        engine: Callable[[int], Engine] | None = None,
        retention: Any = None,
    ) -> None:
        self.env = env
        self.sessions = sessions
        self.send = send
        self.engine = engine  # instance id -> its engine
        # the hook asked at each turn's end: decide(session) -> (policy, ttl_s)
        self.retention = retention if retention is not None else Retention()
        self.let_go = 0  # turns whose KV a retention policy let go (or set a TTL on)
        self.live = 0
        self.started = 0
        self.completed = 0
        self.abandoned = 0
        self._start: dict[int, float] = {}  # session index -> turn 0's arrival
        self.durations = Distribution()
        self.turn_ttft: defaultdict[int, Distribution] = defaultdict(Distribution)
        self.turns_done = 0

    def request_arrived(self, now: float, req: Request) -> None:
        s = req.session
        if s is not None and s.turn == 0:
            self._start[s.index] = now
            self.started += 1
            self.live += 1

    def request_ended(
        self, now: float, instance: int, req: Request, seq: Sequence | None, outcome: Outcome,
        reason: str,
    ) -> None:  # fmt: skip
        s = req.session
        if s is None:
            return
        if outcome != "completed":
            self.abandoned += 1
            self._end(s.index)
            return
        self.turns_done += 1
        if seq is not None:
            self._retain(req, seq, instance)
        if seq is not None and seq.t_first_token >= 0.0:
            self.turn_ttft[s.turn].add(seq.t_first_token - req.arrival_s)
        if s.last:
            self.completed += 1
            self.durations.add(now - self._start[s.index])
            self._end(s.index)
            return
        nxt = s.next()
        turn = nxt.turns[nxt.turn]
        think = s.turns[s.turn].think_s
        ss = self.sessions
        follow = dataclasses.replace(
            req, id=nxt.first_id + nxt.turn, arrival_s=self.env.now + think,
            prompt_tokens=turn.prompt_tokens, output_tokens=turn.output_tokens,
            prefix_hashes=ss.hashes(nxt.index, turn.prompt_tokens),
            prefix_block_tokens=ss.block_tokens, session=nxt,
        )  # fmt: skip
        arrival_at(self.env, follow.arrival_s).callbacks.append(lambda _ev: self.send(follow))  # type: ignore[union-attr]

    def _retain(self, req: Request, seq: Sequence, instance: int) -> None:
        """Apply the retention policy to the turn's own KV (its prompt blocks past
        the shared system prompt) where it is cached: the instance that
        prefilled it and the one that decoded it."""
        assert req.session is not None
        policy, ttl = self.retention.decide(req.session)
        if policy == "keep" or self.engine is None:
            return
        own = req.prefix_hashes[self.sessions.system_prompt_len // self.sessions.block_tokens :]
        if not own:
            return
        self.let_go += 1
        for i in dict.fromkeys((seq.prefill_instance, instance)):
            if i < 0:
                continue
            eng = self.engine(i)
            if policy == "ttl":
                stamps = cached_stamps(eng, own)

                def expire(_ev: object, e: Engine = eng, s: list[int] = stamps) -> None:
                    let_go(e, own, write_down=False, stamps=s)

                at(self.env, self.env.now + ttl, expire)
            else:
                let_go(eng, own, write_down=policy == "offload")

    def _end(self, index: int) -> None:
        self.live -= 1
        del self._start[index]

    def summary(self) -> dict[str, Any]:
        """The summary's ``sessions`` section."""
        return {
            "started": self.started,
            "completed": self.completed,
            "abandoned": self.abandoned,
            "turns_completed": self.turns_done,
            "retention": self.retention.policy
            if isinstance(self.retention, Retention)
            else type(self.retention).__name__,
            "duration_s": self.durations.summary(),
            "ttft_by_turn_s": {str(t): d.summary() for t, d in sorted(self.turn_ttft.items())},
        }
