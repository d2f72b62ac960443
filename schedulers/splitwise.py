"""Splitwise: prompt, token and mixed machine pools (Patel et al., ISCA 2024).

Follows "Splitwise: Efficient Generative LLM Inference Using Phase Splitting"
(arXiv 2311.18677), section IV (the Splitwise design):

- Cluster-level scheduling (IV-B). Machines sit in a prompt pool, a token
  pool and a mixed pool. The CLS picks a request's prompt machine and its
  token machine together, when the request arrives, so that the KV transfer
  can overlap the prompt (IV-B, IV-D): the prompt goes to the prompt machine
  with the fewest pending prompt tokens (join the shortest queue), the tokens
  to the token machine with the most free KV memory, then the least pending
  work. When the prompt pool is backed up (even the shortest queue is past
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

What a router cannot know it does not read: a request's output length is
unknown at arrival, so the memory a request will need on its token machine is
sized from its prompt and ``expected_output_tokens`` (a configured guess, not
the request's true length), and the request fits a token machine when that
many blocks are free there.

Where this differs from the paper:

- Hand-off mode (IV-D, threshold in VI-A): the paper picks per batch,
  serialized for small prompts (< 512 tokens on H100) and layer-wise for
  larger ones. Here the mode is the spec's ``transfer.mode``, one for every
  request of a run: a :class:`~twin.scheduler.Route` carries no per-request
  mode, so the choice cannot be made by this policy. ``layerwise`` is the
  closer setting for prompts past the threshold (most of the Azure traces'),
  ``serialized`` for short-prompt workloads.
- Queue lengths (IV-B): the paper's CLS measures a machine's queue in pending
  tokens, from what machines report regularly. Prompt machines are ranked by
  pending prompt tokens as in the paper; token machines by free KV memory,
  then pending requests, since a token machine's pending work is its resident
  sequences, whose remaining lengths nobody knows. The view is read at each
  decision, not from periodic reports.
- Requests in flight (IV-B): a token machine's free memory counts a request
  only once its blocks are reserved, at its prefill (push) or after it (pull).
  So that a burst does not pile onto one machine, the CLS keeps its own ledger
  of the requests it sent to each token machine: one counts, with its expected
  blocks, until its prompt machine's queue and its own prefill are expected to
  be done (``estimate_queue_s`` plus ``estimate_prefill_s`` at arrival). A
  request still queued past that estimate, or reserved before it, is counted
  wrong for that while.
- Memory need (IV-B): the paper's simulator sizes a request from its true
  output length; a router cannot, so ``expected_output_tokens`` stands in, and
  a request may land on a token machine that later runs short and preempts.
- Mixed machines returning (IV-B): a lent machine goes back once nothing is
  queued or running on it; a request prefilling elsewhere whose tokens were
  sent to it still lands there and is decoded there after the move.

NOTE: machine flow runs on a periodic ``tick`` (every ``tick_interval``),
not at each routing decision as in splitwise-sim, so a burst shorter than a
tick is absorbed by the queues before a machine moves. A move takes
``move_cost`` seconds, during which the machine keeps serving in its old role.
The tick reads only the cluster's state (``tick_on_change``), so the ticks
while the cluster is idle are skipped, with the same decisions.
"""

from __future__ import annotations

