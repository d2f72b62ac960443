"""Experiment specs: YAML in, a validated, fully resolved spec out.

A spec names the model, the GPU, the cluster shape, the engine policy, the
performance model, the scheduler, the workload, the SLOs and the seed. Every
value left out takes the documented default, and the *resolved* spec (defaults
filled in) is what results carry in their header, with its sha256, so a run
can be repeated from its output alone. See README.md, "Experiment spec".
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from twin import yamlio
from twin._check import check_keys, positive_int
from twin.bundled import bundled_names, bundled_text
from twin.errors import SpecError, UnitError, UnknownNameError
from twin.perf.gpus import GPUSpec, get_gpu
from twin.perf.llm import ModelSpec, get_model
from twin.serving.engine import EngineConfig
from twin.serving.handoff import TransferConfig
from twin.sim.metrics import SLO
from twin.units import parse_bytes, parse_duration
from twin.workload.stream import WorkloadSpec

TOP_KEYS = (
    "name",
    "description",
    "seed",
    "model",
    "gpu",
    "cluster",
    "engine",
    "perf",
    "scheduler",
    "workload",
    "slo",
    "transfer",
)
CLUSTER_KEYS = (
    "instances",
    "gpus",
    "tp",
    "pp",
    "gpus_per_node",
    "topology",
    "nodes",
    "prefill",
    "decode",
    "placement",
    "kv_pool",
)
GROUP_KEYS = ("instances", "tp", "pp")
PLACEMENTS = ("packed", "interleaved")
TRANSFER_KEYS = ("mode", "handoff", "multi_nic")
ENGINE_DEFAULTS: dict[str, Any] = {
    "block_size": 16,
    "max_num_seqs": 256,
    "max_batched_tokens": None,  # 8192, or 2048 with chunked_prefill
    "chunked_prefill": False,
    "watermark": 0.01,
    "gpu_memory_utilization": 0.9,
    "activation_reserve": "2 GiB",
    "oversized": "error",
    "fast_forward": True,
    "prefix_caching": False,
}
OVERSIZED = ("error", "reject")
SLO_KEYS = ("ttft", "tpot", "target", "ttft_at")


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """``count`` instances of one role with the same parallelism."""

    role: str
    count: int
    tp: int
    pp: int


@dataclass(frozen=True)
class ExperimentSpec:
    """A validated experiment. ``resolved`` is the plain-data form with every
    default filled in; ``source`` is where it was read from (for messages)."""

    name: str
    seed: int
    model: ModelSpec
    gpu: GPUSpec
    instances: int
    tp: int
    pp: int
    gpus_per_node: int
    groups: tuple[InstanceGroup, ...]
    topology: Any  # a twin.net.topology.Topology, or None: nodes of gpus_per_node GPUs, no network
    placement: str
    kv_pool_bytes: float | None  # host-memory KV pool per node (Mooncake's store), or None
    transfer: TransferConfig
    engine: EngineConfig
    memory_utilization: float
    activation_reserve_bytes: float
    oversized: str
    perf: Mapping[str, Any] | None
    scheduler: str
    scheduler_params: Mapping[str, Any]
    workload: WorkloadSpec
    slo: SLO
    ttft_at: str
    source: str
    base_dir: Path
    resolved: Mapping[str, Any] = field(repr=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(canonical_json(self.resolved).encode()).hexdigest()


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


# -- finding and reading specs -------------------------------------------------------
def read_spec_text(spec: str) -> tuple[str, str, Path]:
    """``(text, display name, base dir)`` of a spec given as a path or a bundled name."""
    path = Path(spec)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise SpecError(f"{spec}: no such experiment spec file")
        return path.read_text(encoding="utf-8"), str(path), path.resolve().parent
    names = bundled_names("experiments")
    if spec not in names:
        raise UnknownNameError("experiment", spec, names)
    return bundled_text("experiments", spec), f"{spec}.yaml", Path.cwd()


def parse_yaml(text: str, where: str) -> dict[str, Any]:
    data = yamlio.load_text(text, where)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{where}: the spec must be a mapping of keys, not {type(data).__name__}")
    return data


def read_spec(spec: str) -> tuple[dict[str, Any], str, Path]:
    """A spec file or bundled experiment as plain data, unresolved: ``(data, the
    name errors give it, the folder its relative paths start from)``; what a
    sweep, a goodput search or a comparison takes."""
    text, where, base_dir = read_spec_text(spec)
    return parse_yaml(text, where), where, base_dir


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], where: str = "--set") -> None:
    """Apply ``key.path=value`` overrides in place; the value is parsed as YAML."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"{where} {item!r}: expected key.path=value")
        try:
            value = yamlio.load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        parts = key.strip().split(".")
        node: Any = data
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif isinstance(nxt, str) and part == "scheduler":
                nxt = node[part] = {"name": nxt}
            elif not isinstance(nxt, dict):
                raise SpecError(
                    f"{where} {item!r}: {'.'.join(parts[: i + 1])} is {nxt!r}, not a mapping"
                )
            node = nxt
        node[parts[-1]] = value


