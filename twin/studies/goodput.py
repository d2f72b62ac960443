"""Goodput: the largest request rate whose SLO attainment meets the target.

For each configuration of a spec (the cartesian product of its ``sweep:``
keys other than the rate key and ``seed``; one configuration without a
sweep), and for each of K seeds, the rate key (``workload.rate_scale``, or
``workload.arrival.rate``) is searched: doubled or halved from a start until
one rate meets the target and its double does not, then bisected
geometrically to a relative tolerance. The K searches of every configuration
advance in lockstep, each round's probes run together on the executor.

A seed's goodput in requests/s is the rate offered at the rate found: the
arrival process's rate x ``rate_scale``, or, for a trace replayed at its own
times, (n - 1) / (last arrival - first arrival) of the requests the run
replays. The table gives the mean over seeds, the half-width of its 95%
confidence interval (Student t, K - 1 degrees of freedom; NaN for one seed),
and the mean per GPU. ``goodput.csv`` holds the same (layout in
``twin/studies/sweep.py``).

With ``out`` (``twin goodput --out DIR``), each probe's attainment is written
to ``DIR/probes/<key>.json`` as soon as it finishes, the key a hash of the
probe's spec and of the code; a search run again over the same folder reads
the probes already there instead of running them, so an interrupted
``twin goodput`` resumes where it stopped and ends with the same result as a
fresh one (the runs are deterministic).

With ``slo.slowdown`` (:mod:`twin.sim.slowdown`), a rate meets the SLO only where its
slowdown percentiles are all within their bounds as well.

NOTE: attainment need not fall monotonically with the rate (a small sample,
a burst); the search returns a rate that meets the target next to one twice
(then 1 + tolerance times) as fast that does not, not necessarily the largest.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import itertools
import json
import math
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from twin import _version
from twin._io import atomic_write, read_text, write_text
from twin._progress import Progress
from twin.errors import SpecError, TwinError
from twin.request import Request
from twin.sim.spec import ExperimentSpec, resolve_spec
from twin.studies.compare import _set_path
from twin.studies.goodput_classes import (
    SIDE,
    class_attainment,
    class_cells,
    class_columns,
    class_lines,
    class_shares,
    class_sides,
)
from twin.studies.goodput_interval import envelope, interval_lines, slo_sides, with_slo
from twin.studies.samples import ci95, horizon_s, sample_warnings
from twin.studies.sweep import (
    RATE_KEYS,
    Axis,
    Executor,
    Job,
    _cell,
    _gpus,
    _params_text,
    make_label,
    parse_sweep,
)

DEFAULT_SEEDS = 3
RateSearch = Generator[float, bool, tuple[float, bool]]


# -- the search ----------------------------------------------------------------------
def rate_search(
    start: float,
    *,
    rel_tol: float | None = 0.05,
    iterations: int | None = None,
    up: int = 12,
    down: int = 12,
) -> RateSearch:
    """A coroutine: yields the rates to try, is sent whether each met the
    target, and returns ``(rate, bounded)``. From ``start`` it doubles (at
    most ``up`` times) or halves (at most ``down`` times) to a bracket, then
    bisects geometrically ``iterations`` times or until hi / lo <= 1 + rel_tol.
    ``bounded`` is False when every rate tried met the target (the rate is
    then the largest tried); the rate is 0 when none did."""
    if not start > 0:
        raise SpecError(f"goodput search: start rate {start!r} must be > 0")
    if (yield start):
        lo = start
        for _ in range(up):
            if not (yield lo * 2):
                break
            lo *= 2
        else:
            return lo, False
        hi = lo * 2
    else:
        hi = start
        for _ in range(down):
            if (yield hi / 2):
                break
            hi /= 2
        else:
            return 0.0, True
        lo = hi / 2
    steps = itertools.count() if iterations is None else range(iterations)
    for _ in steps:
        if iterations is None and hi / lo <= 1 + (rel_tol or 0.0):
            break
        mid = math.sqrt(lo * hi)
        if (yield mid):
            lo = mid
        else:
            hi = mid
    return lo, True


def find_max_rate(meets: Callable[[float], bool], start: float, **kw: Any) -> tuple[float, bool]:
    """Drive :func:`rate_search` with ``meets(rate)``, one probe at a time."""
    search = rate_search(start, **kw)
    rate = next(search)
    while True:
        try:
            rate = search.send(bool(meets(rate)))
        except StopIteration as stop:
            return stop.value


# -- a sweep spec's goodput ----------------------------------------------------------
def require_slo(spec: ExperimentSpec, where: str, slowdown: bool = True) -> None:
    """Goodput is judged against the SLO: refuse a spec without one, before any run;
    ``slowdown``: whether ``slo.slowdown`` alone counts (not for ``twin plan``, whose
    per-phase searches judge TTFT and TPOT)."""
    slo = spec.slo
    if math.isinf(slo.ttft_s) and math.isinf(slo.tpot_s) and (slo.slowdown is None or not slowdown):
        given = "no ttft, tpot or slowdown" if slowdown else "no ttft or tpot"
        raise SpecError(
            f"{where}: slo: {given} given; goodput is the largest rate meeting an SLO, so "
            "the spec needs one (e.g. slo: {ttft: 1 s, tpot: 50 ms})"
        )


class ProbeStore:
    """``DIR/probes/<key>.json``: one finished probe's attainment each, keyed
    by the sha256 of the probe's spec data, its folder and the code."""

    def __init__(self, out: Path | None):
        self.dir = None if out is None else Path(out) / "probes"
        if self.dir is not None:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise SpecError(f"{self.dir}: cannot write: {e.strerror}") from None

    @staticmethod
    def key(data: Mapping[str, Any], base_dir: Path) -> str:
        text = json.dumps(
            {"data": data, "base_dir": str(base_dir), "code": _version.code_sha256()},
            sort_keys=True, separators=(",", ":"), default=str,
        )  # fmt: skip
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def get(self, key: str) -> float | None:
        if self.dir is None:
            return None
        try:
            doc = json.loads(read_text(self.dir / f"{key}.json"))
            value = doc["attainment"]
        except (TwinError, ValueError, KeyError, TypeError):
            return None  # absent, or not whole: run it again
        return float(value) if isinstance(value, int | float) else None

    def put(self, key: str, attainment: float) -> None:
        if self.dir is not None:
            write_text(self.dir / f"{key}.json", json.dumps({"attainment": attainment}) + "\n")


