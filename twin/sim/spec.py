"""Experiment specs: YAML in, a validated, fully resolved spec out.

A spec names the model, the GPU, the cluster shape, the engine policy, the
performance model, the scheduler, the workload, the SLOs and the seed. Every
value left out takes the documented default, and the *resolved* spec (defaults
filled in) is what results carry in their header, with its sha256, so a run
can be repeated from its output alone. See README.md, "Experiment spec".

Each section is declared once, as a frozen dataclass whose fields carry their
YAML key, kind, unit, default and help (:mod:`twin._declare`): the top level
and the cluster here, ``engine:`` in :class:`~twin.serving.engine.EngineConfig`,
``transfer:`` in :class:`~twin.serving.handoff.TransferConfig`, ``slo:`` in
:class:`~twin.sim.metrics.SLO`, ``workload:`` in
:class:`~twin.workload.stream.WorkloadSpec`, ``perf:`` in
:mod:`twin.perf.build`. :func:`resolve_spec` reads each with the one generic
reader, then applies the rules that tie keys together; :func:`spec_schema` is
the JSON Schema of the same declarations (``twin spec --schema``). The
scheduler is looked up and built once and the ``perf:`` keys are checked here,
so that a bad spec fails when it is loaded.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from twin import yamlio
from twin._check import MAX_GPUS, MAX_GPUS_PER_NODE, at_most, is_int, positive_int
from twin._declare import (
    BANDWIDTH,
    NONNEG_INT,
    POSITIVE_INT,
    TEXT,
    Kind,
    anything,
    choice,
    declared,
    mapping,
    nbytes,
    one_of_schemas,
    read,
    schema,
    seconds,
    section,
    string,
)
from twin._io import read_text
from twin.bundled import bundled_names, bundled_text
from twin.errors import SpecError, UnknownNameError, UnknownSchedulerError
from twin.perf.build import perf_schema, read_perf
from twin.perf.gpus import GPUSpec, get_gpu
from twin.perf.llm import ModelSpec, get_model
from twin.scheduler import build_scheduler, scheduler_names
from twin.serving.cluster import Placement
from twin.serving.engine import EngineConfig
from twin.serving.handoff import TransferConfig
from twin.serving.kvpool import PoolSSD
from twin.serving.tiers import RemoteKeys, TierKeys
from twin.sim import fleetspec, layout
from twin.sim.faults import (
    Event,
    EventKeys,
    FailureKeys,
    RandomKeys,
    RetryPolicy,
    read_events,
    read_failures,
)
from twin.sim.fleetspec import ModelKeys, ModelPart
from twin.sim.keypath import set_key_path
from twin.sim.metrics import SLO
from twin.sim.scaling import ScalingKeys
from twin.sim.timeline import DEFAULT_WINDOW_S
from twin.workload.stream import WorkloadSpec

PLACEMENTS = ("packed", "interleaved")
# max_batched_tokens with chunked_prefill, unless given: vLLM's token budget for
# chunked prefill (_DEFAULT_MAX_NUM_BATCHED_TOKENS in vllm/config.py).
CHUNKED_MAX_BATCHED_TOKENS = 2048
_NAME_OR_MAPPING = {"anyOf": [{"type": "string"}, {"type": "object"}]}


# -- the declared sections -----------------------------------------------------------
@dataclass(frozen=True)
class GroupKeys:
    """The instances of one role in a split cluster (``cluster.prefill``,
    ``cluster.decode``); an integer is a count at the cluster's tp and pp."""

    instances: int = declared(1, POSITIVE_INT, "instances of this role")
    tp: int | None = declared(None, POSITIVE_INT, "tensor parallelism (default: cluster.tp)")
    pp: int | None = declared(None, POSITIVE_INT, "pipeline parallelism (default: cluster.pp)")
    ep: int | None = declared(
        None, POSITIVE_INT, "expert parallelism of a MoE model (default: cluster.ep)"
    )
    dp: int | None = declared(
        None, POSITIVE_INT, "data-parallel attention ranks (default: cluster.dp)"
    )
    template: str | None = declared(
        None, TEXT, "the topology's node template its instances go to (default: any node)"
    )


