"""What a topology file describes, whichever form it takes: vertices, links and their
kinds, the sourced protocol efficiencies and latencies, and the helpers both forms
parse with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twin._check import check_keys, entry, fraction, nonneg_float
from twin.errors import SpecError, UnitError, UnknownNameError
from twin.perf.gpus import get_gpu
from twin.units import parse_bandwidth, parse_duration

LINK_KINDS = ("nvlink", "pcie", "infiniband", "roce", "ethernet")
NIC_KINDS = ("infiniband", "roce", "ethernet")
INTRA_KINDS = ("nvswitch", "pcie")
FABRIC_KINDS = ("single-switch", "leaf-spine")
SWITCH_FABRICS = ("nvswitch", "pcie", "infiniband", "roce", "ethernet")
VERTEX_TYPES = ("gpu", "nic", "switch")


# Share of the line rate a bulk transfer gets, per link kind (usable = line x this),
# for a link whose NIC generation is not given (``nics.generation`` sets RDMA NICs').
PROTOCOL_DEFAULTS: Mapping[str, float] = {
    # NCCL tests on DGX A100 / H100 report NVLink bus bandwidth near 80% of the
    # per-GPU, per-direction line rate (e.g. ~240 of 300 GB/s on A100).
    "nvlink": 0.8,
    # PCIe Gen4 x16 device copies reach ~25-26 of 32 GB/s (TLP headers, flow control).
    "pcie": 0.8,
    # InfiniBand RDMA of an unnamed NIC: Azure's acceptance floor for one NDR HCA,
    # ib_write_bw with GPUDirect >= 380 of 400 Gb/s (Azure/azurehpc-health-checks,
    # README test table, check_ib_bw_gdr for ND H100 v5).
    "infiniband": 0.95,
    # RoCEv2 RDMA of an unnamed NIC: the InfiniBand floor above times the RoCE/IB
    # frame ratio (ROCE_PER_IB below): 0.95 x 0.987 = 0.94.
    "roce": 0.94,
    # TCP on the wire: 1448 payload bytes (1500 MTU less IPv4 20 and TCP 32 with
    # timestamps, RFC 791/793/7323) per 1538 bytes on the line (plus Ethernet header
    # 14, FCS 4, preamble 8, inter-frame gap 12; IEEE 802.3) = 0.941. What TCP loses
    # to the host (kernel copies) is the node's ceiling, TCP_HOST_CEILING_BYTES_S.
    "ethernet": 0.94,
}

# RoCEv2 vs InfiniBand: share of a 4096-byte RDMA payload per packet on the line.
# IB: LRH 8 + BTH 12 + ICRC 4 + VCRC 2 = 26 bytes per packet (IBTA spec vol. 1,
# ch. 5); RoCEv2: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + ICRC 4 + FCS 4, plus
# preamble 8 and inter-frame gap 12 = 82 bytes (IBTA RoCEv2 annex A17; IEEE 802.3).
ROCE_PER_IB = (4096 + 26) / (4096 + 82)

# RDMA efficiency per NIC generation, measured over InfiniBand with ib_write_bw
# (perftest, large messages, GPUDirect); RoCE NICs of a generation get this x ROCE_PER_IB.
NIC_GENERATIONS: Mapping[str, float] = {
    # ConnectX-6 (HDR 200 Gb/s, 200 GbE): ~194 Gb/s of 200 on Azure NDv4 (A100 +
    # 8 x HDR ConnectX-6), ib_write_bw per HCA (Azure/azurehpc-health-checks issue #46).
    "connectx-6": 0.97,
    # ConnectX-7 (NDR 400 Gb/s, 400 GbE): 392.8-393.0 Gb/s of 400 on each of the 8
    # HCAs of an Azure ND H100 v5 (nd96isr_h100_v5), ib_write_bw with GPUDirect, as
    # printed by Azure's node health checks (aznhc check_ib_bw_gdr) in their
    # published troubleshooting notes; Azure's pass floor for it is 380.
    "connectx-7": 0.982,
}

# TCP is host-bound: the kernel copies every byte through host memory, so a node's
# TCP traffic tops out at a host copy ceiling however many NICs it has. Mooncake
# (FAST'25, section 5.4.1, Figure 12) moves 40 GB between two nodes over TCP 2.4x
# slower than its RDMA Transfer Engine on 4 x 200 Gbps (87 GB/s -> ~36 GB/s) and
# 4.6x slower on 8 x 400 Gbps (190 GB/s -> ~41 GB/s): four times the NIC line rate
# buys TCP 14%. The default is the 8 x 400 Gbps figure, 190 / 4.6 GB/s, per direction.
TCP_HOST_CEILING_BYTES_S = 190e9 / 4.6


def nic_efficiency(generation: str, kind: str) -> float:
    """RDMA efficiency of a NIC ``generation`` on links of ``kind`` (infiniband | roce)."""
    eff = NIC_GENERATIONS[generation]
    return eff * ROCE_PER_IB if kind == "roce" else eff


# Per-link one-way latency defaults, seconds (a path adds its links' latencies).
LATENCY_DEFAULTS: Mapping[str, float] = {
    "nvlink": 1e-6,  # GPU <-> NVSwitch hop; peer copies start in a few microseconds
    "pcie": 1e-6,  # one PCIe switch hop plus DMA set-up
    "infiniband": 1e-6,  # NIC + switch hop; IB verbs one-way latency is ~1-2 us end to end
    "roce": 2e-6,  # Ethernet switch hops are slower than IB's (~0.5-1 us per hop)
    "ethernet": 10e-6,  # kernel TCP stack on both ends
}


@dataclass(frozen=True, slots=True)
class VertexDef:
    """One vertex: ``type`` gpu | nic | switch; ``node`` its node index (None for
    fabric switches); ``gpu`` the catalog name of a GPU; ``fabric`` what a switch
    switches; ``kind`` a NIC's link kind; ``tier`` a fabric switch's level (0 leaf
    or single switch, 1 spine); ``serves`` the local GPU indices a NIC serves."""

    name: str
    type: str
    node: int | None = None
    index: int = 0
    gpu: str = ""
    fabric: str = ""
    kind: str = ""
    tier: int = 0
    serves: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LinkDef:
    """One directed link before it becomes a :class:`twin.net.topology.Link`."""

    src: str
    dst: str
    kind: str
    capacity_bytes_s: float
    latency_s: float
    efficiency: float


@dataclass(slots=True)
class TopoDef:
    """A topology as plain data: vertices in declaration order, directed links."""

    name: str
    where: str
    vertices: list[VertexDef] = field(default_factory=list)
    links: list[LinkDef] = field(default_factory=list)
    fabric: str = ""  # single-switch | leaf-spine | explicit
    templates: dict[int, str] = field(default_factory=dict)  # node -> template name
    # node -> the most its NICs carry together, bytes/s per direction (a node
    # without an entry has no ceiling beyond its links)
    ceilings: dict[int, float] = field(default_factory=dict)


def parse_rate(value: object, where: str) -> float:
    try:
        x = parse_bandwidth(value)
    except UnitError as e:
        raise SpecError(f"{where}: {e}") from None
    if x <= 0:
        raise SpecError(f"{where}: {value!r} must be a positive bandwidth")
    return x


def parse_latency(value: object, where: str) -> float:
    try:
        x = parse_duration(value)
    except UnitError as e:
        raise SpecError(f"{where}: {e}") from None
    return nonneg_float(x, where)


def one_of(value: object, where: str, what: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise SpecError(f"{where}: unknown {what} {value!r}; expected one of {', '.join(allowed)}")
    return str(value)


def as_mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: {value!r} must be a mapping")
    return value


def gpu_name(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise SpecError(f"{where}: {value!r} must be a GPU catalog name such as h100-sxm")
    try:
        return get_gpu(value).name
    except UnknownNameError as e:
        raise SpecError(f"{where}: {e}") from None


def per_kind(data: Mapping[str, Any], where: str) -> tuple[dict[str, float], dict[str, float]]:
    """``protocol:`` and ``latency:`` mappings over the link kinds, defaults filled in."""
    eff = dict(PROTOCOL_DEFAULTS)
    lat = dict(LATENCY_DEFAULTS)
    for k, target, parse in (
        ("protocol", eff, fraction),
        ("latency", lat, parse_latency),
    ):
        given = data.get(k)
        if given is None:
            continue
        w = entry(where, k)
        check_keys(as_mapping(given, w), w, (), LINK_KINDS)
        for kind, value in given.items():
            target[kind] = parse(value, entry(w, kind))
    return eff, lat


def topology_name(data: Mapping[str, Any], where: str, default: str) -> str:
    name = data.get("name", default)
    if not isinstance(name, str) or not name:
        raise SpecError(f"{entry(where, 'name')}: {name!r} must be a non-empty string")
    return name
