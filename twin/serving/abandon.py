"""A request given up by its client, taken out of the one instance that holds it.

A client that stops waiting (a request time-out, ``workload.timeout``) closes its
connection; vLLM's API server then aborts the request, and the engine frees its
KV blocks and leaves it out of the next batch. :func:`abandon` does that to one
:class:`~twin.serving.sequence.Sequence` at the present instant, wherever it is
on ``engine``: queued, prefilling (the chunk of the iteration under way is
wasted), prefilled with its KV waiting to move, landed and not yet in the
batch, or decoding (the step under way runs without it from the next). A
fast-forwarded stretch ends at the step in progress first, so the result is the
one stepping gives. The caller ends the request (and stops its hand-off).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twin.serving import holding
from twin.serving.sequence import DECODE, DONE, INCOMING

if TYPE_CHECKING:
    from twin.serving.engine import Engine
    from twin.serving.sequence import Sequence


def abandon(engine: Engine, seq: Sequence) -> bool:
    """Take ``seq`` out of ``engine`` now and free every block it holds there;
    a decoding one's produced tokens are brought up to the last step that ended.
    False when, brought up to now (a stretch applies the steps that ended by
    now), it had finished: nothing is taken out."""
    engine.interrupt()  # a stretch ends at the step in progress, as stepping has it
    if seq.state == DONE:
        return False
    if seq.state not in (DECODE, INCOMING):
        engine.drop(seq)  # queued, prefilling, or its KV waiting here to move
        return True
    if seq.state == DECODE:
        # out of its lane's batch before the step in progress (or the next, pipelined)
        engine.lanes[seq.lane].leave(seq)
    elif seq in engine.landed:  # landed or kept, to join at the next step boundary
        engine.landed.remove(seq)
    del engine.running[seq.req.id]
    holding.drop(engine.kv, engine.cache, seq)
    engine.queue_changes += 1
    engine.blocks_freed()
    return True
