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
- :func:`llm_d_yaml`: a values file of llm-d's ModelService Helm chart
  (llm-d-incubation/llm-d-modelservice, ``examples/values-pd.yaml``):
  ``prefill`` and ``decode`` sections with ``replicas``, ``parallelism.tensor``
  and a vLLM container whose ``--kv-transfer-config`` names the NIXL connector.

Both begin with a comment header saying what the twin predicted for the
deployment: the goodput it was chosen for, and TTFT and TPOT (p90, p99) and
SLO attainment of a run of the deployment itself at the chosen rate (the
target rate when one was given, else the goodput), on the sample the choice
was made on; the spec's sha256 ties the file to its inputs. One header line,
``# twin: {...}``, holds the same figures as JSON for tools.

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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from twin import _version
from twin.errors import TwinError
from twin.perf.llm import HF_IDS
from twin.request import Request
from twin.sim.spec import ExperimentSpec, resolve_spec

__all__ = [
    "Deployment",
    "Role",
    "dynamo_yaml",
    "from_plan",
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
    """One phase's instances: how many, and the parallelism of each."""

    replicas: int
    tp: int
    pp: int

    @property
    def gpus(self) -> int:
        """GPUs of one replica."""
        return self.tp * self.pp


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

    def figures(self) -> dict[str, Any]:
        """The header's figures, as the ``# twin:`` line holds them."""
        return {
            "source": self.source,
            "spec_sha256": self.spec_sha256,
            "model": self.model,
            "gpu": self.gpu,
            "prefill": dataclasses.asdict(self.prefill),
            "decode": dataclasses.asdict(self.decode),
            "slo": dict(self.slo),
            "goodput_rps": _num(self.goodput_rps),
            "goodput_ci95": _num(self.goodput_ci95),
            "rate_rps": self.rate_rps,
            "requests": self.requests,
            **{k: _num(v) for k, v in self.predicted.items()},
        }


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) else x


def _k8s_name(name: str) -> str:
    """A Kubernetes object name (RFC 1123 label: a-z, 0-9, '-', at most 63)."""
    out = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:63].rstrip("-")
    return out or "pd-twin"


def _predict(spec: ExperimentSpec, unit: list[Request], rate: float) -> dict[str, float]:
    """TTFT/TPOT p90 and p99 and SLO attainment of ``spec`` on ``unit`` (a
    sample at one request per second) replayed at ``rate``."""
    from twin.sim.simulation import Simulation

    reqs = [dataclasses.replace(r, arrival_s=r.arrival_s / rate) for r in unit]
    s = Simulation(spec, requests=reqs).run().summary
    return {
        "ttft_p90_s": s["ttft_s"]["p90"],
        "ttft_p99_s": s["ttft_s"]["p99"],
        "tpot_p90_s": s["tpot_s"]["p90"],
        "tpot_p99_s": s["tpot_s"]["p99"],
        "slo_attainment": s["slo_attainment"],
    }


def _deployment(
    spec: ExperimentSpec, run: ExperimentSpec, source: str, prefill: Role, decode: Role,
    goodput: float, ci95: float, rate: float, sample: int,
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
        predicted=_predict(run, unit, rate),
    )


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
        Role(plan.n_prefill, plan.prefill.tp, plan.prefill.pp),
        Role(plan.n_decode, plan.decode.tp, plan.decode.pp),
        goodput, plan.capacity_ci95, rate, plan.sample_size,
    )  # fmt: skip


def from_provision(data: Mapping[str, Any], where: str, base_dir: Path, prov: Any) -> Deployment:
    """The best split of a :class:`~twin.studies.provision.Provision` of the
    spec ``data``, its figures from a run at its goodput."""
    from twin.studies.provision import _candidate_spec

    spec = resolve_spec(data, where, base_dir)
    b = prov.best
    pg, dg = b.prefill_group or prov.prefill_group, b.decode_group or prov.decode_group
    run = _candidate_spec(data, where, base_dir, pg, dg, b.prefill, b.decode)
    return _deployment(
        spec, run, "twin provision", Role(b.prefill, pg.tp, pg.pp), Role(b.decode, dg.tp, dg.pp),
        b.goodput_rps, b.goodput_ci95, b.goodput_rps, prov.sample,
    )  # fmt: skip


