"""Sessions: chat and agent conversations of many turns, closed loop.

A session is a conversation: turn ``t``'s prompt is the whole history (the
previous turn's prompt and its answer) plus a new part (the user's next
message, or a tool's result), and the client sends it only when the previous
answer has come back and a think (or tool) time has passed. So a session's
KV is worth keeping between its turns, and how long the turns take sets when
the next ones arrive: the load a cluster sees depends on how fast it serves.

``workload.lengths: {sessions: {...}}`` draws each session when it starts
(``workload.arrival`` is the process of session starts):

- ``turns``: turns per session, a length law (``{dist: fixed, value: N}`` or
  lognormal);
- ``first_prompt``: turn 0's new tokens (after the shared system prompt);
- ``growth``: each later turn's new tokens (the user's message, a tool's output);
- ``output``: each turn's answer;
- ``think``: seconds between an answer and the next turn's send:
  ``{dist: fixed, value: S}``, ``{dist: exponential, mean: S}`` or
  ``{dist: lognormal, median | mean: S, sigma | cv: X}``;
- ``system_prompt_len``: tokens of a system prompt every session shares (0);
- ``block_tokens``: tokens per prefix hash (16, vLLM's block).

What the server does with a session's KV between its turns is the engine's
``engine.session_retention`` (:class:`Retention`).

Turn ``t`` (from 0) of a session therefore sends
``S + F + sum_{j<t} (O_j + G_{j+1})`` tokens, where ``S`` is the system prompt,
``F`` the first prompt, ``O_j`` turn ``j``'s answer and ``G_j`` turn ``j``'s new
part. Its prefix hashes name its full blocks: a block inside the system
prompt by its position (every session shares it), any later block by
(session, position), so turn ``t + 1`` finds turn ``t``'s prompt blocks where
the cache kept them. As in :mod:`twin.workload.shared_prefix`, a twin engine
caches prompt blocks only, so turn ``t + 1`` recomputes turn ``t``'s answer once.

Every draw of a session happens when it starts, from the workload's seeded
stream, so the turns do not depend on the order in which they complete. A
session's turns take consecutive request ids from its first. A turn that
does not complete (rejected or failed) ends its session there: the client
gives up, and the later turns are never sent.

Sources for the shape: multi-turn chat grows each prompt by the history (the
OpenAI chat API resends it; inference-perf's ``shared_prefix`` multi-turn,
``apis/user_session.py``); agentic sessions alternate model calls and tool
calls (Mooncake's tool-agent trace, Qin et al., FAST 2025, Sec. 2). The laws
and their values are the user's: the defaults here are no claim about a
real population.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from twin._check import check_keys, is_int, is_number
from twin.errors import SpecError
from twin.request import Session, Turn
from twin.units import parse_duration

if TYPE_CHECKING:
    import numpy as np

    # a request before its id and scaling, as twin.workload.stream reads rows
    Row = tuple[float | None, int, int, tuple[int, ...], int]

    from twin.workload.lengths import Marginal

VLLM_BLOCK_TOKENS = 16
"""Tokens per KV block in vLLM (``--block-size`` default 16, vLLM docs, engine
arguments); prefix caching hashes whole blocks."""

KEYS = ("turns", "first_prompt", "growth", "output", "think", "system_prompt_len",
        "block_tokens")  # fmt: skip
RETENTION = ("keep", "drop", "ttl", "offload")
REQUIRED = KEYS[:5]
THINK_DISTS = ("fixed", "exponential", "lognormal")

_NUMBER = {"type": "number", "minimum": 0}
RETENTION_SCHEMA = {
    "type": "object",
    "required": ["policy"],
    "properties": {"policy": {"enum": list(RETENTION)}, "ttl": {"type": "string"}},
    "additionalProperties": False,
}
THINK_SCHEMA = {
    "type": "object",
    "required": ["dist"],
    "properties": {"dist": {"enum": list(THINK_DISTS)}, "value": _NUMBER, "mean": _NUMBER,
                   "median": _NUMBER, "sigma": _NUMBER, "cv": _NUMBER},
    "additionalProperties": False,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ThinkTime:
    """Seconds between an answer and the next turn: ``fixed`` (``value``),
    ``exponential`` (``mean``) or ``lognormal`` (``median`` and ``sigma``)."""

    dist: str
    value: float = 0.0
    sigma: float = 0.0

    @classmethod
    def from_mapping(cls, m: object, where: str) -> ThinkTime:
        if not isinstance(m, Mapping):
            raise SpecError(f"{where}: {m!r} is not a mapping; expected {{dist: fixed, value: S}}")
        dist = m.get("dist")
        if dist not in THINK_DISTS:
            raise SpecError(
                f"{where}.dist: {dist!r} unknown; expected one of {', '.join(THINK_DISTS)}"
            )
        if dist == "fixed":
            check_keys(m, where, ("dist", "value"))
            return cls("fixed", _seconds(m, "value", where))
        if dist == "exponential":
            check_keys(m, where, ("dist", "mean"))
            return cls("exponential", _seconds(m, "mean", where))
        check_keys(m, where, ("dist",), ("median", "mean", "sigma", "cv"))
        if ("median" in m) == ("mean" in m):
            raise SpecError(f"{where}: give exactly one of median and mean")
        if ("sigma" in m) == ("cv" in m):
            raise SpecError(f"{where}: give exactly one of sigma and cv")
        sigma = (
            _seconds(m, "sigma", where)
            if "sigma" in m
            else math.sqrt(math.log1p(_seconds(m, "cv", where) ** 2))
        )
        if "median" in m:
            median = _seconds(m, "median", where)
        else:  # mean = median * exp(sigma^2 / 2)
            median = _seconds(m, "mean", where) * math.exp(-(sigma**2) / 2)
        return cls("lognormal", median, sigma)

    def draw(self, rng: np.random.Generator, n: int) -> list[float]:
        if self.dist == "fixed" or n == 0:
            return [self.value] * n
        if self.dist == "exponential":
            return rng.exponential(self.value, n).tolist() if self.value > 0 else [0.0] * n
        if self.value <= 0:
            return [0.0] * n
        return (self.value * rng.lognormal(0.0, self.sigma, n)).tolist()


def _seconds(m: Mapping[str, object], key: str, where: str) -> float:
    if key not in m:
        raise SpecError(f"{where}: missing key '{key}'")
    v = m[key]
    if not is_number(v) or not 0 <= float(v) < math.inf:  # type: ignore[arg-type]
        raise SpecError(f"{where}.{key}: {v!r} is not a number of seconds >= 0")
    return float(v)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Retention:
    """What the serving side does with a session's own KV (its prompt blocks
    past the shared system prompt) when a turn ends, until the next turn:

    - ``keep``: it stays cached, evicted least recently used first as any
      prefix (vLLM's automatic prefix caching; the default);
    - ``drop``: it is evicted at once (a server that frees a conversation's
      KV when the answer is sent: no reuse between turns);
    - ``ttl``: it stays for ``ttl_s``, then is evicted unless a turn used it
      again (a session cache with an expiry, as an agent framework's pinned
      context);
    - ``offload``: it is written down to the KV tiers below HBM at once
      (``kv_tiers``), freeing HBM once written (LMCache-style offload of an
      idle conversation), and loaded back from there by the next turn.

    The spec's ``engine.session_retention``. The hook:
    :class:`twin.sim.sessions.SessionDriver` asks ``decide(session)``
    at each turn's end (the turn just ended); a policy of one's own is any
    object with that method returning ``(policy, ttl_s)``, given to
    :class:`~twin.sim.simulation.Simulation` as ``retention=``."""

    policy: str = "keep"
    ttl_s: float = 0.0

    @classmethod
    def from_mapping(cls, m: object, where: str) -> Retention:
        if not isinstance(m, Mapping):
            raise SpecError(f"{where}: {m!r} is not a mapping; expected {{policy: keep}}")
        check_keys(m, where, ("policy",), ("ttl",))
        policy = m["policy"]
        if policy not in RETENTION:
            raise SpecError(
                f"{where}.policy: {policy!r} unknown; expected one of {', '.join(RETENTION)}"
            )
        if (policy == "ttl") != ("ttl" in m):
            raise SpecError(f"{where}: ttl goes with policy: ttl, and policy: ttl needs one")
        ttl = 0.0
        if "ttl" in m:
            try:
                ttl = parse_duration(m["ttl"])  # type: ignore[arg-type]
            except (TypeError, ValueError) as e:
                raise SpecError(f"{where}.ttl: {m['ttl']!r} is not a duration ({e})") from None
            if not 0 <= ttl < math.inf:
                raise SpecError(f"{where}.ttl: {m['ttl']!r} must be a finite duration >= 0")
        return cls(str(policy), ttl)

    def check(self, lengths: object, caching: bool, tiers: bool, where: str) -> None:
        """What the policy acts on, in a spec: sessions (``lengths``), a prefix
        cache (``caching``), and for ``offload`` the KV tiers (``tiers``)."""
        if self.policy == "keep":
            return
        key = f"{where}: engine.session_retention.policy: {self.policy}"
        if not isinstance(lengths, Sessions):
            raise SpecError(f"{key} acts between a session's turns; give workload.lengths.sessions")
        if not caching:
            raise SpecError(f"{key} acts on the prefix cache; set engine.prefix_caching: true")
        if self.policy == "offload" and not tiers:
            raise SpecError(f"{key} writes a session's KV down to the tiers; give kv_tiers")

    def decide(self, session: Session) -> tuple[str, float]:
        return self.policy, self.ttl_s


@dataclass(frozen=True, slots=True)
class Sessions:
    """The session workload of the module (see there)."""

    turns: Marginal
    first_prompt: Marginal
    growth: Marginal
    output: Marginal
    think: ThinkTime
    system_prompt_len: int = 0
    block_tokens: int = VLLM_BLOCK_TOKENS

    def __post_init__(self) -> None:
        if not is_int(self.system_prompt_len) or self.system_prompt_len < 0:
            raise SpecError(
                f"system_prompt_len(={self.system_prompt_len!r}) must be an integer >= 0"
            )
        if not is_int(self.block_tokens) or self.block_tokens < 1:
            raise SpecError(f"block_tokens(={self.block_tokens!r}) must be an integer >= 1")

    @classmethod
    def from_mapping(
        cls, value: object, where: str, marginal: Callable[[object, str], Marginal]
    ) -> Sessions:
        """``lengths.sessions`` at ``where``; ``marginal`` reads a length law
        (``{dist: fixed, value: N}`` or lognormal, as ``lengths.prompt``)."""
        if not isinstance(value, Mapping):
            raise SpecError(f"{where}: {value!r} is not a mapping; expected keys {', '.join(KEYS)}")
        check_keys(value, where, REQUIRED, KEYS[len(REQUIRED) :])
        turns, first, growth, output = (marginal(value[k], f"{where}.{k}") for k in REQUIRED[:4])
        think = ThinkTime.from_mapping(value["think"], f"{where}.think")
        try:
            return cls(
                turns, first, growth, output, think,
                system_prompt_len=value.get("system_prompt_len", 0),
                block_tokens=value.get("block_tokens", VLLM_BLOCK_TOKENS),
            )  # fmt: skip
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None

    def check_stream(self, skip: int, class_lengths: Sequence[object]) -> None:
        """What a session workload refuses of the rest of ``workload:``."""
        if any(lengths is not None for lengths in class_lengths):
            raise SpecError(
                "classes[].lengths: a session's turns take the session's lengths "
                "(lengths.sessions); give the classes no lengths of their own"
            )
        if skip:
            raise SpecError(
                "skip applies to a stream of requests, not to sessions (lengths.sessions)"
            )

    def first_turns(self, rng: np.random.Generator, out: deque[Session]) -> Iterator[Row]:
        """Turn 0 of each session, as a row; each session goes to ``out`` as its
        row is drawn (the stream's last step takes it from there)."""
        for s in self.stream(rng):
            out.append(s)
            p = s.turns[0].prompt_tokens
            yield None, p, s.turns[0].output_tokens, self.hashes(s.index, p), self.block_tokens

    def hashes(self, session: int, tokens: int) -> tuple[int, ...]:
        """Hashes of the full blocks of a prompt of ``tokens`` tokens of
        ``session``: a block inside the system prompt is named by its position
        alone (shared), a later one by (session, position); distinct integers >= 0."""
        b = self.block_tokens
        shared = self.system_prompt_len // b
        out = []
        for k in range(tokens // b):
            if k < shared:
                out.append(k)
            else:  # Cantor's pairing of (session, k), moved past the shared names
                s = session + k
                out.append(shared + s * (s + 1) // 2 + k)
        return tuple(out)

    def draw(self, rng: np.random.Generator, index: int, first_id: int) -> Session:
        """Session ``index`` (its turn 0 has request id ``first_id``), all its
        draws from ``rng`` in a fixed order."""
        n = int(self.turns.draw(rng, 1)[0])
        first = int(self.first_prompt.draw(rng, 1)[0])
        growth = self.growth.draw(rng, n).tolist()
        outputs = self.output.draw(rng, n).tolist()
        thinks = self.think.draw(rng, n)
        prompt = self.system_prompt_len + first
        turns = []
        for t in range(n):
            turns.append(Turn(prompt, int(outputs[t]), float(thinks[t])))
            prompt += int(outputs[t]) + int(growth[t])
        return Session(index, 0, first_id, tuple(turns))

    def stream(self, rng: np.random.Generator) -> Iterator[Session]:
        """Sessions 0, 1, 2, ... (endless), turn 0 of each, ids consecutive."""
        first_id = 0
        index = 0
        while True:
            s = self.draw(rng, index, first_id)
            yield s
            first_id += len(s.turns)
            index += 1


def sessions_schema(marginal: Mapping[str, object]) -> dict[str, object]:
    """The JSON Schema of ``lengths: {sessions: ...}`` (``marginal``: a length law's)."""
    laws = dict.fromkeys(REQUIRED[:4], marginal)
    return {
        "type": "object", "required": ["sessions"], "additionalProperties": False,
        "properties": {"sessions": {
            "type": "object", "required": list(REQUIRED), "additionalProperties": False,
            "properties": {**laws, "think": THINK_SCHEMA,
                           "system_prompt_len": {"type": "integer", "minimum": 0},
                           "block_tokens": {"type": "integer", "minimum": 1}}}},
    }  # fmt: skip
