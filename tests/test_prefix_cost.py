"""Prefix caching at the cost of a hash per block: eviction looks only at idle
units, in the order of their last use, and a replay with the cache on is
fast-forwarded as one without it is."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import counted_run

from twin.request import Request
from twin.serving.engine import EngineConfig
from twin.serving.kvcache import BlockManager, PrefixCache


class _NoWalk(dict):
    """A unit table that refuses to be walked: eviction must find its victims
    without looking at every unit."""

    def __iter__(self):
        raise AssertionError("the prefix cache walked its units")

    def items(self):
        raise AssertionError("the prefix cache walked its units")

    def values(self):
        raise AssertionError("the prefix cache walked its units")


def test_eviction_never_walks_the_units_held():
    kv = BlockManager(2_010, 16)
    cache = PrefixCache(kv)
    cache.units = _NoWalk()
    held = list(range(2_000))
    kv.allocate(2_000)
    assert cache.insert(held, 1) == 2_000  # held by running sequences
    kv.allocate(10)
    assert cache.insert([-1, -2], 5) == 2
    cache.release([-1, -2])  # idle
    cache.evict(3, hold=False)
    assert -1 not in cache.units and -2 in cache.units  # one unit of 5 blocks was enough
    assert kv.free == 5 and cache.evictable_blocks == 5 and cache.cached_blocks == 2_005


def test_idle_units_are_evicted_in_the_order_of_their_last_use():
    kv = BlockManager(4, 16)
    cache = PrefixCache(kv)
    kv.allocate(4)
    cache.insert([1, 2, 3, 4], 1)  # used in the order 1, 2, 3, 4
    cache.release([1, 2, 3, 4])
    cache.acquire([1])  # 1 used last now
    cache.acquire([3])  # then 3
    cache.release([3])  # 3 goes idle before 1 ...
    cache.release([1])  # ... but 1 was used before it
    order = []
    for _ in range(4):
        before = set(cache.units)
        cache.evict(kv.free + 1, hold=False)
        order += sorted(before - set(cache.units))
    assert order == [2, 4, 1, 3]
    assert kv.free == 4 and not cache.units and cache.evictable_blocks == 0


def test_units_let_go_together_are_evicted_among_the_others_by_last_use():
    kv = BlockManager(5, 16)
    cache = PrefixCache(kv)
    kv.allocate(5)
    cache.insert([1], 1)
    cache.release([1])
    cache.acquire([1])  # a sequence reuses unit 1 ...
    cache.insert([2, 3], 1)  # ... another computes 2 and 3 ...
    cache.insert([4, 5], 1)  # ... and the first its own 4 and 5
    cache.release([2, 3])
    cache.release([1, 4, 5])  # used in the order 1, 2, 3, 4, 5
    cache.evict(4, hold=False)
    assert sorted(cache.units) == [5]


def test_a_replay_with_prefix_caching_is_fast_forwarded():
    """Shared system prompts whose cache fills the KV memory: the decode steps
    are jumped over as without the cache (the steps evict the idle units they
    need), with the stepped result."""
    system = {g: tuple(1_000 * g + k for k in range(4)) for g in range(3)}
    reqs = [
        Request(i, 0.05 * i, 128, 200, system[i % 3] + tuple(10_000 + 8 * i + k for k in range(4)),
                16)
        for i in range(40)
    ]  # fmt: skip
    events, results = {}, {}
    for ff in (False, True):
        cfg = EngineConfig(fast_forward=ff, prefix_caching=True, watermark=0.0, max_num_seqs=4)
        events[ff], eng, done = counted_run(reqs, cfg, blocks=200)
        results[ff] = (
            sorted((s.req.id, s.t_first_token, s.t_finish, s.cached_tokens) for s in done),
            eng.iterations, eng.kv.peak_used, eng.preemptions, sorted(eng.cache.units),
        )  # fmt: skip
        assert eng.preemptions == 0 and eng.kv.peak_used == 200  # the cache filled it
    assert results[True] == results[False]
    assert events[True] * 5 < events[False]


class _Reference:
    """The plain reading of the cache's rules: every unit in the order of its
    last use, eviction walking them for the first idle ones."""

    def __init__(self, total: int) -> None:
        self.free = total
        self.units: OrderedDict[int, list[int]] = OrderedDict()  # hash -> [refs, blocks]

    def insert(self, hashes, blocks):
        n = 0
        for h in hashes:
            if h in self.units:
                break
            self.units[h] = [1, blocks]
            n += 1
        return n

    def acquire(self, hashes):
        for h in hashes:
            self.units[h][0] += 1
            self.units.move_to_end(h)

    def release(self, hashes):
        for h in hashes:
            self.units[h][0] -= 1

    def evict(self, target):
        for h in [h for h, u in self.units.items() if u[0] == 0]:
            if self.free >= target:
                return
            self.free += self.units.pop(h)[1]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("iiaacrre"), st.integers(0, 2**16)), max_size=160))
def test_the_cache_evicts_as_the_plain_reading_of_its_rules(ops):
    """Random inserts, uses, releases and evictions: the same units stay, and
    the same blocks are free, as a cache that walks every unit would leave."""
    total = 400
    kv = BlockManager(total, 16)
    cache = PrefixCache(kv)
    ref = _Reference(total)
    holders: list[list[int]] = []  # the units each live holder has
    fresh = 0

    def insert(x: int) -> list[int]:
        nonlocal fresh
        hashes = [fresh + k for k in range(1 + x % 4)]
        fresh += 4
        blocks = 1 + x % 2
        want = min(len(hashes), kv.free // blocks)
        kv.allocate(want * blocks)
        ref.free -= want * blocks
        assert cache.insert(hashes[:want], blocks) == ref.insert(hashes[:want], blocks)
        return hashes[:want]

    for op, x in ops:
        if op == "i" and kv.free >= 8:  # a prompt computed: its units kept, held by it
            holders.append(insert(x))
        elif op == "a" and cache.units:  # a prompt reuses cached units ...
            keys = sorted(cache.units)
            hashes = [keys[(x + 7 * k) % len(keys)] for k in range(1 + x % 3)]
            hashes = list(dict.fromkeys(hashes))
            cache.acquire(hashes)
            ref.acquire(hashes)
            holders.append(hashes)
        elif op == "c" and holders and kv.free >= 8:  # ... and later keeps its own
            holders[x % len(holders)] += insert(x)
        elif op == "r" and holders:
            hashes = holders.pop(x % len(holders))
            cache.release(hashes)
            ref.release(hashes)
        elif op == "e":  # a few blocks wanted: which units go first matters
            target = kv.free + 1 + x % 8
            cache.evict(target, hold=False)
            ref.evict(target)
        assert list(cache.units) == [h for h in cache.units if h in ref.units]
        assert set(cache.units) == set(ref.units) and kv.free == ref.free
        assert cache.evictable_blocks == sum(u[1] for u in ref.units.values() if u[0] == 0)
