"""The contract every policy this project ships keeps (not the plugins installed beside
it: helpers.own_policies), and the public testing helpers."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from helpers import own_policies

import schedulers.colocated  # registers the built-ins when not installed
import schedulers.disagg
import schedulers.distserve
import schedulers.fabric_aware
import schedulers.kv_router
import schedulers.mooncake
import schedulers.session_affinity
import schedulers.splitwise  # noqa: F401
from twin.errors import SpecError
from twin.request import Request
from twin.scheduler import Plan, Reject, Route
from twin.testing import check_scheduler, instance, make_view


@pytest.mark.parametrize("name", own_policies())
def test_every_registered_scheduler_keeps_the_contract(name):
    kind = check_scheduler(name)
    assert kind in ("colocated", "split", "both")  # sla-planner serves both


@pytest.mark.parametrize("name", own_policies())
def test_every_registered_scheduler_keeps_the_contract_on_a_loaded_fabric(name):
    """The split cluster again, its hand-offs contending for one 25 Gb/s NIC a node."""
    assert check_scheduler(name, seeds=(0,), fabric=True) in ("colocated", "split", "both")


@pytest.mark.parametrize("name", own_policies())
def test_every_registered_scheduler_keeps_the_contract_on_a_cluster_of_two_models(name):
    """Each of two models on the same nodes served by the policy, colocated and split."""
    assert check_scheduler(name, models=True) in ("colocated", "split", "both")


def test_the_contract_refuses_a_policy_that_strays_to_another_models_instance():
    from twin.scheduler import Plan

    class Stray:  # colocated, always instance 0: the first model's
        def setup(self, cluster):
            return Plan()

        def route(self, req, view):
            return Route(0, 0)

    check_scheduler(Stray, seeds=(0,))  # one model: instance 0 is everyone's
    with pytest.raises(AssertionError, match="not one of the model's"):
        check_scheduler(Stray, seeds=(0,), models=True)


def test_a_policy_that_reads_the_fabric_is_tested_on_hand_built_estimates():
    from twin.scheduler import HandoffEstimate

    view = make_view(
        instance(0, role="prefill"), instance(1, role="decode"), instance(2, role="decode"),
        fabric={(0, 1): HandoffEstimate(0, 1, transfer_s=2.0),
                (0, 2): HandoffEstimate(0, 2, transfer_s=0.1)},
    )  # fmt: skip
    assert view.handoff_estimate(0, 2, Request(0, 0.0, 100, 10)).total_s == 0.1
    from twin.scheduler import build_scheduler

    policy = build_scheduler("fabric-aware", {"decide": "arrival"})
    assert policy.route(Request(0, 0.0, 100, 10), view) == Route(0, 2)


def test_the_contract_knows_which_cluster_a_policy_wants():
    assert check_scheduler("colocated") == "colocated"
    assert check_scheduler("disagg") == "split"


_SETUPS = [0]


@dataclass
class Leaky:
    """Keeps state across runs in a module global: each run routes elsewhere."""

    def setup(self, cluster):
        _SETUPS[0] += 1
        return Plan()

    def route(self, req, view):
        return Route(_SETUPS[0] % len(view))


@dataclass
class SilentReject:
    def setup(self, cluster):
        return Plan()

    def route(self, req, view):
        return Reject("")


@dataclass
class OutOfRange:
    def setup(self, cluster):
        return Plan()

    def route(self, req, view):
        return Route(len(view))


@dataclass
class NoPickDecode:
    """Leaves the decode instance open but cannot name one: fine colocated,
    broken on a split cluster, where the prefill ends and nobody picks."""

    def setup(self, cluster):
        return Plan()

    def route(self, req, view):
        return Route(view.of_role("prefill", "mixed")[0].id)


@dataclass
class RefusesBoth:
    def setup(self, cluster):
        raise SpecError("this policy serves no cluster")

    def route(self, req, view):
        return Reject("never")


@dataclass
class SetupCrashesOnSplit:
    """A setup that fails on a split cluster with something other than a SpecError."""

    def setup(self, cluster):
        if cluster.of_role("decode"):
            raise KeyError("decode")
        return Plan()

    def route(self, req, view):
        return Route(0, 0)


@dataclass
class Anywhere:
    """Serves every request whole on the first instance that can prefill."""

    def setup(self, cluster):
        return Plan()

    def route(self, req, view):
        p = view.of_role("prefill", "mixed")[0].id
        return Route(p, p)


def test_the_contract_catches_broken_policies():
    with pytest.raises(AssertionError, match="two runs with seed 0 gave different results"):
        check_scheduler(Leaky)
    with pytest.raises(AssertionError, match="rejected without a reason"):
        check_scheduler(SilentReject)
    with pytest.raises(AssertionError, match="on the colocated cluster: .*instances are 0..2"):
        check_scheduler(OutOfRange)


def test_a_policy_is_held_to_a_split_cluster_unless_its_setup_refuses_one():
    # fine on the colocated cluster; the split one finds the missing hook
    with pytest.raises(
        AssertionError, match=r"on the split cluster: .*left the decode instance open.*pick_decode"
    ):
        check_scheduler(NoPickDecode)
    # a failure at setup other than a SpecError is no refusal
    with pytest.raises(AssertionError, match="on the split cluster: KeyError"):
        check_scheduler(SetupCrashesOnSplit)
    with pytest.raises(AssertionError, match="refused both clusters: colocated: this policy"):
        check_scheduler(RefusesBoth)
    assert check_scheduler(Anywhere) == "both"


def test_hand_built_views_for_unit_tests():
    view = make_view(
        instance(0, role="prefill", queue_tokens=4000),
        instance(1, role="prefill"),
        instance(2, role="decode", free_blocks=10),
        now=5.0,
    )
    assert view.now == 5.0 and [i.id for i in view.of_role("prefill")] == [0, 1]
    from twin.scheduler import build_scheduler

    assert build_scheduler("disagg", {}).route(Request(0, 5.0, 100, 10), view) == Route(1)
    with pytest.raises(ValueError, match="ids must be 0..1"):
        make_view(instance(1), instance(0))
