"""Provisioning: the prompt:token split with the best goodput within a budget.

Splitwise's cluster design study (Patel et al., ISCA 2024, arXiv 2311.18677,
section VI: iso-power and iso-cost clusters) searches the numbers of prompt
and token machines that a power (or cost) budget allows and keeps the one
with the highest throughput under the SLOs. This does the same for any split
spec: for a budget in watts or in GPUs, it lists every prefill:decode count
that fills the budget (no further instance of either role fits), estimates
each one's goodput by simulation, and reports the best.

For a mixture-of-experts model (on the Roofline) each role is searched in
its spec layout and in every expert-parallel layout valid for it
(:func:`layouts`: ``ep`` dividing the routed experts, ``ep = dp x tp`` at the
spec's ``tp``, the weights leaving room for KV), every pair of layouts with
its splits; each candidate names its layouts. A dense model's search is the
spec's layout only.

Power follows the hardware: a split's power is the catalog TDP of every GPU
its instances are placed on, summed (on a topology that mixes H100 and
power-capped H100 nodes, an instance on a capped node costs 490 W a GPU, one
on an H100 node 700 W). A role group that names a node template
(``cluster.decode.template``) is placed on that template's nodes, and a
power budget counts each of its instances at that template's GPUs.
NOTE: a role without a template is counted, while the splits are listed, at
the GPU of the node its first instance lands on in the spec as given; the
power reported is always that of the placement the split runs on. A split
that a topology of several node groups cannot hold is left out, with why.

Goodput is the largest request rate whose SLO attainment reaches the spec's
``slo.target``: the spec's workload, cut to ``sample`` requests and scaled to
a mean rate of one request per second, is replayed at rate ``r`` (arrival
times divided by ``r``), and ``r`` is found by doubling, then bisection to a
relative tolerance.

Each split's goodput is the mean over ``replicates`` independent samples
(:func:`twin.studies.samples.replicate_samples`) with the half-width of its
95% confidence interval; the best is the split with the highest mean, and
the result warns (:func:`twin.studies.samples.sample_warnings`) when the
sample is too small for the target, and when the best split's interval
overlaps another's (the sample does not tell them apart).

NOTE: attainment need not fall monotonically with the rate on a small
sample; the bisection returns a rate that meets the target with a faster one
that does not, not necessarily the largest. A larger ``sample`` steadies it.
NOTE: a trial replays ``sample`` requests, so at rate ``r`` it covers
``sample / r`` seconds; when that is short next to the TTFT objective, the
queues absorb the whole sample as one burst and the goodput comes out high
(the search stops doubling at 4,096 req/s).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from twin._progress import Progress
from twin.errors import CapacityError, SpecError
from twin.perf.gpus import GPUSpec, get_gpu
from twin.request import Request
from twin.serving.cluster import Placement
from twin.serving.kvcache import kv_capacity_blocks
from twin.sim.layout import place
from twin.sim.spec import ExperimentSpec, InstanceGroup, placed, resolve_spec
from twin.studies.samples import (
    DEFAULT_REPLICATES,
    DEFAULT_SAMPLE,
    ci95,
    horizon_s,
    replicate_samples,
    sample_warnings,
)
from twin.studies.sweep import Executor, Job
from twin.workload.stream import iter_requests


@dataclass(frozen=True)
class Candidate:
    """One prefill:decode split, its cost and its estimated goodput (req/s)."""

    prefill: int
    decode: int
    gpus: int
    power_w: float
    goodput_rps: float  # the mean over the samples
    goodput_ci95: float = math.nan  # half-width of its 95% interval (NaN for one sample)
    goodputs_rps: tuple[float, ...] = ()  # one per sample
    prefill_group: InstanceGroup | None = None  # the layouts this split runs (None: the spec's)
    decode_group: InstanceGroup | None = None

    @property
    def goodput_per_gpu(self) -> float:
        return self.goodput_rps / self.gpus


@dataclass(frozen=True)
class Provision:
    """Every split searched that the topology holds, in order of prefill
    count, and the best one."""

    candidates: list[Candidate]
    best: Candidate
    budget: str
    prefill_group: InstanceGroup
    decode_group: InstanceGroup
    left_out: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)
    """Splits the topology cannot hold: ``(prefill, decode, why)``."""
    sample: int = 0  # requests per sample
    warnings: list[str] = dataclasses.field(default_factory=list)
    layouts: bool = False
    """Whether EP layouts were searched (a MoE model): each candidate names its own."""

    def to_dict(self) -> dict[str, Any]:
        """The search as ``twin provision --json`` writes it: the budget, each
        role's instance shape, every split searched (goodput in req/s, mean
        over the samples, its 95% half-width or None for one sample), the
        splits left out and why, and the best split."""
        from twin.studies.samples import json_number

        def group(g: InstanceGroup) -> dict[str, Any]:
            moe = {"ep": g.ep, "dp": g.dp} if g.ep > 1 or g.dp > 1 else {}
            return {"tp": g.tp, "pp": g.pp, **moe, "template": g.template}

        def cand(c: Candidate) -> dict[str, Any]:
            out: dict[str, Any] = {
                "prefill": c.prefill, "decode": c.decode, "gpus": c.gpus, "power_w": c.power_w,
                "goodput_rps": c.goodput_rps, "goodput_ci95": json_number(c.goodput_ci95),
                "goodputs_rps": list(c.goodputs_rps), "goodput_per_gpu": c.goodput_per_gpu,
            }  # fmt: skip
            if self.layouts:
                out["prefill_group"] = group(c.prefill_group or self.prefill_group)
                out["decode_group"] = group(c.decode_group or self.decode_group)
            return out

        return {
            "budget": self.budget,
            "prefill_group": group(self.prefill_group),
            "decode_group": group(self.decode_group),
            "sample": self.sample,
            "candidates": [cand(c) for c in self.candidates],
            "best": cand(self.best),
            "left_out": [{"prefill": p, "decode": d, "why": w} for p, d, w in self.left_out],
            "warnings": list(self.warnings),
        }


_WATTS = {"W": 1.0, "kW": 1e3, "MW": 1e6}


def parse_watts(value: object, where: str = "power") -> float:
    """Watts from ``20000``, ``"20000 W"``, ``"20 kW"``, ``"1.5 MW"``; > 0."""
    text = str(value).strip()
    unit = next((u for u in sorted(_WATTS, key=len, reverse=True) if text.endswith(u)), "")
    try:
        w = float(text[: len(text) - len(unit)].strip()) * _WATTS.get(unit, 1.0)
    except ValueError:
        raise SpecError(f"{where}: {value!r} is not a power; expected e.g. '20 kW'") from None
    if not (w > 0 and math.isfinite(w)):
        raise SpecError(f"{where}: {value!r} must be > 0")
    return w


def _groups(spec: ExperimentSpec) -> tuple[InstanceGroup, InstanceGroup]:
    by_role = {g.role: g for g in spec.groups}
    if set(by_role) != {"prefill", "decode"}:
        raise SpecError(
            f"{spec.source}: cluster: provisioning searches prefill:decode splits; give "
            "cluster.prefill and cluster.decode (their tp and pp are kept)"
        )
    return by_role["prefill"], by_role["decode"]


def _instances(spec: ExperimentSpec) -> tuple[list[str], list[int], list[str | None]]:
    """Each instance's role, GPU count and node template, in id order."""
    each = [g for g in spec.groups for _ in range(g.count)]
    return [g.role for g in each], [g.gpus for g in each], [g.template for g in each]


