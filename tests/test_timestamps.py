"""Per-request timestamps under preemption: first occurrences, ordered, no negative duration."""

from __future__ import annotations

import math

import pytest
import simpy
from helpers import small_spec
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_disagg import run, split_spec
from test_engine import Auditing, Linear, observing, run_engine

import schedulers.splitwise  # noqa: F401 - registers the policy when not installed
from twin.request import Request
from twin.serving.engine import Engine, EngineConfig
from twin.serving.kvcache import BlockManager
from twin.serving.sequence import Sequence
from twin.sim.spec import load_spec

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


# Splitwise on 2 DGX H100 nodes: 2 prompt + 1 token machine of Llama-2-7B TP2,
# little KV memory, a 100 ms role change; a machine turns mixed under load,
# so a request may decode where it was prefilled, be lost, and be retried
# through a hand-off (or the other way round).
RETRIED_SPLITWISE = """\
name: retried-splitwise
seed: 936
model: llama-2-7b
cluster:
  topology: dgx-h100-ib400
  nodes: 2
  prefill: {instances: 2, tp: 2}
  decode: {instances: 1, tp: 2}
  placement: packed
transfer: {mode: layerwise, handoff: push}
engine: {gpu_memory_utilization: 0.25}
perf: {kind: roofline, engine: distserve}  # the instants below are its steps'
scheduler: {name: splitwise, move_cost: 100 ms}
workload:
  lengths: azure-conv
  arrival: {process: poisson, rate: 72.0}
  max_requests: 600
events:
  - {at: 3.570 s, action: fail, gpu: 0}
  - {at: 3.654 s, action: recover, gpu: 0}
"""


def retried_splitwise(tmp_path, *overrides: str):
    path = tmp_path / "retried-splitwise.yaml"
    path.write_text(RETRIED_SPLITWISE)
    return load_spec(str(path), overrides)


def fault_events(*faults: tuple[str, int, float, float]) -> str:
    """The ``events`` override: each fault is (kind, which, fail at, recover at)."""
    events = []
    for kind, name, fail, recover in faults:
        events.append(f"{{at: {fail:.3f}, action: fail, {kind}: {name}}}")
        events.append(f"{{at: {recover:.3f}, action: recover, {kind}: {name}}}")
    return f"events=[{', '.join(events)}]"


def retried_row(tmp_path, rid: int, *overrides: str) -> dict:
    """Request ``rid``'s row in retried-splitwise with ``overrides``, every
    completed row's timestamps checked."""
    _, result, rows = run(retried_splitwise(tmp_path, *overrides))
    check_rows(rows, result.summary)
    return rows[rid]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_retry_handed_off_after_decoding_colocated_has_no_hand_off(tmp_path, fast_forward):
    # Request 133 decodes 80 tokens on the mixed machine (token 1 at 2.325 s,
    # its first decode step at 2.339 s) until GPU 0 fails under it; its retry
    # goes through a prompt machine and a hand-off at 11.39 s. The client saw
    # its token 1 at 2.325 s: that is its TTFT, and the later hand-off (a
    # relocation) is not its hand-off: no transfer, no first_decode_s of
    # -9 s from attempt 1's first decode step against attempt 2's landing.
    spec = retried_splitwise(tmp_path, f"engine.fast_forward={str(fast_forward).lower()}")
    _, result, rows = run(spec)
    r = rows[133]
    assert r["status"] == "completed" and r["attempts"] == 2
    assert r["prefill_instance"] == 1 and r["decode_instance"] == 2  # attempt 2 moved
    assert r["first_token_s"] == r["prefill_done_s"] == pytest.approx(2.3248630)
    assert r["ttft_s"] == pytest.approx(2.3248630 - r["arrival_s"])
    assert r["transfer_s"] == r["first_decode_s"] == r["kv_bytes_moved"] == ""
    assert result.summary["retries"] > 0
    check_rows(rows, result.summary)


