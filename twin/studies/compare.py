"""Policy comparisons: one spec, several variants, the same trace and seed, one table.

A spec with a ``compare:`` section maps labels to overrides of the rest of the
spec (the *base*)::

    compare:
      colocated: {scheduler: colocated, cluster.instances: 4, cluster.prefill: null}
      splitwise: {scheduler: splitwise}

Each entry's keys are dotted paths with the meaning of ``--set key.path=value``
(the values already parsed YAML); a ``null`` value deletes the key, so its
default applies. Entries share the base's ``name``, ``seed``, ``workload`` and
``slo`` (an entry may not override them), so every variant replays the same
requests against the same objectives.
Each variant is resolved and validated on its own before any runs, and runs
in the order the labels are written. See README.md, "Comparing policies".
"""

from __future__ import annotations

import copy
import hashlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from twin import _version
from twin._progress import Progress
from twin.errors import SpecError, UnknownSchedulerError
from twin.sim.keypath import dotted, set_key_path
from twin.sim.result import Result
from twin.sim.simulation import Simulation
from twin.sim.spec import (
    ExperimentSpec,
    apply_overrides,
    canonical_json,
    read_spec,
    resolve_spec,
)

SHARED_KEYS = ("name", "seed", "workload", "slo", "compare")
COMPARE_SCHEMA = {
    "type": "object",
    "minProperties": 1,
    "description": "variants run side by side: label -> {key.path: value} overrides of the "
    "rest of the spec (null deletes a key); see docs/guides/policies.md",
    "additionalProperties": {"type": "object"},
}
COLUMNS = (
    # (title, width)
    ("label", 0),
    ("scheduler", 0),
    ("GPUs", 5),
    ("requests", 9),
    ("completed", 10),
    ("rejected", 9),
    ("TTFT p50", 9),
    ("p99 (s)", 9),
    ("TPOT p50", 9),
    ("p99 (ms)", 9),
    ("SLO att.", 9),
    ("req/s", 8),
    ("KV GiB", 9),
)
GPU_SECONDS_COLUMN = ("GPU-s", 8)  # only when a run reports gpu_seconds
# only when a run has KV tiers: the share of prompt tokens reused, and of them
# loaded back from host DRAM and from SSD (the rest was in HBM or a KV pool)
TIER_COLUMNS = (("reuse %", 8), ("DRAM %", 7), ("SSD %", 6))