def load_spec(spec: str = "quickstart", overrides: Sequence[str] = ()) -> ExperimentSpec:
    """Read, override, validate and resolve an experiment spec."""
    text, where, base_dir = read_spec_text(spec)
    data = parse_yaml(text, where)
    apply_overrides(data, overrides)
    return resolve_spec(data, where, base_dir)


# -- validation ----------------------------------------------------------------------
def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: {value!r} must be a mapping")
    return value


def _check_keys(m: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    check_keys(m, where, (), allowed)


def _fraction(value: Any, where: str, *, closed: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{where}: {value!r} must be a number in (0, 1]")
    v = float(value)
    if not (0.0 < v <= 1.0) if closed else not (0.0 <= v < 1.0):
        raise SpecError(f"{where}: {value!r} must be in {'(0, 1]' if closed else '[0, 1)'}")
    return v


def _duration(value: Any, where: str) -> float:
    try:
        v = parse_duration(value)
    except UnitError as e:
        raise SpecError(f"{where}: {e}") from None
    if v <= 0:
        raise SpecError(f"{where}: {value!r} must be > 0")
    return v


def _group(value: Any, role: str, tp: int, pp: int, where: str) -> InstanceGroup:
    if isinstance(value, int) and not isinstance(value, bool):
        return InstanceGroup(role, positive_int(value, where), tp, pp)
    m = _mapping(value, where)
    _check_keys(m, GROUP_KEYS, where)
    return InstanceGroup(
        role,
        positive_int(m.get("instances", 1), f"{where}.instances"),
        positive_int(m.get("tp", tp), f"{where}.tp"),
        positive_int(m.get("pp", pp), f"{where}.pp"),
    )


def _cluster(cl: Mapping[str, Any], where: str) -> tuple[tuple[InstanceGroup, ...], int, int, dict]:
    """Instance groups (prefill first, then decode, then mixed), default tp/pp, resolved form."""
    tp = positive_int(cl.get("tp", 1), f"{where}.tp")
    pp = positive_int(cl.get("pp", 1), f"{where}.pp")
    if "instances" in cl and "gpus" in cl:
        raise SpecError(f"{where}: give instances or gpus, not both")
    groups: list[InstanceGroup] = []
    for role in ("prefill", "decode"):
        if role in cl:
            groups.append(_group(cl[role], role, tp, pp, f"{where}.{role}"))
    if ("prefill" in cl) != ("decode" in cl):
        missing = "decode" if "prefill" in cl else "prefill"
        raise SpecError(f"{where}.{missing}: missing; a split cluster needs both roles")
    if "gpus" in cl:
        gpus = positive_int(cl["gpus"], f"{where}.gpus")
        if gpus % (tp * pp):
            raise SpecError(f"{where}.gpus: {gpus} is not a multiple of tp x pp = {tp * pp}")
        groups.append(InstanceGroup("mixed", gpus // (tp * pp), tp, pp))
    elif "instances" in cl or not groups:
        groups.append(
            InstanceGroup(
                "mixed", positive_int(cl.get("instances", 1), f"{where}.instances"), tp, pp
            )
        )
    out: dict[str, Any] = {
        "instances": sum(g.count for g in groups),
        "tp": tp,
        "pp": pp,
        "groups": [{"role": g.role, "instances": g.count, "tp": g.tp, "pp": g.pp} for g in groups],
    }
    return tuple(groups), tp, pp, out


def resolve_spec(data: Mapping[str, Any], where: str, base_dir: Path) -> ExperimentSpec:
    """Validate ``data`` (a parsed YAML mapping) into an :class:`ExperimentSpec`."""
    data = copy.deepcopy(dict(data))
    _check_keys(data, TOP_KEYS, where)
    out: dict[str, Any] = {}

    name = str(data.get("name", Path(where).stem))
    out["name"] = name
    if "description" in data:
        out["description"] = str(data["description"])
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpecError(f"{where}: seed: {seed!r} must be a non-negative integer")
    out["seed"] = seed

    if "model" not in data:
        raise SpecError(f"{where}: model: missing; name a catalog model or give its shapes")
    model = get_model(data["model"], where=f"{where}: model")
    out["model"] = data["model"]
    gpu = get_gpu(data.get("gpu", "h100-sxm"), where=f"{where}: gpu")
    out["gpu"] = data.get("gpu", "h100-sxm")

    cl = _mapping(data.get("cluster"), f"{where}: cluster")
    _check_keys(cl, CLUSTER_KEYS, f"{where}: cluster")
    groups, tp, pp, cluster_out = _cluster(cl, f"{where}: cluster")
    topology = None
    if "topology" in cl:
        from twin.net.topology import load_topology

        nodes = cl.get("nodes")
        if nodes is not None:
            nodes = positive_int(nodes, f"{where}: cluster.nodes")
        topology = load_topology(
            cl["topology"], nodes=nodes, where=f"{where}: cluster.topology", base_dir=base_dir
        )
        cluster_out["topology"] = cl["topology"]
        if nodes is not None:
            cluster_out["nodes"] = nodes
    elif "nodes" in cl:
        raise SpecError(f"{where}: cluster.nodes: scales a topology; give cluster.topology too")
    elif any(g.role != "mixed" for g in groups):
        raise SpecError(
            f"{where}: cluster.topology: missing; prefill and decode instances need one, "
            "since the KV cache travels between them (e.g. topology: dgx-h100-ib400)"
        )
    per_node = positive_int(cl.get("gpus_per_node", 8), f"{where}: cluster.gpus_per_node")
    kv_pool = None
    if "kv_pool" in cl:
        if topology is None:
            raise SpecError(
                f"{where}: cluster.kv_pool: needs cluster.topology (pools sit on nodes)"
            )
        try:
            kv_pool = parse_bytes(cl["kv_pool"])
        except UnitError as e:
            raise SpecError(f"{where}: cluster.kv_pool: {e}") from None
        if kv_pool <= 0:
            raise SpecError(f"{where}: cluster.kv_pool: {cl['kv_pool']!r} must be > 0")
        cluster_out["kv_pool"] = cl["kv_pool"]
    placement = cl.get("placement", "packed")
    if placement not in PLACEMENTS:
        raise SpecError(
            f"{where}: cluster.placement: {placement!r}; expected one of {', '.join(PLACEMENTS)}"
        )
    cluster_out.update(gpus_per_node=per_node, placement=placement)
    if topology is not None:
        types = sorted({topology.gpu_type(i) for i in range(len(topology.gpus))})
        if "gpu" in data:
            if [gpu.name] != [get_gpu(t).name for t in types]:
                raise SpecError(
                    f"{where}: gpu: {data['gpu']!r}, but topology {topology.name!r} has "
                    f"{', '.join(types)}; with a topology, leave gpu out"
                )
        else:
            gpu = get_gpu(types[0])
            out["gpu"] = types[0] if len(types) == 1 else " + ".join(types)
    instances = sum(g.count for g in groups)
    out["cluster"] = cluster_out

    tr = _mapping(data.get("transfer"), f"{where}: transfer")
    _check_keys(tr, TRANSFER_KEYS, f"{where}: transfer")
    try:
        transfer = TransferConfig(**tr)
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None
    if not isinstance(transfer.multi_nic, bool):
        raise SpecError(
            f"{where}: transfer.multi_nic: {transfer.multi_nic!r} must be true or false"
        )
    out["transfer"] = {
        "mode": transfer.mode,
        "handoff": transfer.handoff,
        "multi_nic": transfer.multi_nic,
    }

    eng = {**ENGINE_DEFAULTS, **_mapping(data.get("engine"), f"{where}: engine")}
    _check_keys(eng, tuple(ENGINE_DEFAULTS), f"{where}: engine")
    for key in ("fast_forward", "prefix_caching"):
        if not isinstance(eng[key], bool):
            raise SpecError(f"{where}: engine.{key}: {eng[key]!r} must be true or false")
    if not isinstance(eng["chunked_prefill"], bool):
        raise SpecError(
            f"{where}: engine.chunked_prefill: {eng['chunked_prefill']!r} must be true or false"
        )
    if eng["max_batched_tokens"] is None:
        eng["max_batched_tokens"] = 2048 if eng["chunked_prefill"] else 8192
    for key in ("block_size", "max_num_seqs", "max_batched_tokens"):
        positive_int(eng[key], f"{where}: engine.{key}")
    watermark = _fraction(eng["watermark"], f"{where}: engine.watermark", closed=False)
    util = _fraction(eng["gpu_memory_utilization"], f"{where}: engine.gpu_memory_utilization")
    try:
        reserve = parse_bytes(eng["activation_reserve"])
    except UnitError as e:
        raise SpecError(f"{where}: engine.activation_reserve: {e}") from None
    if reserve < 0:
        raise SpecError(
            f"{where}: engine.activation_reserve: {eng['activation_reserve']!r} must be >= 0"
        )
    if eng["oversized"] not in OVERSIZED:
        raise SpecError(
            f"{where}: engine.oversized: {eng['oversized']!r}; "
            f"expected one of {', '.join(OVERSIZED)}"
        )
    engine = EngineConfig(
        block_size=eng["block_size"],
        max_num_seqs=eng["max_num_seqs"],
        max_batched_tokens=eng["max_batched_tokens"],
        chunked_prefill=eng["chunked_prefill"],
        watermark=watermark,
        fast_forward=eng["fast_forward"],
        prefix_caching=eng["prefix_caching"],
    )
    out["engine"] = eng

    perf = data.get("perf")
    if perf is not None:
        perf = _mapping(perf, f"{where}: perf")
    out["perf"] = perf if perf is not None else {"kind": "roofline"}

    sched = data.get("scheduler", "colocated")
    if isinstance(sched, str):
        sched = {"name": sched}
    sched = _mapping(sched, f"{where}: scheduler")
    sched_name = sched.get("name", "colocated")
    if not isinstance(sched_name, str):
        raise SpecError(f"{where}: scheduler.name: {sched_name!r} must be a string")
    params = {k: v for k, v in sched.items() if k != "name"}
    out["scheduler"] = {"name": sched_name, **params}

    wl_data = data.get("workload")
    if wl_data is None:
        raise SpecError(f"{where}: workload: missing; give a trace or synthetic lengths")
    workload = WorkloadSpec.from_mapping(
        _mapping(wl_data, f"{where}: workload"), where=f"{where}: workload", base_dir=base_dir
    )
    out["workload"] = wl_data

    slo_data = _mapping(data.get("slo"), f"{where}: slo")
    _check_keys(slo_data, SLO_KEYS, f"{where}: slo")
    ttft = _duration(slo_data["ttft"], f"{where}: slo.ttft") if "ttft" in slo_data else float("inf")
    tpot = _duration(slo_data["tpot"], f"{where}: slo.tpot") if "tpot" in slo_data else float("inf")
    target = _fraction(slo_data.get("target", 0.9), f"{where}: slo.target")
    ttft_at = slo_data.get("ttft_at", "decode")
    if ttft_at not in ("decode", "prefill"):
        raise SpecError(f"{where}: slo.ttft_at: {ttft_at!r}; expected one of decode, prefill")
    out["slo"] = {
        "ttft": slo_data.get("ttft"),
        "tpot": slo_data.get("tpot"),
        "target": target,
        "ttft_at": ttft_at,
    }

    return ExperimentSpec(
        name=name,
        seed=seed,
        model=model,
        gpu=gpu,
        instances=instances,
        tp=tp,
        pp=pp,
        gpus_per_node=per_node,
        groups=groups,
        topology=topology,
        placement=placement,
        kv_pool_bytes=kv_pool,
        transfer=transfer,
        engine=engine,
        memory_utilization=util,
        activation_reserve_bytes=reserve,
        oversized=eng["oversized"],
        perf=perf,
        scheduler=sched_name,
        scheduler_params=params,
        workload=workload,
        slo=SLO(ttft_s=ttft, tpot_s=tpot, target=target),
        ttft_at=ttft_at,
        source=where,
        base_dir=base_dir,
        resolved=out,
    )
