"""Speculative decoding: the spec, the draws, one step's exact trace, the engine's
invariants under Hypothesis, and the published speed-ups."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import simpy
from helpers import small_spec
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import Linear, audit, observing, run_engine
from test_engine import scenarios as engine_scenarios
from test_every_feature import _SLOW_OK, check_run, write_trace
from test_every_feature import _run as _every_feature_run
from test_every_feature import specs as every_feature_specs

from twin.cli import main
from twin.errors import SpecError
from twin.perf.gpus import get_gpu
from twin.perf.iteration import Batch
from twin.perf.llm import get_model
from twin.perf.roofline import Roofline
from twin.request import Request
from twin.serving.engine import Engine, EngineConfig
from twin.serving.kvcache import BlockManager
from twin.serving.speculative import Speculation, SpeculativeConfig, parse, table
from twin.sim.simulation import Simulation, run

W = "spec.yaml: engine.speculative"


# -- the spec ---------------------------------------------------------------------------
def test_acceptance_forms():
    assert parse({"method": "ngram", "k": 3, "acceptance": 0.5}, W).accept == (0.5, 0.25, 0.125)
    listed = parse({"method": "eagle", "k": 2, "acceptance": [0.8, 0.6]}, W)
    assert listed.accept == (0.8, 0.6) and listed.mean_emitted == pytest.approx(2.4)
    named = parse({"method": "eagle", "k": 3, "acceptance": "vllm-eagle3-llama3.1-8b-mtbench"}, W)
    assert named.accept == (0.7296, 0.5208, 0.3545)
    assert named.mean_emitted == pytest.approx(2.60, abs=0.01)  # the row's acceptance length
    draft = parse({"method": "draft", "k": 4, "acceptance": 0.6, "draft": "llama-3.2-1b"}, W)
    assert draft.draft == "llama-3.2-1b"


def test_every_table_row_is_consistent_and_sourced():
    for name, row in table().items():
        q = row["per_position"]
        assert len(q) == row["k"] and all(0 <= v <= 1 for v in q), name
        assert list(q) == sorted(q, reverse=True), name
        # within the 5% the source holds its own mean to (vLLM DEFAULT_RTOL)
        assert 1 + sum(q) == pytest.approx(row["mean_emitted"], rel=0.05), name
        assert row["source"], name


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"method": "medusa", "k": 2, "acceptance": 0.5}, r"\.method: 'medusa'; expected one of"),
        ({"method": "eagle", "k": 0, "acceptance": 0.5}, r"\.k: 0 must be a positive integer"),
        ({"method": "eagle", "k": 2, "acceptance": 1.5}, r"\.acceptance: 1.5 must be a prob"),
        ({"method": "eagle", "k": 2, "acceptance": [0.5, 0.6]}, r"\.acceptance: .* rises"),
        ({"method": "eagle", "k": 3, "acceptance": [0.5, 0.4]}, r"must be 3 probabilities"),
        ({"method": "eagle", "k": 2, "acceptance": "mt-bench"}, r"unknown figure 'mt-bench'"),
        (
            {"method": "mtp", "k": 2, "acceptance": "deepseek-v3-mtp-low"},
            r"was measured drafting 1 tokens; k is 2",
        ),
        ({"method": "draft", "k": 2, "acceptance": 0.5}, r"\.draft: None; method draft needs"),
        (
            {"method": "eagle", "k": 2, "acceptance": 0.5, "draft": "llama-3.2-1b"},
            r"\.draft: 'llama-3.2-1b' is for method draft only",
        ),
        ({"method": "eagle", "k": 2}, r"acceptance"),
        ("eagle", r"must be a mapping"),
    ],
)
def test_bad_values_are_refused_naming_key_and_value(value, message):
    with pytest.raises(SpecError, match=message):
        parse(value, W)


def test_a_bad_value_is_one_error_line(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(
        "model: llama-3.1-8b\ncluster: {instances: 1, tp: 1}\n"
        "workload: {lengths: azure-conv, max_requests: 5}\n"
        "engine: {speculative: {method: eagle, k: 2, acceptance: 2}}\n"
    )
    rc = main(["run", str(tmp_path / "s.yaml")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("twin: error: ") and "engine.speculative.acceptance: 2" in err


# -- the draws -------------------------------------------------------------------------
def _spec(k: int, accept: tuple[float, ...], perf=None, method: str = "ngram") -> Speculation:
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    return Speculation(SpeculativeConfig(method, k, accept), perf or Linear(), model, gpu, 1, 7)


def test_draws_are_the_requests_own_and_add_up_to_what_is_left():
    sp = _spec(3, (0.7296, 0.5208, 0.3545))
    cum = sp.schedule(5, 1, 400)
    assert cum == sp.schedule(5, 1, 400)  # the same stream whatever runs beside it
    assert cum != sp.schedule(6, 1, 400) and cum != sp.schedule(5, 2, 400)
    steps = np.diff(cum)
    assert cum[0] == 0 and cum[-1] == 400
    assert steps.min() >= 1 and steps.max() <= 4
    # the per-position shares the draws give: position j accepted when a step emits > j
    big = np.diff(sp.schedule(9, 1, 200_000))[:-1]
    shares = [(big > j).mean() for j in (1, 2, 3)]
    assert shares == pytest.approx([0.7296, 0.5208, 0.3545], abs=0.01)


# -- one speculative step, exactly -----------------------------------------------------
def _run(reqs, spec: Speculation, *, blocks=1000, config=None, log=None, audit=False):
    cfg = config or EngineConfig(speculative=spec.config)
    return run_engine(
        reqs, blocks=blocks, config=cfg, perf=spec.perf, log=log, speculation=spec,
        on_engine=_audit if audit else None,
    )  # fmt: skip


def _audit(eng: Engine) -> None:
    """Check at every iteration the engine's decode aggregates against a
    brute-force count (test_engine.audit) as the decode batch reaches pricing."""
    timed = eng.iteration_time

    def audited(b: Batch) -> float:
        audit(eng, b)
        return timed(b)

    eng.iteration_time = audited  # type: ignore[method-assign]


def test_one_speculative_step_exact_trace():
    # every draft accepted: each step emits k + 1 = 4 tokens. Token 1 comes from the
    # prefill (10 ms + 100 x 1 ms); the 8 left take two verify steps, each the perf
    # model's time for one prompt-shaped chunk of 4 tokens: 10 + 4 ms.
    log: list[tuple] = []
    sp = _spec(3, (1.0, 1.0, 1.0), Linear(per_prefill=1e-3))
    eng, done = _run([Request(0, 0.0, 100, 9)], sp, log=log)
    assert log == [
        (0.0, "iteration", 0, (0,), 0),
        (pytest.approx(0.11), "iteration", 0, (), 1),
        (pytest.approx(0.124), "iteration", 0, (), 1),
        (pytest.approx(0.138), "finish", 0, 0),
    ]
    s = done[0]
    assert (s.t_first_token, s.t_finish) == pytest.approx((0.11, 0.138))
    assert s.generated == 9 and eng.batch.steps == 2 and eng.iterations == 3
    tpot = (s.t_finish - s.t_first_token) / 8
    assert tpot == pytest.approx(0.0035)  # 4 tokens visible per 14 ms step
    assert s.max_gap == pytest.approx(0.014)
    assert eng.kv.free == eng.kv.total


def test_a_verify_step_never_costs_less_than_the_decode_step():
    # a model whose prompt tokens are cheaper than decodes (0.1 against 1 ms):
    # 4 verify tokens would price at 10.4 ms, the decode step it replaces at 11
    sp = _spec(3, (1.0, 1.0, 1.0))
    assert sp.iteration_time(Batch((), 1, 101)) == pytest.approx(0.011)
    assert sp.perf.iteration_time(sp.verify_batch(Batch((), 1, 101))) == pytest.approx(0.0104)


def test_one_step_takes_the_blocks_of_its_accepted_tokens_only():
    # block size 4; the prompt of 7 tokens and token 1 fill 2 blocks. Nothing
    # accepted: each step emits one token, and the third block is taken at the
    # step whose context first passes 8 tokens.
    sp = _spec(3, (0.0, 0.0, 0.0))
    cfg = EngineConfig(block_size=4, watermark=0.0, speculative=sp.config)
    eng, done = _run([Request(0, 0.0, 7, 4)], sp, config=cfg, audit=True)
    assert done[0].generated == 4 and eng.batch.steps == 3
    assert eng.kv.peak_used == 3  # 7 + 3 tokens with KV: blocks_for(10, 4)


def test_fast_forward_is_off_and_pipelines_are_refused():
    sp = _spec(2, (0.5, 0.25))
    eng, _ = _run([Request(0, 0.0, 10, 30)], sp)
    assert eng.ff is None and eng.batch.steps < 29  # stepped, and more than a token a step
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    piped = Speculation(sp.config, Roofline(model, gpu, 1, 2), model, gpu, 1, 0)
    cfg = EngineConfig(speculative=sp.config)
    with pytest.raises(SpecError, match="speculative decoding runs on one pipeline stage"):
        Engine(simpy.Environment(), 3, piped.perf, BlockManager(100, 16), cfg, observing([]),
               speculation=piped)  # fmt: skip


def test_a_verifying_decode_takes_its_k_plus_1_tokens_of_a_chunked_budget():
    # budget 64: r0's 60-token prompt alone, then r0 verifying (4 tokens) beside
    # 60 tokens of r1's prompt (63 were a decode one token)
    sp = _spec(3, (0.0, 0.0, 0.0))
    cfg = EngineConfig(chunked_prefill=True, max_batched_tokens=64, speculative=sp.config)
    seen: list[tuple[int, int]] = []

    def record(eng: Engine) -> None:
        timed = eng.iteration_time

        def noted(b: Batch) -> float:
            seen.append((b.prefill_tokens, b.decode_count))
            return timed(b)

        eng.iteration_time = noted  # type: ignore[method-assign]

    reqs = [Request(0, 0.0, 60, 3), Request(1, 0.001, 100, 2)]
    run_engine(reqs, config=cfg, perf=sp.perf, speculation=sp, on_engine=record)
    assert seen[:3] == [(60, 0), (60, 1), (40, 1)]


# -- invariants under Hypothesis ---------------------------------------------------------
@st.composite
def scenarios(draw):
    """The engine's random workloads (test_engine), served speculatively."""
    reqs, blocks, cfg = draw(engine_scenarios())
    k = draw(st.integers(1, 6))
    a = draw(st.sampled_from([0.0, 0.3, 0.7, 0.95, 1.0]))
    sp = _spec(k, tuple(a**j for j in range(1, k + 1)), Linear(per_context=1e-6))
    return reqs, blocks, dataclasses.replace(cfg, speculative=sp.config), sp


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_invariants_hold_under_speculation(scenario):
    reqs, blocks, cfg, sp = scenario
    log: list[tuple] = []
    eng, done = _run(reqs, sp, blocks=blocks, config=cfg, log=log, audit=True)
    # every request ends exactly once, having emitted exactly its output length
    assert sorted(s.req.id for s in done) == [r.id for r in reqs]
    for s in done:
        assert s.generated == s.req.output_tokens
        assert s.req.arrival_s <= s.t_scheduled <= s.t_first_token <= s.t_finish
        if s.req.output_tokens > 1:
            tpot = (s.t_finish - s.t_first_token) / (s.req.output_tokens - 1)
            assert s.max_gap >= tpot - 1e-12
        if s.emit is not None:  # its last decode stretch: 1 to k + 1 tokens a step, to the end
            steps = np.diff(s.emit)
            assert steps.min() >= 1 and steps.max() <= sp.k + 1
            assert s.g_join + s.emit[-1] == s.req.output_tokens
    # KV never above capacity, all of it free at the end (but idle cached prompts),
    # the per-step table spent
    cached = eng.cache.cached_blocks if eng.cache is not None else 0
    assert eng.kv.peak_used <= blocks and eng.kv.free + cached == eng.kv.total
    assert eng.batch.count == 0 and eng.batch.ctx_sum == 0 and not eng.batch._spec_delta
    times = [e[0] for e in log]
    assert times == sorted(times)


