"""Sweeps: one spec, a grid of variants, run in parallel, written run by run.

A spec with a ``sweep:`` section lists values for dotted key paths (the
meaning of ``--set``; ``null`` deletes a key so that its default applies)::

    sweep:
      workload.rate_scale: [0.5, 1.0, 2.0]      # an axis of the product
      zip:                                      # groups whose keys vary together
        - {cluster.prefill.instances: [2, 3], cluster.decode.instances: [2, 1]}
      seed: [0, 1]

The runs are the cartesian product of the axes in the order written (the
first axis varies slowest; each ``zip:`` group is one axis, placed where
``zip:`` stands). Keys under ``tag.`` are labels, not spec keys: they name a
value in the table and the label (``tag.trace: [code, conv]`` beside the
trace paths), and the keys zipped with a tag stay out of the label. Every run
is resolved (``twin.sim.spec.resolve_spec``, its scheduler built) before any runs.

Output layout (``twin sweep SPEC --out DIR``; ``twin.viz.plots`` relies on it)::

    DIR/spec.yaml          the sweep spec as given, --set overrides applied
    DIR/runs/<run_id>.json one run: Result.to_dict() (header, summary,
                           instances, links, timeline) plus "params": {dotted
                           key: value}
    DIR/runs.csv           one row per run, in run order (the cartesian order as
                           written), whatever order the runs finished in:
                             run_id, <each swept key by its dotted path, in the
                             order written>, label, <every summary metric,
                             nested ones flattened with dots: requests,
                             completed, rejected, rejected_by_reason (JSON),
                             ttft_s.mean, ttft_s.p50, ..., slo_attainment,
                             throughput_rps, kv_bytes_transferred, ...>, gpus
    DIR/runs.parquet       runs.csv's columns, typed (twin/studies/sweepdata.py),
                           when pyarrow is importable (the notes say which)
    DIR/requests/<run_id>.csv      (--requests) the run's per-request rows,
    DIR/requests/<run_id>.parquet  and as Parquet when pyarrow is importable
    DIR/traces/<run_id>.json       (--traces) the run's Chrome/Perfetto trace
    DIR/goodput.csv        (twin goodput) label, <swept keys but the rate key
                           and seed>, goodput_rps_mean, goodput_rps_ci95,
                           goodput_per_gpu, seeds, gpus

``run_id`` is the first 12 hex digits of the run's resolved spec sha256
(``header.spec_sha256``). ``label`` names the configuration without the rate
and the seed (``prefill=2 decode=1 slo.ttft=1 s``). CSV floats are written
exactly (``repr``), ``None`` as an empty cell, lists and mappings as JSON.
A run whose JSON is already there with the same spec sha256 is not run again,
so an interrupted sweep resumes (with ``--requests``, a run without its
``requests/<run_id>.csv`` runs again to write it). Every file is written whole:
to a temporary name in its folder, renamed once complete
(:func:`twin._io.atomic_write`), runs.csv once every run has finished, so a
sweep that fails or is interrupted leaves no partial file that looks finished.
Interrupted (Ctrl-C, SIGTERM), a local pool stops its workers before the
command exits; killed outright (SIGKILL), its workers end with it
(:mod:`twin.studies.workers`) and the next sweep into ``DIR`` removes the
temporary files it left.
Each run is deterministic, so the files are byte-identical whichever executor
and how many workers ran them.
"""

from __future__ import annotations

import copy
import csv
import functools
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from twin import _version
from twin._io import atomic_write, read_text, remove_stale_tmp, write_text
from twin._progress import Progress
from twin.errors import SpecError, TwinError
from twin.sim.frames import flatten
from twin.sim.spec import apply_overrides, resolve_spec
from twin.studies.compare import _set_path

