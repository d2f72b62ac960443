"""The policy API's types: the hook Protocols and roles."""

from __future__ import annotations

import typing
from dataclasses import dataclass

import pytest

import schedulers.colocated  # noqa: F401 - registers the built-ins when not installed
import schedulers.disagg  # noqa: F401
import schedulers.distserve  # noqa: F401
import schedulers.mooncake  # noqa: F401
import schedulers.splitwise  # noqa: F401
from twin.errors import SpecError
from twin.scheduler import (
    ROLES,
    PicksDecode,
    Plan,
    Role,
    Scheduler,
    Ticks,
    build_scheduler,
    decode_hook,
    get_scheduler,
    scheduler_names,
    tick_hook,
)
from twin.testing import check_scheduler

SPLIT = ("disagg", "distserve", "mooncake", "splitwise")


# -- the hook Protocols --------------------------------------------------------------
@pytest.mark.parametrize("name", scheduler_names())
def test_every_registered_policy_is_a_scheduler_and_names_its_optional_hooks(name):
    cls = get_scheduler(name)
    policy = build_scheduler(name, {})
    assert isinstance(policy, Scheduler)
    # An optional hook is declared among the bases, so that mypy checks its signature.
    has_pick, has_tick = hasattr(policy, "pick_decode"), hasattr(policy, "tick")
    assert (PicksDecode in cls.__mro__) == has_pick
    assert (Ticks in cls.__mro__) == has_tick
    assert (decode_hook(policy) is policy) == has_pick
    assert (tick_hook(policy, name) is policy) == has_tick


def test_the_built_in_policies_have_the_hooks_they_need():
    policies = {name: build_scheduler(name, {}) for name in ("colocated", *SPLIT)}
    hooks = {
        name: (isinstance(p, PicksDecode), tick_hook(p, name) is not None)
        for name, p in policies.items()
    }
    assert hooks == {
        "colocated": (False, False),
        "disagg": (True, False),
        "distserve": (True, False),
        "mooncake": (True, False),
        "splitwise": (True, True),
    }
    assert tick_hook(build_scheduler("splitwise", {"tick_interval": "20 ms"}), "s").tick_s == 0.02


@dataclass
class TickWithout:
    tick_s: object = None

    def tick(self, view):
        return []


def test_a_tick_hook_needs_a_positive_tick_s():
    for bad in (None, 0, -1.0, float("inf"), True, "50 ms"):
        with pytest.raises(SpecError) as e:
            tick_hook(TickWithout(bad), "mine")
        assert str(e.value) == (
            f"scheduler 'mine' has tick() but tick_s is {bad!r}; "
            "expected the seconds between ticks, > 0"
        )
    assert tick_hook(TickWithout(0.5), "mine").tick_s == 0.5

    @dataclass
    class PeriodOnly:
        tick_s: float = 1.0

    assert tick_hook(PeriodOnly(), "mine") is None
    assert decode_hook(PeriodOnly()) is None


def test_check_scheduler_needs_setup_and_route():
    @dataclass
    class SetupOnly:
        def setup(self, cluster):
            return Plan()

    with pytest.raises(AssertionError, match=r"SetupOnly has no route\(\)"):
        check_scheduler(SetupOnly)


# -- roles ---------------------------------------------------------------------------
def test_roles_are_the_role_type_values():
    assert ROLES == typing.get_args(Role) == ("mixed", "prefill", "decode")
