"""The engine alone: exact traces, queueing theory, and invariants under Hypothesis."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from twin._clock import Arrival
from twin.perf.iteration import Batch
from twin.request import Request
from twin.serving.engine import Engine, EngineConfig
from twin.serving.kvcache import BlockManager, blocks_for
from twin.serving.observer import Observer, broadcast
from twin.serving.queuepolicy import QueuePolicyChoice
from twin.serving.sequence import Sequence
from twin.sim.trace import EventLog


class Linear:
    """A perf model with round numbers: 10 ms + 0.1 ms per prefill token + 1 ms per decode."""

    name = "linear"
    sha256 = None

    def __init__(self, base=0.01, per_prefill=1e-4, per_decode=1e-3, per_context=0.0):
        self.base, self.per_prefill, self.per_decode, self.per_context = (
            base,
            per_prefill,
            per_decode,
            per_context,
        )

    def iteration_time(self, b: Batch) -> float:
        return (
            self.base
            + self.per_prefill * b.prefill_tokens
            + self.per_decode * b.decode_count
            + self.per_context * b.decode_context_sum
        )


def audit(e: Engine, b: Batch) -> None:
    """Check the engine's aggregates, as ``b`` starts, against a brute-force count."""
    dec = [s for s in e.running.values() if s.state == "decode"]
    if b.decode_count:
        assert b.decode_count == len(dec)
        step = e.batch.steps + 1
        assert b.decode_context_sum == sum(s.length_at(step) for s in dec)
        for s in dec:
            assert s.held_blocks >= blocks_for(s.length_at(step), e.kv.block_size)
    cached = e.cache.cached_blocks if e.cache is not None else 0
    assert e.kv.used == sum(s.blocks for s in e.running.values()) + cached
    assert 0 <= e.kv.free <= e.kv.total
    if e.cache is not None:
        refs = {}
        for s in e.running.values():
            for h in s.units:
                refs[h] = refs.get(h, 0) + 1
        assert {h: u[0] for h, u in e.cache.units.items() if u[0]} == refs
        assert e.cache.evictable_blocks == sum(u[1] for u in e.cache.units.values() if u[0] == 0)


class Auditing(Linear):
    """Checks, at every iteration, the engine's aggregates against a brute-force count."""

    engine: Engine

    def iteration_time(self, b: Batch) -> float:
        audit(self.engine, b)
        return super().iteration_time(b)

    def decode_steps(self, count: int, context_sum: int, n: int) -> list[float]:
        """A fast-forward's pricing of steps to come: nothing to audit yet."""
        price = super().iteration_time
        return [price(Batch((), count, context_sum + k * count)) for k in range(n)]


class Done(Observer):
    """Collects the sequences that end, in the order they end."""

    def __init__(self, done: list[Sequence]) -> None:
        self.done = done

    def request_ended(self, now, instance, req, seq, outcome, reason):
        self.done.append(seq)


def observing(done: list[Sequence], log: list[tuple] | None = None) -> Observer:
    return broadcast([Done(done)] + ([EventLog(log)] if log is not None else []))


def run_engine(
    reqs, *, blocks=1000, config=None, perf=None, log=None, probe=None, speculation=None,
    on_engine=None,
):  # fmt: skip
    """Serve ``reqs`` on one engine; ``on_engine`` is given it before the run."""
    env = simpy.Environment()
    done: list[Sequence] = []
    perf = perf or Linear()
    eng = Engine(
        env,
        0,
        perf,
        BlockManager(blocks, (config or EngineConfig()).block_size),
        config or EngineConfig(),
        observing(done, log),
        speculation=speculation,
    )
    if isinstance(perf, Auditing):
        perf.engine = eng
    if on_engine is not None:
        on_engine(eng)

    def arrive():
        for r in reqs:
            if r.arrival_s > env.now:
                yield Arrival(env, r.arrival_s - env.now)
            eng.submit(Sequence(r, env.now))

    def observe():
        # what a router would read, at instants that fall inside decode stretches
        for k in range(200):
            yield Arrival(env, 0.0037 * (k + 1) - env.now)
            eng.sync()
            cached = sorted(eng.cache.units) if eng.cache is not None else []
            probe.append((eng.kv.free, eng.iterations, eng.batch.steps, len(eng.waiting), cached))

    env.process(arrive())
    if probe is not None:
        env.process(observe())
    env.run()
    return eng, done