RATE_KEYS = ("workload.rate_scale", "workload.arrival.rate")
EXECUTORS = ("local", "dask")
TAG = "tag."
RUN_ID_CHARS = 12
_VALUES = {"type": "array", "minItems": 1}
SWEEP_SCHEMA = {
    "type": "object",
    "minProperties": 1,
    "description": "key.path -> [values], one axis each, run as a product; zip: groups keys "
    "that vary together; see docs/guides/sweeps.md",
    "properties": {
        "zip": {"type": "array", "items": {"type": "object", "additionalProperties": _VALUES}}
    },
    "additionalProperties": _VALUES,
}


# -- the sweep section ---------------------------------------------------------------
@dataclass(frozen=True)
class Axis:
    """One factor of the product: ``keys`` that vary together, ``rows`` of
    their values (one tuple per level)."""

    keys: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    zipped: bool = False


@dataclass(frozen=True)
class Run:
    """One run of a sweep: its place, its swept values, its spec data (plain,
    as YAML would give it) and the resolved spec's hash."""

    index: int
    params: dict[str, Any]
    data: dict[str, Any]
    spec_sha256: str
    label: str
    gpus: int

    @property
    def run_id(self) -> str:
        return self.spec_sha256[:RUN_ID_CHARS]


def _values(key: str, values: Any, where: str) -> list[Any]:
    if not isinstance(values, list) or not values:
        raise SpecError(f"{where}: {key}: {values!r} must be a non-empty list of values")
    return values


def _check_key(key: Any, where: str) -> str:
    if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
        raise SpecError(f"{where}: {key!r} is not a key path (expected e.g. cluster.tp)")
    if key.split(".")[0] == "sweep":
        raise SpecError(f"{where}: {key}: a sweep cannot sweep itself")
    return key


def parse_sweep(section: Any, where: str) -> list[Axis]:
    """The axes of a ``sweep:`` section, in the order written."""
    at = f"{where}: sweep"
    if not isinstance(section, dict) or not section:
        raise SpecError(f"{at}: {section!r} must be a mapping of key.path: [values]")
    axes: list[Axis] = []
    for key, values in section.items():
        if key == "zip":
            if not isinstance(values, list) or not values:
                raise SpecError(f"{at}.zip: {values!r} must be a list of {{key: [values]}} groups")
            for n, group in enumerate(values):
                gat = f"{at}.zip[{n}]"
                if not isinstance(group, dict) or not group:
                    raise SpecError(f"{gat}: {group!r} must be a mapping of key.path: [values]")
                keys = tuple(_check_key(k, gat) for k in group)
                cols = [_values(k, group[k], gat) for k in keys]
                lengths = {k: len(c) for k, c in zip(keys, cols, strict=True)}
                if len(set(lengths.values())) > 1:
                    sizes = ", ".join(f"{k} has {v}" for k, v in lengths.items())
                    raise SpecError(f"{gat}: zipped keys need as many values each; {sizes}")
                axes.append(Axis(keys, tuple(zip(*cols, strict=True)), zipped=True))
        else:
            key = _check_key(key, at)
            axes.append(Axis((key,), tuple((v,) for v in _values(key, values, at))))
    seen: set[str] = set()
    for axis in axes:
        for key in axis.keys:
            if key in seen:
                raise SpecError(f"{at}: {key} is swept twice")
            seen.add(key)
    return axes


def swept_keys(axes: Sequence[Axis]) -> list[str]:
    return [k for a in axes for k in a.keys]


def apply_sweep_overrides(data: dict[str, Any], overrides: Sequence[str]) -> None:
    """``--set`` for a sweep spec: ``sweep.KEY=[...]`` replaces the values of
    the swept ``KEY`` (in its zip group, if any; a key not swept yet becomes a
    new axis at the end); every other item is a plain ``--set`` of the base."""
    plain = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not (sep and key.startswith("sweep.") and len(key) > len("sweep.")):
            plain.append(item)
            continue
        target = key[len("sweep.") :]
        holder: dict[str, Any] = {}
        apply_overrides(holder, [f"v={raw}"], where="--set")
        value = holder.get("v")  # null: none (refused below, as a list is expected)
        section = data.get("sweep")
        if not isinstance(section, dict):
            raise SpecError(f"--set {item!r}: the spec has no sweep: section")
        zipped = section.get("zip")
        groups: list[Any] = zipped if isinstance(zipped, list) else []
        for group in groups:
            if isinstance(group, dict) and target in group:
                group[target] = value
                break
        else:
            section[target] = value
    apply_overrides(data, plain)


