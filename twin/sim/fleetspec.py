"""Several models on one cluster: the spec's ``models:`` section.

A spec serves one model (``model:`` and ``cluster:``'s instances), or
several, each with instances of its own::

    models:
      chat: {model: llama-3.1-8b, share: 0.7, cluster: {instances: 2}}
      code: {model: qwen2.5-7b, share: 0.3, cluster: {instances: 2, tp: 2},
             scheduler: colocated, slo: {ttft: 2 s}}

Each model names its model (a catalog name or shapes, as ``model:``), its
share of the workload's requests, its instances (``cluster:``'s instance
keys: ``instances``, ``gpus``, ``tp``, ``pp``, ``ep``, ``dp``, ``prefill``,
``decode``) and, optionally, its own scheduler and SLO keys (those it leaves
out are the spec's). The nodes (``cluster.topology``, ``nodes``,
``gpus_per_node``, ``placement``), the GPU, the engine, the transfer, the
workload and the seed are shared. Each model resolves as a spec of its own
(every check of a one-model spec applies to it, its messages naming
``models.<name>``); the cluster is their instances, model by model in the
order given, placed together.

With a trace workload and no model giving a share, the trace's ``model``
column (a Mooncake line's ``model`` key) names each request's model instead,
as its ``class`` column names the request's class (:mod:`twin.workload.columns`).

Not with several models (refused, one line each): KV pools and tiers (a
prefix hash names blocks of one model's KV), ``scaling:`` (the policies'
added instances would need a model of their own), and instances of
different sizes without a topology.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twin._check import positive_int
from twin._declare import POSITIVE_NUMBER, Kind, anything, declared, mapping, read
from twin.errors import SpecError
from twin.serving.cluster import Placement
from twin.workload.columns import NameColumn
from twin.workload.schedule import RATE_SCHEDULE_SCHEMA, parse_rate_schedule

MODEL_COLUMN = "model"
"""The trace column (the Mooncake JSON key) that names each request's model."""
MODEL_NAMES = NameColumn(MODEL_COLUMN, "model", "models")
NAME_OR_MAPPING = {"anyOf": [{"type": "string"}, {"type": "object"}]}
# cluster keys every model shares, and those each model gives for itself
SHARED_CLUSTER = ("topology", "nodes", "gpus_per_node", "placement")
OWN_CLUSTER = ("instances", "gpus", "tp", "pp", "ep", "dp", "prefill", "decode")
# what several models do not run with yet: (key path, why)
_REFUSED = (
    (("cluster", "kv_pool"), "a KV pool holds prefixes of one model's KV"),
    (("cluster", "kv_pool_ssd"), "a KV pool holds prefixes of one model's KV"),
    (("kv_tiers",), "KV tiers hold prefixes of one model's KV"),
)
_OWN_CLUSTER_SCHEMA = {
    "type": "object",
    "description": "the model's instances: cluster's keys " + ", ".join(OWN_CLUSTER),
    "propertyNames": {"enum": list(OWN_CLUSTER)},
}


@dataclass(frozen=True)
class ModelKeys:
    """One model of a cluster that serves several (``models.<name>``)."""

    model: Any = declared(
        None, anything(NAME_OR_MAPPING), "a catalog name or an inline mapping of shapes",
        required="name a catalog model or give its shapes",
    )  # fmt: skip
    share: float = declared(
        1, POSITIVE_NUMBER, "its share of the workload's requests (shares are normalised)"
    )
    cluster: Any = declared(
        None, Kind(mapping, _OWN_CLUSTER_SCHEMA), "its instances, as cluster: gives them",
        required="give the model's instances (instances, gpus, or prefill and decode)",
    )  # fmt: skip
    scheduler: Any = declared(
        None, anything(NAME_OR_MAPPING), "its policy (default: the spec's scheduler)"
    )
    # its keys are slo:'s (twin.sim.spec's schema says so; read by the model's spec)
    slo: Any = declared(
        None, Kind(mapping, {"type": "object"}), "its SLO; keys left out are the spec's slo"
    )
    rate_schedule: Any = declared(
        None, anything(RATE_SCHEDULE_SCHEMA, parse_rate_schedule),
        "its share over time: the share times this multiplier at each arrival, normalised "
        "over the models (opposite schedules: each model's load its own curve)",
    )  # fmt: skip


@dataclass(frozen=True)
class ModelPart:
    """One model of a resolved spec: its ``name``, its normalised ``share``
    of the requests and ``spec``, the one-model spec it resolves as (its
    model, groups, scheduler and SLO; not placed)."""

    name: str
    share: float | None  # None: the trace's model column names each request's model
    spec: Any
    written: Mapping[str, Any]
    schedule: Any = None  # its rate_schedule (twin.workload.schedule), or None