def test_two_requests_exact_trace():
    log: list[tuple] = []
    reqs = [Request(0, 0.0, 100, 3), Request(1, 0.005, 50, 2)]
    eng, done = run_engine(reqs, log=log)
    assert log == [
        (0.0, "iteration", 0, (0,), 0),  # prefill r0: 10 + 10 ms
        (0.02, "iteration", 0, (1,), 0),  # r1 waited; prefill-priority: 10 + 5 ms
        (0.035, "iteration", 0, (), 2),  # decode both: 10 + 2 ms
        (0.047, "finish", 0, 1),
        (0.047, "iteration", 0, (), 1),
        (0.058, "finish", 0, 0),
    ]
    by_id = {s.req.id: s for s in done}
    r0, r1 = by_id[0], by_id[1]
    assert (r0.t_scheduled, r0.t_first_token, r0.t_finish) == pytest.approx((0.0, 0.02, 0.058))
    assert (r1.t_scheduled, r1.t_first_token, r1.t_finish) == pytest.approx((0.02, 0.035, 0.047))
    assert r0.max_gap == pytest.approx(0.027)  # 0.02 -> 0.047: r1's prefill stalled r0
    assert r1.max_gap == pytest.approx(0.012)
    assert eng.kv.free == eng.kv.total


def test_same_time_arrival_joins_the_batch_formed_then():
    log: list[tuple] = []
    # r1 arrives exactly when r0's prefill ends: it is prefilled next, before any decode.
    reqs = [Request(0, 0.0, 100, 2), Request(1, 0.02, 100, 2)]
    run_engine(reqs, log=log)
    assert log[:2] == [(0.0, "iteration", 0, (0,), 0), (0.02, "iteration", 0, (1,), 0)]


def test_chunked_prefill_mixes_decodes_and_chunks():
    log: list[tuple] = []
    cfg = EngineConfig(chunked_prefill=True, max_batched_tokens=64)
    reqs = [Request(0, 0.0, 60, 3), Request(1, 0.001, 100, 2)]
    run_engine(reqs, config=cfg, log=log)
    iters = [e for e in log if e[1] == "iteration"]
    # r0 alone (60 tokens); then r0 decodes + 63 tokens of r1; then r0 + last 37 of r1
    assert [e[3:] for e in iters[:3]] == [((0,), 0), ((1,), 1), ((1,), 1)]
    finish = [e[3] for e in log if e[1] == "finish"]
    assert sorted(finish) == [0, 1]


def test_output_of_one_token_finishes_at_prefill():
    eng, done = run_engine([Request(0, 0.0, 10, 1)])
    assert done[0].t_finish == done[0].t_first_token == pytest.approx(0.011)
    assert eng.iterations == 1


def test_preemption_by_recompute_when_blocks_run_out():
    # 6 blocks of 4 tokens. Two requests of 8 + 8 tokens each need 4 blocks at the
    # end; both start (2 blocks each) and the later one is preempted when the first
    # grows. Nothing may be lost and no block may leak.
    log: list[tuple] = []
    cfg = EngineConfig(block_size=4, watermark=0.0)
    reqs = [Request(0, 0.0, 8, 9), Request(1, 0.0, 8, 9)]
    eng, done = run_engine(reqs, blocks=6, config=cfg, log=log, perf=Auditing())
    assert sorted(s.req.id for s in done) == [0, 1]
    assert any(e[1] == "preempt" and e[3] == 1 for e in log)
    victim = next(s for s in done if s.req.id == 1)
    assert victim.preemptions >= 1
    assert victim.max_gap > 0.011  # the recompute stall shows in its tail ITL
    assert eng.kv.free == eng.kv.total and eng.kv.peak_used <= 6


def test_m_d_1_mean_wait_matches_theory():
    """One server, FCFS, Poisson arrivals, deterministic service: Pollaczek-Khinchine
    gives the mean wait in queue W = rho * D / (2 (1 - rho))."""
    rng = np.random.default_rng(7)
    service = 0.01 + 1e-4 * 200  # one prefill of 200 tokens, output 1 token
    rho = 0.7
    lam = rho / service
    n = 20_000
    t = np.cumsum(rng.exponential(1.0 / lam, n))
    reqs = [Request(i, float(t[i]), 200, 1) for i in range(n)]
    cfg = EngineConfig(max_num_seqs=1)
    _, done = run_engine(reqs, config=cfg)
    waits = np.array([s.t_scheduled - s.req.arrival_s for s in done])
    theory = rho * service / (2 * (1 - rho))
    assert len(done) == n
    assert waits.mean() == pytest.approx(theory, rel=0.08)
    # and the service itself is deterministic
    assert all(s.t_finish - s.t_scheduled == pytest.approx(service) for s in done[:100])


