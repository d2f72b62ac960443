"""The fabric in the scheduler's view: hand-off estimates against the hand-offs that then run."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from test_disagg import L8, split_spec

import schedulers.disagg  # noqa: F401 - registers the built-ins when not installed
from schedulers.disagg import Disagg
from twin.request import Request
from twin.scheduler import ClusterView, HandoffEstimate, Plan, Route
from twin.sim.simulation import Simulation

KV = L8.kv_bytes_per_token()


@dataclass
class Recorder:
    """Prefill on instance ``req.id % 2``, decode on the last instance; at
    ``pick_decode`` (the prompt done, the hand-off about to start) it keeps
    the view's estimate of the hand-off."""

    seen: dict[int, HandoffEstimate] = field(default_factory=dict)

    def setup(self, cluster: ClusterView) -> Plan:
        return Plan()

    def route(self, req: Request, view: ClusterView) -> Route:
        return Route(req.id % 2)

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        d = len(view) - 1
        est = view.handoff_estimate(req.id % 2, d, req)
        assert est is not None
        self.seen[req.id] = est
        return d


def eth25(**over):
    """Two prefill instances (nodes 0 and 1) and one decode instance (node 2)
    of 8 A100s, one 25 Gb/s TCP NIC per node; pull hand-offs (they start as
    the prompt is done)."""
    cluster = {"topology": "a100-eth25", "nodes": 3, "prefill": {"instances": 2, "tp": 8},
               "decode": {"instances": 1, "tp": 8}}  # fmt: skip
    return split_spec(cluster=cluster, transfer={"handoff": "pull"}, **over)


def test_the_estimate_on_a_loaded_fabric_is_the_hand_off_that_then_runs():
    """Request 0's 60k-token KV is crossing node 2's one NIC (8 flows, 2.7 s)
    when request 1's prompt is done: its 8 flows get half of that NIC, which
    the estimate says before they start."""
    rec = Recorder()
    reqs = [Request(0, 0.0, 60_000, 4), Request(1, 3.0, 2_000, 4)]
    rows: list[dict] = []
    Simulation(eth25(), requests=reqs, on_row=rows.append, scheduler=rec).run()
    by = {r["id"]: r for r in rows}
    first, second = rec.seen[0], rec.seen[1]
    # the second hand-off ran while the first was still moving
    assert by[1]["first_token_s"] < by[0]["first_token_s"] - 1.0
    nic_in = second.bottleneck
    assert nic_in is not None and nic_in.dst == "n2.nic0"
    assert nic_in.flows == 8 and nic_in.utilisation == pytest.approx(1.0)
    assert second.rate_bytes_s == pytest.approx(nic_in.usable_bytes_s / 16, rel=1e-12)
    assert first.rate_bytes_s == pytest.approx(nic_in.usable_bytes_s / 8, rel=1e-12)
    for i, est in ((0, first), (1, second)):
        assert est.bytes == by[i]["kv_bytes_moved"] == reqs[i].prompt_tokens * KV
        assert est.flows == 8 and est.saved_bytes == 0.0
        fixed = by[i]["handoff_descriptors_s"] + by[i]["handoff_router_s"]
        assert est.fixed_s == pytest.approx(fixed, rel=1e-12)
    assert second.total_s == pytest.approx(by[1]["transfer_s"], rel=1e-9)
    # the first was priced on an idle fabric: the second, joining it, slowed it
    # (the estimate holds the rate it starts with to its end)
    assert first.total_s < by[0]["transfer_s"]


def test_reading_the_fabric_changes_no_run():
    """A policy that asks for every pair's estimate at each decision runs as
    the same policy that does not ask, to the byte."""

    @dataclass
    class Asking(Disagg):
        def route(self, req, view):
            for p in view.of_role("prefill"):
                for d in view.of_role("decode"):
                    view.handoff_estimate(p.id, d.id, req)
                    view.path_links(p.id, d.id)
            return super().route(req, view)

        def pick_decode(self, req, view):
            self.route(req, view)
            return super().pick_decode(req, view)

    cluster = {"topology": "dgx-h100-ib400", "nodes": 2, "prefill": {"instances": 2, "tp": 4},
               "decode": {"instances": 2, "tp": 4}}  # fmt: skip
    spec = split_spec(cluster=cluster, engine={"prefix_caching": True})
    plain = Simulation(spec, scheduler=Disagg()).run().to_dict()
    asked = Simulation(spec, scheduler=Asking()).run().to_dict()
    assert asked == plain