@dataclass(frozen=True)
class CompareResult:
    """The runs of a compare spec: ``header`` (what they share) and ``runs``
    (label -> :class:`twin.sim.simulation.Result`, in the order the spec lists them)."""

    header: dict[str, Any]
    runs: dict[str, Result]

    def to_dict(self) -> dict[str, Any]:
        return {"header": self.header, "runs": {k: r.to_dict() for k, r in self.runs.items()}}

    def format_table(self) -> str:
        """One row per label: counts, TTFT and TPOT percentiles, SLO attainment,
        throughput, KV moved between instances and the GPUs each uses."""
        h = self.header
        slo = h["slo"]
        rows = [_row(label, r) for label, r in self.runs.items()]
        columns: tuple[tuple[str, int], ...] = COLUMNS
        if any("gpu_seconds" in r.summary for r in self.runs.values()):
            # runs that scale (or give scaling:): the GPUs they held over time
            columns = (*COLUMNS, GPU_SECONDS_COLUMN)
            for row, r in zip(rows, self.runs.values(), strict=True):
                row.append(_num(r.summary.get("gpu_seconds"), 1.0, 0))
        if any("kv_tiers" in r.summary for r in self.runs.values()):
            columns = (*columns, *TIER_COLUMNS)
            for row, r in zip(rows, self.runs.values(), strict=True):
                row.extend(_tier_cells(r.summary))
            if any("remote" in r.summary.get("kv_tiers", {}) for r in self.runs.values()):
                columns = (*columns, ("store %", 7))  # the KV tiers' remote store
                for row, r in zip(rows, self.runs.values(), strict=True):
                    remote = r.summary.get("kv_tiers", {}).get("remote")
                    row.append(_num(remote["hit_rate"], 100.0, 1) if remote else "-")
        if any("kv_pool" in r.summary for r in self.runs.values()):
            # a KV pool (Mooncake's store): its share of the prompt tokens, and its SSD's
            columns = (*columns, ("pool %", 6), ("pool SSD %", 10))
            for row, r in zip(rows, self.runs.values(), strict=True):
                row.extend(_pool_cells(r.summary))
        classes = [n for r in self.runs.values() for n in r.summary.get("classes", {})]
        for part in ("classes", "models"):  # each class's (model's) attainment against its SLO
            names = list(
                dict.fromkeys(n for r in self.runs.values() for n in r.summary.get(part, {}))
            )
            per_gpus = part == "models"  # and each model's GPU-seconds
            columns = (*columns, *((f"{n} {t}", 9) for n in names
                                   for t in ("att.", "GPU-s")[: 1 + per_gpus]))  # fmt: skip
            for row, r in zip(rows, self.runs.values(), strict=True):
                per = r.summary.get(part, {})
                for n in names:
                    row.append(_num(per[n]["slo_attainment"], 100.0, 1) if n in per else "-")
                    if per_gpus:
                        row.append(_num(per[n]["gpu_seconds"], 1.0, 0) if n in per else "-")
        widths = [
            max(w, len(title), *(len(row[i]) for row in rows))
            for i, (title, w) in enumerate(columns)
        ]
        titles = [title for title, _ in columns]

        def line(cells: Sequence[str]) -> str:
            first = [f"{cells[0]:<{widths[0]}}", f"{cells[1]:<{widths[1]}}"]
            rest = [f"{c:>{w}}" for c, w in zip(cells[2:], widths[2:], strict=True)]
            return "  ".join(first) + "".join(f" {c}" for c in rest)

        head = line(titles)
        return "\n".join(
            [
                f"pd-twin {h['version']} | {h['name']} | {h['model']} | seed {h['seed']} | "
                + (
                    "SLO: each class its own"
                    if classes
                    else "SLO: each model its own, by default "
                    if "models" in h.get("spec", {})
                    else "SLO "
                )
                + (
                    ""
                    if classes
                    else f"TTFT <= {slo['ttft'] or 'inf'}, TPOT <= {slo['tpot'] or 'inf'}"
                ),
                "",
                head,
                "-" * len(head),
                *(line(row) for row in rows),
                *(
                    f"warning: {label}: {w}"
                    for label, r in self.runs.items()
                    for w in r.summary.get("warnings", ())
                ),
            ]
        )


def _row(label: str, r: Result) -> list[str]:
    s, spec = r.summary, r.header["spec"]
    gpus = sum(
        g["instances"] * g["tp"] * g["pp"] * g.get("dp", 1) for g in spec["cluster"]["groups"]
    )
    att = s["slo_attainment"]
    return [
        label,
        spec["scheduler"]["name"]
        if "scheduler" in spec
        else " + ".join(dict.fromkeys(m["scheduler"]["name"] for m in spec["models"].values())),
        str(gpus),
        f"{s['requests']:,}",
        f"{s['completed']:,}",
        f"{s['rejected']:,}",
        _num(s["ttft_s"]["p50"], 1.0),
        _num(s["ttft_s"]["p99"], 1.0),
        _num(s["tpot_s"]["p50"], 1e3, 1),
        _num(s["tpot_s"]["p99"], 1e3, 1),
        "-" if att is None else f"{att * 100:.1f}%",
        _num(s["throughput_rps"], 1.0, 2),
        _num(s["kv_bytes_transferred"] / 2**30, 1.0, 1),
    ]


