"""Fast-forward of pipelined instances (pp > 1) against stepping: one instance
under random workloads, whole runs, readers inside a stretch, and its events."""

from __future__ import annotations

import dataclasses

import pytest
import simpy
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_disagg import split_spec
from test_engine import Linear, largest_relative_difference, observing, scenarios
from test_fastforward import HANDOFFS, fit, outcome, runs
from test_pipeline import Constant

from twin._clock import Arrival
from twin.perf.gpus import get_gpu
from twin.perf.iteration import Batch, stage_steps
from twin.perf.llm import get_model
from twin.perf.roofline import Roofline
from twin.request import Request
from twin.serving.engine import Engine, EngineConfig
from twin.serving.kvcache import BlockManager
from twin.serving.pipeforward import PipeForward
from twin.serving.sequence import Sequence
from twin.sim.simulation import Simulation


class Staged(Linear):
    """:class:`Linear` over ``pp`` stages, the first holding ``share`` of it (a
    share of 1/pp gives equal stages, whose instants tie often)."""

    def __init__(self, pp: int, share: float, **kw) -> None:
        super().__init__(**kw)
        self.pp, self.share = pp, share

    def stage_times(self, b: Batch) -> tuple[float, float]:
        t = self.iteration_time(b)
        first = t * self.share
        return first, (t - first) / (self.pp - 1)


def serving(reqs, blocks, cfg, perf, observer, env=None):
    """An engine in a (new) environment, ``reqs`` arriving at it (not yet run)."""
    env = env or simpy.Environment()
    eng = Engine(env, 0, perf, BlockManager(blocks, cfg.block_size), cfg, observer)

    def arrive():
        for r in reqs:
            if r.arrival_s > env.now:
                yield Arrival(env, r.arrival_s - env.now)
            eng.submit(Sequence(r, env.now))

    env.process(arrive())
    return env, eng


def engine_run(reqs, blocks, cfg, perf, *, probe_every=0.0037):
    """Run one engine; what a router reads at instants inside stretches (every
    ``probe_every`` s, before same-instant events, as an arrival reads), every
    request's timestamps, and the engine's counters."""
    done: list[Sequence] = []
    env, eng = serving(reqs, blocks, cfg, perf, observing(done))
    probe: list[tuple] = []

    def observe():
        for k in range(300):
            yield Arrival(env, probe_every * (k + 1) - env.now)
            eng.sync()
            steps = [batch.steps for batch in eng.lanes]
            probe.append((eng.kv.free, eng.iterations, eng.busy_s, steps, eng.decode_load()))

    env.process(observe())
    env.run()
    per_request = sorted(
        (s.req.id, s.t_scheduled, s.t_prefill_done, s.t_first_token, s.t_finish, s.max_gap,
         s.preemptions, s.generated)
        for s in done
    )  # fmt: skip
    counters = (eng.iterations, eng.busy_s, eng.kv.peak_used, eng.preemptions, eng.kv.free)
    return {"requests": per_request, "counters": counters, "probe": probe}, env


def _events(reqs, blocks, cfg, perf) -> int:
    env, _ = serving(reqs, blocks, cfg, perf, observing([]))
    n = 0
    while env.peek() < float("inf"):
        env.step()
        n += 1
    return n


PERFS = {
    "staged-0.6": lambda pp: Staged(pp, 0.6, per_context=1e-6),
    "staged-0.3": lambda pp: Staged(pp, 0.3, per_context=1e-6),
    "staged-even": lambda pp: Staged(pp, 1 / pp, per_context=1e-6),  # ties: stepping decides
    "constant": lambda pp: Constant(0.012, pp),  # every instant ties
    # powers of two: sums are exact, so lanes come out at the same instants
    "dyadic": lambda pp: Staged(pp, 0.5, base=2**-7, per_prefill=2**-14, per_decode=2**-10),
    "roofline": lambda pp: Roofline(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), 1, pp),
    "distserve": lambda pp: fit(pp),
}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from([2, 3, 4]), st.sampled_from(sorted(PERFS)))
def test_pipelined_fast_forward_gives_exactly_the_stepped_result(scenario, pp, model):
    """Every timestamp, gap, preemption and counter of a pipelined instance, and
    what a reader sees inside a stretch, is the same to the last bit with
    fast-forward as stepping, with chunked prefill, prefix caching, preemptions
    and stages that tie."""
    reqs, blocks, cfg = scenario
    assume(model != "roofline" or pp != 3)  # Llama-3.1-8B's 32 layers do not split in 3
    perf = PERFS[model](pp)
    stepped, _ = engine_run(reqs, blocks, cfg, perf)
    jumped, _ = engine_run(reqs, blocks, dataclasses.replace(cfg, fast_forward=True), perf)
    worst, where = largest_relative_difference(jumped, stepped)
    assert worst == 0.0, f"largest relative difference {worst:.3g} at {where}"
    assert jumped == stepped


