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
from twin.units import parse_bandwidth, parse_bytes, parse_flops

GiB = 2**30

# The sustained tensor-clock share of the 490 W H100 (see its entry in GPUS).
PCAP_SUSTAINED_CLOCK = 0.638


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


# Dense BF16 (and FP8) peaks and bandwidths from each vendor datasheet (named per entry).
# NVLink / Infinity Fabric is given per direction: half the quoted bidirectional
# total. PCIe per direction: Gen4 x16 = 32 GB/s, Gen5 x16 = 64 GB/s.
GPUS: Mapping[str, GPUSpec] = MappingProxyType(
    {
        # NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB): 312 TFLOPS BF16, 1,555 GB/s,
        # 400 W, NVLink 600 GB/s bidirectional, PCIe Gen4
        "a100-40gb": GPUSpec("a100-40gb", 312e12, 1555e9, 40 * GiB, 400.0, 300e9, 32e9),
        # NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOPS BF16, 2,039 GB/s, 400 W
        "a100-80gb": GPUSpec("a100-80gb", 312e12, 2039e9, 80 * GiB, 400.0, 300e9, 32e9),
        # NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989 TFLOPS BF16 dense (1,979 with
        # sparsity), 1,979 TFLOPS FP8 dense, 3.35 TB/s, 700 W, NVLink 900 GB/s bidirectional,
        # PCIe Gen5
        "h100-sxm": GPUSpec(
            "h100-sxm", 989e12, 3.35e12, 80 * GiB, 700.0, 450e9, 64e9, flops_fp8=1979e12
        ),
        # Same silicon power-capped as in Splitwise (splitwise-sim dgx-h100-pcap.yaml:
        # 7,140 W per 8-GPU server vs 10,200 W, i.e. 70%): 0.7 x 700 W = 490 W. Peaks and
        # bandwidths are the H100's; the cap lowers the sustained tensor clock, HBM is kept.
        # sustained_clock = PCAP_SUSTAINED_CLOCK, fitted by twin.perf.calibrate.fit_weighted
        # (sustained_clock@h100-80gb-pcap, jointly with the Roofline defaults; fit_clock, the
        # others held, gives 0.55 on the grid alone) to splitwise-sim
        # perf_model.csv's h100-80gb-pcap
        # rows (llama2-70b TP 2/4/8, bloom-176b TP 8): there every prompt_time is 1.30x the
        # h100-80gb row's and every token_time equal to it, Splitwise's (ISCA'24, section III,
        # power capping) finding that a cap slows the compute-bound prompt phase and leaves the
        # memory-bound token phase almost untouched.
        "h100-80gb-pcap": GPUSpec(
            "h100-80gb-pcap",
            989e12,
            3.35e12,
            80 * GiB,
            490.0,
            450e9,
            64e9,
            PCAP_SUSTAINED_CLOCK,
            1979e12,
        ),
        # NVIDIA H800 SXM5 (the H100's export variant, DeepSeek's serving GPU): the H100
        # SXM5's 989 TFLOPS BF16 dense, 3.35 TB/s and 80 GB, 700 W, with NVLink cut to
        # 400 GB/s bidirectional (DeepSeek-V3 technical report, arXiv 2412.19437, section
        # 3.2.2: "NVLink ... 160 GB/s" achieved of it; NVIDIA H800 product brief); FP8 as the
        # H100 SXM5's, 1,979 TFLOPS dense
        "h800": GPUSpec("h800", 989e12, 3.35e12, 80 * GiB, 700.0, 200e9, 64e9, flops_fp8=1979e12),
        # NVIDIA H200 Tensor Core GPU datasheet (SXM): 989 TFLOPS BF16 dense, 4.8 TB/s,
        # 141 GB, 700 W, NVLink 900 GB/s bidirectional, 1,979 TFLOPS FP8 dense
        "h200": GPUSpec("h200", 989e12, 4.8e12, 141e9, 700.0, 450e9, 64e9, flops_fp8=1979e12),
        # NVIDIA DGX B200 / HGX B200 datasheet: 2.25 PFLOPS BF16 dense per GPU, 8 TB/s,
        # 180 GB, 1,000 W, NVLink 5 1.8 TB/s bidirectional, 4.5 PFLOPS FP8 dense
        "b200": GPUSpec("b200", 2.25e15, 8e12, 180e9, 1000.0, 900e9, 64e9, flops_fp8=4.5e15),
        # NVIDIA L40S datasheet: 362.05 TFLOPS BF16 dense, 864 GB/s GDDR6, 48 GB, 350 W,
        # no NVLink, PCIe Gen4 x16; 733 TFLOPS FP8 dense (1,466 with sparsity)
        "l40s": GPUSpec("l40s", 362.05e12, 864e9, 48 * GiB, 350.0, 0.0, 32e9, flops_fp8=733e12),
        # AMD Instinct MI300X datasheet: 1,307.4 TFLOPS BF16 dense, 5.3 TB/s, 192 GB HBM3,
        # 750 W, Infinity Fabric 896 GB/s peer aggregate (bidirectional), PCIe Gen5;
        # 2,614.9 TFLOPS FP8 dense
        "mi300x": GPUSpec(
            "mi300x", 1307.4e12, 5.3e12, 192 * GiB, 750.0, 448e9, 64e9, flops_fp8=2614.9e12
        ),
    }
)

_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "a100": "a100-80gb",
        "a100-80g": "a100-80gb",
        "a100-sxm-80gb": "a100-80gb",
        "a100-40g": "a100-40gb",
        "h100": "h100-sxm",
        "h100-80gb": "h100-sxm",
        "h100-sxm5": "h100-sxm",
        "h100-pcap": "h100-80gb-pcap",
        "h200-sxm": "h200",
        "h800-sxm": "h800",
        "h200-141gb": "h200",
        "l40s-48gb": "l40s",
        "mi300": "mi300x",
    }
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
