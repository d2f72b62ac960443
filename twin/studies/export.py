"""Deployment export: a deployment chosen by ``twin plan`` or ``twin provision``
as the files a person applies to a Kubernetes cluster.

- :func:`dynamo_yaml`: an NVIDIA Dynamo ``DynamoGraphDeployment`` (API
  ``nvidia.com/v1beta1``) for disaggregated serving on vLLM: a frontend, a
  prefill worker and a decode worker component, each with its replica count;
  the workers run ``python3 -m dynamo.vllm`` with ``--disaggregation-mode
  prefill|decode``, the tensor (and pipeline) parallelism as vLLM engine
  arguments, one GPU per rank, and vLLM's NIXL connector for the KV transfer
  (the layout of ai-dynamo/dynamo's
  ``examples/backends/vllm/deploy/v1beta1/disagg.yaml``).
- :func:`from_run`: the deployment a spec gives as it is (``twin run SPEC
  --export-dynamo FILE``), its figures from that run: one per model of a
  spec of several (``models:``), each model's pools split into prefill and
  decode instances. The files then hold one YAML document per model: a
  ``DynamoGraphDeployment`` each, and a ModelService values document each
  (one Helm release per model, as llm-d serves a model per ModelService,
  its gateway routing on the request's ``model``).
- :func:`llm_d_yaml`: a values file of llm-d's ModelService Helm chart
  (llm-d-incubation/llm-d-modelservice, ``examples/values-pd.yaml``):
  ``prefill`` and ``decode`` sections with ``replicas``, ``parallelism.tensor``
  and a vLLM container whose ``--kv-transfer-config`` names the NIXL connector.

A mixture-of-experts layout (``ep > 1``: the routed experts over ``ep =
dp x tp`` GPUs, ``dp`` data-parallel attention ranks of ``tp`` GPUs) adds
vLLM's ``--enable-expert-parallel`` and ``--data-parallel-size`` (and
``--data-parallel-size-local``, the ranks on each node, when an instance
spans nodes) to the worker's arguments (vLLM's expert-parallel deployment
guide, docs.vllm.ai serving/expert_parallel_deployment). An instance wider
than a node becomes, in Dynamo, a component with ``multinode: {nodeCount:
N}`` and the GPUs of one node as its resources (ai-dynamo/dynamo's
``examples/backends/vllm/deploy/v1beta1/disagg-multinode.yaml``); in llm-d,
``multinode: true`` (a LeaderWorkerSet) and ``parallelism: {tensor, data,
dataLocal, workers}``, ``workers`` the pods (nodes) of one replica and each
pod's GPUs ``tensor x dataLocal`` (llm-d-modelservice's chart values.yaml and
``examples/values-one-pod-per-dp-rank.yaml``).

Every worker carries the engine arguments the twin simulated
(:func:`engine_args`: ``--max-num-seqs``, ``--max-num-batched-tokens``,
``--block-size``, ``--gpu-memory-utilization``, chunked prefill on or off,
``--max-model-len``) beside its parallelism. Both begin with a comment header
saying what the twin predicted for the deployment: the goodput it was chosen
for, and TTFT and TPOT (p90, p99) and SLO attainment of a run of the
deployment itself at the chosen rate (the target rate when one was given,
else the goodput), on the sample the choice was made on; the spec's sha256
ties the file to its inputs. One header line, ``# twin: {...}``, holds the
same figures as JSON for tools. Its caveats list what shaped the figures:
the plan's or provisioning's sample-size warnings, the requests the
predicting run rejected and its preemptions, and an engine setting vLLM
cannot take as simulated.

The images, ports and the secret name are the examples' own; a deployment
edits them to its registry and cluster. Deterministic: the same plan gives
the same bytes.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from twin import _version
from twin._io import write_text
from twin.errors import TwinError
from twin.perf.llm import HF_IDS
from twin.request import Request
from twin.sim.spec import ExperimentSpec, resolve_spec

__all__ = [
    "Deployment",
    "Role",
    "dynamo_yaml",
    "from_plan",
    "from_run",
    "from_provision",
    "llm_d_yaml",
    "write_exports",
]

# The vLLM runtime image of ai-dynamo/dynamo's
# examples/backends/vllm/deploy/v1beta1/disagg.yaml (Dynamo 1.2.0).
DYNAMO_IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.2.0-post.1"
# The llm-d image of llm-d-incubation/llm-d-modelservice's
# examples/values-heterogeneous-pd.yaml.
LLM_D_IMAGE = "ghcr.io/llm-d/llm-d:v0.2.0"
# vLLM's NIXL KV connector, both sides sending and receiving: the
# --kv-transfer-config both projects' disaggregated examples pass.
KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
# The Kubernetes secret holding HF_TOKEN that both projects' examples read.
HF_SECRET = "hf-token-secret"
# llm-d-modelservice examples/values-pd.yaml: the service port (routing.servicePort),
# the decode pods' port behind the routing proxy, and NIXL's side channel.
LLM_D_SERVICE_PORT = 8000
LLM_D_DECODE_PORT = 8200
NIXL_SIDE_CHANNEL_PORT = 5600


@dataclass(frozen=True)
class Role:
    """One phase's instances: how many, and the parallelism of each (``ep``
    and ``dp`` 1 for a dense layout; else the experts over ``ep = dp x tp``)."""

    replicas: int
    tp: int
    pp: int
    ep: int = 1
    dp: int = 1

    @property
    def gpus(self) -> int:
        """GPUs of one replica."""
        return self.dp * self.tp * self.pp

    def nodes(self, gpus_per_node: int) -> int:
        """Nodes one replica spans: 1, or its GPUs over whole nodes."""
        if self.gpus <= gpus_per_node:
            return 1
        if self.gpus % gpus_per_node or self.dp % (self.gpus // gpus_per_node):
            raise TwinError(
                f"an instance of {self.gpus} GPUs (DP{self.dp} x TP{self.tp} x PP{self.pp})"
                f" does not split evenly over nodes of {gpus_per_node} GPUs; the export"
                " needs whole nodes with the same data-parallel ranks on each"
            )
        return self.gpus // gpus_per_node

    def figures(self) -> dict[str, int]:
        """What the header says of it: replicas, tp and pp, and ep and dp under EP."""
        out = {"replicas": self.replicas, "tp": self.tp, "pp": self.pp}
        if self.ep > 1:
            out |= {"ep": self.ep, "dp": self.dp}
        return out


@dataclass(frozen=True)
class Deployment:
    """A split deployment and what the twin predicted for it.

    ``goodput_rps`` (and its 95% half-width, NaN for one sample) is what the
    plan or provisioning chose it for; ``rate_rps`` the rate the run whose
    ``predicted`` figures (``ttft_s`` and ``tpot_s`` p90 and p99, seconds;
    ``slo_attainment``) come from was replayed at."""

    name: str
    model: str
    hf_model: str
    gpu: str
    prefill: Role
    decode: Role
    source: str
    spec_sha256: str
    slo: Mapping[str, float]
    goodput_rps: float
    goodput_ci95: float
    rate_rps: float
    requests: int
    predicted: Mapping[str, float]
    gpus_per_node: int = 8
    # the predicted figures' intervals (twin.sim.intervals): coverage, source,
    # runs and per figure {lo, hi}; None when the perf model has no residuals
    intervals: Mapping[str, Any] | None = None
    # vLLM's engine arguments as the twin simulated them (flag -> value; True
    # for a flag without one), and what shaped the figures, one line each
    engine: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    caveats: tuple[str, ...] = ()

    def figures(self) -> dict[str, Any]:
        """The header's figures, as the ``# twin:`` line holds them."""
        return (
            {
                "source": self.source,
                "spec_sha256": self.spec_sha256,
                "model": self.model,
                "gpu": self.gpu,
                "prefill": self.prefill.figures(),
                "decode": self.decode.figures(),
                "slo": dict(self.slo),
                "goodput_rps": _num(self.goodput_rps),
                "goodput_ci95": _num(self.goodput_ci95),
                "rate_rps": self.rate_rps,
                "requests": self.requests,
                **{k: _num(v) for k, v in self.predicted.items()},
            }
            | ({"intervals": dict(self.intervals)} if self.intervals is not None else {})
            | {
                "engine": dict(self.engine),
                "caveats": list(self.caveats),
            }
        )


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) else x


