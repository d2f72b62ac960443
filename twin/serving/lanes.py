"""The loops of an engine: one (:func:`serve`), or one per pipeline lane (:func:`serve_lane`).

Each loop forms a batch, runs it for the time the perf model gives and
applies it, for as long as the instance's life lasts (a failure ends it).

With pipeline parallelism (a perf model of ``pp > 1`` stages) the instance
keeps up to ``pp`` micro-batches in flight, as vLLM's virtual engines do. Its
running sequences are partitioned into ``pp`` lanes, each with its own decode
batch (:class:`~twin.serving.decodebatch.DecodeBatch`) and its own loop; a
lane's next micro-batch starts once its previous one has left the last stage
(a sequence is in one micro-batch at a time) and the first stage is free, and
its tokens come out after the batch has passed every stage (each stage FIFO,
held for the time :meth:`~twin.perf.iteration.Pipelined.stage_times` gives).
One SimPy event per micro-batch. The waiting queue and the KV blocks are
shared: a prompt joins the lane whose micro-batch admits it and decodes there
until it ends or is preempted (then it waits again for any lane); a landed KV
hand-off joins the next lane to plan. ``max_num_seqs`` holds per lane, as per
virtual engine. NOTE: vLLM also gives each virtual engine 1/pp of the KV
blocks; here they are one pool. A stretch covers every lane's micro-batches
at once (:mod:`twin.serving.pipeforward`); with one stage, one batch's steps
(:mod:`twin.serving.fastforward`).
"""

from __future__ import annotations

from twin._clock import at
from twin.errors import SpecError
from twin.perf.iteration import Batch, Pipelined
from twin.serving.fastforward import FastForward
from twin.serving.pipeforward import PipeForward
from twin.serving.ports import EngineLike


def serve(eng: EngineLike, ff: FastForward | None, life: int):  # noqa: C901 - a SimPy process
    """Form a batch, run it for the time the perf model gives, apply it;
    repeat, for as long as the instance's ``life`` lasts."""
    env = eng.env
    if eng.life != life:
        return  # it failed again before this loop first ran
    while True:
        plan = eng.planner.plan()
        batch, chunks = plan.batch, plan.chunks
        if batch is None:  # decode only
            if ff is not None:
                stretch = ff.plan()
                if stretch is not None:
                    if not stretch.dts[0] > 0.0:
                        _bad_time(eng, stretch.dts[0])
                    yield from ff.run(stretch)
                    if eng.life != life:
                        return  # it failed during the stretch
                    continue
            batch = Batch((), eng.batch.count, eng.batch.ctx_sum)
        elif not chunks:  # an empty batch
            yield eng.idle()
            if eng.life != life:
                return
            continue
        dt = eng.iteration_time(batch)
        if not dt > 0.0:
            _bad_time(eng, dt)
        obs = eng.iteration_observer
        if obs is not None or chunks and eng.hooks is not None:
            eng.iteration_starts(batch, chunks, dt)
        if chunks and ff is not None:  # prompts completing here may head a stretch
            stretch = ff.plan_head(chunks, dt, plan.decodes)
            if stretch is not None:
                yield from ff.run(stretch)
                if eng.life != life:
                    return
                continue
        yield env.timeout(dt)
        if eng.life != life:
            return  # it failed during the iteration: its work is lost
        eng.iterations += 1
        eng.busy_s += dt
        if obs is not None:
            obs.iteration_ended(env.now, eng.id)
        eng.complete(chunks, plan.decodes)


def _bad_time(eng: EngineLike, dt: float) -> None:
    raise SpecError(f"perf model {eng.perf.name!r} gave iteration time {dt!r} <= 0")


def serve_lane(eng: EngineLike, pf: PipeForward | None, lane: int, life: int):  # noqa: C901 - a SimPy process
    """One pipeline lane (``pp > 1``): wait for the first stage, form a
    micro-batch of this lane's work, let it pass every stage, apply it; repeat.
    Inside a fast-forwarded stretch (:mod:`twin.serving.pipeforward`) the lane
    waits until the stretch ends and its own event fires: it then completes
    the micro-batch it has in flight, or queues for the first stage."""
    env = eng.env
    perf = eng.perf
    assert isinstance(perf, Pipelined)
    free = eng.stage_free
    if eng.life != life:
        return  # it failed again before this loop first ran
    while True:
        st = pf.stretch if pf is not None else None
        if st is not None:
            assert pf is not None
            if lane not in st.lanes:
                # An idle lane woken at the instant another planned a stretch:
                # stepping would queue it for the first stage and plan (nothing,
                # unless a change comes first); end the stretch, stepping goes on.
                pf.interrupt()
                continue
            yield pf.wait(st, lane)
            if eng.life != life:
                return
            del st.wake[lane]
            resumed = st.resume.pop(lane, None)
            if resumed is not None:  # its micro-batch in flight has just ended
                eng.flight[lane] = None
                eng.use_lane(lane)
                eng.iterations += 1
                eng.busy_s += resumed[1]
                eng.complete([], True)
                if not st.settled and pf.went(st, lane):
                    continue  # the stretch goes on with this lane's new batch
            continue
        if free[0] > env.now:  # the first stage holds the micro-batch before
            yield at(env, free[0])
            if eng.life != life:
                return
            continue
        eng.use_lane(lane)
        plan = eng.planner.plan()
        chunks = plan.chunks
        batch = plan.batch or Batch((), eng.batch.count, eng.batch.ctx_sum)
        if batch.is_empty:
            yield eng.idle()
            if eng.life != life:
                return
            continue
        if plan.batch is None and pf is not None and pf.plan(lane):
            continue  # a stretch covers it: wait in it with the other lanes
        first, later = perf.stage_times(batch)
        if eng.speed != 1.0:
            first, later = first / eng.speed, later / eng.speed
        if not first > 0.0 or not later >= 0.0:
            raise SpecError(
                f"perf model {perf.name!r} gave stage times {(first, later)!r}; "
                "expected the first > 0 and the later >= 0"
            )
        t = env.now + first
        free[0] = t
        for k in range(1, eng.pp):  # each stage takes the micro-batches in order
            t = (t if t > free[k] else free[k]) + later
            free[k] = t
        dt = t - env.now  # this micro-batch's latency through the pipeline
        obs = eng.iteration_observer
        if pf is not None:
            eng.claims += 1
            eng.claim_no[lane] = eng.claims
            eng.flight[lane] = (t, bool(chunks))
        eng.iteration_starts(batch, chunks, dt)
        yield at(env, t)
        if eng.life != life:
            return
        eng.flight[lane] = None
        eng.use_lane(lane)
        eng.iterations += 1
        eng.busy_s += first  # the time the pipeline's entrance was taken
        if obs is not None:
            obs.iteration_ended(env.now, eng.id)
        eng.complete(chunks, plan.decodes)
