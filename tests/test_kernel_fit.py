"""The L40S's shares of peak, fitted to AIConfigurator's measured L40S kernels
(twin/data/kernels_l40s.json), and the kernel pricing they are fitted with."""

from __future__ import annotations

import pytest

from twin.errors import SpecError, UnknownNameError
from twin.perf.gpus import get_gpu
from twin.perf.kernel_fit import (
    KernelEfficiency,
    KernelPoint,
    bundled_points,
    fit_kernels,
    points_from_table,
    price,
    regime,
    score,
)
from twin.perf.llm import get_model
from twin.perf.presets import FP8_GEMM_SHARE, GPU_EFFICIENCY
from twin.perf.roofline import Roofline, fp8_gemm_ratio
from twin.studies import kernel_table

L40S = get_gpu("l40s")
POINTS = bundled_points("l40s")
# What the L40S preset must price, per group of the table (twin.perf.presets, the comment
# above _L40S_EFF): the largest median and worst absolute relative error, fitted and
# held-out points alike.
BOUNDS = {
    "compute": (0.05, 0.30),
    "memory": (0.10, 0.15),
    "decode-attention": (0.10, 0.45),
    "prefill-attention": (0.15, 0.55),
    "all-reduce": (0.25, 0.45),
    "ramp": (0.10, 0.30),
    "fp8-compute": (0.35, 0.60),
    "fp8-memory": (0.15, 0.30),
    "fp8-ramp": (0.25, 0.50),
}


def preset() -> KernelEfficiency:
    mfu, mbu, attn_mfu, *_, hop = GPU_EFFICIENCY["l40s"]
    return KernelEfficiency(mfu, mbu, attn_mfu, hop, mfu * FP8_GEMM_SHARE["l40s"])


def test_preset_is_the_fit_of_the_cited_table() -> None:
    fit = fit_kernels(POINTS, L40S)
    p = preset()
    assert p.mfu == pytest.approx(fit.mfu, abs=5e-4)
    assert p.mbu == pytest.approx(fit.mbu, abs=5e-4)
    assert p.attn_mfu == pytest.approx(fit.attn_mfu, abs=5e-4)
    assert p.hop_latency_s == pytest.approx(fit.hop_latency_s, rel=5e-3)
    assert fit.fp8_mfu is not None
    assert FP8_GEMM_SHARE["l40s"] == pytest.approx(fit.fp8_mfu / fit.mfu, abs=5e-4)


@pytest.mark.parametrize("group", sorted(BOUNDS))
def test_preset_prices_the_measured_kernels(group: str) -> None:
    scores = [s for s in score(POINTS, L40S, preset()) if s.group == group]
    assert scores and any(not s.fitted for s in scores)  # each group has held-out points
    median, worst = BOUNDS[group]
    for s in scores:
        assert s.median <= median and s.worst <= worst, s


def test_held_out_points_do_not_move_the_fit() -> None:
    kept = [p for p in POINTS if not p.held_out]
    assert fit_kernels(kept, L40S) == fit_kernels(POINTS, L40S)
    assert sum(p.held_out for p in POINTS) > len(kept)


def test_datasheet_bf16_peak_is_the_dense_one() -> None:
    # the datasheet's 362 TFLOPS BF16 is dense: the best measured GEMM exceeds half of it (the
    # dense rate were it the sparse figure) and stays under it
    best = max(p.flops / p.seconds for p in POINTS if p.kind == "gemm" and not p.fp8)
    assert 0.5 * L40S.flops_bf16 < best <= L40S.flops_bf16


def test_scored_only_groups_are_never_fitted() -> None:
    groups = {(s.group, s.fitted) for s in score(POINTS, L40S, preset())}
    for g in ("ramp", "fp8-ramp", "fp8-memory", "all-reduce-bw"):
        assert (g, False) in groups and (g, True) not in groups


def test_price_matches_the_roofline_gemm_time() -> None:
    # a dense model's weight GEMMs, each priced as a kernel, sum to Roofline.gemm_time
    # wherever they share a regime (every GEMM weight-bound, or every one compute-bound)
    m = get_model("llama-3.1-8b")
    r = Roofline(m, L40S, 1)
    shapes = [(m.hidden + 2 * m.kv_heads * m.head_dim, m.hidden), (m.hidden, m.heads * m.head_dim),
              (2 * m.intermediate, m.hidden), (m.hidden, m.intermediate)]  # fmt: skip
    for tokens in (1, 8192):
        kernels = [KernelPoint("gemm", 2.0 * tokens * n * k, 2.0 * n * k, 1.0, "")
                   for n, k in shapes]  # fmt: skip
        total = m.layers * sum(price(p, L40S, preset()) for p in kernels)
        assert r.gemm_time(tokens) == pytest.approx(total, rel=1e-9)


