"""Splitwise: prompt, token and mixed machine pools (Patel et al., ISCA 2024).

Follows "Splitwise: Efficient Generative LLM Inference Using Phase Splitting"
(arXiv 2311.18677), section IV (the Splitwise design):

- Cluster-level scheduling (IV-B). Machines sit in a prompt pool, a token
  pool and a mixed pool. A request's prompt goes to the prompt machine with
  the fewest pending prompt tokens (join the shortest queue); its tokens go to
  the token machine with the most free KV memory, then the least pending work.
  When the prompt pool is backed up (even the shortest queue is past
  ``mixed_threshold_tokens``), a token machine moves to the mixed pool; when
  the token pool runs out of memory (no token machine with more than
  ``token_free_threshold`` of its KV blocks free), a prompt machine does. A
  mixed machine serves both phases of the requests routed to it, prefill
  first; once it is drained and its pool no longer needs help, it goes back.
  The pools are tried in order (prompt, then mixed; token, then mixed), as
  splitwise-sim's ``MixedPoolScheduler`` does, so mixed machines take the
  overflow and can drain.
- Machine-level scheduling (IV-C). Prompt machines batch FCFS up to
  ``prompt_token_limit`` prompt tokens per iteration (2,048 in the paper: past
  it, batching more prompts buys no throughput); token machines batch as many
  sequences as their KV memory holds. Mixed machines keep their own limits and
  the engine's prefill-first policy.
- KV-cache transfer (IV-D): serialized or layer-wise, from the spec's
  ``transfer.mode``; the hand-off itself is the core's (twin.serving.handoff).

The provisioning study (section VI, iso-power and iso-cost clusters) is
``twin provision`` (twin.studies.provision), which works with any split policy.

NOTE: machine flow runs on a periodic ``tick`` (every ``tick_interval``),
not at each routing decision as in splitwise-sim, so a burst shorter than a
tick is absorbed by the queues before a machine moves. A move takes
``move_cost`` seconds, during which the machine keeps serving in its old role.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from twin.request import Request
from twin.scheduler import (
    ClusterView,
    InstanceView,
    PicksDecode,
    Plan,
    Reject,
    Role,
    Route,
    Scheduler,
    SetRole,
    Ticks,
    duration_s,
    is_int,
    register,
    require_split,
)


@register("splitwise")
@dataclass
class Splitwise(Scheduler, PicksDecode, Ticks):
    """Splitwise: JSQ over prompt/token/mixed pools, machine flow, per-phase batching."""

    prompt_token_limit: int = 2048
    mixed_threshold_tokens: int = 8192
    token_free_threshold: float = 0.05
    move_cost: float | str = 0.0
    tick_interval: float | str = "50 ms"
    token_max_num_seqs: int | None = None
    _home: dict[int, Role] = field(default_factory=dict, init=False, repr=False)
    _moving: dict[int, Role] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("prompt_token_limit", "mixed_threshold_tokens"):
            v = getattr(self, name)
            if not is_int(v) or v <= 0:
                raise ValueError(f"{name}: {v!r} must be a positive integer")
        if not 0.0 <= self.token_free_threshold < 1.0:
            raise ValueError(
                f"token_free_threshold: {self.token_free_threshold!r} must be in [0, 1)"
            )
        v = self.token_max_num_seqs
        if v is not None and (not is_int(v) or v <= 0):
            raise ValueError(f"token_max_num_seqs: {v!r} must be a positive integer or null")
        self.move_cost_s = duration_s(self.move_cost, "move_cost")
        self.tick_s = duration_s(self.tick_interval, "tick_interval", positive=True)

    # -- setup -----------------------------------------------------------------------
    def setup(self, cluster: ClusterView) -> Plan:
        require_split(cluster, "splitwise", " (its prompt and token machines)")
        # The pool each prompt and token machine goes back to; a mixed one has none.
        self._home = {i.id: "prefill" for i in cluster.of_role("prefill")}
        self._home |= {i.id: "decode" for i in cluster.of_role("decode")}
        self._moving = {}
        prompt = {i.id: self.prompt_token_limit for i in cluster.of_role("prefill")}
        # A sequence holds at least one block: memory, not a count, bounds the batch.
        seqs = {
            i.id: self.token_max_num_seqs or max(1, i.total_blocks)
            for i in cluster.of_role("decode")
        }
        return Plan(max_batched_tokens=prompt, max_num_seqs=seqs)

    # -- routing ---------------------------------------------------------------------
    def route(self, req: Request, view: ClusterView) -> Route | Reject:
        prompt = view.of_role("prefill")
        mixed = view.of_role("mixed")
        for pool in (prompt, mixed):
            if pool:
                best = min(pool, key=_prompt_load)
                if not self._queue_long(best, req):
                    return self._route_to(best)
        best = min(prompt + mixed, key=_prompt_load)
        return self._route_to(best)

    @staticmethod
    def _route_to(inst: InstanceView) -> Route:
        return Route(inst.id, inst.id) if inst.role == "mixed" else Route(inst.id)

    def _queue_long(self, inst: InstanceView, req: Request) -> bool:
        return (
            inst.queue_requests > 0
            and inst.queue_tokens + req.prompt_tokens > self.mixed_threshold_tokens
        )

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        need = _blocks(req.prompt_tokens + req.output_tokens, view.instances[0].block_size)
        token = view.of_role("decode")
        mixed = view.of_role("mixed")
        for pool in (token, mixed):
            fits = [i for i in pool if i.free_blocks >= need]
            if fits:
                return min(fits, key=_token_load).id
        return min(token + mixed, key=_token_load).id

    # -- machine flow ----------------------------------------------------------------
    def tick(self, view: ClusterView) -> list[SetRole]:
        for i, role in list(self._moving.items()):
            if view[i].role == role:
                del self._moving[i]
        if self._moving:
            return []  # one move at a time, so a move's effect is seen before the next
        prompt = view.of_role("prefill")
        token = view.of_role("decode")
        mixed = view.of_role("mixed")
        # A pool needs help when all its machines, and the mixed ones, are past
        # the mark; a lent machine goes back only once its own pool alone is not
        # (hysteresis: no moving back and forth while the pool is still short).
        if self._backed_up(prompt + mixed) and len(token) > 1:
            return [self._move(min(token, key=_token_load), "mixed")]
        if self._full(token + mixed) and len(prompt) > 1:
            return [self._move(min(prompt, key=lambda i: (-i.free_blocks, i.id)), "mixed")]
        for inst in mixed:
            home = self._home.get(inst.id, "mixed")
            if home == "mixed" or inst.queue_requests or inst.running_requests:
                continue
            if (home == "decode" and not self._backed_up(prompt)) or (
                home == "prefill" and not self._full(token)
            ):
                return [self._move(inst, home)]
        return []

    def _backed_up(self, pool: tuple[InstanceView, ...]) -> bool:
        return all(i.queue_tokens > self.mixed_threshold_tokens for i in pool)

    def _full(self, pool: tuple[InstanceView, ...]) -> bool:
        return all(self._out_of_memory(i) for i in pool)

    def _move(self, inst: InstanceView, role: Role) -> SetRole:
        self._moving[inst.id] = role
        return SetRole(inst.id, role, self.move_cost_s)

    def _out_of_memory(self, inst: InstanceView) -> bool:
        return inst.free_blocks <= self.token_free_threshold * inst.total_blocks


def _prompt_load(i: InstanceView) -> tuple[int, int, int]:
    """Pending prompt tokens first (JSQ), then requests, then id."""
    return (i.queue_tokens, i.queue_requests + i.running_requests, i.id)


def _token_load(i: InstanceView) -> tuple[int, int, int]:
    """Most free KV memory first, then the least pending work, then id."""
    return (-i.free_blocks, i.running_requests + i.queue_requests, i.id)


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)