@st.composite
def pipelined_runs(draw):
    """A random whole run (see ``test_fastforward.runs``) of instances with
    ``pp`` stages; split, the prefill instance has 1 or ``pp``, and under load
    the decode instance's memory fills (Llama-2-7B's KV, four times
    Llama-3.1-8B's a token), so hand-offs, pushed or pulled, wait for the
    blocks its finishes free."""
    kind, data = draw(runs())
    pp = data["cluster"]["pp"] = draw(st.sampled_from([2, 4]))
    if kind == "split":
        data["cluster"]["prefill"]["pp"] = draw(st.sampled_from([1, pp]))
        if draw(st.booleans()):
            data["model"] = "llama-2-7b"
    return kind, data


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=pipelined_runs(), model=st.sampled_from(["spec", "distserve"]))
def test_whole_pipelined_runs_fast_forwarded_are_those_stepped(run, model):
    """Colocated and split runs of pipelined instances, with preemptions,
    chunked prefill, prefix caching, failures and throttled GPUs, and
    hand-offs waiting on a full decode instance: the same to the last bit."""
    kind, data = run
    perf = None
    if model == "distserve":  # one perf model, of pp stages, for every instance
        perf = fit(data["cluster"]["pp"])
        data["cluster"].get("prefill", {})["pp"] = data["cluster"]["pp"]
    stepped, n_stepped = outcome(kind, data, False, perf)
    jumped, n_jumped = outcome(kind, data, True, perf)
    worst, where = largest_relative_difference(jumped, stepped)
    assert worst == 0.0, f"largest relative difference {worst:.3g} at {where}"
    assert jumped == stepped
    assert n_jumped <= n_stepped


@st.composite
def loaded_decode_runs(draw):
    """A split run whose decode instance, of 2 or 4 stages, receives hand-offs
    (pushed or pulled, serialized or layer-wise) faster than it ends requests:
    its memory fills (Llama-2-7B's KV at a quarter of the GPU), its running
    slots do, or a prefix cache makes every reservation a change, so
    hand-offs wait for the blocks a finish frees, and reserve them as the
    lane completes its micro-batch."""
    mode, handoff = draw(st.sampled_from(HANDOFFS))
    engine = {"chunked_prefill": draw(st.booleans())}
    pressure = draw(st.sampled_from(["memory", "slots", "prefix-cache"]))
    model = "llama-3.1-8b"
    if pressure == "memory":
        model = "llama-2-7b"
        engine["gpu_memory_utilization"] = 0.25
    else:
        engine["max_num_seqs"] = draw(st.integers(1, 4))
        engine["prefix_caching"] = pressure == "prefix-cache"
    cluster = {
        "nodes": 1,
        "prefill": {
            "instances": draw(st.integers(1, 2)),
            "tp": 1,
            "pp": draw(st.sampled_from([1, 2])),
        },
        "decode": {"instances": 1, "tp": 1, "pp": draw(st.sampled_from([2, 4]))},
    }
    workload = {
        "lengths": draw(st.sampled_from(["azure-conv", "azure-code"])),
        "arrival": {"process": "gamma", "rate": draw(st.sampled_from([20.0, 60.0])), "cv": 2},
        "max_requests": draw(st.integers(10, 40)),
    }
    return "split", {
        "model": model, "seed": draw(st.integers(0, 3)), "cluster": cluster, "engine": engine,
        "scheduler": draw(st.sampled_from(["disagg", "splitwise"])), "workload": workload,
        "transfer": {"mode": mode, "handoff": handoff},
    }  # fmt: skip


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=loaded_decode_runs())
def test_pipelined_decode_instances_under_hand_off_load_fast_forward_as_stepped(run):
    """Pipelined decode instances receiving hand-offs faster than they end
    requests: every timestamp, counter and summary the same to the last bit
    with fast-forward as stepping."""
    kind, data = run
    stepped, n_stepped = outcome(kind, data, False)
    jumped, n_jumped = outcome(kind, data, True)
    worst, where = largest_relative_difference(jumped, stepped)
    assert worst == 0.0, f"largest relative difference {worst:.3g} at {where}"
    assert jumped == stepped
    assert n_jumped <= n_stepped


