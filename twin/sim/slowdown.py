"""Slowdown objectives: percentiles of each request's latency over its own unloaded latency.

Splitwise (Patel et al., ISCA 2024, its SLO table; the bounds as splitwise-sim's
``notebooks/plots.ipynb`` ``get_slo`` at commit 84356b4 states them) states its SLOs as
slowdowns: a request's TTFT, time between tokens and end-to-end latency divided by those of
the same request served alone on an unloaded reference machine (a DGX-A100), with a bound on
the P50, P90 and P99 of each over the completed requests. The spec's ``slo.slowdown``
(:class:`Slowdown`) names the reference instance (``gpu``, ``tp``; priced by the spec's own
``perf:``) and the bounds; :class:`SlowdownJudge` folds every completed request's three
slowdowns and says whether every bound holds. They are judged over the whole run (a
workload's classes of traffic are not judged apart).

A request's unloaded times, as splitwise-sim computes them (``notebooks/perf_model.py``,
``add_baseline_perf``, and ``notebooks/plots.ipynb``, ``get_data``): TTFT, one iteration of its
prompt alone; time between tokens, one decode step of it alone at the context of its prompt;
end to end, the TTFT plus that step for each output token after the first. Its loaded time
between tokens is its TPOT (the mean gap; a one-token request has none and adds no TBT
slowdown).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from twin._declare import POSITIVE_INT, Kind, declared, mapping, read, schema, string
from twin.errors import SpecError, UnknownNameError
from twin.perf.build import build_perf_model
from twin.perf.gpus import get_gpu
from twin.perf.iteration import Batch
from twin.sim.distribution import Distribution

if TYPE_CHECKING:
    from twin.perf.iteration import PerfModel
    from twin.sim.spec import ExperimentSpec

METRICS = ("ttft", "tbt", "e2e")
_PCT = re.compile(r"p(\d{1,2}(?:\.\d+)?)")


def _bounds(value: Any, where: str) -> tuple[tuple[str, float, float], ...]:
    """``{p50: 2, p90: 3}`` -> ``(("p50", 0.5, 2.0), ("p90", 0.9, 3.0))``: percentiles in
    (0, 100) and the slowdown each may reach (a positive number)."""
    out = []
    for key, bound in mapping(value, where).items():
        m = _PCT.fullmatch(str(key))
        q = float(m.group(1)) / 100 if m else 0.0
        if not 0.0 < q < 1.0:
            raise SpecError(f"{where}: key {key!r} must be a percentile p1 to p99 (p50, p99.9)")
        if isinstance(bound, bool) or not isinstance(bound, int | float) or not bound > 0:
            raise SpecError(f"{where}.{key}: {bound!r} must be a positive number (a slowdown)")
        out.append((str(key), q, float(bound)))
    return tuple(sorted(out, key=lambda t: t[1]))


_BOUNDS_SCHEMA = {
    "type": "object",
    "patternProperties": {"^p[0-9]{1,2}(\\.[0-9]+)?$": {"type": "number", "exclusiveMinimum": 0}},
    "additionalProperties": False,
}
BOUNDS = Kind(_bounds, _BOUNDS_SCHEMA, keep=True)


@dataclass(frozen=True, slots=True)
class Slowdown:
    """Slowdown objectives (the spec's ``slo.slowdown``): bounds on percentiles of each
    completed request's TTFT, time between tokens and end-to-end latency over its own on an
    unloaded reference instance (``gpu`` at ``tp``, priced by the spec's ``perf:``)."""

    gpu: str = declared(None, string(), "the reference instance's GPU",
                        required="name the reference instance's GPU (a100-80gb)")  # fmt: skip
    tp: int = declared(1, POSITIVE_INT, "the reference instance's tensor parallelism")
    ttft: tuple[tuple[str, float, float], ...] = declared(
        None, BOUNDS, "TTFT slowdown per percentile ({p50: 2, p90: 3, p99: 6})", unset=()
    )
    tbt: tuple[tuple[str, float, float], ...] = declared(
        None, BOUNDS, "time-between-tokens slowdown per percentile", unset=()
    )
    e2e: tuple[tuple[str, float, float], ...] = declared(
        None, BOUNDS, "end-to-end slowdown per percentile", unset=()
    )

    def __post_init__(self) -> None:
        if not (self.ttft or self.tbt or self.e2e):
            raise SpecError("slowdown: bounds none of ttft, tbt, e2e")


def _read_slowdown(value: Any, where: str) -> Slowdown | None:
    return None if value is None else read(Slowdown, value, where).value


SLOWDOWN = Kind(_read_slowdown, lambda: schema(Slowdown), keep=True)


class SlowdownJudge:
    """Folds completed requests' slowdowns against ``reference`` (the reference instance's
    perf model) and judges them by ``slowdown``'s bounds."""

    def __init__(self, slowdown: Slowdown, reference: PerfModel) -> None:
        self.slowdown = slowdown
        self.reference = reference
        self.dists = {m: Distribution() for m in METRICS}

    def unloaded(self, prompt: int, output: int) -> tuple[float, float, float]:
        """A request's TTFT, time between tokens and end-to-end latency alone on the
        reference instance (see the module's docstring)."""
        ttft = self.reference.iteration_time(Batch(prefill=((prompt, 0),)))
        tbt = self.reference.iteration_time(Batch(decode_count=1, decode_context_sum=prompt))
        return ttft, tbt, ttft + tbt * (output - 1)

    def add(self, prompt: int, output: int, ttft: float, tpot: float | None, e2e: float) -> None:
        """One completed request: ``prompt`` and ``output`` tokens, its measured latencies."""
        u_ttft, u_tbt, u_e2e = self.unloaded(prompt, output)
        self.dists["ttft"].add(ttft / u_ttft)
        if tpot is not None:
            self.dists["tbt"].add(tpot / u_tbt)
        self.dists["e2e"].add(e2e / u_e2e)

    def summary(self) -> dict[str, Any]:
        """Per metric bounded, each bounded percentile's slowdown (None without a request);
        ``met``: every bound holds (False with no completed request)."""
        out: dict[str, Any] = {}
        met = True
        for m in METRICS:
            bounds = getattr(self.slowdown, m)
            if not bounds:
                continue
            d = self.dists[m]
            got = {}
            for name, q, bound in bounds:
                v = d.quantile(q) if d.count else math.nan
                got[name] = None if math.isnan(v) else v
                met = met and not math.isnan(v) and v <= bound
            out[m] = got
        out["met"] = met
        return out


def slowdown_judge(spec: ExperimentSpec) -> SlowdownJudge | None:
    """The judge of ``spec.slo.slowdown`` (None without one): its reference instance priced
    by the spec's ``perf:`` for its model."""
    sd = spec.slo.slowdown
    if sd is None:
        return None
    where = f"{spec.source}: slo.slowdown"
    try:
        gpu = get_gpu(sd.gpu, f"{where}.gpu")
    except UnknownNameError as e:
        raise SpecError(f"{where}.gpu: {e}") from None
    ref = build_perf_model(spec.perf, spec.model, gpu, sd.tp, where=f"{where}: reference perf",
                           base_dir=spec.base_dir)  # fmt: skip
    return SlowdownJudge(sd, ref)