def _group(value: Any, where: str) -> GroupKeys:
    if is_int(value):
        return GroupKeys(instances=positive_int(value, where))
    return read(GroupKeys, value, where).value


_GROUP = Kind(_group, one_of_schemas(POSITIVE_INT.schema, lambda: schema(GroupKeys)))


@dataclass(frozen=True)
class ClusterKeys:
    """The cluster: colocated instances, or prefill and decode instances on a
    topology."""

    instances: int = declared(1, POSITIVE_INT, "colocated (mixed) instances; or give gpus")
    gpus: int | None = declared(
        None, POSITIVE_INT, "GPUs of colocated instances of tp x pp each, instead of instances"
    )
    tp: int = declared(
        1, POSITIVE_INT, "tensor parallelism per instance (the default of every group)"
    )
    pp: int = declared(1, POSITIVE_INT, "pipeline parallelism per instance")
    ep: int = declared(
        1, POSITIVE_INT, "expert parallelism: the routed experts split over ep = dp x tp GPUs"
    )
    dp: int = declared(
        1, POSITIVE_INT,
        "data-parallel attention: an instance is dp x tp x pp GPUs, each dp rank its sequences",
    )  # fmt: skip
    gpus_per_node: int = declared(8, POSITIVE_INT, "GPUs per node, without a topology")
    topology: Any = declared(
        None, anything(_NAME_OR_MAPPING), "a bundled name, a YAML path or an inline mapping"
    )
    nodes: int | None = declared(
        None, POSITIVE_INT, "scales a single-template topology", nullable=True
    )
    prefill: GroupKeys | None = declared(None, _GROUP, "split serving: the prefill instances")
    decode: GroupKeys | None = declared(None, _GROUP, "split serving: the decode instances")
    placement: str = declared(
        "packed", choice(*PLACEMENTS), "packed (in id order) | interleaved (P0, D0, P1, D1, ...)"
    )
    kv_pool_bytes: float | None = declared(
        None, nbytes(positive=True),
        "host-memory KV pool per node (Mooncake's store); needs a topology", key="kv_pool",
    )  # fmt: skip
    # Mooncake's store pools the DRAM and the SSDs of the GPU nodes (Qin et al.,
    # arXiv 2407.00079v3: abstract and section 3, the architecture overview;
    # FAST 2025: sections 3.1 and 3.2, Mooncake Store): here what a node's
    # DRAM pool evicts goes to its SSD.
    kv_pool_ssd_bytes: float | None = declared(
        None, nbytes(positive=True),
        "NVMe KV pool per node below its DRAM pool (null: none); needs kv_pool",
        key="kv_pool_ssd", nullable=True,
    )  # fmt: skip
    # The defaults of kv_tiers' SSD: Samsung PM1743 (PCIe 5.0 x4 enterprise NVMe),
    # 13,000 MB/s sequential read, 6,600 MB/s sequential write as announced
    # (AnandTech, "Samsung Announces First PCIe 5.0 Enterprise SSD: PM1743",
    # 2021-12-23); 100 us a transfer, the round figure of an enterprise NVMe read.
    kv_pool_ssd_read_bandwidth: float = declared("13 GB/s", BANDWIDTH, "reads of a node's SSD pool")
    kv_pool_ssd_write_bandwidth: float = declared(
        "6.6 GB/s", BANDWIDTH, "writes into a node's SSD pool"
    )
    kv_pool_ssd_latency_s: float = declared(
        "100 us", seconds(positive=False), "fixed time of one SSD pool transfer",
        key="kv_pool_ssd_latency",
    )  # fmt: skip


_SCHEDULER_NAME = Kind(string().parse, lambda: {"type": "string", "enum": scheduler_names()})


@dataclass(frozen=True)
class SchedulerKeys:
    """The scheduling policy (a name alone is short for ``{name: ...}``)."""

    open_keys: ClassVar[str] = "the policy's parameters, beside its name"
    name: str = declared("colocated", _SCHEDULER_NAME, "a registered policy (twin schedulers)")


