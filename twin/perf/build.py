"""The ``perf:`` section of a spec -> a :class:`~twin.perf.iteration.PerfModel`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from twin.errors import SpecError, UnitError
from twin.perf.gpus import GPUSpec
from twin.perf.iteration import PerfModel
from twin.perf.llm import ModelSpec
from twin.perf.roofline import DEFAULT_ENGINE, ENGINE_OVERHEADS, Roofline, engine_overheads
from twin.perf.tables import DistServeFit, ProfileTable
from twin.units import parse_duration

_ROOFLINE_KEYS = ("kind", "mfu", "mbu", "attn_mfu", "overhead", "layer_overhead",
                  "seq_overhead", "seq_shard_overhead", "hop_latency", "tp_mfu_exponent",
                  "act_traffic", "no_overlap", "throttle", "throttle_knee", "engine")  # fmt: skip
_PROFILE_KEYS = ("kind", "path", "format", "model", "hardware", "tp")
_DISTSERVE_KEYS = ("kind", "path", "model", "tp")
_KINDS = {"roofline": _ROOFLINE_KEYS, "profile": _PROFILE_KEYS, "distserve": _DISTSERVE_KEYS}


def build_perf_model(
    spec: Mapping[str, object] | None,
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int,
    pp: int = 1,
    where: str = "",
    base_dir: Path | None = None,
) -> PerfModel:
    """A perf model from a YAML mapping; ``None`` is the calibrated Roofline.

    ``{kind: roofline, engine: distserve|splitwise-sim, mfu: 0.5, mbu: 0.8, attn_mfu: 0.3,
    overhead: "4 ms", layer_overhead, seq_overhead, seq_shard_overhead,
    hop_latency, tp_mfu_exponent, act_traffic, no_overlap, throttle,
    throttle_knee}`` (durations with
    units; unset efficiencies default per GPU, unset software terms to the
    ``engine`` preset, itself ``distserve`` by default);
    ``{kind: profile, path, format: splitwise|native, model, hardware, tp}``
    (``model``/``hardware``/``tp`` select splitwise rows and default to the
    instance's model name, GPU name and TP); ``{kind: distserve, path, model,
    tp}``. Relative paths resolve against ``base_dir``. ``where`` prefixes
    error messages (``"spec.yaml: perf"``).
    """
    w = where or "perf"
    if spec is None:
        return Roofline(model, gpu, tp, pp)
    if not isinstance(spec, Mapping):
        raise SpecError(f"{w}: {spec!r} must be a mapping with a 'kind'")
    kind = spec.get("kind")
    if kind not in _KINDS:
        raise SpecError(f"{w}.kind: {kind!r}; expected one of {', '.join(_KINDS)}")
    allowed = _KINDS[kind]
    for key in spec:
        if key not in allowed:
            raise SpecError(
                f"{w}: unknown key {key!r} for kind {kind}; expected one of {', '.join(allowed)}"
            )
    if kind == "roofline":
        kw: dict[str, float] = {}
        engine = spec.get("engine", DEFAULT_ENGINE)
        if not isinstance(engine, str):
            known = ", ".join(ENGINE_OVERHEADS)
            raise SpecError(f"{w}.engine: {engine!r}; expected one of {known}")
        engine_overheads(engine)  # UnknownNameError (with suggestions) for a misspelled name
        for key in ("mfu", "mbu", "attn_mfu"):
            if key in spec:
                v = spec[key]
                if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
                    raise SpecError(f"{w}.{key}: {v!r} must be a number in (0, 1]")
                kw[key] = float(v)
        if "tp_mfu_exponent" in spec:
            v = spec["tp_mfu_exponent"]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 2:
                raise SpecError(f"{w}.tp_mfu_exponent: {v!r} must be a number in [0, 2]")
            kw["tp_mfu_exponent"] = float(v)
        if "act_traffic" in spec:
            v = spec["act_traffic"]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1e4:
                raise SpecError(f"{w}.act_traffic: {v!r} must be a number in [0, 10000)")
            kw["act_traffic"] = float(v)
        if "throttle" in spec:
            v = spec["throttle"]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 10:
                raise SpecError(f"{w}.throttle: {v!r} must be a number in [0, 10]")
            kw["throttle"] = float(v)
        if "no_overlap" in spec:
            v = spec["no_overlap"]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
                raise SpecError(f"{w}.no_overlap: {v!r} must be a number in [0, 1]")
            kw["no_overlap"] = float(v)
        for key in ("overhead", "layer_overhead", "seq_overhead", "seq_shard_overhead",
                    "hop_latency", "throttle_knee"):  # fmt: skip
            if key in spec:
                try:
                    kw[f"{key}_s"] = parse_duration(spec[key])
                except UnitError as e:
                    raise SpecError(f"{w}.{key}: {e}") from None
                if kw[f"{key}_s"] < 0:
                    raise SpecError(f"{w}.{key}: {spec[key]!r} must be >= 0")
        return Roofline(model, gpu, tp, pp, engine=engine, **kw)
    if "path" not in spec or not isinstance(spec["path"], str):
        raise SpecError(f"{w}.path: {spec.get('path')!r}; expected a file path")
    path = Path(spec["path"])
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise SpecError(f"{w}.path: {str(path)!r} is not a file")
    sel_tp = spec.get("tp", tp)
    if isinstance(sel_tp, bool) or not isinstance(sel_tp, int) or sel_tp < 1:
        raise SpecError(f"{w}.tp: {sel_tp!r} must be a positive integer")
    if kind == "distserve":
        name = spec.get("model", model.name)
        return DistServeFit.from_json(path, str(name), sel_tp, where=f"{w}: {path}")
    fmt = spec.get("format", "auto")
    if fmt == "auto":
        head = path.open("rb").readline()
        fmt = "splitwise" if b"tensor_parallel" in head else "native"
    if fmt == "native":
        return ProfileTable.from_native(path, where=f"{w}: {path}")
    if fmt == "splitwise":
        return ProfileTable.from_splitwise(
            path,
            str(spec.get("model", model.name)),
            str(spec.get("hardware", gpu.name)),
            sel_tp,
            where=f"{w}: {path}",
        )
    raise SpecError(f"{w}.format: {fmt!r}; expected one of splitwise, native")
