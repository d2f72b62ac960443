"""How far a goodput measured on a finite sample can be trusted.

A goodput search replays a sample of the spec's workload at rising rates. Two
things make a small sample mislead:

- **composition and warm-up**: the first few hundred requests of a stream
  are one draw of its lengths and gaps, and a short replay never fills the
  queues and decode batches. Measured on ``experiments/disagg.yaml``
  (Llama-3.1-70B; docs/guides/sweeps.md, "Sample sizes"; 3 samples each),
  ``twin provision``'s best goodput (3:1 at every size) reads 83.1 +- 8.9,
  68.0 +- 14.9, 57.0 +- 3.6 and 53.1 +- 3.3 req/s at 250, 500, 1,000 and
  2,000 requests (+56.5%, +28.1%, +7.5% against the largest), and ``twin
  plan``'s (two nodes) 25.5 +- 6.0, 23.8 +- 8.4, 23.5 +- 6.7 and
  22.6 +- 4.5 req/s (+13.0%, +5.5%, +4.0%; at 250 it also picks another
  prefill shape, one TP4 PP2 instance). Hence :data:`DEFAULT_SAMPLE`:
  the smallest size within 10% of the largest for both.
- **granularity**: at an attainment target ``p`` a sample of ``n`` requests
  allows ``n (1 - p)`` misses; below :data:`MIN_MISSES` of them the verdict of
  every probe turns on a handful of requests.

So each search is run on :data:`DEFAULT_REPLICATES` independent samples
(:func:`replicate_samples`): for a synthetic workload, the spec's seed and
the ones after it (independent replications); for a trace, consecutive
windows of ``n`` requests (batch means over the one stream the trace is).
Each goodput carries the half-width of the 95% confidence interval of its
mean over them (:func:`ci95`; Law, *Simulation Modeling and Analysis*, 5th
ed., sections 9.4 and 9.5.3), and :func:`sample_warnings` says when the
sample is too small: too few misses allowed, fewer samples than asked, or an
interval wider than :data:`MAX_CI_FRACTION` of the goodput (with the sample
size that would narrow it to that, the half-width shrinking as
``1 / sqrt(n)``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI reads this module's defaults to build its parser: keep it light
    from twin.request import Request
    from twin.sim.spec import ExperimentSpec

DEFAULT_SAMPLE = 1000  # requests per sample: the convergence study in the module docstring
DEFAULT_REPLICATES = 3  # samples per goodput: the fewest that give an interval (2 dof)
# Misses the attainment target must allow: the usual floor for a proportion's
# normal approximation, n (1 - p) >= 10 (the success-failure condition,
# OpenIntro Statistics, 4th ed., section 5.1).
MIN_MISSES = 10
# A 95% half-width above 15% of the goodput is warned of: with 3 samples (t = 4.3)
# the bundled disagg provisioning reads +-19% at 500 requests, +-11% at 1,000.
MAX_CI_FRACTION = 0.15
# Request lifetimes at the SLOs a sample must span at the goodput found: one to
# fill the decode batches and the queues, one measured at that level (the
# planner's decode probes warm up for one lifetime and measure one more). On
# experiments/disagg.yaml (a 12.0 s lifetime) the provisioning samples of 250,
# 500, 1,000 and 2,000 requests span 0.25, 0.92, 2.0 and 4.1 lifetimes at the
# goodputs found, and the goodput is within 2% of the largest from 2.0 on.
HORIZONS = 2


def horizon_s(slo: Any, requests: Sequence[Request]) -> float | None:
    """A request's lifetime at the SLOs: the TTFT objective plus the mean
    output length times the TPOT objective (the finite ones); None if
    neither is."""
    parts = []
    if math.isfinite(slo.ttft_s):
        parts.append(slo.ttft_s)
    if math.isfinite(slo.tpot_s) and requests:
        parts.append(slo.tpot_s * sum(r.output_tokens for r in requests) / len(requests))
    return sum(parts) if parts else None


def ci95(values: Sequence[float]) -> float:
    """Half-width of the 95% confidence interval of the mean (Student t,
    ``len(values) - 1`` degrees of freedom); NaN for fewer than two values."""
    k = len(values)
    if k < 2:
        return math.nan
    import numpy as np
    from scipy.special import stdtrit  # scipy.stats.t.ppf's own kernel, without scipy.stats

    sd = float(np.std(values, ddof=1))
    return float(stdtrit(k - 1, 0.975)) * sd / math.sqrt(k)


def _draw(spec: ExperimentSpec, seed: int, skip: int, n: int) -> list[Request]:
    import numpy as np

    from twin.workload.stream import iter_requests

    workload = spec.workload if not skip else dataclasses.replace(spec.workload, skip=skip)
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[0])
    return list(itertools.islice(iter_requests(workload, rng), n))


def replicate_samples(spec: ExperimentSpec, n: int, k: int) -> list[list[Request]]:
    """Up to ``k`` independent samples of ``n`` requests of ``spec``'s
    workload, the first being the one a run of the spec draws first.

    A synthetic workload draws sample ``j`` with seed ``spec.seed + j``; a
    trace gives its ``j``-th window of ``n`` requests (``workload.skip = j n``
    past the spec's own ``skip``), each shifted to arrive from 0. A trace
    window shorter than ``n`` ends the list (the first is kept however short)."""
    if n < 1 or k < 1:
        raise ValueError(f"replicate_samples: n={n!r} and k={k!r} must be >= 1")
    w = spec.workload
    if w.trace is None:
        return [_draw(spec, spec.seed + j, w.skip, n) for j in range(k)]
    out = [_draw(spec, spec.seed, w.skip, n)]
    for j in range(1, k):
        window = _draw(spec, spec.seed, w.skip + j * n, n)
        if len(window) < n:
            break
        out.append(window)
    return out


def sample_warnings(
    *,
    asked: int,
    got: int,
    target: float,
    replicates_asked: int,
    replicates: int,
    mean: float,
    ci: float,
    what: str = "goodput",
    horizon_s: float | None = None,
) -> list[str]:
    """The warnings of a goodput found on ``replicates`` samples of ``got``
    requests (``asked`` and ``replicates_asked`` were requested) at the
    attainment ``target``, with ``mean`` (req/s) and 95% half-width ``ci``;
    ``horizon_s``: a request's lifetime at the SLOs (:func:`horizon_s`)."""
    out = []
    if horizon_s is not None and horizon_s > 0 and mean > 0:
        span = got / mean
        if span < HORIZONS * horizon_s:
            need = math.ceil(HORIZONS * horizon_s * mean)
            out.append(
                f"at {mean:.3g} req/s a sample of {got} requests spans {span:.3g} s, under "
                f"{HORIZONS} request lifetimes at the SLOs ({horizon_s:.3g} s each): queues and "
                f"decode batches never reach steady state and the {what} reads high "
                f"(use --sample >= {need})"
            )
    if got < asked:
        out.append(f"the workload holds {got} requests, fewer than the {asked} asked for")
    misses = got * (1.0 - target)
    if misses < MIN_MISSES - 1e-9:
        fix = (
            f"--sample >= {math.ceil(MIN_MISSES / (1.0 - target) - 1e-9)}"
            if target < 1
            else "a lower target"
        )
        out.append(
            f"a sample of {got} requests allows {math.floor(misses + 1e-9)} misses at attainment "
            f">= {target:.4g}: each verdict turns on fewer than {MIN_MISSES} requests "
            f"(use {fix})"
        )
    if replicates < replicates_asked:
        out.append(
            f"{replicates} independent sample(s) of {got} requests, fewer than the "
            f"{replicates_asked} asked for (a trace gives one per window of --sample requests "
            "it holds)" + ("; no confidence interval" if replicates < 2 else "")
        )
    if replicates >= 2 and mean > 0 and ci > MAX_CI_FRACTION * mean:
        need = math.ceil(got * (ci / (MAX_CI_FRACTION * mean)) ** 2)
        out.append(
            f"the {what}'s 95% interval is +-{ci / mean:.0%} over {replicates} samples of {got} "
            f"requests: too small a sample (about --sample {need} narrows it to "
            f"+-{MAX_CI_FRACTION:.0%})"
        )
    return out


def json_number(x: float | None) -> float | None:
    """``x`` for a JSON document: None where it is NaN or infinite (no goodput
    measured, an SLO not set), which strict JSON cannot hold."""
    return None if x is None or not math.isfinite(x) else x


def convergence_doc(
    rows: Sequence[tuple[int, int, str, float, float]], what: str
) -> dict[str, Any]:
    """``--convergence`` as JSON: one entry per sample size (the rows of
    :func:`format_convergence`)."""
    return {
        "convergence": [
            {
                "sample": n, "requests": got, what: label, "goodput_rps": json_number(mean),
                "goodput_ci95": json_number(ci),
            }
            for n, got, label, mean, ci in rows
        ]
    }  # fmt: skip


def format_convergence(rows: Sequence[tuple[int, int, str, float, float]], what: str) -> str:
    """The table of a convergence study: per sample size asked, the requests
    sampled, the result, its goodput and 95% half-width, and the change from
    the largest sample's goodput."""
    width = max([len(what), *(len(r[2]) for r in rows)])
    head = (
        f"{'sample':>7} {'requests':>8}  {what:<{width}}  {'goodput req/s':>13} "
        f"{'+- 95% CI':>10} {'vs largest':>10}"
    )
    last = rows[-1][3] if rows else math.nan
    lines = [head, "-" * len(head)]
    for n, got, label, mean, ci in rows:
        change = (mean - last) / last if last > 0 else math.nan
        lines.append(
            f"{n:>7} {got:>8}  {label:<{width}}  {mean:>13.3f} "
            f"{'-' if math.isnan(ci) else f'{ci:.3f}':>10} "
            f"{'-' if math.isnan(change) else f'{change:+.1%}':>10}"
        )
    return "\n".join(lines)
