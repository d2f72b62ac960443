"""Progress bars of the long commands: on a terminal's stderr only, never on
stdout, never in an output file."""

from __future__ import annotations

import copy
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from twin._progress import Progress
from twin.cli import main

BASE = {
    "name": "tiny",
    "model": "llama-3.1-8b",
    "cluster": {"instances": 1, "tp": 1},
    "workload": {
        "lengths": "azure-conv",
        "arrival": {"process": "poisson", "rate": 2.0},
        "max_requests": 20,
    },
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_a_bar_counts_units_with_elapsed_time_and_eta_on_a_terminal():
    tty = Tty()
    with Progress(3, "runs", desc="sweep", stream=tty) as bar:
        for _ in range(3):
            bar.update()
        bar.note("7 probes")
        assert bar.shown and bar.done == 3
    text = tty.getvalue()
    assert "sweep" in text and " 3/3 " in text and "runs" in text
    # elapsed<remaining, as tqdm writes them
    assert re.search(r"\[\d\d:\d\d<\d\d:\d\d", text), text
    assert text.endswith("\n")  # closed: the next line starts clean


def test_a_resumed_count_starts_at_what_was_done():
    tty = Tty()
    with Progress(5, "runs", initial=3, stream=tty) as bar:
        bar.update()
    assert " 3/5 " in tty.getvalue() and " 4/5 " in tty.getvalue()
    assert bar.done == 4


@pytest.mark.parametrize(
    "stream, quiet, total",
    [(io.StringIO(), False, 3), (Tty(), True, 3), (Tty(), False, 0)],
    ids=["not a terminal", "quiet", "nothing to count"],
)
def test_no_bar_prints_nothing(stream, quiet, total):
    with Progress(total, "runs", stream=stream, quiet=quiet) as bar:
        bar.update(total)
        bar.note("x")
    assert not bar.shown and stream.getvalue() == "" and bar.done == total


def test_a_bar_not_shown_never_imports_tqdm():
    code = (
        "import sys, twin.cli; from twin._progress import Progress\n"
        "with Progress(3, 'runs') as p: p.update(3)\n"
        "assert 'tqdm' not in sys.modules, 'tqdm imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""


def _files(folder: Path) -> dict[str, bytes]:
    """What a command wrote, plots aside (their images embed nothing of the run)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "plots" not in p.parts
    }


def _twice(monkeypatch, capsys, tmp_path, argv):
    """Run ``argv`` (``{out}`` its output folder) without and with a terminal
    on stderr; returns ((stdout, stderr, files) without, the same with)."""
    got = []
    for name, stream in (("plain", None), ("tty", Tty())):
        out = tmp_path / name / "out"
        out.parent.mkdir(parents=True)
        if stream is not None:
            monkeypatch.setattr(sys, "stderr", stream)
        code = main([a.format(out=out) for a in argv])
        monkeypatch.undo()
        std = capsys.readouterr()
        assert code == 0, std.err
        err = std.err if stream is None else stream.getvalue()
        # the sweep's one note on where the Parquet went is not progress
        err = "".join(x for x in err.splitlines(True) if not x.startswith("twin: Parquet"))
        got.append((std.out.replace(str(out), "OUT"), err, _files(out) if out.exists() else {}))
    return got


def test_sweep_and_goodput_show_a_bar_on_a_terminal_only_and_write_the_same(
    tmp_path, monkeypatch, capsys
):
    data = copy.deepcopy(BASE)
    data["sweep"] = {"slo.ttft": ["1 s", "2 s"]}
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(data))
    plain, tty = _twice(
        monkeypatch, capsys, tmp_path, ["sweep", str(spec), "--out", "{out}", "--no-plots"]
    )
    assert plain[1] == "" and "sweep" in tty[1] and " 2/2 " in tty[1]
    assert tty[0] == plain[0] and tty[2] == plain[2] and "runs.csv" in plain[2]
    args = ["goodput", str(spec), "--seeds", "1", "--rel-tol", "0.5", "--out", "{out}"]
    plain, tty = _twice(monkeypatch, capsys, tmp_path / "g", [*args, "--no-plots"])
    assert plain[1] == "" and "goodput" in tty[1] and " 2/2 " in tty[1] and "runs]" in tty[1]
    assert tty[0] == plain[0] and tty[2] == plain[2] and "goodput.csv" in plain[2]


def test_compare_shows_a_bar_unless_quiet(tmp_path, monkeypatch, capsys):
    data = copy.deepcopy(BASE)
    data["cluster"] = {"instances": 2, "tp": 1}
    data["compare"] = {"a": {"cluster.instances": 1}, "b": {"cluster.instances": 2}}
    spec = tmp_path / "c.yaml"
    spec.write_text(yaml.safe_dump(data))
    plain, tty = _twice(monkeypatch, capsys, tmp_path, ["run", str(spec), "--json", "{out}"])
    assert plain[1] == "" and "compare" in tty[1] and " 2/2 " in tty[1]
    assert tty[0] == plain[0]
    quiet = Tty()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert main(["run", str(spec), "-q"]) == 0
    monkeypatch.undo()
    assert quiet.getvalue() == "" and capsys.readouterr().out == ""


def test_plan_counts_each_search_of_both_phases_then_the_other_samples(tiny_plan_spec, monkeypatch):
    from twin.studies.planner import plan_distserve

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    # one configuration (TP1) searched in each phase, then rescored on the second sample
    kw = dict(max_gpus_per_instance=1, max_decode_requests=50, iterations=2, sample_size=10)
    plan = plan_distserve(tiny_plan_spec, replicates=2, **kw)
    monkeypatch.undo()
    text = tty.getvalue()
    assert len(plan.candidates) == 2 and len(plan.capacity_samples) == 2
    assert "plan" in text and " 2/2 " in text
    assert "plan: the other samples" in text and " 1/1 " in text


def test_bench_counts_each_measured_run(monkeypatch, capsys):
    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    code = main(["bench", "--sizes", "20", "--config", "colocated", "--repeat", "1"])
    monkeypatch.undo()
    assert code == 0
    assert "bench" in tty.getvalue() and " 1/1 " in tty.getvalue()
    assert "bench" not in capsys.readouterr().out.split("\n", 1)[0]  # the table's head only


def test_provision_counts_each_split_on_each_sample(monkeypatch):
    from twin.studies.provision import provision

    spec = {
        "model": "llama-3.1-8b",
        "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "tp": 4, "prefill": 1,
                    "decode": 1},
        "scheduler": "splitwise",
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 5},
                     "max_requests": 60},
        "slo": {"ttft": "500 ms", "tpot": "40 ms"},
    }  # fmt: skip
    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    p = provision(spec, "p.yaml", Path.cwd(), power_w=6000, sample=20, replicates=2)
    monkeypatch.undo()
    assert len(p.candidates) == 1  # one split fits 6 kW: two samples searched
    assert "provision" in tty.getvalue() and " 2/2 " in tty.getvalue()


def test_the_fits_of_calibrate_and_the_held_out_table_are_counted():
    from test_validate import _bumped_unless, _synthetic

    from twin.perf.calibrate import fit_sources, held_out_table

    done: list[int] = []
    fit, _ = _bumped_unless("b", 0.002)
    held_out_table(_synthetic(), fit, on_source=lambda: done.append(1))
    assert len(done) == 3  # a source held out at a time
    done.clear()
    fit_sources(_synthetic(), starts=0, rounds=0, on_fit=lambda: done.append(1))
    assert len(done) == 1  # the defaults' refinement, the only fit