def test_a_retry_of_a_request_landed_but_not_taken_up_starts_where_it_decodes(tmp_path):
    # Request 124's KV lands on the mixed machine (1.977 s), whose node fails
    # (1.979 s) before it is taken up; once the node is back (2.558 s) the
    # retry decodes it colocated on the same machine (and a third attempt
    # after the node's second failure). The client's token 1 comes with the
    # retry's first iteration (2.929 s): its decode start, not -1 (a TTFT of
    # -2.9 s before).
    events = fault_events(("node", 0, 1.979, 2.558), ("node", 0, 3.808, 5.275))
    r = retried_row(
        tmp_path, 124, "seed=12", events, "transfer.mode=serialized", "workload.max_requests=300"
    )
    assert r["status"] == "completed" and r["attempts"] == 3
    assert r["transfer_s"] != ""  # its first attempt's hand-off is its own
    assert r["prefill_done_s"] + r["transfer_s"] <= r["first_token_s"] <= r["finish_s"]
    assert r["first_token_s"] == pytest.approx(2.9293048)  # the retry's, after node 0 is back


def test_a_landed_request_recomputed_for_another_hand_off_starts_where_it_decodes(tmp_path):
    # Request 90's KV lands on the mixed machine (instance 0, 1.408 s), whose
    # GPU 0 fails (1.422 s) before it is taken up. Its retry recomputes token
    # 2 on prompt machine 1 for another hand-off (1.878 s) and is lost with
    # GPU 2 (2.0 s) before that moves; the third attempt decodes colocated on
    # instance 0, back since 2.422 s. The recompute for a hand-off is not where
    # it stays: its decode start is the third attempt's first iteration
    # (3.050 s), not -1, and the 0.47 s from token 1 to the recompute's token,
    # both before the decode side took it up, is no gap the client sees.
    events = fault_events(("gpu", 2, 2.0, 3.0), ("gpu", 0, 1.422, 2.422))
    r = retried_row(
        tmp_path, 90, "seed=65535", events, "engine.fast_forward=false", "workload.max_requests=120"
    )
    assert r["status"] == "completed" and r["attempts"] == 3
    assert r["prefill_instance"] == r["decode_instance"] == 0
    assert r["prefill_done_s"] == pytest.approx(1.4066406)  # token 1, on prompt machine 1
    assert r["transfer_s"] == pytest.approx(0.0010406112)  # its first attempt's hand-off is its own
    assert r["first_token_s"] == pytest.approx(3.0501906)
    assert r["ttft_s"] == pytest.approx(3.0501906 - r["arrival_s"])
    assert r["max_itl_s"] == pytest.approx(0.1323848)  # its first decode step after the recompute


class KeptHere:
    """Hand-off hooks that pick the prefilling instance (a prompt machine turned
    mixed) to decode each prompt as it starts, as the push hand-off does: the
    KV stays."""

    def on_prefill_start(self, engine, seq, dt):
        seq.handoff = False

    def on_prefilled(self, engine, seq):
        raise AssertionError(f"request {seq.req.id} is handed off")

    def on_blocks_freed(self, engine):
        pass


