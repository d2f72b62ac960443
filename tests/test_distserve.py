"""DistServe: the runtime policy on hand-built views, and the planner."""

from __future__ import annotations

import pytest

from schedulers.distserve import DistServe
from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import Route
from twin.testing import check_scheduler, instance, make_view

REQ = Request(0, 0.0, 500, 20)


# -- runtime -------------------------------------------------------------------------
def test_prefill_goes_to_the_shortest_queue_in_tokens_then_requests_then_id():
    view = make_view(
        instance(0, "prefill", queue_tokens=4000, queue_requests=1),
        instance(1, "prefill", queue_tokens=900, queue_requests=3),
        instance(2, "prefill", queue_tokens=900, queue_requests=2),
        instance(3, "prefill", queue_tokens=900, queue_requests=2, running_requests=9),
        instance(4, "decode"),
    )
    policy = DistServe()
    policy.setup(view)
    # Running requests do not count: a prefill instance's queue is its waiting prompts.
    assert policy.route(REQ, view) == Route(2)


def test_decode_goes_to_the_least_loaded_then_most_free_blocks_then_id():
    view = make_view(
        instance(0, "prefill"),
        instance(1, "decode", running_requests=5, queue_requests=0, free_blocks=900),
        instance(2, "decode", running_requests=3, queue_requests=1, free_blocks=100),
        instance(3, "decode", running_requests=2, queue_requests=2, free_blocks=500),
        instance(4, "decode", running_requests=4, queue_requests=0, free_blocks=500),
    )
    policy = DistServe()
    policy.setup(view)
    assert policy.route(REQ, view) == Route(0)  # the decode side is chosen later
    assert policy.pick_decode(REQ, view) == 3


def test_pair_node_keeps_the_hand_off_inside_the_prefill_node():
    view = make_view(
        instance(0, "prefill", node=0, queue_tokens=100),
        instance(1, "decode", node=0, running_requests=9),
        instance(2, "prefill", node=1, queue_tokens=50),
        instance(3, "decode", node=1, running_requests=7),
        instance(4, "decode", node=0, running_requests=1),
    )
    policy = DistServe(pair="node")
    policy.setup(view)
    assert policy.route(REQ, view) == Route(2)
    assert policy.pick_decode(REQ, view) == 3  # node 1's only decode, though 4 is idler
    assert DistServe().pick_decode(REQ, view) == 4


def test_setup_refuses_a_colocated_cluster_and_says_what_to_do():
    view = make_view(instance(0), instance(1))
    with pytest.raises(SpecError, match="only mixed instances; give cluster.prefill"):
        DistServe().setup(view)
    with pytest.raises(ValueError, match="pair: 'nodes'"):
        DistServe(pair="nodes")


def test_distserve_keeps_the_contract_on_a_split_cluster():
    assert check_scheduler("distserve") == "split"
    assert check_scheduler(DistServe, {"pair": "node"}) == "split"
