"""Measured runs read, whatever their kind: an inference-perf run folder or a
run of a folder with a ``manifest.csv`` (:mod:`twin.studies.realrun`), a
``vllm bench serve`` result or an AIPerf export (:mod:`twin.studies.benchrun`);
each as a :class:`~twin.studies.realrun.RealRun`."""

from __future__ import annotations

from pathlib import Path

from twin.errors import TwinError
from twin.studies.benchrun import bench_file, read_bench_run
from twin.studies.realrun import RealRun, _folder_run, _is_run_folder, _manifest, _manifest_run


def read_run(path: str | Path, *, gpu: str | None = None) -> RealRun:
    """The run at ``path`` (:mod:`twin.studies.realrun`): a run folder, or ``DATA/<key>`` /
    ``DATA/runs/<run>`` of a folder with a ``manifest.csv``, or a ``vllm bench serve``
    result or an AIPerf export (:mod:`twin.studies.benchrun`). ``gpu`` (a catalog name)
    is needed where the run's files do not name one (an inference-perf folder)."""
    p = Path(path)
    for data, key in ((p.parent, p.name), (p.parent.parent, p.name)):
        if (data / "manifest.csv").is_file():
            rows = _manifest(data)
            row = rows.get(key) or next(
                (r for r in rows.values() if r.get("training_run") == key), None
            )
            if row is not None:
                return _manifest_run(data, row, gpu)
    kind = bench_file(p)
    if kind is not None:  # vllm bench serve's result, AIPerf's export
        return read_bench_run(p, kind, gpu)
    if p.is_dir():
        return _folder_run(p, gpu)
    raise TwinError(
        f"{p}: not an inference-perf run folder nor a run of a folder with manifest.csv"
    )


def read_runs(folder: str | Path, *, gpu: str | None = None) -> list[RealRun]:
    """Every run of ``folder``: the rows of its ``manifest.csv`` in file order, else
    each sub-folder that is an inference-perf run folder (sorted by name)."""
    f = Path(folder)
    if (f / "manifest.csv").is_file():
        return [_manifest_run(f, row, gpu) for row in _manifest(f).values()]
    if not f.is_dir():
        raise TwinError(f"{f}: not a folder")
    runs = []
    for d in sorted(f.iterdir()):
        kind = bench_file(d)
        if kind is not None:
            runs.append(read_bench_run(d, kind, gpu))
        elif _is_run_folder(d):
            runs.append(_folder_run(d, gpu))
    if not runs:
        raise TwinError(
            f"{f}: no manifest.csv and no measured run in it (an inference-perf run folder, "
            "a vllm bench serve result, an AIPerf export)"
        )
    return runs