def test_regimes_and_all_reduce_price() -> None:
    small = KernelPoint("all-reduce", 0.0, 1024.0, 1e-5, "", tp=4)
    assert regime(small, L40S) == "all-reduce"
    assert regime(KernelPoint("all-reduce", 0.0, 2**20, 1e-3, "", tp=4), L40S) == "all-reduce-bw"
    eff = KernelEfficiency(0.5, 0.5, 0.5, 2e-6)
    assert price(small, L40S, eff) == pytest.approx(6 * 2e-6 + 1.5 * 1024 / L40S.pcie_bytes_s)
    fp8 = KernelPoint("gemm", 2e12, 1e6, 1.0, "", fp8=True)
    assert regime(fp8, L40S) == "fp8-compute"
    assert price(fp8, L40S, eff) == pytest.approx(2e12 / (L40S.flops_fp8 * 0.5))
    with_fp8 = KernelEfficiency(0.5, 0.5, 0.5, 2e-6, fp8_mfu=0.25)
    assert price(fp8, L40S, with_fp8) == pytest.approx(2e12 / (L40S.flops_fp8 * 0.25))
    assert regime(KernelPoint("gemm", 2e9, 1e9, 1.0, "", fp8=True), L40S) == "fp8-memory"


def test_fp8_gemms_are_priced_at_the_measured_share_of_the_fp8_peak() -> None:
    # an FP8 checkpoint's compute-bound GEMMs on L40S run at fp8_mfu of the FP8 peak, as the
    # kernel fit prices them; a GPU without a measured share keeps the datasheet's ratio
    import dataclasses

    fp8 = dataclasses.replace(get_model("llama-3.1-8b"), weight_dtype_bytes=1)
    share = FP8_GEMM_SHARE["l40s"]
    assert fp8_gemm_ratio(fp8, L40S) == pytest.approx(L40S.flops_bf16 / (L40S.flops_fp8 * share))
    h100 = get_gpu("h100-sxm")
    assert fp8_gemm_ratio(fp8, h100) == h100.flops_bf16 / h100.flops_fp8
    m, r = fp8, Roofline(fp8, L40S, 1)
    shapes = [(m.hidden + 2 * m.kv_heads * m.head_dim, m.hidden), (m.hidden, m.heads * m.head_dim),
              (2 * m.intermediate, m.hidden), (m.hidden, m.intermediate)]  # fmt: skip
    kernels = [KernelPoint("gemm", 2.0 * 8192 * n * k, 1.0 * n * k, 1.0, "", fp8=True)
               for n, k in shapes]  # fmt: skip
    assert all(regime(p, L40S) == "fp8-compute" for p in kernels)
    total = m.layers * sum(price(p, L40S, preset()) for p in kernels)
    assert r.gemm_time(8192) == pytest.approx(total, rel=1e-9)


def test_a_term_without_points_or_an_impossible_point_is_refused() -> None:
    gemms = [p for p in POINTS if p.kind == "gemm"]
    with pytest.raises(SpecError, match="no fitted point for attn_mfu"):
        fit_kernels(gemms, L40S)
    fast = KernelPoint("all-reduce", 0.0, 2**13, 1e-9, "too fast", tp=2)
    with pytest.raises(SpecError, match="too fast: faster than its link allows"):
        fit_kernels([*POINTS, fast], L40S)


def test_bad_tables_and_gpus_are_named() -> None:
    with pytest.raises(SpecError, match="t.json: not a kernel table"):
        points_from_table({"gemm": [["bfloat16", 1, 2]]}, "t.json")
    with pytest.raises(UnknownNameError, match="'h100-sxm'.*Known: l40s"):
        bundled_points("h100-sxm")


def test_command_prints_the_fit_and_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert kernel_table.main(["l40s"]) == 0
    out = capsys.readouterr().out
    assert "l40s, fitted: mfu 0.747" in out and "l40s, preset:" in out
    assert kernel_table.main(["h100"]) == 2
    assert capsys.readouterr().err.startswith("twin: error: unknown GPU with a kernel table")