def split(
    data: Mapping[str, Any], where: str
) -> list[tuple[str, float | None, dict[str, Any], Any]]:
    """The one-model specs of a spec with ``models:``: ``(name, share, spec
    data, the model's keys as read)`` per model, in the order given; every
    share None when the trace's ``model`` column names each request's model."""
    if data.get("models") is None:
        raise SpecError(f"{where}: gpu_budget: applies to several models (models:)")
    models = mapping(data["models"], f"{where}: models")
    if not models:
        raise SpecError(f"{where}: models: empty; name at least one model")
    if data.get("model") is not None:
        raise SpecError(
            f"{where}: model: with models:, each model gives its own (models.<name>.model)"
        )
    cluster = mapping(data.get("cluster") or {}, f"{where}: cluster")
    for k in OWN_CLUSTER:
        if k in cluster:
            raise SpecError(
                f"{where}: cluster.{k}: with models:, each model gives its instances "
                f"(models.<name>.cluster.{k})"
            )
    for path, why in _REFUSED:
        node: Any = data
        for k in path:
            node = node.get(k) if isinstance(node, Mapping) else None
        if node is not None:
            raise SpecError(f"{where}: {'.'.join(path)}: not with several models ({why})")
    out = []
    total = 0.0
    reads = []
    for name, entry in models.items():
        if not isinstance(name, str) or not name.strip():
            raise SpecError(f"{where}: models: {name!r}: a model's name is a non-empty string")
        r = read(ModelKeys, entry, f"{where}: models.{name}")
        keys = r.value
        one = {k: v for k, v in data.items() if k not in ("models", "gpu_budget")}
        one["name"] = data.get("name") or Path(where).stem
        one["model"] = keys.model
        one["cluster"] = {
            **{k: v for k, v in cluster.items() if k in SHARED_CLUSTER},
            **mapping(keys.cluster, f"{where}: models.{name}.cluster"),
        }
        if keys.scheduler is not None:
            one["scheduler"] = keys.scheduler
        if keys.slo is not None:
            one["slo"] = {**mapping(data.get("slo") or {}, f"{where}: slo"), **keys.slo}
        total += keys.share
        out.append((name, keys.share, one, r))
        reads.append((name, r))
    if _traced(data, reads, where):
        return [(n, None, one, r) for n, _, one, r in out]
    return [(n, s / total, one, r) for n, s, one, r in out]


def _traced(data: Mapping[str, Any], reads: Sequence[tuple[str, Any]], where: str) -> bool:
    """Whether the trace's ``model`` column names each request's model: a
    trace workload whose models give no share (each gives one, or none)."""
    workload = data.get("workload")
    if not isinstance(workload, Mapping) or workload.get("trace") is None:
        return False
    shared = [name for name, r in reads if "share" in r.given]
    if shared and len(shared) < len(reads):
        raise SpecError(
            f"{where}: models.{next(n for n, r in reads if 'share' not in r.given)}: give "
            f"every model a share (drawn by share) or none (the trace's {MODEL_COLUMN!r} "
            "column names each request's model)"
        )
    if shared:
        return False
    for name, r in reads:
        if r.value.rate_schedule is not None:
            raise SpecError(
                f"{where}: models.{name}.rate_schedule: a schedule changes a model's share; "
                f"without shares the trace's {MODEL_COLUMN!r} column names each request's model"
            )
    return True


def combine(
    parts: Sequence[ModelPart], data: Mapping[str, Any], where: str, base_dir: Path, slo: Any
) -> dict[str, Any]:
    """The fields of the spec of several models, to replace on the first
    model's spec: every model's groups (each named by its model), in order;
    the scheduler's name that messages give; the spec's own SLO (``slo``,
    its ``slo:`` as read); the resolved form, with a ``models:`` section of
    each model's."""
    first = parts[0].spec
    groups = tuple(dataclasses.replace(g, model=p.name) for p in parts for g in p.spec.groups)
    if first.topology is None and len({g.gpus for g in groups}) > 1:
        raise SpecError(
            f"{where}: models: instances of different sizes need a cluster.topology to be "
            "placed on (without one, every instance has the same dp x tp x pp)"
        )
    resolved = {
        k: v for k, v in first.resolved.items() if k not in ("model", "cluster", "scheduler", "slo")
    }
    shared = {k: v for k, v in first.resolved["cluster"].items() if k in SHARED_CLUSTER}
    resolved["cluster"] = {
        "instances": sum(g.count for g in groups),
        **shared,
        "groups": [  # every model's, each naming its model
            {**g, "model": p.name} for p in parts for g in p.spec.resolved["cluster"]["groups"]
        ],
    }
    resolved["slo"] = slo.written
    resolved["models"] = {
        p.name: {
            "model": p.spec.resolved["model"],
            **({} if p.share is None else {"share": p.share}),
            "cluster": {
                k: v for k, v in p.spec.resolved["cluster"].items() if k not in SHARED_CLUSTER
            },
            "scheduler": p.spec.resolved["scheduler"],
            "slo": p.spec.resolved["slo"],
        }
        | ({"rate_schedule": p.written["rate_schedule"]} if p.schedule is not None else {})
        for p in parts
    }
    budget = data.get("gpu_budget")
    if budget is not None:
        resolved["gpu_budget"] = budget = positive_int(budget, f"{where}: gpu_budget")
        start = sum(g.count * g.gpus for g in groups)
        if budget < start:
            raise SpecError(
                f"{where}: gpu_budget: {budget} is below the {start} GPUs the models start with"
            )
    return {
        "groups": groups,
        "instances": resolved["cluster"]["instances"],
        "scheduler": ", ".join(f"{p.name}: {p.spec.scheduler}" for p in parts),
        "scheduler_params": {},
        "slo": slo.value,
        "source": where,
        "base_dir": base_dir,
        "resolved": resolved,
        "models": tuple(parts),
        "gpu_budget": budget,
    }


Slice = tuple[Any, list[Any], list[Placement]]


def slices(spec: Any, placements: Sequence[Placement]) -> list[Slice]:
    """Each model's one-model spec, its groups and their instances'
    placements (the spec itself, all of them, with one model)."""
    if not spec.models:
        return [(spec, list(spec.groups), list(placements))]
    out = []
    i = 0
    for part in spec.models:
        groups = [g for g in spec.groups if g.model == part.name]
        n = sum(g.count for g in groups)
        out.append((part.spec, groups, list(placements[i : i + n])))
        i += n
    return out