def _tier_cells(s: Mapping[str, Any]) -> list[str]:
    tiers = s.get("kv_tiers", {})
    cells = [_num(s.get("prefix_hit_rate"), 100.0, 1)]
    for name in ("dram", "ssd"):
        cells.append(_num(tiers[name]["hit_rate"], 100.0, 1) if name in tiers else "-")
    return cells


def _pool_cells(s: Mapping[str, Any]) -> list[str]:
    pool = s.get("kv_pool")
    if not pool:
        return ["-", "-"]
    rates = [t["hit_rate"] for t in pool.values()]
    both = None if any(x is None for x in rates) else sum(rates)
    ssd = pool["ssd"]["hit_rate"] if "ssd" in pool else None
    return [_num(both, 100.0, 1), _num(ssd, 100.0, 1)]


def _num(x: float | None, scale: float, digits: int = 3) -> str:
    if x is None or x != x:  # None or NaN: nothing was measured
        return "-"
    return f"{x * scale:.{digits}f}"


def _set_path(data: dict[str, Any], path: str, value: Any, where: str) -> None:
    """Set (or, for ``None``, delete) the key ``path`` of ``data`` in place
    (:func:`~twin.sim.keypath.set_key_path`; a copy of ``value``)."""
    set_key_path(data, path, copy.deepcopy(value), where)


