"""Pipeline parallelism: micro-batches in flight across the stages of one instance."""

from __future__ import annotations

import math

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import Linear, observing, scenarios

from twin._clock import Arrival
from twin.perf.gpus import get_gpu
from twin.perf.iteration import Batch, Pipelined, pipeline_stages
from twin.perf.llm import get_model
from twin.perf.roofline import Roofline
from twin.request import Request
from twin.serving.engine import Engine, EngineConfig
from twin.serving.kvcache import BlockManager, blocks_for
from twin.serving.sequence import Sequence


class Constant:
    """Every batch takes ``c`` seconds through the pipeline, ``c / pp`` on each stage."""

    name = "constant"
    sha256 = None

    def __init__(self, c: float, pp: int) -> None:
        self.c, self.pp = c, pp

    def iteration_time(self, b: Batch) -> float:
        return self.c

    def stage_times(self, b: Batch) -> tuple[float, float]:
        return self.c / self.pp, self.c / self.pp


class PipeLinear(Linear):
    """:class:`Linear` split evenly over ``pp`` stages; at every launch it checks the
    lane's aggregates against a brute-force count, as ``test_engine.Auditing`` does."""

    engine: Engine

    def __init__(self, pp: int, **kw) -> None:
        super().__init__(**kw)
        self.pp = pp

    def stage_times(self, b: Batch) -> tuple[float, float]:
        e = self.engine
        lane = e.batch.lane
        dec = [s for s in e.running.values() if s.state == "decode" and s.lane == lane]
        assert b.decode_count in (0, len(dec))
        if b.decode_count:
            step = e.batch.steps + 1
            assert b.decode_context_sum == sum(s.length_at(step) for s in dec)
            for s in dec:
                assert s.held_blocks >= blocks_for(s.length_at(step), e.kv.block_size)
        cached = e.cache.cached_blocks if e.cache is not None else 0
        assert e.kv.used == sum(s.blocks for s in e.running.values()) + cached
        t = self.iteration_time(b) / self.pp
        return t, t


def run(reqs, perf, *, blocks=10_000, config=None, log=None):
    env = simpy.Environment()
    done: list[Sequence] = []
    cfg = config or EngineConfig()
    eng = Engine(env, 0, perf, BlockManager(blocks, cfg.block_size), cfg, observing(done, log))
    if isinstance(perf, PipeLinear):
        perf.engine = eng

    def arrive():
        for r in reqs:
            if r.arrival_s > env.now:
                yield Arrival(env, r.arrival_s - env.now)
            eng.submit(Sequence(r, env.now))

    env.process(arrive())
    env.run()
    return eng, {s.req.id: s for s in done}


def test_a_model_with_stages_is_pipelined_and_one_without_is_not():
    assert pipeline_stages(Constant(0.01, 4)) == 4
    assert pipeline_stages(Linear()) == 1
    r = Roofline(get_model("llama-2-70b"), get_gpu("a100-80gb"), 4, 2)
    assert isinstance(r, Pipelined) and pipeline_stages(r) == 2


def test_two_micro_batches_exact_trace():
    # pp 2, 10 ms through the pipeline (5 ms a stage), one sequence per lane
    log: list[tuple] = []
    reqs = [Request(0, 0.0, 16, 3), Request(1, 0.0, 16, 3)]
    cfg = EngineConfig(max_num_seqs=1)
    eng, done = run(reqs, Constant(0.010, 2), config=cfg, log=log)
    assert log == [
        (0.0, "iteration", 0, (0,), 0),  # lane 0: r0's prompt; out at 10 ms
        (0.005, "iteration", 0, (1,), 0),  # lane 1 enters once stage 1 is free
        (0.01, "iteration", 0, (), 1),  # r0's token 1 at 10 ms; its first decode step
        (0.015, "iteration", 0, (), 1),
        (0.02, "iteration", 0, (), 1),
        (0.025, "iteration", 0, (), 1),
        (0.03, "finish", 0, 0),
        (0.035, "finish", 0, 1),
    ]
    assert (done[0].t_first_token, done[1].t_first_token) == pytest.approx((0.01, 0.015))
    assert eng.iterations == 6 and eng.busy_s == pytest.approx(6 * 0.005)
    # without stages the same requests run one at a time: 10 ms an iteration, in turn
    _, one = run(reqs, Linear(base=0.010, per_prefill=0.0, per_decode=0.0), config=cfg)
    assert (one[0].t_finish, one[1].t_finish) == pytest.approx((0.03, 0.06))


