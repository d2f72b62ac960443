"""Topologies: the bundled files, paths and capacities, and every kind of bad input."""

from __future__ import annotations

import textwrap

import pytest

from twin.cli import main
from twin.errors import SpecError, UnknownNameError
from twin.net.topodef import (
    NIC_GENERATIONS,
    PROTOCOL_DEFAULTS,
    ROCE_PER_IB,
    TCP_HOST_CEILING_BYTES_S,
)
from twin.net.topology import LINK_KINDS, Link, load_topology, topology_names

CX6, CX7 = NIC_GENERATIONS["connectx-6"], NIC_GENERATIONS["connectx-7"]
TCP = 0.94  # the documented TCP wire efficiency (1500-byte frames)

# name -> (nodes, GPUs, intra-node link kind, per-direction intra rate, NICs per node)
BUNDLED = {
    "dgx-a100-ib200": (4, 32, "nvlink", 300e9, 8),
    "dgx-h100-ib400": (4, 32, "nvlink", 450e9, 8),
    "h100-roce-4x200": (4, 32, "nvlink", 450e9, 4),
    "h100-roce-8x400": (4, 32, "nvlink", 450e9, 8),
    "a100-eth25": (4, 32, "nvlink", 300e9, 1),
    "l40s-pcie-eth100": (2, 16, "pcie", 32e9, 1),
    "dgx-h100-box": (1, 8, "nvlink", 450e9, 0),
}
# name -> (NIC kind, NIC line rate bytes/s, efficiency of its NIC links)
NICS = {
    "dgx-a100-ib200": ("infiniband", 25e9, CX6),
    "dgx-h100-ib400": ("infiniband", 50e9, CX7),
    "h100-roce-4x200": ("roce", 25e9, CX6 * ROCE_PER_IB),
    "h100-roce-8x400": ("roce", 50e9, CX7 * ROCE_PER_IB),
    "a100-eth25": ("ethernet", 3.125e9, TCP),
    "l40s-pcie-eth100": ("ethernet", 12.5e9, TCP),
}


