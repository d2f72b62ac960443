"""A prompt's prefix units: runs of ``prefix_block_tokens`` tokens named by a hash.

The prefix cache, the KV tiers below it and the KV pools keep a prompt's KV
by these units; only units that are whole KV blocks can be kept.
"""

from __future__ import annotations

from twin.request import Request


def cacheable(req: Request, block_size: int) -> tuple[int, ...]:
    """The prefix hashes of ``req`` whose units are whole blocks of its prompt
    (none when a unit is not a multiple of ``block_size``)."""
    unit = req.prefix_block_tokens
    if unit <= 0 or unit % block_size:
        return ()
    return req.prefix_hashes[: req.prompt_tokens // unit]