def compare_entries(data: Mapping[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """The ``compare:`` section of ``data``, checked: label -> {key path: value}."""
    section = data.get("compare")
    if not isinstance(section, dict) or not section:
        raise SpecError(
            f"{where}: compare: {section!r} must be a non-empty mapping of label -> overrides"
        )
    out: dict[str, dict[str, Any]] = {}
    for label, entry in section.items():
        at = f"{where}: compare.{label}"
        if not isinstance(label, str) or not label:
            raise SpecError(f"{where}: compare: label {label!r} must be a non-empty string")
        if entry is None:
            entry = {}
        if not isinstance(entry, dict):
            raise SpecError(f"{at}: {entry!r} must be a mapping of key.path: value")
        for key in entry:
            if not isinstance(key, str):
                raise SpecError(f"{at}: key {key!r} must be a dotted key path")
            if key.split(".")[0] in SHARED_KEYS:
                raise SpecError(
                    f"{at}: {key}: the entries share the base spec's "
                    f"{', '.join(SHARED_KEYS[:-1])}; set it outside compare: (or with --set)"
                )
        out[label] = entry
    return out


def compare_specs(
    spec_data: Mapping[str, Any],
    where: str,
    base_dir: Path,
    overrides: Sequence[str] = (),
    only: Sequence[str] | None = None,
    warn: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], dict[str, ExperimentSpec]]:
    """The base (``--set`` applied, ``compare:`` still in it) and, per selected
    label in the spec's order, its resolved spec. Every selected entry is
    validated, its scheduler included, before anything runs; errors name the
    entry as ``compare.LABEL``. An entry key that overrides a ``--set`` key
    (the same key, or one above or below it) is told to ``warn``, one line
    each (default: ``twin: warning: ...`` on stderr)."""
    base = copy.deepcopy(dict(spec_data))
    apply_overrides(base, overrides)
    entries = compare_entries(base, where)
    labels = list(entries)
    if only is not None:
        for label in only:
            if label not in entries:
                raise SpecError(
                    f"{where}: compare: no entry {label!r}; the entries are {', '.join(labels)}"
                )
        labels = [label for label in labels if label in set(only)]
    name = str(base.get("name", Path(where).stem))
    specs: dict[str, ExperimentSpec] = {}
    say = warn or (lambda msg: print(f"twin: warning: {msg}", file=sys.stderr))
    for label in labels:
        for line in overridden(label, entries[label], overrides):
            say(line)
    for label in labels:
        at = f"{where}: compare.{label}"
        data = {k: copy.deepcopy(v) for k, v in base.items() if k != "compare"}
        for key, value in entries[label].items():
            _set_path(data, key, value, at)
        data["name"] = f"{name}/{label}"
        try:
            spec = resolve_spec(data, at, base_dir)
        except UnknownSchedulerError as e:  # keep the registry's suggestion, add --only's
            others = [x for x in entries if x != label]
            hint = f" (--only {','.join(others)} runs the others)" if others else ""
            raise SpecError(f"{e}{hint}") from None
        specs[label] = spec
    return base, specs


def _yaml_text(value: Any) -> str:
    """A value as ``--set`` would take it (YAML flow style: null, 4, {a: 1})."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6)
    return text.strip().removesuffix("...").strip()


def overridden(label: str, entry: Mapping[str, Any], overrides: Sequence[str]) -> list[str]:
    """One line per ``--set`` override that entry ``label`` overrides: the same
    key path, or one that contains or lies inside it (``cluster.prefill: null``
    overrides ``--set cluster.prefill.instances=3``)."""
    lines = []
    for item in overrides:
        key = dotted(item.partition("=")[0].strip())
        for path, value in entry.items():
            p = dotted(path)
            if p == key or key.startswith(f"{p}.") or p.startswith(f"{key}."):
                lines.append(
                    f"compare entry {label!r} overrides --set {item.strip()} "
                    f"with {path}={_yaml_text(value)}"
                )
    return lines


def run_compare(
    spec: str | Path | Mapping[str, Any] = "compare-azure-conv",
    where: str | None = None,
    base_dir: Path | None = None,
    overrides: Sequence[str] = (),
    only: Sequence[str] | None = None,
    warn: Callable[[str], None] | None = None,
    *,
    quiet: bool = False,
    runner: Callable[[str, ExperimentSpec], Result] | None = None,
) -> CompareResult:
    """Run every entry of the spec's ``compare:`` section (or those in ``only``),
    one after the other, on the base spec's workload and seed (a progress bar
    on stderr when it is a terminal, unless ``quiet``).

    ``spec`` takes the forms :func:`twin.run` takes: a YAML path, a bundled
    experiment's name, or a mapping of the same keys (parsed YAML, left
    unchanged; its relative paths start at ``base_dir``, default the current
    folder). ``where`` names it in messages. ``overrides`` are
    ``key.path=value`` strings applied to the base before the entries (an
    entry that overrides one says so to ``warn``, see :func:`compare_specs`).
    ``runner(label, spec)`` runs one entry (default: ``Simulation(spec).run()``);
    ``twin run`` passes one that writes each entry's own files.
    """
    if isinstance(spec, ExperimentSpec):
        raise SpecError(
            f"{spec.source}: a loaded spec has no compare: section; give run_compare its "
            "path, bundled name or mapping"
        )
    if isinstance(spec, Mapping):
        data: Mapping[str, Any] = spec
        where = where or "<spec>"
        base_dir = base_dir if base_dir is not None else Path.cwd()
    else:
        data, read_where, read_dir = read_spec(str(spec))
        where = where or read_where
        base_dir = base_dir if base_dir is not None else read_dir
    base, specs = compare_specs(data, where, base_dir, overrides, only, warn)
    run_one = runner or (lambda _label, s: Simulation(s).run())
    runs = {}
    with Progress(len(specs), "runs", desc="compare", quiet=quiet) as bar:
        for label, one in specs.items():
            runs[label] = run_one(label, one)
            bar.update()
    first = next(iter(specs.values()))
    traces: dict[str, str] = {}
    for r in runs.values():
        traces.update(r.header["trace_sha256"])
    header = {
        "tool": "pd-twin",
        "version": _version.__version__,
        "name": str(base.get("name", Path(where).stem)),
        "model": " + ".join(f"{p.name}: {p.spec.model.name}" for p in first.models)
        or first.model.name,
        "seed": first.seed,
        "workload": first.resolved["workload"],
        "slo": first.resolved["slo"],
        "spec": base,
        "spec_sha256": hashlib.sha256(canonical_json(base).encode()).hexdigest(),
        "trace_sha256": traces,
        "labels": list(runs),
    }
    return CompareResult(header, runs)