def _k8s_name(name: str) -> str:
    """A Kubernetes object name (RFC 1123 label: a-z, 0-9, '-', at most 63)."""
    out = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:63].rstrip("-")
    return out or "pd-twin"


_FIGURES = {"ttft_p90_s": ("ttft_s", "p90"), "ttft_p99_s": ("ttft_s", "p99"),
            "tpot_p90_s": ("tpot_s", "p90"), "tpot_p99_s": ("tpot_s", "p99")}  # fmt: skip


def _predict(
    spec: ExperimentSpec, unit: list[Request], rate: float
) -> tuple[dict[str, float], dict[str, Any] | None, list[str]]:
    """TTFT/TPOT p90 and p99 and SLO attainment of ``spec`` on ``unit`` (a
    sample at one request per second) replayed at ``rate``, their prediction
    intervals (``None`` without ``perf.residuals``), and the limits that run
    hit (requests rejected, preemptions), one line each."""
    from twin.sim.simulation import Simulation

    reqs = [dataclasses.replace(r, arrival_s=r.arrival_s / rate) for r in unit]
    s = Simulation(spec, requests=reqs).run().summary
    hit = []
    if s["rejected"]:
        why = ", ".join(f"{k} {v}" for k, v in s["rejected_by_reason"].items())
        hit.append(f"{s['rejected']} of the {s['requests']} requests were rejected ({why})")
    if s["preemptions"]:
        hit.append(f"{s['preemptions']} preemptions: the KV cache ran full")
    out = {k: s[key][q] for k, (key, q) in _FIGURES.items()}
    out["slo_attainment"] = s["slo_attainment"]
    iv = s.get("intervals")
    if iv is None:
        return out, None, hit
    bounds = {k: iv[key][q] for k, (key, q) in _FIGURES.items() if q in iv.get(key, {})}
    if "slo_attainment" in iv:
        bounds["slo_attainment"] = iv["slo_attainment"]
    keep = {k: iv[k] for k in ("coverage", "source", "runs", "sha256")}
    return out, {**keep, **bounds}, hit


