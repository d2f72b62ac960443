"""A leading byte-order mark (which Excel and Windows editors write) is
accepted by every reader of the project, because every reader reads through
twin/_io.py: each reader below gives the same result on a file with a BOM as
on the same file without one."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from twin._io import decode_text, open_text, read_csv, read_text
from twin.cli import main

REPO = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures"
BOM = b"\xef\xbb\xbf"

MODEL = {"name": "tiny", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16,
         "intermediate": 128, "vocab": 100, "params": 123456}  # fmt: skip
TOPOLOGY = {
    "name": "two",
    "templates": {"n": {"gpu": "h100-sxm", "gpus": 8,
                        "nics": {"count": 8, "kind": "infiniband", "bandwidth": "400 Gbps"}}},
    "nodes": [{"template": "n", "count": 2}],
}  # fmt: skip
SPEC = {"name": "s", "model": "llama-3.1-8b", "gpu": "h100-sxm", "cluster": {"instances": 1},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 2},
                     "max_requests": 10}}  # fmt: skip
NATIVE = (
    "phase,batch_size,tokens,context,time_s\n"
    "prefill,1,512,0,0.050\nprefill,1,1024,0,0.090\nprefill,4,512,0,0.160\n"
    "decode,1,1,512,0.020\ndecode,1,1,2048,0.024\ndecode,8,1,512,0.022\ndecode,8,1,2048,0.030\n"
)
AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
)
MOONCAKE = (
    '{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n'
    '{"timestamp": 500, "input_length": 120, "output_length": 12, "hash_ids": [1, 2]}\n'
)


def _spec(p: Path) -> Any:
    from twin.sim.spec import parse_yaml, read_spec_text, resolve_spec

    text, where, base = read_spec_text(str(p))
    return resolve_spec(parse_yaml(text, where), where, base).sha256


def _topology(p: Path) -> Any:
    from twin.net.report import summary
    from twin.net.topology import load_topology

    return summary(load_topology(str(p)))


def _model(p: Path) -> Any:
    from twin.perf.llm import model_from_arg

    return model_from_arg(str(p), "MODEL")


def _workload(p: Path) -> Any:
    from twin.workload.stream import WorkloadSpec

    return WorkloadSpec.from_yaml(p)


def _lengths(p: Path) -> Any:
    from twin.workload.lengths import LengthTable

    t = LengthTable.read_csv(p)
    return t.q.tolist(), t.prompt.tolist(), t.output.tolist(), t.rho, t.meta


def _trace(p: Path) -> Any:
    from twin.workload.traces import detect_format, read_trace

    return detect_format(p), read_trace(p)


def _measured(p: Path) -> Any:
    from twin.workload.measured import detect, read_measured

    return detect(p), read_measured(p).requests


def _native(p: Path) -> Any:
    from twin.perf.tables import ProfileTable, read_native

    t = ProfileTable.from_native(p)
    return read_native(p)[:2], t.prefill_time(2, 800), t.decode_time(4, 4000)


def _sidecar(p: Path) -> Any:
    from twin.perf.profile import read_sidecar

    return read_sidecar(p.with_name("t.csv"))


def _runs(p: Path) -> Any:
    from twin.studies.sweepdata import runs_columns

    return runs_columns(p.parent)


def _plot_csv(p: Path) -> Any:
    from twin.viz.canvas import _read_csv

    return _read_csv(p)


# (file name, its text, the reader: path -> what it read)
READERS: dict[str, tuple[str, str, Callable[[Path], Any]]] = {
    "experiment spec": ("s.yaml", yaml.safe_dump(SPEC), _spec),
    "topology": ("two.yaml", yaml.safe_dump(TOPOLOGY), _topology),
    "model file": ("m.yaml", yaml.safe_dump(MODEL), _model),
    "workload file": ("w.yaml", yaml.safe_dump({"workload": SPEC["workload"]}), _workload),
    "length table": ("l.csv", (REPO / "twin/data/lengths_azure_conv.csv").read_text(), _lengths),
    "azure trace": ("a.csv", AZURE, _trace),
    "mooncake trace": ("m.jsonl", MOONCAKE, _trace),
    "vllm result": ("v.json", (FIX / "vllm-bench-serve.synthetic.json").read_text(), _measured),
    "aiperf export": ("p.jsonl", (FIX / "aiperf-profile_export.synthetic.jsonl").read_text(),
                      _measured),
    "native profile": ("t.csv", NATIVE, _native),
    "profile sidecar": ("t.json", json.dumps({"model": "tiny", "gpu": "h100-sxm"}), _sidecar),
    "runs.csv": ("runs.csv", "run_id,label,requests\na1,x,10\nb2,y,20\n", _runs),
    "plot CSV": ("r.csv", "ttft_s,tpot_s,status\n0.1,0.01,completed\n", _plot_csv),
}  # fmt: skip


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_accepts_a_byte_order_mark(tmp_path, reader):
    name, text, read = READERS[reader]
    plain, marked = tmp_path / "plain", tmp_path / "bom"
    for d in (plain, marked):
        d.mkdir()
    (plain / name).write_text(text, encoding="utf-8")
    (marked / name).write_bytes(BOM + text.encode())
    if reader == "profile sidecar":  # it sits beside its table
        for d in (plain, marked):
            (d / "t.csv").write_text(NATIVE)
    a, b = read(plain / name), read(marked / name)
    assert repr(b).replace(str(marked), str(plain)) == repr(a)


def test_the_io_readers_drop_one_byte_order_mark(tmp_path):
    p = tmp_path / "x.csv"
    p.write_bytes(BOM + b"a,b\n1,2\n")
    assert read_text(p) == "a,b\n1,2\n"
    assert decode_text(p.read_bytes(), str(p)) == "a,b\n1,2\n"
    with open_text(p) as f:
        assert f.read() == "a,b\n1,2\n"
    assert read_csv(p) == (["a", "b"], [["1", "2"]])
    p.write_bytes(BOM + BOM + b"a\n")  # only the leading one is a mark
    assert read_text(p) == "\ufeffa\n"


@pytest.mark.parametrize("results", ["vllm-bench-serve.synthetic.json",
                                     "aiperf-profile_export.synthetic.jsonl"])  # fmt: skip
def test_validate_run_against_a_file_with_a_byte_order_mark(tmp_path, capsys, results):
    marked = tmp_path / results
    marked.write_bytes(BOM + (FIX / results).read_bytes())
    spec = str(FIX / "validate-run.yaml")
    assert main(["validate", "run", spec, "--against", str(FIX / results), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["validate", "run", spec, "--against", str(marked), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["metrics"] == plain["metrics"] and got["replayed"] == plain["replayed"] == 24


# Reading text from a file anywhere else would decode it its own way. The
# package's bundled files (twin/bundled.py, a layer below twin/_io.py) are
# read as the package ships them.
_OWN_WAY = {"twin/_io.py", "twin/bundled.py"}


def _text_reads(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        if isinstance(fn, ast.Attribute) and fn.attr == "read_text":
            found.append(ast.unparse(node))  # Path.read_text: _io.read_text is a name
        elif (isinstance(fn, ast.Name) and fn.id == "open") or (
            isinstance(fn, ast.Attribute) and fn.attr == "open"
        ):
            args = node.args[1:] if isinstance(fn, ast.Name) else node.args
            modes = [a.value for a in args if isinstance(a, ast.Constant)]
            modes += [k.value.value for k in node.keywords
                      if k.arg == "mode" and isinstance(k.value, ast.Constant)]  # fmt: skip
            if not any(set(str(m)) & set("wabx") for m in modes):
                found.append(ast.unparse(node))
        elif isinstance(fn, ast.Attribute) and fn.attr == "load" and ast.unparse(fn) == "json.load":
            found.append(ast.unparse(node))  # json.load(file): its own decoding
    return found


def test_no_module_reads_text_but_through_twin_io():
    offenders = {}
    for path in sorted([*(REPO / "twin").rglob("*.py"), *(REPO / "schedulers").rglob("*.py")]):
        rel = path.relative_to(REPO).as_posix()
        if rel not in _OWN_WAY and (found := _text_reads(path.read_text())):
            offenders[rel] = found
    assert offenders == {}
    assert _text_reads("open(p)\nPath(p).read_text()\nopen(p, 'rb')\njson.load(f)\n") == [
        "open(p)", "Path(p).read_text()", "json.load(f)"
    ]  # fmt: skip
