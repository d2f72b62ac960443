"""Mixed hardware: role groups placed on the node template they name, and
provisioning that prices each split at the GPUs it actually uses."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from twin.errors import SpecError, UnknownNameError
from twin.sim.simulation import Simulation
from twin.sim.spec import resolve_spec
from twin.studies.provision import format_provision, placed_power_w, provision

_NICS = {"count": 8, "kind": "infiniband", "bandwidth": "400 Gbps"}
# One H100 SXM node (700 W a GPU) beside one power-capped H100 node (490 W a GPU).
MIXED = {
    "name": "mixed",
    "templates": {
        "h100": {"gpu": "h100-sxm", "gpus": 8, "nics": _NICS},
        "pcap": {"gpu": "h100-80gb-pcap", "gpus": 8, "nics": _NICS},
    },
    "nodes": [{"template": "h100", "count": 1}, {"template": "pcap", "count": 1}],
}


def mixed_data(prefill: dict[str, Any], decode: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "llama-3.1-8b",
        "cluster": {"topology": copy.deepcopy(MIXED), "tp": 4, "prefill": prefill,
                    "decode": decode},
        "scheduler": "splitwise",
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 5},
                     "max_requests": 1000},
        "slo": {"ttft": "500 ms", "tpot": "40 ms"},
    }  # fmt: skip


def test_a_group_goes_to_the_nodes_of_the_template_it_names():
    data = mixed_data({"instances": 1, "template": "h100"}, {"instances": 2, "template": "pcap"})
    spec = resolve_spec(data, "mixed.yaml", Path.cwd())
    assert [g.template for g in spec.groups] == ["h100", "pcap"]
    assert spec.resolved["cluster"]["groups"][1]["template"] == "pcap"
    sim = Simulation(spec)
    assert [(e.role, p.node, p.gpus) for e, p in zip(sim.engines, sim.placements, strict=True)] == [
        ("prefill", 0, (0, 1, 2, 3)),
        ("decode", 1, (8, 9, 10, 11)),
        ("decode", 1, (12, 13, 14, 15)),
    ]
    assert [e.perf.name.split("@")[1] for e in sim.engines] == [
        "h100-sxmx4", "h100-80gb-pcapx4", "h100-80gb-pcapx4",
    ]  # fmt: skip
    assert placed_power_w(spec) == 4 * 700 + 8 * 490
    # without templates, packed placement fills the H100 node first
    plain = resolve_spec(mixed_data({"instances": 1}, {"instances": 2}), "m.yaml", Path.cwd())
    assert [p.node for p in Simulation(plain).placements] == [0, 0, 1]
    assert "template" not in plain.resolved["cluster"]["groups"][1]
    assert placed_power_w(plain) == 8 * 700 + 4 * 490


def test_a_template_with_too_few_gpus_is_an_error_naming_the_file_and_the_key():
    data = mixed_data({"instances": 1, "template": "h100"}, {"instances": 3, "template": "pcap"})
    with pytest.raises(SpecError) as e:  # as the spec resolves, so twin spec says so too
        resolve_spec(data, "mixed.yaml", Path.cwd())
    assert str(e.value) == (
        "mixed.yaml: cluster.decode.template: 3 decode instances of 4 GPUs (12 in all) do not "
        "fit on template 'pcap': topology 'mixed' has 1 node(s) of it with 8 GPUs each"
    )


def test_an_unknown_template_is_refused_when_the_spec_is_loaded():
    data = mixed_data({"instances": 1}, {"instances": 1, "template": "pcp"})
    with pytest.raises(UnknownNameError) as e:
        resolve_spec(data, "mixed.yaml", Path.cwd())
    assert str(e.value) == (
        "mixed.yaml: cluster.decode.template: unknown node template 'pcp'. "
        "Did you mean 'pcap'? Known: h100, pcap"
    )


def test_provision_reports_the_power_of_the_gpus_each_split_uses():
    data = mixed_data({"instances": 1, "template": "h100"}, {"instances": 1, "template": "pcap"})
    p = provision(data, "mixed.yaml", Path.cwd(), gpus=12, sample=40, replicates=1)
    # 1 x TP4 on H100 + 2 x TP4 capped; 2 x TP4 on H100 + 1 x TP4 capped
    assert [(c.prefill, c.decode, c.power_w) for c in p.candidates] == [
        (1, 2, 4 * 700 + 8 * 490),
        (2, 1, 8 * 700 + 4 * 490),
    ]
    assert p.left_out == []
    assert "prefill TP4 on h100 x N, decode TP4 on pcap x M" in format_provision(p)


def test_provision_leaves_out_a_split_the_template_cannot_hold():
    data = mixed_data({"instances": 1, "template": "h100"}, {"instances": 1, "template": "pcap"})
    # the budget holds 1 H100 TP4 instance + 3 capped ones, but the capped node has 8 GPUs
    p = provision(
        data, "mixed.yaml", Path.cwd(), power_w=4 * 700 + 12 * 490, sample=40, replicates=1
    )
    assert [(c.prefill, c.decode, c.power_w) for c in p.candidates] == [(2, 1, 8 * 700 + 4 * 490)]
    assert [(n_p, n_d) for n_p, n_d, _ in p.left_out] == [(1, 3)]
    assert "cluster.decode.template: 3 decode instances" in p.left_out[0][2]
    assert "left out: mixed.yaml: cluster.decode.template" in format_provision(p)


def test_a_topology_names_the_template_of_each_node():
    from twin.net.topology import load_topology

    topo = load_topology(MIXED)
    assert [topo.template_of(k) for k in range(topo.num_nodes)] == ["h100", "pcap"]
    assert topo.templates == ("h100", "pcap")
    single = load_topology("dgx-h100-ib400", nodes=2)
    assert single.templates == ("node",) and single.template_of(1) == "node"


def _twin_templates() -> dict[str, Any]:
    """Two node templates of the same GPU (700 W each): a power budget of
    700 W x N is a budget of N GPUs."""
    data = mixed_data({"instances": 1, "template": "h100"}, {"instances": 1, "template": "pcap"})
    data["cluster"]["topology"]["templates"]["pcap"]["gpu"] = "h100-sxm"
    return data


def test_a_power_and_a_gpu_budget_skip_the_same_splits():
    data, gpus = _twin_templates(), 16  # 1:3 and 3:1 do not fit a template's 8 GPUs
    by_gpus = provision(data, "mixed.yaml", Path.cwd(), gpus=gpus, sample=40, replicates=1)
    by_power = provision(data, "mixed.yaml", Path.cwd(), power_w=700 * gpus, sample=40,
                         replicates=1)  # fmt: skip
    assert by_power.left_out == by_gpus.left_out != []
    assert [(c.prefill, c.decode) for c in by_power.candidates] == [
        (c.prefill, c.decode) for c in by_gpus.candidates
    ]


@pytest.mark.parametrize("budget", [{"gpus": 24}, {"power_w": 700 * 24}])
def test_a_budget_no_split_of_which_fits_says_so(budget):
    with pytest.raises(SpecError) as e:
        provision(_twin_templates(), "mixed.yaml", Path.cwd(), sample=40, replicates=1, **budget)
    msg = str(e.value)
    assert msg.startswith("a budget of ") and "none of its 5 splits fits the topology" in msg
    assert "1:5: mixed.yaml: cluster.decode.template: 5 decode instances" in msg