# -- a whole run -------------------------------------------------------------------------
def test_a_run_is_deterministic_and_faster_per_token():
    spec = {"method": "eagle", "k": 3, "acceptance": "vllm-eagle3-llama3.1-8b-mtbench"}
    on = run(small_spec(requests=60, rate=2.0, engine={"speculative": spec}))
    again = run(small_spec(requests=60, rate=2.0, engine={"speculative": spec}))
    off = run(small_spec(requests=60, rate=2.0))
    assert on.summary == again.summary
    assert on.summary["completed"] == off.summary["completed"] == 60
    assert on.summary["tpot_s"]["mean"] < 0.8 * off.summary["tpot_s"]["mean"]


# -- the published speed-ups -------------------------------------------------------------
def speedup(perf, spec: Speculation, batch: int, context: int) -> float:
    """Tokens per second per sequence with speculation over without, at a
    decode batch of ``batch`` sequences of ``context`` tokens each."""
    b = Batch((), batch, batch * context)
    return spec.config.mean_emitted * perf.iteration_time(b) / spec.iteration_time(b)


@pytest.mark.parametrize("row", ["deepseek-v3-mtp-low", "deepseek-v3-mtp-high"])
@pytest.mark.parametrize("batch", [64, 256, 1024])
def test_deepseek_v3_mtp_speedup_matches_the_report(row, batch):
    """DeepSeek-V3 Technical Report (arXiv 2412.19437), section 5.4.3: its MTP
    module drafts one token, accepted 85% to 90% of the time, for 1.8x the
    tokens per second. Its decode layout (section 3.4.2): attention TP4, MoE
    expert-parallel across the instance, on H800; EP 256 here (the report's 320
    GPUs hold the 256 routed experts plus redundant and shared ones). The report
    gives no batch: held from one to sixteen sequences per attention rank
    (64 ranks), contexts of 2,000 tokens."""
    model, gpu = get_model("deepseek-v3"), get_gpu("h800")
    perf = Roofline(model, gpu, 4, ep=256, dp=64)
    cfg = parse({"method": "mtp", "k": 1, "acceptance": row}, W)
    sp = Speculation(cfg, perf, model, gpu, 4, 0)
    assert speedup(perf, sp, batch, 2000) == pytest.approx(1.8, rel=0.15)


