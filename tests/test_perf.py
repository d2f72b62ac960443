from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twin.errors import ProfileError, SpecError
from twin.perf.build import build_perf_model
from twin.perf.gpus import get_gpu
from twin.perf.iteration import Batch
from twin.perf.llm import get_model
from twin.perf.roofline import Roofline
from twin.perf.tables import DistServeFit, ProfileTable

L70 = get_model("llama-2-70b")
A100 = get_gpu("a100-80gb")
H100 = get_gpu("h100")


def prefill(*lens: int) -> Batch:
    return Batch(prefill=tuple((n, 0) for n in lens))


def test_empty_batch_costs_nothing() -> None:
    assert Roofline(L70, A100, 8).iteration_time(Batch()) == 0.0


def test_decode_batch1_is_memory_bound() -> None:
    r = Roofline(L70, H100, 1, mfu=0.5, mbu=0.8, overhead_s=0.0, layer_overhead_s=0.0,
                 seq_overhead_s=0.0, hop_latency_s=0.0, tp_mfu_exponent=0.0)  # fmt: skip
    t = r.iteration_time(Batch(decode_count=1, decode_context_sum=1000))
    weights_s = L70.weight_bytes / (H100.hbm_bytes_s * 0.8)
    assert t == pytest.approx(weights_s, rel=0.01)  # KV of 1,000 tokens is ~0.2% of weights


def test_tp_reduces_time() -> None:
    for b in (prefill(2048), Batch(decode_count=32, decode_context_sum=32 * 1000)):
        times = [Roofline(L70, A100, tp).iteration_time(b) for tp in (1, 2, 4, 8)]
        assert times == sorted(times, reverse=True)


def test_pp_is_sequential_and_never_faster() -> None:
    b = prefill(1024)
    assert Roofline(L70, A100, 2, 2).iteration_time(b) > Roofline(L70, A100, 2).iteration_time(b)
    with pytest.raises(SpecError, match="pp=3 does not divide"):
        Roofline(L70, A100, 1, 3)


@given(
    n=st.integers(1, 8192),
    extra=st.integers(1, 4096),
    cached=st.integers(0, 8192),
    dec=st.integers(0, 256),
    ctx=st.integers(1, 4096),
)
def test_more_tokens_never_faster(n: int, extra: int, cached: int, dec: int, ctx: int) -> None:
    r = Roofline(L70, A100, 4)
    base = Batch(prefill=((n, cached),), decode_count=dec, decode_context_sum=dec * ctx)
    more = Batch(prefill=((n + extra, cached),), decode_count=dec, decode_context_sum=dec * ctx)
    longer = Batch(prefill=((n, cached),), decode_count=dec + 1,
                   decode_context_sum=dec * ctx + ctx)  # fmt: skip
    t = r.iteration_time(base)
    assert r.iteration_time(more) > t
    assert r.iteration_time(longer) > t
    assert r.iteration_time(base) == t  # pure


def test_per_gpu_efficiency_defaults_and_override() -> None:
    from twin.perf.presets import DEFAULT_HOP_LATENCY_S, DEFAULT_MFU, GPU_EFFICIENCY

    r = Roofline(L70, H100, 4)
    eff = (r.mfu, r.mbu, r.attn_mfu, r.throttle, r.throttle_knee_s, r.l2_speedup,
           r.hop_latency_s)  # fmt: skip
    assert eff == GPU_EFFICIENCY["h100-sxm"]
    assert r.hop_latency_s < Roofline(L70, A100, 4).hop_latency_s  # NVLink 4 against NVLink 3
    assert Roofline(L70, H100, 4, mfu=0.5).mfu == 0.5
    assert Roofline(L70, H100, 4, hop_latency_s=1e-5).hop_latency_s == 1e-5
    other = Roofline(L70, get_gpu("mi300x"), 4)
    assert other.mfu == DEFAULT_MFU and other.throttle == 0.0  # no throttle without data
    assert other.hop_latency_s == DEFAULT_HOP_LATENCY_S
    # L40S: its own kernel-fitted shares (tests/test_kernel_fit.py), no throttle, no L2 term
    l40s = Roofline(L70, get_gpu("l40s"), 4)
    mfu, mbu, attn_mfu, *_, hop = GPU_EFFICIENCY["l40s"]
    assert (l40s.mfu, l40s.mbu, l40s.attn_mfu, l40s.hop_latency_s) == (mfu, mbu, attn_mfu, hop)
    assert (l40s.throttle, l40s.l2_speedup) == (0.0, 1.0)


