"""One request's life on the instances that serve it: its state and timestamps.

A :class:`Sequence` is what an engine batches, the hand-off moves and the
metrics read when it ends. Times are simulated seconds; ``-1`` means not yet
(or never).
"""

from __future__ import annotations

from twin.request import Request
from twin.scheduler import Objectives

WAITING, PREFILL, DECODE, DONE = "waiting", "prefill", "decode", "done"
# Disaggregated serving: prompt done, KV held here until it has moved (prefill
# side); blocks reserved here, KV on its way (decode side).
HANDOFF, INCOMING = "handoff", "incoming"
# An attempt that ended with its instance (or the instance its KV was bound
# for): the request goes on in a new Sequence, or ends as failed.
LOST = "lost"
NO_OBJECTIVES = Objectives()  # no TTFT or TPOT objective (both infinite)


class Sequence:
    """The life of one request on one instance: its state and timestamps (s).

    A request may run a phase more than once: a preempted sequence is
    recomputed (its prompt and the tokens it had produced are prefilled again,
    on the instance that preempted it), and a request whose instance fails is
    retried (:meth:`retry`), perhaps along another path (colocated after a
    hand-off, or the other way round). Every timestamp keeps its FIRST
    occurrence (DESIGN.md, Conservation), and each is written through
    :meth:`mark`, which holds the one rule: a timestamp is set once, and the
    hand-off's (``t_transfer_start``, ``t_transfer_end``, ``t_decode_start``)
    only on the request's own path: when its token 1 was (or, before it exists,
    is to be) handed off, and before its first decode step. So they stay
    ordered, ``arrival <= scheduled <= prefill_done <= first_token <= finish``
    and ``transfer_end <= decode_start <= first_decode``, and no duration built
    from them is negative:

    - ``t_arrival``: the prefilling instance received it (after any KV-pool load).
    - ``t_scheduled``: first admitted into a batch; a readmission after a
      preemption does not move it.
    - ``t_prefill_done``: the first prompt's last chunk ended (token 1 was
      produced); the recompute of a preempted sequence does not move it.
    - ``t_first_token``: token 1 produced, the same instant as ``t_prefill_done``.
    - ``t_transfer_start`` / ``t_transfer_end``: the KV hand-off began moving
      (a layer-wise stream: one layer into the prefill iteration) / landed.
      A request moves at most once; a recompute happens where it is preempted.
    - ``t_decode_start``: the decode side took the landed request up: the
      start of the first iteration there that produces a token for it (its
      first decode step, or the recompute of one preempted before that step).
    - ``t_first_decode``: the decode side's first decode step for it ended.
    - ``t_finish``: the last token was produced (once).

    A request whose instance fails goes on in a new Sequence (:meth:`retry`),
    which keeps these timestamps and the tokens the client has seen. A
    request whose token 1 was produced where it stays (colocated) has no
    hand-off even if a retry later moves its KV; nor has one whose decode
    steps began before a retry's hand-off (the hand-off is then a relocation,
    not the path of its first tokens). ``moves`` records the path: whether
    its token 1 was produced for a hand-off. A request lost after its KV
    landed and before a token came of it keeps ``landed``: its retry's first
    iteration that produces a token where it stays is its decode start.

    ``t_last_token`` and ``t_attempt`` (when this attempt was dispatched) are
    not phases' timestamps but running values: when the latest token was
    produced, from which the next inter-token gap is measured, and where the
    time an attempt ran before it was lost is measured from.
    """

    __slots__ = (
        "req",
        "slo",
        "state",
        "prefill_len",
        "prefilled",
        "generated",
        "blocks",
        "t_arrival",
        "t_scheduled",
        "t_prefill_done",
        "t_first_token",
        "t_finish",
        "t_last_token",
        "max_gap",
        "preemptions",
        "d_join",
        "g_join",
        "emit",
        "lane",
        "epoch",
        "instance",
        "handoff",
        "prefill_instance",
        "decode_instance",
        "t_transfer_start",
        "t_transfer_end",
        "t_first_decode",
        "t_decode_start",
        "moves",
        "landed",
        "landing_gap",
        "decode_gap",
        "transfer",
        "units",
        "shared_blocks",
        "cached_tokens",
        "preloaded_tokens",
        "tier_tokens",
        "kv_load_s",
        "handoff_costs",
        "kv_moved_bytes",
        "kv_saved_bytes",
        "attempt",
        "t_attempt",
        "lost_tokens",
        "lost_s",
    )

    def __init__(self, req: Request, now: float, slo: Objectives = NO_OBJECTIVES) -> None:
        self.req = req
        # The TTFT and TPOT objectives of the request's class (the run's without
        # classes), as a queue policy reads them (twin.serving.queuepolicy.Queued.slo).
        self.slo = slo
        self.state = WAITING
        self.prefill_len = req.prompt_tokens
        self.prefilled = 0
        self.generated = 0
        self.blocks = 0
        self.t_arrival = -1.0
        self.t_scheduled = -1.0
        self.t_prefill_done = -1.0
        self.t_first_token = -1.0
        self.t_finish = -1.0
        self.t_last_token = -1.0
        self.max_gap = 0.0
        self.preemptions = 0
        self.d_join = 0
        self.g_join = 0
        # Speculative decoding: the tokens emitted after each of its decode steps
        # since d_join (twin.serving.speculative.Speculation.schedule); None: one a step.
        self.emit: list[int] | None = None
        self.lane = 0  # the pipeline micro-batch lane it belongs to (0 without pipelining)
        self.epoch = 0
        self.instance = -1
        # Disaggregated serving: whether the KV moves after the prefill, where,
        # and when (-1 = not yet / never).
        self.handoff = False
        self.prefill_instance = -1
        self.decode_instance: int | None = None
        self.t_transfer_start = -1.0
        self.t_transfer_end = -1.0
        self.t_first_decode = -1.0
        self.t_decode_start = -1.0
        self.moves = False  # its token 1 was produced for a hand-off (set with t_first_token)
        # Set when the KV lands, cleared by the first token the decode side
        # produces for it (its first decode step's, or a recompute's), which
        # records apart the gap since token 1 (across the hand-off) and the
        # gap since the decode side took it up.
        self.landed = False
        self.landing_gap = 0.0
        self.decode_gap = 0.0
        self.transfer: object | None = None
        # Prefix caching: the cached units (hashes) this sequence holds here,
        # their blocks (not in ``blocks``), and the prompt tokens it reused.
        self.units: list[int] = []
        self.shared_blocks = 0
        self.cached_tokens = 0
        self.preloaded_tokens = 0  # prompt tokens whose KV was loaded from a KV pool
        # KV tiers (twin.serving.tiers): prompt tokens loaded back from DRAM and
        # from SSD, and how long the load took (0 when nothing was loaded)
        self.tier_tokens = (0, 0, 0)  # loaded from DRAM, SSD, the remote store
        self.kv_load_s = 0.0
        # The hand-off's fixed costs (a twin.serving.handoff.HandoffCosts), the
        # KV bytes it moved and those the decode side's prefix cache held.
        self.handoff_costs: object | None = None
        self.kv_moved_bytes = 0.0
        self.kv_saved_bytes = 0.0
        # Failures: this attempt's number (1 at the first dispatch), when it was
        # dispatched, and over the attempts lost before it the KV tokens lost
        # and the time they had run.
        self.attempt = 0
        self.t_attempt = now
        self.lost_tokens = 0
        self.lost_s = 0.0

    def retry(self, now: float) -> Sequence:
        """The next attempt of this request, after this one was lost: its first
        timestamps, the tokens already produced (the prompt and they are
        prefilled again, as after a preemption) and its attempt history."""
        s = Sequence(self.req, now, self.slo)
        for name in _KEPT:
            setattr(s, name, getattr(self, name))
        s.prefill_len = self.req.prompt_tokens + self.generated
        return s

    def mark(self, name: str, now: float) -> bool:
        """Timestamp ``name`` (``"t_scheduled"``, ...) is ``now``, if this is
        its first occurrence on the request's path (the class docstring);
        whether it was set."""
        if getattr(self, name) >= 0.0:
            return False  # a repeat (a recompute, a retry): the first stays
        if name in _HANDOFF_TIMES:
            on_path = self.moves if self.t_first_token >= 0.0 else self.handoff
            if not on_path or self.t_first_decode >= 0.0:
                return False
        setattr(self, name, now)
        if name == "t_first_token":
            self.moves = self.handoff
        return True

    @property
    def held_blocks(self) -> int:
        """Blocks whose KV this sequence reads: its own and the cached ones it shares."""
        return self.blocks + self.shared_blocks

    def length_at(self, step: int) -> int:
        """Tokens in the sequence (its KV context) when decode step ``step`` runs."""
        n = step - self.d_join
        return self.prefill_len + 1 + (n if self.emit is None else self.emit[n])

    def decoded(self, steps: int) -> int:
        """Tokens its first ``steps`` decode steps since it joined emit."""
        return steps if self.emit is None else self.emit[steps]


# The hand-off's timestamps: only on a path whose token 1 is handed off (Sequence.mark).
_HANDOFF_TIMES = frozenset(("t_transfer_start", "t_transfer_end", "t_decode_start"))

# What a retry keeps of the attempt before it (Sequence.retry).
_KEPT = (
    "generated", "t_arrival", "t_scheduled", "t_prefill_done", "t_first_token", "t_last_token",
    "max_gap", "preemptions", "t_transfer_start", "t_transfer_end", "t_first_decode",
    "t_decode_start", "moves", "landed", "landing_gap", "decode_gap", "cached_tokens",
    "handoff_costs", "kv_moved_bytes", "kv_saved_bytes", "attempt", "lost_tokens", "lost_s",
)  # fmt: skip