def write(tmp_path, text, name="t.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_every_bundled_topology_is_listed():
    assert sorted(BUNDLED) == topology_names()


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_topology_shape_and_same_node_path(name):
    nodes, gpus, kind, rate, nics = BUNDLED[name]
    t = load_topology(name)
    assert (t.num_nodes, len(t.gpus)) == (nodes, gpus)
    assert t.gpus[0] == "n0.gpu0" and t.gpus[-1] == f"n{nodes - 1}.gpu{gpus // nodes - 1}"
    assert all(t.nic_count(k) == nics for k in range(nodes))
    p = t.path(0, 1)
    assert [ln.kind for ln in p] == [kind, kind]
    assert p[0].src == "n0.gpu0" and p[-1].dst == "n0.gpu1"
    eff = 0.8  # the documented NVLink and PCIe default
    assert t.bottleneck_bytes_s(p) == pytest.approx(rate * eff)
    assert t.path(3, 3) == ()


@pytest.mark.parametrize("name", sorted(NICS))
def test_cross_node_path_goes_through_nics_at_the_nic_rate(name):
    kind, rate, eff = NICS[name]
    t = load_topology(name)
    dst = t.gpus_of_node(1)[0]
    p = t.path(0, dst)
    h = t.hops(p)
    verts = [h[0].src] + [ln.dst for ln in h]
    assert verts[0] == "n0.gpu0" and verts[-1] == t.gpus[dst]
    assert "n0.nic0" in verts and "n1.nic0" in verts
    assert kind in {ln.kind for ln in p}
    assert t.bottleneck_bytes_s(p) == pytest.approx(rate * eff)
    assert t.latency_s(p) == pytest.approx(sum(ln.latency_s for ln in p))
    assert t.latency_s(p) > t.latency_s(t.path(0, 1))


def test_units_are_exact():
    t = load_topology("dgx-h100-ib400")
    ln = t.link("n0.nic0", "switch")
    assert ln.capacity_bytes_s == 50e9  # "400 Gbps"
    assert ln.usable_bytes_s == 50e9 * CX7
    assert t.link("n0.gpu0", "n0.nvswitch").capacity_bytes_s == 450e9  # "450 GB/s"
    with pytest.raises(KeyError, match="no link"):
        t.link("n0.gpu0", "switch")


def test_nic_choice_and_the_nics_that_serve_a_gpu():
    t = load_topology("dgx-h100-ib400", nodes=2)
    p = t.path(2, 13, nic=5)
    verts = [ln.dst for ln in p]
    assert "n0.nic5" in verts and "n1.nic5" in verts
    # GPU 2 reaches NIC 5 over NVSwitch, then through GPU 5's PCIe link
    assert [ln.kind for ln in p][:2] == ["nvlink", "nvlink"]
    own = t.path(2, 13)
    assert "n0.nic2" in [ln.dst for ln in own] and "n1.nic5" in [ln.dst for ln in own]
    assert t.path(2, 13) is own  # cached
    with pytest.raises(ValueError, match="nic 8"):
        t.path(0, 8, nic=8)
    r = load_topology("h100-roce-4x200")
    assert r.nics_of_gpu(3) == ("n0.nic1",)
    assert r.nics_of_gpu(8) == ("n1.nic0",)
    assert load_topology("a100-eth25").nics_of_gpu(5) == ("n0.nic0",)
    assert load_topology("dgx-h100-box").nics_of_gpu(0) == ()


def test_injection_bandwidth():
    assert load_topology("dgx-h100-ib400").injection_bytes_s(3) == pytest.approx(50e9 * CX7)
    # two GPUs share one 200 Gb/s NIC; one GPU alone may use all of it
    assert load_topology("h100-roce-4x200").injection_bytes_s(1) == pytest.approx(
        25e9 * CX6 * ROCE_PER_IB
    )
    assert load_topology("dgx-h100-box").injection_bytes_s(0) == 0.0


@pytest.mark.parametrize(
    "name, expected",
    [
        ("dgx-h100-ib400", 8 * 50e9 * CX7),
        ("dgx-a100-ib200", 8 * 25e9 * CX6),
        ("h100-roce-4x200", 87e9),  # the node ceiling: 4 NICs at 0.957 would give 95.7
        ("h100-roce-8x400", 190e9),  # the node ceiling, not 8 x 48.4
        ("a100-eth25", 1 * 3.125e9 * TCP),
        ("l40s-pcie-eth100", 1 * 12.5e9 * TCP),
    ],
)
def test_bisection_of_two_nodes_on_one_switch_is_one_nodes_nics(name, expected):
    t = load_topology(name, nodes=2)
    assert t.halves() == (t.gpus_of_node(0), t.gpus_of_node(1))
    assert t.bisection_bytes_s() == pytest.approx(expected)


def test_bisection_of_one_box_is_half_its_gpus_nvlink():
    t = load_topology("dgx-h100-box")
    assert t.bisection_bytes_s() == pytest.approx(4 * 450e9 * 0.8)


def test_scaling_the_node_count():
    t = load_topology("dgx-a100-ib200", nodes=6)
    assert (t.num_nodes, len(t.gpus)) == (6, 48)
    assert t.gpus_of_node(5) == tuple(range(40, 48))
    assert t.node_of(47) == 5
    assert t.bisection_bytes_s() == pytest.approx(3 * 8 * 25e9 * CX6)
    with pytest.raises(SpecError, match="must be a positive integer"):
        load_topology("dgx-a100-ib200", nodes=0)


HETERO = """\
name: hetero
templates:
  prefill:
    gpu: h100-sxm
    gpus: 8
    nics: {count: 8, kind: infiniband, bandwidth: 400 Gbps}
  decode:
    gpu: h100-80gb-pcap
    gpus: 4
    nics: {count: 2, kind: infiniband, bandwidth: 200 Gbps}
nodes:
  - {template: prefill, count: 2}
  - {template: decode, count: 1}
"""


def test_mixed_templates_give_each_gpu_its_type(tmp_path):
    t = load_topology(write(tmp_path, HETERO))
    assert t.name == "hetero"
    assert (t.num_nodes, len(t.gpus)) == (3, 20)
    assert [t.gpu_type(i) for i in (0, 15, 16, 19)] == [
        "h100-sxm",
        "h100-sxm",
        "h100-80gb-pcap",
        "h100-80gb-pcap",
    ]
    assert t.gpus_of_node(2) == (16, 17, 18, 19)
    assert t.nic_count(2) == 2
    assert t.nics_of_gpu(17) == ("n2.nic0",) and t.nics_of_gpu(18) == ("n2.nic1",)
    # H100 -> power-capped H100 node: the decode node's 200 Gb/s NIC is the bottleneck
    assert t.bottleneck_bytes_s(t.path(0, 17)) == pytest.approx(25e9 * 0.95)
    with pytest.raises(SpecError, match="scales a single template"):
        load_topology(write(tmp_path, HETERO), nodes=4)


def test_leaf_spine_oversubscription_limits_the_bisection(tmp_path):
    text = """\
    node:
      gpu: h100-sxm
      gpus: 8
      nics: {count: 8, kind: infiniband, bandwidth: 400 Gbps}
    nodes: 4
    fabric: {kind: leaf-spine, nodes_per_leaf: 2, oversubscription: %s}
    """
    blocking = load_topology(write(tmp_path, text % 2))
    assert blocking.link("leaf0", "spine").capacity_bytes_s == 16 * 50e9 / 2
    assert blocking.bisection_bytes_s() == pytest.approx(8 * 50e9 * 0.95)
    p = blocking.path(0, 16)
    assert [ln.dst for ln in p][1:5] == ["leaf0", "spine", "leaf1", "n2.nic0"]
    assert "spine" not in [ln.dst for ln in blocking.path(0, 8)]  # same leaf
    assert load_topology(write(tmp_path, text % 1)).bisection_bytes_s() == pytest.approx(
        16 * 50e9 * 0.95
    )


EXPLICIT = """\
name: two-gpus
vertices:
  - {name: a, type: gpu, node: 0, gpu: l40s}
  - {name: b, type: gpu, node: 1, gpu: a100-80gb}
  - {name: na, type: nic, node: 0, kind: ethernet}
  - {name: nb, type: nic, node: 1, kind: ethernet}
  - {name: sw, type: switch, fabric: ethernet}
links:
  - {src: a, dst: na, kind: pcie, bandwidth: 32 GB/s}
  - {src: b, dst: nb, kind: pcie, bandwidth: 32 GB/s}
  - {src: na, dst: sw, kind: ethernet, bandwidth: 100 Gbps, latency: 5 us}
  - {src: nb, dst: sw, kind: %s, bandwidth: %s}
protocol: {ethernet: 0.5}
"""


def test_explicit_graph(tmp_path):
    t = load_topology(write(tmp_path, EXPLICIT % ("ethernet", "100 Gbps")))
    assert t.gpus == ("a", "b") and t.num_nodes == 2
    assert [t.gpu_type(0), t.gpu_type(1)] == ["l40s", "a100-80gb"]
    p = t.path(0, 1)
    assert [ln.dst for ln in t.hops(p)] == ["na", "sw", "nb", "b"]
    # TCP NICs: both nodes' host copy ceilings are on the path, first and last
    assert [p[0].kind, p[-1].kind] == ["ceiling", "ceiling"] and not p[0].hop
    assert t.ceiling_bytes_s(0) == t.ceiling_bytes_s(1) == TCP_HOST_CEILING_BYTES_S
    assert t.bottleneck_bytes_s(p) == pytest.approx(12.5e9 * 0.5)
    assert t.link("sw", "na").latency_s == pytest.approx(5e-6)  # duplex copies latency
    assert t.graph.nodes["sw"]["type"] == "switch" and t.graph.nodes["sw"]["fabric"] == "ethernet"
    assert t.nics_of_gpu(1) == ("nb",)
    with pytest.raises(SpecError, match="scales a template"):
        load_topology(write(tmp_path, EXPLICIT % ("ethernet", "100 Gbps")), nodes=2)


def test_inline_mapping_and_base_dir(tmp_path):
    import yaml

    data = yaml.safe_load(HETERO)
    assert len(load_topology(data, where="spec.yaml: topology").gpus) == 20
    data["templates"]["decode"]["gpus"] = 0
    with pytest.raises(SpecError, match=r"^spec\.yaml: topology\.templates\.decode\.gpus: 0 "):
        load_topology(data, where="spec.yaml: topology")
    write(tmp_path, HETERO, "h.yaml")
    assert load_topology("h.yaml", base_dir=tmp_path).num_nodes == 3


def test_link_usable_rate_and_checks():
    ln = Link("a", "b", "roce", 50e9, 1e-6, 0.9)
    assert ln.usable_bytes_s == pytest.approx(45e9)
    assert LINK_KINDS == ("nvlink", "pcie", "infiniband", "roce", "ethernet")
    for bad in (dict(kind="nvlink2"), dict(capacity_bytes_s=0.0), dict(efficiency=1.5)):
        args = dict(src="a", dst="b", kind="roce", capacity_bytes_s=1.0, latency_s=0.0)
        args["efficiency"] = 1.0
        args.update(bad)
        with pytest.raises(ValueError):
            Link(**args)


# -- errors ----------------------------------------------------------------------------
GOOD_NODE = """\
node:
  gpu: h100-sxm
  gpus: 8
  intra: {kind: nvswitch}
  nics: {count: 8, kind: infiniband, bandwidth: 400 Gbps}
nodes: 2
"""


@pytest.mark.parametrize(
    "old, new, message",
    [
        (
            "kind: infiniband",
            "kind: infiniband2",
            "t.yaml: node.nics.kind: unknown NIC kind 'infiniband2'; "
            "expected one of infiniband, roce, ethernet",
        ),
        (
            "kind: nvswitch",
            "kind: nvlink-mesh",
            "t.yaml: node.intra.kind: unknown intra-node fabric 'nvlink-mesh'; "
            "expected one of nvswitch, pcie",
        ),
        ("400 Gbps", "0 Gbps", "t.yaml: node.nics.bandwidth: '0 Gbps' must be a positive"),
        ("400 Gbps", "-5 Gbps", "t.yaml: node.nics.bandwidth: '-5 Gbps' must be a positive"),
        ("400 Gbps", "400 parsecs", "t.yaml: node.nics.bandwidth: '400 parsecs' is not a band"),
        (
            "gpu: h100-sxm",
            "gpu: h100-sxn",
            "t.yaml: node.gpu: unknown gpu 'h100-sxn'. Did you mean",
        ),
        ("gpus: 8", "gpus: 0", "t.yaml: node.gpus: 0 must be a positive integer"),
        (
            "nodes: 2",
            "nodes: 2\nfabric: {kind: torus}",
            "t.yaml: fabric.kind: unknown fabric kind 'torus'; expected one of single-switch, "
            "leaf-spine",
        ),
        ("nodes: 2", "nodes: 2\nnicss: 3", "t.yaml: unknown key 'nicss'"),
        ("intra:", "intr:", "t.yaml: node: unknown key 'intr'. Did you mean 'intra'?"),
        (
            "bandwidth: 400 Gbps}",
            "bandwidth: 400 Gbps, gpus: [0, 1, 2, 3, 4, 5, 6, 9]}",
            "t.yaml: node.nics.gpus[7]: GPU index 9 outside the node; expected 0..7",
        ),
        (
            "bandwidth: 400 Gbps}",
            "bandwidth: 400 Gbps, gpus: [0, 1, 2, 3, 4, 5, 6, 6]}",
            "t.yaml: node.nics.gpus: GPU 7 is served by no NIC",
        ),
        (
            "bandwidth: 400 Gbps}",
            "bandwidth: 400 Gbps, gpus: [0, 1]}",
            "t.yaml: node.nics.gpus: [0, 1] must be a list of 8 entries, one per NIC",
        ),
        (
            "  nics: {count: 8, kind: infiniband, bandwidth: 400 Gbps}\n",
            "",
            "t.yaml: GPU 'n1.gpu0' is not connected to the other GPUs "
            "(no route n0.gpu0 -> n1.gpu0)",
        ),
        ("nodes: 2", "nodes: 2\nprotocol: {roce: 1.5}", "t.yaml: protocol.roce: 1.5 must be in"),
        ("nodes: 2", "nodes: 2\nlatency: {tcp: 1 us}", "t.yaml: latency: unknown key 'tcp'"),
        ("nodes: 2", "nodes: [2", "t.yaml: not valid YAML"),
    ],
)
def test_template_errors(tmp_path, old, new, message):
    assert old in GOOD_NODE
    load_topology(write(tmp_path, GOOD_NODE))  # the unchanged file is fine
    with pytest.raises(SpecError) as e:
        load_topology(write(tmp_path, GOOD_NODE.replace(old, new)))
    assert str(e.value).startswith(f"{tmp_path}/{message}")


def test_mixed_nic_kinds_on_one_fabric_is_an_error(tmp_path):
    with pytest.raises(SpecError, match="kinds infiniband, roce; one fabric carries one kind"):
        load_topology(
            write(tmp_path, HETERO.replace("infiniband, bandwidth: 200", "roce, bandwidth: 200"))
        )


@pytest.mark.parametrize(
    "kind, bandwidth, extra, message",
    [
        (
            "infiniband2",
            "100 Gbps",
            "",
            "link 3 (nb -> sw): unknown kind 'infiniband2'; "
            "expected one of nvlink, pcie, infiniband, roce, ethernet",
        ),
        ("ethernet", "0 Gbps", "", "link 3 (nb -> sw): bandwidth: '0 Gbps' must be a positive"),
        (
            "ethernet",
            "100 Gbps",
            "  - {src: nb, dst: sw2, kind: ethernet, bandwidth: 1 Gbps}\n",
            "link 4 (nb -> sw2): 'sw2' is not a declared vertex (dangling edge)",
        ),
        (
            "ethernet",
            "100 Gbps",
            "  - {src: sw, dst: nb, kind: ethernet, bandwidth: 1 Gbps}\n",
            "link 4 (sw -> nb): sw -> nb is already link 3",
        ),
        (
            "ethernet",
            "100 Gbps",
            "  - {src: na, dst: nb, kind: ethernet, bandwidth: 1 Gbps, duplx: true}\n",
            "link 4 (na -> nb): unknown key 'duplx'. Did you mean 'duplex'?",
        ),
    ],
)
def test_explicit_link_errors(tmp_path, kind, bandwidth, extra, message):
    text = EXPLICIT.replace("protocol:", extra + "protocol:") % (kind, bandwidth)
    with pytest.raises(SpecError) as e:
        load_topology(write(tmp_path, text))
    assert str(e.value).startswith(f"{tmp_path / 't.yaml'}: {message}")


@pytest.mark.parametrize(
    "old, new, message",
    [
        (
            "  - {src: b, dst: nb, kind: pcie, bandwidth: 32 GB/s}\n",
            "",
            "GPU 'b' is not connected to the other GPUs",
        ),
        (
            "{src: b, dst: nb, kind: pcie, bandwidth: 32 GB/s}",
            "{src: b, dst: nb, kind: pcie, bandwidth: 32 GB/s, duplex: false}",
            "GPU 'b' is not connected to the other GPUs (no route a -> b)",
        ),
        ("type: switch", "type: router", "vertices[4].type: unknown vertex type 'router'"),
        ("{name: nb, type: nic, node: 1,", "{name: na, type: nic, node: 1,", "declared twice"),
        ("node: 1, gpu", "node: 2, gpu", "GPU node indices [0, 2] must run 0, 1, 2"),
        ("kind: ethernet}\n  - {name: nb", "kind: ethernet, serves: [b]}\n  - {name: nb",
         "vertices[2].serves: 'b' is not a GPU of node 0; expected one of a"),
    ],
)  # fmt: skip
def test_explicit_graph_errors(tmp_path, old, new, message):
    good = EXPLICIT % ("ethernet", "100 Gbps")
    assert old in good
    with pytest.raises(SpecError, match="^" + str(tmp_path / "t.yaml").replace(".", r"\.")) as e:
        load_topology(write(tmp_path, good.replace(old, new)))
    assert message in str(e.value)


def test_unknown_name_suggests_close_ones():
    with pytest.raises(UnknownNameError) as e:
        load_topology("dgx-h100-ib40")
    assert "Did you mean 'dgx-h100-ib400'" in str(e.value)
    assert "l40s-pcie-eth100" in str(e.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(SpecError, match="no such topology file"):
        load_topology(str(tmp_path / "nope.yaml"))
    with pytest.raises(SpecError, match=r"^spec\.yaml: topology: nope\.yaml: no such topology"):
        load_topology("nope.yaml", where="spec.yaml: topology", base_dir=tmp_path)


# -- the command line ------------------------------------------------------------------
def test_twin_topo_prints_the_summary(capsys):
    assert main(["topo", "dgx-h100-ib400"]) == 0
    out = capsys.readouterr().out
    assert "topology dgx-h100-ib400: 4 nodes, 32 GPUs, 32 NICs" in out
    assert "8 x h100-sxm, nvswitch 450 GB/s per GPU, 8 x infiniband NIC 400 Gb/s" in out
    assert "links (directed): nvlink 64 (eff 0.8), pcie 64 (eff 0.8), infiniband 64" in out
    assert "per-GPU injection: 49.10 GB/s (393 Gb/s)" in out  # ConnectX-7: 0.982
    assert "bisection: 785.60 GB/s (6,285 Gb/s) usable (nodes 0-1 | 2-3)" in out
    assert "node ceiling" not in out  # RDMA without a measured aggregate
    assert "GPU 0 -> GPU 8: n0.gpu0 -> n0.nic0 -> switch -> n1.nic0 -> n1.gpu0" in out


def test_twin_topo_scales_and_draws(capsys, tmp_path):
    png = tmp_path / "t.png"
    assert main(["topo", "h100-roce-8x400", "--nodes", "6", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "6 nodes, 48 GPUs" in out and str(png) in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_twin_topo_errors_are_one_line(capsys, tmp_path):
    assert main(["topo", "dgx-h100-ib40"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: unknown topology 'dgx-h100-ib40'") and err.count("\n") == 1
    assert main(["topo", "dgx-h100-box", "--nodes", "0"]) == 2
    assert "--nodes: 0 must be a positive integer" in capsys.readouterr().err
    bad = write(tmp_path, GOOD_NODE.replace("400 Gbps", "0 Gbps"))
    assert main(["topo", str(bad)]) == 2
    assert "node.nics.bandwidth: '0 Gbps' must be a positive" in capsys.readouterr().err


def test_a_gpu_served_by_several_nics_sends_through_the_first(tmp_path):
    t = load_topology(
        write(
            tmp_path,
            """\
            node:
              gpu: h100-sxm
              gpus: 2
              nics: {count: 2, kind: roce, bandwidth: 200 Gbps, gpus: [[0, 1], [1, 0]]}
            nodes: 2
            """,
        )
    )
    assert t.nics_of_gpu(0) == ("n0.nic0", "n0.nic1")
    assert t.nics_of_gpu(3) == ("n1.nic0", "n1.nic1")
    verts = [ln.dst for ln in t.path(0, 3)]
    assert verts == ["n0.nic0", "switch", "n1.nic0", "n1.gpu1"]
    # both NICs are one GPU's to use
    assert t.injection_bytes_s(0) == pytest.approx(2 * 25e9 * PROTOCOL_DEFAULTS["roce"])
