"""What ``twin kv`` prints: a model's KV bytes per token and per block, and
for a number of tokens the blocks, tokens allocated and bytes (exact
integers, whole model: all TP shards)."""

from __future__ import annotations

import decimal
from typing import Any

from twin.perf.llm import ModelSpec, kv_blocks


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
    shape: dict[str, Any] = {"kv_heads": model.kv_heads, "head_dim": model.head_dim}
    if model.is_mla:
        shape = {"kv_lora_rank": model.kv_lora_rank, "qk_rope_dim": model.qk_rope_dim}
    return {
        "model": model.name,
        "layers": model.layers,
        **shape,
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
    shape = f"{model.kv_heads} kv heads x {model.head_dim} head dim"
    if model.is_mla:
        shape = f"({model.kv_lora_rank} latent + {model.qk_rope_dim} rope)"
    return "\n".join(
        [
            f"model            {model.name} ({model.layers} layers x {shape}, {b} B/element)",
            f"bytes per token  {per_token:,} B",
            f"bytes per block  {per_token * block_size:,} B ({block_size} tokens)",
            f"blocks           {blocks:,} for {tokens:,} tokens"
            f" ({blocks * block_size:,} tokens allocated)",
            f"KV size          {total:,} B = {_exact(total, 10)} KiB"
            f" = {_exact(total, 20)} MiB = {_exact(total, 30)} GiB",
        ]
    )
