"""Moving and taking back scheduled events (twin/_clock.py) keeps SimPy's queue a
heap in O(log n): the events fire in the order of their keys, as after a heapify."""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from twin._clock import at, cancel, move


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=60),
    st.lists(st.tuples(st.booleans(), st.integers(0, 59), st.integers(0, 50)), max_size=30),
)
def test_events_fire_in_key_order_after_moves_and_cancels(times, ops):
    env = simpy.Environment()
    fired: list[int] = []
    events = {}
    for k, t in enumerate(times):
        events[k] = at(env, float(t), lambda _ev, k=k: fired.append(k))
    when = {k: float(t) for k, t in enumerate(times)}
    order = {k: k for k in events}  # ties: the later scheduled (or moved) fires later
    seq = len(times)
    for is_move, k, t in ops:
        if k not in events:
            continue
        if is_move:
            move(env, events[k], float(t))
            when[k], order[k], seq = float(t), seq, seq + 1
        else:
            cancel(env, events.pop(k))
            del when[k]
    env.run()
    assert fired == sorted(when, key=lambda k: (when[k], order[k]))
