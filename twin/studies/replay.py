"""``twin validate replay SPEC``: the measured table against each roofline preset.

The spec's workload (the same seed, so the same requests: arrival times and
lengths) is served once with the spec's own ``perf:``, which must be a
measured table (``{kind: profile}`` or ``{kind: distserve}``), and once per
roofline preset (``perf: {kind: roofline, engine: E}`` for every key of
:data:`twin.perf.presets.ENGINE_OVERHEADS`), everything else unchanged. Per
metric (TTFT, TPOT, E2E; over the requests every variant completed): the
mean, p50 and p99 (numpy's linear percentiles) of each variant, and each
preset's relative difference from the table, (preset - table) / table.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from twin.errors import SpecError

METRICS = ("ttft", "tpot", "e2e")
STATS = ("mean", "p50", "p99")
MEASURED_KINDS = ("profile", "distserve")


@dataclass(frozen=True)
class ReplayComparison:
    spec: str
    variants: tuple[str, ...]  # "profile" (the spec's table) first, then "roofline E"
    requests: int  # requests the spec's workload sent
    compared: int  # requests every variant completed
    values: dict[str, dict[str, dict[str, float]]]  # metric -> variant -> stat -> seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "variants": list(self.variants),
            "requests": self.requests,
            "compared": self.compared,
            "metrics": self.values,
        }


def _variants(data: dict[str, Any], where: str) -> list[tuple[str, dict[str, Any]]]:
    from twin.perf.presets import ENGINE_OVERHEADS

    perf = data.get("perf")
    if perf is None or isinstance(perf, dict):  # no perf: or no kind: a roofline, as a run builds
        kind = (perf or {}).get("kind", "roofline")
    else:
        kind = None
    if kind not in MEASURED_KINDS:
        raise SpecError(
            f"{where}: perf.kind: {kind!r}; validate replay needs a measured table "
            "(perf: {kind: profile, path: ...} or {kind: distserve, path: ...})"
        )
    out = [(str(kind), data)]
    for engine in ENGINE_OVERHEADS:
        d = copy.deepcopy(data)
        d["perf"] = {"kind": "roofline", "engine": engine}
        out.append((f"roofline {engine}", d))
    return out


def validate_replay(spec: str, overrides: Sequence[str] = ()) -> ReplayComparison:
    """Serve ``spec``'s requests through its table and through each preset (see the module)."""
    from twin.sim.simulation import Simulation
    from twin.sim.spec import apply_overrides, read_spec, resolve_spec

    data, where, base_dir = read_spec(spec)
    apply_overrides(data, tuple(overrides))
    runs: list[tuple[str, dict[int, dict[str, Any]]]] = []
    sent: set[tuple[Any, ...]] | None = None
    for name, d in _variants(data, where):
        rows: list[dict[str, Any]] = []
        Simulation(resolve_spec(d, where, base_dir), on_row=rows.append).run()
        reqs = {(r["id"], r["arrival_s"], r["prompt_tokens"], r["output_tokens"]) for r in rows}
        if sent is not None and reqs != sent:  # the perf model must not change the workload
            raise SpecError(f"{where}: {name} served other requests than the table")
        sent = reqs
        runs.append((name, {r["id"]: r for r in rows if r["status"] == "completed"}))
    ids = sorted(set.intersection(*(set(done) for _, done in runs)))
    values: dict[str, dict[str, dict[str, float]]] = {}
    for m in METRICS:
        values[m] = {}
        for name, done in runs:
            v = np.array([float(done[i][f"{m}_s"]) for i in ids if done[i][f"{m}_s"] != ""])
            values[m][name] = (
                {
                    "mean": float(v.mean()),
                    "p50": float(np.percentile(v, 50)),
                    "p99": float(np.percentile(v, 99)),
                }
                if v.size
                else {}
            )
    return ReplayComparison(where, tuple(n for n, _ in runs), len(sent or ()), len(ids), values)


_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}


def format_replay(c: ReplayComparison) -> str:
    """Per metric and statistic: each variant's value (ms), and each preset's
    difference from the table."""
    table, presets = c.variants[0], c.variants[1:]
    head = f"{'metric':<12} {table + ' ms':>14}" + "".join(
        f" {p + ' ms':>24} {'vs table':>9}" for p in presets
    )
    lines = [
        f"{c.spec}: {c.requests} requests, {c.compared} completed by every variant",
        head,
        "-" * len(head),
    ]
    for m in METRICS:
        base = c.values[m][table]
        for s in STATS:
            if s not in base:
                continue
            line = f"{_NAMES[m] + ' ' + s:<12} {base[s] * 1e3:>14.2f}"
            for p in presets:
                x = c.values[m][p][s]
                line += f" {x * 1e3:>24.2f} {(x - base[s]) / base[s]:>+9.1%}"
            lines.append(line)
    return "\n".join(lines)
