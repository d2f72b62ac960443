"""DistServe's placement planner (Zhong et al., OSDI 2024, arXiv 2401.09670, section 4).

Given a spec (model, GPU topology, SLOs, attainment target, workload), pick
the parallelism of prefill and of decode instances, how many of each, and
where they go, to maximize goodput per GPU:

1. Score each phase alone (section 4.1, Algorithm 1's ``simu_prefill`` and
   ``simu_decode``). For every (tp, pp) a real engine runs (tp dividing the
   heads and the MLP width and dividing, or a multiple of, the KV heads; pp
   dividing the layers; a shape the perf model has) and tp x pp GPUs inside
   one node, the twin itself simulates one instance on a rate-scaled copy of
   a workload sample and a binary search on the rate finds its goodput: the
   largest rate whose attainment of that phase's SLO meets the target. A
   prefill probe runs one prefill instance on the sample's prompts with
   one-token outputs (nothing is decoded, nothing moves) and counts TTFT
   only; a decode probe runs one decode instance fed by enough prefill
   instances of the best prefill configuration that the
   prefill never limits, and counts TPOT only. Probes run on a copy of the
   spec's GPUs with a fabric fast enough that the KV hand-off never limits
   (DistServe's simulator leaves the transfer out too); step 3 deals with the
   network.
2. Take the best goodput per GPU in each phase and replicate (Algorithm 1's
   last lines): either to a target rate, ``ceil(R / goodput)`` of each, or to
   fill the cluster with the P:D counts that balance the phases
   (``n_p x goodput_p ~ n_d x goodput_d``).
3. Placement follows the topology. When the fabric moves a typical prompt's
   KV across nodes in a small share of the TTFT SLO and stays lightly busy at
   the prefill's goodput (high node affinity, section 4.1), instances go
   anywhere (``placement: packed``). Otherwise (low node affinity, section
   4.2, Algorithm 2) every node holds its own prefill and decode instances,
   which may take smaller tp/pp so that they fit together, with
   ``placement: interleaved`` and the runtime's ``pair: node`` keeping each
   hand-off on NVLink. The unit chosen is the node-sized group with the most
   goodput per GPU.

Expert parallelism (a mixture-of-experts model, the Roofline): beside TP x PP
the search scores EP layouts of ``ep / tp`` data-parallel attention ranks,
inside a node and over 2 up to ``max_ep_nodes`` whole nodes (wide EP). A
probe with a wide instance runs on the spec's own nodes and fabric (grown to
the nodes it needs), so that each MoE layer's two all-to-alls cross the real
NICs; its KV hand-off then crosses that fabric too, which the in-node probes
leave out.

NOTE: simplifications, with their consequences. Only expert-parallel
instances span nodes in this twin, so Algorithm 2's instance segments (PP stages of one instance
across nodes, stage-aligned with the other phase) are not available: a model
whose prefill/decode pair does not fit in one node falls back to free
placement over the slow fabric, and the plan says so. PP adds memory, not
speed, in the twin's performance model, so PP configurations only win where
memory is the limit. Goodput comes from a finite sample (a few hundred
requests by default); a sample too small to queue gives optimistic numbers.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from twin._progress import Progress
from twin.errors import CapacityError, ProfileError, SpecError
from twin.request import Request
from twin.scheduler import ClusterView, Plan, Route
from twin.sim.spec import ExperimentSpec, resolve_spec
from twin.studies.samples import (
    DEFAULT_REPLICATES,
    DEFAULT_SAMPLE,
    replicate_samples,
    sample_warnings,
)
from twin.studies.sweep import Executor, Job

__all__ = ["Candidate", "DistServePlan", "plan_distserve"]

PROBE_FABRIC = "3200 Gbps"  # per NIC, one NIC per GPU: the probes' KV never waits
_MAX_BRACKET = 14  # doublings or halvings of the rate before giving up
_MAX_FEED = 32  # most prefill instances feeding a decode probe


@dataclass(frozen=True, slots=True)
class Candidate:
    """One phase's parallel configuration and its simulated goodput.

    ``goodput_rps`` is per instance, requests/s; 0 when the configuration
    cannot meet the target at any rate or cannot hold the weights (``note``).
    """

    role: str
    tp: int
    pp: int
    goodput_rps: float
    note: str = ""
    ep: int = 1  # expert parallelism over ep / tp data-parallel attention ranks (MoE)

    @property
    def dp(self) -> int:
        return self.ep // self.tp if self.ep > 1 else 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def per_gpu(self) -> float:
        return self.goodput_rps / self.gpus

    def label(self) -> str:
        if self.ep > 1:
            return f"TP{self.tp} DP{self.dp} EP{self.ep}"
        return f"TP{self.tp} PP{self.pp}"


@dataclass(frozen=True)
class DistServePlan:
    """What :func:`plan_distserve` chose and why.

    ``capacity_rps`` is the planned goodput of the whole deployment,
    ``min(n_prefill x prefill goodput, n_decode x decode goodput)`` (per node,
    summed, under low affinity). ``handoff_s`` is a typical prompt's
    cross-node KV hand-off on an idle fabric (None on a one-node topology).
    """

    model: str
    topology: Any
    topology_name: str
    nodes: int
    gpus_per_node: int
    slo: Any
    prefill: Candidate
    decode: Candidate
    candidates: tuple[Candidate, ...]
    n_prefill: int
    n_decode: int
    placement: str
    pair: str
    affinity: str
    handoff_s: float | None
    typical_prompt: int
    capacity_rps: float
    target_rate: float | None
    sample_size: int
    simulations: int
    transfer_mode: str
    multi_nic: bool
    reasons: tuple[str, ...] = field(default_factory=tuple)
    capacity_samples: tuple[float, ...] = ()
    """The plan's goodput (req/s) on each independent sample, the planning one first."""
    warnings: tuple[str, ...] = ()

    @property
    def capacity_mean(self) -> float:
        return statistics.fmean(self.capacity_samples) if self.capacity_samples else math.nan

    @property
    def capacity_ci95(self) -> float:
        from twin.studies.samples import ci95

        return ci95(self.capacity_samples)

    @property
    def gpus_used(self) -> int:
        return self.n_prefill * self.prefill.gpus + self.n_decode * self.decode.gpus

    def to_spec_overrides(self) -> dict[str, Any]:
        """The ``cluster``, ``transfer`` and ``scheduler`` mappings that run this plan."""

        def group(n: int, c: Candidate) -> dict[str, int]:
            return {"instances": n, "tp": c.tp, "pp": c.pp} | _ep_keys(c.ep, c.tp)

        return {
            "cluster": {
                "topology": self.topology,
                "nodes": self.nodes,
                "prefill": group(self.n_prefill, self.prefill),
                "decode": group(self.n_decode, self.decode),
                "placement": self.placement,
            },
            "transfer": {
                "mode": self.transfer_mode,
                "handoff": "pull",
                "multi_nic": self.multi_nic,
            },
            "scheduler": {"name": "distserve", "pair": self.pair},
        }

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``twin plan --json`` writes it: the deployment
        (``spec_overrides``, the counts and each phase's chosen candidate),
        its estimated goodput, every scored candidate and the reasons.
        Rates are req/s, times seconds; None where a value is infinite or
        not measured (an SLO not set, no hand-off on one node)."""
        from twin.studies.samples import json_number

        def cand(c: Candidate) -> dict[str, Any]:
            return {
                "role": c.role, "tp": c.tp, "pp": c.pp, **_ep_keys(c.ep, c.tp), "gpus": c.gpus,
                "goodput_rps": c.goodput_rps, "goodput_per_gpu": c.per_gpu, "note": c.note,
            }  # fmt: skip

        return {
            "model": self.model,
            "topology": self.topology_name,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "slo": {
                "ttft_s": json_number(self.slo.ttft_s),
                "tpot_s": json_number(self.slo.tpot_s),
                "target": self.slo.target,
            },
            "prefill": {**cand(self.prefill), "instances": self.n_prefill},
            "decode": {**cand(self.decode), "instances": self.n_decode},
            "gpus_used": self.gpus_used,
            "placement": self.placement,
            "pair": self.pair,
            "affinity": self.affinity,
            "transfer_mode": self.transfer_mode,
            "multi_nic": self.multi_nic,
            "handoff_s": json_number(self.handoff_s),
            "typical_prompt_tokens": self.typical_prompt,
            "capacity_rps": self.capacity_rps,
            "capacity_samples_rps": list(self.capacity_samples),
            "capacity_mean_rps": json_number(self.capacity_mean),
            "capacity_ci95_rps": json_number(self.capacity_ci95),
            "target_rate_rps": self.target_rate,
            "sample_size": self.sample_size,
            "simulations": self.simulations,
            "candidates": [cand(c) for c in self.candidates],
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "spec_overrides": self.to_spec_overrides(),
        }

    def explain(self) -> str:
        """A plain-text account of the plan: the scored candidates, the choice, the reasons."""
        slo = self.slo
        lines = [
            f"DistServe plan: {self.model} on {self.topology_name} x {self.nodes} nodes "
            f"({self.nodes * self.gpus_per_node} GPUs)",
            f"SLO: TTFT <= {_s(slo.ttft_s)}, TPOT <= {_s(slo.tpot_s)}, "
            f"attainment >= {slo.target:.0%}; sample of {self.sample_size} requests, "
            f"median prompt {self.typical_prompt} tokens; {self.simulations} simulations",
            "",
            "goodput per instance, each phase simulated alone (binary search on the rate):",
            f"  {'phase':8}{'config':12}{'GPUs':>5}{'req/s':>10}{'req/s/GPU':>11}",
        ]
        for c in self.candidates:
            mark = "  <- chosen" if c in (self.prefill, self.decode) else ""
            note = f"  ({c.note})" if c.note else ""
            lines.append(
                f"  {c.role:8}{c.label():12}{c.gpus:>5}{c.goodput_rps:>10.2f}"
                f"{c.per_gpu:>11.3f}{mark}{note}"
            )
        lines += ["", *self.reasons, ""]
        lines.append(
            f"plan: {self.n_prefill} x prefill {self.prefill.label()} + {self.n_decode} x decode "
            f"{self.decode.label()} = {self.gpus_used} GPUs, placement {self.placement}, "
            f"est. goodput {self.capacity_rps:.2f} req/s "
            f"({self.capacity_rps / max(1, self.gpus_used):.3f} per GPU)"
        )
        k = len(self.capacity_samples)
        if k > 1:
            lines.append(
                f"over {k} samples of {self.sample_size} requests (the counts kept): "
                f"{self.capacity_mean:.2f} +- {self.capacity_ci95:.2f} req/s (95% CI)"
            )
        lines.append(
            "runtime: scheduler distserve (FCFS per instance, shortest-queue prefill, "
            f"least-loaded decode{', same node' if self.pair == 'node' else ''}), "
            "KV pulled by the decode side"
        )
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _s(x: float) -> str:
    if math.isinf(x):
        return "inf"
    return f"{x * 1e3:g} ms" if x < 1 else f"{x:g} s"


# -- the probe's policy: one controller, shortest queue, least loaded ------------------------
class _Probe:
    """The runtime the probes run (DistServe's, section 4.3); kept here because
    the core does not import the policies in ``schedulers/``."""

    def setup(self, cluster: ClusterView) -> Plan:
        return Plan()

    def route(self, req: Request, view: ClusterView) -> Route:
        p = min(view.of_role("prefill"), key=lambda i: (i.queue_tokens, i.queue_requests, i.id))
        return Route(p.id)

    def pick_decode(self, req: Request, view: ClusterView) -> int:
        d = min(
            view.of_role("decode"),
            key=lambda i: (i.running_requests + i.queue_requests, -i.free_blocks, i.id),
        )
        return d.id


# -- the planner ---------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _first_fit(sizes: Sequence[int], per_node: int) -> list[int]:
    """The node each instance lands on when taken in order, each on the first
    node with room (as :func:`twin.serving.cluster.place_on_topology` places them);
    an instance of more GPUs than a node (wide EP) takes the next whole free
    nodes and lands on the first of them."""
    free: list[int] = []
    out = []
    for s in sizes:
        if s > per_node:
            k = math.ceil(s / per_node)
            out.append(len(free))
            free += [0] * (k - 1) + [k * per_node - s]
            continue
        for k, f in enumerate(free):
            if f >= s:
                free[k] -= s
                out.append(k)
                break
        else:
            free.append(per_node - s)
            out.append(len(free) - 1)
    return out


def _nodes_needed(sizes: Sequence[int], per_node: int) -> int:
    """Nodes of ``per_node`` GPUs that first-fit places ``sizes`` on."""
    where = _first_fit(sizes, per_node)
    return max((k + math.ceil(s / per_node) for k, s in zip(where, sizes, strict=True)), default=1)


def _unit_repeats(cp: Candidate, kp: int, cd: Candidate, kd: int, per_node: int) -> bool:
    """Whether ``interleaved`` placement (P0, D0, P1, D1, ...) of this unit
    replicated on a few nodes puts exactly one unit on every node."""
    from twin.serving.cluster import placement_order

    nodes = 3
    roles = ["prefill"] * (kp * nodes) + ["decode"] * (kd * nodes)
    sizes = [cp.gpus] * (kp * nodes) + [cd.gpus] * (kd * nodes)
    order = placement_order(roles, "interleaved")
    where = _first_fit([sizes[i] for i in order], per_node)
    per: dict[int, list[int]] = {}
    for i, n in zip(order, where, strict=True):
        per.setdefault(n, [0, 0])[roles[i] == "decode"] += 1
    return sorted(per) == list(range(nodes)) and all(v == [kp, kd] for v in per.values())


class _Planner:
    def __init__(
        self,
        spec: ExperimentSpec,
        sample: list[Request],
        max_gpus: int,
        iterations: int,
        max_decode_requests: int,
        max_ep_nodes: int = 1,
    ) -> None:
        topo = spec.topology
        if topo is None:
            raise SpecError(
                f"{spec.source}: cluster.topology: missing; the planner places instances on "
                "a topology (e.g. topology: dgx-h100-ib400)"
            )
        if not sample:
            raise SpecError(f"{spec.source}: the workload sample is empty")
        self.spec = spec
        self.topo = topo
        self.per_node = len(topo.gpus_of_node(0))
        self.max_gpus = min(max_gpus, self.per_node)
        self.max_ep_nodes = max_ep_nodes
        self.iterations = iterations
        self.sample = sorted(sample, key=lambda r: (r.arrival_s, r.id))
        t0 = self.sample[0].arrival_s
        span = self.sample[-1].arrival_s - t0
        n = len(self.sample)
        if span > 0:
            self.base_rate = (n - 1) / span
            self.unit = [(r.arrival_s - t0) * self.base_rate for r in self.sample]
        else:  # no arrival pattern given: evenly spaced
            self.base_rate = 1.0
            self.unit = [float(i) for i in range(n)]
        self.mean_output = statistics.fmean(r.output_tokens for r in self.sample)
        self.max_decode_requests = max_decode_requests
        self.cache: dict[tuple, float] = {}
        self.simulations = 0
        self.unbounded = False

    # one simulation ---------------------------------------------------------------------
    def _spec(self, groups: dict[str, tuple[int, int, int, int]], ttft_at: str) -> ExperimentSpec:
        res = self.spec.resolved
        sizes = [
            tp * pp * (ep // tp if ep > 1 else 1)
            for tp, pp, n, ep in groups.values()
            for _ in range(n)
        ]
        nodes = _nodes_needed(sizes, self.per_node)
        topology: Any = {
            "name": "plan-probe",
            "node": {
                "gpu": self.topo.gpu_type(0),
                "gpus": self.per_node,
                "nics": {"count": self.per_node, "kind": "infiniband", "bandwidth": PROBE_FABRIC},
            },
            "nodes": nodes,
        }
        if max(sizes) > self.per_node:
            # A wide-EP instance's all-to-alls cross the NICs: the probe runs on
            # the spec's own nodes and fabric, as many nodes as it needs.
            topology = res["cluster"]["topology"]
        cluster = {"topology": topology, "placement": "packed"}
        if max(sizes) > self.per_node:
            cluster["nodes"] = nodes
        for role, (tp, pp, n, ep) in groups.items():
            cluster[role] = {"instances": n, "tp": tp, "pp": pp} | _ep_keys(ep, tp)
        slo = {k: v for k, v in res["slo"].items() if v is not None}
        data = {
            "name": f"{res['name']}-plan",
            "seed": res["seed"],
            "model": res["model"],
            "cluster": cluster,
            "engine": {**res["engine"], "oversized": "reject"},
            "perf": res["perf"],
            "transfer": {"mode": "serialized", "handoff": "pull"},
            "workload": res["workload"],
            "slo": {**slo, "ttft_at": ttft_at},
        }
        return resolve_spec(data, self.spec.source, self.spec.base_dir)

    def _requests(self, rate: float, one_token: bool) -> list[Request]:
        scale = 1.0 / rate
        return [
            Request(
                r.id,
                u * scale,
                r.prompt_tokens,
                1 if one_token else r.output_tokens,
                r.prefix_hashes,
                r.prefix_block_tokens,
            )  # fmt: skip
            for r, u in zip(self.sample, self.unit, strict=True)
        ]

    def _attain(self, key: tuple, make: Callable[[], tuple[ExperimentSpec, list[Request], float]]):
        """Attainment of both SLOs over the requests arriving at or after the
        warm-up time that ``make`` returns beside the spec and the requests."""
        if key not in self.cache:
            from twin.sim.simulation import Simulation

            spec, reqs, warm_s = make()
            self.simulations += 1
            met = [0, 0]

            def row(r: dict[str, Any]) -> None:
                if r["arrival_s"] >= warm_s:
                    met[0] += r["slo_met"]
                    met[1] += 1

            Simulation(spec, requests=reqs, scheduler=_Probe(), on_row=row).run()
            self.cache[key] = met[0] / met[1] if met[1] else 0.0
        return self.cache[key]

    def prefill_attainment(self, tp: int, pp: int, rate: float, ep: int = 1) -> float:
        def make():
            shape = (tp, pp, 1, ep)
            spec = self._spec({"prefill": shape, "decode": shape}, "prefill")
            return spec, self._requests(rate, True), 0.0

        return self._attain(("prefill", tp, pp, ep, rate), make)

    def prefill_capacity(self, tp: int, pp: int, ep: int = 1) -> float:
        """Requests/s one prefill instance serves with the whole sample queued
        at once (its throughput, saturated): the ceiling of a goodput search
        that met the target at every rate tried, since then the sample was too
        small to build a queue that breaks the TTFT SLO and the rate found is
        the search's bracket, not the instance's."""
        key = ("prefill-capacity", tp, pp, ep)
        if key not in self.cache:
            from twin.sim.simulation import Simulation

            shape = (tp, pp, 1, ep)
            spec = self._spec({"prefill": shape, "decode": shape}, "prefill")
            reqs = [dataclasses.replace(r, arrival_s=0.0) for r in self._requests(1.0, True)]
            self.simulations += 1
            end = [0.0, 0]

            def row(r: dict[str, Any]) -> None:
                if r["ttft_s"] is not None:
                    end[0] = max(end[0], r["arrival_s"] + r["ttft_s"])
                    end[1] += 1

            Simulation(spec, requests=reqs, scheduler=_Probe(), on_row=row).run()
            self.cache[key] = end[1] / end[0] if end[0] > 0 else math.inf
        return self.cache[key]

    def decode_capacity(self, tp: int, pp: int, feed: Candidate, ep: int = 1) -> float:
        """Requests/s one decode instance completes with the looped sample
        queued at once behind as many prefill instances as a decode probe
        uses at most (its throughput, saturated: the finishing rate over the
        second half of the completions); the ceiling of a decode search that
        met the target at every rate tried, as :meth:`prefill_capacity`. On a
        sample a few batches long it reads low (the last batch part full)."""
        n_p = _MAX_FEED
        key = ("decode-capacity", tp, pp, ep, feed.tp, feed.pp, feed.ep, n_p)
        if key not in self.cache:
            from twin.sim.simulation import Simulation

            groups = {"prefill": (feed.tp, feed.pp, n_p, feed.ep), "decode": (tp, pp, 1, ep)}
            spec = self._spec(groups, "decode")
            top = self.base_rate * 2.0**_MAX_BRACKET  # the rate the search stopped at
            reqs = [dataclasses.replace(r, arrival_s=0.0) for r in self._looped(top)[0]]
            self.simulations += 1
            ends: list[float] = []

            def row(r: dict[str, Any]) -> None:
                if r["finish_s"] is not None:
                    ends.append(r["finish_s"])

            Simulation(spec, requests=reqs, scheduler=_Probe(), on_row=row).run()
            ends.sort()
            h = len(ends) // 2
            span = ends[-1] - ends[h] if ends else 0.0
            self.cache[key] = (len(ends) - 1 - h) / span if span > 0 else math.inf
        return self.cache[key]

    def decode_attainment(
        self, tp: int, pp: int, feed: Candidate, rate: float, ep: int = 1
    ) -> float:
        # Enough prefill instances that they keep up with twice the probe rate. Both
        # SLOs count, TTFT ending when the decode side takes the request up: under pull a decode
        # instance that falls behind keeps TPOT but makes requests wait for it.
        n_p = max(1, min(_MAX_FEED, math.ceil(2 * rate / max(feed.goodput_rps, 1e-9))))

        def make():
            groups = {"prefill": (feed.tp, feed.pp, n_p, feed.ep), "decode": (tp, pp, 1, ep)}
            return self._spec(groups, "decode"), *self._looped(rate)

        key = ("decode", tp, pp, ep, feed.tp, feed.pp, feed.ep, n_p, rate)
        return self._attain(key, make)

    def _looped(self, rate: float) -> tuple[list[Request], float]:
        """The sample at ``rate``, looped until it covers the warm-up (one
        request's decode lifetime at the TPOT SLO, which a decode batch needs to
        fill) plus as long again, at most ``max_decode_requests``; and the
        warm-up time, whose arrivals are not counted."""
        lifetime = self.mean_output * min(self.spec.slo.tpot_s, 1.0)
        want = min(self.max_decode_requests, math.ceil(2 * lifetime * rate))
        copies = max(1, math.ceil(want / len(self.sample)))
        period = (self.unit[-1] + 1.0) / rate
        base = self._requests(rate, False)
        n = len(base)
        reqs = [
            Request(
                k * n + i,
                r.arrival_s + k * period,
                r.prompt_tokens,
                r.output_tokens,
                r.prefix_hashes,
                r.prefix_block_tokens,
            )  # fmt: skip
            for k in range(copies)
            for i, r in enumerate(base)
        ]
        warm = lifetime if copies > 1 else 0.0
        return reqs, min(warm, reqs[-1].arrival_s / 2)

    # goodput search -----------------------------------------------------------------------
    def goodput(self, attain: Callable[[float], float]) -> float:
        """Largest rate with ``attain(rate) >= target``: bracket by doubling or
        halving from the sample's own rate, then bisect geometrically."""
        from twin.studies.goodput import find_max_rate

        target = self.spec.slo.target
        rate, bounded = find_max_rate(
            lambda r: attain(r) >= target,
            self.base_rate,
            iterations=self.iterations,
            up=_MAX_BRACKET,
            down=_MAX_BRACKET,
        )
        if not bounded:
            self.unbounded = True  # meets the target at every rate tried: the sample never queues
        return rate

    def configs(self) -> list[tuple[int, int, str]]:
        """(tp, pp, note) that a real engine can run inside a node (tp shards
        the heads, the MLP width and the KV heads, :meth:`ModelSpec.tp_problem`;
        pp divides the layers); the note says why a config cannot serve
        (weights that do not fit, no entry in a fitted perf model)."""
        from twin.perf.build import build_perf_model
        from twin.perf.gpus import get_gpu
        from twin.serving.kvcache import kv_capacity_blocks

        model, spec = self.spec.model, self.spec
        gpu = get_gpu(self.topo.gpu_type(0))
        out = []
        for tp in _divisors(model.heads):
            if model.tp_problem(tp):
                continue
            for pp in _divisors(model.layers):
                if tp * pp > self.max_gpus:
                    continue
                note = ""
                try:
                    kv_capacity_blocks(
                        gpu_memory_bytes=gpu.memory_bytes,
                        memory_utilization=spec.memory_utilization,
                        weight_bytes=model.weight_bytes,
                        activation_reserve_bytes=spec.activation_reserve_bytes,
                        kv_bytes_per_token=model.kv_bytes_per_token_tp(tp),
                        tp=tp,
                        pp=pp,
                        block_size=spec.engine.block_size,
                    )
                except CapacityError:
                    note = "weights do not fit"
                if not note and spec.perf is not None and spec.perf.get("kind") != "roofline":
                    try:  # a fitted table or profile has rows for some shapes only
                        build_perf_model(
                            spec.perf, model, gpu, tp, pp, where=f"{spec.source}: perf",
                            base_dir=spec.base_dir,
                        )  # fmt: skip
                    except ProfileError:
                        note = "no entry in the perf model's table"
                out.append((tp, pp, note))
        return sorted(out, key=lambda c: (c[0] * c[1], c[1], c[0]))

    def where(self) -> str:
        """Where the searched instances live, for messages."""
        if self.spec.model.is_moe and self.max_ep_nodes > 1 and self.topo.num_nodes > 1:
            return f"within a node or, with EP, over up to {self.max_ep_nodes} nodes"
        return "within a node"

    def expert_configs(self) -> list[tuple[int, int, str]]:
        """(tp, ep, note) of the expert-parallel layouts of a MoE model inside a
        node, or over 2 up to ``max_ep_nodes`` whole nodes of the topology (wide
        EP: ``ep`` a multiple of a node's GPUs): ``ep`` dividing the routed
        experts, ``ep / tp >= 2`` data-parallel attention ranks of ``tp`` GPUs
        each (TP inside a node), no pipeline; the note as in :meth:`configs`.
        Empty for a dense model or a perf model other than the Roofline (the
        only one with EP)."""
        from twin.serving.kvcache import kv_capacity_blocks

        model, spec = self.spec.model, self.spec
        if not model.is_moe or (spec.perf is not None and spec.perf.get("kind") != "roofline"):
            return []
        gpu_mem = _gpu_memory(self.topo)
        wide = self.per_node * min(self.max_ep_nodes, self.topo.num_nodes)
        out = []
        for ep in _divisors(model.experts):
            # inside a node, or over whole nodes (wide EP)
            if ep < 2 or (ep > self.max_gpus and (ep > wide or ep % self.per_node)):
                continue
            for tp in _divisors(ep):
                if ep // tp < 2 or tp > self.max_gpus or model.tp_problem(tp):
                    continue
                note = ""
                try:
                    kv_capacity_blocks(
                        gpu_memory_bytes=gpu_mem,
                        memory_utilization=spec.memory_utilization,
                        weight_bytes=model.weight_bytes_per_gpu(tp, 1, ep) * tp,
                        activation_reserve_bytes=spec.activation_reserve_bytes,
                        kv_bytes_per_token=model.kv_bytes_per_token_tp(tp),
                        tp=tp,
                        pp=1,
                        block_size=spec.engine.block_size,
                    )
                except CapacityError:
                    note = "weights do not fit"
                out.append((tp, ep, note))
        return sorted(out, key=lambda c: (c[1], c[0]))


def _ep_keys(ep: int, tp: int) -> dict[str, int]:
    """A group's ``ep`` and ``dp`` keys: none without EP (a dense layout)."""
    return {"ep": ep, "dp": ep // tp} if ep > 1 else {}


def _gpu_memory(topo: Any) -> float:
    from twin.perf.gpus import get_gpu

    return float(get_gpu(topo.gpu_type(0)).memory_bytes)


def _prefill_probe(pl: _Planner, c: Candidate) -> Callable[[float], float]:
    return lambda r: pl.prefill_attainment(c.tp, c.pp, r, c.ep)


def _decode_probe(pl: _Planner, c: Candidate, feed: Candidate) -> Callable[[float], float]:
    return lambda r: pl.decode_attainment(c.tp, c.pp, feed, r, c.ep)


# Each configuration's goodput search is one job on the executor: the searches
# share nothing (every probe's cache key names its configuration), and the
# bisection inside one stays serial. Jobs take and return plain data.
# max GPUs per in-node instance, bisection steps, decode requests, nodes of a wide-EP instance
_Limits = tuple[int, int, int, int]


def _search(
    spec: ExperimentSpec, sample: list[Request], limits: _Limits, role: str, tp: int, pp: int,
    feed: Candidate | None, ep: int = 1,
) -> tuple[float, bool, int]:  # fmt: skip
    """One configuration's goodput (a job): (rate, whether it met the target at
    every rate tried, simulations run). A decode configuration is fed by ``feed``."""
    pl = _Planner(spec, sample, *limits)
    c = Candidate(role, tp, pp, 0.0, ep=ep)
    if feed is None:
        rate = _prefill_goodput(pl, c)
    else:
        rate = _decode_goodput(pl, c, feed)
    return rate, pl.unbounded, pl.simulations


def _decode_goodput(pl: _Planner, c: Candidate, feed: Candidate) -> float:
    """A decode configuration's goodput fed by ``feed``; where the search met
    the target at every rate tried, at most its saturated throughput."""
    rate = pl.goodput(_decode_probe(pl, c, feed))
    if pl.unbounded:
        rate = min(rate, pl.decode_capacity(c.tp, c.pp, feed, c.ep))
    return rate


def _prefill_goodput(pl: _Planner, c: Candidate) -> float:
    """A prefill configuration's goodput; where the search met the target at
    every rate tried, at most the instance's saturated throughput (a decode
    probe sizes its prefill feed on this figure, and the plan its counts)."""
    rate = pl.goodput(_prefill_probe(pl, c))
    if pl.unbounded:
        rate = min(rate, pl.prefill_capacity(c.tp, c.pp, c.ep))
    return rate


def _rescore(
    spec: ExperimentSpec, sample: list[Request], limits: _Limits, prefill: Candidate,
    decode: Candidate,
) -> tuple[float, float, int]:  # fmt: skip
    """The chosen configurations' goodputs on another sample (a job): the
    prefill's, the decode's fed by that prefill, and the simulations run."""
    rp = _Planner(spec, sample, *limits)
    gp = _prefill_goodput(rp, prefill)
    rp.unbounded = False
    gd = _decode_goodput(rp, decode, dataclasses.replace(prefill, goodput_rps=gp))
    return gp, gd, rp.simulations


def _score(
    ex: Executor, spec: ExperimentSpec, sample: list[Request], limits: _Limits, role: str,
    configs: Sequence[tuple[int, int, str, int]], feed: Candidate | None, bar: Progress,
) -> tuple[list[Candidate], int]:  # fmt: skip
    """Every configuration (tp, pp, note, ep) of ``role`` scored, in the order
    of ``configs`` (the searches run as jobs on ``ex``, each counted on ``bar``
    as it ends), and the simulations they ran."""
    searched = [(tp, pp, ep) for tp, pp, note, ep in configs if not note]
    jobs: list[Job] = [
        (_search, (spec, sample, limits, role, tp, pp, feed, ep)) for tp, pp, ep in searched
    ]
    found = {}
    for i, value in ex.run(jobs):
        found[i] = value
        bar.update()
    by_config = {c: found[i] for i, c in enumerate(searched)}
    out, simulations = [], 0
    for tp, pp, note, ep in configs:
        if note:
            out.append(Candidate(role, tp, pp, 0.0, note, ep))
            continue
        rate, unbounded, sims = by_config[(tp, pp, ep)]
        simulations += sims
        if rate == 0:
            note = "misses the SLO at every rate tried"
        elif unbounded:
            note = "meets the SLO at every rate tried: the sample is too small to queue"
            note += "; capped at its throughput with the sample queued at once"
        out.append(Candidate(role, tp, pp, rate, note, ep))
    return out, simulations


def _best(cands: Sequence[Candidate]) -> Candidate | None:
    ok = [c for c in cands if c.goodput_rps > 0]
    return max(ok, key=lambda c: (c.per_gpu, -c.gpus, -c.pp, -c.tp), default=None)


def plan_distserve(  # noqa: C901
    spec: ExperimentSpec,
    *,
    sample: list[Request] | None = None,
    sample_size: int = DEFAULT_SAMPLE,
    replicates: int = DEFAULT_REPLICATES,
    max_gpus_per_instance: int = 8,
    target_rate: float | None = None,
    affinity_fraction: float = 0.05,
    max_link_busy: float = 0.5,
    iterations: int = 6,
    max_decode_requests: int = 1500,
    max_ep_nodes: int = 4,
    executor: Executor | None = None,
) -> DistServePlan:
    """Plan a DistServe deployment of ``spec``'s model on its topology.

    ``sample``: the requests to simulate (default: the first ``sample_size`` of
    the spec's workload, drawn as a run would); their arrival pattern is kept
    and scaled in time to each probed rate. ``replicates``: independent samples
    (:func:`twin.studies.samples.replicate_samples`; only the given
    ``sample`` when one is given) on which the chosen prefill and decode
    configurations are scored again, the counts kept, for the interval of the
    plan's goodput. ``target_rate`` (requests/s):
    replicate to reach it instead of filling the cluster. High node affinity
    needs a typical prompt's cross-node hand-off within ``affinity_fraction``
    of the TTFT SLO and the path busy at most ``max_link_busy`` of the time at
    the prefill instance's goodput. ``iterations``: bisection steps after the
    bracket. ``max_decode_requests``: a decode probe loops the sample until a
    decode batch has filled (one request lifetime at the TPOT SLO) and as long
    again, up to this many requests; arrivals in the warm-up are not counted.
    ``max_ep_nodes``: a mixture-of-experts model's expert-parallel layouts
    may also span 2 up to this many whole nodes (wide EP, ``ep`` a multiple of
    the node's GPUs), their all-to-alls priced on the topology's NICs.
    ``executor`` runs the searches of each phase's configurations, and the
    scores on the other samples, as parallel jobs (default: one after the
    other, in this process). Deterministic: the same inputs give the same
    plan, on any executor.
    """
    if target_rate is not None and not target_rate > 0:
        raise SpecError(f"target_rate: {target_rate!r} must be > 0")
    if replicates < 1:
        raise SpecError(f"replicates: {replicates!r} must be at least 1")
    if sample is None:
        samples = replicate_samples(spec, sample_size, replicates)
        asked = sample_size
    else:
        samples = [sample]
        asked, replicates = len(sample), 1
    sample = samples[0]
    limits = (max_gpus_per_instance, iterations, max_decode_requests, max_ep_nodes)
    pl = _Planner(spec, sample, *limits)
    configs = [(tp, pp, note, 1) for tp, pp, note in pl.configs()]
    configs += [(tp, 1, note, ep) for tp, ep, note in pl.expert_configs()]
    searches = 2 * sum(1 for _, _, note, _ in configs if not note)  # each configuration, per phase
    with (
        executor if executor is not None else Executor(jobs=1) as ex,
        Progress(searches, "searches", desc="plan") as bar,
    ):
        prefills, simulations = _score(ex, spec, sample, limits, "prefill", configs, None, bar)
        best_p = _best(prefills)
        if best_p is None:
            raise SpecError(
                f"{spec.source}: no prefill configuration {pl.where()} meets the TTFT SLO "
                f"({_s(spec.slo.ttft_s)}) for {spec.slo.target:.0%} of the sample at any rate"
            )
        decodes, sims = _score(ex, spec, sample, limits, "decode", configs, best_p, bar)
        simulations += sims
    best_d = _best(decodes)
    if best_d is None:
        raise SpecError(
            f"{spec.source}: no decode configuration {pl.where()} meets the TPOT SLO "
            f"({_s(spec.slo.tpot_s)}) for {spec.slo.target:.0%} of the sample at any rate"
        )

    topo = spec.topology
    nodes = topo.num_nodes
    per_node = pl.per_node
    prompts = [r.prompt_tokens for r in pl.sample]
    typical = int(statistics.median(prompts))
    reasons = [
        f"prefill: {best_p.label()} has the most goodput per GPU "
        f"({best_p.per_gpu:.3f} req/s/GPU); decode: {best_d.label()} "
        f"({best_d.per_gpu:.3f} req/s/GPU) [section 4.1, Algorithm 1]"
    ]

    handoff_s: float | None = None
    affinity = "single-node"
    if nodes > 1:
        from twin.studies.handoff import handoff_estimate

        est = handoff_estimate(
            spec.model, max(1, typical), topo, tp=best_p.tp, placement="cross-node",
            mode="serialized", multi_nic=spec.transfer.multi_nic,
        )  # fmt: skip
        # The bytes over the fabric decide the affinity: the hand-off's fixed
        # costs are paid inside a node as across nodes.
        handoff_s = float(est["bytes_s"])
        share = handoff_s / spec.slo.ttft_s
        busy = best_p.goodput_rps * handoff_s
        high = share <= affinity_fraction and busy <= max_link_busy
        affinity = "high" if high else "low"
        reasons.append(
            f"network: a {typical}-token prompt's KV ({est['kv_bytes'] / 2**20:,.0f} MiB) "
            f"crosses nodes in {handoff_s * 1e3:.2f} ms on an idle fabric = {share:.1%} of the "
            f"TTFT SLO (limit {affinity_fraction:.0%}); at the prefill goodput the path is busy "
            f"{busy:.0%} of the time (limit {max_link_busy:.0%}) -> "
            + (
                "high node affinity: place instances freely [section 4.1]"
                if high
                else "low node affinity: keep each prefill/decode pair inside a node, on "
                "NVLink [section 4.2, Algorithm 2]"
            )
        )

    placement, pair = "packed", "any"
    unit = None
    if affinity == "low":
        unit = _node_unit(prefills, decodes, per_node)
        if unit is None:
            reasons.append(
                "no prefill/decode pair fits in one node (only EP instances span nodes here), "
                "so the plan places freely and the KV crosses the slow fabric"
            )
            affinity = "low (no pair fits a node)"
    if unit is not None:
        cp, kp, cd, kd = unit
        placement, pair = "interleaved", "node"
        best_p, best_d = cp, cd
        unit_rate = min(kp * cp.goodput_rps, kd * cd.goodput_rps)
        if target_rate is not None:
            nodes = math.ceil(target_rate / unit_rate)
        n_p, n_d = kp * nodes, kd * nodes
        capacity = unit_rate * nodes
        reasons.append(
            f"node unit: {kp} x prefill {cp.label()} + {kd} x decode {cd.label()} "
            f"({kp * cp.gpus + kd * cd.gpus} of {per_node} GPUs) serves {unit_rate:.2f} req/s, "
            "the most per GPU of the pairs that fit a node; "
            + (
                f"{nodes} nodes reach {target_rate:g} req/s"
                if target_rate is not None
                else f"replicated on all {nodes} nodes"
            )
        )
    elif target_rate is not None:
        n_p = math.ceil(target_rate / best_p.goodput_rps)
        n_d = math.ceil(target_rate / best_d.goodput_rps)
        nodes = _nodes_needed([best_p.gpus] * n_p + [best_d.gpus] * n_d, per_node)
        capacity = min(n_p * best_p.goodput_rps, n_d * best_d.goodput_rps)
        reasons.append(
            f"counts: ceil({target_rate:g} / {best_p.goodput_rps:.2f}) = {n_p} prefill, "
            f"ceil({target_rate:g} / {best_d.goodput_rps:.2f}) = {n_d} decode, on {nodes} nodes"
        )
    else:
        n_p, n_d, capacity = _fill(best_p, best_d, nodes, per_node)
        if n_p == 0:
            fits = _fitting_pair(prefills, decodes, nodes, per_node)
            if fits is None:
                raise SpecError(
                    f"{spec.source}: no prefill and decode instance that meet the SLOs fit "
                    f"together on {nodes} nodes of {per_node} GPUs"
                )
            reasons.append(
                f"fit: a prefill {best_p.label()} and a decode {best_d.label()} instance need "
                f"{best_p.gpus + best_d.gpus} GPUs, more than {nodes} x {per_node}; of the "
                "pairs that fit, the one with the most goodput"
            )
            best_p, best_d = fits
            n_p, n_d, capacity = _fill(best_p, best_d, nodes, per_node)
        reasons.append(
            f"counts: fill {nodes * per_node} GPUs balancing the phases "
            f"(n_p x {best_p.goodput_rps:.2f} ~ n_d x {best_d.goodput_rps:.2f} req/s): "
            f"{n_p} prefill, {n_d} decode"
        )

    # The chosen configurations scored again on the other samples, the counts kept.
    caps = [min(n_p * best_p.goodput_rps, n_d * best_d.goodput_rps)]
    jobs: list[Job] = [(_rescore, (spec, other, limits, best_p, best_d)) for other in samples[1:]]
    with (
        executor if executor is not None else Executor(jobs=1) as ex,
        Progress(len(jobs), "samples", desc="plan: the other samples") as bar,
    ):
        rescored = {}
        for i, value in ex.run(jobs):
            rescored[i] = value
            bar.update()
    for k in range(len(jobs)):
        gp, gd, sims = rescored[k]
        caps.append(min(n_p * gp, n_d * gd))
        simulations += sims
    from twin.studies.samples import ci95

    warnings = sample_warnings(
        asked=asked, got=len(sample), target=spec.slo.target, replicates_asked=replicates,
        replicates=len(samples), mean=statistics.fmean(caps), ci=ci95(caps),
        what="plan's goodput",
    )  # fmt: skip

    res_cluster = spec.resolved["cluster"]
    return DistServePlan(
        model=spec.model.name,
        topology=res_cluster["topology"],
        topology_name=topo.name,
        nodes=nodes,
        gpus_per_node=per_node,
        slo=spec.slo,
        prefill=best_p,
        decode=best_d,
        candidates=tuple(prefills + decodes),
        n_prefill=n_p,
        n_decode=n_d,
        placement=placement,
        pair=pair,
        affinity=affinity,
        handoff_s=handoff_s,
        typical_prompt=typical,
        capacity_rps=capacity,
        target_rate=target_rate,
        sample_size=len(pl.sample),
        simulations=simulations,
        transfer_mode=spec.transfer.mode,
        multi_nic=spec.transfer.multi_nic,
        reasons=tuple(reasons),
        capacity_samples=tuple(caps),
        warnings=tuple(warnings),
    )


def _fill(p: Candidate, d: Candidate, nodes: int, per_node: int) -> tuple[int, int, float]:
    """Counts that fill ``nodes`` nodes with the most balanced goodput:
    maximize ``min(n_p g_p, n_d g_d)``, then use fewer GPUs, then fewer prefills."""
    best: tuple[float, int, int, int] | None = None
    for n_p in range(1, nodes * per_node // p.gpus + 1):
        n_d = (nodes * per_node - n_p * p.gpus) // d.gpus
        while n_d > 0 and _nodes_needed([p.gpus] * n_p + [d.gpus] * n_d, per_node) > nodes:
            n_d -= 1
        if n_d == 0:
            continue
        # Drop decode instances the prefill side cannot feed.
        while n_d > 1 and (n_d - 1) * d.goodput_rps >= n_p * p.goodput_rps:
            n_d -= 1
        cap = min(n_p * p.goodput_rps, n_d * d.goodput_rps)
        key = (cap, -(n_p * p.gpus + n_d * d.gpus), -n_p, n_d)
        if best is None or key > best:
            best = key
    if best is None:
        return 0, 0, 0.0
    return -best[2], best[3], best[0]


def _fitting_pair(
    prefills: Sequence[Candidate], decodes: Sequence[Candidate], nodes: int, per_node: int
) -> tuple[Candidate, Candidate] | None:
    """The prefill and decode configurations whose counts filling ``nodes``
    nodes (:func:`_fill`) serve the most goodput (then use fewer GPUs, then
    the most per GPU of each phase), among those that fit at all; or None."""
    best: tuple[tuple, tuple[Candidate, Candidate]] | None = None
    for cp in prefills:
        for cd in decodes:
            if cp.goodput_rps <= 0 or cd.goodput_rps <= 0:
                continue
            n_p, n_d, cap = _fill(cp, cd, nodes, per_node)
            if n_p == 0:
                continue
            gpus = n_p * cp.gpus + n_d * cd.gpus
            key = (cap, -gpus, cp.per_gpu, cd.per_gpu, -cp.gpus, -cd.gpus)
            if best is None or key > best[0]:
                best = (key, (cp, cd))
    return None if best is None else best[1]


def _node_unit(
    prefills: Sequence[Candidate], decodes: Sequence[Candidate], per_node: int
) -> tuple[Candidate, int, Candidate, int] | None:
    """The group of prefill and decode instances that fits one node with the
    most goodput per GPU (Algorithm 2's intra-node configuration), or None."""
    best: tuple[tuple, tuple[Candidate, int, Candidate, int]] | None = None
    for cp in prefills:
        for cd in decodes:
            if cp.goodput_rps <= 0 or cd.goodput_rps <= 0:
                continue
            for kp in range(1, per_node // cp.gpus + 1):
                for kd in range(1, (per_node - kp * cp.gpus) // cd.gpus + 1):
                    if not _unit_repeats(cp, kp, cd, kd, per_node):
                        continue
                    gpus = kp * cp.gpus + kd * cd.gpus
                    rate = min(kp * cp.goodput_rps, kd * cd.goodput_rps)
                    key = (rate / gpus, rate, -gpus, -kp, -cp.gpus, -cd.gpus)
                    if best is None or key > best[0]:
                        best = (key, (cp, kp, cd, kd))
    return None if best is None else best[1]
