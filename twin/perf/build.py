"""The ``perf:`` section of a spec -> a :class:`~twin.perf.iteration.PerfModel`.

Each kind of performance model declares its keys once (:class:`RooflineKeys`,
:class:`ProfileKeys`, :class:`DistServeKeys`); :func:`read_perf` checks a
``perf:`` mapping against them when the spec is loaded, and
:func:`build_perf_model` builds the model for one instance shape when the
simulation is (a profile table is read then).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twin._declare import (
    FRACTION,
    NONNEG_INT,
    POSITIVE_INT,
    TEXT,
    anything,
    choice,
    declared,
    interval,
    keys,
    read,
    schema,
    seconds,
    string,
)
from twin.bundled import spec_file
from twin.errors import SpecError, UnknownNameError
from twin.perf.gpus import GPUSpec
from twin.perf.iteration import PerfModel
from twin.perf.llm import ModelSpec
from twin.perf.moe import DISPATCH_DTYPES, MOE_OVERLAPS
from twin.perf.presets import DEFAULT_ENGINE, ENGINE_OVERHEADS
from twin.perf.residuals import read_residuals
from twin.perf.roofline import Roofline
from twin.perf.tables import (
    DISTSERVE_OVERHEAD_S,
    DISTSERVE_PREFILL_OVERHEAD_S,
    DISTSERVE_TOKEN_OVERHEAD_S,
    DistServeFit,
    ProfileTable,
)


def _engine(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise SpecError(f"{where}: {value!r}; expected one of {', '.join(ENGINE_OVERHEADS)}")
    if value not in ENGINE_OVERHEADS:  # a misspelled name: suggest the close ones
        raise UnknownNameError("serving engine", value, ENGINE_OVERHEADS, where=where)
    return value


_PATH = string("; expected a file path")
_AT_LEAST_0 = seconds(positive=False)


@dataclass(frozen=True)
class RooflineKeys:
    """``perf: {kind: roofline, ...}``: the analytical model; unset efficiencies
    default per GPU, unset software terms to the ``engine`` preset."""

    kind: str = declared("roofline", choice("roofline"), "roofline")
    mfu: float | None = declared(None, FRACTION, "GEMM compute efficiency (default: per GPU)")
    mbu: float | None = declared(None, FRACTION, "HBM bandwidth efficiency (default: per GPU)")
    attn_mfu: float | None = declared(
        None, FRACTION, "attention compute efficiency (default: per GPU)"
    )
    overhead_s: float | None = declared(
        None, _AT_LEAST_0, "fixed time per iteration (default: the preset)", key="overhead"
    )
    layer_overhead_s: float | None = declared(
        None, _AT_LEAST_0, "time per layer per iteration (default: the preset)",
        key="layer_overhead",
    )  # fmt: skip
    seq_overhead_s: float | None = declared(
        None, _AT_LEAST_0, "time per sequence per iteration (default: the preset)",
        key="seq_overhead",
    )  # fmt: skip
    seq_shard_overhead_s: float | None = declared(
        None, _AT_LEAST_0, "time per sequence per iteration, split by TP (default: the preset)",
        key="seq_shard_overhead",
    )  # fmt: skip
    hop_latency_s: float | None = declared(
        None, _AT_LEAST_0, "latency of one all-reduce hop (default: per GPU)", key="hop_latency"
    )
    tp_mfu_exponent: float | None = declared(
        None, interval(0, 2), "compute time grows as TP^exponent (default 0)"
    )
    act_traffic: float | None = declared(
        None, interval(0, 1e4, hi_open=True),
        "activation-sized memory passes per token per layer (default: the preset)",
    )  # fmt: skip
    no_overlap: float | None = declared(
        None, interval(0, 1),
        "share of the shorter of compute and memory time not hidden (default: the preset)",
    )  # fmt: skip
    throttle: float | None = declared(
        None, interval(0, 10),
        "compute past throttle_knee runs 1 + throttle times slower (default: per GPU)",
    )  # fmt: skip
    throttle_knee_s: float | None = declared(
        None, _AT_LEAST_0, "compute time before the throttle applies (default: per GPU)",
        key="throttle_knee",
    )  # fmt: skip
    l2_speedup: float | None = declared(
        None, interval(1, 100),
        "activation passes of tokens that fit in L2 run this many times faster (default: per GPU)",
    )  # fmt: skip
    hop_overhead_s: float | None = declared(
        None, _AT_LEAST_0, "software latency added to each all-reduce hop (default: the preset)",
        key="hop_overhead",
    )  # fmt: skip
    moe_efficiency: float | None = declared(
        None, FRACTION,
        "MoE: share of mbu the fused experts kernel reaches reading expert weights"
        " (default: the preset; 1 without one)",
    )  # fmt: skip
    expert_skew: float | None = declared(
        None, interval(0, 100),
        "MoE: the busiest GPU's routed tokens over the mean, minus 1 (default 0: uniform)",
    )  # fmt: skip
    moe_dispatch_dtype: str | None = declared(
        None, choice(*DISPATCH_DTYPES),
        "MoE under EP: the dispatch all-to-all's precision, the combine kept at the"
        " activations' (default: the activations' dtype)",
    )  # fmt: skip
    moe_overlap: str | None = declared(
        None, choice(*MOE_OVERLAPS),
        "MoE under EP: two-batch hides the all-to-alls under compute with two micro-batches"
        " (default none)",
    )  # fmt: skip
    moe_overlap_min_tokens: int | None = declared(
        None, NONNEG_INT,
        "MoE two-batch overlap: a batch of fewer new tokens per attention rank runs unsplit"
        " (default 0)",
    )  # fmt: skip
    moe_dispatch_nodes: int | None = declared(
        None, POSITIVE_INT,
        "MoE under EP across nodes: a token crosses the NICs once per node it reaches, at"
        " most this many nodes (default: each expert's copy sent on its own)",
    )  # fmt: skip
    engine: str = declared(
        DEFAULT_ENGINE,
        anything({"enum": list(ENGINE_OVERHEADS)}, _engine),
        "preset of software overheads: " + " | ".join(ENGINE_OVERHEADS),
    )


@dataclass(frozen=True)
class ProfileKeys:
    """``perf: {kind: profile, path, ...}``: measured iteration times, interpolated."""

    kind: str = declared("profile", choice("profile"), "profile")
    path: str | None = declared(
        None, _PATH, "the table (relative to the spec's folder, or data:PATH)",
        required="expected a file path",
    )  # fmt: skip
    format: str = declared(
        "auto", choice("auto", "splitwise", "native"), "auto | splitwise | native"
    )
    model: str | None = declared(None, TEXT, "splitwise rows: model (default: the spec's)")
    hardware: str | None = declared(None, TEXT, "splitwise rows: hardware (default: the GPU)")
    tp: int | None = declared(None, POSITIVE_INT, "rows of this TP (default: the instance's)")


@dataclass(frozen=True)
class DistServeKeys:
    """``perf: {kind: distserve, path, ...}``: DistServe's fitted latency model."""

    kind: str = declared("distserve", choice("distserve"), "distserve")
    path: str | None = declared(
        None, _PATH, "the profiler JSON (relative to the spec's folder, or data:PATH)",
        required="expected a file path",
    )  # fmt: skip
    model: str | None = declared(None, TEXT, "the model's entry (default: the spec's)")
    tp: int | None = declared(None, POSITIVE_INT, "the entry of this TP (default: the instance's)")
    # Defaults: simdistserve's own values (twin.perf.tables, DISTSERVE_*, where each is cited).
    overhead_s: float = declared(
        DISTSERVE_OVERHEAD_S, _AT_LEAST_0,
        "time per iteration outside the fit (default: simdistserve's 2 ms)", key="overhead",
    )  # fmt: skip
    token_overhead_s: float = declared(
        DISTSERVE_TOKEN_OVERHEAD_S, _AT_LEAST_0,
        "time per context token of the batch outside the fit (default: simdistserve's 0.1 us)",
        key="token_overhead",
    )  # fmt: skip
    prefill_overhead_s: float = declared(
        DISTSERVE_PREFILL_OVERHEAD_S, _AT_LEAST_0,
        "time per pipeline stage of a prefill iteration, times pp (default: simdistserve's 1 ms)",
        key="prefill_overhead",
    )  # fmt: skip