def test_sustained_power_throttle() -> None:
    # compute-bound prefill: compute time past the knee runs 1 + throttle times slower
    # (compute + throttle x max(compute - knee, 0)), so long GEMM phases cost more per token
    kw = {"mfu": 0.5, "overhead_s": 0.0, "layer_overhead_s": 0.0, "seq_overhead_s": 0.0,
          "seq_shard_overhead_s": 0.0, "hop_latency_s": 0.0, "act_traffic": 0.0,
          "no_overlap": 0.0, "attn_mfu": 1.0}  # fmt: skip
    free = Roofline(L70, A100, 1, throttle=0.0, **kw)
    hot = Roofline(L70, A100, 1, throttle=0.5, throttle_knee_s=1.0, **kw)
    b = prefill(16384)
    c = free.iteration_time(b)
    assert c > 1.0  # compute-bound, longer than the knee
    assert hot.iteration_time(b) == pytest.approx(c + 0.5 * (c - 1.0))
    # per-token cost rises with the iteration's work, whether one prompt or many
    per_tok = [hot.iteration_time(prefill(*[512] * k)) / (512 * k) for k in (1, 4, 16, 64)]
    assert per_tok == sorted(per_tok) and per_tok[0] < per_tok[-1]
    # an iteration under the knee, e.g. a decode step, is untouched
    d = Batch(decode_count=8, decode_context_sum=8 * 1000)
    assert hot.iteration_time(d) == free.iteration_time(d)
    short = prefill(512)
    assert free.iteration_time(short) < 1.0
    assert hot.iteration_time(short) == free.iteration_time(short)
    # a knee of 0 throttles all compute: the same as a lower mfu
    always = Roofline(L70, A100, 1, throttle=1.0, throttle_knee_s=0.0, **kw)
    assert always.iteration_time(b) == pytest.approx(2 * c)
    with pytest.raises(SpecError, match="throttle_knee_s=-1"):
        Roofline(L70, A100, throttle_knee_s=-1)
    with pytest.raises(SpecError, match="throttle=-1"):
        Roofline(L70, A100, throttle=-1)
    r = build_perf_model({"kind": "roofline", "throttle": 0.2, "throttle_knee": "300 ms"},
                         L70, A100, 4)  # fmt: skip
    assert isinstance(r, Roofline)
    assert (r.throttle, r.throttle_knee_s) == (0.2, pytest.approx(0.3))
    with pytest.raises(SpecError, match="throttle_knee"):
        build_perf_model({"kind": "roofline", "throttle_knee": "-1 s"}, L70, A100, 4)


def test_default_preset_decode_sanity() -> None:
    # the default (vllm) preset stays close to what vLLM V1 measures: Llama-2-70B on 4 x H100
    # steps in 19-22 ms at 38-108 sequences (shared/data/realruns), so on 8 GPUs in less; an
    # 8B model on one H100 reads 16 GB of weights and 8 GB of KV here, 7 ms at 3.35 TB/s
    h100 = get_gpu("h100-sxm")
    big = Roofline(L70, h100, 8).iteration_time(
        Batch(decode_count=64, decode_context_sum=64 * 1024)
    )
    assert 0.012 <= big <= 0.022, big  # priced at 17 ms
    small = Roofline(get_model("llama-3.1-8b"), h100, 1).iteration_time(
        Batch(decode_count=64, decode_context_sum=64 * 1024)
    )
    assert 0.007 <= small <= 0.015, small  # priced at 9.9 ms


