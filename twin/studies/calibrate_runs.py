"""``twin calibrate --runs DIR``: fit the ``vllm`` preset's free terms to measured serving runs.

The runs are read by :func:`twin.studies.runs.read_runs` (inference-perf run folders, or a
folder of the layout of ``shared/data/realruns``); runs past saturation are left out. Each run
is replayed through the spec built from it with ``perf: {kind: roofline, engine: vllm}`` and
the candidate terms (optionally only the first ``stage_requests`` requests sent in each load
stage, for speed), and scored with the published definitions
(:func:`twin.studies.realrun.twin_metrics`, :func:`~twin.studies.realrun.score`).

The engine's terms are fitted on a loss that is the mean over runs of each run's absolute
percentage error of E2E mean and ITL mean, averaged over its load stages. The client's
share (``client_latency_s``: the load generator's and vLLM's API server's time around the
engine, added to TTFT and E2E as ``slo.client_latency``) is fitted on TTFT mean alone: it
is the one term that moves TTFT without moving the engine's steps. It changes no step, so
it is applied to each replay's figures (TTFT and E2E shift by it; ITL does not change)
rather than replayed, and solved exactly at each turn of the search (:func:`best_client`).

The search is coarse to fine and deterministic: per free term in turn, a step up and a step
down (multiplicative, within :data:`BOUNDS`), kept when the loss falls; the step shrinks
once a round improves nothing, until :data:`ROUNDS` rounds. Every replay is cached by (run,
terms), so the leave-one-run-out fits (:func:`leave_one_out`: each run scored with the
terms fitted to the others) share most of their replays.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from twin.perf.presets import ENGINE_OVERHEADS
from twin.perf.vllm import VLLM_CLIENT_LATENCY_S
from twin.studies.realrun import WHOLE, RealRun

if TYPE_CHECKING:
    from twin.studies.validate_realrun import RunScore

ENGINE = "vllm"
# The free terms and their bounds (lower, upper): see twin.perf.vllm for what each stands for.
BOUNDS: Mapping[str, tuple[float, float]] = {
    "overhead_s": (1e-4, 3e-3),
    "layer_overhead_s": (1e-6, 6e-5),
    "hop_overhead_s": (0.0, 5e-6),
    "moe_efficiency": (0.3, 1.0),
    "client_latency_s": (0.0, 0.03),
}
# Where every fit starts, the same whatever the runs (so that a held-out run has no say in
# it): the physical estimates of twin.perf.vllm before any fit.
PRIOR: Mapping[str, float] = {
    "overhead_s": 1.5e-3,
    "layer_overhead_s": 1.5e-5,
    "hop_overhead_s": 2e-6,
    "moe_efficiency": 1.0,
    "client_latency_s": 5e-3,
}
FITTED = ("e2e_mean", "itl_mean")  # the metrics the engine terms' loss takes
CLIENT = "client_latency_s"  # not a perf term: slo.client_latency, fitted on TTFT alone
CLIENT_FITTED = ("ttft_mean",)
_SHIFTED = ("e2e_mean", "e2e_p90", "e2e_p99", "ttft_mean", "ttft_p90", "ttft_p99")
REPORTED = ("e2e_mean", "itl_mean", "ttft_mean")
ROUNDS = 4
FIRST_STEP = 0.4  # the first round moves a term by x 1.4 and / 1.4
# The YAML key of each term in ``perf:`` (twin.perf.build.RooflineKeys) and its unit.
_YAML = {"overhead_s": "overhead", "layer_overhead_s": "layer_overhead",
         "hop_overhead_s": "hop_overhead", "seq_overhead_s": "seq_overhead"}  # fmt: skip


@dataclass(frozen=True)
class Fit:
    """Fitted terms, the loss they reach and each run's errors (metric -> % per run)."""

    terms: dict[str, float]
    loss: float
    errors: dict[str, dict[str, float]]  # run key -> metric -> mean abs % error over stages
    evaluations: int