@pytest.mark.parametrize("pp", [2, 4])
def test_a_pipelined_stretch_is_priced_to_the_last_bit_as_stage_by_stage(pp):
    perf = Roofline(get_model("llama-2-70b"), get_gpu("h100-sxm"), 4, pp)
    for count, ctx, n in [(1, 100, 1), (37, 37 * 900, 79), (256, 256 * 3000, 300)]:
        firsts, laters = stage_steps(perf)(count, ctx, n)
        want = [perf.stage_times(Batch((), count, ctx + k * count)) for k in range(n)]
        assert list(zip(firsts, laters, strict=True)) == want
        assert all(type(x) is float for x in firsts + laters)


def test_pipelined_decodes_take_a_few_events_a_stretch():
    """Four lanes of long decodes: stepping takes an event or two per micro-batch;
    fast-forward goes on past each finish that leaves its lane decoding (the
    other lanes' schedule stands), with the same result."""
    pp, m = 4, 8
    reqs = [Request(i, 0.0, 64, 400 + 7 * i) for i in range(pp * m)]
    cfg = EngineConfig(max_num_seqs=m, fast_forward=False)
    perf = Staged(pp, 0.4, per_context=1e-6)
    stepped, _ = engine_run(reqs, 10_000, cfg, perf, probe_every=0.5)
    jumped, _ = engine_run(reqs, 10_000, dataclasses.replace(cfg, fast_forward=True), perf,
                           probe_every=0.5)  # fmt: skip
    assert jumped == stepped
    n_stepped = _events(reqs, 10_000, cfg, perf)
    n_jumped = _events(reqs, 10_000, dataclasses.replace(cfg, fast_forward=True), perf)
    micro_batches = stepped["counters"][0]
    assert n_stepped >= micro_batches  # at least one event per micro-batch
    # 32 finishes, about three events each (where a stretch ended at each, five)
    assert n_jumped <= 4 * (pp * m)
    assert n_jumped * 10 < n_stepped


def test_readers_and_a_failure_inside_a_pipelined_stretch_see_what_stepping_shows():
    """A reader syncing at instants spread over a stretch, and a failure in the
    middle of one, see what stepping shows; the requests lost and served again
    end as they do stepping."""
    pp = 3
    perf = Staged(pp, 0.45, per_context=1e-6)
    reqs = [Request(i, 0.001 * i, 40 + i, 120 - 5 * i) for i in range(9)]

    def readings(ff: bool) -> list[tuple]:
        done: list[Sequence] = []
        cfg = EngineConfig(max_num_seqs=3, fast_forward=ff)
        env, eng = serving(reqs, 5000, cfg, perf, observing(done))
        seen: list[tuple] = []

        def read():
            for t in (0.05, 0.0777, 0.31, 0.5, 0.9):
                yield Arrival(env, t - env.now)
                eng.sync()
                seen.append((env.now, eng.kv.free, eng.iterations, eng.busy_s,
                             eng.decode_load()))  # fmt: skip
            yield Arrival(env, 1.2 - env.now)
            lost = eng.fail()
            seen.append(sorted((s.req.id, s.generated, s.t_last_token) for s in lost))
            eng.recover()
            for s in lost:
                eng.submit(Sequence(s.req, env.now))

        env.process(read())
        env.run()
        seen.append(sorted((s.req.id, s.t_first_token, s.t_finish, s.max_gap) for s in done))
        return seen

    assert readings(True) == readings(False)