def _place(spec: ExperimentSpec) -> list[Placement]:
    """Where the run puts the spec's instances (as the spec resolves them)."""
    return place(spec.groups, spec.topology, spec.placement, spec.gpus_per_node, spec.source)


def placed_power_w(spec: ExperimentSpec) -> float:
    """The TDP (W) of every GPU the spec's instances run on, summed: per
    instance, its GPUs' catalog TDP on the nodes it is placed on; without a
    topology, every GPU is the spec's ``gpu``."""
    if spec.topology is None:
        return sum(g.count * g.gpus for g in spec.groups) * spec.gpu.tdp_w
    topo = spec.topology
    return sum(get_gpu(topo.gpu_type(i)).tdp_w for p in _place(spec) for i in p.gpus)


def _role_gpu(spec: ExperimentSpec, group: InstanceGroup) -> GPUSpec:
    """The GPU ``group``'s instances are placed on: its template's GPU, else
    that of the node the spec places its first instance on."""
    topo = spec.topology
    if topo is None:
        return spec.gpu
    if group.template is not None:
        node = next(k for k in range(topo.num_nodes) if topo.template_of(k) == group.template)
        return get_gpu(topo.gpu_type(topo.gpus_of_node(node)[0]))
    places = _place(spec)
    roles = _instances(spec)[0]
    first = next(p for p, r in zip(places, roles, strict=True) if r == group.role)
    return get_gpu(topo.gpu_type(first.gpus[0]))


