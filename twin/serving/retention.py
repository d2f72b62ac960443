"""A retention policy's hand on an instance's prefix cache: letting a
session's idle KV go between its turns (:mod:`twin.sim.sessions`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from twin.serving.engine import Engine


def let_go(
    engine: Engine, hashes: Sequence[int], *, write_down: bool, stamps: Sequence[int] | None = None
) -> None:
    """Evict now the idle cached units among ``hashes`` on ``engine`` (written
    down to the tiers below when ``write_down``; with ``stamps``, those of
    :func:`cached_stamps`, a unit used since is kept; see
    :meth:`~twin.serving.kvcache.PrefixCache.let_go`). Nothing on an instance
    that is down or has no prefix cache."""
    cache = engine.cache
    if cache is None or not engine.up:
        return
    engine.sync()  # inside a fast-forwarded stretch: the state stepping shows now
    if cache.let_go(hashes, write_down=write_down, stamps=stamps):
        engine.blocks_freed()


def cached_stamps(engine: Engine, hashes: Sequence[int]) -> list[int]:
    """The last-use stamps of the cached ``hashes`` on ``engine`` (-1: not cached)."""
    return engine.cache.stamps(hashes) if engine.cache is not None else [-1] * len(hashes)