def test_a_cut_pipelined_stretch_leaves_no_stale_event(monkeypatch):
    """Arrivals in the middle of stretches end them: the stretch's own event is
    taken off the queue, so every stretch event that fires finds its stretch
    still under way (and does something)."""
    from twin.serving.pipeforward import PipeForward

    fired: list[bool] = []
    for name in ("_ended", "_more"):
        original = getattr(PipeForward, name)

        def wrapped(self, st, _original=original):
            fired.append(self.stretch is st)
            return _original(self, st)

        monkeypatch.setattr(PipeForward, name, wrapped)
    pp = 2
    reqs = [Request(i, 0.0137 * i, 30 + i, 60 + 3 * i) for i in range(12)]
    cfg = EngineConfig(max_num_seqs=4, fast_forward=True)
    jumped, _ = engine_run(reqs, 10_000, cfg, Staged(pp, 0.55, per_context=1e-6))
    stepped, _ = engine_run(reqs, 10_000, dataclasses.replace(cfg, fast_forward=False),
                            Staged(pp, 0.55, per_context=1e-6))  # fmt: skip
    assert jumped == stepped
    assert fired and all(fired)


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("ff", [False, True])
def test_failing_and_recovering_twice_at_one_instant_leaves_one_loop_serving(pp, ff):
    """Each serving loop serves the life it was started for: two failures and
    recoveries at the same instant, before the first recovery's loops ran,
    leave the instance served once (the request takes as long as after one)."""

    def finish(times: int) -> tuple[float, int]:
        env = simpy.Environment()
        done: list[Sequence] = []
        perf = Linear() if pp == 1 else Constant(0.012, pp)
        cfg = EngineConfig(chunked_prefill=True, max_batched_tokens=32, fast_forward=ff)
        eng = Engine(env, 0, perf, BlockManager(1000, 16), cfg, observing(done))

        def go():
            yield Arrival(env, 0.05)
            for _ in range(times):
                eng.fail()
                eng.recover()
            eng.submit(Sequence(Request(0, env.now, 100, 20), env.now))

        env.process(go())
        env.run()
        assert len(done) == 1
        return done[0].t_finish, eng.iterations

    assert finish(2) == finish(3) == finish(1)


def test_pipelined_decode_instances_under_a_watching_tick_fast_forward_and_cross_stepping(
    monkeypatch,
):
    """Splitwise's tick sleeps watching the token machines' free blocks: their
    stretches keep short of its threshold (they take blocks with no event),
    so they fast-forward with the same results, and crossings wake the tick
    at the same instants (some, at a high threshold and a high rate)."""
    from pathlib import Path

    from twin.sim import control
    from twin.sim.simulation import Simulation
    from twin.sim.spec import resolve_spec
    from twin.studies.bench import bench_spec

    woken: list[float] = []  # the ticks a crossing woke the sleeping tick for
    wake = control.ControlLoop.wake

    def armed(self, when):
        before = self._wake_at
        wake(self, when)
        if self._wake_at != before:
            woken.append(self._wake_at)

    monkeypatch.setattr(control.ControlLoop, "wake", armed)

    def outcome(ff: bool, rate: float, threshold: float) -> tuple[dict, int, list[float]]:
        spec = bench_spec("split", 300)
        for role in ("prefill", "decode"):
            spec["cluster"][role]["tp"] = 4
        spec["cluster"]["pp"] = 2
        spec["scheduler"] = {"name": "splitwise", "token_free_threshold": threshold}
        spec["engine"] = {"fast_forward": ff, "gpu_memory_utilization": 0.5}
        # the rates and thresholds that cross (or not) were chosen with this preset's steps
        spec["perf"] = {"kind": "roofline", "engine": "distserve"}
        spec["workload"]["arrival"]["rate"] = rate
        rows: list[dict] = []
        woken.clear()
        sim = Simulation(resolve_spec(spec, "split.yaml", Path.cwd()), on_row=rows.append)
        res = sim.run().to_dict()
        del res["header"]
        rows.sort(key=lambda r: r["id"])
        return {"result": res, "rows": rows}, sim.events, list(woken)

    for rate, threshold, crossed in [(8.0, 0.6, False), (30.0, 0.9, True)]:
        stepped, n_stepped, w_stepped = outcome(False, rate, threshold)
        jumped, n_jumped, w_jumped = outcome(True, rate, threshold)
        assert jumped == stepped
        assert w_jumped == w_stepped and bool(w_stepped) == crossed
        assert n_jumped * 2 < n_stepped


