"""Fast-forward against stepping: the perf models' stretch pricing, and whole runs."""

from __future__ import annotations

import json

import pytest
import simpy
from helpers import small_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_disagg import split_spec
from test_engine import QUEUE_POLICIES, Linear, largest_relative_difference

from twin._clock import Arrival
from twin.perf.gpus import get_gpu
from twin.perf.iteration import VECTOR_STEPS, Batch, decode_steps
from twin.perf.llm import get_model
from twin.perf.roofline import Roofline
from twin.perf.tables import DistServeFit, ProfileTable
from twin.request import Request
from twin.serving.abandon import abandon
from twin.serving.engine import Engine, EngineConfig
from twin.serving.fastforward import FastForward
from twin.serving.kvcache import BlockManager
from twin.serving.observer import Observer
from twin.serving.sequence import Sequence
from twin.sim.simulation import Simulation

H100 = get_gpu("h100-sxm")
A100 = get_gpu("a100-80gb")


def table() -> ProfileTable:
    """A small measured-looking table: decode rows for batch 1, 8 and 32 (the
    last two extrapolated past), contexts 128 to 4,096 (clamped outside)."""
    decode = {
        (b, c): 0.006 + 1e-4 * b + 2e-7 * b * c for b in (1, 8, 32) for c in (128, 1024, 4096)
    }
    prefill = {(1, p): 0.01 + 6e-5 * p for p in (128, 1024, 8192)}
    return ProfileTable("profile:test", None, prefill, decode)


def fit(pp: int = 1) -> DistServeFit:
    """DistServe's formula with round coefficients (ms), its overheads and ``pp`` stages."""
    return DistServeFit("distserve:test", None, (5.0, 0.05, 1e-6), (8.0, 2e-4, 0.1),
                        (9.0, 1.5e-4, 0.08), 24, pp=pp, overhead_s=2e-3,
                        token_overhead_s=1e-7, prefill_overhead_s=1e-3)  # fmt: skip


MODELS = {
    "roofline": lambda: Roofline(get_model("llama-3.1-8b"), H100, 1),
    "roofline-70b-tp8-pp2": lambda: Roofline(get_model("llama-2-70b"), A100, 8, 2),
    "roofline-throttled": lambda: Roofline(get_model("llama-2-70b"), H100, 8, throttle_knee_s=0.0),
    "roofline-splitwise": lambda: Roofline(
        get_model("llama-2-70b"), A100, 4, engine="splitwise-sim", no_overlap=0.4
    ),
    "profile": table,
    "distserve": fit,
    "distserve-pp4": lambda: fit(4),
    "linear": lambda: Linear(per_context=1e-6),  # no decode_steps of its own
}


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(MODELS)),
    count=st.integers(1, 300),
    mean_ctx=st.integers(1, 6000),
    n=st.sampled_from([1, 2, 7, VECTOR_STEPS - 1, VECTOR_STEPS, 300]),
)
def test_a_stretch_is_priced_to_the_last_bit_as_step_by_step(name, count, mean_ctx, n):
    perf = MODELS[name]()
    ctx = count * mean_ctx
    got = decode_steps(perf)(count, ctx, n)
    want = [perf.iteration_time(Batch((), count, ctx + k * count)) for k in range(n)]
    assert isinstance(got, list) and all(type(x) is float for x in got)
    assert got == want


# how a split cluster moves KV: (transfer.mode, transfer.handoff)
HANDOFFS = [("serialized", "push"), ("serialized", "pull"), ("layerwise", "push")]