def free_terms(runs: Sequence[RealRun], names: Sequence[str] | None = None) -> tuple[str, ...]:
    """The terms to fit: ``names`` (default all of :data:`BOUNDS`), less those no run can
    tell: ``moe_efficiency`` without a mixture-of-experts run, ``hop_overhead_s`` when
    every run is at TP 1."""
    from twin.perf.llm import get_model

    chosen = tuple(BOUNDS) if names is None else tuple(names)
    moe = any(get_model(r.spec["model"]).experts for r in runs)
    tp = any(int(r.spec.get("cluster", {}).get("tp", 1)) > 1 for r in runs)
    return tuple(
        n for n in chosen
        if not (n == "moe_efficiency" and not moe) and not (n == "hop_overhead_s" and not tp)
    )  # fmt: skip


def perf_block(terms: Mapping[str, float]) -> dict[str, Any]:
    """The ``perf:`` mapping that sets ``terms`` on the ``vllm`` preset (durations in us)."""
    out: dict[str, Any] = {"kind": "roofline", "engine": ENGINE}
    for k, v in terms.items():
        if k == CLIENT:
            continue
        if k in _YAML:
            out[_YAML[k]] = f"{v * 1e6:.4g} us"
        else:
            out[k] = round(float(v), 4)
    return out


class Replayer:
    """Replays runs with candidate terms; caches each (run, engine terms) replay."""

    def __init__(self, stage_requests: int | None) -> None:
        self.stage_requests = stage_requests
        self.cache: dict[tuple[str, tuple[tuple[str, float], ...]], RunScore] = {}

    def scored(self, run: RealRun, terms: Mapping[str, float]) -> RunScore:
        """``run`` replayed with the engine terms of ``terms`` and no client latency."""
        engine = {k: v for k, v in terms.items() if k != CLIENT}
        key = (run.key, tuple(sorted((k, round(v, 12)) for k, v in engine.items())))
        scored = self.cache.get(key)
        if scored is None:
            from twin.studies.validate_realrun import replay

            spec = dict(run.spec)
            spec["perf"] = perf_block(engine)
            spec["slo"] = {**spec.get("slo", {}), "client_latency": "0 s"}
            scored = replay(dataclasses.replace(run, spec=spec), stage_requests=self.stage_requests)
            self.cache[key] = scored
        return scored

    def errors(self, run: RealRun, terms: Mapping[str, float]) -> dict[str, float]:
        """Per metric of :data:`REPORTED`, the absolute % error averaged over the run's
        load stages (the whole run when it has one stage). Without ``client_latency_s``
        in ``terms`` the shipped :data:`~twin.perf.vllm.VLLM_CLIENT_LATENCY_S` applies."""
        scored = self.scored(run, terms)
        client = float(terms.get(CLIENT, VLLM_CLIENT_LATENCY_S))
        stages = _stages(scored)
        out = {}
        for m in REPORTED:
            vals = []
            for s in stages:
                sc = scored.scores.get((s, m))
                if sc is not None:
                    p = sc.predicted + (client if m in _SHIFTED else 0.0)
                    vals.append(abs(p - sc.actual) / sc.actual * 100)
            out[m] = statistics.fmean(vals) if vals else math.inf
        return out


def _stages(scored: RunScore) -> list[int]:
    return sorted({s for s, _ in scored.scores if s != WHOLE}) or [WHOLE]


def best_client(rep: Replayer, runs: Sequence[RealRun], terms: Mapping[str, float]) -> float:
    """The client latency that minimises the TTFT loss with the engine terms of ``terms``:
    the loss is a weighted sum of ``|predicted + c - measured| / measured`` over the runs'
    stages, so its minimum is the weighted median of the gaps ``measured - predicted``
    (weights ``1 / measured``, shared out over each run's stages), held in its bounds."""
    gaps = []
    for r in runs:
        scored = rep.scored(r, terms)
        stages = [s for s in _stages(scored) if (s, "ttft_mean") in scored.scores]
        for s in stages:
            sc = scored.scores[(s, "ttft_mean")]
            gaps.append((sc.actual - sc.predicted, 1.0 / (sc.actual * len(stages))))
    gaps.sort()
    half, acc = sum(w for _, w in gaps) / 2, 0.0
    for g, w in gaps:
        acc += w
        if acc >= half:
            return _clip(CLIENT, g)
    raise ValueError("best_client: no run scored TTFT")