def engine_args(run: ExperimentSpec) -> tuple[dict[str, Any], list[str]]:
    """vLLM's engine arguments of what the twin simulated (``engine:`` and the
    context), flag -> value, and a caveat where one has no vLLM equal."""
    e = run.engine
    args: dict[str, Any] = {
        "--max-num-seqs": e.max_num_seqs,
        "--block-size": e.block_size,
        "--gpu-memory-utilization": e.gpu_memory_utilization,
    }
    mml = run.max_model_len
    if mml is not None:
        args["--max-model-len"] = mml
    notes = []
    if e.chunked_prefill:
        args["--enable-chunked-prefill"] = True
        args["--max-num-batched-tokens"] = e.max_batched_tokens
    else:
        args["--no-enable-chunked-prefill"] = True
        if mml is None or e.max_batched_tokens >= mml:
            args["--max-num-batched-tokens"] = e.max_batched_tokens
        else:  # vLLM refuses a budget below the context without chunked prefill
            notes.append(
                f"the twin batched up to {e.max_batched_tokens} prefill tokens an iteration "
                f"(a longer prompt alone); vLLM without chunked prefill needs a budget >= "
                f"max_model_len {mml}, so --max-num-batched-tokens is left to its default"
            )
    sp = e.speculative
    if sp is not None:
        config: dict[str, Any] = {"method": sp.method, "num_speculative_tokens": sp.k}
        if sp.draft is not None:
            config = {"model": HF_IDS.get(sp.draft, sp.draft), "num_speculative_tokens": sp.k}
        args["--speculative-config"] = json.dumps(config, separators=(",", ":"))
        notes.append(
            f"speculative decoding ({sp.method}, k={sp.k}) was simulated at an assumed "
            f"acceptance of {sp.mean_emitted:.2f} tokens a step; "
            + (
                "name the drafter checkpoint (model) in --speculative-config, and method "
                "eagle3 for an EAGLE-3 head"
                if sp.method == "eagle"
                else "check the acceptance vLLM reports (spec_decode metrics) against it"
            )
        )
    return args, notes


