"""The decode step's dependence on batch size, against splitwise-sim's H100 TP8 table.

splitwise-sim's perf_model.csv (Llama-2-70B, h100-80gb, TP 8, prompt 512, 128
generated tokens: mean context 576) measures the decode step slowing from about
30 ms at batch 1 to about 50 ms at batch 64 (1.69x). The roofline under the
table's own engine preset must price every measured batch size within 10%
(issue 17's tolerance) and reproduce the slowdown within 10% too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from twin.perf.gpus import get_gpu
from twin.perf.iteration import Batch
from twin.perf.llm import get_model
from twin.perf.roofline import Roofline
from twin.perf.validate import SPLITWISE_CSV, Source, splitwise_sources

TOLERANCE = 0.10  # issue 17: "within the same tolerance" as its 10% target
CONTEXT = 512 + 128 // 2  # the table's decode context for 512-token prompts, 128 tokens out


@pytest.fixture(scope="module")
def measured(shared_data: Path) -> dict[int, float]:
    """Batch size -> measured decode step (s) at :data:`CONTEXT`."""
    src: Source = next(
        s
        for s in splitwise_sources(shared_data / SPLITWISE_CSV)
        if s.name == "splitwise llama2-70b h100-80gb tp8"
    )
    out = {
        p.batch.decode_count: p.measured_s
        for p in src.points
        if p.phase == "tpot" and p.batch.decode_context_sum == p.batch.decode_count * CONTEXT
    }
    assert sorted(out) == [1, 2, 4, 8, 16, 32, 64]
    # What the issue quotes: about 30 ms at batch 1, about 50 ms at batch 64.
    assert out[1] == pytest.approx(0.030, rel=0.05) and out[64] == pytest.approx(0.050, rel=0.05)
    return out


def _step(engine: str, b: int) -> float:
    m = Roofline(get_model("llama2-70b"), get_gpu("h100-80gb"), 8, engine=engine)
    return m.iteration_time(Batch(decode_count=b, decode_context_sum=b * CONTEXT))


def test_decode_step_per_batch_size(measured: dict[int, float]) -> None:
    for b, t in measured.items():
        assert _step("splitwise-sim", b) == pytest.approx(t, rel=TOLERANCE), b


def test_decode_slowdown_batch_64_over_1(measured: dict[int, float]) -> None:
    want = measured[64] / measured[1]
    got = _step("splitwise-sim", 64) / _step("splitwise-sim", 1)
    assert got == pytest.approx(want, rel=TOLERANCE)


@pytest.mark.xfail(
    strict=True,
    reason="the default preset (engine: distserve) carries DistServe's per-sequence cost, "
    "fitted to DistServe's OPT data (53 us per sequence per iteration, against splitwise-sim's "
    "216 us): a 64-sequence step slows 1.39x over batch 1 against the 1.69x measured; "
    "use perf: {kind: roofline, engine: splitwise-sim} for this table",
)
def test_default_preset_decode_slowdown(measured: dict[int, float]) -> None:
    want = measured[64] / measured[1]
    got = _step("distserve", 64) / _step("distserve", 1)
    assert got == pytest.approx(want, rel=TOLERANCE)