import heapq
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
    TickWatch,
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
    expected_output_tokens: int = 128
    # tick reads the pools' queues, memory and roles, never the time: a tick
    # that moved nothing need not come again until the cluster changes
    tick_on_change: bool = field(default=True, init=False, repr=False)
    _home: dict[int, Role] = field(default_factory=dict, init=False, repr=False)
    _moving: dict[int, Role] = field(default_factory=dict, init=False, repr=False)
    # Token machine -> the requests sent there whose blocks the machine may not
    # have reserved yet.
    _inflight: dict[int, _OnWay] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("prompt_token_limit", "mixed_threshold_tokens"):
            v = getattr(self, name)
            if not is_int(v) or v <= 0:
                raise ValueError(f"{name}: {v!r} must be a positive integer")
        if not 0.0 <= self.token_free_threshold < 1.0:
            raise ValueError(
                f"token_free_threshold: {self.token_free_threshold!r} must be in [0, 1)"
            )
        v = self.expected_output_tokens
        if not is_int(v) or v < 0:
            raise ValueError(f"expected_output_tokens: {v!r} must be an integer >= 0")
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
        self._inflight = {}
        prompt = {i.id: self.prompt_token_limit for i in cluster.of_role("prefill")}
        # A sequence holds at least one block: memory, not a count, bounds the batch.
        seqs = {
            i.id: self.token_max_num_seqs or max(1, i.total_blocks)
            for i in cluster.of_role("decode")
        }
        return Plan(max_batched_tokens=prompt, max_num_seqs=seqs)

    # -- routing ---------------------------------------------------------------------
    def route(self, req: Request, view: ClusterView) -> Route | Reject:
        """Both machines at arrival: the prompt machine by JSQ, and, unless it
        is a mixed machine (which serves the whole request), the token machine."""
        pools = _pools(view)  # the same for both picks (one pass over the view)
        best = self._prompt_machine(req, pools)
        if best.role == "mixed":
            return Route(best.id, best.id)
        need = self._need(req, view)
        now = view.now
        decode = self._pick_decode(need, now, pools)
        due = now + best.estimate_queue_s() + best.estimate_prefill_s(req.prompt_tokens)
        on_way = self._inflight.get(decode)
        if on_way is None:
            on_way = self._inflight[decode] = _OnWay()
        on_way.add(due, need)
        return Route(best.id, decode)

    def _prompt_machine(
        self, req: Request, pools: tuple[tuple[InstanceView, ...], ...]
    ) -> InstanceView:
        prompt, _, mixed = pools
        for pool in (prompt, mixed):
            if pool:
                best = min(pool, key=_prompt_load)
                if not self._queue_long(best, req):
                    return best
        return min(prompt + mixed, key=_prompt_load)

    def _queue_long(self, inst: InstanceView, req: Request) -> bool:
        return (
            inst.queue_requests > 0
            and inst.queue_tokens + req.prompt_tokens > self.mixed_threshold_tokens
        )

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        """The token machine for ``req`` now: the most free KV memory (less what
        is on its way) that fits the expected need, then the least pending work;
        a mixed machine when no token machine fits. ``route`` asks it at arrival."""
        return self._pick_decode(self._need(req, view), view.now, _pools(view))

    def _pick_decode(
        self, need: int, now: float, pools: tuple[tuple[InstanceView, ...], ...]
    ) -> int:
        inflight = self._inflight
        for i, sent in list(inflight.items()):
            if not sent.land(now):
                del inflight[i]

        _, token, mixed = pools
        # (-free memory less what is on its way, pending work, id) of each
        # machine, its memory read once
        loads: dict[int, tuple[int, int, int]] = {}
        for pool in (token, mixed):
            # the first of the least load among those that fit (min over the fits)
            best_load: tuple[int, int, int] | None = None
            for inst in pool:
                iid = inst.id
                free = inst.free_blocks
                pending = inst.running_requests + inst.queue_requests
                on_way = inflight.get(iid)
                if on_way is not None:
                    pending += len(on_way.due)
                    free -= on_way.blocks
                got = loads[iid] = (-free, pending, iid)
                if free >= need and (best_load is None or got < best_load):
                    best_load = got
            if best_load is not None:
                return best_load[2]
        return min(loads.values())[2]  # none fits: the least load of all

    def _need(self, req: Request, view: ClusterView) -> int:
        """KV blocks ``req`` is expected to need: its prompt and
        ``expected_output_tokens`` (its true output length is not known)."""
        tokens = req.prompt_tokens + self.expected_output_tokens
        return _blocks(tokens, view.instances[0].block_size)

    # -- machine flow ----------------------------------------------------------------
    def tick(self, view: ClusterView) -> list[SetRole]:
        for i, role in list(self._moving.items()):
            if view[i].role == role:
                del self._moving[i]
        if self._moving:
            return []  # one move at a time, so a move's effect is seen before the next
        prompt, token, mixed = _pools(view)
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

    def tick_watch(self, view: ClusterView) -> TickWatch | None:
        """What a tick that moved nothing turns on: with no move under way and
        no mixed machine, the prompt machines' queues against
        ``mixed_threshold_tokens`` and the token machines' free memory against
        ``token_free_threshold``, each only where its pool's move is possible."""
        prompt, token, mixed = _pools(view)
        if self._moving or mixed:
            return None
        queue = {i.id: self.mixed_threshold_tokens for i in prompt} if len(token) > 1 else {}
        free = (
            {i.id: self.token_free_threshold * i.total_blocks for i in token}
            if len(prompt) > 1
            else {}
        )
        return TickWatch(queue, free)

    def _backed_up(self, pool: tuple[InstanceView, ...]) -> bool:
        return all(i.queue_tokens > self.mixed_threshold_tokens for i in pool)

    def _full(self, pool: tuple[InstanceView, ...]) -> bool:
        return all(self._out_of_memory(i) for i in pool)

    def _move(self, inst: InstanceView, role: Role) -> SetRole:
        self._moving[inst.id] = role
        return SetRole(inst.id, role, self.move_cost_s)

    def _out_of_memory(self, inst: InstanceView) -> bool:
        return inst.free_blocks <= self.token_free_threshold * inst.total_blocks


class _OnWay:
    """The requests sent to one token machine whose KV is still expected: the
    time each is expected to land, soonest first (a heap), with its blocks;
    and their blocks in all. Kept as requests are sent and land, so that a
    pick costs the same however many are on their way."""

    __slots__ = ("due", "blocks")

    def __init__(self) -> None:
        self.due: list[tuple[float, int]] = []
        self.blocks = 0

    def add(self, due: float, blocks: int) -> None:
        heapq.heappush(self.due, (due, blocks))
        self.blocks += blocks

    def land(self, now: float) -> bool:
        """Forget those expected by ``now``; whether any is still on its way."""
        due = self.due
        while due and due[0][0] <= now:
            self.blocks -= heapq.heappop(due)[1]
        return bool(due)


def _pools(view: ClusterView) -> tuple[tuple[InstanceView, ...], ...]:
    """The prompt, token and mixed machines that take new work, in id order
    (``view.of_role`` of each role, in one pass)."""
    by: dict[str, list[InstanceView]] = {"prefill": [], "decode": [], "mixed": []}
    for i in view.instances:
        accepting = getattr(i, "accepting", None)  # as ClusterView.up reads it
        if getattr(i, "up", True) if accepting is None else accepting:
            got = by.get(i.role)
            if got is not None:
                got.append(i)
    return tuple(by["prefill"]), tuple(by["decode"]), tuple(by["mixed"])


def _prompt_load(i: InstanceView) -> tuple[int, int, int]:
    """Pending prompt tokens first (JSQ), then requests, then id."""
    return (i.queue_tokens, i.queue_requests + i.running_requests, i.id)


def _token_load(i: InstanceView) -> tuple[int, int, int]:
    """Most free KV memory first, then the least pending work, then id."""
    return (-i.free_blocks, i.running_requests + i.queue_requests, i.id)


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)