def _loss(
    rep: Replayer,
    runs: Sequence[RealRun],
    terms: Mapping[str, float],
    metrics: Sequence[str] = FITTED,
) -> float:
    return statistics.fmean(
        statistics.fmean(rep.errors(r, terms)[m] for m in metrics) for r in runs
    )


def _metrics(name: str) -> tuple[str, ...]:
    """The metrics term ``name`` is fitted on."""
    return CLIENT_FITTED if name == CLIENT else FITTED


def _clip(name: str, v: float) -> float:
    lo, hi = BOUNDS[name]
    return min(max(v, lo), hi)


def fit(
    runs: Sequence[RealRun],
    names: Sequence[str] | None = None,
    *,
    stage_requests: int | None = None,
    start: Mapping[str, float] | None = None,
    replayer: Replayer | None = None,
) -> Fit:
    """Fit the free terms (:func:`free_terms`) to ``runs`` (see the module), from
    ``start`` (default :data:`PRIOR`)."""
    if not runs:
        raise ValueError("fit: no run to fit to")
    rep = replayer or Replayer(stage_requests)
    free = free_terms(runs, names)
    begin = PRIOR if start is None else start
    terms = {n: _clip(n, float(begin.get(n, ENGINE_OVERHEADS[ENGINE].get(n, 1.0)))) for n in free}
    step = FIRST_STEP
    evals = 1
    for _ in range(ROUNDS):
        improved = False
        for n in free:
            lo, hi = BOUNDS[n]
            best = _loss(rep, runs, terms, _metrics(n))
            if n == CLIENT:  # solved exactly: it moves no step, so no replay is needed
                c = dict(terms, **{n: best_client(rep, runs, terms)})
                loss = _loss(rep, runs, c, _metrics(n))
                evals += 1
                if loss < best - 1e-9:
                    terms, improved = c, True
                continue
            for cand in (terms[n] * (1 + step), terms[n] / (1 + step)):
                if terms[n] == 0.0:  # a term at 0 moves up by a tenth of its range
                    cand = lo + (hi - lo) * 0.1 * step / FIRST_STEP
                c = dict(terms, **{n: _clip(n, cand)})
                if c[n] == terms[n]:
                    continue
                loss = _loss(rep, runs, c, _metrics(n))
                evals += 1
                if loss < best - 1e-9:
                    best, terms, improved = loss, c, True
                    break
        if not improved:
            step /= 2
    errors = {r.key: rep.errors(r, terms) for r in runs}
    return Fit(terms, _loss(rep, runs, terms), errors, evals)


def leave_one_out(
    runs: Sequence[RealRun],
    names: Sequence[str] | None = None,
    *,
    stage_requests: int | None = None,
) -> dict[str, dict[str, float]]:
    """Each run's errors (metric -> %) with the terms fitted to the other runs."""
    rep = Replayer(stage_requests)
    out = {}
    for i, held in enumerate(runs):
        others = [r for j, r in enumerate(runs) if j != i]
        f = fit(others, names, replayer=rep)
        out[held.key] = rep.errors(held, f.terms)
    return out


