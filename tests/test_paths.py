"""Paths and protocols: widest-path routing and its tie-breaks, NIC generations,
node ceilings (TCP's host copy ceiling, a measured multi-NIC aggregate), and the
Mooncake Transfer Engine figures the bundled RoCE topologies reproduce."""

from __future__ import annotations

import textwrap

import pytest
import simpy
import yaml

from twin.bundled import bundled_text
from twin.cli import main
from twin.errors import SpecError
from twin.net.flows import FlowSpec, Network
from twin.net.topodef import (
    NIC_GENERATIONS,
    PROTOCOL_DEFAULTS,
    ROCE_PER_IB,
    TCP_HOST_CEILING_BYTES_S,
)
from twin.net.topology import Link, load_topology
from twin.perf.llm import get_model
from twin.studies.handoff import handoff_estimate

ROCE = PROTOCOL_DEFAULTS["roce"]


def write(tmp_path, text, name="t.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def verts(topo, path):
    hops = topo.hops(path)
    return [hops[0].src] + [ln.dst for ln in hops]


# -- widest path -------------------------------------------------------------------------
def test_a_wide_two_hop_route_beats_a_narrow_direct_link(tmp_path):
    # GPU a (node 0) and b (node 1): a direct 25 Gb/s link, or two hops of 100 Gb/s
    # through a switch. Fewest hops would take the direct link.
    t = load_topology(
        write(
            tmp_path,
            """\
            vertices:
              - {name: a, type: gpu, node: 0, gpu: h100-sxm}
              - {name: b, type: gpu, node: 1, gpu: h100-sxm}
              - {name: sw, type: switch, fabric: roce}
            links:
              - {src: a, dst: b, kind: roce, bandwidth: 25 Gbps}
              - {src: a, dst: sw, kind: roce, bandwidth: 100 Gbps}
              - {src: sw, dst: b, kind: roce, bandwidth: 100 Gbps}
            """,
        )
    )
    p = t.path(0, 1)
    assert verts(t, p) == ["a", "sw", "b"]
    assert t.bottleneck_bytes_s(p) == pytest.approx(12.5e9 * ROCE)
    assert verts(t, t.path(1, 0)) == ["b", "sw", "a"]  # duplex: the same both ways


def test_between_nics_too_the_wider_route_wins(tmp_path):
    # the NICs of two nodes: a direct 25 Gb/s cable, or 100 Gb/s through a switch
    t = load_topology(
        write(
            tmp_path,
            """\
            vertices:
              - {name: a, type: gpu, node: 0, gpu: h100-sxm}
              - {name: b, type: gpu, node: 1, gpu: h100-sxm}
              - {name: na, type: nic, node: 0, kind: roce}
              - {name: nb, type: nic, node: 1, kind: roce}
              - {name: sw, type: switch, fabric: roce}
            links:
              - {src: a, dst: na, kind: pcie, bandwidth: 64 GB/s}
              - {src: b, dst: nb, kind: pcie, bandwidth: 64 GB/s}
              - {src: na, dst: nb, kind: roce, bandwidth: 25 Gbps}
              - {src: na, dst: sw, kind: roce, bandwidth: 100 Gbps}
              - {src: sw, dst: nb, kind: roce, bandwidth: 100 Gbps}
            """,
        )
    )
    assert verts(t, t.path(0, 1)) == ["a", "na", "sw", "nb", "b"]


def test_of_a_gpus_nics_the_one_on_the_widest_route_carries_it(tmp_path):
    # one GPU, two NICs that serve it, the first listed the narrower
    t = load_topology(
        write(
            tmp_path,
            """\
            vertices:
              - {name: a, type: gpu, node: 0, gpu: h100-sxm}
              - {name: slow, type: nic, node: 0, kind: roce}
              - {name: fast, type: nic, node: 0, kind: roce}
              - {name: b, type: gpu, node: 1, gpu: h100-sxm}
              - {name: nb, type: nic, node: 1, kind: roce}
              - {name: sw, type: switch, fabric: roce}
            links:
              - {src: a, dst: slow, kind: pcie, bandwidth: 64 GB/s}
              - {src: a, dst: fast, kind: pcie, bandwidth: 64 GB/s}
              - {src: b, dst: nb, kind: pcie, bandwidth: 64 GB/s}
              - {src: slow, dst: sw, kind: roce, bandwidth: 25 Gbps}
              - {src: fast, dst: sw, kind: roce, bandwidth: 400 Gbps}
              - {src: nb, dst: sw, kind: roce, bandwidth: 400 Gbps}
            """,
        )
    )
    assert t.nics_of_gpu(0) == ("slow", "fast")
    assert verts(t, t.path(0, 1)) == ["a", "fast", "sw", "nb", "b"]
    assert t.bottleneck_bytes_s(t.path(0, 1)) == pytest.approx(50e9 * ROCE)


TIES = """\
vertices:
  - {name: a, type: gpu, node: 0, gpu: h100-sxm}
  - {name: b, type: gpu, node: 1, gpu: h100-sxm}
  - {name: s1, type: switch, fabric: roce}
  - {name: s2, type: switch, fabric: roce}
  - {name: s3, type: switch, fabric: roce}
links:
%s
"""


def _ties(tmp_path, links):
    body = "\n".join(f"  - {{{ln}}}" for ln in links)
    return load_topology(write(tmp_path, TIES % body))


def test_equal_width_routes_go_by_latency_then_hops_then_names(tmp_path):
    wide = "kind: roce, bandwidth: 100 Gbps"
    # equal width: the lower total latency wins, though it has more hops
    t = _ties(
        tmp_path,
        [
            f"src: a, dst: s1, {wide}, latency: 5 us",
            f"src: s1, dst: b, {wide}, latency: 5 us",
            f"src: a, dst: s2, {wide}, latency: 1 us",
            f"src: s2, dst: s3, {wide}, latency: 1 us",
            f"src: s3, dst: b, {wide}, latency: 1 us",
        ],
    )
    assert verts(t, t.path(0, 1)) == ["a", "s2", "s3", "b"]
    # equal width and latency: the fewer hops win
    t = _ties(
        tmp_path,
        [
            f"src: a, dst: s1, {wide}, latency: 3 us",
            f"src: s1, dst: b, {wide}, latency: 3 us",
            f"src: a, dst: s2, {wide}, latency: 2 us",
            f"src: s2, dst: s3, {wide}, latency: 2 us",
            f"src: s3, dst: b, {wide}, latency: 2 us",
        ],
    )
    assert verts(t, t.path(0, 1)) == ["a", "s1", "b"]
    # all equal: the route whose names sort first, whatever order the file lists them in
    links = [
        f"src: a, dst: s2, {wide}",
        f"src: s2, dst: b, {wide}",
        f"src: a, dst: s1, {wide}",
        f"src: s1, dst: b, {wide}",
    ]
    assert verts(t := _ties(tmp_path, links), t.path(0, 1)) == ["a", "s1", "b"]
    assert verts(t := _ties(tmp_path, links[::-1]), t.path(0, 1)) == ["a", "s1", "b"]
    # width comes first: a narrower route loses however fast and short it is
    t = _ties(
        tmp_path,
        [
            "src: a, dst: b, kind: roce, bandwidth: 50 Gbps, latency: 0 us",
            f"src: a, dst: s1, {wide}, latency: 9 us",
            f"src: s1, dst: b, {wide}, latency: 9 us",
        ],
    )
    assert verts(t, t.path(0, 1)) == ["a", "s1", "b"]


def test_routes_tied_on_width_before_the_bottleneck_go_by_latency(tmp_path):
    # Both routes end on the same 50 Gb/s link; the one wider before it (s1) is
    # slower. A single pass on (width, latency) would settle s3 through s1 first.
    t = _ties(
        tmp_path,
        [
            "src: a, dst: s1, kind: roce, bandwidth: 400 Gbps, latency: 9 us",
            "src: s1, dst: s3, kind: roce, bandwidth: 400 Gbps, latency: 9 us",
            "src: a, dst: s2, kind: roce, bandwidth: 100 Gbps, latency: 1 us",
            "src: s2, dst: s3, kind: roce, bandwidth: 100 Gbps, latency: 1 us",
            "src: s3, dst: b, kind: roce, bandwidth: 50 Gbps, latency: 1 us",
        ],
    )
    p = t.path(0, 1)
    assert verts(t, p) == ["a", "s2", "s3", "b"]
    assert t.latency_s(p) == pytest.approx(3e-6)


def test_the_bundled_routes_are_the_direct_ones():
    # widest routing keeps the documented paths of the template topologies
    t = load_topology("dgx-h100-ib400", nodes=2)
    assert verts(t, t.path(0, 9)) == ["n0.gpu0", "n0.nic0", "switch", "n1.nic1", "n1.gpu1"]
    assert verts(t, t.path(0, 1)) == ["n0.gpu0", "n0.nvswitch", "n0.gpu1"]
    r = load_topology("h100-roce-8x400")
    assert verts(r, r.path(0, 16))[1:6] == ["n0.nic0", "leaf0", "spine", "leaf1", "n2.nic0"]


# -- NIC generations ---------------------------------------------------------------------
NODE = """\
node:
  gpu: h100-sxm
  gpus: 8
  nics: {count: 8, kind: %s, bandwidth: 400 Gbps%s}
nodes: 2
"""


def test_rdma_efficiency_is_the_nic_generations():
    cx6, cx7 = NIC_GENERATIONS["connectx-6"], NIC_GENERATIONS["connectx-7"]
    assert cx6 == 0.97 and cx7 == 0.982  # ib_write_bw ~194 of 200, ~393 of 400 Gb/s
    # RoCEv2 frames carry 82 header bytes per 4096, InfiniBand's 26
    assert ROCE_PER_IB == pytest.approx(4122 / 4178)
    for gen, eff in (("connectx-6", cx6), ("connectx-7", cx7)):
        for kind, factor in (("infiniband", 1.0), ("roce", ROCE_PER_IB)):
            t = load_topology(yaml.safe_load(NODE % (kind, f", generation: {gen}")))
            assert t.link("n0.nic3", "switch").efficiency == pytest.approx(eff * factor)
            assert t.link("switch", "n1.nic3").efficiency == pytest.approx(eff * factor)
            assert t.link("n0.gpu3", "n0.nic3").efficiency == PROTOCOL_DEFAULTS["pcie"]
    plain = load_topology(yaml.safe_load(NODE % ("infiniband", "")))
    assert plain.link("n0.nic0", "switch").efficiency == PROTOCOL_DEFAULTS["infiniband"]


def test_templates_of_two_generations_on_one_fabric():
    data = {
        "templates": {
            "old": {"gpu": "a100-80gb", "gpus": 8, "nics": {
                "count": 8, "kind": "infiniband", "bandwidth": "200 Gbps",
                "generation": "connectx-6"}},
            "new": {"gpu": "h100-sxm", "gpus": 8, "nics": {
                "count": 8, "kind": "infiniband", "bandwidth": "400 Gbps",
                "generation": "connectx-7"}},
        },
        "nodes": [{"template": "old", "count": 2}, {"template": "new", "count": 2}],
        "fabric": {"kind": "leaf-spine", "nodes_per_leaf": 2, "oversubscription": 1},
    }  # fmt: skip
    t = load_topology(data)
    assert t.link("n0.nic0", "leaf0").efficiency == NIC_GENERATIONS["connectx-6"]
    assert t.link("n2.nic0", "leaf1").efficiency == NIC_GENERATIONS["connectx-7"]
    # a switch-to-switch link takes the best of the NICs' efficiencies
    assert t.link("leaf0", "spine").efficiency == NIC_GENERATIONS["connectx-7"]
    # old -> new: the ConnectX-6 NIC is the bottleneck
    assert t.bottleneck_bytes_s(t.path(0, 16)) == pytest.approx(25e9 * 0.97)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            NODE % ("roce", ", generation: connectx-8"),
            "t.yaml: node.nics.generation: unknown NIC generation 'connectx-8'; "
            "expected one of connectx-6, connectx-7",
        ),
        (
            NODE % ("ethernet", ", generation: connectx-7"),
            "t.yaml: node.nics.generation: 'connectx-7' sets an RDMA efficiency, "
            "but kind 'ethernet' is TCP",
        ),
        (
            NODE % ("roce", ", generation: connectx-7") + "protocol: {roce: 0.5}\n",
            "t.yaml: protocol.roce: template 'node' names its NIC generation (connectx-7)",
        ),
        (
            NODE % ("ethernet", ", attach: gpu"),
            "t.yaml: node.nics.attach: 'gpu' is GPUDirect RDMA, but kind 'ethernet' is TCP",
        ),
        (
            NODE % ("roce", ", ceiling: 0 GB/s"),
            "t.yaml: node.nics.ceiling: '0 GB/s' must be a positive bandwidth",
        ),
    ],
)
def test_bad_generations_and_ceilings_are_one_line_errors(tmp_path, capsys, text, message):
    p = write(tmp_path, text)
    with pytest.raises(SpecError) as e:
        load_topology(p)
    assert str(e.value).startswith(message.replace("t.yaml", str(p)))
    assert main(["topo", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and err.count("\n") == 1


# -- node ceilings -------------------------------------------------------------------------
def _aggregate(topo, src_gpus, dst_gpus, nbytes=8e9, *, multi_nic=True):
    """Bytes/s of one transfer from GPUs to GPUs on an idle network, each source
    spreading its share over every NIC of its node when ``multi_nic``."""
    env = simpy.Environment()
    net = Network(env)
    flows = []
    share = nbytes / len(src_gpus)
    for g, d in zip(src_gpus, dst_gpus, strict=True):
        n = topo.nic_count(topo.node_of(g)) if multi_nic else 1
        for k in range(n):
            path = topo.path(g, d, nic=k) if multi_nic else topo.path(g, d)
            flows.append(FlowSpec(path, share / n))
    t = net.start(flows)
    env.run()
    latency = max(topo.latency_s(f.path) for f in flows)
    return nbytes / (t.end_s - latency)


def _as_tcp(name):
    data = yaml.safe_load(bundled_text("topologies", name))
    nics = data["node"]["nics"]
    nics.update(kind="ethernet", attach="host")
    for k in ("generation", "ceiling", "gpus"):
        nics.pop(k, None)
    data["name"] = f"{name}-tcp"
    return load_topology(data)


def test_tcp_is_held_to_the_host_ceiling_however_many_nics():
    tcp = _as_tcp("h100-roce-8x400")
    assert tcp.ceiling_bytes_s(0) == TCP_HOST_CEILING_BYTES_S
    src, dst = tcp.gpus_of_node(0), tcp.gpus_of_node(1)
    # eight 400 Gb/s NICs at TCP's 0.94 would carry 376 GB/s; the host copies 41.3
    assert _aggregate(tcp, src, dst) == pytest.approx(TCP_HOST_CEILING_BYTES_S, rel=1e-6)
    # one GPU on one NIC: 47 GB/s of wire, still held to the host's 41.3
    assert _aggregate(tcp, src[:1], dst[:1], multi_nic=False) == pytest.approx(
        TCP_HOST_CEILING_BYTES_S, rel=1e-6
    )
    assert tcp.injection_bytes_s(0) == pytest.approx(TCP_HOST_CEILING_BYTES_S)
    # per direction: two nodes sending to each other each get the whole ceiling
    env = simpy.Environment()
    net = Network(env)
    there = net.start([FlowSpec(tcp.path(g, d), 1e9) for g, d in zip(src, dst, strict=True)])
    back = net.start([FlowSpec(tcp.path(d, g), 1e9) for g, d in zip(src, dst, strict=True)])
    env.run()
    assert there.end_s == pytest.approx(back.end_s)
    assert there.end_s == pytest.approx(8e9 / TCP_HOST_CEILING_BYTES_S, rel=1e-3)
    # a node's ceiling is shared by all its flows: two receivers share the sender's
    three = _as_tcp("h100-roce-4x200")
    env = simpy.Environment()
    net = Network(env)
    a = net.start([FlowSpec(three.path(0, 8), 4e9)])
    b = net.start([FlowSpec(three.path(2, 16), 4e9)])
    env.run()
    assert a.end_s == pytest.approx(b.end_s)
    assert a.end_s == pytest.approx(8e9 / TCP_HOST_CEILING_BYTES_S, rel=1e-3)


def test_a_slow_tcp_nic_is_bound_by_its_wire_not_the_host():
    t = load_topology("l40s-pcie-eth100")
    assert t.ceiling_bytes_s(0) == TCP_HOST_CEILING_BYTES_S
    assert t.injection_bytes_s(0) == pytest.approx(12.5e9 * 0.94)


def test_an_explicit_graph_can_set_the_ceiling(tmp_path):
    text = """\
    vertices:
      - {name: a, type: gpu, node: 0, gpu: h100-sxm}
      - {name: b, type: gpu, node: 1, gpu: h100-sxm}
      - {name: sw, type: switch, fabric: roce}
    links:
      - {src: a, dst: sw, kind: roce, bandwidth: 400 Gbps}
      - {src: sw, dst: b, kind: roce, bandwidth: 400 Gbps}
    ceiling: 10 GB/s
    """
    t = load_topology(write(tmp_path, text))
    assert t.ceiling_bytes_s(0) == t.ceiling_bytes_s(1) == 10e9
    assert t.bottleneck_bytes_s(t.path(0, 1)) == 10e9
    assert t.bisection_bytes_s() == pytest.approx(10e9)
    # RDMA NICs without a ceiling: none
    assert (
        load_topology(write(tmp_path, text.replace("ceiling: 10 GB/s\n", ""))).ceiling_bytes_s(0)
        is None
    )


def test_a_ceiling_is_a_shared_cap_not_a_hop():
    cap = Link("n0.nics", "n0.nics.out", "ceiling", 10.0, 0.0, 1.0, hop=False)
    a, b = Link("g0", "sw", "roce", 100.0, 0.0, 1.0), Link("sw", "g1", "roce", 100.0, 0.0, 1.0)
    FlowSpec((cap, a, b), 1.0)  # chains over its hops
    FlowSpec((a, cap, b), 1.0)
    with pytest.raises(SpecError, match=r"link 0 \(g0 -> sw\) ends at 'sw' but link 2"):
        FlowSpec((a, cap, a), 1.0)
    with pytest.raises(ValueError, match="kind 'ceiling'"):
        Link("x", "y", "ceiling", 10.0, 0.0, 1.0)  # a hop of kind ceiling
    env = simpy.Environment()
    net = Network(env)
    one = net.start([FlowSpec((cap, a, b), 10.0)])
    c, d = Link("g2", "sw", "roce", 100.0, 0.0, 1.0), Link("sw", "g3", "roce", 100.0, 0.0, 1.0)
    two = net.start([FlowSpec((cap, c, d), 10.0)])
    env.run()
    assert one.end_s == two.end_s == pytest.approx(2.0)  # 10 B/s shared by two flows
    assert {(s["src"], s["dst"]) for s in net.link_stats()} >= {("n0.nics", "n0.nics.out")}


def test_twin_topo_shows_the_ceiling(capsys):
    assert main(["topo", "h100-roce-8x400"]) == 0
    out = capsys.readouterr().out
    assert "node ceiling: 190.00 GB/s (1,520 Gb/s) per direction" in out
    assert "GPU 0 -> GPU 8: n0.gpu0 -> n0.nic0 -> leaf0 -> n1.nic0 -> n1.gpu0; pcie/roce;" in out
    assert "bisection: 380.00 GB/s" in out  # two nodes' ceilings, not 16 NICs


# -- the Mooncake figures ------------------------------------------------------------------
# Qin et al., "Mooncake: Trading More Storage for Less Computation", FAST'25,
# section 5.4.1 and Figure 12: 40 GB (LLaMA3-70B's KV of 128k tokens) between two
# nodes; the Transfer Engine reaches 87 GB/s on 4 x 200 Gbps and 190 GB/s on
# 8 x 400 Gbps RoCE, "approximately 2.4x and 4.6x faster than" TCP.
MOONCAKE_RDMA = {"h100-roce-4x200": 87e9, "h100-roce-8x400": 190e9}
MOONCAKE_TCP = {"h100-roce-4x200": 87e9 / 2.4, "h100-roce-8x400": 190e9 / 4.6}
TOLERANCE = 0.02  # the paper gives two significant figures for the rates


def _handoff_rate(topo):
    l3 = get_model("llama-3.1-70b")  # LLaMA3-70B's shape: 320 KiB of KV per token
    est = handoff_estimate(l3, 131072, topo, tp=8, multi_nic=True)
    assert est["kv_bytes"] == 40 * 2**30
    return est["kv_bytes"] / est["bytes_s"]  # the network's part; fixed costs are < 1% here


@pytest.mark.parametrize("name", sorted(MOONCAKE_RDMA))
def test_the_mooncake_topologies_reproduce_the_transfer_engine_figure(name):
    rate = _handoff_rate(load_topology(name))
    assert rate == pytest.approx(MOONCAKE_RDMA[name], rel=TOLERANCE)


def test_the_mooncake_tcp_figure_on_8x400():
    tcp = _handoff_rate(_as_tcp("h100-roce-8x400"))
    assert tcp == pytest.approx(MOONCAKE_TCP["h100-roce-8x400"], rel=TOLERANCE)
    rdma = _handoff_rate(load_topology("h100-roce-8x400"))
    assert rdma / tcp == pytest.approx(4.6, rel=TOLERANCE)


def test_the_mooncake_tcp_figure_on_4x200_within_the_hosts_difference():
    # The default host ceiling is the 8 x 400 Gbps host's (41.3 GB/s); the paper's
    # 4 x 200 Gbps host copies ~36 GB/s. One default serves both within 15%.
    tcp = _handoff_rate(_as_tcp("h100-roce-4x200"))
    assert tcp == pytest.approx(MOONCAKE_TCP["h100-roce-4x200"], rel=0.15)
    assert tcp == pytest.approx(TCP_HOST_CEILING_BYTES_S, rel=1e-3)
