"""Max-min fair sharing by progressive filling: :func:`max_min_rates` of flows
on paths of links with capacities, one connected component at a time, and the
filling of a component of flow groups that :class:`~twin.net.flows.Network`
re-shares (``_fill``: a group stays whole only while flow-by-flow filling would
give its flows one rate)."""

from __future__ import annotations

import math
from collections.abc import Hashable
from collections.abc import Sequence as Seq
from typing import TypeVar

from twin.net.transfer import _Flow, _Key

K = TypeVar("K", bound=Hashable)


def max_min_rates(
    paths: Seq[Seq[K]], caps: Seq[float | None], capacity: dict[K, float]
) -> list[float]:
    """Max-min fair rates by progressive filling, one connected component at a time.

    Flow ``i`` crosses links ``paths[i]`` and may not exceed ``caps[i]``
    (None: uncapped). Flows that share a link, directly or through other
    flows, form a component; flows of different components cannot change each
    other's rates, so each component is filled on its own (in the order of its
    first flow). Within one, all unfrozen flows rise together to the level at
    which a link fills or a cap is met; the flows held there freeze; repeat. A
    flow with no links and no cap gets ``inf``. Every round freezes at least
    one flow, so there are at most ``len(paths)`` rounds.
    """
    rate = [0.0] * len(paths)
    for comp in _components(paths):
        got, _ = _fill([paths[i] for i in comp], [caps[i] for i in comp], capacity)
        for i, r in zip(comp, got, strict=True):
            rate[i] = r
    return rate


def _components(paths: Seq[Seq[K]]) -> list[list[int]]:
    """The flows (indices) of each connected component, in order of first flow."""
    first: dict[K, int] = {}  # link -> the first flow on it
    parent = list(range(len(paths)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, p in enumerate(paths):
        for k in p:
            j = first.setdefault(k, i)
            a, b = root(i), root(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    comps: dict[int, list[int]] = {}
    for i in range(len(paths)):
        comps.setdefault(root(i), []).append(i)
    return list(comps.values())


def _fill(  # noqa: C901
    paths: Seq[Seq[K]],
    caps: Seq[float | None],
    capacity: dict[K, float],
    members: Seq[Seq[Seq[K]] | None] | None = None,
) -> tuple[list[float], int]:
    """Progressive filling of one set of flows (no decomposition).

    With ``members``, entry ``i`` is a flow group: ``members[i]`` lists the
    links of each of its flows (None: a single flow), and ``paths[i]`` holds
    them all, a link once per member that crosses it, so a link counts every
    member on it. A group rises as one. That is the per-flow filling exactly
    as long as, whenever a link fills, either every member of each group on it
    is held by some full link (or the group's cap) or none is; the arithmetic
    is then the same operation for operation. Returns ``(rates, -1)``, a
    member's rate per entry, or ``([], i)`` for the first group ``i`` whose
    members would part (the caller splits it and fills again).
    """
    n = len(paths)
    rate = [0.0] * n
    frozen = [False] * n
    users: dict[K, list[int]] = {}
    for i, p in enumerate(paths):
        for k in p:
            users.setdefault(k, []).append(i)
    left = {k: capacity[k] for k in users}  # capacity not taken by frozen flows
    count = {k: len(v) for k, v in users.items()}  # unfrozen flows on the link
    open_links = list(users)  # links with unfrozen flows
    cap_of = [math.inf if c is None else c for c in caps]
    capped = [i for i in range(n) if cap_of[i] < math.inf]  # ... unfrozen
    todo = n
    while todo:
        level = math.inf
        for k in open_links:
            share = left[k] / count[k]
            if share < level:
                level = share
        for i in capped:
            if cap_of[i] < level:
                level = cap_of[i]
        if level == math.inf:  # only flows with neither links nor caps remain
            for i in range(n):
                if not frozen[i]:
                    rate[i] = math.inf
            break
        level = max(level, 0.0)  # rounding may leave a link a hair below zero
        hold: list[int] = []
        full: list[K] = []
        for k in open_links:
            # A link within rounding of the level is full too: freeze its flows.
            if left[k] / count[k] <= level * (1.0 + 1e-12):
                full.append(k)
                hold.extend(i for i in users[k] if not frozen[i])
        at_cap = [i for i in capped if cap_of[i] <= level]
        if members is not None:
            full_set = set(full)
            for i in dict.fromkeys(hold):  # each group once
                m = members[i]
                if m is None or cap_of[i] <= level:
                    continue
                for links in m:
                    if full_set.isdisjoint(links):
                        return [], i
        hold.extend(at_cap)
        for i in hold:
            if frozen[i]:
                continue  # on two full links
            frozen[i] = True
            rate[i] = level
            todo -= 1
            for k in paths[i]:
                left[k] -= level
                count[k] -= 1
        open_links = [k for k in open_links if count[k]]
        capped = [i for i in capped if not frozen[i]]
    return rate, -1


def _fill_one(f: _Flow, capacity: dict[_Key, float]) -> tuple[list[float], int]:
    """:func:`_fill` of the one group ``f`` (the same operations, one round)."""
    mult = f.mult
    level = math.inf
    for k, m in mult.items():
        share = capacity[k] / m
        if share < level:
            level = share
    cap = math.inf if f.cap is None else f.cap
    if cap < level:
        level = cap
    if level == math.inf:
        return [math.inf], -1
    level = max(level, 0.0)
    if f.n > 1 and cap > level:
        full = {k for k, m in mult.items() if capacity[k] / m <= level * (1.0 + 1e-12)}
        for links in f.members:
            if full.isdisjoint(links):
                return [], 0
    return [level], -1
