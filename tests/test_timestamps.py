"""Per-request timestamps under preemption: first occurrences, ordered, no negative duration."""

from __future__ import annotations

import math

import pytest
from helpers import small_spec
from hypothesis import given, settings
from hypothesis import strategies as st
from test_disagg import run, split_spec
from test_engine import Auditing, run_engine

from twin.request import Request
from twin.serving.engine import EngineConfig

DURATIONS = (
    "queue_s", "prefill_s", "transfer_wait_s", "transfer_s", "first_decode_s",
    "ttft_s", "tpot_s", "e2e_s", "max_itl_s",
)  # fmt: skip
ORDER = ("arrival_s", "scheduled_s", "prefill_done_s", "first_token_s", "finish_s")


def test_a_recompute_keeps_the_first_prefill_done():
    # The preemption scenario of test_engine: 6 blocks of 4 tokens, two 8-token
    # prompts prefilled together (10 ms + 16 x 0.1 ms = 11.6 ms); request 1 is
    # preempted as request 0 grows and is recomputed later. Its prompt was done,
    # and its first token out, at 11.6 ms, whatever the recompute does.
    cfg = EngineConfig(block_size=4, watermark=0.0)
    reqs = [Request(0, 0.0, 8, 9), Request(1, 0.0, 8, 9)]
    _, done = run_engine(reqs, blocks=6, config=cfg, perf=Auditing())
    victim = next(s for s in done if s.req.id == 1)
    assert victim.preemptions >= 1
    assert victim.t_scheduled == 0.0
    assert victim.t_prefill_done == pytest.approx(0.0116)
    assert victim.t_first_token == pytest.approx(0.0116)
    assert victim.t_prefill_done <= victim.t_first_token <= victim.t_finish


def small_memory(split: bool, fast_forward: bool, handoff: str = "push", mode: str = "serialized"):
    """One (or one prefill + one decode) Llama-3.1-8B on one H100 with ~370 KV
    blocks: long outputs preempt."""
    engine = {"gpu_memory_utilization": 0.22, "fast_forward": fast_forward}
    if not split:
        return small_spec(engine=engine, cluster={"instances": 1, "tp": 1})
    return split_spec(
        engine=engine,
        cluster={"nodes": 1, "prefill": {"instances": 1, "tp": 1},
                 "decode": {"instances": 1, "tp": 1}},
        transfer={"mode": mode, "handoff": handoff},
    )  # fmt: skip


def check_rows(rows: dict, summary: dict) -> None:
    for r in rows.values():
        if r["status"] != "completed":
            continue
        times = [r[k] for k in ORDER]
        assert times == sorted(times), (r["id"], dict(zip(ORDER, times, strict=True)))
        for k in DURATIONS:
            assert r[k] == "" or r[k] >= 0.0, (r["id"], k, r[k])
    for key, value in summary.items():
        if isinstance(value, dict) and "mean" in value and key.endswith("_s"):
            for stat, v in value.items():
                assert v is None or v >= 0.0, (key, stat, v)


def test_preempted_split_requests_keep_ordered_timestamps():
    reqs = [Request(i, 0.02 * i, 200 + 37 * (i % 13), 150 + 23 * (i % 11)) for i in range(60)]
    _, result, rows = run(small_memory(True, True), requests=reqs)
    assert result.summary["preemptions"] > 0
    check_rows(rows, result.summary)
    moved = [r for r in rows.values() if r["transfer_s"] != ""]
    assert moved and all(r["preemptions"] == 0 or r["transfer_s"] >= 0 for r in moved)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 0.02), st.integers(1, 800), st.integers(1, 400)),
             min_size=8, max_size=40),
    st.booleans(),
    st.booleans(),
    st.sampled_from([("push", "serialized"), ("push", "layerwise"), ("pull", "serialized")]),
)  # fmt: skip
def test_timestamps_are_ordered_under_preemption(items, split, fast_forward, transfer):
    t = 0.0
    reqs = []
    for i, (gap, p, o) in enumerate(items):
        t += gap
        reqs.append(Request(i, t, p, o))
    spec = small_memory(split, fast_forward, *transfer)
    _, result, rows = run(spec, requests=reqs)
    assert sorted(rows) == list(range(len(reqs)))
    check_rows(rows, result.summary)
    assert not math.isnan(result.summary["simulated_s"])
