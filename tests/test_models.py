from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twin.errors import SpecError, UnknownNameError
from twin.perf.kvreport import kv_report
from twin.perf.llm import MODELS, dtype_bytes, get_model, kv_blocks, kv_bytes

USER = {
    "name": "tiny",
    "layers": 2,
    "hidden": 64,
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 16,
    "intermediate": 128,
    "vocab": 100,
    "params": 123456,
}


def test_llama2_70b_kv_bytes_exact() -> None:
    m = get_model("llama-2-70b")
    assert m.kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2 == 327_680
    assert m.kv_bytes_per_token(1) == 163_840
    assert kv_blocks(1000, 16) == 63
    assert kv_bytes(1000, m) == 1008 * 327_680
    assert kv_bytes(1008, m) == kv_bytes(1000, m) < kv_bytes(1009, m)


@pytest.mark.parametrize(
    ("name", "per_token"),
    [
        ("llama-2-7b", 2 * 32 * 32 * 128 * 2),  # 524,288: no GQA
        ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2),  # 131,072
        ("opt-13b", 2 * 40 * 40 * 128 * 2),  # 819,200
        ("bloom-176b", 2 * 70 * 112 * 128 * 2),
        ("qwen3-8b", 2 * 36 * 8 * 128 * 2),
    ],
)
def test_kv_bytes_known_models(name: str, per_token: int) -> None:
    assert get_model(name).kv_bytes_per_token() == per_token


def test_weight_bytes() -> None:
    assert get_model("llama-2-70b").weight_bytes == 68_976_648_192 * 2


@pytest.mark.parametrize("name", sorted(MODELS))
def test_catalog_params_match_shapes(name: str) -> None:
    # the linear layers hold most of the parameters; embeddings make up the rest
    m = MODELS[name]
    linear = m.layers * m.linear_params_per_layer
    if m.is_moe:  # every expert holds weights, not only the ones a token uses
        linear = m.dense_token_params + m.routed_params
    share = linear / m.params
    # below ~5B a 150k- to 256k-token vocabulary's embeddings are up to a quarter of the weights
    assert (0.80 if m.params > 5e9 else 0.6) < share < 1.0


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("llama2-70b", "llama-2-70b"),
        ("meta-llama/Llama-2-70b-hf", "llama-2-70b"),
        ("facebook/opt-13b", "opt-13b"),
        ("LLAMA-3.1-8B", "llama-3.1-8b"),
        ("Qwen/Qwen3-8B", "qwen3-8b"),
    ],
)
def test_aliases(alias: str, canonical: str) -> None:
    assert get_model(alias) is MODELS[canonical]


def test_unknown_model_suggests() -> None:
    with pytest.raises(UnknownNameError) as e:
        get_model("llama-2-71b")
    assert "Did you mean 'llama-2-7b'" in str(e.value)
    assert "Known: bloom-176b" in str(e.value)


def test_inline_model() -> None:
    m = get_model(dict(USER, dtype="fp8"), "spec.yaml: model")
    assert m.name == "tiny" and m.dtype_bytes == 1 and m.mlp == "gated"
    assert m.kv_bytes_per_token() == 2 * 2 * 2 * 16 * 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layers": -3}, "spec.yaml: model.layers: -3 must be a positive integer"),
        ({"hidden": 1.5}, "spec.yaml: model.hidden: 1.5 must be a positive integer"),
        ({"kv_heads": 3}, "spec.yaml: model.kv_heads: 3 does not divide heads=4"),
        ({"mlp": "moe"}, "spec.yaml: model.mlp: 'moe'; expected one of gated, plain"),
        ({"colour": 1}, "spec.yaml: model: unknown key 'colour'. Expected one of name,"),
        ({"dtype": "fp4"}, "spec.yaml: model.dtype: unknown dtype 'fp4'"),
    ],
)
def test_inline_model_errors(change: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as e:
        get_model(dict(USER, **change), "spec.yaml: model")
    assert message in str(e.value)


def test_inline_model_missing_field() -> None:
    spec = {k: v for k, v in USER.items() if k != "vocab"}
    with pytest.raises(SpecError, match="missing 'vocab'"):
        get_model(spec, "spec.yaml: model")


def test_dtype_bytes() -> None:
    assert [dtype_bytes(n) for n in ("fp16", "BF16", "fp8", "int8", "fp32")] == [2, 2, 1, 1, 4]
    with pytest.raises(SpecError, match="expected one of"):
        dtype_bytes("fp6")


def test_kv_report_text() -> None:
    text = kv_report(get_model("llama2-70b"), 1000, 16)
    assert "bytes per token  327,680 B" in text
    assert "bytes per block  5,242,880 B (16 tokens)" in text
    assert "blocks           63 for 1,000 tokens (1,008 tokens allocated)" in text
    assert "330,301,440 B = 322,560 KiB = 315 MiB = 0.3076171875 GiB" in text
    fp8 = kv_report(get_model("llama2-70b"), 1000, 16, dtype_bytes=1)
    assert "163,840 B" in fp8


@given(tokens=st.integers(0, 10**7), block=st.integers(1, 512))
def test_blocks_cover_tokens_tightly(tokens: int, block: int) -> None:
    n = kv_blocks(tokens, block)
    assert n * block >= tokens > (n - 1) * block or tokens == n == 0