def test_attention_efficiency_makes_long_prompts_superlinear() -> None:
    r = Roofline(L70, A100, 8)
    per_token = [r.iteration_time(prefill(n)) / n for n in (8192, 16384, 32768)]
    assert per_token == sorted(per_token)
    slow = Roofline(L70, A100, 8, attn_mfu=0.05).iteration_time(prefill(8192))
    assert slow > r.iteration_time(prefill(8192))
    # a cached prefix costs attention work and KV reads
    assert r.iteration_time(Batch(prefill=((512, 4096),))) > r.iteration_time(prefill(512))


def test_act_traffic_and_no_overlap_add_time() -> None:
    b = Batch(decode_count=64, decode_context_sum=64 * 1000)
    base = Roofline(L70, A100, 4, act_traffic=0.0, no_overlap=0.0).iteration_time(b)
    assert Roofline(L70, A100, 4, no_overlap=0.0).iteration_time(b) > base
    assert Roofline(L70, A100, 4, act_traffic=0.0, no_overlap=0.5).iteration_time(b) > base
    with pytest.raises(SpecError, match="no_overlap=2"):
        Roofline(L70, A100, no_overlap=2)


def test_build_perf_model_accepts_new_roofline_keys() -> None:
    spec = {"kind": "roofline", "attn_mfu": 0.3, "act_traffic": 10, "no_overlap": 0.1}
    r = build_perf_model(spec, L70, A100, 4)
    assert isinstance(r, Roofline)
    assert (r.attn_mfu, r.act_traffic, r.no_overlap) == (0.3, 10.0, 0.1)
    with pytest.raises(SpecError, match="no_overlap"):
        build_perf_model({"kind": "roofline", "no_overlap": 1.5}, L70, A100, 4)
    with pytest.raises(SpecError, match="unknown key 'bogus'"):
        build_perf_model({"kind": "roofline", "bogus": 1}, L70, A100, 4)


def test_engine_presets_default_override_and_unknown() -> None:
    from twin.errors import UnknownNameError
    from twin.perf.presets import ENGINE_OVERHEADS, ENGINE_TERMS, GPU_EFFICIENCY, KERNEL_TERMS

    assert set(ENGINE_OVERHEADS) == {"splitwise-sim", "distserve", "vllm"}
    for preset in ENGINE_OVERHEADS.values():
        assert set(ENGINE_TERMS) <= set(preset) <= {*ENGINE_TERMS, *KERNEL_TERMS}
    with pytest.raises(TypeError):
        ENGINE_OVERHEADS["splitwise-sim"]["overhead_s"] = 1.0  # type: ignore[index]
    # the default is the vllm preset (new specs; the bundled experiments name distserve)
    r = Roofline(L70, A100, 4)
    assert r.engine == "vllm"
    assert r.name == "roofline:llama-2-70b@a100-80gbx4"
    vllm = ENGINE_OVERHEADS["vllm"]
    assert {k: getattr(r, k) for k in ENGINE_TERMS} == {k: vllm[k] for k in ENGINE_TERMS}
    assert r.moe_efficiency == vllm["moe_efficiency"]
    r = Roofline(L70, A100, 4, engine="distserve")
    assert r.name == "roofline:llama-2-70b@a100-80gbx4:distserve"
    assert {k: getattr(r, k) for k in ENGINE_TERMS} == dict(ENGINE_OVERHEADS["distserve"])
    assert r.moe_efficiency == 1.0  # a preset without the kernel term
    d = Roofline(L70, A100, 4, engine="splitwise-sim")
    assert {k: getattr(d, k) for k in ENGINE_TERMS} == dict(ENGINE_OVERHEADS["splitwise-sim"])
    assert d.name.endswith(":splitwise-sim")
    # GPU efficiencies are shared by the engines
    eff = (d.mfu, d.mbu, d.attn_mfu, d.throttle, d.throttle_knee_s, d.l2_speedup,
           d.hop_latency_s)  # fmt: skip
    assert eff == (r.mfu, r.mbu, r.attn_mfu, r.throttle, r.throttle_knee_s, r.l2_speedup,
                   r.hop_latency_s)  # fmt: skip
    assert eff == GPU_EFFICIENCY["a100-80gb"]
    b = Batch(decode_count=32, decode_context_sum=32 * 1000)
    assert d.iteration_time(b) != r.iteration_time(b)
    # one term overridden, the others from the preset
    o = Roofline(L70, A100, 4, engine="distserve", seq_overhead_s=1e-3)
    assert o.seq_overhead_s == 1e-3
    assert o.act_traffic == ENGINE_OVERHEADS["distserve"]["act_traffic"]
    assert o.overhead_s == ENGINE_OVERHEADS["distserve"]["overhead_s"]
    # per-sequence cost split by TP
    s1 = Roofline(L70, A100, 1, seq_shard_overhead_s=8e-4, seq_overhead_s=0.0)
    s8 = Roofline(L70, A100, 8, seq_shard_overhead_s=8e-4, seq_overhead_s=0.0)
    assert s1._seq == pytest.approx(8e-4) and s8._seq == pytest.approx(1e-4)
    with pytest.raises(UnknownNameError, match="unknown serving engine 'distsrve'.*'distserve'"):
        Roofline(L70, A100, 4, engine="distsrve")