def _flags(engine: Mapping[str, Any]) -> list[str]:
    out = []
    for flag, value in engine.items():
        out += [flag] if value is True else [flag, str(value)]
    return out


def _deployment(
    spec: ExperimentSpec, run: ExperimentSpec, source: str, prefill: Role, decode: Role,
    goodput: float, ci95: float, rate: float, sample: int, warnings: tuple[str, ...] = (),
) -> Deployment:  # fmt: skip
    from twin.studies.provision import unit_rate
    from twin.studies.samples import replicate_samples

    if not rate > 0:
        raise TwinError(
            f"{spec.source}: the chosen deployment serves no rate meeting the SLOs "
            f"(goodput {goodput:g} req/s); nothing to export"
        )
    unit = unit_rate(spec, replicate_samples(spec, sample, 1)[0])
    slo = spec.slo
    predicted, intervals, hit = _predict(run, unit, rate)
    engine, notes = engine_args(run)
    return Deployment(
        name=_k8s_name(str(spec.resolved.get("name", "pd-twin"))),
        model=spec.model.name,
        hf_model=HF_IDS.get(spec.model.name, spec.model.name),
        gpu=run.topology.gpu_type(0) if run.topology is not None else str(run.gpu.name),
        prefill=prefill,
        decode=decode,
        source=source,
        spec_sha256=spec.sha256,
        slo={"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "target": slo.target},
        goodput_rps=goodput,
        goodput_ci95=ci95,
        rate_rps=rate,
        requests=len(unit),
        predicted=predicted,
        gpus_per_node=(
            len(run.topology.gpus_of_node(0)) if run.topology is not None else run.gpus_per_node
        ),
        intervals=intervals,
        engine=engine,
        caveats=(*warnings, *hit, *notes),
    )


def _role(replicas: int, layout: Any) -> Role:
    """A :class:`Role` of ``replicas`` instances of ``layout`` (a planner
    candidate or an instance group: ``tp``, ``pp``, ``ep``, ``dp``)."""
    ep = int(getattr(layout, "ep", 1) or 1)
    dp = int(getattr(layout, "dp", 1) or 1) if ep > 1 else 1
    return Role(replicas, layout.tp, layout.pp, ep, dp)


def from_plan(spec: ExperimentSpec, plan: Any) -> Deployment:
    """The deployment a :class:`~twin.studies.planner.DistServePlan` of ``spec``
    chose, its figures from a run at the target rate (else at its goodput)."""
    data = copy.deepcopy(dict(spec.resolved))
    over = plan.to_spec_overrides()
    data["cluster"] = over["cluster"]
    data["transfer"] = {**data.get("transfer", {}), **over["transfer"]}
    data["scheduler"] = over["scheduler"]
    run = resolve_spec(data, spec.source, spec.base_dir)
    goodput = plan.capacity_mean  # over the samples, as twin provision's
    rate = plan.target_rate if plan.target_rate is not None else goodput
    return _deployment(
        spec, run, "twin plan",
        _role(plan.n_prefill, plan.prefill), _role(plan.n_decode, plan.decode),
        goodput, plan.capacity_ci95, rate, plan.sample_size, tuple(plan.warnings),
    )  # fmt: skip


def from_provision(data: Mapping[str, Any], where: str, base_dir: Path, prov: Any) -> Deployment:
    """The best split of a :class:`~twin.studies.provision.Provision` of the
    spec ``data``, its figures from a run at its goodput."""
    from twin.studies.provision import _candidate_spec

    spec = resolve_spec(data, where, base_dir, place=False)  # the template searched
    b = prov.best
    pg, dg = b.prefill_group or prov.prefill_group, b.decode_group or prov.decode_group
    run = _candidate_spec(data, where, base_dir, pg, dg, b.prefill, b.decode)
    return _deployment(
        spec, run, "twin provision", _role(b.prefill, pg), _role(b.decode, dg),
        b.goodput_rps, b.goodput_ci95, b.goodput_rps, prov.sample, tuple(prov.warnings),
    )  # fmt: skip


def split_groups(spec: ExperimentSpec, model: str = "") -> dict[str, Any]:
    """``model``'s instance groups by role ("" the only model's): its prefill
    and decode groups, or an error naming the spec (the exports write split
    deployments)."""
    groups = {g.role: g for g in spec.groups if g.model == model}
    if set(groups) != {"prefill", "decode"}:
        where = f"{spec.source}: models.{model}" if model else spec.source
        raise TwinError(
            f"{where}: cluster: {' and '.join(sorted(groups))} instances; the exports write "
            "split deployments (give cluster.prefill and cluster.decode)"
        )
    return groups


def from_run(spec: ExperimentSpec, summary: Mapping[str, Any]) -> list[Deployment]:
    """The deployment ``spec`` gives as it is, one per model (a spec of one
    model: one), its figures from a run of it (``summary``: that run's): each
    model's TTFT and TPOT p90 and p99 and attainment against its SLO, at the
    mean rate its requests arrived at over the run; no goodput was searched.
    A model whose instances are not split into prefill and decode is refused
    (the exports write split deployments)."""
    parts = [(p.name, p.spec, summary["models"][p.name]) for p in spec.models] or [
        ("", spec, summary)
    ]
    out = []
    for name, one, s in parts:
        groups = split_groups(spec, name)
        hit = [f"{w}" for w in summary.get("warnings", ())]
        if s["rejected"]:
            hit.append(f"{s['rejected']} of the {s['requests']} requests were rejected")
        if summary["preemptions"]:
            hit.append(f"{summary['preemptions']} preemptions in the run: the KV cache ran full")
        engine, notes = engine_args(one)
        slo = one.slo
        label = spec.resolved.get("name", "pd-twin")
        out.append(
            Deployment(
                name=_k8s_name(f"{label}-{name}" if name else str(label)),
                model=one.model.name,
                hf_model=HF_IDS.get(one.model.name, one.model.name),
                gpu=spec.topology.gpu_type(0) if spec.topology is not None else spec.gpu.name,
                prefill=_role(groups["prefill"].count, groups["prefill"]),
                decode=_role(groups["decode"].count, groups["decode"]),
                source=f"twin run {Path(spec.source).name}",
                spec_sha256=spec.sha256,
                slo={"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "target": slo.target},
                goodput_rps=math.nan,
                goodput_ci95=math.nan,
                rate_rps=s["requests"] / summary["simulated_s"] if summary["simulated_s"] else 0.0,
                requests=s["requests"],
                predicted={
                    **{k: s[key][q] for k, (key, q) in _FIGURES.items()},
                    "slo_attainment": s["slo_attainment"],
                },
                gpus_per_node=(
                    len(spec.topology.gpus_of_node(0))
                    if spec.topology is not None
                    else spec.gpus_per_node
                ),
                engine=engine,
                caveats=(*hit, *notes),
            )
        )
    return out


# ------------------------------------------------------------------------------ the files


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g} s" if x >= 1 else f"{x * 1e3:.1f} ms"


def _interval_lines(iv: Mapping[str, Any] | None) -> list[str]:
    """The header's line of prediction intervals (none without residuals)."""
    if iv is None:
        return []

    def span(key: str, fmt: Any) -> str:
        b = iv.get(key)
        if b is None:
            return "-"
        hi = "unbounded" if b["hi"] is None else fmt(b["hi"])
        return f"{fmt(b['lo'] or 0.0)} - {hi}"

    pct = "{:.1%}".format
    return [
        f"  {iv['coverage']:.0%} prediction intervals (the perf model's error on {iv['runs']} "
        f"measured runs): TTFT p90 {span('ttft_p90_s', _ms)}, p99 {span('ttft_p99_s', _ms)}; "
        f"TPOT p90 {span('tpot_p90_s', _ms)}, p99 {span('tpot_p99_s', _ms)}; "
        f"attainment {span('slo_attainment', pct)}"
    ]


def header(d: Deployment, what: str) -> str:
    """The comment block that opens an export: what it is and what the twin predicted."""
    f = d.figures()
    ci = "" if f["goodput_ci95"] is None else f" +- {d.goodput_ci95:.3f} (95% CI)"
    slo = d.slo
    gpus = d.prefill.replicas * d.prefill.gpus + d.decode.replicas * d.decode.gpus
    searched = not math.isnan(d.goodput_rps)
    lines = [
        f"{what} for {d.name}, from `{d.source}` (pd-twin {_version.__version__}).",
        f"Spec sha256 {d.spec_sha256}.",
        f"Model {d.model} ({d.hf_model}) on {d.gpu}: {d.prefill.replicas} prefill x "
        f"{_layout(d.prefill)} + {d.decode.replicas} decode x {_layout(d.decode)} "
        f"= {gpus} GPUs; KV over NIXL.",
        "Predicted by the twin:",
        (
            f"  goodput {d.goodput_rps:.3f}{ci} req/s with SLO attainment >= "
            if searched
            else "  the spec's deployment as given (no goodput searched); its SLO: attainment >= "
        )
        + f"{slo['target']:.0%} (TTFT <= {_ms(slo['ttft_s'])}, TPOT <= {_ms(slo['tpot_s'])})",
        f"  at {d.rate_rps:.3f} req/s{'' if searched else ' on average'} ({d.requests} "
        f"requests): TTFT p90 {_ms(f['ttft_p90_s'])}, "
        f"p99 {_ms(f['ttft_p99_s'])}; TPOT p90 {_ms(f['tpot_p90_s'])}, "
        f"p99 {_ms(f['tpot_p99_s'])}; attainment {d.predicted['slo_attainment']:.1%}",
        *_interval_lines(d.intervals),
        "vLLM engine arguments as simulated: " + " ".join(_flags(d.engine)),
        *(
            ["Caveats (what shaped these figures):", *(f"  - {c}" for c in d.caveats)]
            if d.caveats
            else ["Caveats: none (no sample-size warning, no request rejected, no preemption)."]
        ),
        "Images, ports and the secret are the upstream examples'; edit them for your cluster.",
    ]
    out = [f"# {line}".rstrip() for line in lines]
    out.append("# twin: " + json.dumps(f, sort_keys=True, allow_nan=False))
    return "\n".join(out) + "\n"


def _dump(doc: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=False, width=1000)


def _layout(r: Role) -> str:
    text = f"TP{r.tp} PP{r.pp}"
    return f"EP{r.ep} (DP{r.dp} x {text})" if r.ep > 1 else text


def _vllm_args(d: Deployment, role: Role) -> list[str]:
    args = ["--tensor-parallel-size", str(role.tp)]
    if role.pp > 1:
        args += ["--pipeline-parallel-size", str(role.pp)]
    return args + _ep_args(d, role) + _flags(d.engine)


def _ep_args(d: Deployment, role: Role) -> list[str]:
    """vLLM's expert-parallel arguments of ``role``: none for a dense layout."""
    if role.ep == 1:
        return []
    args = ["--enable-expert-parallel", "--data-parallel-size", str(role.dp)]
    nodes = role.nodes(d.gpus_per_node)
    if nodes > 1:
        args += ["--data-parallel-size-local", str(role.dp // nodes)]
    return args


def dynamo_yaml(d: Deployment) -> str:
    """A Dynamo ``DynamoGraphDeployment`` of ``d`` (vLLM backend), header first."""
    kv = json.dumps(KV_TRANSFER, separators=(",", ":"))

    def worker(name: str, mode: str, role: Role) -> dict[str, Any]:
        nodes = role.nodes(d.gpus_per_node)
        gpus = str(role.gpus // nodes)  # per node (per pod) when the instance spans nodes
        container = {
            "name": "main",
            "image": DYNAMO_IMAGE,
            "workingDir": "/workspace/examples/backends/vllm",
            "command": ["python3", "-m", "dynamo.vllm"],
            "args": [
                "--model",
                d.hf_model,
                "--disaggregation-mode",
                mode,
                *_vllm_args(d, role),
                "--kv-transfer-config",
                kv,
            ],  # fmt: skip
            "envFrom": [{"secretRef": {"name": HF_SECRET}}],
            "resources": {
                "limits": {"nvidia.com/gpu": gpus},
                "requests": {"nvidia.com/gpu": gpus},
            },
        }
        out: dict[str, Any] = {
            "name": name,
            "type": mode,
            "replicas": role.replicas,
        }
        if nodes > 1:
            out["multinode"] = {"nodeCount": nodes}
        out["podTemplate"] = {"spec": {"containers": [container]}}
        return out

    doc = {
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": d.name},
        "spec": {
            "components": [
                {
                    "name": "Frontend",
                    "type": "frontend",
                    "replicas": 1,
                    "podTemplate": {
                        "spec": {"containers": [{"name": "main", "image": DYNAMO_IMAGE}]}
                    },
                },
                worker("VllmPrefillWorker", "prefill", d.prefill),
                worker("VllmDecodeWorker", "decode", d.decode),
            ]
        },
    }
    return header(d, "NVIDIA Dynamo DynamoGraphDeployment (kubectl apply -f)") + _dump(doc)


def llm_d_yaml(d: Deployment) -> str:
    """llm-d ModelService Helm values of ``d``, header first."""
    kv = json.dumps(KV_TRANSFER, separators=(",", ":"))

    def role(r: Role, port: int) -> dict[str, Any]:
        nodes = r.nodes(d.gpus_per_node)
        gpus = str(r.gpus // nodes)  # per pod: one pod a node
        args = ["--kv-transfer-config", kv]
        if r.pp > 1:
            args += ["--pipeline-parallel-size", str(r.pp)]
        args += _ep_args(d, r) + _flags(d.engine)
        parallelism: dict[str, int] = {"tensor": r.tp}
        if r.ep > 1:
            parallelism |= {"data": r.dp, "dataLocal": r.dp // nodes, "workers": nodes}
        return {
            "create": True,
            "replicas": r.replicas,
            "parallelism": parallelism,
            "containers": [
                {
                    "name": "vllm",
                    "image": LLM_D_IMAGE,
                    "modelCommand": "vllmServe",
                    "args": args,
                    "env": [
                        {
                            "name": "VLLM_NIXL_SIDE_CHANNEL_PORT",
                            "value": str(NIXL_SIDE_CHANNEL_PORT),
                        },
                        {
                            "name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                        },
                    ],
                    "ports": [
                        {"containerPort": port, "protocol": "TCP"},
                        {"containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"},
                    ],
                    "resources": {
                        "limits": {"nvidia.com/gpu": gpus},
                        "requests": {"nvidia.com/gpu": gpus},
                    },
                    "mountModelVolume": True,
                }
            ],
        }

    multinode = max(d.prefill.nodes(d.gpus_per_node), d.decode.nodes(d.gpus_per_node)) > 1
    doc = {
        "multinode": multinode,
        "modelArtifacts": {"name": d.hf_model, "uri": f"hf://{d.hf_model}"},
        "routing": {"servicePort": LLM_D_SERVICE_PORT},
        "decode": role(d.decode, LLM_D_DECODE_PORT),
        "prefill": role(d.prefill, LLM_D_SERVICE_PORT),
    }
    return header(d, "llm-d ModelService Helm values (helm install -f)") + _dump(doc)


def write_exports(
    d: Deployment | Sequence[Deployment], dynamo: str | None, llm_d: str | None
) -> list[str]:
    """Write the asked-for files, each through :func:`twin._io.write_text`
    once both are rendered (a deployment that cannot be exported leaves no
    file), ``-`` to stdout; the paths of the files written. Several deployments
    (one per model) are one YAML document each, in order."""
    deps = [d] if isinstance(d, Deployment) else list(d)
    texts = [
        (path, "---\n".join(render(one) for one in deps))
        for path, render in ((dynamo, dynamo_yaml), (llm_d, llm_d_yaml))
        if path
    ]
    for path, text in texts:
        if path == "-":
            sys.stdout.write(text)
        else:
            write_text(path, text)
    return [path for path, _ in texts if path != "-"]