@st.composite
def runs(draw, policy: str | None = None):
    """A small cluster, colocated or split (KV pushed or pulled, serialized or
    layer-wise), under a random fault timeline, at loads up to one that
    queues (30 req/s; with 4 running slots a sequence, or a prefix cache,
    hand-offs wait on the decode side for the blocks a finish frees), its
    instances admitting in the order of queue ``policy`` (drawn when None)."""
    layout = draw(st.sampled_from(["colocated", "split", "splitwise"]))
    engine = {
        "chunked_prefill": draw(st.booleans()),
        "gpu_memory_utilization": draw(st.sampled_from([0.22, 0.9])),  # 0.22: preemptions
        "queue_policy": policy or draw(st.sampled_from(QUEUE_POLICIES)),
        "max_num_seqs": draw(st.sampled_from([4, 256])),
        "prefix_caching": draw(st.booleans()),
    }
    rate = draw(st.sampled_from([2.0, 8.0, 30.0]))
    workload = {
        "lengths": "azure-conv",
        "arrival": {"process": "gamma", "rate": rate, "cv": 2},
        "max_requests": draw(st.integers(5, 60)),
        "priority": {0: 1, 1: 1, 2: 1},
    }
    timeout = draw(st.sampled_from([None, 0.2, 0.7, 2.0]))  # clients that give up
    if timeout is not None:
        workload["timeout"] = timeout
    events = []
    for _ in range(draw(st.integers(0, 3))):
        action = draw(st.sampled_from(["fail", "recover", "degrade", "restore"]))
        e = {"at": draw(st.sampled_from([0.3, 1.1, 2.5, 4.0])), "action": action,
             "instance": draw(st.integers(0, 1))}  # fmt: skip
        if action == "degrade":
            e["factor"] = draw(st.sampled_from([0.25, 0.5]))
        events.append(e)
    events.sort(key=lambda e: e["at"])
    over = {"engine": engine, "workload": workload, "events": events}
    if layout == "colocated":
        routing = draw(st.sampled_from(["least_loaded", "round_robin"]))
        data = {"cluster": {"instances": 2, "tp": 1}, "seed": draw(st.integers(0, 3)),
                "scheduler": {"name": "colocated", "routing": routing}}  # fmt: skip
        return "colocated", data | over
    cluster = {
        "nodes": 1,
        "prefill": {"instances": 1, "tp": 1},
        "decode": {"instances": 1, "tp": 1},
    }
    sched = "disagg" if layout == "split" else "splitwise"
    mode, handoff = draw(st.sampled_from(HANDOFFS))
    transfer = {"mode": mode, "handoff": handoff}
    return "split", {"cluster": cluster, "scheduler": sched, "transfer": transfer} | over


def outcome(kind: str, data: dict, ff: bool, perf=None):
    data = json.loads(json.dumps(data))
    data["engine"]["fast_forward"] = ff
    spec = small_spec(**data) if kind == "colocated" else split_spec(**data)
    rows: list[dict] = []
    sim = Simulation(spec, on_row=rows.append, perf=perf)
    res = sim.run().to_dict()
    del res["header"]  # the resolved spec, which names fast_forward
    return {"result": res, "rows": sorted(rows, key=lambda r: r["id"])}, sim.events


@pytest.mark.parametrize("policy", QUEUE_POLICIES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), model=st.sampled_from(["spec", "profile", "distserve"]))
def test_whole_runs_fast_forwarded_are_those_stepped(policy, data, model):
    """Every timestamp, counter and summary of a run, colocated or split, with
    preemptions, chunked prefill, failures, throttled GPUs and client time-outs,
    is the same to the last bit with fast-forward as stepping, under each queue
    policy."""
    kind, data = data.draw(runs(policy))
    perf = {"spec": None, "profile": table(), "distserve": fit()}[model]
    stepped, n_stepped = outcome(kind, data, False, perf)
    jumped, n_jumped = outcome(kind, data, True, perf)
    worst, where = largest_relative_difference(jumped, stepped)
    assert worst == 0.0, f"largest relative difference {worst:.3g} at {where}"
    assert jumped == stepped
    assert n_jumped <= n_stepped


