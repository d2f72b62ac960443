"""inference-perf's ``shared_prefix`` workload: shared system prompts, optionally
multi-turn chat, with the prefix block hashes a prefix cache acts on.

What inference-perf (kubernetes-sigs/inference-perf, ``datagen/shared_prefix_datagen.py``
and ``apis/user_session.py``) sends, as read in its source:

- ``groups`` system prompts of ``system_prompt_len`` random tokens, and per group
  ``users`` questions of ``question_len`` tokens: ``groups x users`` prompts, each the
  group's system prompt followed by its question. The list is shuffled once (seeded)
  and then cycled in order: request ``n`` carries prompt ``n mod (groups x users)``.
  Each asks for ``output_len`` tokens (with ``ignore_eos`` the server makes exactly
  that many).
- Multi-turn chat (``enable_multi_turn_chat``): each prompt belongs to one user
  session, whose context starts as its group's system prompt; the session's round
  ``r`` (request ``n`` is round ``n div (groups x users)``) sends context + the prompt,
  and the context then becomes that text + the response. So round ``r``'s prompt is
  ``S + (r + 1)(S + Q) + r O`` tokens (``S`` system prompt, ``Q`` question, ``O``
  output), and round ``r``'s prompt is a prefix of round ``r + 1``'s. No truncation:
  a session grows until the server refuses it (``max_model_len``).
- inference-perf before its multi-turn support (late 2025) had no such key and used
  its defaults for unknown keys; that is what the runs in ``shared/data/realruns``
  ran: their resolved configs show 10 groups x 10 prompts, single turn, and their
  traces repeat with period 100.

Prefix hashes (``block_tokens``-token blocks, 16 as vLLM's): a request's block ``k``
is named by what it holds: a block wholly inside the system prompt by ``(group,
k)``, so the group's requests share it; any later block by ``(session, k)``, so a
repeat of a prompt (single turn) and a session's later rounds (multi-turn) find the
earlier blocks. Only full blocks carry a hash, as vLLM hashes only full blocks.

NOTE: vLLM also caches the blocks a response filled; a twin engine caches prompt
blocks only, so a multi-turn round recomputes the previous response's blocks once.
inference-perf holds a session's next round until its previous one has ended; this
generator is open loop (the arrival process alone times the sends).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from twin._check import check_keys, is_int
from twin.errors import SpecError

if TYPE_CHECKING:
    import numpy as np

VLLM_BLOCK_TOKENS = 16
"""Tokens per KV block in vLLM (``--block-size`` default 16, vLLM docs, engine
arguments); prefix caching hashes whole blocks."""

KEYS = ("groups", "users", "system_prompt_len", "question_len", "output_len", "multi_turn",
        "block_tokens")  # fmt: skip
SCHEMA = {
    "type": "object",
    "required": list(KEYS[:5]),
    "additionalProperties": False,
    "properties": {
        **{k: {"type": "integer", "minimum": 1} for k in KEYS[:5]},
        "system_prompt_len": {"type": "integer", "minimum": 0},
        "multi_turn": {"type": "boolean"},
        "block_tokens": {"type": "integer", "minimum": 1},
    },
}

# (prompt tokens, output tokens, prefix hashes, tokens per hash)
Drawn = tuple[int, int, tuple[int, ...], int]


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """The workload of the module: ``groups`` system prompts x ``users`` prompts each."""

    groups: int
    users: int
    system_prompt_len: int
    question_len: int
    output_len: int
    multi_turn: bool = False
    block_tokens: int = VLLM_BLOCK_TOKENS

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "multi_turn":
                if not isinstance(v, bool):
                    raise SpecError(f"multi_turn(={v!r}) must be true or false")
                continue
            low = 0 if f.name == "system_prompt_len" else 1
            if not is_int(v) or v < low:
                raise SpecError(f"{f.name}(={v!r}) must be an integer >= {low}")

    @classmethod
    def from_mapping(cls, m: object, where: str) -> SharedPrefix:
        if not isinstance(m, Mapping):
            raise SpecError(f"{where}: {m!r} is not a mapping; expected keys {', '.join(KEYS)}")
        check_keys(m, where, KEYS[:5], KEYS[5:])
        try:
            return cls(**{k: m[k] for k in KEYS if k in m})
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None

    @property
    def prompts(self) -> int:
        """Distinct prompts (sessions): ``groups x users``."""
        return self.groups * self.users

    def prompt_tokens(self, round: int = 0) -> int:
        """A prompt's tokens in round ``round`` (always round 0 in single turn)."""
        s, q = self.system_prompt_len, self.question_len
        if not self.multi_turn:
            return s + q
        return s + (round + 1) * (s + q) + round * self.output_len

    def hashes(self, group: int, session: int, tokens: int) -> tuple[int, ...]:
        """The hashes of the full blocks of a prompt of ``tokens`` tokens of ``session``
        (in ``group``): blocks inside the system prompt named by the group, the rest
        by the session. Every name is a distinct integer >= 0."""
        b = self.block_tokens
        stride = self.groups + self.prompts
        shared = self.system_prompt_len // b
        return tuple(
            k * stride + (group if k < shared else self.groups + session)
            for k in range(tokens // b)
        )

    def draw(self, order: np.ndarray, n: int) -> Drawn:
        """Request ``n`` given the shuffled prompt ``order`` (a permutation of the
        sessions ``0 .. groups x users - 1``; session ``s`` is in group ``s div users``)."""
        session = int(order[n % self.prompts])
        tokens = self.prompt_tokens(n // self.prompts)
        hashes = self.hashes(session // self.users, session, tokens)
        return tokens, self.output_len, hashes, self.block_tokens

    def order(self, rng: np.random.Generator) -> np.ndarray:
        """The shuffled prompt list, from ``rng`` (its only draw)."""
        return rng.permutation(self.prompts)

    def stream(self, rng: np.random.Generator) -> Iterator[Drawn]:
        """Requests 0, 1, 2, ... (endless)."""
        order = self.order(rng)
        n = 0
        while True:
            yield self.draw(order, n)
            n += 1