def test_the_gain_fades_as_batches_grow():
    """Llama-3.1-70B on 8 H100s with EAGLE-3 at vLLM's measured Llama-3.1 acceptance:
    a small batch is memory-bound and verifying 4 tokens costs about what 1 does;
    a large one is compute-bound and pays for every drafted token."""
    model, gpu = get_model("llama-3.1-70b"), get_gpu("h100-sxm")
    perf = Roofline(model, gpu, 8)
    cfg = parse({"method": "eagle", "k": 3, "acceptance": "vllm-eagle3-llama3.1-8b-mtbench"}, W)
    sp = Speculation(cfg, perf, model, gpu, 8, 0)
    gains = [speedup(perf, sp, b, 1000) for b in (1, 64, 128, 256, 512)]
    assert gains[0] > 2.0
    assert gains == sorted(gains, reverse=True) and gains[-1] < 1.0


def _study(tmp_path, rate: int) -> dict[str, dict]:
    """The bundled study's plain and eagle3 summaries at ``rate`` requests/s."""
    out = tmp_path / f"r{rate}.json"
    sets = ["--set", f"workload.arrival.rate={rate}", "--set", "workload.max_requests=300"]
    assert main(["run", "speculative", *sets, "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    return {label: run["summary"] for label, run in runs.items()}


def test_the_bundled_study_shows_the_gain_fading_with_load(tmp_path, capsys):
    def gain(rate: int) -> float:
        s = _study(tmp_path, rate)
        return s["plain"]["tpot_s"]["p50"] / s["eagle3"]["tpot_s"]["p50"]

    light, heavy = gain(1), gain(48)
    assert light > 2.0  # 2.6 tokens a step, verifying 4 costs about what 1 does
    assert 1.0 < heavy < 0.7 * light


# -- every feature together ---------------------------------------------------------------
@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory):
    return write_trace(tmp_path_factory.mktemp("trace") / "prefixes.jsonl")


def _one_stage(d: dict) -> bool:
    """One pipeline stage on every instance (of each model, with several)."""
    clusters = [m["cluster"] for m in d["models"].values()] if "models" in d else [d["cluster"]]
    return all(c["pp"] == 1 for c in clusters)


@st.composite
def speculative_specs(draw):
    """test_every_feature's random specs (split or colocated, hand-offs, faults,
    retries, tiers and pools, scaling, rate schedules), one pipeline stage,
    each instance decoding speculatively."""
    data = draw(every_feature_specs().filter(_one_stage))
    method = draw(st.sampled_from(["eagle", "ngram", "draft"]))
    spec = {"method": method, "k": draw(st.integers(1, 5)), "acceptance": draw(
        st.sampled_from([0.0, 0.6, 0.9, 1.0]))}  # fmt: skip
    if method == "draft":
        spec["draft"] = "llama-3.2-1b"
    data["engine"]["speculative"] = spec
    return data


@settings(max_examples=25, deadline=None, suppress_health_check=_SLOW_OK)
@given(data=speculative_specs())
def test_every_feature_with_speculation_conserves_and_orders(data, trace):
    out, sim = _every_feature_run(data, trace, True)  # fast-forward asked for: it stays off
    check_run(out, sim)
    assert all(e.spec is not None and e.ff is None for e in sim.engines)


def test_a_routers_estimates_see_the_verify_step_and_its_tokens():
    spec = {"method": "eagle", "k": 3, "acceptance": "vllm-eagle3-llama3.1-8b-mtbench"}
    sim = Simulation(small_spec(requests=5, engine={"speculative": spec}))
    view, eng = sim.view.instances[0], sim.engines[0]
    sp = eng.spec
    assert sp is not None
    step = sp.iteration_time(Batch((), 32, 32_000))
    assert view.estimate_decode_s(32, 32_000) == pytest.approx(
        step / (1 + 0.7296 + 0.5208 + 0.3545)
    )
    assert view.estimate_decode_s(32, 32_000) < eng.perf.iteration_time(Batch((), 32, 32_000))
    prompt = Batch(((1000, 0),))
    assert view.estimate_prefill_s(1000) == sp.iteration_time(prompt)
    assert view.estimate_prefill_s(1000) > eng.perf.iteration_time(prompt)  # the head's too


@pytest.mark.parametrize(
    ("spec", "config"),
    [
        (
            {"method": "mtp", "k": 1, "acceptance": "deepseek-v3-mtp-high"},
            {"method": "mtp", "num_speculative_tokens": 1},
        ),
        (
            {"method": "draft", "k": 4, "acceptance": 0.6, "draft": "llama-3.2-1b"},
            {"model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 4},
        ),
    ],
)
def test_an_export_carries_the_speculative_config_and_its_assumption(spec, config):
    from twin.studies.export import engine_args

    args, notes = engine_args(small_spec(requests=5, engine={"speculative": spec}))
    assert json.loads(args["--speculative-config"]) == config
    assert any("simulated at an assumed acceptance of" in n for n in notes)


def test_a_decoding_request_that_times_out_leaves_the_step_table():
    """Client time-outs (workload.timeout) take speculative decodes out of the
    batch: each one's tokens to come leave the per-step table, the context sum
    stays the brute-force count at every iteration, and nothing is left over.
    r0 and r1 (400 tokens, some 12 ms a step for 2.2 of them) are decoding at
    0.5 s; r2 (5 tokens) is done long before."""
    spec = {"method": "ngram", "k": 3, "acceptance": 0.6}
    reqs = [Request(0, 0.0, 100, 400), Request(1, 0.0, 100, 400), Request(2, 0.0, 50, 5)]
    rows: list[dict] = []
    sim = Simulation(
        small_spec(engine={"speculative": spec}, cluster={"instances": 1, "tp": 1},
                   workload={"lengths": "azure-conv", "timeout": "0.5 s",
                             "arrival": {"process": "poisson", "rate": 1}, "max_requests": 3}),
        requests=reqs, perf=Linear(per_context=1e-6), on_row=rows.append,
    )  # fmt: skip
    _audit(sim.engines[0])
    sim.run()
    by_id = {r["id"]: r for r in rows}
    assert [by_id[i]["status"] for i in range(3)] == ["failed", "failed", "completed"]
    assert by_id[0]["reason"] == by_id[1]["reason"] == "timeout"
    e = sim.engines[0]
    assert e.batch.count == 0 and e.batch.ctx_sum == 0 and not e.batch._spec_delta
    assert e.kv.free == e.kv.total