def test_a_cut_stretch_leaves_no_stale_event():
    """An arrival in the middle of a stretch moves the stretch's one event to the
    end of the step in progress: every event popped does something."""
    env = simpy.Environment()
    # Linear: prefill 10 ms + 0.1 ms/token; a decode step 10 ms + 1 ms/sequence.
    eng = Engine(env, 0, Linear(), BlockManager(1000, 16), EngineConfig(), Observer())
    reqs = [Request(0, 0.0, 100, 50), Request(1, 0.1055, 100, 3)]

    def arrive():
        for r in reqs:
            yield Arrival(env, r.arrival_s - env.now)
            eng.submit(Sequence(r, env.now))

    env.process(arrive())
    popped: list[float] = []
    while env.peek() < float("inf"):
        popped.append(env.peek())
        env.step()
    # t=0: the two processes start, r0 arrives, the idle engine wakes. One
    # stretch covers r0's prompt (to 0.02) and its 49 decode steps of 11 ms; r1
    # arrives at 0.1055 (its process ends there) in the step 0.097-0.108, which
    # the stretch's event is moved to. One stretch covers r1's prompt (to 0.128)
    # and two 12 ms steps of both, ending with r1's finish at 0.152; r0's last
    # 39 steps end at 0.581.
    want = [0.0] * 4 + [0.1055, 0.1055, 0.108, 0.152, 0.581]
    assert popped == pytest.approx(want, abs=1e-12)
    assert eng.iterations == 2 + 49  # two prompts; r1 rides in two of r0's steps


def test_a_cut_stretch_reads_as_stepping_until_its_step_ends():
    """An arrival cuts a stretch without applying its steps (they are applied
    when the step in progress ends); a reader that syncs in between, at the
    arrival's instant or later in the step, sees what stepping shows."""

    def readings(ff: bool) -> list[tuple]:
        env = simpy.Environment()
        eng = Engine(env, 0, Linear(), BlockManager(1000, 16), EngineConfig(fast_forward=ff),
                     Observer())  # fmt: skip
        reqs = [Request(0, 0.0, 100, 50), Request(1, 0.1055, 100, 3)]
        seen: list[tuple] = []

        def arrive():
            for r in reqs:
                yield Arrival(env, r.arrival_s - env.now)
                eng.submit(Sequence(r, env.now))

        def read():
            for t in (0.05, 0.1055, 0.107, 0.11, 0.3):
                yield env.timeout(t - env.now)
                eng.sync()
                seen.append((env.now, eng.kv.free, eng.batch.steps, eng.iterations, eng.busy_s,
                             eng.batch.ctx_sum, eng.batch.largest_gaps()))  # fmt: skip

        env.process(arrive())
        env.process(read())
        env.run()
        return seen

    assert readings(True) == readings(False)


def test_an_instance_stopped_mid_stretch_never_ends_its_step_in_progress():
    """Its last sequence given up in the middle of a step (a client time-out)
    and its GPUs released at that instant (a drained instance given back), an
    instance has run the steps that ended by then and not the one in
    progress, fast-forwarded as stepped; a reader later sees nothing more."""

    def after(ff: bool) -> tuple:
        env = simpy.Environment()
        eng = Engine(env, 0, Linear(), BlockManager(1000, 16), EngineConfig(fast_forward=ff),
                     Observer())  # fmt: skip
        seq = Sequence(Request(0, 0.0, 100, 50), 0.0)

        def run():
            eng.submit(seq)
            yield env.timeout(0.1055)
            assert abandon(eng, seq)
            eng.stop()
            yield env.timeout(1.0)
            eng.sync()

        env.process(run())
        env.run()
        return env.now, eng.iterations, eng.busy_s, eng.batch.steps, eng.kv.free

    # Linear: the prompt 20 ms, then decode steps of 11 ms; at 0.1055 the eighth
    # (0.097-0.108) is in progress: the prompt and seven steps ran.
    stepped = after(False)
    assert stepped[1:4] == (8, pytest.approx(0.097), 7)
    assert after(True) == stepped


def _crossing(perf: Roofline, count: int) -> int:
    """The context sum at which a decode step of ``count`` sequences turns from
    memory- to compute-bound (unthrottled)."""
    c0 = (perf._flop_token + perf._flop_seq) * count * perf._inv_compute
    slope_c = perf._flop_attn * perf._inv_attn
    m0 = (perf._w_b + perf._kv_b * count) * perf._inv_mem
    slope_m = perf._kv_b * perf._inv_mem
    return int((m0 - c0) / (slope_c - slope_m))