KINDS: dict[str, type] = {
    "roofline": RooflineKeys,
    "profile": ProfileKeys,
    "distserve": DistServeKeys,
}


RESIDUALS_SCHEMA: dict[str, Any] = {
    "description": "a residual table (path, or {path | rows, coverage}): the run's figures"
    " carry prediction intervals (twin.perf.residuals)",
    "oneOf": [{"type": "string"}, {"type": "object"}],
}


def perf_schema() -> dict[str, Any]:
    """The JSON Schema of ``perf:``: one of the kinds, each with its keys."""
    options = []
    for kind, cls in KINDS.items():
        s = schema(cls)
        s["properties"]["kind"] = {"const": kind, "description": f"the {kind} model"}
        s["required"] = ["kind", *s.get("required", [])]
        s["properties"]["residuals"] = RESIDUALS_SCHEMA
        options.append(s)
    return {"oneOf": options}


def read_perf(spec: object, where: str = "", base_dir: Path | None = None) -> Any:
    """Check a ``perf:`` mapping: its kind, its keys, their values and, for a
    table, that the file is there. Returns the kind's keys (a
    :class:`RooflineKeys`, :class:`ProfileKeys` or :class:`DistServeKeys`) with
    ``path`` resolved against ``base_dir``. ``where`` prefixes error messages
    (``"spec.yaml: perf"``)."""
    w = where or "perf"
    if not isinstance(spec, Mapping):
        raise SpecError(f"{w}: {spec!r} must be a mapping with a 'kind'")
    kind = spec.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise SpecError(f"{w}.kind: {kind!r}; expected one of {', '.join(KINDS)}")
    cls = KINDS[kind]
    if "residuals" in spec:  # any kind: checked here, read again by the run (twin.sim.intervals)
        read_residuals(spec["residuals"], f"{w}.residuals", base_dir)
        spec = {k: v for k, v in spec.items() if k != "residuals"}
    allowed = keys(cls)
    for key in spec:
        if key not in allowed:
            raise SpecError(
                f"{w}: unknown key {key!r} for kind {kind}; expected one of {', '.join(allowed)}"
            )
    perf: Any = read(cls, dict(spec), w).value
    if kind != "roofline":
        path = spec_file(perf.path, f"{w}.path", base_dir)
        if not path.is_file():
            raise SpecError(f"{w}.path: {str(path)!r} is not a file")
        perf = dataclasses.replace(perf, path=str(path))
    return perf


