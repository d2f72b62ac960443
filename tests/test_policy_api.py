"""The policy API's types: the hook Protocols, roles, the shared setup check and
duration helper, the scheduler's random stream, and what schedulers/ import."""

from __future__ import annotations

import ast
import typing
from dataclasses import dataclass, field
from pathlib import Path

import helpers
import numpy as np
import pytest

import schedulers.colocated  # registers the built-ins when not installed
import schedulers.disagg
import schedulers.distserve
import schedulers.mooncake
import schedulers.splitwise  # noqa: F401
from twin.errors import SpecError
from twin.scheduler import (
    ROLES,
    PicksDecode,
    Plan,
    Role,
    Route,
    Scheduler,
    Ticks,
    build_scheduler,
    decode_hook,
    duration_s,
    get_scheduler,
    require_split,
    tick_hook,
)
from twin.sim.simulation import Simulation
from twin.testing import check_scheduler, instance, make_view

SCHEDULERS_DIR = Path(__file__).resolve().parent.parent / "schedulers"
POLICY_API = {"twin.scheduler", "twin.request", "twin.errors", "twin.testing"}
SPLIT = ("disagg", "distserve", "mooncake", "splitwise")


# -- the hook Protocols --------------------------------------------------------------
@pytest.mark.parametrize("name", helpers.own_policies())
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


# -- the setup check -----------------------------------------------------------------
def test_the_split_check_names_the_policy_and_the_roles_it_found():
    mixed = make_view(instance(0), instance(1))
    with pytest.raises(SpecError) as e:
        require_split(mixed, "mine")
    assert str(e.value) == (
        "scheduler 'mine' needs prefill and decode instances, but the cluster has only "
        "mixed instances; give cluster.prefill and cluster.decode"
    )
    half = make_view(instance(0, role="prefill"), instance(1))
    with pytest.raises(SpecError, match=r"has only mixed and prefill instances; .* \(see X\)$"):
        require_split(half, "mine", " (see X)")
    require_split(make_view(instance(0, role="prefill"), instance(1, role="decode")), "mine")


@pytest.mark.parametrize("name", SPLIT)
def test_every_split_policy_refuses_a_colocated_cluster_with_the_shared_check(name):
    with pytest.raises(SpecError) as e:
        build_scheduler(name, {}).setup(make_view(instance(0), instance(1)))
    assert str(e.value).startswith(
        f"scheduler {name!r} needs prefill and decode instances, but the cluster has only "
        "mixed instances; give cluster.prefill and cluster.decode"
    )


# -- durations -----------------------------------------------------------------------
def test_duration_parameters():
    assert duration_s("50 ms", "tick") == pytest.approx(0.05)
    assert duration_s(2, "tick") == 2.0
    assert duration_s(0, "cost") == 0.0
    with pytest.raises(ValueError, match=r"^tick: 0 must be > 0$"):
        duration_s(0, "tick", positive=True)
    with pytest.raises(ValueError, match=r"^cost: '-1 s' must be >= 0$"):
        duration_s("-1 s", "cost")
    with pytest.raises(ValueError, match=r"^cost: 'soon' is not a duration"):
        duration_s("soon", "cost")


# -- the scheduler's random stream ---------------------------------------------------
@dataclass
class Draws:
    """Colocated least-id routing that records the generator and one draw per request."""

    rngs: list = field(default_factory=list)
    draws: list = field(default_factory=list)

    def setup(self, cluster):
        self.rngs.append(cluster.rng)
        return Plan()

    def route(self, req, view):
        self.rngs.append(view.rng)
        self.draws.append(int(view.rng.integers(1 << 30)))
        return Route(0, 0)


def _run_draws(seed):
    policy, rows = Draws(), []
    spec = helpers.small_spec(requests=20, seed=seed)
    Simulation(spec, scheduler=policy, on_row=rows.append).run()
    return policy, [r["arrival_s"] for r in sorted(rows, key=lambda r: r["id"])]


def test_the_policy_gets_the_scheduler_stream_spawned_from_the_seed():
    policy, arrivals = _run_draws(7)
    first = policy.rngs[0]
    assert isinstance(first, np.random.Generator)
    assert all(r is first for r in policy.rngs)  # one stream for the whole run
    assert len(policy.draws) == 20
    stream = np.random.default_rng(np.random.SeedSequence(7).spawn(2)[1])
    assert policy.draws == [int(stream.integers(1 << 30)) for _ in range(20)]

    again, arrivals_again = _run_draws(7)
    assert again.draws == policy.draws and arrivals_again == arrivals
    other, _ = _run_draws(8)
    assert other.draws != policy.draws

    # the workload has its own stream: a policy that draws does not move arrivals
    rows = []
    Simulation(helpers.small_spec(requests=20, seed=7), on_row=rows.append).run()
    assert [r["arrival_s"] for r in sorted(rows, key=lambda r: r["id"])] == arrivals


def test_hand_built_views_carry_a_seeded_generator():
    def draw(**kw):
        return make_view(instance(0), **kw).rng.random()

    assert draw() == draw() == np.random.default_rng(0).random()
    assert draw(seed=1) == np.random.default_rng(1).random() != draw()


def test_check_scheduler_holds_a_drawing_policy_to_determinism():
    assert check_scheduler(Draws) == "both"  # Route(0, 0): whole on instance 0, either kind


# -- what a policy module may import -------------------------------------------------
def _twin_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "twin":  # from twin import scheduler
                found += [f"twin.{a.name}" for a in node.names]
            else:
                found.append(node.module)
    return [m for m in found if m.split(".")[0] in ("twin", "simpy")]


@pytest.mark.parametrize("path", sorted(SCHEDULERS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_schedulers_import_only_the_policy_api(path):
    outside = [m for m in _twin_imports(path) if m not in POLICY_API]
    assert outside == [], (
        f"{path.name} imports {outside}; a policy imports only {sorted(POLICY_API)}"
    )


def test_the_import_check_sees_every_form(tmp_path):
    f = tmp_path / "p.py"
    f.write_text(
        "import twin.units\nfrom twin import scheduler, sim\nfrom twin.sim.spec import x\n"
        "import simpy\nfrom . import other\nimport numpy as np\n"
    )
    assert _twin_imports(f) == [
        "twin.units",
        "twin.scheduler",
        "twin.sim",
        "twin.sim.spec",
        "simpy",
    ]