# ------------------------------------------------------------------------------ the files


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g} s" if x >= 1 else f"{x * 1e3:.1f} ms"


def header(d: Deployment, what: str) -> str:
    """The comment block that opens an export: what it is and what the twin predicted."""
    f = d.figures()
    ci = "" if f["goodput_ci95"] is None else f" +- {d.goodput_ci95:.3f} (95% CI)"
    slo = d.slo
    gpus = d.prefill.replicas * d.prefill.gpus + d.decode.replicas * d.decode.gpus
    lines = [
        f"{what} for {d.name}, from `{d.source}` (pd-twin {_version.__version__}).",
        f"Spec sha256 {d.spec_sha256}.",
        f"Model {d.model} ({d.hf_model}) on {d.gpu}: {d.prefill.replicas} prefill x "
        f"TP{d.prefill.tp} PP{d.prefill.pp} + {d.decode.replicas} decode x TP{d.decode.tp} "
        f"PP{d.decode.pp} = {gpus} GPUs; KV over NIXL.",
        "Predicted by the twin:",
        f"  goodput {d.goodput_rps:.3f}{ci} req/s with SLO attainment >= "
        f"{slo['target']:.0%} (TTFT <= {_ms(slo['ttft_s'])}, TPOT <= {_ms(slo['tpot_s'])})",
        f"  at {d.rate_rps:.3f} req/s ({d.requests} requests): TTFT p90 {_ms(f['ttft_p90_s'])}, "
        f"p99 {_ms(f['ttft_p99_s'])}; TPOT p90 {_ms(f['tpot_p90_s'])}, "
        f"p99 {_ms(f['tpot_p99_s'])}; attainment {d.predicted['slo_attainment']:.1%}",
        "Images, ports and the secret are the upstream examples'; edit them for your cluster.",
    ]
    out = [f"# {line}".rstrip() for line in lines]
    out.append("# twin: " + json.dumps(f, sort_keys=True, allow_nan=False))
    return "\n".join(out) + "\n"


def _dump(doc: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=False, width=1000)


def _vllm_args(d: Deployment, role: Role) -> list[str]:
    args = ["--tensor-parallel-size", str(role.tp)]
    if role.pp > 1:
        args += ["--pipeline-parallel-size", str(role.pp)]
    return args


def dynamo_yaml(d: Deployment) -> str:
    """A Dynamo ``DynamoGraphDeployment`` of ``d`` (vLLM backend), header first."""
    kv = json.dumps(KV_TRANSFER, separators=(",", ":"))

    def worker(name: str, mode: str, role: Role) -> dict[str, Any]:
        gpus = str(role.gpus)
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
        return {
            "name": name,
            "type": mode,
            "replicas": role.replicas,
            "podTemplate": {"spec": {"containers": [container]}},
        }

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
        gpus = str(r.gpus)
        args = ["--kv-transfer-config", kv]
        if r.pp > 1:
            args += ["--pipeline-parallel-size", str(r.pp)]
        return {
            "create": True,
            "replicas": r.replicas,
            "parallelism": {"tensor": r.tp},
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

    doc = {
        "multinode": False,
        "modelArtifacts": {"name": d.hf_model, "uri": f"hf://{d.hf_model}"},
        "routing": {"servicePort": LLM_D_SERVICE_PORT},
        "decode": role(d.decode, LLM_D_DECODE_PORT),
        "prefill": role(d.prefill, LLM_D_SERVICE_PORT),
    }
    return header(d, "llm-d ModelService Helm values (helm install -f)") + _dump(doc)


def check_writable(*paths: str | None) -> None:
    """Fail before a long search, not after it, on a file that cannot be written."""
    for path in paths:
        if path:
            try:
                with open(path, "a", encoding="utf-8"):
                    pass
            except OSError as e:
                raise TwinError(f"{path}: cannot write: {e.strerror}") from None


def write_exports(d: Deployment, dynamo: str | None, llm_d: str | None) -> list[str]:
    """Write the asked-for files; their paths."""
    written = []
    for path, text in ((dynamo, dynamo_yaml), (llm_d, llm_d_yaml)):
        if path:
            try:
                Path(path).write_text(text(d), encoding="utf-8")
            except OSError as e:
                raise TwinError(f"{path}: cannot write: {e.strerror}") from None
            written.append(path)
    return written
