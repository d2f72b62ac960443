"""GPU specifications and their catalog.

A :class:`GPUSpec` holds what the performance models read: dense BF16
FLOP/s, HBM bytes/s, memory bytes, board power, and the per-GPU, per-direction
NVLink (or Infinity Fabric) and PCIe bandwidths. :func:`get_gpu` looks a name
up (case-insensitive, with aliases) or builds a user GPU from an inline
mapping whose quantities may carry units (``"989 TFLOPS"``, ``"3.35 TB/s"``,
``"80 GiB"``, ``"700 W"``).

A GPU run under a board power limit below its rated one is its own entry: the
same peaks, a lower ``tdp_w`` and a ``sustained_clock`` below 1, the share of
the datasheet tensor-core clock it holds under that limit. The clock scales
the achievable FLOP/s (:attr:`GPUSpec.sustained_flops`); HBM bandwidth is
left as it is (the memory clock is not what the power limit lowers first, and
the measured profile's decode times are unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from twin._check import check_keys, entry, nonneg_float, positive_float
from twin.errors import SpecError, UnitError, UnknownNameError
from twin.perf.catalogs import read_catalog
from twin.units import parse_bandwidth, parse_bytes, parse_flops

GiB = 2**30


def _clock(v: object, where: str) -> float:
    f = positive_float(v, where)
    if f > 1.0:
        raise SpecError(f"{where}: {v!r} must be a share of the clock in (0, 1]")
    return f


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator.

    ``flops_bf16``: dense (no sparsity) BF16 tensor FLOP/s. ``hbm_bytes_s``:
    device-memory bandwidth, bytes/s. ``memory_bytes``: device memory, bytes.
    ``tdp_w``: board power limit, W. ``nvlink_bytes_s``: GPU-to-GPU bandwidth
    per GPU per direction, bytes/s (0 when the GPU has none).
    ``pcie_bytes_s``: host-link bandwidth per direction, bytes/s.
    ``sustained_clock``: the share of the datasheet tensor-core clock the GPU
    sustains under its power limit, in (0, 1]; 1 for a GPU at its rated power.
    ``flops_fp8``: dense (no sparsity) FP8 tensor FLOP/s; 0 for a GPU whose tensor
    cores have no FP8 (A100: FP8 weights are widened to BF16 and run at ``flops_bf16``).
    """

    name: str
    flops_bf16: float
    hbm_bytes_s: float
    memory_bytes: float
    tdp_w: float
    nvlink_bytes_s: float
    pcie_bytes_s: float
    sustained_clock: float = 1.0
    flops_fp8: float = 0.0

    def __post_init__(self) -> None:
        where = f"gpu {self.name!r}"
        for field in ("flops_bf16", "hbm_bytes_s", "memory_bytes", "tdp_w", "pcie_bytes_s"):
            positive_float(getattr(self, field), f"{where}: {field}")
        nonneg_float(self.nvlink_bytes_s, f"{where}: nvlink_bytes_s")
        nonneg_float(self.flops_fp8, f"{where}: flops_fp8")
        _clock(self.sustained_clock, f"{where}: sustained_clock")

    @property
    def sustained_flops(self) -> float:
        """Dense BF16 FLOP/s at the sustained clock: ``flops_bf16 x sustained_clock``."""
        return self.flops_bf16 * self.sustained_clock

    @property
    def sustained_flops_fp8(self) -> float:
        """Dense FP8 FLOP/s at the sustained clock; the BF16 figure without FP8 tensor cores."""
        return (self.flops_fp8 or self.flops_bf16) * self.sustained_clock


def _catalog_gpu(name: str, spec: Mapping[str, float]) -> GPUSpec:
    try:
        return GPUSpec(name, **spec)
    except TypeError as e:
        raise SpecError(f"twin/data/gpus/{name}.json: spec: {e}") from None


# The catalog: one data file per GPU (twin/data/gpus/<name>.json, read and checked by
# twin.perf.catalogs), each value cited there (the vendor datasheet; NVLink / Infinity
# Fabric per direction, half the quoted bidirectional total; PCIe per direction).
_FILES = read_catalog("gpus")
GPUS: Mapping[str, GPUSpec] = MappingProxyType(
    {k: _catalog_gpu(k, d["spec"]) for k, d in _FILES.items()}
)
_ALIASES: Mapping[str, str] = MappingProxyType(
    {a: k for k, d in _FILES.items() for a in d.get("aliases", ())}
)

