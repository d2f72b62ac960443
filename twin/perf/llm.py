"""LLM architectures and the KV-cache arithmetic that follows from them.

A :class:`ModelSpec` holds the shapes that decide memory and FLOPs: layers,
hidden size, query and KV heads, head dimension, MLP width and kind, vocabulary
and parameter count. The catalog :data:`MODELS` carries public Hugging Face
``config.json`` values, one data file per model in ``twin/data/models/``
(:mod:`twin.perf.catalogs`; the shapes typed from the config, or the config
itself, read by :mod:`twin.perf.hfconfig`), each value with its source;
:func:`get_model` looks a name up (case-insensitive, with aliases) or builds
a user model from an inline YAML mapping or a ``config.json``.

KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per
element, for the whole model; a TP shard holds 1/TP of it. Engines allocate
KV in blocks (default 16 tokens), so sizes are rounded up to whole blocks.

Mixture-of-experts models (``experts > 0``) replace the MLP of every layer
after the first ``dense_layers`` by ``experts`` routed experts of width
``expert_intermediate``, of which each token uses ``experts_per_token``, plus
``shared_experts`` that every token uses. DeepSeek's multi-head latent
attention (``kv_lora_rank > 0``) caches, per layer and token, one compressed
latent of ``kv_lora_rank`` elements and the rope key of ``qk_rope_dim``: KV
bytes per token = layers x (kv_lora_rank + qk_rope_dim) x bytes per element,
the same on every TP rank (the latent is not split over heads).

Sliding-window attention (GPT-OSS: config.json's ``sliding_window`` and
``layer_types``): ``sliding_layers`` of the layers attend to the last
``sliding_window`` tokens only, which bounds their attention work
(:class:`~twin.perf.roofline.Roofline`). NOTE: the KV cache still holds the
whole context for every layer (the figures above, an upper bound): the
block accounting sizes one block for all layers of a token, and bounding the
sliding layers' share at the window would need a pool of its own for them
(as vLLM's hybrid KV-cache manager keeps), which the twin does not model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from twin._check import check_keys, entry, is_int, positive_int
from twin._io import read_text
from twin.errors import SpecError, UnknownNameError
from twin.perf.catalogs import read_catalog
from twin.perf.hfconfig import CONFIG_KEYS, load_config, shapes_from_config

_DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2,
     "fp8": 1, "int8": 1}
)  # fmt: skip
_MLP_KINDS = ("gated", "plain")
_MOE_FIELDS = ("experts", "experts_per_token", "shared_experts", "expert_intermediate",
               "dense_layers")  # fmt: skip
_MLA_FIELDS = ("kv_lora_rank", "qk_rope_dim", "qk_nope_dim", "q_lora_rank")
_SLIDING_FIELDS = ("sliding_window", "sliding_layers")


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

    Mixture of experts (all 0 for a dense model): ``experts`` routed experts
    per MoE layer, ``experts_per_token`` of them per token (top-k),
    ``shared_experts`` every token uses, each ``expert_intermediate`` wide
    (gated when ``mlp`` is); the first ``dense_layers`` layers have a dense MLP
    of width ``intermediate``, the rest are MoE layers. Multi-head latent
    attention (DeepSeek; all 0 for GQA): ``kv_lora_rank`` (the cached latent),
    ``qk_rope_dim`` (the cached rope key), ``qk_nope_dim`` and ``q_lora_rank``
    (0: a full query projection); ``head_dim`` is then the value head size.
    ``weight_dtype_bytes`` is the bytes per weight when the checkpoint's
    weights are stored narrower than the activations and KV (DeepSeek-V3's FP8
    weights); 0 means ``dtype_bytes``. ``sliding_layers`` of the layers
    (0: none) attend to the last ``sliding_window`` tokens only.
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
    experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    expert_intermediate: int = 0
    dense_layers: int = 0
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    qk_nope_dim: int = 0
    q_lora_rank: int = 0
    weight_dtype_bytes: int = 0
    sliding_window: int = 0
    sliding_layers: int = 0

    def __post_init__(self) -> None:  # noqa: C901
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
        for field in _MOE_FIELDS + _MLA_FIELDS + ("weight_dtype_bytes", *_SLIDING_FIELDS):
            v = getattr(self, field)
            if not is_int(v) or v < 0:
                raise SpecError(f"{where}: {field}={v!r} must be an integer >= 0")
        if self.weight_dtype_bytes not in (0, 1, 2, 4):
            raise SpecError(
                f"{where}: weight_dtype_bytes={self.weight_dtype_bytes!r}; expected 1, 2 or 4"
            )
        if self.experts:
            if not 0 < self.experts_per_token <= self.experts:
                raise SpecError(
                    f"{where}: experts_per_token={self.experts_per_token!r} must be in"
                    f" 1..experts={self.experts}"
                )
            if self.expert_intermediate < 1:
                raise SpecError(f"{where}: expert_intermediate must be >= 1 with experts")
            if self.dense_layers >= self.layers:
                raise SpecError(
                    f"{where}: dense_layers={self.dense_layers} leaves no MoE layer of"
                    f" {self.layers}"
                )
        elif any(getattr(self, f) for f in _MOE_FIELDS):
            raise SpecError(f"{where}: {', '.join(_MOE_FIELDS[1:])} need experts >= 1")
        if bool(self.sliding_window) != bool(self.sliding_layers):
            raise SpecError(f"{where}: sliding_window and sliding_layers go together")
        if self.sliding_layers > self.layers:
            raise SpecError(
                f"{where}: sliding_layers={self.sliding_layers} exceeds layers={self.layers}"
            )
        if self.kv_lora_rank and not self.qk_rope_dim:
            raise SpecError(f"{where}: kv_lora_rank needs qk_rope_dim >= 1")
        if not self.kv_lora_rank and any(getattr(self, f) for f in _MLA_FIELDS):
            raise SpecError(f"{where}: {', '.join(_MLA_FIELDS[1:])} need kv_lora_rank >= 1")

    @property
    def is_moe(self) -> bool:
        """Whether the model has routed experts."""
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        """Whether the attention is multi-head latent attention (a cached latent)."""
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (0 for a dense model)."""
        return self.layers - self.dense_layers if self.experts else 0

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
        if self.intermediate % tp and (self.dense_layers or not self.experts):
            return f"{tp} does not divide {self.name}'s FFN width {self.intermediate:,}"
        if self.experts and self.expert_intermediate % tp:
            return f"{tp} does not divide {self.name}'s expert width {self.expert_intermediate:,}"
        if self.is_mla:
            return None  # one latent per token, replicated on every TP rank
        if self.kv_heads % tp and tp % self.kv_heads:
            return (
                f"{tp} neither divides nor is a multiple of {self.name}'s {self.kv_heads} KV heads"
            )
        return None

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads each TP rank holds: ``kv_heads / tp``, or 1 when ``tp``
        exceeds the KV heads (each is then replicated, as vLLM does); 1 for
        latent attention (the latent is one "head" every rank holds)."""
        if self.is_mla:
            return 1
        return max(1, self.kv_heads // tp)

    def kv_bytes_per_token_tp(self, tp: int = 1, dtype_bytes: int | None = None) -> int:
        """KV bytes one token takes on all ``tp`` ranks together: the whole
        model's :meth:`kv_bytes_per_token`, or more when ``tp`` exceeds the KV
        heads and they are replicated."""
        b = self.dtype_bytes if dtype_bytes is None else dtype_bytes
        if self.is_mla:
            return tp * self.kv_bytes_per_token(b)
        return 2 * self.layers * self.kv_heads_per_gpu(tp) * tp * self.head_dim * b

    def kv_bytes_per_token(self, dtype_bytes: int | None = None) -> int:
        """Bytes of K and V one token holds across all layers (whole model, not a
        shard); for latent attention the latent and the rope key."""
        b = self.dtype_bytes if dtype_bytes is None else dtype_bytes
        if self.is_mla:
            return self.layers * (self.kv_lora_rank + self.qk_rope_dim) * b
        return 2 * self.layers * self.kv_heads * self.head_dim * b

    @property
    def kv_elements_per_layer(self) -> int:
        """Elements one token caches per layer: 2 x kv_heads x head_dim, or
        kv_lora_rank + qk_rope_dim for latent attention."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_dim
        return 2 * self.kv_heads * self.head_dim

    @property
    def weight_bytes_per_param(self) -> int:
        """Bytes per stored weight: ``weight_dtype_bytes``, else ``dtype_bytes``."""
        return self.weight_dtype_bytes or self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights at :attr:`weight_bytes_per_param` per parameter."""
        return self.params * self.weight_bytes_per_param

    def weight_bytes_per_gpu(self, tp: int = 1, pp: int = 1, ep: int = 1) -> float:
        """Weight bytes on each GPU of an instance: all weights over ``tp x pp``
        without EP; with EP the routed experts over ``ep`` and the rest over
        ``tp`` (each data-parallel attention rank keeps its copy), over ``pp``."""
        if ep == 1:
            return self.weight_bytes / (tp * pp)
        routed = self.routed_params * self.weight_bytes_per_param
        return ((self.weight_bytes - routed) / tp + routed / ep) / pp

    @property
    def attn_params_per_layer(self) -> int:
        """Weights of one layer's attention projections: Q, K, V and O for
        GQA; for latent attention the query (through ``q_lora_rank`` when set),
        the joint KV down-projection with the rope key, the latent's K/V
        up-projection and O."""
        h = self.hidden
        if not self.is_mla:
            return 2 * h * self.heads * self.head_dim + 2 * h * self.kv_heads * self.head_dim
        qk = self.heads * (self.qk_nope_dim + self.qk_rope_dim)
        q = h * self.q_lora_rank + self.q_lora_rank * qk if self.q_lora_rank else h * qk
        kv_down = h * (self.kv_lora_rank + self.qk_rope_dim)
        kv_up = self.kv_up_params_per_layer
        return q + kv_down + kv_up + self.heads * self.head_dim * h

    def attn_flops_per_pair(self, absorbed: bool = False) -> int:
        """FLOPs of one layer's attention for one query token against one
        cached or new key token, all heads (a multiply-add is 2): 2 x heads x
        (the score's dot-product length + the value's). GQA: head_dim each.
        Latent attention without absorption (prefill: K and V up-projected
        from the latent per head, DeepSeek-V2, arXiv 2405.04434, 2.1.2-2.1.3):
        qk_nope + qk_rope, and the value head. With the up-projections
        absorbed into the query and the output (decode, as FlashMLA runs it:
        the query moved into the latent space, the attention read straight off
        the cached latent): kv_lora_rank + qk_rope for the score, kv_lora_rank
        for the value."""
        if not self.is_mla:
            return 4 * self.heads * self.head_dim
        if absorbed:
            return 2 * self.heads * (2 * self.kv_lora_rank + self.qk_rope_dim)
        return 2 * self.heads * (self.qk_nope_dim + self.qk_rope_dim + self.head_dim)

    @property
    def kv_up_params_per_layer(self) -> int:
        """Latent attention: weights of one layer's K/V up-projection from the
        latent (kv_lora_rank x heads x (qk_nope + value head)); 0 for GQA."""
        if not self.is_mla:
            return 0
        return self.kv_lora_rank * self.heads * (self.qk_nope_dim + self.head_dim)

    def mlp_params(self, width: int) -> int:
        """Weights of one MLP (or expert) ``width`` wide: 3 or 2 matrices."""
        return (3 if self.mlp == "gated" else 2) * self.hidden * width

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (0 for a dense model)."""
        return self.mlp_params(self.expert_intermediate) if self.experts else 0

    @property
    def routed_params(self) -> int:
        """Weights of all routed experts of all MoE layers."""
        return self.moe_layers * self.experts * self.expert_params

    @property
    def dense_token_params(self) -> int:
        """Weights every token multiplies, all layers together, apart from the
        routed experts: attention, the dense layers' MLPs (every layer's for a
        model without experts) and, per MoE layer, the shared experts and the
        router (hidden x experts)."""
        moe = self.shared_experts * self.expert_params + self.hidden * self.experts
        dense = self.dense_layers if self.experts else self.layers  # every layer without experts
        return (
            self.layers * self.attn_params_per_layer
            + dense * self.mlp_params(self.intermediate)
            + self.moe_layers * moe
        )

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the matrices one token multiplies in a layer (attention + MLP);
        for a MoE model the per-layer mean with its ``experts_per_token`` routed experts."""
        if not self.experts and not self.is_mla:
            q_o = 2 * self.hidden * self.heads * self.head_dim
            k_v = 2 * self.hidden * self.kv_heads * self.head_dim
            mats = 3 if self.mlp == "gated" else 2
            return q_o + k_v + mats * self.hidden * self.intermediate
        routed = self.moe_layers * self.experts_per_token * self.expert_params
        return (self.dense_token_params + routed) // self.layers


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


# Suffixes of fine-tuned or packaged variants with the base model's shapes.
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-base", "-hf")

_REQUIRED = ("name", "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
             "vocab", "params")  # fmt: skip
_OPTIONAL = ("dtype_bytes", "dtype", "mlp", "max_context", *_MOE_FIELDS, *_MLA_FIELDS,
             "weight_dtype_bytes", *_SLIDING_FIELDS)  # fmt: skip


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


def get_model(name_or_mapping: str | Mapping[str, object], where: str = "") -> ModelSpec:  # noqa: C901
    """A catalog model by name, or a user model from an inline mapping.

    Names are case-insensitive; a Hugging Face repo id (``facebook/opt-13b``,
    ``meta-llama/Llama-2-70b-hf``) and short aliases (``llama2-70b``) work.
    A mapping needs ``name, layers, hidden, heads, kv_heads, head_dim,
    intermediate, vocab, params`` and may give ``dtype_bytes`` or ``dtype``,
    ``mlp`` and ``max_context`` (tokens; config.json's
    ``max_position_embeddings``). ``where`` prefixes error messages
    (``"spec.yaml: model"``).

    A Hugging Face ``config.json`` works too, as a path (``*.json``) or its
    mapping inline (:mod:`twin.perf.hfconfig`).

    Raises :class:`UnknownNameError` for an unknown name and
    :class:`SpecError` for a malformed mapping.
    """
    if isinstance(name_or_mapping, str) and name_or_mapping.strip().endswith(".json"):
        path = name_or_mapping.strip()
        cfg = load_config(path, where or "model")
        return get_model(shapes_from_config(cfg, f"{where or 'model'}: {path}"), where)
    if isinstance(name_or_mapping, Mapping) and "layers" not in name_or_mapping:
        if any(k in name_or_mapping for k in CONFIG_KEYS):
            return get_model(shapes_from_config(name_or_mapping, where or "model"), where)
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
    extra = {k: _nonneg_int(m[k], entry(where, k)) for k in _OPTIONAL[4:] if k in m}
    if extra.get("weight_dtype_bytes") == 0:  # 0 is the class's "as dtype_bytes", not a width
        raise SpecError(
            f"{entry(where, 'weight_dtype_bytes')}: 0; expected 1, 2 or 4 "
            "(leave it out for weights as wide as dtype_bytes)"
        )
    try:
        return ModelSpec(name=m["name"], dtype_bytes=b, mlp=str(mlp), max_context=ctx, **ints,
                         **extra)  # fmt: skip
    except SpecError as e:
        raise SpecError(f"{where or 'model'}: {e}") from None


def _nonneg_int(v: object, where: str) -> int:
    if not is_int(v) or v < 0:  # type: ignore[operator]
        raise SpecError(f"{where}: {v!r} must be an integer >= 0")
    return v  # type: ignore[return-value]


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
        if not Path(text).exists():
            raise SpecError(f"{where}: {text}: no such model file")
        try:
            raw = read_text(text, "model file", SpecError)
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None
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


# The catalog: one data file per model (twin/data/models/<name>.json, read and checked by
# twin.perf.catalogs), each value cited there: the shapes typed from the model's
# config.json (or its paper), or the config.json itself, shapes and parameter count derived.
_FILES = read_catalog("models")
MODELS: Mapping[str, ModelSpec] = MappingProxyType(
    {
        k: get_model({"name": k, **d["shapes"]}, f"twin/data/models/{k}.json")
        if "shapes" in d
        else get_model(shapes_from_config(d["config"], k, k), k)
        for k, d in _FILES.items()
    }
)
# The Hugging Face repo of each catalog model (where its config.json is); a
# deployment export names the model by it. OPT-175B has none: Meta gates it.
HF_IDS: Mapping[str, str] = MappingProxyType(
    {k: d["hf_id"] for k, d in _FILES.items() if "hf_id" in d}
)
# Names the normalisation (:func:`normal_model_name`) does not bring to a catalog
# name by itself, keyed by their normal form: each file's aliases, and the repo id
# of a model kept as its config.json.
_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        **{a: k for k, d in _FILES.items() for a in d.get("aliases", ())},
        **{normal_model_name(d["hf_id"]): k for k, d in _FILES.items() if "config" in d},
    }
)


def model_names() -> list[str]:
    """Catalog names, sorted."""
    return sorted(MODELS)
