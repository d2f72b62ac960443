"""The policy API: registry behaviour and the colocated baseline on hand-built views."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import helpers
import pytest

import schedulers.colocated  # registers the built-ins when not installed
from twin.errors import DuplicateRegistrationError, SpecError, UnknownSchedulerError
from twin.request import Request
from twin.scheduler import (
    ClusterView,
    InstanceSnapshot,
    InstanceView,
    Plan,
    Route,
    build_scheduler,
    get_scheduler,
    register,
    scheduler_names,
)


def test_colocated_is_registered_and_listed():
    assert "colocated" in scheduler_names()
    assert get_scheduler("colocated") is schedulers.colocated.Colocated


def test_a_typo_suggests_the_close_name():
    with pytest.raises(
        UnknownSchedulerError, match=r"unknown scheduler 'colocatd'\. Did you mean 'colocated'\?"
    ):
        get_scheduler("colocatd")


def test_duplicate_registration_is_an_error():
    @dataclass
    class Other:
        def setup(self, cluster):
            return Plan()

        def route(self, req, view):
            return Route(0)

    with pytest.raises(DuplicateRegistrationError, match="already registered"):
        register("colocated")(Other)


def test_unknown_parameter_lists_the_known_ones():
    with pytest.raises(
        SpecError, match=r"scheduler\.routng: unknown parameter .* expected one of routing"
    ):
        build_scheduler("colocated", {"routng": "x"})
    with pytest.raises(SpecError, match="round_robin"):
        build_scheduler("colocated", {"routing": "random"})


def test_snapshot_is_an_instance_view():
    assert isinstance(InstanceSnapshot(0), InstanceView)


def view(*loads):
    return ClusterView(
        [
            InstanceSnapshot(i, queue_requests=q, running_requests=r)
            for i, (q, r) in enumerate(loads)
        ]
    )


def test_least_loaded_picks_fewest_outstanding_then_lowest_id():
    policy = build_scheduler("colocated", {"routing": "least_loaded"})
    req = Request(0, 0.0, 10, 10)
    assert policy.route(req, view((3, 4), (0, 5), (1, 1))) == Route(2, 2)
    assert policy.route(req, view((1, 1), (2, 0), (0, 2))) == Route(0, 0)
    # ties go to the lowest id whatever the order the view lists them in
    shuffled = ClusterView(
        [InstanceSnapshot(i, queue_requests=q) for i, q in ((3, 1), (1, 2), (0, 1), (2, 1))]
    )
    assert policy.route(req, shuffled) == Route(0, 0)


def test_round_robin_cycles():
    policy = build_scheduler("colocated", {"routing": "round_robin"})
    v = view((9, 9), (0, 0), (0, 0))
    picks = [policy.route(Request(i, 0.0, 1, 1), v).prefill for i in range(5)]
    assert picks == [0, 1, 2, 0, 1]


def test_colocated_keeps_mixed_instances_and_refuses_split_ones():
    plan = build_scheduler("colocated", {}).setup(view((0, 0), (0, 0)))
    assert dict(plan.roles) == {}
    split = ClusterView([InstanceSnapshot(0, role="prefill"), InstanceSnapshot(1, role="decode")])
    with pytest.raises(SpecError, match="has decode and prefill instances"):
        build_scheduler("colocated", {}).setup(split)


def test_disagg_picks_least_loaded_prefill_and_decode():
    import schedulers.disagg  # noqa: F401

    v = ClusterView(
        [
            InstanceSnapshot(0, role="prefill", queue_tokens=5000),
            InstanceSnapshot(1, role="prefill", queue_tokens=1000, running_requests=3),
            InstanceSnapshot(2, role="prefill", queue_tokens=1000, running_requests=1),
            InstanceSnapshot(3, role="decode", running_requests=9),
            InstanceSnapshot(4, role="decode", running_requests=2, free_blocks=10),
            InstanceSnapshot(5, role="decode", running_requests=2, free_blocks=500),
        ]
    )
    req = Request(0, 0.0, 100, 10)
    policy = build_scheduler("disagg", {})
    assert policy.route(req, v) == Route(2)
    assert policy.pick_decode(req, v) == 5
    assert build_scheduler("disagg", {"decode_at": "arrival"}).route(req, v) == Route(2, 5)
    with pytest.raises(SpecError, match="needs prefill and decode instances"):
        policy.setup(view((0, 0)))


class FakeEntryPoint:
    def __init__(self, name, obj):
        self.name, self.value, self._obj = name, f"fake:{name}", obj

    def load(self):
        if isinstance(self._obj, Exception):
            raise self._obj
        return self._obj


@dataclass
class ThirdParty:
    """A policy from another package."""

    def setup(self, cluster):
        return Plan({i.id: "mixed" for i in cluster.instances})

    def route(self, req, view):
        return Route(0, 0)


def test_entry_points_bring_third_party_policies(monkeypatch):
    import twin.scheduler as sched

    monkeypatch.setattr(sched, "_registry", dict(sched._registry))
    monkeypatch.setattr(sched, "_entry_points_loaded", False)
    monkeypatch.setattr(sched, "entry_points", lambda group: [FakeEntryPoint("third", ThirdParty)])
    assert get_scheduler("third") is ThirdParty
    assert "third" in scheduler_names()


def test_a_broken_plugin_is_a_clear_error(monkeypatch):
    import twin.scheduler as sched
    from twin.errors import PluginError

    monkeypatch.setattr(sched, "_registry", dict(sched._registry))
    monkeypatch.setattr(sched, "_entry_points_loaded", False)
    broken = [FakeEntryPoint("oops", ImportError("no module named 'nowhere'"))]
    monkeypatch.setattr(sched, "entry_points", lambda group: broken)
    with pytest.raises(PluginError, match=r"'oops' \(fake:oops\) failed to load: ImportError"):
        scheduler_names()


@dataclass
class BreaksTheContract:
    """An installed plugin that loads but routes to an instance that is not there."""

    def setup(self, cluster):
        return Plan()

    def route(self, req, view):
        return Route(99, 99)


SUITES = ("test_contract.py", "test_policy_api.py")


def _parametrized_names(path: Path, monkeypatch) -> set[str]:
    """The ``name`` values a freshly loaded test module parametrizes over."""
    mod_spec = importlib.util.spec_from_file_location(f"fresh_{path.stem}", path)
    assert mod_spec is not None and mod_spec.loader is not None
    mod = importlib.util.module_from_spec(mod_spec)
    monkeypatch.setitem(sys.modules, mod_spec.name, mod)  # its dataclasses look it up
    mod_spec.loader.exec_module(mod)
    names: set[str] = set()
    for fn in vars(mod).values():
        for mark in getattr(fn, "pytestmark", []):
            if mark.name == "parametrize" and mark.args[0] == "name":
                names.update(mark.args[1])
    return names


def test_policy_suites_hold_this_projects_policies_not_installed_plugins(monkeypatch):
    import twin.scheduler as sched

    monkeypatch.setattr(sched, "_registry", dict(sched._registry))
    monkeypatch.setattr(sched, "_entry_points_loaded", False)
    plugins = [FakeEntryPoint("a-users-plugin", BreaksTheContract),
               FakeEntryPoint("oops", ImportError("no module named 'nowhere'"))]  # fmt: skip
    monkeypatch.setattr(sched, "entry_points", lambda group: plugins)
    own = set(helpers.own_policies())
    assert {"colocated", "disagg", "sla-planner", "kv-router"} <= own
    for suite in SUITES:
        names = _parametrized_names(Path(__file__).with_name(suite), monkeypatch)
        assert names == own, suite
    assert not sched._entry_points_loaded  # collecting the suites loaded no plugin


def test_a_snapshot_reports_a_remote_tier_below_its_local_ones():
    # two 512-token units: one in HBM, the next only in the remote store
    req = Request(0, 0.0, 1024, 10, (7, 8), 512)
    snap = InstanceSnapshot(
        0, cached_hashes=frozenset({7}), tier_hashes=(("remote", frozenset({8})),)
    )
    assert snap.cached_prefix_by_tier(req) == {"hbm": 512, "dram": 0, "ssd": 0, "remote": 512}
    chain = (("dram", frozenset({7})), ("ssd", frozenset()), ("remote", frozenset({8})))
    assert InstanceSnapshot(1, tier_hashes=chain).cached_prefix_by_tier(req) == {
        "hbm": 0, "dram": 512, "ssd": 0, "remote": 512,
    }  # fmt: skip
