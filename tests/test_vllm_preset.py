"""The vllm engine preset, FP8 GEMMs at the FP8 peak, the fused-MoE efficiency, and the
preset as the default of a new spec (the bundled experiments keep the distserve one)."""

from __future__ import annotations

import dataclasses

import pytest

from twin.errors import SpecError
from twin.perf.build import build_perf_model
from twin.perf.gpus import get_gpu
from twin.perf.iteration import Batch
from twin.perf.llm import get_model
from twin.perf.presets import DEFAULT_ENGINE, ENGINE_OVERHEADS
from twin.perf.roofline import Roofline

H100 = get_gpu("h100-sxm")
A100 = get_gpu("a100-80gb")
L70 = get_model("llama-2-70b")


def test_fp8_weights_run_their_gemms_at_the_fp8_peak_where_the_gpu_has_one() -> None:
    fp8 = dataclasses.replace(L70, name="llama-2-70b-fp8", weight_dtype_bytes=1)
    prompt = Batch(((4096, 0),))  # compute-bound: the GEMMs dominate
    kw = {"attn_mfu": 0.8, "overhead_s": 0.0, "layer_overhead_s": 0.0, "act_traffic": 0.0,
          "no_overlap": 0.0, "throttle": 0.0}  # fmt: skip
    bf16_h = Roofline(L70, H100, 8, **kw).iteration_time(prompt)
    fp8_h = Roofline(fp8, H100, 8, **kw).iteration_time(prompt)
    # the weight GEMMs at 1,979 instead of 989 TFLOPS (attention and the LM head stay BF16)
    g16 = Roofline(L70, H100, 8, **kw).gemm_time(4096)
    assert Roofline(fp8, H100, 8, **kw).gemm_time(4096) == pytest.approx(g16 * 989 / 1979)
    assert fp8_h < 0.75 * bf16_h
    # an A100 has no FP8 tensor cores: the GEMMs stay at the BF16 peak
    bf16_a = Roofline(L70, A100, 8, **kw).iteration_time(prompt)
    fp8_a = Roofline(fp8, A100, 8, **kw).iteration_time(prompt)
    assert fp8_a == pytest.approx(bf16_a, rel=0.02)
    assert get_gpu("l40s").flops_fp8 == 733e12 and A100.flops_fp8 == 0.0


def test_a_user_gpu_may_give_its_fp8_peak() -> None:
    g = get_gpu({"name": "x", "flops_bf16": "100 TFLOPS", "flops_fp8": "200 TFLOPS",
                 "hbm_bytes_s": "1 TB/s", "memory_bytes": "24 GiB", "tdp_w": "300 W"})  # fmt: skip
    assert g.flops_fp8 == pytest.approx(200e12)
    assert g.sustained_flops_fp8 == pytest.approx(200e12)
    with pytest.raises(SpecError, match="flops_fp8"):
        get_gpu({"name": "x", "flops_bf16": 1e14, "flops_fp8": -1, "hbm_bytes_s": 1e12,
                 "memory_bytes": 1e9, "tdp_w": 300})  # fmt: skip


def test_moe_efficiency_slows_the_expert_weight_reads_only() -> None:
    mix = get_model("mixtral-8x7b")
    decode = Batch((), 16, 16 * 600)  # memory-bound: every active expert's weights read
    base = {"engine": "distserve", "no_overlap": 0.0}
    full = Roofline(mix, H100, 2, **base, moe_efficiency=1.0)
    half = Roofline(mix, H100, 2, **base, moe_efficiency=0.5)
    extra = half.iteration_time(decode) - full.iteration_time(decode)
    assert extra == pytest.approx(full.experts_time(16), rel=1e-6)  # twice the read time
    dense = Roofline(L70, H100, 4, **base, moe_efficiency=0.5)
    assert dense.iteration_time(decode) == Roofline(L70, H100, 4, **base).iteration_time(decode)
    with pytest.raises(SpecError, match="moe_efficiency"):
        Roofline(mix, H100, 2, moe_efficiency=0.0)
    r = build_perf_model({"kind": "roofline", "moe_efficiency": 0.6}, mix, H100, 2)
    assert isinstance(r, Roofline) and r.moe_efficiency == 0.6


def test_vllm_decode_step_is_near_the_measured_inter_token_latency() -> None:
    # vLLM v0.15.1, Llama-2-70B on 4 x H100, 8 req/s of ~575-token prompts (prefix-cached)
    # and 248 output tokens: measured itl_mean 19.3 ms (shared/data/realruns, run
    # 20260217-202857 stage 0) at about 8 x 4.8 s = 38 sequences of ~700 tokens of context
    step = Roofline(L70, H100, 4, engine="vllm").iteration_time(Batch((), 38, 38 * 700))
    assert 0.85 * 19.3e-3 <= step <= 1.15 * 19.3e-3, step
    # the distserve preset (per-layer launches, compute and memory added) is far slower
    slow = Roofline(L70, H100, 4, engine="distserve").iteration_time(Batch((), 38, 38 * 700))
    assert slow > 1.5 * step


def test_the_vllm_preset_terms_are_within_their_stated_bounds() -> None:
    from twin.perf.vllm import VLLM_CLIENT_LATENCY_S
    from twin.studies.calibrate_runs import BOUNDS, CLIENT

    preset = {**ENGINE_OVERHEADS["vllm"], CLIENT: VLLM_CLIENT_LATENCY_S}
    for k, (lo, hi) in BOUNDS.items():
        assert lo <= preset[k] <= hi, (k, preset[k])
    assert preset["no_overlap"] == 0.0 and preset["seq_overhead_s"] == 0.0


def test_new_specs_and_the_bundled_runs_get_the_vllm_preset_a_pinned_one_keeps_its_own() -> None:
    from twin.sim.spec import load_spec, resolve_spec

    assert DEFAULT_ENGINE == "vllm"
    data = {"model": "llama-2-7b", "gpu": "h100-sxm",
            "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                         "max_requests": 5}}  # fmt: skip
    from pathlib import Path

    spec = resolve_spec(data, "new.yaml", Path("."))
    assert build_perf_model(spec.perf, L70, H100, 1).engine == "vllm"  # type: ignore[attr-defined]
    for name in ("quickstart", "disagg", "diurnal", "link-flap", "node-failure"):
        perf = build_perf_model(load_spec(name).perf, L70, H100, 1)
        assert perf.engine == "vllm", name  # type: ignore[attr-defined]
    pinned = resolve_spec({**data, "perf": {"kind": "roofline", "engine": "distserve"}},
                          "pinned.yaml", Path("."))  # fmt: skip
    assert build_perf_model(pinned.perf, L70, H100, 1).engine == "distserve"  # type: ignore[attr-defined]