def build_perf_model(
    spec: Mapping[str, object] | None,
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int,
    pp: int = 1,
    where: str = "",
    base_dir: Path | None = None,
    ep: int = 1,
    dp: int = 1,
    a2a: Mapping[str, Any] | None = None,
) -> PerfModel:
    """A perf model from a YAML mapping; ``None`` is the calibrated Roofline.

    ``{kind: roofline, engine: vllm|distserve|splitwise-sim, mfu: 0.5, mbu: 0.8, attn_mfu: 0.3,
    overhead: "4 ms", layer_overhead, seq_overhead, seq_shard_overhead,
    hop_latency, tp_mfu_exponent, act_traffic, no_overlap, throttle,
    throttle_knee, l2_speedup, hop_overhead, moe_efficiency}`` (durations with
    units; unset efficiencies default per GPU, unset software terms to the
    ``engine`` preset, itself ``vllm`` by default);
    ``{kind: profile, path, format: splitwise|native, model, hardware, tp}``
    (``model``/``hardware``/``tp`` select splitwise rows and default to the
    instance's model name, GPU name and TP); ``{kind: distserve, path, model,
    tp, overhead, token_overhead, prefill_overhead}`` (the overheads default to
    simdistserve's). Every kind is built for ``pp`` pipeline stages. Relative
    paths resolve against ``base_dir``. ``where`` prefixes error messages
    (``"spec.yaml: perf"``).

    A mixture-of-experts instance with expert parallelism (``ep`` > 1, ``dp``
    data-parallel attention ranks) needs the Roofline; ``a2a`` holds the links
    its all-to-alls run on (:func:`twin.net.topology.all_to_all_links`).
    """
    w = where or "perf"
    moe: dict[str, Any] = {}
    if ep > 1 or dp > 1:
        moe = {"ep": ep, "dp": dp, **(a2a or {})}
    if spec is None:
        return Roofline(model, gpu, tp, pp, **moe)
    perf = read_perf(spec, where, base_dir)
    if isinstance(perf, RooflineKeys):
        if perf.moe_overlap_min_tokens is not None and perf.moe_overlap != "two-batch":
            raise SpecError(
                f"{w}.moe_overlap_min_tokens: {perf.moe_overlap_min_tokens!r} acts only with"
                " moe_overlap: two-batch; set it or leave the key out"
            )
        kw = {
            f.name: getattr(perf, f.name)
            for f in dataclasses.fields(perf)
            if f.name not in ("kind", "engine") and getattr(perf, f.name) is not None
        }
        return Roofline(model, gpu, tp, pp, engine=perf.engine, **kw, **moe)
    if moe:
        raise SpecError(f"{w}.kind: {perf.kind} has no expert parallelism; use kind: roofline")
    path = Path(perf.path)
    sel_tp = tp if perf.tp is None else perf.tp
    name = model.name if perf.model is None else perf.model
    if isinstance(perf, DistServeKeys):
        return DistServeFit.from_json(
            path, name, sel_tp, where=f"{w}: {path}", pp=pp, overhead_s=perf.overhead_s,
            token_overhead_s=perf.token_overhead_s, prefill_overhead_s=perf.prefill_overhead_s,
        )  # fmt: skip
    fmt = perf.format
    if fmt == "auto":
        with path.open("rb") as f:
            head = f.readline()
        fmt = "splitwise" if b"tensor_parallel" in head else "native"
    if fmt == "native":
        return ProfileTable.from_native(path, where=f"{w}: {path}", pp=pp)
    hardware = gpu.name if perf.hardware is None else perf.hardware
    return ProfileTable.from_splitwise(path, name, hardware, sel_tp, where=f"{w}: {path}", pp=pp)
