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


# Share of the line rate a bulk transfer gets, per link kind (usable = line x this).
PROTOCOL_DEFAULTS: Mapping[str, float] = {
    # NCCL tests on DGX A100 / H100 report NVLink bus bandwidth near 80% of the
    # per-GPU, per-direction line rate (e.g. ~240 of 300 GB/s on A100).
    "nvlink": 0.8,
    # PCIe Gen4 x16 device copies reach ~25-26 of 32 GB/s (TLP headers, flow control).
    "pcie": 0.8,
    # InfiniBand RDMA: 64b/66b line code (97%) and headers at 4 KiB MTU (~98%);
    # ib_write_bw with large messages runs within a few percent of the data rate.
    "infiniband": 0.95,
    # RoCEv2 RDMA: Ethernet/IP/UDP headers on top of InfiniBand's, plus congestion
    # control back-off (DCQCN). Mooncake's Transfer Engine moves 87 GB/s over
    # 4 x 200 Gb/s RoCE (87% of line rate; kvcache-ai/Mooncake README).
    "roce": 0.9,
    # TCP: kernel copies through host memory, one stream per peer. Mooncake's README
    # puts RDMA at 2.4x-4.6x its TCP path on the same NICs; 0.4 is a chosen middle
    # value, not a measurement. Set it per topology.
    "ethernet": 0.4,
}


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