def _role_tdp(spec: ExperimentSpec, group: InstanceGroup) -> float:
    """TDP (W) of one GPU of the type ``group``'s instances are placed on."""
    return _role_gpu(spec, group).tdp_w


def _holds_weights(spec: ExperimentSpec, gpu: GPUSpec, g: InstanceGroup) -> bool:
    """Whether ``g``'s layout leaves room for KV on ``gpu`` after its weights
    (as the run sizes an expert-parallel instance's KV)."""
    model = spec.model
    try:
        kv_capacity_blocks(
            gpu_memory_bytes=gpu.memory_bytes,
            memory_utilization=spec.memory_utilization,
            weight_bytes=model.weight_bytes_per_gpu(g.tp, g.pp, g.ep) * g.tp * g.pp,
            activation_reserve_bytes=spec.activation_reserve_bytes,
            kv_bytes_per_token=model.kv_bytes_per_token_tp(g.tp),
            tp=g.tp,
            pp=g.pp,
            block_size=spec.engine.block_size,
        )
    except CapacityError:
        return False
    return True


def layouts(spec: ExperimentSpec, group: InstanceGroup, most_gpus: int) -> list[InstanceGroup]:
    """The layouts a role is searched in, in order of ``ep``: the spec's own,
    and for a mixture-of-experts model on the Roofline every expert-parallel
    layout valid for the role: ``ep`` dividing the routed experts, ``ep =
    dp x tp`` over ``dp >= 2`` data-parallel attention ranks of the group's
    ``tp`` (its ``pp`` kept), at most ``most_gpus`` GPUs an instance, and
    the weights leaving room for KV on the role's GPU. A dense model: the
    spec's layout only."""
    model = spec.model
    if not model.is_moe or (spec.perf is not None and spec.perf.get("kind") != "roofline"):
        return [group]
    gpu = _role_gpu(spec, group)
    found = {(group.ep, group.dp): group}
    for ep in range(group.tp * 2, model.experts + 1, group.tp):
        g = dataclasses.replace(group, ep=ep, dp=ep // group.tp)
        if model.experts % ep or g.gpus > most_gpus or (ep, g.dp) in found:
            continue
        if _holds_weights(spec, gpu, g):
            found[(ep, g.dp)] = g
    return sorted(found.values(), key=lambda g: (g.ep, g.dp))


def sample_requests(spec: ExperimentSpec, sample: int) -> list[Request]:
    """The first ``sample`` requests of the spec's workload, shifted to start
    at 0 and scaled to a mean rate of 1 request/s."""
    seeds = np.random.SeedSequence(spec.seed).spawn(2)
    reqs = []
    for req in iter_requests(spec.workload, np.random.default_rng(seeds[0])):
        reqs.append(req)
        if len(reqs) >= sample:
            break
    return unit_rate(spec, reqs)


def unit_rate(spec: ExperimentSpec, reqs: list[Request]) -> list[Request]:
    """``reqs`` shifted to start at 0 and scaled to a mean rate of 1 request/s."""
    if len(reqs) < 2:
        raise SpecError(f"{spec.source}: workload: provisioning needs at least 2 requests")
    t0, span = reqs[0].arrival_s, reqs[-1].arrival_s - reqs[0].arrival_s
    scale = (len(reqs) - 1) / span if span > 0 else 1.0
    return [
        dataclasses.replace(r, id=k, arrival_s=(r.arrival_s - t0) * scale)
        for k, r in enumerate(reqs)
    ]


def attainment(spec: ExperimentSpec, reqs: list[Request], rate: float) -> float:
    from twin.sim.simulation import Simulation

    scaled = [dataclasses.replace(r, arrival_s=r.arrival_s / rate) for r in reqs]
    return float(Simulation(spec, requests=scaled).run().summary["slo_attainment"])


def goodput(
    spec: ExperimentSpec, reqs: list[Request], *, tol: float = 0.05, max_doublings: int = 12
) -> float:
    """The largest rate (req/s) whose attainment reaches ``spec.slo.target``,
    to a relative tolerance ``tol``; 0 when even 1/1024 req/s misses it."""
    from twin.studies.goodput import find_max_rate

    target = spec.slo.target
    rate, _ = find_max_rate(
        lambda r: attainment(spec, reqs, r) >= target,
        1.0,
        rel_tol=tol,
        up=max_doublings,
        down=10,
    )
    return rate


def _goodput_job(spec: ExperimentSpec, reqs: list[Request], tol: float) -> float:
    """:func:`goodput` of one split on one sample: a job for the executor."""
    return goodput(spec, reqs, tol=tol)


def _candidate_spec(
    data: Mapping[str, Any], where: str, base_dir: Path, pg: InstanceGroup, dg: InstanceGroup,
    n_p: int, n_d: int,
) -> ExperimentSpec:  # fmt: skip
    d = copy.deepcopy(dict(data))
    cl = dict(d.get("cluster") or {})
    cl.pop("instances", None)
    cl.pop("gpus", None)
    for role, g, n in (("prefill", pg, n_p), ("decode", dg, n_d)):
        cl[role] = {"instances": n, "tp": g.tp, "pp": g.pp}
        if g.ep > 1 or g.dp > 1:  # an expert-parallel group keeps its layout
            cl[role].update(ep=g.ep, dp=g.dp)
        if g.template is not None:
            cl[role]["template"] = g.template
    d["cluster"] = cl
    spec = resolve_spec(d, where, base_dir, place=False)
    # A topology too small for the split grows a node at a time; one that
    # cannot (several node groups, or the explicit form) says the split does
    # not fit.
    for _ in range(256):
        if spec.topology is None:
            break
        try:
            _place(spec)
            break
        except SpecError as e:
            cl["nodes"] = spec.topology.num_nodes + 1
            try:
                spec = resolve_spec(d, where, base_dir, place=False)
            except SpecError:
                raise e from None
    return placed(spec)


def provision(  # noqa: C901
    data: Mapping[str, Any],
    where: str,
    base_dir: Path,
    *,
    power_w: float | None = None,
    gpus: int | None = None,
    sample: int = DEFAULT_SAMPLE,
    replicates: int = DEFAULT_REPLICATES,
    tol: float = 0.05,
    executor: Executor | None = None,
) -> Provision:
    """Search prefill:decode instance counts within a budget of ``power_w``
    watts or ``gpus`` GPUs (default: the spec's own GPU count) for the best
    goodput; ``data`` is a parsed spec (as ``twin.sim.spec.load_spec`` reads it).
    ``executor`` runs the goodput searches, one per split and sample, as
    parallel jobs (default: one after the other, here); the result is the
    same on any executor."""
    base = resolve_spec(data, where, base_dir, place=False)  # its groups, as a template
    pg, dg = _groups(base)
    if power_w is not None and gpus is not None:
        raise SpecError("give a power budget or a GPU budget, not both")
    tdp_p, tdp_d = _role_tdp(base, pg), _role_tdp(base, dg)
    if power_w is not None:
        if not power_w > 0:
            raise SpecError(f"power budget {power_w!r} W must be > 0")
        tdp_p, tdp_d, budget, label = tdp_p, tdp_d, float(power_w), f"{power_w:,.0f} W"
    else:
        if gpus is None:
            gpus = pg.count * pg.gpus + dg.count * dg.gpus
        if gpus <= 0:
            raise SpecError(f"GPU budget {gpus!r} must be > 0")
        tdp_p, tdp_d, budget, label = 1.0, 1.0, float(gpus), f"{gpus} GPUs"
    if sample < 2:
        raise SpecError(f"sample {sample!r} must be at least 2 requests")
    if replicates < 1:
        raise SpecError(f"replicates {replicates!r} must be at least 1")
    # Each pair of layouts (one for a dense model) with every split that fills the budget.
    most = int(budget // min(tdp_p, tdp_d))
    pairs = [(lp, ld) for lp in layouts(base, pg, most) for ld in layouts(base, dg, most)]
    searched = len(pairs) > 1
    splits = []
    for lp, ld in pairs:
        cost_p, cost_d = lp.gpus * tdp_p, ld.gpus * tdp_d
        n_p = 1
        while n_p * cost_p + cost_d <= budget + 1e-9:
            n_d = int((budget - n_p * cost_p) // cost_d + 1e-9)
            splits.append((lp, ld, n_p, n_d))
            n_p += 1
    if not splits:
        raise SpecError(
            f"a budget of {label} holds no prefill + decode pair "
            f"({pg.gpus * tdp_p + dg.gpus * tdp_d:g} "
            f"{'W' if power_w is not None else 'GPUs'} for the smallest)"
        )
    samples = [unit_rate(base, r) for r in replicate_samples(base, sample, replicates)]
    out = []
    left_out: list[tuple[int, int, str]] = []
    held: list[tuple[InstanceGroup, InstanceGroup, int, int, ExperimentSpec]] = []
    for lp, ld, n_p, n_d in splits:
        try:
            spec = _candidate_spec(data, where, base_dir, lp, ld, n_p, n_d)
            held.append((lp, ld, n_p, n_d, spec))
        except SpecError as e:
            why = f"{_layout(lp)} + {_layout(ld)}: {e}" if searched else str(e)
            left_out.append((n_p, n_d, why))
    jobs: list[Job] = [(_goodput_job, (spec, reqs, tol)) for *_, spec in held for reqs in samples]
    with (
        executor if executor is not None else Executor(jobs=1) as ex,
        Progress(len(jobs), "searches", desc="provision") as bar,  # a split on a sample each
    ):
        found = {}
        for i, value in ex.run(jobs):
            found[i] = value
            bar.update()
    k = len(samples)
    for i, (lp, ld, n_p, n_d, spec) in enumerate(held):
        rates = tuple(found[i * k + j] for j in range(k))
        out.append(
            Candidate(
                prefill=n_p,
                decode=n_d,
                gpus=n_p * lp.gpus + n_d * ld.gpus,
                power_w=placed_power_w(spec),
                goodput_rps=float(np.mean(rates)),
                goodput_ci95=ci95(rates),
                goodputs_rps=rates,
                prefill_group=lp,
                decode_group=ld,
            )
        )
    if not out:  # every split of the budget left out: say so, not as if the first one ended it
        n_p, n_d, why = left_out[0]
        raise SpecError(
            f"a budget of {label}: none of its {len(left_out)} splits fits the topology, so "
            f"none was searched (give a budget the topology holds); {n_p}:{n_d}: {why}"
        )
    best = max(out, key=lambda c: (c.goodput_rps, -c.power_w, -c.prefill))
    warnings = sample_warnings(
        asked=sample, got=len(samples[0]), target=base.slo.target, replicates_asked=replicates,
        replicates=len(samples), mean=best.goodput_rps, ci=best.goodput_ci95,
        what="best split's goodput", horizon_s=horizon_s(base.slo, samples[0]),
    )  # fmt: skip
    for c in out:
        if c is not best and _overlap(best, c):
            warnings.append(
                f"the best split's interval ({best.goodput_rps:.3f} +- {best.goodput_ci95:.3f}) "
                f"overlaps {_split(c, searched)}'s ({c.goodput_rps:.3f} +- "
                f"{c.goodput_ci95:.3f} req/s): the sample does not tell them apart"
            )
    return Provision(out, best, label, pg, dg, left_out, len(samples[0]), warnings, searched)


def _overlap(a: Candidate, b: Candidate) -> bool:
    if math.isnan(a.goodput_ci95) or math.isnan(b.goodput_ci95):
        return False
    return a.goodput_rps - a.goodput_ci95 <= b.goodput_rps + b.goodput_ci95


def _on(g: InstanceGroup) -> str:
    ep = f" DP{g.dp} EP{g.ep}" if g.ep > 1 else ""
    return ep + ("" if g.template is None else f" on {g.template}")


def _layout(g: InstanceGroup) -> str:
    """A role's layout as the EP search reports it: ``TP8``, ``TP1 DP16 EP16``."""
    if g.ep > 1:
        return f"TP{g.tp} DP{g.dp} EP{g.ep}"
    return f"TP{g.tp}" + (f" PP{g.pp}" if g.pp > 1 else "")


def _layouts(p: Provision, c: Candidate) -> tuple[str, str]:
    """Candidate ``c``'s prefill and decode layouts (the provision's own where
    ``c`` keeps them)."""
    return _layout(c.prefill_group or p.prefill_group), _layout(c.decode_group or p.decode_group)


def _split(c: Candidate, layouts: bool) -> str:
    """``2:1``, and with an EP search each role's layout: ``2:1 (EP16/EP32)``."""
    if not layouts or c.prefill_group is None or c.decode_group is None:
        return f"{c.prefill}:{c.decode}"
    return f"{c.prefill}:{c.decode} ({_layout(c.prefill_group)} / {_layout(c.decode_group)})"


def format_provision(p: Provision) -> str:
    """The table ``twin provision`` prints; with an EP search (a MoE model)
    each split's row names the layouts of its prefill and decode instances."""
    if p.layouts:
        head = [
            f"budget {p.budget}: prefill x N, decode x M, each role in every EP layout valid "
            f"for it (the spec's: prefill {_layout(p.prefill_group)}, decode "
            f"{_layout(p.decode_group)})",
            f"{'prefill':>8}{'as':>15}{'decode':>8}{'as':>15}{'gpus':>6}{'power W':>10}"
            f"{'goodput rps':>13}{'+- 95% CI':>11}{'per GPU':>10}",
        ]
    else:
        head = [
            f"budget {p.budget}: prefill TP{p.prefill_group.tp}{_on(p.prefill_group)} x N, "
            f"decode TP{p.decode_group.tp}{_on(p.decode_group)} x M",
            f"{'prefill':>8}{'decode':>8}{'gpus':>6}{'power W':>10}{'goodput rps':>13}"
            f"{'+- 95% CI':>11}{'per GPU':>10}",
        ]
    lines = head
    for c in p.candidates:
        mark = "  <- best" if c == p.best else ""
        ci = "-" if math.isnan(c.goodput_ci95) else f"{c.goodput_ci95:.3f}"
        if p.layouts:
            lp, ld = _layouts(p, c)
            split = f"{c.prefill:>8}{lp:>15}{c.decode:>8}{ld:>15}"
        else:
            split = f"{c.prefill:>8}{c.decode:>8}"
        lines.append(
            f"{split}{c.gpus:>6}{c.power_w:>10,.0f}"
            f"{c.goodput_rps:>13.3f}{ci:>11}{c.goodput_per_gpu:>10.3f}{mark}"
        )
    for n_p, n_d, why in p.left_out:
        lines.append(f"{n_p:>8}{n_d:>8}  left out: {why}")
    b = p.best
    k = len(b.goodputs_rps)
    if p.layouts:
        lp, ld = _layouts(p, b)
        what = f"{b.prefill} prefill ({lp}) + {b.decode} decode ({ld}) instances"
    else:
        what = f"{b.prefill} prefill + {b.decode} decode instances"
    lines.append(
        f"best: {what}, {b.goodput_rps:.3f} req/s "
        f"at SLO attainment >= target (mean of {k} sample{'s' if k != 1 else ''} of "
        f"{p.sample} requests)"
    )
    lines += [f"warning: {w}" for w in p.warnings]
    return "\n".join(lines)