def _scheduler(value: Any, where: str) -> dict[str, Any]:
    return {"name": value} if isinstance(value, str) else mapping(value, where)


_SCHEDULER = Kind(_scheduler, one_of_schemas(_SCHEDULER_NAME.schema, lambda: schema(SchedulerKeys)))


@dataclass(frozen=True)
class OutputKeys:
    """What a run reports besides its summary (``output:``)."""

    window_s: float = declared(
        f"{DEFAULT_WINDOW_S:g} s", seconds(), "width of the timeline's windows", key="window"
    )


@dataclass(frozen=True)
class TopKeys:
    """An experiment spec: the model, the GPU, the cluster, the engine, the
    performance model, the scheduler, the workload, the SLOs and the seed."""

    name: str | None = declared(None, TEXT, "the experiment's name (default: the file name)")
    description: str | None = declared(None, TEXT, "free text, kept in the results")
    seed: int = declared(0, NONNEG_INT, "every random stream is spawned from this")
    model: Any = declared(
        None, anything(_NAME_OR_MAPPING), "a catalog name or an inline mapping of shapes",
        required="name a catalog model or give its shapes",
    )  # fmt: skip
    gpu: Any = declared(
        "h100-sxm", anything(_NAME_OR_MAPPING),
        "a catalog name or an inline mapping (with a topology: leave it out)",
    )  # fmt: skip
    cluster: Any = declared(None, section(ClusterKeys), "the instances and where they run")
    engine: Any = declared(None, section(EngineConfig), "per-instance batching and memory")
    perf: Any = declared(
        None, Kind(mapping, perf_schema), "the iteration-time model (default: {kind: roofline})",
        nullable=True,
    )  # fmt: skip
    scheduler: Any = declared(None, _SCHEDULER, "the policy: a name, or {name, parameters...}")
    workload: Any = declared(
        None, section(WorkloadSpec), "a trace file, or synthetic lengths with an arrival process",
        required="give a trace or synthetic lengths", nullable=True,
    )  # fmt: skip
    slo: Any = declared(None, section(SLO), "latency objectives")
    transfer: Any = declared(None, section(TransferConfig), "how a split deployment moves KV")
    events: Any = declared(
        None, anything(lambda: {"type": "array", "items": schema(EventKeys)}),
        "a timeline of failures and degradations (see Failures and degradation)",
        nullable=True,
    )  # fmt: skip
    retry: Any = declared(None, section(RetryPolicy), "what a request whose instance fails does")
    failures: Any = declared(
        None, section(FailureKeys), "random failures per component class (MTBF, repair time)"
    )
    scaling: Any = declared(
        None, section(ScalingKeys), "start-up cost of instances a policy adds (AddInstance)"
    )
    output: Any = declared(None, section(OutputKeys), "what a run reports besides its summary")
    kv_tiers: Any = declared(
        None, section(TierKeys), "KV tiers below HBM per instance: DRAM, SSD (see KV tiers)"
    )
    models: Any = declared(
        None, anything(lambda: {"type": "object", "additionalProperties": _model_schema()}),
        "several models on the cluster, by name: {model, share, cluster, scheduler, slo}",
    )  # fmt: skip
    gpu_budget: int | None = declared(
        None, POSITIVE_INT, "several models: the GPUs their instances may hold together"
    )


def _model_schema() -> dict[str, Any]:
    """The schema of one of ``models:``, its ``slo`` that of ``slo:``."""
    s = schema(ModelKeys)
    s["properties"]["slo"] = {**schema(SLO), "description": s["properties"]["slo"]["description"]}
    return s