_FIELDS = ("name", "flops_bf16", "hbm_bytes_s", "memory_bytes", "tdp_w")
_OPTIONAL = ("nvlink_bytes_s", "pcie_bytes_s", "sustained_clock", "flops_fp8")


def _quantity(parse, value: object, where: str) -> float:  # type: ignore[no-untyped-def]
    try:
        return float(parse(value))
    except UnitError as e:
        raise SpecError(f"{where}: {e}") from None


def _watts(value: object, where: str) -> float:
    if isinstance(value, str) and value.strip().endswith("W"):
        value = value.strip()[:-1].strip()
        try:
            value = float(value)
        except ValueError:
            raise SpecError(f"{where}: {value!r} is not a power; expected e.g. '700 W'") from None
    return positive_float(value, where)


def get_gpu(name_or_mapping: str | Mapping[str, object], where: str = "") -> GPUSpec:
    """A catalog GPU by name (case-insensitive; ``h100`` = ``h100-80gb`` = ``h100-sxm``),
    or a user GPU from an inline mapping with ``name, flops_bf16, hbm_bytes_s,
    memory_bytes, tdp_w`` and optional ``nvlink_bytes_s`` (default 0),
    ``pcie_bytes_s`` (default 32 GB/s), ``sustained_clock`` (default 1, the
    share of the tensor clock held under the power limit) and ``flops_fp8``
    (default 0: no FP8 tensor cores). ``where`` prefixes
    error messages.

    Raises :class:`UnknownNameError` for an unknown name and :class:`SpecError`
    for a malformed mapping.
    """
    if isinstance(name_or_mapping, str):
        key = name_or_mapping.strip().lower()
        key = _ALIASES.get(key, key)
        if key not in GPUS:
            raise UnknownNameError("gpu", name_or_mapping, GPUS)
        return GPUS[key]
    if not isinstance(name_or_mapping, Mapping):
        raise SpecError(f"{where or 'gpu'}: {name_or_mapping!r} is not a GPU name or mapping")
    m = name_or_mapping
    check_keys(m, where or "gpu", _FIELDS, _OPTIONAL)
    if not isinstance(m["name"], str) or not m["name"]:
        raise SpecError(f"{entry(where, 'name')}: {m['name']!r} must be a non-empty string")
    flops = positive_float(_quantity(parse_flops, m["flops_bf16"], entry(where, "flops_bf16")),
                           entry(where, "flops_bf16"))  # fmt: skip
    hbm = positive_float(
        _quantity(parse_bandwidth, m["hbm_bytes_s"], entry(where, "hbm_bytes_s")),
        entry(where, "hbm_bytes_s"),
    )
    mem = positive_float(
        _quantity(parse_bytes, m["memory_bytes"], entry(where, "memory_bytes")),
        entry(where, "memory_bytes"),
    )
    nvl = nonneg_float(
        _quantity(parse_bandwidth, m.get("nvlink_bytes_s", 0), entry(where, "nvlink_bytes_s")),
        entry(where, "nvlink_bytes_s"),
    )
    pcie = positive_float(
        _quantity(parse_bandwidth, m.get("pcie_bytes_s", 32e9), entry(where, "pcie_bytes_s")),
        entry(where, "pcie_bytes_s"),
    )
    clock = _clock(m.get("sustained_clock", 1.0), entry(where, "sustained_clock"))
    tdp = _watts(m["tdp_w"], entry(where, "tdp_w"))
    fp8 = nonneg_float(_quantity(parse_flops, m.get("flops_fp8", 0), entry(where, "flops_fp8")),
                       entry(where, "flops_fp8"))  # fmt: skip
    return GPUSpec(m["name"], flops, hbm, mem, tdp, nvl, pcie, clock, fp8)


def gpu_names() -> list[str]:
    """Catalog names, sorted."""
    return sorted(GPUS)
