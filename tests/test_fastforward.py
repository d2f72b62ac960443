"""Fast-forward against stepping: the perf models' stretch pricing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import Linear

from twin.perf.gpus import get_gpu
from twin.perf.iteration import VECTOR_STEPS, Batch, decode_steps
from twin.perf.llm import get_model
from twin.perf.roofline import Roofline
from twin.perf.tables import DistServeFit, ProfileTable

H100 = get_gpu("h100-sxm")
A100 = get_gpu("a100-80gb")


def table() -> ProfileTable:
    """A small measured-looking table: decode rows for batch 1, 8 and 32 (the
    last two extrapolated past), contexts 128 to 4,096 (clamped outside)."""
    decode = {
        (b, c): 0.006 + 1e-4 * b + 2e-7 * b * c for b in (1, 8, 32) for c in (128, 1024, 4096)
    }
    prefill = {(1, p): 0.01 + 6e-5 * p for p in (128, 1024, 8192)}
    return ProfileTable("profile:test", None, prefill, decode)


def fit(pp: int = 1) -> DistServeFit:
    """DistServe's formula with round coefficients (ms), its overheads and ``pp`` stages."""
    return DistServeFit("distserve:test", None, (5.0, 0.05, 1e-6), (8.0, 2e-4, 0.1),
                        (9.0, 1.5e-4, 0.08), 24, pp=pp, overhead_s=2e-3,
                        token_overhead_s=1e-7, prefill_overhead_s=1e-3)  # fmt: skip


MODELS = {
    "roofline": lambda: Roofline(get_model("llama-3.1-8b"), H100, 1),
    "roofline-70b-tp8-pp2": lambda: Roofline(get_model("llama-2-70b"), A100, 8, 2),
    "roofline-throttled": lambda: Roofline(get_model("llama-2-70b"), H100, 8, throttle_knee_s=0.0),
    "roofline-splitwise": lambda: Roofline(
        get_model("llama-2-70b"), A100, 4, engine="splitwise-sim", no_overlap=0.4
    ),
    "profile": table,
    "distserve": fit,
    "distserve-pp4": lambda: fit(4),
    "linear": lambda: Linear(per_context=1e-6),  # no decode_steps of its own
}


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(MODELS)),
    count=st.integers(1, 300),
    mean_ctx=st.integers(1, 6000),
    n=st.sampled_from([1, 2, 7, VECTOR_STEPS - 1, VECTOR_STEPS, 300]),
)
def test_a_stretch_is_priced_to_the_last_bit_as_step_by_step(name, count, mean_ctx, n):
    perf = MODELS[name]()
    ctx = count * mean_ctx
    got = decode_steps(perf)(count, ctx, n)
    want = [perf.iteration_time(Batch((), count, ctx + k * count)) for k in range(n)]
    assert isinstance(got, list) and all(type(x) is float for x in got)
    assert got == want