def summary(errors: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Per metric: the mean and the median of the runs' errors, and the worst."""
    out = {}
    for m in REPORTED:
        vals = [e[m] for e in errors.values()]
        out[m] = {"mean": statistics.fmean(vals), "median": statistics.median(vals),
                  "worst": max(vals)}  # fmt: skip
    return out


def perf_yaml(terms: Mapping[str, float]) -> str:
    """The ``perf:`` block of :func:`perf_block` as YAML text, and the ``slo:`` block's
    ``client_latency`` when ``terms`` hold it."""
    import yaml

    doc: dict[str, Any] = {"perf": perf_block(terms)}
    if CLIENT in terms:
        doc["slo"] = {"client_latency": f"{terms[CLIENT] * 1e3:.4g} ms"}
    return str(yaml.safe_dump(doc, sort_keys=False))


def format_fit(f: Fit, held_out: Mapping[str, Mapping[str, float]] | None) -> str:
    """Per run its errors in sample (and held out), the summary, the fitted terms."""
    lines = [
        f"{'run':<48} "
        + " ".join(f"{m:>10}" for m in REPORTED)
        + ("  held out: " + " ".join(f"{m:>10}" for m in REPORTED) if held_out else "")
    ]
    lines.append("-" * len(lines[0]))
    for key, e in f.errors.items():
        row = f"{key[:48]:<48} " + " ".join(f"{e[m]:>9.1f}%" for m in REPORTED)
        if held_out:
            row += "             " + " ".join(f"{held_out[key][m]:>9.1f}%" for m in REPORTED)
        lines.append(row)
    for label, errs in (("in sample", f.errors), ("leave one run out", held_out)):
        if not errs:
            continue
        s = summary(errs)
        lines.append(
            f"{label} over {len(errs)} runs: "
            + "; ".join(
                f"{m} mean {s[m]['mean']:.1f}% median {s[m]['median']:.1f}%" for m in REPORTED
            )
        )
    lines.append(f"fitted ({f.evaluations} evaluations, loss {f.loss:.2f}% on "
                 + " and ".join(FITTED) + "):")  # fmt: skip
    return "\n".join(lines)


def command(
    folder: str,
    *,
    gpu: str | None = None,
    fit_terms: str | None = None,
    stage_requests: int | None = None,
    loo: bool = False,
    out: str | None = None,
    as_json: bool = False,
    residuals: str | None = None,
) -> int:
    """``twin calibrate --runs DIR``: fit, print, and write the ``perf:`` block to ``out``."""
    import json
    from pathlib import Path

    from twin.errors import TwinError
    from twin.studies.runs import read_runs

    names = None
    if fit_terms is not None:
        names = tuple(k.strip() for k in fit_terms.split(",") if k.strip())
        bad = [n for n in names if n not in BOUNDS]
        if bad:
            raise TwinError(f"--fit: {bad[0]!r}; expected some of {', '.join(BOUNDS)}")
    if stage_requests is not None and stage_requests < 1:
        raise TwinError(f"--stage-requests: {stage_requests} must be >= 1")
    runs = [r for r in read_runs(folder, gpu=gpu) if not r.overloaded]
    if not runs:
        raise TwinError(f"{folder}: no run that is not overloaded to fit to")
    rep = Replayer(stage_requests)
    f = fit(runs, names, replayer=rep)
    held = None
    held_terms = {}
    if (loo or residuals is not None) and len(runs) > 1:
        held = {}
        for i, r in enumerate(runs):
            g = fit([o for j, o in enumerate(runs) if j != i], names, replayer=rep)
            held[r.key] = rep.errors(r, g.terms)
            held_terms[r.key] = g.terms
    if residuals is not None:  # the held-out residuals, for perf.residuals
        from twin.studies.runresiduals import loo_table, report_table

        cap = f" --stage-requests {stage_requests}" if stage_requests else ""
        table = loo_table(runs, held_terms, stage_requests,
                          f"twin calibrate --runs {folder}{cap} (leave one run out)",
                          perf_block)  # fmt: skip
        report_table(table, residuals)
    text = perf_yaml(f.terms)
    if out is not None:
        Path(out).write_text(text)
    if as_json:
        doc = {"terms": f.terms, "loss": f.loss, "evaluations": f.evaluations,
               "in_sample": f.errors, "summary": summary(f.errors), "perf": perf_block(f.terms),
               "stage_requests": stage_requests}  # fmt: skip
        if held is not None:
            doc["leave_one_out"] = held
            doc["leave_one_out_summary"] = summary(held)
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(format_fit(f, held))
        print(text, end="")
    return 0