def test_a_landed_retry_kept_where_it_is_prefilled_starts_decoding_there():
    # Attempt 1 handed token 1 (0.1 s) off; its KV landed (0.2 s) on an
    # instance that failed before taking it up. The retry, bound for another
    # hand-off, recomputes the 8-token prompt and token 1 (10 ms + 9 x 0.1 ms)
    # on a prompt machine that picks itself to decode it as the iteration
    # starts (1.0 s): that iteration is its decode start, where the client
    # sees token 1 (not -1), and its decode steps (11 ms) follow.
    env = simpy.Environment()
    done: list[Sequence] = []
    config = EngineConfig(block_size=4)
    eng = Engine(env, 0, Linear(), BlockManager(100, 4), config, observing(done), hooks=KeptHere())
    lost = Sequence(Request(0, 0.0, 8, 4), 0.0)
    lost.handoff = True
    for name, t in (
        ("t_arrival", 0.0),
        ("t_scheduled", 0.0),
        ("t_transfer_start", 0.05),
        ("t_prefill_done", 0.1),
        ("t_first_token", 0.1),
        ("t_transfer_end", 0.2),
    ):
        assert lost.mark(name, t)
    lost.generated, lost.t_last_token, lost.landed = 1, 0.1, True
    retry = lost.retry(1.0)
    retry.handoff = True
    env.run(until=1.0)
    eng.submit(retry)
    env.run()
    assert done == [retry] and retry.t_finish == pytest.approx(1.0329)
    assert retry.t_decode_start == 1.0
    assert retry.t_first_decode == pytest.approx(1.0219)
    assert retry.decode_gap == pytest.approx(0.0109)  # the recompute, from the decode start
    assert not retry.landed


_FAULT = st.tuples(
    st.floats(0.5, 6.0), st.sampled_from(["gpu", "instance", "node"]), st.integers(0, 5),
    st.floats(0.01, 1.5),
)  # fmt: skip


@settings(max_examples=6, deadline=None)
@given(
    st.lists(_FAULT, min_size=1, max_size=4),
    st.sampled_from([("push", "layerwise"), ("push", "serialized"), ("pull", "serialized")]),
    st.booleans(),
    st.integers(0, 2**16),
)
@example(  # request 90: landed, lost, recomputed for another hand-off, lost, then colocated
    faults=[(2.0, "gpu", 2, 1.0), (1.421875, "gpu", 0, 1.0)],
    transfer=("push", "layerwise"),
    fast_forward=False,
    seed=65535,
)
def test_retried_requests_keep_ordered_timestamps_on_every_path(
    tmp_path_factory, faults, transfer, fast_forward, seed
):
    # Failures and repairs under splitwise's mixed machines: requests are
    # retried colocated after a hand-off and through one after decoding.
    events = fault_events(
        *((target, k % {"gpu": 6, "instance": 3, "node": 1}[target], t, t + repair)
          for t, target, k, repair in faults)
    )  # fmt: skip
    spec = retried_splitwise(
        tmp_path_factory.mktemp("spec"), f"seed={seed}", events,
        f"transfer.handoff={transfer[0]}", f"transfer.mode={transfer[1]}",
        f"engine.fast_forward={str(fast_forward).lower()}", "workload.max_requests=200",
    )  # fmt: skip
    _, result, rows = run(spec)
    assert len(rows) == 200
    check_rows(rows, result.summary)


def test_a_timestamp_is_marked_once_and_a_hand_off_only_on_the_path_of_token_1():
    def seq(handoff: bool) -> Sequence:
        s = Sequence(Request(0, 0.0, 10, 5), 0.0)
        s.handoff = handoff
        return s

    s = seq(True)
    assert s.mark("t_transfer_start", 0.5)  # a layer-wise stream, before token 1
    assert s.mark("t_first_token", 1.0) and s.moves
    assert not s.mark("t_first_token", 2.0) and s.t_first_token == 1.0  # a recompute's
    assert s.mark("t_transfer_end", 1.5) and not s.mark("t_transfer_end", 3.0)
    assert s.t_transfer_end == 1.5
    # token 1 produced colocated: a retry's hand-off is a relocation
    s = seq(False)
    s.mark("t_first_token", 1.0)
    r = s.retry(2.0)
    r.handoff = True
    assert not r.moves and not r.mark("t_transfer_start", 3.0) and r.t_transfer_start == -1.0
    # handed off, but decoded where it was (its decode side failed) before a retry moved it
    s = seq(True)
    s.mark("t_first_token", 1.0)
    s.handoff = False
    s.mark("t_first_decode", 1.2)
    r = s.retry(2.0)
    r.handoff = True
    assert not r.mark("t_transfer_end", 3.0) and not r.mark("t_decode_start", 3.1)
