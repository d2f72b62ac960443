"""Per-request latencies folded into streaming summaries.

TTFT, TPOT, E2E and tail inter-token latency per DESIGN.md. Requests are
folded in as they end and then dropped, so memory does not grow with the
trace: a :class:`Distribution` keeps exact values (8 bytes each, in a flat
array) up to ``exact_limit`` and then folds them into logarithmic buckets of
relative width 0.2% (quantiles then are within 0.1% of the exact ones; count,
mean, min and max stay exact). Per-request rows go to ``on_row`` as requests
end (``twin run --requests-csv`` writes each to the file at once).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from twin._declare import FRACTION, choice, declared, seconds
from twin.request import Request
from twin.serving.observer import InstanceInfo, Observer, Outcome
from twin.serving.sequence import Sequence
from twin.sim.distribution import QUANTILES, Distribution
from twin.sim.slowdown import SLOWDOWN, Slowdown, SlowdownJudge

if TYPE_CHECKING:
    from twin.net.topology import Topology
    from twin.sim.timeline import Timeline

__all__ = ["QUANTILES", "REQUEST_COLUMNS", "SLO", "Distribution", "Metrics"]

TTFT_AT = ("decode", "prefill")


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency objectives (the spec's ``slo:``): a request meets its SLO when
    TTFT <= ``ttft_s`` and TPOT <= ``tpot_s``; ``target`` is the attainment
    goodput is judged against; ``ttft_at`` is where a split deployment's TTFT
    ends (DESIGN.md); ``slowdown``: bounds on percentiles of each request's
    latencies over its own unloaded ones (:mod:`twin.sim.slowdown`), judged
    over the run besides the attainment."""

    ttft_s: float = declared(
        None, seconds(), "time to first token (default: none)", key="ttft", unset=math.inf
    )
    tpot_s: float = declared(
        None, seconds(), "time per output token (default: none)", key="tpot", unset=math.inf
    )
    target: float = declared(0.9, FRACTION, "attainment that counts as meeting the SLO", keep=False)
    ttft_at: str = declared(
        "decode", choice(*TTFT_AT), "decode | prefill: where a split deployment's TTFT ends"
    )
    slowdown: Slowdown | None = declared(
        None, SLOWDOWN, "slowdown bounds per percentile against an unloaded reference "
        "instance ({gpu, tp, ttft, tbt, e2e}; twin.sim.slowdown)", nullable=True,
    )  # fmt: skip
    # The client's share of what it measures (HTTP round trip, tokenising the
    # prompt and the streamed text): added to TTFT and E2E (DESIGN.md, TTFT).
    # Default 0, the serving side alone: the measured runs at hand record
    # client-side TTFT and E2E only, with no server-side instant to tell the
    # client's share apart; give a figure measured on the user's own setup.
    client_latency_s: float = declared(
        "0 s", seconds(positive=False), "client-side latency added to TTFT and E2E",
        key="client_latency",
    )  # fmt: skip


REQUEST_COLUMNS = (
    "id",
    "status",
    "reason",
    "instance",
    "prefill_instance",
    "decode_instance",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "scheduled_s",
    "prefill_done_s",
    "first_token_s",
    "finish_s",
    "queue_s",
    "prefill_s",
    "transfer_wait_s",
    "transfer_s",
    "handoff_control_s",
    "handoff_registration_s",
    "handoff_descriptors_s",
    "handoff_router_s",
    "kv_bytes_moved",
    "kv_bytes_saved",
    "first_decode_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "max_itl_s",
    "preemptions",
    "slo_met",
    "attempts",
    "lost_tokens",
    "time_lost_s",
    # where the reused prompt tokens came from (KV tiers, KV pool) and how long
    # loading them back took
    "hbm_hit_tokens",
    "dram_hit_tokens",
    "ssd_hit_tokens",
    "pool_hit_tokens",
    "kv_load_s",
)