@pytest.mark.parametrize("offset", [-80, -40, -1, 0, 1, 40])
@pytest.mark.parametrize("knee", [None, "inside"])
def test_a_stretch_across_the_bound_or_the_knee_is_priced_as_step_by_step(offset, knee):
    """A stretch whose steps change from memory- to compute-bound (or cross the
    throttle's knee) part way is priced exactly as step by step, on both sides."""
    count = 256
    base = Roofline(get_model("llama-3.1-8b"), H100, 1)
    cross = _crossing(base, count)
    ctx = cross + offset * count
    perf = base
    if knee is not None:  # the knee at the compute time of the stretch's middle step
        mid = ctx + 20 * count
        knee_s = (base._flop_token + base._flop_seq) * count * base._inv_compute + (
            base._flop_attn * mid * base._inv_attn
        )
        perf = Roofline(get_model("llama-3.1-8b"), H100, 1, throttle_knee_s=knee_s)
    for n in (2, 41, VECTOR_STEPS - 1, VECTOR_STEPS, 200):
        got = perf.decode_steps(count, ctx, n)
        want = [perf.iteration_time(Batch((), count, ctx + k * count)) for k in range(n)]
        assert got == want, (n, offset, knee)


_SPLIT = {"engine": {"fast_forward": True}, "scheduler": "splitwise",
          "workload": {"lengths": "azure-conv", "max_requests": 150,
                       "arrival": {"process": "poisson", "rate": 8.0}}}  # fmt: skip
# with a topology, so the hand-off hooks are there, as in every networked colocated run
_COLOCATED = {"engine": {"fast_forward": True},
              "cluster": {"instances": 2, "tp": 1, "topology": "dgx-h100-ib400", "nodes": 1},
              "workload": {"lengths": "azure-conv", "max_requests": 150,
                           "arrival": {"process": "poisson", "rate": 4.0}}}  # fmt: skip
_CHUNKED = _COLOCATED | {"engine": {"fast_forward": True, "chunked_prefill": True}}


@pytest.mark.parametrize(
    ("kind", "data", "method", "refuse", "fewer"),
    [
        # On a decode instance, a hand-off reserving blocks free past what the
        # stretch's steps take leaves the stretch going.
        ("split", _SPLIT, "keeps", lambda self, blocks: False, 1),
        # A step of prompts only that stepping would follow with decode steps
        # of the batch they join is the first step of one stretch with them:
        # one event fewer for most of the 150 prompts.
        ("colocated", _COLOCATED, "plan_head", lambda self, chunks, dt, mixed: None, 100),
        # ... and with chunked prefill, a step whose prompt chunks complete
        # beside the batch's decodes.
        ("colocated", _CHUNKED, "plan_head", lambda self, chunks, dt, mixed: None, 100),
        # On a decode instance, a KV landing in the middle of a stretch joins
        # the batch at the next step inside the stretch (its steps from there
        # priced again with it): one event fewer for most of the 150 landings.
        ("split", _SPLIT, "lands", lambda self, seq: False, 75),
    ],
    ids=["a reservation", "a step of prompts", "a mixed step", "a landing"],
)
def test_a_change_the_stretch_takes_in_leaves_it_going(
    monkeypatch, kind, data, method, refuse, fewer
):
    """A change the stretch under way can take in (instead of ending there)
    costs fewer events, and every result (first decode times and inter-token
    gaps included) is as when it ends the stretch, and as stepping."""
    going, n_going = outcome(kind, data, True)
    with monkeypatch.context() as m:
        m.setattr(FastForward, method, refuse)
        ended, n_ended = outcome(kind, data, True)
    stepped, _ = outcome(kind, data, False)
    assert going == ended == stepped
    assert n_going <= n_ended - fewer