def test_the_prefix_the_decode_side_holds_is_what_the_estimate_leaves_out():
    rec = Recorder()
    reqs = [Request(i, 2.0 * i, 1500, 4, prefix_hashes=(11, 12), prefix_block_tokens=512)
            for i in range(2)]  # fmt: skip
    rows: list[dict] = []
    spec = eth25(engine={"prefix_caching": True})
    Simulation(spec, requests=reqs, on_row=rows.append, scheduler=rec).run()
    by = {r["id"]: r for r in rows}
    assert rec.seen[0].saved_tokens == 0
    assert rec.seen[1].saved_tokens == 1024
    for i in range(2):
        assert rec.seen[i].saved_bytes == by[i]["kv_bytes_saved"]
        assert rec.seen[i].bytes == by[i]["kv_bytes_moved"]


def test_a_cluster_without_a_topology_has_no_fabric():
    from helpers import small_spec

    sim = Simulation(small_spec(requests=1))
    assert sim.view.fabric is None
    assert sim.view.handoff_estimate(0, 1, Request(0, 0.0, 10, 2)) is None
    assert sim.view.path_links(0, 1) == ()


def test_rails_a_flow_keeps_its_nic_number_across_nodes():
    cluster = {"topology": "dgx-h100-ib400", "nodes": 2, "prefill": {"instances": 1, "tp": 4},
               "decode": {"instances": 3, "tp": 4}}  # fmt: skip
    sim = Simulation(split_spec(cluster=cluster), requests=[])
    view = sim.view
    where = {i.id: (i.node, i.gpus) for i in view.instances}
    req = Request(0, 0.0, 1000, 2)
    for d in (1, 2, 3):
        est = view.handoff_estimate(0, d, req)
        same_node = where[d][0] == where[0][0]
        local = [g % 8 for g in where[d][1]] == [g % 8 for g in where[0][1]]
        assert est.rail_aligned == (same_node or local), (d, where)
        assert est.links and all(ln.load_bytes_s == 0.0 for ln in est.links)
        assert view.path_links(0, d) == est.links


def test_over_a_run_on_the_thin_spine_most_estimates_are_the_hand_offs_that_ran():
    """The bundled fabric-aware experiment's 32:1 spine under load-only
    pairing, pull hand-offs (each starts as it is priced): an estimate is off
    only where flows join or leave the links while the hand-off moves."""
    from pathlib import Path

    from twin import yamlio
    from twin.studies.compare import compare_specs

    path = Path("experiments/fabric-aware.yaml")
    sets = ["transfer.handoff=pull", "workload.max_requests=150"]
    data = yamlio.load_text(path.read_text(encoding="utf-8"), str(path))
    _, specs = compare_specs(data, str(path), path.parent, sets, ["disagg"])
    seen: dict[int, float] = {}

    @dataclass
    class Pricing(Disagg):
        def pick_decode(self, req, view):
            d = super().pick_decode(req, view)
            seen[req.id] = view.handoff_estimate(self._prefill[req.id], d, req).total_s
            return d

        def route(self, req, view):
            r = super().route(req, view)
            self._prefill[req.id] = r.prefill
            return r

        def __post_init__(self):
            super().__post_init__()
            self._prefill: dict[int, int] = {}

    rows: list[dict] = []
    Simulation(specs["disagg"], scheduler=Pricing(), on_row=rows.append).run()
    errors = [seen[r["id"]] / r["transfer_s"] - 1 for r in rows if r["transfer_wait_s"] == 0]
    assert len(errors) > 100
    exact = sum(abs(e) < 1e-6 for e in errors) / len(errors)
    assert exact > 0.8, exact  # 0.873 when written