def test_build_perf_model_engine_key() -> None:
    from twin.errors import UnknownNameError
    from twin.perf.presets import ENGINE_OVERHEADS

    r = build_perf_model({"kind": "roofline", "engine": "distserve"}, L70, A100, 4)
    assert isinstance(r, Roofline) and r.engine == "distserve"
    r = build_perf_model(
        {"kind": "roofline", "engine": "distserve", "seq_shard_overhead": "0.2 ms"}, L70, A100, 4
    )
    assert isinstance(r, Roofline)
    assert r.seq_shard_overhead_s == pytest.approx(2e-4)
    assert r.no_overlap == ENGINE_OVERHEADS["distserve"]["no_overlap"]
    default = build_perf_model(None, L70, A100, 4)
    assert isinstance(default, Roofline) and default.engine == "vllm"
    with pytest.raises(UnknownNameError, match="Did you mean 'distserve'"):
        build_perf_model({"kind": "roofline", "engine": "distserv"}, L70, A100, 4)
    with pytest.raises(SpecError, match="engine: 3"):
        build_perf_model({"kind": "roofline", "engine": 3}, L70, A100, 4)


def test_roofline_rejects_bad_params() -> None:
    with pytest.raises(SpecError, match="mfu=1.5 must be a number in"):
        Roofline(L70, A100, mfu=1.5)
    with pytest.raises(SpecError, match="tp=0 must be a positive integer"):
        Roofline(L70, A100, 0)


SPLITWISE = Path("profiles/splitwise_sim/perf_model.csv")
DISTSERVE = Path("profiles/distserve/profiler-a100-80g.distserve.json")