def _reacting(reqs, blocks, cfg, perf, mode: str) -> dict:
    """Run one engine whose observer, as each request ends, schedules at the same
    instant (at arrival priority) a reader that syncs, or a new request."""
    from twin.serving.observer import Observer

    env = simpy.Environment()
    done: list[Sequence] = []
    probe: list[tuple] = []
    extra = [10_000]

    class Reacting(Observer):
        def request_ended(self, now, instance, req, seq, outcome, reason):
            done.append(seq)

            def react():
                yield Arrival(env, 0.0)
                if mode == "read":
                    eng.sync()
                    probe.append((env.now, eng.kv.free, eng.iterations, eng.busy_s,
                                  eng.running_requests))  # fmt: skip
                elif extra[0] < 10_030:
                    extra[0] += 1
                    new = Request(extra[0], env.now, req.prompt_tokens, req.output_tokens)
                    eng.submit(Sequence(new, env.now))

            env.process(react())

    _, eng = serving(reqs, blocks, cfg, perf, Reacting(), env)
    env.run()
    per_request = sorted((s.req.id, s.t_scheduled, s.t_first_token, s.t_finish, s.max_gap)
                         for s in done)  # fmt: skip
    return {"requests": per_request, "probe": probe, "busy": (eng.iterations, eng.busy_s)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from([2, 3, 4]), st.sampled_from(["staged-0.6", "dyadic"]),
       st.sampled_from(["read", "submit"]))  # fmt: skip
def test_what_a_finish_sets_off_at_its_instant_sees_what_stepping_shows(scenario, pp, model, mode):
    """A stretch goes on past a finish: the lane completes the micro-batch and
    plans its next in one event, as stepping does, so a reader or a request
    that the finish sets off at that instant sees the next one begun."""
    reqs, blocks, cfg = scenario
    cfg = dataclasses.replace(cfg, prefix_caching=False)
    perf = PERFS[model](pp)
    stepped = _reacting(reqs, blocks, cfg, perf, mode)
    jumped = _reacting(reqs, blocks, dataclasses.replace(cfg, fast_forward=True), perf, mode)
    assert jumped == stepped


@pytest.mark.parametrize(
    ("model", "engine", "n", "prompt", "output"),
    [
        # the decode memory full: the hand-off's blocks are not free past what
        # the stretch takes
        ("llama-2-7b", {"gpu_memory_utilization": 0.25}, 20, 3000, 100),
        # a prefix cache on the decode side: a reservation always ends the stretch
        ("llama-3.1-8b", {"max_num_seqs": 1, "prefix_caching": True}, 3, 500, 40),
    ],
    ids=["memory", "prefix-cache"],
)
@pytest.mark.parametrize(("handoff", "mode"), [("push", "serialized"), ("pull", "serialized"),
                                               ("push", "layerwise")])  # fmt: skip
def test_a_hand_off_reserved_as_a_lane_completes_the_micro_batch_ending_a_stretch(
    monkeypatch, model, engine, n, prompt, output, handoff, mode
):
    """A decode instance of two stages: a finish in the micro-batch that ends a
    stretch frees blocks, and a queued hand-off reserves them while the lane
    completes it (the stretch's event has fired; the lane has not gone on).
    The reservation ends the stretch there, as any change does, with the
    result of stepping."""
    inside: list[bool] = []  # an interrupt while the lane completes the micro-batch
    interrupt = PipeForward.interrupt

    def watched(self):
        if self.stretch is not None:
            inside.append(self.stretch.event is None)
        interrupt(self)

    monkeypatch.setattr(PipeForward, "interrupt", watched)
    reqs = [Request(i, 0.02 * i, prompt + 37 * (i % 7), output + 11 * (i % 5)) for i in range(n)]

    def result(ff: bool) -> dict:
        spec = split_spec(
            model=model,
            engine=engine | {"fast_forward": ff},
            cluster={"nodes": 1, "prefill": {"instances": 1, "tp": 1},
                     "decode": {"instances": 1, "tp": 1, "pp": 2}},
            transfer={"mode": mode, "handoff": handoff},
            # the arrival gaps and lengths that reach the path were chosen with this preset's steps
            perf={"kind": "roofline", "engine": "distserve"},
        )  # fmt: skip
        rows: list[dict] = []
        res = Simulation(spec, requests=reqs, on_row=rows.append).run().to_dict()
        del res["header"]
        return {"result": res, "rows": sorted(rows, key=lambda r: r["id"])}

    stepped = result(False)
    jumped = result(True)
    assert any(inside)
    assert jumped == stepped
    assert all(r["status"] == "completed" for r in stepped["rows"])