QUEUE_POLICIES = ("fcfs", "priority", "shortest-prompt-first")


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 25))
    block = draw(st.sampled_from([1, 4, 16]))
    caching = draw(st.booleans())
    reqs = []
    t = 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.001, 0.01, 0.05]))
        prompt = draw(st.integers(1, 120))
        # prefix hashes over 16-token units from a tiny alphabet, so prefixes repeat
        hashes = tuple(draw(st.lists(st.integers(0, 2), min_size=-(-prompt // 16),
                                     max_size=-(-prompt // 16))))  # fmt: skip
        chain = tuple(hash(hashes[: k + 1]) for k in range(len(hashes)))
        priority = draw(st.integers(0, 2))
        reqs.append(Request(i, t, prompt, draw(st.integers(1, 40)), chain, 16, priority))
    longest = max(blocks_for(r.prompt_tokens + r.output_tokens - 1, block) for r in reqs)
    blocks = draw(st.integers(longest, longest * 4))
    cfg = EngineConfig(
        block_size=block,
        max_num_seqs=draw(st.integers(1, 8)),
        max_batched_tokens=draw(st.integers(8, 256)),
        chunked_prefill=draw(st.booleans()),
        watermark=0.0,
        fast_forward=False,
        prefix_caching=caching,
        queue_policy=QueuePolicyChoice(draw(st.sampled_from(QUEUE_POLICIES))),
    )
    return reqs, blocks, cfg


@settings(max_examples=75, deadline=None)
@given(scenarios())
def test_invariants_hold_for_random_workloads(scenario):
    reqs, blocks, cfg = scenario
    log: list[tuple] = []
    perf = Auditing(per_context=1e-6)
    eng, done = run_engine(reqs, blocks=blocks, config=cfg, log=log, perf=perf)
    # every request ends exactly once, with all its tokens
    assert sorted(s.req.id for s in done) == [r.id for r in reqs]
    for s in done:
        assert s.generated == s.req.output_tokens
        assert s.req.arrival_s <= s.t_scheduled <= s.t_first_token <= s.t_finish
        assert s.max_gap >= 0
        if s.req.output_tokens > 1:
            tpot = (s.t_finish - s.t_first_token) / (s.req.output_tokens - 1)
            assert s.max_gap >= tpot - 1e-12  # the largest gap is at least the mean gap
    # no block leak, never over capacity; what stays is idle cached prompts
    cached = eng.cache.cached_blocks if eng.cache is not None else 0
    assert eng.kv.free + cached == eng.kv.total
    if eng.cache is not None:
        assert eng.cache.evictable_blocks == cached
        assert all(u[0] == 0 for u in eng.cache.units.values())
    assert eng.kv.peak_used <= blocks
    # the clock never goes back
    times = [e[0] for e in log]
    assert times == sorted(times)
    assert not eng.running and not eng.waiting and eng.batch.count == 0
    assert eng.batch.ctx_sum == 0
    assert math.isfinite(eng.busy_s)


def largest_relative_difference(a, b, where="") -> tuple[float, str]:
    """The largest ``|x - y| / max(|x|, |y|)`` over the numbers at the same place
    in two nested structures of dicts, lists and tuples, and that place; ``inf``
    where anything else differs (a key, a string, a length)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return math.inf, f"{where} keys"
        pairs = [(a[k], b[k], f"{where}.{k}") for k in a]
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return math.inf, f"{where} length"
        pairs = [(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True))]
    elif isinstance(a, int | float) and isinstance(b, int | float) and type(a) is type(b):
        if a == b or (a != a and b != b):  # equal, or both NaN
            return 0.0, where
        return abs(a - b) / max(abs(a), abs(b)), where
    else:
        return (0.0 if a == b else math.inf), where
    worst = (0.0, where)
    for x, y, w in pairs:
        d = largest_relative_difference(x, y, w)
        if d[0] > worst[0]:
            worst = d
    return worst


def outcome(reqs, blocks, cfg, perf=None):
    probe: list[tuple] = []
    eng, done = run_engine(reqs, blocks=blocks, config=cfg, probe=probe, perf=perf)
    per_request = sorted(
        (
            s.req.id,
            s.t_scheduled,
            s.t_prefill_done,
            s.t_first_token,
            s.t_finish,
            s.max_gap,
            s.preemptions,
        )
        for s in done
    )
    return per_request, eng.iterations, eng.busy_s, eng.kv.peak_used, eng.preemptions, probe


def perf_models():
    """A perf model of each kind the fast-forward prices stretches with."""
    from twin.perf.gpus import get_gpu
    from twin.perf.llm import get_model
    from twin.perf.roofline import Roofline
    from twin.perf.tables import DistServeFit, ProfileTable

    decode = {(b, c): 0.006 + 1e-4 * b + 2e-7 * b * c for b in (1, 8) for c in (16, 256)}
    # a measured table need not grow with the context: steps that get shorter
    falling = {(1, 16): 0.02, (1, 40): 0.011, (1, 64): 0.013, (8, 16): 0.03, (8, 64): 0.012}
    return {
        "linear": Linear(per_context=1e-6),  # priced step by step (no decode_steps)
        "roofline": Roofline(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), 1),
        "profile": ProfileTable("profile:t", None, {(1, 64): 0.01, (1, 256): 0.02}, decode),
        "falling": ProfileTable("profile:f", None, {(1, 64): 0.01}, falling),
        "distserve": DistServeFit(
            "distserve:t",
            None,
            (5.0, 0.05, 1e-6),
            (8.0, 2e-4, 0.1),
            (9.0, 1.5e-4, 0.08),
            4,
            overhead_s=2e-3,
        ),  # fmt: skip
    }


@settings(max_examples=75, deadline=None)
@given(scenarios(), st.sampled_from(["linear", "roofline", "profile", "falling", "distserve"]))
def test_fast_forward_gives_exactly_the_stepped_result(scenario, model):
    """Covering decode stretches with one event changes nothing: every timestamp,
    gap, preemption and counter, and what a reader sees inside a stretch, is
    equal to stepping; the largest relative difference is 0 (bit-identical)."""
    reqs, blocks, cfg = scenario
    perf = perf_models()[model]
    stepped = outcome(reqs, blocks, cfg, perf)
    jumped = outcome(reqs, blocks, dataclasses.replace(cfg, fast_forward=True), perf)
    worst, where = largest_relative_difference(jumped, stepped)
    assert worst == 0.0, f"largest relative difference {worst:.3g} at {where}"
    assert jumped == stepped


def counted_run(reqs, cfg, blocks=1000):
    """Run ``reqs`` on one engine (a linear perf model): the SimPy events
    it took, the engine and the finished sequences."""
    env = simpy.Environment()
    done: list[Sequence] = []
    eng = Engine(env, 0, Linear(per_context=1e-6), BlockManager(blocks, 16), cfg, observing(done))

    def arrive():
        for r in reqs:
            yield Arrival(env, r.arrival_s - env.now)
            eng.submit(Sequence(r, env.now))

    env.process(arrive())
    n = 0
    while env.peek() < math.inf:
        env.step()
        n += 1
    return n, eng, done


def test_fast_forward_covers_long_decodes_with_few_events():
    reqs = [Request(0, 0.0, 100, 500), Request(1, 0.2, 100, 300), Request(2, 3.0, 50, 50)]
    events = {}
    for ff in (False, True):
        events[ff], eng, done = counted_run(reqs, EngineConfig(fast_forward=ff))
        assert sorted(s.req.id for s in done) == [0, 1, 2] and eng.iterations == 3 + 499
    assert events[True] * 10 < events[False]


def test_a_cached_prefix_is_not_computed_again():
    # r1 shares r0's first two 16-token units; it arrives after r0's prompt is done.
    a = (11, 12, 13, 14)
    b = (11, 12, 99, 98)
    reqs = [Request(0, 0.0, 64, 2, a, 16), Request(1, 0.1, 64, 2, b, 16)]
    cfg = EngineConfig(prefix_caching=True, watermark=0.0)
    log: list[tuple] = []
    eng, done = run_engine(reqs, blocks=100, config=cfg, log=log, perf=Auditing())
    r1 = next(s for s in done if s.req.id == 1)
    assert r1.cached_tokens == 32
    # 10 ms + 0.1 ms x 32 uncached tokens, not x 64
    assert r1.t_prefill_done - r1.t_scheduled == pytest.approx(0.01 + 1e-4 * 32)
    # everything r0 and r1 computed stays cached (6 distinct units of one block each)
    assert eng.cache.cached_blocks == 6 * 1 and eng.kv.free == 100 - 6
    assert eng.cache.evictable_blocks == 6


def test_cached_prefixes_are_evicted_before_anyone_is_preempted():
    reqs = [Request(i, 0.2 * i, 64, 2, (100 * i, 100 * i + 1, 100 * i + 2, 100 * i + 3), 16)
            for i in range(6)]  # fmt: skip
    cfg = EngineConfig(prefix_caching=True, watermark=0.0)
    eng, done = run_engine(reqs, blocks=10, config=cfg, perf=Auditing())
    assert len(done) == 6 and eng.preemptions == 0
    assert eng.cache.cached_blocks <= 10 and eng.kv.free + eng.cache.cached_blocks == 10


def test_only_the_clock_touches_simpys_private_queue():
    from pathlib import Path

    import twin

    root = Path(twin.__file__).parent
    users = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if "._queue" in p.read_text() or "._eid" in p.read_text()
    )
    assert users == ["_clock.py"]


def test_an_arrival_is_seen_before_an_iteration_ending_at_the_same_instant():
    import simpy

    from twin._clock import Arrival, at

    env = simpy.Environment()
    seen: list[str] = []
    at(env, 1.0, lambda _ev: seen.append("iteration end"))
    env.timeout(1.0).callbacks.append(lambda _ev: seen.append("timer"))
    Arrival(env, 1.0).callbacks.append(lambda _ev: seen.append("arrival"))
    env.run()
    assert seen == ["arrival", "iteration end", "timer"]


class Holding:
    """Hand-off hooks that keep every prefilled KV where it is until told."""

    def __init__(self) -> None:
        self.held: list[Sequence] = []

    def on_prefill_start(self, engine, seq, dt) -> None:
        pass

    def on_prefilled(self, engine, seq) -> None:
        self.held.append(seq)

    def on_blocks_freed(self, engine) -> None:
        pass


def _kept_later(keep_at: float, *, ff: bool, busy: bool) -> tuple[list, Engine]:
    """Request 0's KV waits after its prompt; at ``keep_at`` its own instance
    takes it up to decode (its decode side failed, say). ``busy``: request 1
    decodes meanwhile."""
    env = simpy.Environment()
    done: list[Sequence] = []
    hooks = Holding()
    cfg = EngineConfig(fast_forward=ff)
    eng = Engine(env, 0, Linear(per_context=1e-6), BlockManager(1000, 16), cfg,
                 observing(done), hooks=hooks)  # fmt: skip
    first = Sequence(Request(0, 0.0, 100, 40), 0.0)
    first.handoff = True
    eng.submit(first)
    if busy:
        eng.submit(Sequence(Request(1, 0.0, 100, 400), 0.0))

    def later():
        yield Arrival(env, keep_at)
        assert hooks.held == [first]
        eng.sender.keep(first)

    env.process(later())
    env.run()
    rows = [(s.req.id, s.t_first_token, s.t_first_decode, s.t_finish, s.max_gap) for s in done]
    return rows, eng


@pytest.mark.parametrize("busy", [False, True])
def test_a_kv_kept_after_its_prompt_decodes_from_the_next_step_boundary(busy):
    """Taken up while the engine is idle, it wakes it; taken up inside a
    fast-forwarded stretch, it joins after the step in progress, exactly as
    stepping has it."""
    keep_at = 0.2345
    stepped, e1 = _kept_later(keep_at, ff=False, busy=busy)
    jumped, e2 = _kept_later(keep_at, ff=True, busy=busy)
    assert sorted(r[0] for r in stepped) == ([0, 1] if busy else [0])
    assert jumped == stepped
    assert (e1.iterations, e1.batch.steps) == (e2.iterations, e2.batch.steps)
    kept = next(r for r in stepped if r[0] == 0)
    assert kept[2] > keep_at  # its first decode step starts after it was taken up
    assert e1.kv.free == e1.kv.total and e2.kv.free == e2.kv.total