@pytest.mark.parametrize("pp", [2, 4])
def test_a_steady_stream_gets_pp_times_the_throughput_at_the_traversal_latency(pp):
    # pp x M identical requests at once, M per lane (max_num_seqs): each lane's tokens come
    # out every c (a micro-batch's way through the pipeline), the lanes c / pp apart
    c, m, out = 0.020, 8, 50
    reqs = [Request(i, 0.0, 32, out) for i in range(pp * m)]
    cfg = EngineConfig(max_num_seqs=m)
    _, piped = run(reqs, Constant(c, pp), config=cfg)
    _, flat = run(reqs, Linear(base=c, per_prefill=0.0, per_decode=0.0), config=cfg)
    for i, s in piped.items():
        lane = i // m
        # closed form: the lane's prompts enter at lane x c / pp, then one token every c
        assert s.t_first_token == pytest.approx(lane * c / pp + c)
        assert s.t_finish == pytest.approx(lane * c / pp + out * c)
        assert (s.t_finish - s.t_first_token) / (out - 1) == pytest.approx(c)
        assert s.max_gap == pytest.approx(c)
    for i, s in flat.items():
        assert s.t_finish == pytest.approx((i // m + 1) * out * c)  # M at a time
    span_piped = max(s.t_finish for s in piped.values())
    span_flat = max(s.t_finish for s in flat.values())
    tokens = pp * m * out
    assert tokens / span_piped == pytest.approx(pp * tokens / span_flat, rel=(pp - 1) / (2 * out))


def test_a_slow_micro_batch_holds_up_the_ones_behind_it_stage_by_stage():
    # stage times 30 ms for a prompt, 5 ms for a decode step, pp 3: r1's decode step
    # entering behind r0's prompt waits for it at the last stage (FIFO), leaving 5 ms after
    class Stages(Constant):
        def stage_times(self, b):
            return (0.030, 0.030) if b.prefill else (0.005, 0.005)

        def iteration_time(self, b):
            return 3 * self.stage_times(b)[0]

    cfg = EngineConfig(max_num_seqs=1)
    reqs = [Request(1, 0.0, 16, 2), Request(0, 0.016, 16, 2)]
    _, done = run(reqs, Stages(0.0, 3), config=cfg)
    # r1: prompt 0 -> 90 ms. r0: arrives at 16 ms, its prompt enters at 30 ms (stage 1 was
    # busy) and holds the last stage 90 -> 120 ms. r1's decode step enters at 90 ms, is
    # through stage 2 at 100 ms and waits for the last stage: 120 -> 125 ms. r0's decode
    # step: 120 -> 125 -> 130 -> 135 ms.
    assert done[1].t_first_token == pytest.approx(0.090)
    assert done[0].t_first_token == pytest.approx(0.120)
    assert done[1].t_finish == pytest.approx(0.125)
    assert done[0].t_finish == pytest.approx(0.135)


def test_roofline_stages_add_up_to_the_iteration():
    m, g = get_model("llama-2-70b"), get_gpu("a100-80gb")
    b = Batch(((512, 0),), 16, 16 * 1024)
    flat = Roofline(m, g, 4, 1)
    assert flat.stage_times(b) == (flat.iteration_time(b), 0.0)
    r = Roofline(m, g, 4, 2)
    first, later = r.stage_times(b)
    assert first + later == pytest.approx(r.iteration_time(b), rel=1e-12)
    send = r.hop_latency_s + (16 + 512) * m.hidden * m.dtype_bytes / g.nvlink_bytes_s
    assert later - first == pytest.approx(send, rel=1e-9)
    # the two stages split the TP-only time: latency barely above TP4 alone, throughput ~2x
    assert r.iteration_time(b) == pytest.approx(flat.iteration_time(b) + send, rel=1e-9)
    assert max(first, later) < 0.51 * flat.iteration_time(b)


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.sampled_from([2, 3]))
def test_invariants_hold_with_micro_batches_in_flight(scenario, pp):
    reqs, blocks, cfg = scenario
    log: list[tuple] = []
    perf = PipeLinear(pp, per_context=1e-6)
    eng, done = run(reqs, perf, blocks=blocks, config=cfg, log=log)
    assert sorted(done) == [r.id for r in reqs]
    for s in done.values():
        assert s.generated == s.req.output_tokens
        assert s.req.arrival_s <= s.t_scheduled <= s.t_first_token <= s.t_finish
        if s.req.output_tokens > 1:
            tpot = (s.t_finish - s.t_first_token) / (s.req.output_tokens - 1)
            assert s.max_gap >= tpot - 1e-12
            # a sequence is in one micro-batch at a time: its tokens are a traversal apart
            assert s.t_finish - s.t_first_token >= (s.req.output_tokens - 1) * 0.01 - 1e-9
    cached = eng.cache.cached_blocks if eng.cache is not None else 0
    assert eng.kv.free + cached == eng.kv.total
    assert eng.kv.peak_used <= blocks
    times = [e[0] for e in log]
    assert times == sorted(times)
    assert not eng.running and not eng.waiting
    for batch in eng.lanes:
        assert batch.count == 0 and batch.ctx_sum == 0
    assert math.isfinite(eng.busy_s)


@pytest.mark.parametrize("mode", ["serialized", "layerwise"])
def test_a_split_cluster_with_pipelined_instances_serves_everything(mode):
    from test_disagg import run as run_sim
    from test_disagg import split_spec

    def spec(pp: int):
        return split_spec(
            cluster={"prefill": {"instances": 1, "tp": 4, "pp": pp},
                     "decode": {"instances": 1, "tp": 4, "pp": pp}},
            transfer={"mode": mode},
            workload={"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 40.0},
                      "max_requests": 200},
        )  # fmt: skip

    sim, result, rows = run_sim(spec(2))
    s = result.summary
    assert s["completed"] == s["requests"] == 200
    assert all(e.pp == 2 and e.kv.free == e.kv.total for e in sim.engines)
    assert all(0 < e.busy_s <= result.summary["simulated_s"] for e in sim.engines)
    _, again, rows2 = run_sim(spec(2))  # deterministic
    assert rows2 == rows and again.summary == s
    # under load the decode instance at PP2 keeps up where PP1 queues: shorter TPOT
    _, flat, _ = run_sim(spec(1))
    assert s["tpot_s"]["p50"] < flat.summary["tpot_s"]["p50"]