def short_key(key: str) -> str:
    """How a key reads in a label: ``cluster.prefill.instances`` -> ``prefill``,
    ``scheduler.name`` -> ``scheduler``, ``tag.trace`` -> ``trace``."""
    parts = key.split(".")
    if len(parts) > 1 and parts[-1] in ("instances", "name"):
        parts = parts[:-1]
    if len(parts) > 1 and parts[0] in ("cluster", "workload", "tag"):
        parts = parts[1:]
    if key == "cluster.instances":
        return "instances"
    return ".".join(parts)


def make_label(params: Mapping[str, Any], axes: Sequence[Axis], leave_out: Iterable[str]) -> str:
    """The configuration's label: ``short=value`` of each swept key but those
    in ``leave_out``, those set to null and those zipped with a ``tag.`` key."""
    skip = set(leave_out)
    for axis in axes:
        if any(k.startswith(TAG) for k in axis.keys):
            skip.update(k for k in axis.keys if not k.startswith(TAG))
    parts = []
    for key, value in params.items():
        if key in skip or value is None:
            continue
        parts.append(f"{short_key(key)}={_cell(value)}")
    return " ".join(parts)


def _gpus(resolved: Mapping[str, Any]) -> int:
    return sum(
        g["instances"] * g["tp"] * g["pp"] * g.get("dp", 1) for g in resolved["cluster"]["groups"]
    )


def expand(
    data: Mapping[str, Any], where: str, base_dir: Path, *, leave_out: Sequence[str] = ()
) -> tuple[list[Axis], list[Run]]:
    """The axes and the runs of a sweep spec (``data``: parsed YAML with a
    ``sweep:`` section, overrides applied), each run resolved and its
    scheduler built; errors name the run by its swept values. ``leave_out``:
    keys kept out of the labels (besides the rate keys and ``seed``)."""
    axes = parse_sweep(data.get("sweep"), where)
    base = {k: copy.deepcopy(v) for k, v in data.items() if k != "sweep"}
    out_of_label = {*RATE_KEYS, "seed", *leave_out}
    runs: list[Run] = []
    seen: dict[str, int] = {}
    for index, combo in enumerate(itertools.product(*(a.rows for a in axes))):
        params: dict[str, Any] = {}
        for axis, row in zip(axes, combo, strict=True):
            params.update(zip(axis.keys, row, strict=True))
        at = f"{where}: sweep run {index} ({_params_text(params)})"
        run_data = copy.deepcopy(base)
        for key, value in params.items():
            if not key.startswith(TAG):
                _set_path(run_data, key, value, at)
        spec = resolve_spec(run_data, at, base_dir)
        sha = spec.sha256
        if sha in seen:
            raise SpecError(
                f"{at}: the same spec as run {seen[sha]}; its swept values change nothing"
            )
        seen[sha] = index
        label = make_label(params, axes, out_of_label)
        runs.append(Run(index, params, run_data, sha, label, _gpus(spec.resolved)))
    return axes, runs


def _params_text(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_cell(v)}" for k, v in params.items())


# -- running one spec (in a worker) --------------------------------------------------
def run_spec(data: Mapping[str, Any], where: str, base_dir: str) -> dict[str, Any]:
    """Resolve and run one spec; the result as ``Result.to_dict()``. A top-level
    function so that process pools and Dask workers can call it."""
    from twin.sim.simulation import Simulation

    return Simulation(resolve_spec(data, where, Path(base_dir))).run().to_dict()


def run_spec_with_requests(data: Mapping[str, Any], where: str, base_dir: str) -> dict[str, Any]:
    """:func:`run_spec`, plus the per-request rows as CSV text under the key
    ``"requests_csv"`` (written by the caller, so remote workers need no shared disk)."""
    return run_spec_outputs(data, where, base_dir, requests=True)


