"""LLM architectures and the KV-cache arithmetic that follows from them.

A :class:`ModelSpec` holds the shapes that decide memory and FLOPs: layers,
hidden size, query and KV heads, head dimension, MLP width and kind, vocabulary
and parameter count. The catalog :data:`MODELS` carries public Hugging Face
``config.json`` values; :func:`get_model` looks a name up (case-insensitive,
with aliases) or builds a user model from an inline YAML mapping.

KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per
element, for the whole model; a TP shard holds 1/TP of it. Engines allocate
KV in blocks (default 16 tokens), so sizes are rounded up to whole blocks.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from twin._check import check_keys, entry, is_int, positive_int
from twin.errors import SpecError, UnknownNameError

_DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2,
     "fp8": 1, "int8": 1}
)  # fmt: skip
_MLP_KINDS = ("gated", "plain")


def dtype_bytes(name: str | int) -> int:
    """Bytes per element of a dtype name (``fp16``, ``bf16``, ``fp8``, ``int8``, ``fp32``).

    An ``int`` is taken as already a byte count and must be 1, 2 or 4.
    """
    if is_int(name):
        if name in (1, 2, 4):
            return name
        raise SpecError(f"dtype: {name!r} bytes per element; expected 1, 2 or 4")
    if isinstance(name, str) and name.strip().lower() in _DTYPE_BYTES:
        return _DTYPE_BYTES[name.strip().lower()]
    raise SpecError(f"unknown dtype {name!r}; expected one of {', '.join(_DTYPE_BYTES)}")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The shapes of one decoder-only transformer.

    ``params`` is the total parameter count (embeddings included);
    ``dtype_bytes`` the bytes per weight and per KV element (2 for fp16/bf16).
    ``mlp`` is ``"gated"`` (SwiGLU: gate, up and down matrices, Llama/Qwen) or
    ``"plain"`` (up and down only, OPT/BLOOM); it decides the MLP FLOPs.
    ``max_context`` is the longest sequence (prompt plus output, tokens) the
    model was built for, Hugging Face's ``max_position_embeddings``; ``None``
    for a user model that gives none (no limit).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    params: int
    dtype_bytes: int = 2
    mlp: str = "gated"
    max_context: int | None = None

    def __post_init__(self) -> None:
        where = f"model {self.name!r}"
        for field in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
                      "vocab", "params", "dtype_bytes"):  # fmt: skip
            positive_int(getattr(self, field), f"{where}: {field}")
        if self.heads % self.kv_heads:
            raise SpecError(
                f"{where}: heads={self.heads} is not a multiple of kv_heads={self.kv_heads}"
            )
        if self.dtype_bytes not in (1, 2, 4):
            raise SpecError(f"{where}: dtype_bytes={self.dtype_bytes!r}; expected 1, 2 or 4")
        if self.mlp not in _MLP_KINDS:
            raise SpecError(f"{where}: mlp={self.mlp!r}; expected one of {', '.join(_MLP_KINDS)}")
        if self.max_context is not None:
            positive_int(self.max_context, f"{where}: max_context")

    def tp_problem(self, tp: int) -> str | None:
        """Why a real engine cannot shard this model ``tp`` ways, or None.

        vLLM splits the query heads and the MLP width evenly over the TP ranks
        (``ColumnParallelLinear`` divides the output size; ``ModelConfig``
        checks the heads), and the KV heads either evenly or, when ``tp``
        exceeds them, by replicating each over ``tp / kv_heads`` ranks
        (``QKVParallelLinear``): so ``tp`` must divide the heads and the
        intermediate size, and divide or be a multiple of the KV heads.
        """
        if self.heads % tp:
            return f"{tp} does not divide {self.name}'s {self.heads} attention heads"
        if self.intermediate % tp:
            return f"{tp} does not divide {self.name}'s FFN width {self.intermediate:,}"
        if self.kv_heads % tp and tp % self.kv_heads:
            return (
                f"{tp} neither divides nor is a multiple of {self.name}'s {self.kv_heads} KV heads"
            )
        return None

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads each TP rank holds: ``kv_heads / tp``, or 1 when ``tp``
        exceeds the KV heads (each is then replicated, as vLLM does)."""
        return max(1, self.kv_heads // tp)

    def kv_bytes_per_token_tp(self, tp: int = 1, dtype_bytes: int | None = None) -> int:
        """KV bytes one token takes on all ``tp`` ranks together: the whole
        model's :meth:`kv_bytes_per_token`, or more when ``tp`` exceeds the KV
        heads and they are replicated."""
        b = self.dtype_bytes if dtype_bytes is None else dtype_bytes
        return 2 * self.layers * self.kv_heads_per_gpu(tp) * tp * self.head_dim * b

    def kv_bytes_per_token(self, dtype_bytes: int | None = None) -> int:
        """Bytes of K and V one token holds across all layers (whole model, not a shard)."""
        b = self.dtype_bytes if dtype_bytes is None else dtype_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * b

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights at ``dtype_bytes`` per parameter."""
        return self.params * self.dtype_bytes

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the matrices one token multiplies in a layer (attention + MLP)."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        mats = 3 if self.mlp == "gated" else 2
        return q_o + k_v + mats * self.hidden * self.intermediate


def kv_blocks(tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` tokens needed to hold ``tokens`` (ceil; 0 for 0)."""
    if tokens < 0:
        raise SpecError(f"tokens: {tokens!r} must be >= 0")
    positive_int(block_size, "block_size")
    return -(-tokens // block_size)


def kv_bytes(
    tokens: int, model: ModelSpec, block_size: int = 16, dtype_bytes: int | None = None
) -> int:
    """KV bytes ``tokens`` occupy once rounded up to whole blocks (whole model)."""
    return kv_blocks(tokens, block_size) * block_size * model.kv_bytes_per_token(dtype_bytes)


def _exact(n: int, shift: int) -> str:
    """``n / 2**shift`` written out in full: the expansion always terminates."""
    with decimal.localcontext() as ctx:
        ctx.prec = 80
        q = (decimal.Decimal(n) / (decimal.Decimal(2) ** shift)).normalize()
    text = f"{q:,f}"
    return text


def kv_facts(
    model: ModelSpec, tokens: int, block_size: int = 16, dtype_bytes: int | None = None
) -> dict[str, Any]:
    """What ``twin kv --json`` writes: the model's KV shape, bytes per token and
    per block, and for ``tokens`` tokens the blocks, tokens allocated and
    bytes (exact integers, whole model: all TP shards)."""
    b = model.dtype_bytes if dtype_bytes is None else dtype_bytes
    per_token = model.kv_bytes_per_token(b)
    blocks = kv_blocks(tokens, block_size)
    return {
        "model": model.name,
        "layers": model.layers,
        "kv_heads": model.kv_heads,
        "head_dim": model.head_dim,
        "bytes_per_element": b,
        "bytes_per_token": per_token,
        "block_size": block_size,
        "bytes_per_block": per_token * block_size,
        "tokens": tokens,
        "blocks": blocks,
        "tokens_allocated": blocks * block_size,
        "kv_bytes": blocks * block_size * per_token,
    }


def kv_report(
    model: ModelSpec, tokens: int, block_size: int = 16, dtype_bytes: int | None = None
) -> str:
    """The text ``twin kv MODEL --tokens N --block-size B --dtype D`` prints.

    All byte counts are exact integers for the whole model (all TP shards);
    the block-rounded size is also shown in KiB, MiB and GiB.
    """
    b = model.dtype_bytes if dtype_bytes is None else dtype_bytes
    per_token = model.kv_bytes_per_token(b)
    blocks = kv_blocks(tokens, block_size)
    total = blocks * block_size * per_token
    return "\n".join(
        [
            f"model            {model.name} ({model.layers} layers x {model.kv_heads} kv heads"
            f" x {model.head_dim} head dim, {b} B/element)",
            f"bytes per token  {per_token:,} B",
            f"bytes per block  {per_token * block_size:,} B ({block_size} tokens)",
            f"blocks           {blocks:,} for {tokens:,} tokens"
            f" ({blocks * block_size:,} tokens allocated)",
            f"KV size          {total:,} B = {_exact(total, 10)} KiB"
            f" = {_exact(total, 20)} MiB = {_exact(total, 30)} GiB",
        ]
    )


def _m(name: str, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
       intermediate: int, vocab: int, params: int, ctx: int,
       mlp: str = "gated") -> ModelSpec:  # fmt: skip
    return ModelSpec(name, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab,
                     params, 2, mlp, ctx)  # fmt: skip


# Values from each model's Hugging Face config.json (repo named in the comment);
# params are the published totals, or for OPT counted from the config shapes
# (weights + biases + learned positions, tied LM head). The context (the
# argument after params) is config.json's max_position_embeddings, except
# where the comment names another source.
MODELS: Mapping[str, ModelSpec] = MappingProxyType(
    {
        # meta-llama/Llama-2-7b-hf
        "llama-2-7b": _m("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 6_738_415_616, 4096),
        # meta-llama/Llama-2-13b-hf
        "llama-2-13b": _m("llama-2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 13_015_864_320, 4096),
        # meta-llama/Llama-2-70b-hf
        "llama-2-70b": _m("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 68_976_648_192, 4096),
        # meta-llama/Meta-Llama-3-8B (the shapes of Llama-3.1-8B, an 8,192-token context)
        "llama-3-8b": _m("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8_030_261_248, 8192),
        # meta-llama/Meta-Llama-3-70B (the shapes of Llama-3.1-70B, an 8,192-token context)
        "llama-3-70b": _m("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 70_553_706_496, 8192),
        # meta-llama/Llama-3.1-8B
        "llama-3.1-8b": _m(
            "llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8_030_261_248, 131072
        ),
        # meta-llama/Llama-3.1-70B
        "llama-3.1-70b": _m(
            "llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 70_553_706_496, 131072
        ),
        # facebook/opt-13b
        "opt-13b": _m(
            "opt-13b", 40, 5120, 40, 40, 128, 20480, 50272, 12_853_473_280, 2048, "plain"
        ),
        # facebook/opt-66b
        "opt-66b": _m(
            "opt-66b", 64, 9216, 72, 72, 128, 36864, 50272, 65_719_701_504, 2048, "plain"
        ),
        # facebook/opt-175b (shapes of the OPT paper, arXiv 2205.01068, Table 1; the weights
        # are gated by Meta; context 2048, as in every released OPT config.json)
        "opt-175b": _m(
            "opt-175b", 96, 12288, 96, 96, 128, 49152, 50272, 174_604_468_224, 2048, "plain"
        ),
        # bigscience/bloom (ALiBi, no max_position_embeddings: the context is the
        # training sequence length, 2048, of the BLOOM paper, arXiv 2211.05100,
        # its training hyperparameters table)
        "bloom-176b": _m(
            "bloom-176b", 70, 14336, 112, 112, 128, 57344, 250880, 176_247_271_424, 2048, "plain"
        ),
        # Qwen/Qwen3-8B
        "qwen3-8b": _m("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, 8_190_735_360, 40960),
    }
)

# The Hugging Face repo of each catalog model (where its config.json is); a
# deployment export names the model by it. OPT-175B has none: Meta gates it.
HF_IDS: Mapping[str, str] = MappingProxyType(
    {
        "llama-2-7b": "meta-llama/Llama-2-7b-hf",
        "llama-2-13b": "meta-llama/Llama-2-13b-hf",
        "llama-2-70b": "meta-llama/Llama-2-70b-hf",
        "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
        "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
        "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
        "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
        "opt-13b": "facebook/opt-13b",
        "opt-66b": "facebook/opt-66b",
        "bloom-176b": "bigscience/bloom",
        "qwen3-8b": "Qwen/Qwen3-8B",
    }
)

# Names the normalisation (:func:`normal_model_name`) does not bring to a
# catalog name by itself, keyed by their normal form.
_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "bloom": "bloom-176b",
        "bloom-176": "bloom-176b",
        "qwen-3-8b": "qwen3-8b",
        "llama-3.0-8b": "llama-3-8b",
        "llama-3.0-70b": "llama-3-70b",
        "opt-175": "opt-175b",
    }
)

# Suffixes of fine-tuned or packaged variants with the base model's shapes.
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-base", "-hf")

_REQUIRED = ("name", "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
             "vocab", "params")  # fmt: skip
_OPTIONAL = ("dtype_bytes", "dtype", "mlp", "max_context")


def normal_model_name(name: str) -> str:
    """The normal form of a model name: lower case, ``_`` and spaces as ``-``,
    no organisation (``meta-llama/``), no variant suffix (``-Instruct``,
    ``-chat``, ``-hf``), ``Meta-Llama-3`` as ``llama-3``, ``llama3``/``opt13b``
    with a hyphen after the family: ``meta-llama/Llama-3.1-70B-Instruct`` and
    ``llama3.1-70b`` are both ``llama-3.1-70b``."""
    key = "-".join(name.strip().lower().replace("_", " ").split())
    key = key.rsplit("/", 1)[-1]
    stripped = True
    while stripped:
        stripped = False
        for suffix in _VARIANT_SUFFIXES:
            if key.endswith(suffix) and len(key) > len(suffix):
                key, stripped = key[: -len(suffix)], True
    if key.startswith("meta-llama-"):
        key = key[len("meta-") :]
    return re.sub(r"^(llama|opt)(\d)", r"\1-\2", key)


def _canonical(name: str) -> str | None:
    key = normal_model_name(name)
    if key in MODELS:
        return key
    return _ALIASES.get(key)


def get_model(name_or_mapping: str | Mapping[str, object], where: str = "") -> ModelSpec:
    """A catalog model by name, or a user model from an inline mapping.

    Names are case-insensitive; a Hugging Face repo id (``facebook/opt-13b``,
    ``meta-llama/Llama-2-70b-hf``) and short aliases (``llama2-70b``) work.
    A mapping needs ``name, layers, hidden, heads, kv_heads, head_dim,
    intermediate, vocab, params`` and may give ``dtype_bytes`` or ``dtype``,
    ``mlp`` and ``max_context`` (tokens; config.json's
    ``max_position_embeddings``). ``where`` prefixes error messages
    (``"spec.yaml: model"``).

    Raises :class:`UnknownNameError` for an unknown name and
    :class:`SpecError` for a malformed mapping.
    """
    if isinstance(name_or_mapping, str):
        key = _canonical(name_or_mapping)
        if key is None:
            raise UnknownNameError(
                "model", name_or_mapping, MODELS, where,
                close_to=normal_model_name(name_or_mapping),
            )  # fmt: skip
        return MODELS[key]
    if not isinstance(name_or_mapping, Mapping):
        raise SpecError(
            f"{where or 'model'}: {name_or_mapping!r} is neither a model name nor a mapping"
        )
    m = name_or_mapping
    check_keys(m, where or "model", _REQUIRED, _OPTIONAL)
    if not isinstance(m["name"], str) or not m["name"]:
        raise SpecError(f"{entry(where, 'name')}: {m['name']!r} must be a non-empty string")
    ints = {k: positive_int(m[k], entry(where, k)) for k in _REQUIRED[1:]}
    if "dtype_bytes" in m and "dtype" in m:
        raise SpecError(f"{where or 'model'}: give dtype or dtype_bytes, not both")
    b = 2
    if "dtype_bytes" in m:
        b = positive_int(m["dtype_bytes"], entry(where, "dtype_bytes"))
    elif "dtype" in m:
        try:
            b = dtype_bytes(m["dtype"])  # type: ignore[arg-type]
        except SpecError as e:
            raise SpecError(f"{entry(where, 'dtype')}: {e}") from None
    mlp = m.get("mlp", "gated")
    if mlp not in _MLP_KINDS:
        raise SpecError(f"{entry(where, 'mlp')}: {mlp!r}; expected one of gated, plain")
    if ints["heads"] % ints["kv_heads"]:
        raise SpecError(
            f"{entry(where, 'kv_heads')}: {ints['kv_heads']} does not divide heads={ints['heads']}"
        )
    if b not in (1, 2, 4):
        raise SpecError(f"{entry(where, 'dtype_bytes')}: {b}; expected 1, 2 or 4")
    ctx = None
    if m.get("max_context") is not None:
        ctx = positive_int(m["max_context"], entry(where, "max_context"))
    return ModelSpec(name=m["name"], dtype_bytes=b, mlp=str(mlp), max_context=ctx, **ints)


def model_from_arg(value: str, where: str) -> ModelSpec:
    """A model given on the command line: a catalog name or alias, a YAML file
    (``FILE.yaml``: the mapping of a spec's inline ``model:``, or a spec with
    one), or that mapping inline (``{name: tiny, layers: 2, ...}``)."""
    from pathlib import Path

    from twin import yamlio

    text = value.strip()
    if text.startswith("{"):
        where_map = f"{where} (inline)"
        doc = yamlio.load_text(text, where_map)
    elif text.endswith((".yaml", ".yml")) or Path(text).is_file():
        where_map = f"{where} {text}"
        try:
            raw = Path(text).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SpecError(f"{where}: {text}: no such model file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError(f"{where}: {text}: cannot read: {e}") from None
        doc = yamlio.load_text(raw, where_map)
        if isinstance(doc, Mapping) and set(doc) >= {"model"} and "layers" not in doc:
            doc, where_map = doc["model"], f"{where_map}: model"  # a spec with an inline model
    else:
        return get_model(text, where)
    if isinstance(doc, str):
        return get_model(doc, where_map)
    if not isinstance(doc, Mapping):
        raise SpecError(
            f"{where_map}: {doc!r} is not a model mapping; expected keys {', '.join(_REQUIRED)}"
        )
    return get_model(doc, where_map)


def model_names() -> list[str]:
    """Catalog names, sorted."""
    return sorted(MODELS)