def probe_attainment(
    data: Mapping[str, Any], where: str, base_dir: str, of_class: str | None = None
) -> float:
    """SLO attainment of one run (a worker's job); ``of_class``: that class's. A run
    whose ``slo.slowdown`` bounds do not all hold attains 0 (it misses its SLO at any
    target)."""
    from twin.studies.sweep import run_spec

    summary = run_spec(data, where, base_dir)["summary"]
    if of_class is not None:
        return class_attainment(summary, of_class)
    if not summary.get("slowdown", {"met": True})["met"]:
        return 0.0
    att = summary["slo_attainment"]
    return 0.0 if att is None else float(att)


def offered_rps(spec: ExperimentSpec) -> float:
    """Requests/s the spec's workload offers (see the module docstring)."""
    from twin.workload.stream import iter_requests

    w = spec.workload
    rate = getattr(w.arrival, "rate_per_s", None)
    if rate is not None:
        return float(rate) * w.rate_scale
    first = last = 0.0
    n = 0
    for req in iter_requests(w, np.random.default_rng(0)):
        if n == 0:
            first = req.arrival_s
        last = req.arrival_s
        n += 1
    if n < 2 or last == first:
        return 0.0
    return (n - 1) / (last - first)


@dataclass(frozen=True)
class GoodputRow:
    """One configuration: its swept values, per-seed rates (the rate key's
    value) and goodputs (req/s), and their summary."""

    label: str
    params: dict[str, Any]
    seeds: tuple[int, ...]
    rates: tuple[float, ...]
    goodputs_rps: tuple[float, ...]
    bounded: bool
    gpus: int
    warnings: tuple[str, ...] = ()
    # the prediction interval (req/s; hi None: met the target at every rate tried)
    # at ``coverage`` from the perf model's residuals (twin.studies.goodput_interval)
    interval: tuple[float, float | None] | None = None
    coverage: float | None = None
    # each sample's name ("seed 1", or a trace window's "requests 300-599"), in seeds' order
    samples: tuple[str, ...] = ()
    # with classes of traffic (twin.studies.goodput_classes), per class: its name, its
    # goodput (req/s of the class), the rate of all requests there, and whether bounded
    classes: tuple[tuple[str, float, float, bool], ...] = ()

    @property
    def mean_rps(self) -> float:
        return float(np.mean(self.goodputs_rps))

    @property
    def ci95_rps(self) -> float:
        return ci95(self.goodputs_rps)

    @property
    def per_gpu(self) -> float:
        return self.mean_rps / self.gpus