CLASS_COLUMN = "class"  # after REQUEST_COLUMNS, in a run with classes of traffic only
MODEL_COLUMN = "model"  # after those, in a run of several models only (models:)


def request_columns(classes: bool = False, models: bool = False) -> tuple[str, ...]:
    """The per-request columns of a run: :data:`REQUEST_COLUMNS`, then the
    request's class of traffic when the workload has ``classes``, then its
    model when the spec has several (``models``)."""
    extra = ((CLASS_COLUMN,) if classes else ()) + ((MODEL_COLUMN,) if models else ())
    return (*REQUEST_COLUMNS, *extra)


class Metrics(Observer):
    """Folds ended requests into summaries; optionally streams one row each to
    ``on_row`` (a dict keyed by :data:`REQUEST_COLUMNS`).

    The client sees exactly ``output_tokens`` tokens. TTFT is arrival -> the
    instant it sees token 1; TPOT is the mean gap between consecutive tokens
    it sees, (last seen - first seen) / (output_tokens - 1) (none for one
    token); max ITL is the largest of those gaps. The token timeline:

    - Colocated: token 1 comes out when the prompt is done
      (``t_first_token``), each later one at the end of the decode step (or
      recompute) that produces it; the client sees each as it is produced.
    - Split, push or pull alike: token 1 is produced by the prefill side at
      ``t_prefill_done`` and travels with the KV; the decode side's first
      step, which takes the landed request up at ``t_decode_start``, produces
      token 2, and each later step one more.

    ``ttft_at`` is where a split deployment's TTFT ends (DESIGN.md, TTFT): at
    ``prefill`` the prefill side streams token 1 at once, so TTFT excludes the
    hand-off and the gap from token 1 to token 2 (across the hand-off) is an
    inter-token gap. At ``decode`` the decode side releases token 1 when it
    takes the request up, at the start of its first decode step: TTFT includes
    the KV transfer and the wait for that step, and token 2 follows one step
    later, so the gaps the client sees are decode steps (and recompute stalls),
    never the hand-off. (Seeing tokens 1 and 2 together at that step's end
    would count a zero gap: TPOT 0 for a 2-token request.) The engines record
    the instants; the rule is applied here, and only here.

    ``timeline`` (a :class:`~twin.sim.timeline.Timeline`), when given, gets the
    same requests and the instances' changes, window by window.

    ``classes`` (name -> SLO, for a workload with classes of traffic): each
    request is judged against its class's SLO, and its row names its class."""

    def __init__(
        self,
        slo: SLO,
        on_row: Callable[[dict[str, Any]], None] | None = None,
        ttft_at: str = "decode",
        timeline: Timeline | None = None,
        faults: bool = False,
        scales: Seq[tuple[float, float]] = (),
        classes: Mapping[str, SLO] | None = None,
        slowdown: SlowdownJudge | None = None,
    ) -> None:
        self.slo = slo
        self.slowdown = slowdown
        self.classes = classes
        # SLO attainment counted again with TTFT and TPOT scaled by each
        # (TTFT factor, TPOT factor) pair (twin.sim.intervals)
        self.scales = tuple(scales)
        self.scaled_met = [0] * len(self.scales)
        self.timeline = timeline
        self.faults = faults
        self.on_row = on_row
        self.ttft_at_decode = ttft_at == "decode"
        self.completed = 0
        self.rejected = 0
        self.reject_reasons: Counter[str] = Counter()
        self.failed = 0
        self.fail_reasons: Counter[str] = Counter()
        self.retries = 0  # attempts after the first, of requests that ended
        self.lost_tokens = 0
        self.slo_met = 0
        self.ttft_met = 0
        self.tpot_met = 0
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.reused_tokens = 0  # prompt tokens whose KV came from a prefix cache or pool
        self.wasted_prefill_tokens = 0  # prompt tokens computed for requests that missed
        self.preemptions = 0
        self.truncated = 0  # requests served cut to the context (engine.oversized: truncate)
        self.last_end_s = 0.0
        self.ttft = Distribution()
        self.tpot = Distribution()
        self.e2e = Distribution()
        self.queue = Distribution()
        self.itl_max = Distribution()
        self.transfer = Distribution()

    @property
    def ended(self) -> int:
        return self.completed + self.rejected + self.failed

    def run_started(
        self, name: str, instances: Seq[InstanceInfo], topology: Topology | None
    ) -> None:
        if self.timeline is not None:
            self.timeline.start(instances)

    def role_changed(self, now: float, instance: int, old: str, new: str) -> None:
        if self.timeline is not None:
            self.timeline.role_changed(now, instance, new)

    def instance_up(self, now: float, instance: int, info: InstanceInfo | None = None) -> None:
        if self.timeline is not None:
            self.timeline.instance_up(now, instance, info)

    def instance_down(self, now: float, instance: int) -> None:
        if self.timeline is not None:
            self.timeline.instance_down(now, instance)

    def request_arrived(self, now: float, req: Request) -> None:
        if self.timeline is not None:
            self.timeline.arrived(req.arrival_s)

    def timeline_rows(self) -> list[dict[str, Any]]:
        """The timeline's rows up to the last request's end ([] without one)."""
        return self.timeline.rows(self.last_end_s) if self.timeline is not None else []

    def request_ended(
        self, now: float, instance: int, req: Request, seq: Sequence | None, outcome: Outcome,
        reason: str,
    ) -> None:  # fmt: skip
        if outcome == "completed":
            assert seq is not None
            self.complete(seq)
        elif outcome == "failed":
            assert seq is not None
            self.fail(seq, reason, now)
        else:
            self.reject(req, reason, now, outcome)

    def complete(self, s: Sequence) -> None:
        req = s.req
        moved = s.t_transfer_end >= 0.0
        if moved and self.ttft_at_decode:
            first, max_gap = s.t_decode_start, max(s.max_gap, s.decode_gap)
        else:
            first, max_gap = s.t_first_token, max(s.max_gap, s.landing_gap)
        slo = self.slo if self.classes is None else self.classes[req.traffic_class]
        client = slo.client_latency_s
        ttft = first - req.arrival_s + client
        e2e = s.t_finish - req.arrival_s + client
        queue = s.t_scheduled - req.arrival_s
        tpot: float | None = None
        if req.output_tokens > 1:
            tpot = (s.t_finish - first) / (req.output_tokens - 1)
            self.tpot.add(tpot)
            self.itl_max.add(max_gap)
        self.ttft.add(ttft)
        self.e2e.add(e2e)
        self.queue.add(queue)
        if self.slowdown is not None:
            self.slowdown.add(req.prompt_tokens, req.output_tokens, ttft, tpot, e2e)
        transfer: float | None = None
        if moved:
            # What the hand-off adds after the prompt is done (a layer-wise
            # stream overlaps the prefill; only its residual shows).
            sent_from = max(s.t_transfer_start, s.t_prefill_done)
            transfer = s.t_transfer_end - sent_from
            self.transfer.add(transfer)
        ttft_ok = ttft <= slo.ttft_s
        tpot_ok = tpot is None or tpot <= slo.tpot_s
        self.completed += 1
        self.ttft_met += ttft_ok
        self.tpot_met += tpot_ok
        self.slo_met += ttft_ok and tpot_ok
        for i, (ft, fp) in enumerate(self.scales):
            self.scaled_met[i] += _within(ttft, ft, slo.ttft_s) and (
                tpot is None or _within(tpot, fp, slo.tpot_s)
            )
        self.output_tokens += req.output_tokens
        self.prompt_tokens += req.prompt_tokens
        self.reused_tokens += s.cached_tokens
        if not (ttft_ok and tpot_ok):
            self.wasted_prefill_tokens += req.prompt_tokens - s.cached_tokens
        if s.t_finish > self.last_end_s:
            self.last_end_s = s.t_finish
        if self.timeline is not None:
            self.timeline.completed(
                req.arrival_s, s.t_finish, ttft, tpot, ttft_ok and tpot_ok, s.t_scheduled,
                s.t_transfer_end, s.t_decode_start, transfer,
            )  # fmt: skip
        if self.on_row is not None:
            costs: Any = s.handoff_costs if moved else None
            self.on_row(
                {
                    "id": req.id,
                    "status": "completed",
                    "reason": "",
                    "instance": s.instance,
                    "prefill_instance": s.prefill_instance,
                    "decode_instance": s.instance,
                    "arrival_s": req.arrival_s,
                    "prompt_tokens": req.prompt_tokens,
                    "output_tokens": req.output_tokens,
                    "scheduled_s": s.t_scheduled,
                    "prefill_done_s": s.t_prefill_done,
                    "first_token_s": first,
                    "finish_s": s.t_finish,
                    "queue_s": queue,
                    "prefill_s": s.t_prefill_done - s.t_scheduled,
                    "transfer_wait_s": max(0.0, s.t_transfer_start - s.t_prefill_done)
                    if moved
                    else "",
                    "transfer_s": "" if transfer is None else transfer,
                    # The hand-off's fixed parts as charged (a layer-wise stream
                    # hides its control round trip and registration behind the
                    # prefill's first layer when they are shorter), and its bytes.
                    "handoff_control_s": "" if costs is None else costs.control_s,
                    "handoff_registration_s": "" if costs is None else costs.registration_s,
                    "handoff_descriptors_s": "" if costs is None else costs.descriptors_s,
                    "handoff_router_s": "" if costs is None else costs.router_s,
                    "kv_bytes_moved": s.kv_moved_bytes if moved else "",
                    "kv_bytes_saved": s.kv_saved_bytes if moved else "",
                    "first_decode_s": s.t_first_decode - s.t_transfer_end
                    if moved and s.t_first_decode >= 0
                    else "",
                    "ttft_s": ttft,
                    "tpot_s": "" if tpot is None else tpot,
                    "e2e_s": e2e,
                    "max_itl_s": max_gap if req.output_tokens > 1 else "",
                    "preemptions": s.preemptions,
                    "slo_met": int(ttft_ok and tpot_ok),
                    "attempts": s.attempt,
                    "lost_tokens": s.lost_tokens,
                    "time_lost_s": s.lost_s,
                    **_hit_cells(s),
                    **self._class_cell(req),
                }
            )
        self._tally(s)

    def _tally(self, s: Sequence) -> None:
        """What a request that ran adds to the totals, completed or failed:
        its retries, the KV tokens its lost attempts held, its preemptions."""
        self.retries += max(0, s.attempt - 1)
        self.lost_tokens += s.lost_tokens
        self.preemptions += s.preemptions

    def fail(self, s: Sequence, reason: str, now: float) -> None:
        """``s``'s request ended failed: its instance failed under it and it
        was not (or could no more be) retried."""
        self.failed += 1
        self.fail_reasons[reason] += 1
        self._tally(s)
        self._unserved(
            s.req, "failed", reason, now, "failed",
            preemptions=s.preemptions, attempts=s.attempt, lost_tokens=s.lost_tokens,
            time_lost_s=s.lost_s,
        )  # fmt: skip

    def reject(self, req: Request, reason: str, now: float, outcome: str = "rejected") -> None:
        self.rejected += 1
        self.reject_reasons[reason] += 1
        self._unserved(
            req, "rejected", reason, now, outcome,
            preemptions=0, attempts=0, lost_tokens=0, time_lost_s=0.0,
        )  # fmt: skip

    def _unserved(
        self, req: Request, status: str, reason: str, now: float, outcome: str, **counts: Any
    ) -> None:
        """The end of a request that did not complete: the run's end, the
        timeline and its row (``counts``: its preemptions and attempt history)."""
        if now > self.last_end_s:
            self.last_end_s = now
        if self.timeline is not None:
            self.timeline.ended(req.arrival_s, now, outcome)
        if self.on_row is not None:
            row: dict[str, Any] = dict.fromkeys(REQUEST_COLUMNS, "")
            row.update(self._class_cell(req))
            row.update(
                id=req.id,
                status=status,
                reason=reason,
                arrival_s=req.arrival_s,
                prompt_tokens=req.prompt_tokens,
                output_tokens=req.output_tokens,
                slo_met=0,
                **counts,
            )
            self.on_row(row)

    def _class_cell(self, req: Request) -> dict[str, str]:
        """The row's class column, in a run with classes, and its model
        column, in a run of several models (none without)."""
        cells = {} if self.classes is None else {CLASS_COLUMN: req.traffic_class}
        if req.model:
            cells[MODEL_COLUMN] = req.model
        return cells

    def summary(self) -> dict[str, Any]:
        """The stable summary keys (DESIGN.md; other tools read them)."""
        n = self.ended
        span = self.last_end_s
        out = {
            "requests": n,
            "completed": self.completed,
            "rejected": self.rejected,
            "rejected_by_reason": dict(sorted(self.reject_reasons.items())),
            "ttft_s": self.ttft.summary(),
            "tpot_s": self.tpot.summary(),
            "e2e_s": self.e2e.summary(),
            "queue_s": self.queue.summary(),
            "max_itl_s": self.itl_max.summary(),
            "transfer_s": self.transfer.summary(),
            "slo_attainment": self.slo_met / n if n else None,
            "ttft_attainment": self.ttft_met / n if n else None,
            "tpot_attainment": self.tpot_met / n if n else None,
            "throughput_rps": self.completed / span if span > 0 else None,
            "output_tokens_per_s": self.output_tokens / span if span > 0 else None,
            "simulated_s": span,
            "preemptions": self.preemptions,
            "prefix_hit_rate": self.reused_tokens / self.prompt_tokens
            if self.prompt_tokens
            else None,
            "wasted_prefill_tokens": self.wasted_prefill_tokens,
            "truncated": self.truncated,
        } | (self.fault_summary() if self.faults else {})
        if self.slowdown is not None:
            out["slowdown"] = self.slowdown.summary()
        return out

    def scaled_attainment(self) -> list[float]:
        """The SLO attainment at each of :attr:`scales` (rejected requests miss);
        none when no request ended."""
        n = self.ended
        return [met / n for met in self.scaled_met] if n else []

    def fault_summary(self) -> dict[str, Any]:
        """The keys of a run with an ``events:`` timeline (left out without one,
        so that such a run reads as before)."""
        return {
            "failed": self.failed,
            "failed_by_reason": dict(sorted(self.fail_reasons.items())),
            "retries": self.retries,
            "lost_tokens": self.lost_tokens,
        }


def _within(x: float, factor: float, limit: float) -> bool:
    """Whether ``x`` scaled by ``factor`` (possibly infinite) meets ``limit``."""
    return limit == math.inf or x * factor <= limit


def _hit_cells(s: Any) -> dict[str, Any]:
    """The requests CSV's hit columns of a completed sequence: its reused
    prompt tokens split by where they came from. Tokens loaded from a KV pool
    (Mooncake's store, or the KV tiers' remote store) or from the lower KV
    tiers are counted as such; the rest
    of the reuse was in the instance's HBM prefix cache."""
    dram, ssd, remote = s.tier_tokens
    lower = dram + ssd
    # a KV tier's remote store is a pool too
    pool = remote if lower or remote else min(s.preloaded_tokens, s.cached_tokens)
    return {
        "hbm_hit_tokens": max(0, s.cached_tokens - lower - pool),
        "dram_hit_tokens": dram,
        "ssd_hit_tokens": ssd,
        "pool_hit_tokens": pool,
        "kv_load_s": s.kv_load_s,
    }
