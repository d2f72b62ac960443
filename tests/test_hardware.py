from __future__ import annotations

import pytest

from twin.errors import SpecError, UnknownNameError
from twin.perf.gpus import GPUS, get_gpu


@pytest.mark.parametrize("alias", ["h100", "H100-80GB", "h100-sxm"])
def test_h100_aliases(alias: str) -> None:
    assert get_gpu(alias) is GPUS["h100-sxm"]


def test_required_catalog() -> None:
    for name in ("a100-40gb", "a100-80gb", "h100-sxm", "h100-80gb-pcap", "h200", "b200", "l40s",
                 "mi300x"):  # fmt: skip
        assert name in GPUS


def test_pcap_is_70_percent_of_power_same_silicon() -> None:
    h, cap = GPUS["h100-sxm"], GPUS["h100-80gb-pcap"]
    assert cap.tdp_w == pytest.approx(h.tdp_w * 7140 / 10200)
    assert cap.flops_bf16 == h.flops_bf16 and cap.hbm_bytes_s == h.hbm_bytes_s
    # the cap lowers the sustained tensor clock only
    assert h.sustained_clock == 1.0 and 0.5 <= cap.sustained_clock < 1.0
    assert cap.sustained_flops == cap.flops_bf16 * cap.sustained_clock


def test_pcap_prefill_slower_decode_same() -> None:
    # with the software terms and the throttle off, a compute-bound prefill on the capped H100
    # takes 1 / sustained_clock of the full H100's time, and a memory-bound decode step the same
    from twin.perf.iteration import Batch
    from twin.perf.llm import get_model
    from twin.perf.roofline import Roofline

    kw = {"overhead_s": 0.0, "layer_overhead_s": 0.0, "seq_overhead_s": 0.0,
          "seq_shard_overhead_s": 0.0, "hop_latency_s": 0.0, "act_traffic": 0.0,
          "no_overlap": 0.0, "throttle": 0.0}  # fmt: skip
    m = get_model("llama-2-70b")
    h, cap = (Roofline(m, get_gpu(g), 1, **kw) for g in ("h100-sxm", "h100-80gb-pcap"))
    pre = Batch(prefill=((8192, 0),))
    assert cap.iteration_time(pre) == pytest.approx(
        h.iteration_time(pre) / GPUS["h100-80gb-pcap"].sustained_clock, rel=1e-12
    )
    dec = Batch(decode_count=1, decode_context_sum=1000)
    assert cap.iteration_time(dec) == h.iteration_time(dec)


def test_inline_gpu_sustained_clock() -> None:
    spec = {"name": "x", "flops_bf16": 1e15, "hbm_bytes_s": 1e12, "memory_bytes": 1e10,
            "tdp_w": 500}  # fmt: skip
    assert get_gpu(spec).sustained_clock == 1.0
    g = get_gpu({**spec, "sustained_clock": 0.8})
    assert g.sustained_flops == pytest.approx(0.8e15)
    with pytest.raises(SpecError, match=r"spec.yaml: gpu.sustained_clock: 1.2 must be a share"):
        get_gpu({**spec, "sustained_clock": 1.2}, "spec.yaml: gpu")


def test_values_are_sane() -> None:
    for g in GPUS.values():
        # ridge point (FLOP per byte) of every datasheet GPU lies in 100..500
        assert 100 < g.flops_bf16 / g.hbm_bytes_s < 500, g.name
    assert GPUS["a100-80gb"].memory_bytes == 80 * 2**30
    assert GPUS["l40s"].nvlink_bytes_s == 0


def test_unknown_gpu_suggests() -> None:
    with pytest.raises(UnknownNameError, match="Did you mean 'h200'"):
        get_gpu("h20")


def test_inline_gpu_with_units() -> None:
    g = get_gpu(
        {"name": "x", "flops_bf16": "989 TFLOPS", "hbm_bytes_s": "3.35 TB/s",
         "memory_bytes": "80 GiB", "tdp_w": "700 W", "nvlink_bytes_s": "450 GB/s"},
        "spec.yaml: gpu",
    )  # fmt: skip
    assert (g.flops_bf16, g.hbm_bytes_s, g.memory_bytes, g.tdp_w) == (989e12, 3.35e12, 80 * 2**30,
                                                                      700.0)  # fmt: skip
    assert g.nvlink_bytes_s == 450e9


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hbm_bytes_s": "3 parsec"}, "spec.yaml: gpu.hbm_bytes_s: '3 parsec' is not a bandwidth"),
        ({"tdp_w": -5}, "spec.yaml: gpu.tdp_w: -5 must be a positive number"),
        ({"fp4": 1}, "spec.yaml: gpu: unknown key 'fp4'. Expected one of name, flops_bf16"),
    ],
)
def test_inline_gpu_errors(change: dict[str, object], message: str) -> None:
    spec = {"name": "x", "flops_bf16": 1e15, "hbm_bytes_s": 1e12, "memory_bytes": 1e10,
            "tdp_w": 500}  # fmt: skip
    with pytest.raises(SpecError) as e:
        get_gpu(dict(spec, **change), "spec.yaml: gpu")
    assert message in str(e.value)
