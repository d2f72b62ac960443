"""A model's shapes from its Hugging Face ``config.json``, as the inline ``model:``
mapping a spec takes (for the models of a measured run that the catalog lacks).

Reads the keys Llama, Mistral, Qwen2, Yi, Mixtral and Llama-4 text configs share
(``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
``num_key_value_heads``, ``head_dim`` (else hidden / heads), ``intermediate_size``,
``vocab_size``, ``max_position_embeddings``; MoE: ``num_local_experts``,
``num_experts_per_tok``, Llama-4's shared expert and ``intermediate_size_mlp``);
a ``text_config`` inside (Llama-4's) is read in its place. The parameter count is
counted from the shapes: embeddings (and an untied LM head), per layer the attention
projections (q, k, v, o) and the MLP (gate, up, down; each expert and the shared
one, plus the router), and the norms (2 per layer, 1 final).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twin.errors import SpecError

_NEEDED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
           "vocab_size")  # fmt: skip


def model_mapping(
    config: Mapping[str, Any], name: str, where: str, fp8: bool = False
) -> dict[str, Any]:
    """The inline ``model:`` mapping of ``config`` (``where`` names it in errors);
    ``fp8``: weights stored in 8 bits (activations and KV stay 16-bit)."""
    c = config.get("text_config", config)
    if not isinstance(c, Mapping):
        raise SpecError(f"{where}: text_config is not a mapping")
    missing = [k for k in _NEEDED if not isinstance(c.get(k), int)]
    if missing:
        raise SpecError(f"{where}: missing integer key(s) {', '.join(missing)} in config.json")
    layers, hidden, heads = c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    inter, vocab = c["intermediate_size"], c["vocab_size"]
    experts = int(c.get("num_local_experts") or 0)
    moe_every = int(c.get("interleave_moe_layer_step") or 1)
    llama4 = "intermediate_size_mlp" in c
    out: dict[str, Any] = {
        "name": name, "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv,
        "head_dim": head_dim, "vocab": vocab, "mlp": "gated",
    }  # fmt: skip
    if c.get("max_position_embeddings"):
        out["max_context"] = int(c["max_position_embeddings"])
    attn = hidden * head_dim * (2 * heads + 2 * kv)
    dense_mlp = 3 * hidden * inter
    if experts:
        moe_layers = layers // moe_every
        dense_width = int(c["intermediate_size_mlp"]) if llama4 else inter
        shared = 1 if llama4 else 0  # Llama-4 adds one shared expert of the experts' width
        moe_mlp = (experts + shared) * 3 * hidden * inter + hidden * experts
        mlp = moe_layers * moe_mlp + (layers - moe_layers) * 3 * hidden * dense_width
        out.update(
            intermediate=dense_width, experts=experts,
            experts_per_token=int(c.get("num_experts_per_tok") or 1),
            shared_experts=shared, expert_intermediate=inter,
            dense_layers=layers - moe_layers,
        )  # fmt: skip
        if moe_every != 1:
            raise SpecError(
                f"{where}: interleave_moe_layer_step={moe_every}: alternating dense and MoE "
                "layers are not modelled (the catalog's MoE layers follow its dense ones)"
            )
    else:
        mlp = layers * dense_mlp
        out["intermediate"] = inter
    head = 0 if c.get("tie_word_embeddings") else vocab * hidden
    out["params"] = vocab * hidden + head + layers * (attn + 2 * hidden) + mlp + hidden
    if fp8:
        out["weight_dtype_bytes"] = 1
    return out