def test_profile_table_reproduces_splitwise_points(shared_data: Path) -> None:
    path = shared_data / SPLITWISE
    t = ProfileTable.from_splitwise(path, "llama2-70b", "h100-80gb", 8)
    rows = [r for r in csv.DictReader(path.open()) if r["model"] == "llama2-70b"
            and r["hardware"] == "h100-80gb" and r["tensor_parallel"] == "8"]  # fmt: skip
    # (P=2048, B=1) runs 5 times; the table holds their median
    runs = sorted(float(r["prompt_time"]) for r in rows if (r["prompt_size"], r["batch_size"])
                  == ("2048", "1"))  # fmt: skip
    assert t.iteration_time(prefill(2048)) == pytest.approx(runs[len(runs) // 2] / 1e3)
    runs = sorted(float(r["token_time"]) for r in rows if (r["prompt_size"], r["batch_size"],
                  r["token_size"]) == ("512", "16", "128"))  # fmt: skip
    b = Batch(decode_count=16, decode_context_sum=16 * (512 + 64))
    assert t.iteration_time(b) == pytest.approx(runs[len(runs) // 2] / 1e3)
    assert len(t.sha256 or "") == 64


def test_profile_table_unknown_combo_lists_available(shared_data: Path) -> None:
    with pytest.raises(ProfileError, match="available: .*llama2-70b/h100-80gb/tp8"):
        ProfileTable.from_splitwise(shared_data / SPLITWISE, "llama2-70b", "h100-80gb", 16)


def write_native(tmp_path: Path) -> Path:
    p = tmp_path / "prof.csv"
    p.write_text(
        "phase,batch_size,tokens,context,time_s\n"
        "prefill,1,512,0,0.050\nprefill,1,1024,0,0.090\nprefill,4,512,0,0.160\n"
        "decode,1,1,512,0.020\ndecode,1,1,2048,0.024\ndecode,8,1,512,0.022\n"
        "decode,8,1,2048,0.030\n"
    )
    return p


def test_native_table_points_and_interpolation(tmp_path: Path) -> None:
    t = ProfileTable.from_native(write_native(tmp_path))
    assert t.iteration_time(prefill(512)) == 0.050
    assert t.iteration_time(prefill(768)) == pytest.approx(0.070)  # linear in tokens
    assert t.iteration_time(prefill(2048)) == pytest.approx(0.180)  # last per-token rate
    assert t.iteration_time(prefill(512, 512, 512, 512)) == 0.160
    assert t.iteration_time(Batch(decode_count=8, decode_context_sum=8 * 2048)) == 0.030
    mid = t.iteration_time(Batch(decode_count=8, decode_context_sum=8 * 1280))
    assert mid == pytest.approx(0.026)
    # mixed: prefill part plus decode's marginal cost over a batch of one
    mixed = Batch(prefill=((512, 0),), decode_count=8, decode_context_sum=8 * 512)
    assert t.iteration_time(mixed) == pytest.approx(0.050 + 0.022 - 0.020)


def test_native_table_bad_header(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("phase,batch,tokens\n")
    with pytest.raises(ProfileError, match="expected phase,batch_size,tokens,context,time_s"):
        ProfileTable.from_native(p)


def test_distserve_fit_formula(tmp_path: Path) -> None:
    p = tmp_path / "fit.json"
    p.write_text(json.dumps({"m": {"1": {"decoding_large_small_bs_threshold": 4,
        "prefill": [10, 0.1, 1e-5], "decoding_smallbs": [20, 0.001, 0.5],
        "decoding_largebs": [7, 0.002, 0.25]}}}))  # fmt: skip
    f = DistServeFit.from_json(p, "m", 1)
    assert f.iteration_time(prefill(100, 300)) == pytest.approx(
        (10 + 0.1 * 400 + 1e-5 * (100**2 + 300**2)) / 1e3
    )
    assert f.iteration_time(Batch(decode_count=3, decode_context_sum=900)) == pytest.approx(
        (20 + 0.9 + 1.5) / 1e3
    )
    assert f.iteration_time(Batch(decode_count=4, decode_context_sum=900)) == pytest.approx(
        (7 + 1.8 + 1.0) / 1e3
    )
    with pytest.raises(ProfileError, match="available: m tp1"):
        DistServeFit.from_json(p, "m", 2)


_FIT = {
    "m": {
        "1": {
            "decoding_large_small_bs_threshold": 4,
            "prefill": [10, 0.1, 1e-5],
            "decoding_smallbs": [20, 0.001, 0.5],
            "decoding_largebs": [7, 0.002, 0.25],
        }
    }
}


def test_distserve_overheads_by_hand(tmp_path: Path) -> None:
    p = tmp_path / "fit.json"
    p.write_text(json.dumps(_FIT))
    bare = DistServeFit.from_json(p, "m", 1)
    f = DistServeFit.from_json(
        p, "m", 1, overhead_s=2e-3, token_overhead_s=1e-7, prefill_overhead_s=1e-3
    )
    # two prompts, 100 and 300 tokens: fit 10 + 40 + 1.0 = 51 ms; overheads 2 ms + 400 tokens
    # x 1e-4 ms + 1 ms for a prefill iteration
    two = prefill(100, 300)
    assert bare.iteration_time(two) == pytest.approx(51e-3)
    assert f.iteration_time(two) == pytest.approx((51 + 2 + 0.04 + 1) / 1e3)
    # three decodes, 900 context tokens counting the token fed in (897 without): 22.4 ms
    # fitted; + 2 ms + 897 x 1e-4 ms, and no prefill term
    three = Batch(decode_count=3, decode_context_sum=900)
    assert bare.iteration_time(three) == pytest.approx(22.4e-3)
    assert f.iteration_time(three) == pytest.approx((22.4 + 2 + 0.0897) / 1e3)
    # a chunk of 50 tokens after 250 cached counts 300 context tokens
    chunk = Batch(prefill=((50, 250),))
    fit_ms = 10 + 0.1 * 50 + 1e-5 * 50 * (50 + 500)
    assert f.iteration_time(chunk) == pytest.approx((fit_ms + 2 + 0.03 + 1) / 1e3)
    assert f.iteration_time(Batch()) == 0.0


def test_distserve_pipeline_stages_by_hand(tmp_path: Path) -> None:
    p = tmp_path / "fit.json"
    p.write_text(json.dumps(_FIT))
    f = DistServeFit.from_json(
        p, "m", 1, pp=2, overhead_s=2e-3, token_overhead_s=1e-7, prefill_overhead_s=1e-3
    )
    # each stage runs half the fit; a prefill stage adds pp x 1 ms; the first stage pays the
    # per-iteration and per-token costs
    first, rest = f.stage_times(prefill(100, 300))
    assert rest == pytest.approx((51 / 2 + 2) / 1e3)
    assert first == pytest.approx(rest + (2 + 0.04) / 1e3)
    assert f.iteration_time(prefill(100, 300)) == pytest.approx(first + rest)
    first, rest = f.stage_times(Batch(decode_count=3, decode_context_sum=900))
    assert (first, rest) == pytest.approx(((11.2 + 2 + 0.0897) / 1e3, 11.2e-3))


def _simdistserve_ms(prompts: list[int], contexts: list[int], fit: dict, pp: int) -> float:
    """simdistserve's time for one iteration through all ``pp`` stages, in ms, written out from
    its formulas (LLMServe/DistServe 82831f1: estimators/time_estimator.py get_prefill_time and
    get_decode_time per stage; base/worker.py add_ray_overhead on the first stage): a prefill
    iteration of ``prompts`` or a decode iteration of requests at ``contexts`` (prompt plus
    tokens produced)."""
    if prompts:
        a, b, c = fit["prefill"]
        stage = (a + b * sum(prompts) + c * sum(x * x for x in prompts)) / pp + 1 * pp
        tokens = sum(prompts)
    else:
        small = len(contexts) < fit["decoding_large_small_bs_threshold"]
        a, b, c = fit["decoding_smallbs" if small else "decoding_largebs"]
        stage = (a + b * sum(x + 1 for x in contexts) + c * len(contexts)) / pp
        tokens = sum(contexts)
    return pp * stage + 2 + 0.0001 * tokens


@pytest.mark.parametrize("pp", [1, 2])
def test_the_distserve_kind_defaults_to_simdistserves_formula(shared_data: Path, pp: int) -> None:
    path = shared_data / DISTSERVE
    fit = json.loads(path.read_text())["facebook/opt-13b"]["1"]
    ds = build_perf_model(
        {"kind": "distserve", "path": str(path)}, get_model("opt-13b"), A100, 1, pp
    )
    for prompts in ([512], [128, 1024, 40]):
        batch = prefill(*prompts)
        assert ds.iteration_time(batch) * 1e3 == pytest.approx(
            _simdistserve_ms(prompts, [], fit, pp), rel=1e-12
        )
    for contexts in ([600] * 8, [512 + i for i in range(120)]):  # either side of the threshold
        # pd-twin's decode context of a sequence counts the token fed in
        batch = Batch(decode_count=len(contexts), decode_context_sum=sum(contexts) + len(contexts))
        assert ds.iteration_time(batch) * 1e3 == pytest.approx(
            _simdistserve_ms([], contexts, fit, pp), rel=1e-12
        )
    zero = build_perf_model(
        {"kind": "distserve", "path": str(path), "overhead": 0, "token_overhead": "0 s",
         "prefill_overhead": "0 ms"},
        get_model("opt-13b"), A100, 1,
    )  # fmt: skip
    bare = DistServeFit.from_json(path, "facebook/opt-13b", 1)
    assert zero.iteration_time(prefill(512)) == bare.iteration_time(prefill(512))


def test_distserve_real_file(shared_data: Path) -> None:
    f = DistServeFit.from_json(shared_data / DISTSERVE, "facebook/opt-13b", 1)
    a, b, c = 18.10254647486372, 0.1019122572698738, 7.122264314252114e-06
    assert f.iteration_time(prefill(1000)) == pytest.approx((a + b * 1000 + c * 1e6) / 1e3)


def test_build_perf_model(tmp_path: Path) -> None:
    r = build_perf_model({"kind": "roofline", "mfu": 0.4, "overhead": "3 ms"}, L70, A100, 4)
    assert isinstance(r, Roofline) and r.mfu == 0.4 and r.overhead_s == pytest.approx(3e-3)
    assert isinstance(build_perf_model(None, L70, A100, 4), Roofline)
    write_native(tmp_path)
    t = build_perf_model({"kind": "profile", "path": "prof.csv", "format": "native"}, L70, A100,
                         4, base_dir=tmp_path)  # fmt: skip
    assert isinstance(t, ProfileTable) and t.sha256 is not None
    with pytest.raises(SpecError, match="spec.yaml: perf: unknown key 'mfuu' for kind roofline; "
                       "expected one of kind, mfu, mbu"):  # fmt: skip
        build_perf_model({"kind": "roofline", "mfuu": 0.4}, L70, A100, 4, where="spec.yaml: perf")
    with pytest.raises(SpecError, match="kind: 'table'; expected one of roofline, profile"):
        build_perf_model({"kind": "table"}, L70, A100, 4)
    with pytest.raises(SpecError, match="overhead: '3 parsec' is not a duration"):
        build_perf_model({"kind": "roofline", "overhead": "3 parsec"}, L70, A100, 4)


def test_profile_and_fit_rows_are_found_under_catalog_spellings(shared_data):
    from twin.perf.build import build_perf_model
    from twin.perf.gpus import get_gpu
    from twin.perf.llm import get_model

    sw = build_perf_model(
        {"kind": "profile", "path": "profiles/splitwise_sim/perf_model.csv"},
        get_model("llama-2-70b"),
        get_gpu("h100-sxm"),
        8,
        base_dir=shared_data,
    )
    assert sw.sha256 == "dbbe505d1d64fc4bd1ec03c50edf944643586de4f68a81e94cbd55dd5bdfbf41"
    ds = build_perf_model(
        {"kind": "distserve", "path": "profiles/distserve/profiler-a100-80g.distserve.json"},
        get_model("opt-13b"),
        get_gpu("a100-80gb"),
        1,
        base_dir=shared_data,
    )
    assert ds.iteration_time(Batch(((512, 0),))) > 0


def test_defaults_within_plausible_bounds() -> None:
    # every hard-coded fitted default lies within the bounds the calibration enforces
    from twin.perf.calibrate import _BOUNDS, _EFF, _LINK, CAPPED, ENGINES, GPUS
    from twin.perf.presets import ENGINE_OVERHEADS, ENGINE_TERMS, GPU_EFFICIENCY

    values = [(k, v) for g in GPUS for k, v in zip((*_EFF, *_LINK), GPU_EFFICIENCY[g], strict=True)]
    values += [("sustained_clock", get_gpu(g).sustained_clock) for g in CAPPED]
    values += [(k, ENGINE_OVERHEADS[e][k]) for e in ENGINES for k in ENGINE_TERMS]
    for k, v in values:
        lo, hi, _ = _BOUNDS[k]
        assert v <= hi and (v == 0.0 or v >= lo), (k, v)


def _act_only(**kw: float) -> Roofline:
    """A Roofline whose iteration time beyond the weights' read is its activation passes."""
    return Roofline(L70, H100, 1, mfu=0.8, mbu=0.5, attn_mfu=0.5, overhead_s=0.0,
                    layer_overhead_s=0.0, seq_overhead_s=0.0, seq_shard_overhead_s=0.0,
                    no_overlap=0.0, throttle=0.0, act_traffic=10.0, **kw)  # fmt: skip


def test_activation_passes_in_l2_run_l2_speedup_faster() -> None:
    from twin.perf.presets import L2_BYTES, l2_tokens

    # 50 MB of H100 L2 hold 50e6 / (8,192 x 2 bytes) = 3,051.76 tokens' activations
    assert l2_tokens(H100, L70) == pytest.approx(L2_BYTES["h100-sxm"] / (8192 * 2))
    assert l2_tokens(get_gpu("l40s"), L70) == 0.0  # no L2 entry: every pass at HBM
    per_token = 10.0 * L70.layers * L70.hidden * 2 / (H100.hbm_bytes_s * 0.5)
    fast, slow = _act_only(l2_speedup=2.0), _act_only(l2_speedup=1.0)
    for n in (500, 3000):  # all resident: half the HBM price
        b = prefill(n)
        assert slow.iteration_time(b) - fast.iteration_time(b) == pytest.approx(n * per_token / 2)
    for n in (4000, 9000):  # the first 3,051.76 tokens resident, the rest at HBM
        b = prefill(n)
        saved = slow.iteration_time(b) - fast.iteration_time(b)
        assert saved == pytest.approx(l2_tokens(H100, L70) * per_token / 2)
    with pytest.raises(SpecError, match="l2_speedup"):
        _act_only(l2_speedup=0.5)


def test_hop_overhead_adds_per_ring_step() -> None:
    b = Batch(decode_count=4, decode_context_sum=4000)
    for tp in (2, 8):
        base = Roofline(L70, H100, tp, hop_overhead_s=0.0).iteration_time(b)
        more = Roofline(L70, H100, tp, hop_overhead_s=1e-6).iteration_time(b)
        # 2 all-reduces per layer, each 2 (TP - 1) ring steps
        assert more - base == pytest.approx(2 * L70.layers * 2 * (tp - 1) * 1e-6)
    with pytest.raises(SpecError, match="hop_overhead_s"):
        Roofline(L70, H100, 2, hop_overhead_s=-1.0)


def test_gemm_time_is_the_larger_of_flops_and_weights() -> None:
    r = Roofline(L70, H100, 4, mfu=0.5, mbu=0.8)
    flops = 2 * L70.layers * L70.linear_params_per_layer / 4
    weights = L70.layers * L70.linear_params_per_layer * 2 / 4
    for n in (1, 64, 4096):
        want = max(flops * n / (H100.flops_bf16 * 0.5), weights / (H100.hbm_bytes_s * 0.8))
        assert r.gemm_time(n) == pytest.approx(want)
    assert r.gemm_time(1) == r.gemm_time(16)  # weight-bound: flat
    assert r.gemm_time(8192) == pytest.approx(2 * r.gemm_time(4096))  # compute-bound: linear
