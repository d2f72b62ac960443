"""A model's shapes from its Hugging Face ``config.json``.

:func:`shapes_from_config` reads the keys the ``transformers`` configuration
classes define (``num_hidden_layers``, ``hidden_size``,
``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
``intermediate_size``, ``vocab_size``, ``max_position_embeddings``,
``torch_dtype``; mixture of experts: ``num_local_experts`` (Mixtral),
``num_experts`` (Qwen-MoE) or ``n_routed_experts`` (DeepSeek),
``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts``,
``first_k_dense_replace``; latent attention: ``kv_lora_rank``,
``qk_rope_head_dim``, ``qk_nope_head_dim``, ``q_lora_rank``, ``v_head_dim``)
and writes the mapping :func:`twin.perf.llm.get_model` takes inline, its
parameter count computed from the shapes (:func:`count_params`). A
multimodal config's language model (``text_config``) is the one read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twin._check import is_int
from twin._io import read_text
from twin.errors import SpecError
from twin.perf.catalogs import read_catalog

# Keys that say a mapping is a config.json rather than the twin's own model mapping.
CONFIG_KEYS = ("num_hidden_layers", "hidden_size", "text_config")

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def load_config(path: str | Path, where: str) -> dict[str, Any]:
    """The mapping of the ``config.json`` at ``path``; a one-line error naming
    the file when it cannot be read or is not a JSON object."""
    p = Path(path)
    if not p.exists():
        raise SpecError(f"{where}: {p}: no such config.json")
    text = read_text(p, "config.json", SpecError)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{where}: {p}: not JSON: {e.msg} (line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: {p}: a config.json holds an object, not {type(doc).__name__}")
    doc.setdefault("_name_or_path", p.parent.name if p.stem == "config" else p.stem)
    return doc


def _int(cfg: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    if key not in cfg or cfg[key] is None:
        if default is None:
            raise SpecError(f"{where}: key {key!r} missing")
        return default
    v = cfg[key]
    if not is_int(v) or v < 0:
        raise SpecError(f"{where}: key {key!r}: {v!r} must be an integer >= 0")
    return int(v)


def shapes_from_config(cfg: Mapping[str, Any], where: str, name: str | None = None) -> dict:
    """The inline model mapping of ``cfg`` (a parsed config.json); errors name
    ``where`` (the file) and the key."""
    if isinstance(cfg.get("text_config"), Mapping):
        outer = cfg
        cfg = {**cfg["text_config"]}
        for k in ("torch_dtype", "tie_word_embeddings", "_name_or_path"):
            if k in outer and k not in cfg:
                cfg[k] = outer[k]
        where = f"{where}: text_config"
    layers = _int(cfg, "num_hidden_layers", where)
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    if not layers or not hidden or not heads:
        raise SpecError(
            f"{where}: num_hidden_layers, hidden_size and num_attention_heads must be >= 1"
        )
    kv_heads = _int(cfg, "num_key_value_heads", where, heads) or heads
    head_dim = _int(cfg, "head_dim", where, hidden // heads) or hidden // heads
    experts = max(
        _int(cfg, k, where, 0) for k in ("num_local_experts", "num_experts", "n_routed_experts")
    )
    out: dict[str, Any] = {
        "name": name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "config.json"),
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": _int(cfg, "v_head_dim", where, head_dim) if "kv_lora_rank" in cfg else head_dim,
        "intermediate": _int(cfg, "intermediate_size", where),
        "vocab": _int(cfg, "vocab_size", where),
    }
    if "max_position_embeddings" in cfg:
        out["max_context"] = _int(cfg, "max_position_embeddings", where)
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    if dtype is not None:
        if dtype not in _DTYPES:
            raise SpecError(
                f"{where}: key 'torch_dtype': {dtype!r}; expected one of {', '.join(_DTYPES)}"
            )
        out["dtype"] = _DTYPES[dtype]
    if experts:
        out["experts"] = experts
        out["experts_per_token"] = _int(cfg, "num_experts_per_tok", where)
        out["expert_intermediate"] = _int(cfg, "moe_intermediate_size", where, out["intermediate"])
        # Llama-4: one shared expert of the routed experts' width in every MoE layer
        shared = 1 if str(cfg.get("model_type", "")).startswith("llama4") else 0
        out["shared_experts"] = _int(cfg, "n_shared_experts", where, shared)
        out["dense_layers"] = _int(cfg, "first_k_dense_replace", where, 0)
    if cfg.get("kv_lora_rank"):
        out["kv_lora_rank"] = _int(cfg, "kv_lora_rank", where)
        out["qk_rope_dim"] = _int(cfg, "qk_rope_head_dim", where)
        out["qk_nope_dim"] = _int(cfg, "qk_nope_head_dim", where)
        out["q_lora_rank"] = _int(cfg, "q_lora_rank", where, 0)
    out["params"] = count_params(out, cfg)
    return out


def count_params(m: Mapping[str, Any], cfg: Mapping[str, Any]) -> int:
    """Weights of the model ``m`` (the inline mapping) with ``cfg``'s extras:
    embeddings and (untied) LM head, per layer the attention projections
    (with biases where ``attention_bias`` is set or the family has them:
    Qwen2's q/k/v), Qwen3's and Gemma-3's per-head q/k norms, the gated MLP
    or the routed and shared experts with their router, two RMSNorm weights
    (four for Gemma-2/3), and the final norm."""
    h, v, n = m["hidden"], m["vocab"], m["layers"]
    heads, kv, hd = m["heads"], m["kv_heads"], m["head_dim"]
    kind = str(cfg.get("model_type", ""))
    tied = bool(cfg.get("tie_word_embeddings", False))
    total = v * h * (1 if tied else 2) + h
    if m.get("kv_lora_rank"):
        qk = heads * (m["qk_nope_dim"] + m["qk_rope_dim"])
        ql = m.get("q_lora_rank", 0)
        q = h * ql + ql + ql * qk if ql else h * qk
        kvp = h * (m["kv_lora_rank"] + m["qk_rope_dim"]) + m["kv_lora_rank"]
        kvp += m["kv_lora_rank"] * heads * (m["qk_nope_dim"] + hd)
        attn = q + kvp + heads * hd * h
    else:
        attn = 2 * h * heads * hd + 2 * h * kv * hd
        if cfg.get("attention_bias") or kind == "qwen2":
            attn += heads * hd + 2 * kv * hd + (h if cfg.get("attention_bias") else 0)
        if kind.startswith(("qwen3", "gemma3")):
            attn += 2 * hd  # q_norm and k_norm
    norms = 4 * h if kind.startswith(("gemma2", "gemma3")) else 2 * h
    dense = 3 * h * m["intermediate"]
    experts = m.get("experts", 0)
    if not experts:
        return total + n * (attn + dense + norms)
    moe = (experts + m.get("shared_experts", 0)) * 3 * h * m["expert_intermediate"] + h * experts
    dl = m.get("dense_layers", 0)
    return total + n * (attn + norms) + dl * dense + (n - dl) * moe


def bundled_configs() -> dict[str, dict[str, Any]]:
    """The catalog models kept as their config.json (``twin/data/models/<name>.json``
    with a ``config``: per model its Hugging Face id, the config's source, the
    keys read and the published parameter count with its source)."""
    return {k: d for k, d in read_catalog("models").items() if "config" in d}