def spec_schema(extra: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of an experiment spec, from the
    declarations; ``extra`` adds top-level keys read elsewhere (``compare:``,
    ``sweep:``)."""
    s = schema(TopKeys)
    s["properties"].update(extra or {})
    s["required"].remove("model")  # or models:
    s["anyOf"] = [{"required": ["model"]}, {"required": ["models"]}]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "pd-twin experiment spec",
        **s,
    }


# -- the resolved spec ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """``count`` instances of one role with the same parallelism; ``template``
    the topology's node template they are placed on (None: any node)."""

    role: str
    count: int
    tp: int
    pp: int
    template: str | None = None
    ep: int = 1
    dp: int = 1
    model: str = ""  # its model's name in a spec of several (twin.sim.fleetspec)

    @property
    def gpus(self) -> int:
        """GPUs of one instance: ``dp x tp x pp``."""
        return self.dp * self.tp * self.pp


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
    perf: Mapping[str, Any] | None
    scheduler: str
    scheduler_params: Mapping[str, Any]
    workload: WorkloadSpec
    slo: SLO
    source: str
    base_dir: Path
    resolved: Mapping[str, Any] = field(repr=False)
    window_s: float = DEFAULT_WINDOW_S  # output.window: the timeline's windows
    events: tuple[Event, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    failures: tuple[RandomKeys, ...] = ()
    failure_seed: int | None = None
    scaling: ScalingKeys | None = None  # given: runs report gpu_seconds
    kv_tiers: TierKeys | None = None  # given: KV tiers below HBM, runs report kv_tiers
    kv_pool_ssd: PoolSSD | None = None  # an SSD below each node's KV pool, or None
    # where each instance runs, by id (twin.sim.layout; empty until placed)
    placements: tuple[Placement, ...] = field(default=(), repr=False)
    models: tuple[ModelPart, ...] = ()  # several models: each one's (twin.sim.fleetspec)
    gpu_budget: int | None = None  # several models: the GPUs they may hold together

    def part(self, model: str) -> ExperimentSpec:
        """The one-model spec of ``model`` (this spec when it serves one)."""
        return next((p.spec for p in self.models if p.name == model), self)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(canonical_json(self.resolved).encode()).hexdigest()

    @property
    def memory_utilization(self) -> float:
        return self.engine.gpu_memory_utilization

    @property
    def activation_reserve_bytes(self) -> float:
        return self.engine.activation_reserve_bytes

    @property
    def oversized(self) -> str:
        return self.engine.oversized

    @property
    def max_model_len(self) -> int | None:
        """Longest prompt + output served: ``engine.max_model_len``, else the
        model's context; None when neither is known (no limit)."""
        if self.engine.max_model_len is not None:
            return self.engine.max_model_len
        return self.model.max_context

    @property
    def ttft_at(self) -> str:
        return self.slo.ttft_at


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


# -- finding and reading specs -------------------------------------------------------
def read_spec_text(spec: str) -> tuple[str, str, Path]:
    """``(text, display name, base dir)`` of a spec given as a path or a bundled name."""
    path = Path(spec)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise SpecError(f"{spec}: no such experiment spec file")
        return read_text(path, "experiment spec", SpecError), str(path), path.resolve().parent
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
    """Apply ``key.path=value`` overrides in place; the value is parsed as YAML.
    ``key.path=null`` removes the key, so that its default applies (as a
    ``null`` in a sweep or compare entry does). A list item is named by its
    index, ``workload.classes.0.share`` or ``workload.classes[0].share``
    (:mod:`twin.sim.keypath`)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"{where} {item!r}: expected key.path=value")
        try:
            value = yamlio.load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        set_key_path(data, key.strip(), value, f"{where} {item!r}")


def load_spec(spec: str = "quickstart", overrides: Sequence[str] = ()) -> ExperimentSpec:
    """Read, override, validate and resolve an experiment spec."""
    text, where, base_dir = read_spec_text(spec)
    data = parse_yaml(text, where)
    apply_overrides(data, overrides)
    return resolve_spec(data, where, base_dir)


# -- the rules between keys ----------------------------------------------------------
@dataclass(frozen=True)
class _Cluster:
    keys: ClusterKeys
    groups: tuple[InstanceGroup, ...]
    topology: Any
    resolved: dict[str, Any]


def _cluster(data: Any, where: str, base_dir: Path) -> _Cluster:  # noqa: C901
    """Instance groups (prefill first, then decode, then mixed), the topology
    and the resolved form of ``cluster:``."""
    at = f"{where}: cluster"
    r = read(ClusterKeys, data, at)
    cl, given = r.value, r.given
    tp, pp, ep, dp = cl.tp, cl.pp, cl.ep, cl.dp
    if "instances" in given and "gpus" in given:
        raise SpecError(f"{at}: give instances or gpus, not both")
    groups: list[InstanceGroup] = []
    for role in ("prefill", "decode"):
        if role in given:
            g: GroupKeys = getattr(cl, role)
            groups.append(
                InstanceGroup(
                    role, g.instances, g.tp or tp, g.pp or pp, g.template, g.ep or ep, g.dp or dp
                )  # fmt: skip
            )
    if ("prefill" in given) != ("decode" in given):
        missing = "decode" if "prefill" in given else "prefill"
        raise SpecError(f"{at}.{missing}: missing; a split cluster needs both roles")
    if cl.gpus is not None:
        if cl.gpus % (dp * tp * pp):
            size = f"dp x tp x pp = {dp * tp * pp}" if dp > 1 else f"tp x pp = {tp * pp}"
            raise SpecError(f"{at}.gpus: {cl.gpus} is not a multiple of {size}")
        groups.append(InstanceGroup("mixed", cl.gpus // (dp * tp * pp), tp, pp, None, ep, dp))
    elif "instances" in given or not groups:
        groups.append(InstanceGroup("mixed", cl.instances, tp, pp, None, ep, dp))
    at_most(cl.gpus_per_node, MAX_GPUS_PER_NODE, f"{at}.gpus_per_node", "GPUs per node")
    for ig in groups:  # before anything is built per instance or per GPU
        key = f"{at}.{ig.role}" if ig.role != "mixed" else at
        what = f"GPUs (instances x dp x tp x pp = {ig.count} x {ig.dp} x {ig.tp} x {ig.pp})"
        at_most(ig.count * ig.gpus, MAX_GPUS, key, what)
    at_most(sum(ig.count * ig.gpus for ig in groups), MAX_GPUS, at, "GPUs in all")
    out: dict[str, Any] = {
        "instances": sum(g.count for g in groups),
        "tp": tp,
        "pp": pp,
        **({"ep": ep} if ep > 1 else {}),
        **({"dp": dp} if dp > 1 else {}),
        "groups": [
            {"role": g.role, "instances": g.count, "tp": g.tp, "pp": g.pp}
            | ({"ep": g.ep} if g.ep > 1 else {})
            | ({"dp": g.dp} if g.dp > 1 else {})
            | ({"template": g.template} if g.template is not None else {})
            for g in groups
        ],
    }
    topology = None
    if "topology" in given:
        from twin.net.topology import load_topology

        topology = load_topology(
            cl.topology, nodes=cl.nodes, where=f"{at}.topology", base_dir=base_dir
        )
        out["topology"] = cl.topology
        if cl.nodes is not None:
            out["nodes"] = cl.nodes
    elif cl.nodes is not None:
        raise SpecError(f"{at}.nodes: scales a topology; give cluster.topology too")
    elif any(g.role != "mixed" for g in groups):
        raise SpecError(
            f"{at}.topology: missing; prefill and decode instances need one, "
            "since the KV cache travels between them (e.g. topology: dgx-h100-ib400)"
        )
    for ig in groups:
        if ig.template is None:
            continue
        assert topology is not None  # a group with a template is split, so it has one
        if ig.template not in topology.templates:
            raise UnknownNameError(
                "node template", ig.template, topology.templates, where=f"{at}.{ig.role}.template"
            )
    if cl.kv_pool_bytes is not None:
        if topology is None:
            raise SpecError(f"{at}.kv_pool: needs cluster.topology (pools sit on nodes)")
        out["kv_pool"] = r.written["kv_pool"]
    ssd_keys = ("kv_pool_ssd_read_bandwidth", "kv_pool_ssd_write_bandwidth", "kv_pool_ssd_latency")
    if cl.kv_pool_ssd_bytes is not None:
        if cl.kv_pool_bytes is None:
            raise SpecError(f"{at}.kv_pool_ssd: is below the DRAM pool; give cluster.kv_pool too")
        for k in ("kv_pool_ssd", *ssd_keys):  # only with it: pools without keep their sha256
            out[k] = r.written[k]
    else:
        for k in ssd_keys:
            if k in given:
                raise SpecError(f"{at}.{k}: needs cluster.kv_pool_ssd (the SSD pool's size)")
    out.update(gpus_per_node=cl.gpus_per_node, placement=cl.placement)
    return _Cluster(cl, tuple(groups), topology, out)


def _engine(data: Any, where: str, model: ModelSpec) -> tuple[EngineConfig, dict[str, Any]]:
    r = read(EngineConfig, data, f"{where}: engine")
    engine, out = r.value, r.written
    for key in ("queue_policy", "speculative", "session_retention"):
        if key not in r.given:  # results of specs without them read as before they came
            del out[key]
    if "max_batched_tokens" not in r.given and engine.chunked_prefill:
        engine = dataclasses.replace(engine, max_batched_tokens=CHUNKED_MAX_BATCHED_TOKENS)
        out["max_batched_tokens"] = CHUNKED_MAX_BATCHED_TOKENS
    # vLLM refuses a token budget below the context without chunked prefill
    # (SchedulerConfig._verify_args, vllm/config/scheduler.py): such an engine
    # could never take a prompt longer than the budget in one iteration.
    # NOTE: the default budget stays allowed (a resolved spec writes it out, so
    # "given" cannot tell it apart): a longer prompt then runs alone, as under
    # vLLM's own default budget, max(max_model_len, 2048).
    mml = engine.max_model_len or model.max_context
    default = EngineConfig.__dataclass_fields__["max_batched_tokens"].default
    if engine.max_batched_tokens != default and not engine.chunked_prefill and mml is not None:
        if engine.max_batched_tokens < mml:
            raise SpecError(
                f"{where}: engine.max_batched_tokens: {engine.max_batched_tokens} is below "
                f"max_model_len {mml:,} without chunked prefill, which vLLM refuses: "
                "set engine.chunked_prefill: true, raise it, or lower engine.max_model_len"
            )
    return engine, out


def _check_limits(model: ModelSpec, engine: EngineConfig, cluster: _Cluster, where: str) -> None:
    """What a real engine refuses to start with: a context beyond the model's,
    a TP that does not shard the model (:meth:`ModelSpec.tp_problem`), and,
    without a topology, a TP wider than a node.

    NOTE: the Roofline prices TP's all-reduce on the GPU's NVLink (or PCIe),
    so TP across nodes would be priced as if it were inside one; it is
    refused instead (with a topology, an instance never spans nodes)."""
    mml = engine.max_model_len
    if mml is not None:
        at = f"{where}: engine.max_model_len"
        if mml < 2:
            raise SpecError(f"{at}: {mml} must be at least 2 (a prompt token and an output token)")
        if model.max_context is not None and mml > model.max_context:
            raise SpecError(
                f"{at}: {mml} exceeds {model.name}'s context of {model.max_context:,} tokens "
                "(max_position_embeddings); it may only lower it"
            )
    keys = cluster.keys
    for g in cluster.groups:
        g_keys = getattr(keys, g.role) if g.role != "mixed" else None
        own = g_keys is not None and g_keys.tp is not None
        key = f"cluster.{g.role}.tp" if own else "cluster.tp"
        problem = model.tp_problem(g.tp)
        if problem:
            raise SpecError(f"{where}: {key}: {problem}")
        layout.check_ep(model, g, g_keys, where)
        if cluster.topology is None and g.tp > keys.gpus_per_node:
            raise SpecError(
                f"{where}: {key}: {g.tp} exceeds a node's {keys.gpus_per_node} GPUs "
                "(cluster.gpus_per_node); tensor parallelism across nodes is not modelled "
                "(its all-reduce is priced on NVLink): use pp to span nodes"
            )


def _policy(data: Any, given_as: Any, where: str) -> tuple[str, dict[str, Any]]:
    """The scheduler's name and parameters, checked by building the policy once
    (a policy checks its values when it is made)."""
    r = read(SchedulerKeys, data, f"{where}: scheduler")
    name, params = r.value.name, r.extra
    try:
        build_scheduler(name, params, where=f"{where}: scheduler")
    except UnknownSchedulerError as e:
        key = "scheduler" if isinstance(given_as, str) else "scheduler.name"
        raise UnknownSchedulerError(name, e.known, where=f"{where}: {key}") from None
    return name, params


def placed(spec: ExperimentSpec) -> ExperimentSpec:
    """``spec`` with its instances placed, and every check that needs to know
    where they run done (:mod:`twin.sim.layout`)."""
    where = spec.source
    topo = spec.topology
    placements = layout.place(spec.groups, topo, spec.placement, spec.gpus_per_node, where)
    for one, groups, at in fleetspec.slices(spec, placements):
        layout.check_memory(one.model, spec.engine, spec.gpu, groups, topo, at, one.source)
        layout.check_perf(one.perf, one.model, spec.gpu, groups, topo, at, one.source, one.base_dir)
    layout.check_targets(spec.events, spec.failures, spec.kv_tiers, topo, placements, where)
    return dataclasses.replace(spec, placements=tuple(placements))


def resolve_spec(
    data: Mapping[str, Any], where: str, base_dir: Path, *, place: bool = True
) -> ExperimentSpec:
    """Validate ``data`` (a parsed YAML mapping) into an :class:`ExperimentSpec`,
    its instances placed (:func:`placed`; with ``place`` false, not yet: a
    search that grows the topology until they fit places them itself)."""
    data = copy.deepcopy(dict(data))
    if data.get("models") is not None or "gpu_budget" in data:
        return _models(data, where, base_dir, place)
    top_read = read(TopKeys, data, where, sep=": ")
    top = top_read.value
    out: dict[str, Any] = {}

    name = Path(where).stem if top.name is None else top.name
    out["name"] = name
    if top.description is not None:
        out["description"] = top.description
    out["seed"] = top.seed
    model_arg = top.model
    if isinstance(model_arg, str) and model_arg.strip().endswith(".json"):
        model_arg = str(base_dir / model_arg.strip())  # a config.json beside the spec
    model = get_model(model_arg, where=f"{where}: model")
    out["model"] = model_arg
    gpu = get_gpu(top.gpu, where=f"{where}: gpu")
    out["gpu"] = top.gpu

    cluster = _cluster(top.cluster, where, base_dir)
    topology = cluster.topology
    if topology is not None:
        types = sorted({topology.gpu_type(i) for i in range(len(topology.gpus))})
        if "gpu" in top_read.given:
            if [gpu.name] != [get_gpu(t).name for t in types]:
                raise SpecError(
                    f"{where}: gpu: {top.gpu!r}, but topology {topology.name!r} has "
                    f"{', '.join(types)}; with a topology, leave gpu out"
                )
        else:
            gpu = get_gpu(types[0])
            out["gpu"] = types[0] if len(types) == 1 else " + ".join(types)
    out["cluster"] = cluster.resolved

    tr = read(TransferConfig, top.transfer, f"{where}: transfer")
    out["transfer"] = tr.written

    engine, out["engine"] = _engine(top.engine, where, model)
    _check_limits(model, engine, cluster, where)

    if top.perf is not None:
        read_perf(top.perf, f"{where}: perf", base_dir)
    out["perf"] = top.perf if top.perf is not None else {"kind": "roofline"}

    sched_name, params = _policy(top.scheduler, data.get("scheduler"), where)
    out["scheduler"] = {"name": sched_name, **params}

    workload = WorkloadSpec.from_mapping(
        top.workload, where=f"{where}: workload", base_dir=base_dir
    )
    workload.check_files(f"{where}: workload")
    out["workload"] = top.workload

    slo = read(SLO, top.slo, f"{where}: slo")
    # slowdown written only when given: a spec without it resolves (and hashes) as before
    out["slo"] = {k: v for k, v in slo.written.items() if k != "slowdown" or k in slo.given}

    # Only given: a spec without faults resolves (and hashes) as before.
    events, out_events = read_events(top.events, f"{where}: events")
    if out_events:
        out["events"] = out_events
    retry = read(RetryPolicy, top.retry, f"{where}: retry")
    if "retry" in top_read.given:
        out["retry"] = retry.written
    failure_seed, failures, out_failures = read_failures(top.failures, f"{where}: failures")
    if "failures" in top_read.given:
        out["failures"] = out_failures
    scaling = read(ScalingKeys, top.scaling, f"{where}: scaling")
    if "scaling" in top_read.given:
        out["scaling"] = scaling.written
    tiers = _kv_tiers(top.kv_tiers, "kv_tiers" in top_read.given, engine, workload, where, out)
    # Only when given, so that specs without it keep their resolved form and sha256.
    output = read(OutputKeys, top.output, f"{where}: output")
    if "output" in top_read.given:
        out["output"] = output.written

    spec = ExperimentSpec(
        name=name,
        seed=top.seed,
        model=model,
        gpu=gpu,
        instances=cluster.resolved["instances"],
        tp=cluster.keys.tp,
        pp=cluster.keys.pp,
        gpus_per_node=cluster.keys.gpus_per_node,
        groups=cluster.groups,
        topology=topology,
        placement=cluster.keys.placement,
        kv_pool_bytes=cluster.keys.kv_pool_bytes,
        transfer=tr.value,
        engine=engine,
        perf=top.perf,
        scheduler=sched_name,
        scheduler_params=params,
        workload=workload,
        slo=slo.value,
        source=where,
        base_dir=base_dir,
        resolved=out,
        window_s=output.value.window_s,
        events=events,
        retry=retry.value,
        failures=failures,
        failure_seed=failure_seed,
        scaling=scaling.value if "scaling" in top_read.given else None,
        kv_tiers=tiers.value if "kv_tiers" in top_read.given else None,
        kv_pool_ssd=_pool_ssd(cluster.keys),
    )
    return placed(spec) if place else spec


def _pool_ssd(keys: ClusterKeys) -> PoolSSD | None:
    """The SSD below each node's KV pool (``cluster.kv_pool_ssd``), or None."""
    if keys.kv_pool_ssd_bytes is None:
        return None
    return PoolSSD(
        keys.kv_pool_ssd_bytes, keys.kv_pool_ssd_read_bandwidth,
        keys.kv_pool_ssd_write_bandwidth, keys.kv_pool_ssd_latency_s,
    )  # fmt: skip


def _models(data: Mapping[str, Any], where: str, base_dir: Path, place: bool) -> ExperimentSpec:
    """A spec of several models (:mod:`twin.sim.fleetspec`): each resolved as
    a one-model spec, then their instances placed together."""
    parts = [
        fleetspec.ModelPart(name, share, resolve_spec(one, f"{where}: models.{name}", base_dir,
                            place=False), keys.written, keys.value.rate_schedule)
        for name, share, one, keys in fleetspec.split(data, where)
    ]  # fmt: skip
    slo = read(SLO, data.get("slo"), f"{where}: slo")
    spec = dataclasses.replace(
        parts[0].spec, **fleetspec.combine(parts, data, where, base_dir, slo)
    )
    return placed(spec) if place else spec


def _kv_tiers(
    data: Any, given: bool, engine: EngineConfig, workload: WorkloadSpec, where: str,
    out: dict[str, Any],
) -> Any:  # fmt: skip
    """``kv_tiers:`` read (into ``out`` when ``given``), with what it needs of
    the engine; and ``engine.session_retention``'s needs, tiers among them."""
    tiers = read(TierKeys, data, f"{where}: kv_tiers")
    if given:
        if not engine.prefix_caching:
            raise SpecError(
                f"{where}: kv_tiers: the tiers hold what the prefix cache evicts; "
                "set engine.prefix_caching: true"
            )
        out["kv_tiers"] = tiers.written
        if tiers.value.remote is not None:  # its own section
            remote = read(RemoteKeys, tiers.value.remote, f"{where}: kv_tiers.remote")
            tiers = dataclasses.replace(
                tiers, value=dataclasses.replace(tiers.value, remote=remote.value)
            )
            out["kv_tiers"] = {**tiers.written, "remote": remote.written}
    engine.session_retention.check(workload.lengths, engine.prefix_caching, given, where)
    return tiers