def run_spec_outputs(
    data: Mapping[str, Any], where: str, base_dir: str, *, requests: bool = False,
    traces: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """:func:`run_spec`, plus with ``requests`` the per-request rows as CSV text
    (key ``"requests_csv"``) and with ``traces`` the run's Chrome trace as JSON
    text (key ``"trace_json"``, twin/sim/trace.py), for the caller to write."""
    import csv
    import io

    from twin.sim.metrics import request_columns
    from twin.sim.simulation import Simulation
    from twin.sim.trace import TraceRecorder, chrome_trace_text

    spec = resolve_spec(data, where, Path(base_dir))
    buf = io.StringIO()
    columns = request_columns(bool(spec.workload.classes), bool(spec.models))
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    recorder = TraceRecorder() if traces else None
    on_row = writer.writerow if requests else None
    result = Simulation(spec, on_row=on_row, trace=recorder).run().to_dict()
    if requests:
        result["requests_csv"] = buf.getvalue()
    if recorder is not None:
        result["trace_json"] = chrome_trace_text(recorder)
    return result


# -- executors -----------------------------------------------------------------------
Job = tuple[Callable[..., Any], tuple[Any, ...]]


def cores() -> int:
    """The processors this process may run on (its affinity mask, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def parse_jobs(value: str | int | None) -> int | None:
    """``-j``: a positive integer, or ``auto`` (None: every core)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise TwinError(f"-j: {value!r} must be a positive integer or auto")
    return n


def _on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _terminate_raises() -> Any:
    """While a pool runs, SIGTERM unwinds like Ctrl-C (so the pool's workers
    are stopped); returns the handler to restore, or None off the main thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _on_term)


def _restore_term(previous: Any) -> None:
    import signal

    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


class Executor:
    """Runs jobs (a function and its arguments) and yields ``(index, result)``
    as they finish: in this process (``jobs=1``, or one core), in a process
    pool, or on a Dask cluster (a local one, or an existing scheduler at
    ``address``). ``jobs=None`` (``-j auto``) uses every core: that many local
    processes, or local Dask workers. A job's function and arguments must
    pickle (a module-level function, plain data, specs, requests); callers
    key results by index, so nothing depends on the order jobs finish in."""

    def __init__(self, kind: str = "local", jobs: int | None = None, address: str | None = None):
        if kind not in EXECUTORS:
            raise TwinError(f"--executor: {kind!r}; expected one of {', '.join(EXECUTORS)}")
        if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
            raise TwinError(f"-j: {jobs!r} must be a positive integer or auto")
        if address is not None:
            kind = "dask"
        self.kind, self.jobs, self.address = kind, jobs, address
        self._pool: Any = None
        self._term: Any = None
        self._client: Any = None
        self._cluster: Any = None

    @property
    def workers(self) -> int:
        """How many jobs run at once on a local pool or cluster."""
        return self.jobs if self.jobs is not None else cores()

    def __enter__(self) -> Executor:
        if self.kind == "dask":
            try:
                from dask.distributed import Client, LocalCluster
            except ImportError:
                raise TwinError(
                    "--executor dask: dask.distributed is not installed "
                    "(pip install 'pd-twin[dask]')"
                ) from None
            if self.address is not None:
                try:
                    self._client = Client(self.address, timeout="10s")
                except OSError as e:
                    raise TwinError(f"--address {self.address}: cannot connect: {e}") from None
            else:
                self._cluster = LocalCluster(
                    n_workers=self.workers,
                    processes=True,
                    threads_per_worker=1,
                    dashboard_address=None,
                )
                self._client = Client(self._cluster)
        elif self.workers > 1:
            from concurrent.futures import ProcessPoolExecutor

            from twin.studies.workers import init_worker

            self._pool = ProcessPoolExecutor(
                max_workers=self.workers, initializer=init_worker, initargs=(os.getpid(),)
            )
            self._term = _terminate_raises()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            if exc and exc[0] is not None:
                # interrupted or failed: stop the workers now, leave none behind
                procs = list((getattr(self._pool, "_processes", None) or {}).values())
                self._pool.shutdown(wait=False, cancel_futures=True)
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.join()
            else:
                self._pool.shutdown(wait=True, cancel_futures=True)
            _restore_term(self._term)
        if self._client is not None:
            self._client.close()
        if self._cluster is not None:
            self._cluster.close()
        self._pool = self._client = self._cluster = None  # entered again, it starts afresh

    def run(self, jobs: Sequence[Job]) -> Iterator[tuple[int, Any]]:
        """Yield ``(index into jobs, result)`` in the order they finish; a job's
        exception is raised here (the finished ones have been yielded)."""
        if self._client is not None:
            from dask.distributed import as_completed as dask_completed

            futures = {
                self._client.submit(fn, *args, pure=False): i for i, (fn, args) in enumerate(jobs)
            }
            for fut in dask_completed(futures):
                yield futures[fut], fut.result()
        elif self._pool is not None and len(jobs) > 1:  # one job runs here, unpickled
            from concurrent.futures import as_completed

            futures = {self._pool.submit(fn, *args): i for i, (fn, args) in enumerate(jobs)}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()
        else:
            for i, (fn, args) in enumerate(jobs):
                yield i, fn(*args)


# -- outputs -------------------------------------------------------------------------
def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list | dict):
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return str(value)


def _write_whole(path: Path, text: str) -> None:
    write_text(path, text)


def run_document(run: Run, result: Mapping[str, Any]) -> str:
    """The text of ``runs/<run_id>.json``."""
    doc = {"params": run.params, **result}
    return json.dumps(doc, indent=2, default=str) + "\n"


def _done(path: Path, sha: str) -> dict[str, Any] | None:
    """The stored result at ``path`` if it is whole, of the spec ``sha`` and
    made by this very code (a changed model must not reuse old results)."""
    try:
        doc = json.loads(read_text(path))
    except (TwinError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    header = doc.get("header", {})
    if header.get("spec_sha256") != sha or header.get("code_sha256") != _version.code_sha256():
        return None
    return doc


class RunsTable:
    """``runs.csv``, written row by row in run order: row ``i`` goes out once
    runs ``0..i`` have all finished."""

    def __init__(self, f: IO[str], keys: Sequence[str]):
        self._writer = csv.writer(f, lineterminator="\n")
        self._f, self._keys = f, list(keys)
        self._metrics: list[str] | None = None
        self._pending: dict[int, tuple[Run, Mapping[str, Any]]] = {}
        self._next = 0

    def add(self, run: Run, summary: Mapping[str, Any]) -> None:
        self._pending[run.index] = (run, summary)
        while self._next in self._pending:
            r, s = self._pending.pop(self._next)
            flat = flatten(s)
            if self._metrics is None:
                self._metrics = list(flat)
                self._writer.writerow(["run_id", *self._keys, "label", *self._metrics, "gpus"])
            self._writer.writerow(
                [r.run_id]
                + [_cell(r.params[k]) for k in self._keys]
                + [r.label]
                + [_cell(flat.get(m)) for m in self._metrics]
                + [str(r.gpus)]
            )
            self._next += 1
        self._f.flush()


@dataclass(frozen=True)
class SweepOutcome:
    """What ``run_sweep`` did: the runs in order, how many ran and were skipped."""

    runs: list[Run]
    ran: int
    skipped: int
    out: Path
    notes: tuple[str, ...] = ()  # what was written or left out, and why (printed by twin sweep)


def run_sweep(
    data: Mapping[str, Any],
    where: str,
    base_dir: Path,
    out: Path,
    *,
    executor: Executor | None = None,
    runner: Callable[..., dict[str, Any]] | None = None,
    requests: bool = False,
    traces: bool = False,
) -> SweepOutcome:
    """Run every run of the sweep spec ``data`` (parsed YAML, overrides applied)
    not already done in ``out`` and write the layout described at the top of
    this module. ``executor`` defaults to one local process; ``runner`` is the
    function a worker calls with ``(data, where, base_dir)`` (tests swap it);
    ``requests`` also writes each run's per-request rows to
    ``out/requests/<run_id>.csv`` (for latency CDFs); ``traces`` each run's
    Chrome trace to ``out/traces/<run_id>.json`` (a done run without its
    trace is run again). Parquet beside the CSV files when pyarrow is
    importable; the outcome's notes say whether it was."""
    from twin.sim.frames import have_pyarrow

    if runner is None:
        runner = run_spec
        if requests or traces:
            runner = functools.partial(run_spec_outputs, requests=requests, traces=traces)
    axes, runs = expand(data, where, base_dir)
    out = Path(out)
    parquet = have_pyarrow()
    try:
        (out / "runs").mkdir(parents=True, exist_ok=True)
        for d in (out, out / "runs", out / "requests", out / "traces"):
            remove_stale_tmp(d)  # of a sweep killed outright (SIGKILL) before this one
        _write_whole(out / "spec.yaml", yaml.safe_dump(dict(data), sort_keys=False))
        (out / "runs.parquet").unlink(missing_ok=True)  # rewritten once runs.csv is whole
    except OSError as e:
        raise TwinError(f"{out}: cannot write: {e.strerror}") from None
    todo: list[Run] = []
    # runs.csv takes its name only once every row is in (twin._io.atomic_write)
    with atomic_write(out / "runs.csv") as f:
        table = RunsTable(f, swept_keys(axes))
        _run_all(
            runs, todo, table, out, where, base_dir, executor, runner, requests, traces, parquet
        )
    skipped = len(runs) - len(todo)
    notes = []
    if parquet:
        from twin.studies.sweepdata import write_runs_parquet

        write_runs_parquet(out)
        notes.append(
            f"Parquet written beside the CSV files: {out / 'runs.parquet'}"
            + (f", {out / 'requests'}/<run_id>.parquet" if requests else "")
        )
    else:
        notes.append("no Parquet: pyarrow is not installed (pip install 'pd-twin[data]'); CSV only")
    return SweepOutcome(runs, len(todo), skipped, out, tuple(notes))


def _run_all(
    runs: list[Run],
    todo: list[Run],
    table: RunsTable,
    out: Path,
    where: str,
    base_dir: Path,
    executor: Executor | None,
    runner: Callable[..., dict[str, Any]],
    requests: bool,
    traces: bool,
    parquet: bool,
) -> None:
    """Add the done runs to ``table``, then run ``todo`` (filled here) and add
    each as it finishes, writing its files."""
    progress: Progress | None = None
    try:
        for run in runs:
            doc = _done(out / "runs" / f"{run.run_id}.json", run.spec_sha256)
            if traces and not (out / "traces" / f"{run.run_id}.json").is_file():
                doc = None
            if requests and not (out / "requests" / f"{run.run_id}.csv").is_file():
                doc = None  # swept before without --requests: run again for its rows
            if doc is None:
                todo.append(run)
            else:
                table.add(run, doc["summary"])
        skipped = len(runs) - len(todo)
        progress = Progress(len(runs), "runs", desc="sweep", initial=skipped)
        jobs: list[Job] = [(runner, (r.data, where, str(base_dir))) for r in todo]
        with executor if executor is not None else Executor(jobs=1) as ex:
            for i, result in ex.run(jobs):
                run = todo[i]
                rows = result.pop("requests_csv", None)
                if rows is not None:
                    (out / "requests").mkdir(exist_ok=True)
                    _write_whole(out / "requests" / f"{run.run_id}.csv", rows)
                    if parquet:
                        from twin.studies.sweepdata import write_requests_parquet

                        write_requests_parquet(out / "requests", run.run_id, rows)
                trace = result.pop("trace_json", None)
                if trace is not None:
                    (out / "traces").mkdir(exist_ok=True)
                    _write_whole(out / "traces" / f"{run.run_id}.json", trace)
                _write_whole(out / "runs" / f"{run.run_id}.json", run_document(run, result))
                table.add(run, result["summary"])
                progress.update()
    finally:
        if progress is not None:
            progress.close()
