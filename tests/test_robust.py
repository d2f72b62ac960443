"""Bad input, interruptions and partial outputs (see also tests/test_fuzz.py)."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import child_pids

from twin import yamlio
from twin._io import AtomicFile, atomic_write, not_utf8, read_text
from twin.cli import main
from twin.errors import SpecError, TraceError, TwinError
from twin.workload.traces import read_mooncake

REPO = Path(__file__).resolve().parent.parent

TINY = {
    "name": "tiny",
    "model": "llama-3.1-8b",
    "gpu": "h100-sxm",
    "cluster": {"instances": 1, "tp": 1},
    "workload": {
        "lengths": "azure-conv",
        "arrival": {"process": "poisson", "rate": 4.0},
        "max_requests": 40,
    },
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}


# -- reading -------------------------------------------------------------------------------
def test_not_utf8_names_the_line_and_byte_across_chunks(tmp_path):
    p = tmp_path / "t.csv"
    # a valid 2-byte character straddling the 1 MiB read boundary, then a bad byte on line 3
    head = b"a" * ((1 << 20) - 1) + "\u00e9".encode() + b"\nok\nbad \xff here\n"
    p.write_bytes(head)
    assert not_utf8(p) == f"{p}: line 3: byte 0xff is not UTF-8; expected UTF-8 text"
    p.write_bytes(b"x\n\xc3")
    assert "line 2: the file ends inside a UTF-8 character" in not_utf8(p)
    with pytest.raises(TwinError, match="line 2: the file ends inside"):
        read_text(p)


def test_read_text_drops_a_byte_order_mark(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_bytes(b"\xef\xbb\xbfname: x\n")
    assert read_text(p) == "name: x\n"


def test_mooncake_with_a_byte_order_mark_reads_as_without(tmp_path):
    text = (
        '{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n'
        '{"timestamp": 500, "input_length": 120, "output_length": 12, "hash_ids": [1, 2]}\n'
    )
    plain, bom = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    plain.write_text(text)
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert read_mooncake(bom) == read_mooncake(plain)
    assert len(read_mooncake(bom)) == 2


def test_a_trace_cell_over_the_csv_field_limit_is_one_error(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("num_prefill_tokens,num_decode_tokens\n" + "1" * 200_000 + ",3\n")
    from twin.workload.traces import read_lengths

    with pytest.raises(TraceError, match=r"t.csv: line 2: .*field limit"):
        read_lengths(p)


def test_duplicate_yaml_keys_are_refused_merge_keys_may_override():
    with pytest.raises(SpecError, match=r"line 3.*duplicate key 'tp' \(first at line 2\)"):
        yamlio.load_text("cluster:\n  tp: 1\n  tp: 2\n", "s.yaml")
    doc = yamlio.load_text("base: &b {tp: 1, pp: 1}\ncluster:\n  <<: *b\n  tp: 2\n", "s.yaml")
    assert doc["cluster"] == {"tp": 2, "pp": 1}


def test_sizes_are_bounded_before_anything_is_built():
    from twin._check import MAX_GPUS
    from twin.sim.spec import resolve_spec

    d = copy.deepcopy(TINY)
    d["cluster"]["instances"] = MAX_GPUS  # at the bound: accepted
    assert resolve_spec(d, "s.yaml", Path.cwd()).resolved["cluster"]["instances"] == MAX_GPUS
    d["cluster"]["instances"] = MAX_GPUS + 1
    with pytest.raises(SpecError, match="over the limit of 200,000"):
        resolve_spec(d, "s.yaml", Path.cwd())


def test_a_thousand_node_topology_solves_one_max_flow_per_gpu_position():
    from twin.net.topology import load_topology

    small = load_topology("dgx-h100-ib400", nodes=2)
    big = load_topology("dgx-h100-ib400", nodes=1000)
    assert len(big.gpus) == 8000
    got = [big.injection_bytes_s(i) for i in range(len(big.gpus))]
    assert big.max_flows == 8  # one per GPU of a node, not 8,000
    assert got == [small.injection_bytes_s(i % 8) for i in range(8000)]


def test_plan_without_an_slo_is_refused_up_front(tmp_path, capsys):
    import yaml

    d = {k: v for k, v in TINY.items() if k != "slo"}
    d["cluster"] = {"topology": "dgx-h100-ib400", "nodes": 1, "prefill": 1, "decode": 1}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    assert main(["plan", str(tmp_path / "s.yaml")]) == 2
    assert "slo: no ttft or tpot given" in capsys.readouterr().err


# -- interruptions -------------------------------------------------------------------------
def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys, tmp_path):
    import twin.sim.simulation as simulation

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(simulation.Simulation, "run", interrupted)
    csv_path = tmp_path / "r.csv"
    assert main(["run", "quickstart", "-q", "--requests-csv", str(csv_path)]) == 130
    assert capsys.readouterr().err == "twin: interrupted\n"
    assert list(tmp_path.iterdir()) == []  # no partial CSV, no temporary file


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_sigint_stops_a_parallel_sweep_and_its_workers(tmp_path):
    import yaml

    d = copy.deepcopy(TINY)
    d["workload"]["max_requests"] = 1500
    d["workload"]["arrival"]["rate"] = 20.0
    d["sweep"] = {"seed": list(range(8))}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen(
        [sys.executable, "-m", "twin.cli", "sweep", "s.yaml", "-j", "2", "--out", "o",
         "--no-plots"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    runs = tmp_path / "o" / "runs"
    workers: list[int] = []
    while p.poll() is None and not (runs.is_dir() and any(runs.glob("*.json"))):
        workers = child_pids(p.pid) or workers
        time.sleep(0.02)
    assert p.poll() is None, "the sweep ended before it could be interrupted"
    workers = child_pids(p.pid) or workers
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err == "twin: interrupted\n"
    assert len(workers) == 2
    assert not [w for w in workers if Path(f"/proc/{w}").exists()]  # none orphaned
    assert not (tmp_path / "o" / "runs.csv").exists()  # the sweep did not finish
    assert [q.name for q in (tmp_path / "o").iterdir() if q.name.startswith(".")] == []


def test_goodput_resumes_from_the_probes_it_wrote(tmp_path):
    from twin.studies.goodput import goodput, probe_attainment

    d = copy.deepcopy(TINY)
    calls = []

    def counting(data, where, base_dir):
        calls.append(1)
        return probe_attainment(data, where, base_dir)

    fresh = goodput(d, "g.yaml", Path.cwd(), seeds=2, runner=counting)
    n = len(calls)
    out = tmp_path / "o"
    first = goodput(d, "g.yaml", Path.cwd(), seeds=2, runner=counting, out=out)
    probes = sorted((out / "probes").iterdir())
    assert len(calls) == 2 * n and len(probes) == n  # each probe written
    for p in probes[: n // 2]:  # as if interrupted before these finished
        p.unlink()
    probes[-1].write_text('{"attain')  # and one cut short: it runs again
    again = goodput(d, "g.yaml", Path.cwd(), seeds=2, runner=counting, out=out)
    assert len(calls) == 2 * n + n // 2 + 1
    assert again.reused == n - n // 2 - 1
    assert again.csv_rows() == first.csv_rows() == fresh.csv_rows()
    assert again.probes == first.probes == fresh.probes


def test_sweep_requests_fills_in_a_folder_swept_without(tmp_path):
    from twin.studies.sweep import run_sweep

    d = copy.deepcopy(TINY)
    d["sweep"] = {"engine.max_num_seqs": [4, 16]}
    out = tmp_path / "o"
    assert run_sweep(d, "s.yaml", Path.cwd(), out).ran == 2
    assert not (out / "requests").exists()
    done = run_sweep(d, "s.yaml", Path.cwd(), out, requests=True)
    assert done.ran == 2
    assert sorted(p.name for p in (out / "requests").glob("*.csv")) == sorted(
        f"{r.run_id}.csv" for r in done.runs
    )
    assert run_sweep(d, "s.yaml", Path.cwd(), out, requests=True).ran == 0


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    p = tmp_path / "out.csv"
    p.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_write(p) as f:
        f.write("half")
        raise RuntimeError
    assert p.read_text() == "old\n" and list(tmp_path.iterdir()) == [p]
    with atomic_write(p) as f:
        f.write("new\n")
    assert p.read_text() == "new\n" and list(tmp_path.iterdir()) == [p]
    a = AtomicFile(tmp_path / "x.json")
    a.write("{}")
    assert not (tmp_path / "x.json").exists()  # not under its name until closed
    a.close()
    assert (tmp_path / "x.json").read_text() == "{}"
    with pytest.raises(TwinError, match="cannot write"):
        AtomicFile(tmp_path / "no" / "such.csv")