@dataclass(frozen=True)
class Goodput:
    """Every configuration's goodput, in the sweep's order."""

    rate_key: str
    keys: list[str]
    rows: list[GoodputRow]
    probes: int
    reused: int = 0  # probes read from an earlier run's DIR/probes, not run again

    def csv_rows(self) -> list[list[str]]:
        head = ["label", *self.keys, "goodput_rps_mean", "goodput_rps_ci95"]
        out = [[*head, "goodput_per_gpu", "seeds", "gpus"]]
        with_iv = any(r.interval is not None for r in self.rows)
        if with_iv:  # only then: a spec without residuals writes the columns as before
            out[0] += ["goodput_rps_lo", "goodput_rps_hi", "coverage"]
        per_class = class_columns(self.rows)  # only with classes of traffic
        out[0] += per_class
        for r in self.rows:
            out.append(
                [r.label, *(_cell(r.params[k]) for k in self.keys)]
                + [_cell(r.mean_rps), _cell(r.ci95_rps), _cell(r.per_gpu)]
                + [str(len(r.seeds)), str(r.gpus)]
            )
            if with_iv:
                lo, hi = r.interval if r.interval is not None else (None, None)
                out[-1] += [_cell(lo), _cell(hi), _cell(r.coverage)]
            out[-1] += [_cell(v) for v in class_cells(r, per_class)]
        return out

    def write_csv(self, path: Path) -> None:
        with atomic_write(path) as f:
            csv.writer(f, lineterminator="\n").writerows(self.csv_rows())

    def format_table(self) -> str:
        width = max([len("configuration"), *(len(r.label) for r in self.rows)])
        head = (
            f"{'configuration':<{width}}  {'GPUs':>5} {'seeds':>5} {'goodput req/s':>14} "
            f"{'+- 95% CI':>10} {'per GPU':>9}"
        )
        lines = [head, "-" * len(head)]
        for r in self.rows:
            mark = "" if r.bounded else "  (met the target at every rate tried)"
            ci = r.ci95_rps
            lines.append(
                f"{r.label or '(base)':<{width}}  {r.gpus:>5} {len(r.seeds):>5} "
                f"{r.mean_rps:>14.3f} {'-' if math.isnan(ci) else f'{ci:.3f}':>10} "
                f"{r.per_gpu:>9.4f}{mark}"
            )
        for r in self.rows:  # the values behind each interval
            if len(r.goodputs_rps) > 1:
                each = ", ".join(
                    f"{name} {v:.3f}" for name, v in zip(r.samples, r.goodputs_rps, strict=True)
                )
                lines.append(f"{r.label or '(base)'}: per sample req/s: {each}")
        lines.append(f"rate key {self.rate_key}; {self.probes} simulation runs")
        lines += interval_lines(self.rows)
        lines += class_lines(self.rows)
        for r in self.rows:
            lines += [f"warning: {r.label or '(base)'}: {w}" for w in r.warnings]
        return "\n".join(lines)


def _rate_key(data: Mapping[str, Any], axes: Sequence[Axis], rate_key: str | None) -> str:
    if rate_key is not None:
        return rate_key
    keys = {k for a in axes for k in a.keys}
    for key in RATE_KEYS:
        if key in keys:
            return key
    wl = data.get("workload")
    if isinstance(wl, dict) and isinstance(wl.get("arrival"), dict) and "rate_scale" not in wl:
        return "workload.arrival.rate"
    return "workload.rate_scale"


def _get_path(data: Mapping[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _config_axes(axes: Sequence[Axis], drop: set[str]) -> list[Axis]:
    out = []
    for a in axes:
        keep = [i for i, k in enumerate(a.keys) if k not in drop]
        if not keep:
            continue
        # distinct rows, first seen first; a value may be a mapping or a list
        # (cluster.prefill: {instances: 1, tp: 2}), so rows are told apart by
        # their JSON text, not hashed
        seen: dict[str, tuple[Any, ...]] = {}
        for row in a.rows:
            kept = tuple(row[i] for i in keep)
            seen.setdefault(json.dumps(kept, sort_keys=True, default=str), kept)
        rows = list(seen.values())
        out.append(Axis(tuple(a.keys[i] for i in keep), tuple(rows), a.zipped))
    return out


def _first(spec: ExperimentSpec, limit: int) -> list[Request]:
    from twin.workload.stream import iter_requests

    rng = np.random.default_rng(np.random.SeedSequence(spec.seed).spawn(2)[0])
    return list(itertools.islice(iter_requests(spec.workload, rng), limit))


def _replicates(
    spec: ExperimentSpec, per_seed: dict[int, dict[str, Any]], seeds: Sequence[int], at: str,
    base_dir: Path,
) -> tuple[dict[int, dict[str, Any]], tuple[int, int, float | None]]:  # fmt: skip
    """The runs of one configuration, by seed, as independent samples: a
    trace's runs move to consecutive windows of ``max_requests`` requests
    (those that hold a full window; one run without ``max_requests``); and
    (requests per run asked, requests in the first run, a request's lifetime
    at the SLOs)."""
    w = spec.workload
    n = w.max_requests
    first = _first(spec, n if n is not None else 10**7)
    notes = (n or len(first), len(first), horizon_s(spec.slo, first))
    if w.trace is None:
        return per_seed, notes
    if n is None:
        return {seeds[0]: per_seed[seeds[0]]}, notes
    out = {seeds[0]: per_seed[seeds[0]]}
    for j, s in enumerate(seeds[1:], start=1):
        d = copy.deepcopy(per_seed[s])
        _set_path(d, "workload.skip", w.skip + j * n, at)
        if len(_first(resolve_spec(d, at, base_dir), n)) < n:
            break
        out[s] = d
    return out, notes


def _sample_name(spec: ExperimentSpec, seed: int, n: int | None) -> str:
    """A sample as the table names it: a trace's window of requests, or a seed."""
    w = spec.workload
    if w.trace is not None and n is not None:
        return f"requests {w.skip}-{w.skip + n - 1}"
    return f"seed {seed}"


def over_context(spec: ExperimentSpec, n: int | None) -> float:
    """The share of a sample's requests (its first ``n``; all without) longer
    than the context: rejected at any rate, they miss the SLO whatever the
    cluster does."""
    limit = spec.max_model_len
    reqs = _first(spec, n if n is not None else 10**7)
    if limit is None or not reqs:
        return 0.0
    return sum(r.prompt_tokens + r.output_tokens > limit for r in reqs) / len(reqs)


def kind_warnings(
    names: Sequence[str], shares: Sequence[float], target: float, mml: int
) -> list[str]:
    """A sample whose over-context share alone misses the target, beside
    others that can meet it: the samples differ in kind, not by chance."""
    allowed = 1.0 - target
    bad = [(x, s) for x, s in zip(names, shares, strict=True) if s > allowed + 1e-12]
    if not bad or len(bad) == len(names):
        return []
    worst = max(bad, key=lambda b: b[1])
    rest = max(s for s in shares if s <= allowed + 1e-12)
    return [
        f"the samples differ in kind: {', '.join(x for x, _ in bad)} hold(s) up to "
        f"{worst[1]:.1%} requests longer than the context ({mml:,} tokens; {worst[0]}), "
        f"more than the {allowed:.0%} the target lets miss, so no rate meets it there "
        f"(goodput 0), against at most {rest:.1%} in the others: the interval measures that "
        "difference, not chance; a model or engine.max_model_len that fits the traffic, "
        "not a larger sample, narrows it"
    ]


def goodput(  # noqa: C901
    data: Mapping[str, Any],
    where: str,
    base_dir: Path,
    *,
    rate_key: str | None = None,
    seeds: int | None = None,
    target: float | None = None,
    start: float | None = None,
    sample: int | None = None,
    rel_tol: float = 0.05,
    max_steps: int = 12,
    executor: Executor | None = None,
    runner: Callable[..., float] = probe_attainment,
    out: Path | None = None,
) -> Goodput:
    """The goodput of every configuration of the spec ``data`` (parsed YAML,
    overrides applied). ``seeds``: K seeds from the spec's seed on (default:
    the swept ``seed:`` values, else 3); ``target``: the attainment to meet
    (default each configuration's ``slo.target``); ``start``: the first rate
    tried (default the rate key's value in the spec, else 1); ``sample``:
    requests per run (``workload.max_requests``; default the spec's own).

    The K runs of a configuration are independent samples of its workload: a
    synthetic one at K seeds; a trace, whose requests no seed changes, in K
    consecutive windows of ``max_requests`` requests (``workload.skip``), as
    many as it holds. Each row carries the warnings of
    :func:`twin.studies.samples.sample_warnings`. ``out``: the folder whose
    ``probes/`` keeps each finished probe (see the module docstring)."""
    axes = parse_sweep(data["sweep"], where) if "sweep" in data else []
    key = _rate_key(data, axes, rate_key)
    if key not in RATE_KEYS:
        raise SpecError(f"{where}: rate key {key!r}; expected one of {', '.join(RATE_KEYS)}")
    base = {k: copy.deepcopy(v) for k, v in data.items() if k != "sweep"}
    seed0 = base.get("seed", 0)
    swept_seeds = next((a.rows for a in axes if a.keys == ("seed",)), None)
    if seeds is not None:
        if seeds < 1:
            raise SpecError(f"--seeds: {seeds} must be a positive integer")
        seed_list = [seed0 + k for k in range(seeds)] if isinstance(seed0, int) else []
    elif swept_seeds is not None:
        seed_list = [row[0] for row in swept_seeds]
    else:
        seed_list = [seed0 + k for k in range(DEFAULT_SEEDS)] if isinstance(seed0, int) else []
    if not seed_list:
        raise SpecError(f"{where}: seed: {seed0!r} must be a non-negative integer")
    if sample is not None:
        if sample < 1:
            raise SpecError(f"--sample: {sample} must be a positive integer")
        _set_path(base, "workload.max_requests", sample, where)
    if start is None:
        first = next((a.rows[0][a.keys.index(key)] for a in axes if key in a.keys), None)
        given = _get_path(base, key)
        start = given if isinstance(given, int | float) else first
        start = float(start) if isinstance(start, int | float) else 1.0
    caxes = _config_axes(axes, {key, "seed"})
    keys = [k for a in caxes for k in a.keys]

    configs: list[Any] = []  # (params, label, target, gpus, {seed: data}, ...)
    targets: dict[tuple[int, str], float] = {}  # (configuration, a class's side) -> its target
    for n, combo in enumerate(itertools.product(*(a.rows for a in caxes))):
        params: dict[str, Any] = {}
        for axis, row in zip(caxes, combo, strict=True):
            params.update(zip(axis.keys, row, strict=True))
        at = f"{where}: configuration {n} ({_params_text(params)})"
        per_seed = {}
        for seed in seed_list:
            d = copy.deepcopy(base)
            for k, v in params.items():
                if not k.startswith("tag."):
                    _set_path(d, k, v, at)
            d["seed"] = seed
            _set_path(d, key, start, at)
            per_seed[seed] = d
        spec = resolve_spec(per_seed[seed_list[0]], at, base_dir)
        require_slo(spec, at)
        per_seed, notes = _replicates(spec, per_seed, seed_list, at, base_dir)
        tgt = spec.slo.target if target is None else target
        label = make_label(params, caxes, ())
        sides, coverage = slo_sides(spec)
        variants = {"": per_seed} | {
            side: {seed: with_slo(d, v) for seed, d in per_seed.items()}
            for side, v in sides.items()
            if v is not None
        }
        csides = class_sides(spec, target)  # a search per class of traffic
        variants |= dict.fromkeys(csides, per_seed)
        targets.update({(len(configs), side): t for side, t in csides.items()})
        configs.append(
            (params, label, tgt, _gpus(spec.resolved), per_seed, at, notes, variants,
             (sides, coverage))
        )  # fmt: skip

    searches = {
        (c, s, side): rate_search(start, rel_tol=rel_tol, up=max_steps, down=max_steps)
        for c in range(len(configs))
        for side, datas in configs[c][7].items()
        for s in datas
    }
    pending = {cs: next(g) for cs, g in searches.items()}
    found: dict[tuple[int, int, str], tuple[float, bool]] = {}
    probes = reused = 0
    store = ProbeStore(out)
    # a unit is a search (a configuration on a seed or window) done; the probes run beside
    with (
        executor if executor is not None else Executor(jobs=1) as ex,
        Progress(len(searches), "searches", desc="goodput") as bar,
    ):
        while pending:
            order = list(pending)
            jobs: list[Job] = []
            results: dict[int, float] = {}
            pkeys: list[str] = []
            for i, (c, s, side) in enumerate(order):
                d = copy.deepcopy(configs[c][7][side][s])
                _set_path(d, key, pending[(c, s, side)], configs[c][5])
                of_class = side[len(SIDE) :] if side.startswith(SIDE) else None
                pkey = store.key(d if of_class is None else {"class": of_class, **d}, base_dir)
                done = store.get(pkey)
                if done is not None:
                    results[i] = done
                    reused += 1
                    continue
                pkeys.append(pkey)
                args = (d, configs[c][5], str(base_dir))
                jobs.append((runner, args if of_class is None else (*args, of_class)))
            index = [i for i in range(len(order)) if i not in results]
            for j, att in ex.run(jobs):
                store.put(pkeys[j], att)  # written as it finishes: a rerun resumes here
                results[index[j]] = att
                bar.note(f"{probes + len(results)} runs")
                bar.update(0)
            probes += len(order)
            for i, cs in enumerate(order):
                tgt = targets.get((cs[0], cs[2]), configs[cs[0]][2])
                try:
                    pending[cs] = searches[cs].send(results[i] >= tgt)
                except StopIteration as stop:
                    found[cs] = stop.value
                    del pending[cs]
                    bar.update()

    def to_rps(data: dict[str, Any], rate: float, at: str) -> float:
        if rate <= 0:
            return 0.0
        d = copy.deepcopy(data)
        _set_path(d, key, rate, at)
        return offered_rps(resolve_spec(d, at, base_dir))

    rows = []
    for c, (params, label, tgt, gpus, per_seed, at, notes, variants, iv) in enumerate(configs):
        rates = [found[(c, s, "")][0] for s in per_seed]
        rps = [to_rps(per_seed[s], r, at) for s, r in zip(per_seed, rates, strict=True)]
        bounded = all(found[(c, s, "")][1] for s in per_seed)
        interval = None
        if iv[0]:
            lo = [to_rps(per_seed[s], found[(c, s, "lo")][0], at) for s in per_seed] if (
                "lo" in variants) else []  # fmt: skip
            hi = [(to_rps(per_seed[s], found[(c, s, "hi")][0], at), found[(c, s, "hi")][1])
                  for s in per_seed] if "hi" in variants else []  # fmt: skip
            interval = envelope(iv[0], lo, hi)
        asked, got, horizon = notes
        warn = sample_warnings(
            asked=asked, got=got, target=tgt, replicates_asked=len(seed_list),
            replicates=len(per_seed), mean=float(np.mean(rps)), ci=ci95(rps), horizon_s=horizon,
        )  # fmt: skip
        specs = {s: resolve_spec(per_seed[s], at, base_dir) for s in per_seed}
        limit = next(iter(specs.values())).workload.max_requests
        names = tuple(_sample_name(sp, s, limit) for s, sp in specs.items())
        mml = next(iter(specs.values())).max_model_len
        if len(specs) > 1 and mml is not None:
            shares = [over_context(sp, limit) for sp in specs.values()]
            kind = kind_warnings(names, shares, tgt, mml)
            if kind:  # then a larger sample is not the remedy the interval suggests
                warn = [w for w in warn if "95% interval" not in w] + kind
        rows.append(
            GoodputRow(
                label,
                params,
                tuple(per_seed),
                tuple(rates),
                tuple(rps),
                bounded,
                gpus,
                tuple(warn),
                interval,
                iv[1],
                names,
                _per_class(c, variants, found, per_seed, specs, to_rps, at),
            )  # fmt: skip
        )
    return Goodput(key, keys, rows, probes, reused)


def _per_class(
    c: int, variants: Mapping[str, Any], found: Mapping[tuple[int, int, str], tuple[float, bool]],
    per_seed: Mapping[int, Any], specs: Mapping[int, ExperimentSpec],
    to_rps: Callable[[dict[str, Any], float, str], float], at: str,
) -> tuple[tuple[str, float, float, bool], ...]:  # fmt: skip
    """Each class's goodput of configuration ``c``: the mean over samples of
    the rate found for it, all requests and the class's share of them."""
    out = []
    sides = [side for side in variants if side.startswith(SIDE)]
    shares = {s: class_shares(specs[s]) for s in per_seed} if sides else {}
    for side in sides:
        name = side[len(SIDE) :]
        total = [to_rps(per_seed[s], found[(c, s, side)][0], at) for s in per_seed]
        share = [shares[s][name] for s in per_seed]
        mine = [t * f for t, f in zip(total, share, strict=True)]
        bounded = all(found[(c, s, side)][1] for s in per_seed)
        out.append((name, float(np.mean(mine)), float(np.mean(total)), bounded))
    return tuple(out)
