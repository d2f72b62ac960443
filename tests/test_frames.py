"""Results as data: typed DataFrames, the flat summary, Parquet, load_sweep."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from doc_pages import find_page

import twin
from twin.cli import main
from twin.errors import TwinError
from twin.sim.frames import (
    REQUEST_KINDS,
    coerce,
    flatten,
    parse_csv_columns,
    read_parquet_columns,
)
from twin.sim.metrics import REQUEST_COLUMNS

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")
ROOT = Path(__file__).resolve().parents[1]

# One Llama-3.1-8B instance; prompt + output beyond 1,200 tokens is rejected
# (context_length), so the table holds completed and rejected requests.
SPEC = {
    "name": "frames",
    "model": "llama-3.1-8b",
    "cluster": {"instances": 1, "tp": 1},
    "engine": {"max_model_len": 1200, "oversized": "reject"},
    "workload": {
        "lengths": "azure-conv",
        "arrival": {"process": "poisson", "rate": 4.0},
        "max_requests": 40,
    },
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}
SPLIT = {
    "name": "frames-split",
    "model": "llama-3.1-8b",
    "cluster": {
        "topology": "dgx-h100-ib400",
        "nodes": 2,
        "prefill": {"instances": 1, "tp": 8},
        "decode": {"instances": 1, "tp": 8},
    },
    "scheduler": "disagg",
    "workload": {
        "lengths": "azure-conv",
        "arrival": {"process": "poisson", "rate": 4.0},
        "max_requests": 20,
    },
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}
DTYPES = {
    "int": "int64",
    "int?": "Int64",
    "float": "float64",
    "bool": "bool",
    "str": "string",
    "str?": "string",
}


@pytest.fixture(scope="module")
def result():
    return twin.run(SPEC)


def _write_spec(tmp_path: Path, data: dict, name: str = "spec.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_requests_frame_is_typed_one_row_per_request_in_id_order(result):
    df = result.requests
    assert list(df.columns) == list(REQUEST_COLUMNS)
    assert {c: str(t) for c, t in df.dtypes.items()} == {
        c: DTYPES[k] for c, k in REQUEST_KINDS.items()
    }
    assert list(df["id"]) == list(range(40))
    assert len(df) == result.summary["requests"]
    done = df[df["status"] == "completed"]
    rejected = df[df["status"] == "rejected"]
    assert len(done) == result.summary["completed"] and len(rejected) == result.summary["rejected"]
    assert len(rejected) > 0 and len(done) > 0
    # the reason of a rejected request; missing values are NA/NaN, never ""
    assert set(rejected["reason"]) == {"context_length"}
    assert done["reason"].isna().all() and rejected["instance"].isna().all()
    assert rejected["ttft_s"].isna().all() and not rejected["slo_met"].any()
    for col in ("status", "reason"):
        assert not (df[col] == "").any()
    assert (rejected["prompt_tokens"] + rejected["output_tokens"] > 1200).all()
    assert (done["prompt_tokens"] + done["output_tokens"] <= 1200).all()
    assert done["slo_met"].sum() / len(df) == pytest.approx(result.summary["slo_attainment"])
    assert done["ttft_s"].quantile(0.5) == pytest.approx(result.summary["ttft_s.p50"])


def test_requests_frame_holds_the_values_of_the_requests_csv(result, tmp_path):
    spec = _write_spec(tmp_path, SPEC)
    path = tmp_path / "r.csv"
    assert main(["run", spec, "--requests-csv", str(path), "-q"]) == 0
    with open(path, newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: int(r["id"]))
    df = result.requests
    for row, (_, rec) in zip(rows, df.iterrows(), strict=True):
        for c, kind in REQUEST_KINDS.items():
            want, got = coerce(kind, row[c]), rec[c]
            if want is None:
                assert got is pd.NA or (isinstance(got, float) and math.isnan(got)), (c, got)
            else:
                assert got == want, (c, got, want)


def test_summary_is_flat_with_dotted_keys_and_json_stays_nested(result):
    s = result.summary
    nested = result.to_dict()["summary"]
    assert dict(s) == flatten(nested)
    assert "ttft_s.p99" in s and "ttft_s" not in list(s)
    assert s["ttft_s.p99"] == s["ttft_s"]["p99"] == nested["ttft_s"]["p99"]
    assert isinstance(nested["ttft_s"], dict)
    assert pd.Series(dict(s))["slo_attainment"] == s["slo_attainment"]


def test_instance_link_and_timeline_frames():
    r = twin.run(SPLIT, overrides=["output.window=2 s"])
    rows = r.to_dict()
    inst = r.instances
    assert list(inst["id"]) == [0, 1] and list(inst["role"]) == ["prefill", "decode"]
    assert str(inst["iterations"].dtype) == "int64" and str(inst["busy_s"].dtype) == "float64"
    assert list(inst["gpus"][0]) == rows["instances"][0]["gpus"]
    links = r.links
    assert len(links) == len(rows["links"]) > 0
    assert links["bytes"].sum() == pytest.approx(sum(x["bytes"] for x in rows["links"]))
    tl = r.timeline
    assert len(tl) == len(rows["timeline"]) > 1
    assert list(tl["start_s"]) == [w["start_s"] for w in rows["timeline"]]
    assert tl["arrived"].sum() == r.summary["requests"]
    # no topology, no links: an empty frame that still has the columns
    empty = twin.run(SPEC).links
    assert len(empty) == 0 and "utilization" in empty.columns


def test_repr_html_is_a_compact_summary_table(result):
    text = result._repr_html_()
    assert text.startswith("<table>") and "frames" in text and "SLO attainment" in text
    assert f"<td style='text-align:right'>{result.summary['requests']}</td>" in text


def test_requests_need_kept_rows():
    r = twin.run(SPEC, keep_requests=False)
    with pytest.raises(TwinError, match="kept no per-request rows"):
        _ = r.requests


def _python(code: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT
    )


def test_a_run_without_frames_never_imports_pandas_or_pyarrow():
    code = (
        "import sys, twin\n"
        "r = twin.run({'model': 'llama-3.1-8b', 'workload': {'lengths': 'azure-conv', "
        "'arrival': {'process': 'poisson', 'rate': 2}, 'max_requests': 5}})\n"
        "r.summary['ttft_s.p50']; r.to_dict(); r._repr_html_()\n"
        "assert 'pandas' not in sys.modules and 'pyarrow' not in sys.modules, 'loaded'\n"
        "r.requests\n"
        "assert 'pandas' in sys.modules\n"
    )
    p = _python(code)
    assert p.returncode == 0, p.stderr


def test_without_pandas_a_frame_says_how_to_install_it():
    code = (
        "import sys\n"
        "sys.modules['pandas'] = None\n"
        "import twin\n"
        "r = twin.run({'model': 'llama-3.1-8b', 'workload': {'lengths': 'azure-conv', "
        "'arrival': {'process': 'poisson', 'rate': 2}, 'max_requests': 5}})\n"
        "try:\n"
        "    r.instances\n"
        "except twin.TwinError as e:\n"
        "    print(e)\n"
    )
    p = _python(code)
    assert p.returncode == 0, p.stderr
    assert "pip install 'pd-twin[data]'" in p.stdout


def test_requests_parquet_is_typed_and_byte_identical_across_runs(tmp_path):
    spec = _write_spec(tmp_path, SPEC)
    a, b, c = (tmp_path / n for n in ("a.parquet", "b.parquet", "a.csv"))
    assert main(["run", spec, "--requests-parquet", str(a), "--requests-csv", str(c), "-q"]) == 0
    assert main(["run", spec, "--requests-parquet", str(b), "-q"]) == 0
    assert a.read_bytes() == b.read_bytes()
    import pyarrow.parquet as pq

    meta = pq.read_metadata(a)
    # arrow's own schema, ours, no pandas metadata and nothing of the clock
    assert set(meta.metadata) == {b"ARROW:schema", b"pd-twin.kinds", b"pd-twin.spec_sha256"}
    assert meta.created_by.startswith("parquet-cpp-arrow version ")
    cols, kinds = read_parquet_columns(a)
    assert kinds == REQUEST_KINDS and list(cols) == list(REQUEST_COLUMNS)
    with open(c, newline="") as f:
        rows = list(csv.DictReader(f))  # the same order: as requests ended
    assert cols["id"] == [int(r["id"]) for r in rows]
    assert cols["reason"] == [r["reason"] or None for r in rows]
    assert cols["tpot_s"] == [float(r["tpot_s"]) if r["tpot_s"] else None for r in rows]
    table = pq.read_table(a)
    assert str(table.schema.field("instance").type) == "int64"
    assert str(table.schema.field("slo_met").type) == "bool"


def test_requests_parquet_errors_are_one_line(tmp_path, capsys):
    spec = _write_spec(tmp_path, SPEC)
    assert main(["run", spec, "--requests-parquet", str(tmp_path / "no" / "x.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and err.count("\n") == 1 and "x.parquet" in err
    # a run that fails leaves no Parquet file behind
    good = tmp_path / "r.parquet"
    bad_csv = str(tmp_path / "no" / "r.csv")
    assert main(["run", spec, "--requests-parquet", str(good), "--requests-csv", bad_csv]) == 2
    assert "r.csv': no folder" in capsys.readouterr().err and not good.exists()


SWEEP = {
    **{k: v for k, v in SPEC.items() if k != "engine"},
    "name": "frames-sweep",
    "sweep": {"workload.arrival.rate": [2.0, 8.0], "cluster.instances": [1, 2]},
}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    spec = _write_spec(d, SWEEP)
    assert main(["sweep", spec, "-j", "1", "--out", str(d / "o"), "--requests", "--no-plots"]) == 0
    return d, spec


def test_load_sweep_runs_frame(swept):
    d, _ = swept
    df = twin.load_sweep(d / "o")
    with open(d / "o" / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(df.columns) == list(rows[0])
    assert list(df["run_id"]) == [r["run_id"] for r in rows]
    assert str(df["run_id"].dtype) == "string" and str(df["cluster.instances"].dtype) == "int64"
    assert list(df["workload.arrival.rate"]) == [2.0, 2.0, 8.0, 8.0]
    assert list(df["cluster.instances"]) == [1, 2, 1, 2]
    assert str(df["requests"].dtype) == "int64" and list(df["requests"]) == [40] * 4
    assert [float(r["ttft_s.p99"]) for r in rows] == list(df["ttft_s.p99"])
    # the metric columns are the flat summary's keys
    one = twin.run({k: v for k, v in SWEEP.items() if k != "sweep"})
    assert [c for c in df.columns if c in one.summary] == list(one.summary)


def test_runs_parquet_holds_the_same_frame_and_is_deterministic(swept, tmp_path):
    d, spec = swept
    cols, kinds = read_parquet_columns(d / "o" / "runs.parquet")
    from twin.sim.frames import frame

    pd.testing.assert_frame_equal(frame(cols, kinds), twin.load_sweep(d / "o"))
    again = tmp_path / "again"
    assert main(["sweep", spec, "-j", "1", "--out", str(again), "--requests", "--no-plots"]) == 0
    assert (again / "runs.parquet").read_bytes() == (d / "o" / "runs.parquet").read_bytes()
    for p in (d / "o" / "requests").glob("*.parquet"):
        assert (again / "requests" / p.name).read_bytes() == p.read_bytes()


def test_load_sweep_requests_concatenates_runs_with_their_keys(swept):
    d, _ = swept
    runs = twin.load_sweep(d / "o")
    reqs = twin.load_sweep(d / "o", requests=True)
    lead = ["run_id", "workload.arrival.rate", "cluster.instances", "label"]
    assert list(reqs.columns) == lead + list(REQUEST_COLUMNS)
    assert len(reqs) == runs["requests"].sum()
    assert list(reqs["run_id"].unique()) == list(runs["run_id"])
    for run_id, part in reqs.groupby("run_id", sort=False):
        assert list(part["id"]) == list(range(40))
        assert (part["label"] == runs.set_index("run_id").loc[run_id, "label"]).all()
        assert part["slo_met"].mean() == pytest.approx(
            runs.set_index("run_id").loc[run_id, "slo_attainment"]
        )
    assert str(reqs["slo_met"].dtype) == "bool" and str(reqs["instance"].dtype) == "Int64"
    # the CSVs read as the Parquet files do
    for p in (d / "o" / "requests").glob("*.parquet"):
        p.rename(p.with_suffix(".hidden"))
    try:
        pd.testing.assert_frame_equal(twin.load_sweep(d / "o", requests=True), reqs)
    finally:
        for p in (d / "o" / "requests").glob("*.hidden"):
            p.rename(p.with_suffix(".parquet"))


def test_load_sweep_errors(tmp_path):
    with pytest.raises(TwinError, match="no runs.csv; not a sweep folder"):
        twin.load_sweep(tmp_path)
    with pytest.raises(TwinError, match="not a folder"):
        twin.load_sweep(tmp_path / "nope")


def test_load_sweep_without_per_request_files_names_the_run(tmp_path):
    spec = _write_spec(tmp_path, SWEEP)
    assert main(["sweep", spec, "-j", "1", "--out", str(tmp_path / "o"), "--no-plots"]) == 0
    with pytest.raises(TwinError, match=r"run [0-9a-f]{12} has no requests/.*--requests"):
        twin.load_sweep(tmp_path / "o", requests=True)


def test_without_pyarrow_a_sweep_says_so_and_writes_csv_only(tmp_path):
    spec = _write_spec(tmp_path, SWEEP)
    out = tmp_path / "o"
    code = (
        "import sys\n"
        "sys.modules['pyarrow'] = None\n"
        "from twin.cli import main\n"
        f"sys.exit(main(['sweep', {spec!r}, '-j', '1', '--out', {str(out)!r}, '--requests', "
        "'--no-plots']))\n"
    )
    p = _python(code)
    assert p.returncode == 0, p.stderr
    note = "no Parquet: pyarrow is not installed (pip install 'pd-twin[data]'); CSV only"
    assert note in p.stderr
    assert (out / "runs.csv").is_file() and not (out / "runs.parquet").exists()
    assert len(list((out / "requests").glob("*.csv"))) == 4
    assert not list((out / "requests").glob("*.parquet"))


def test_csv_columns_are_typed_from_all_their_cells():
    header = ["run_id", "n", "x", "flag", "key", "note"]
    rows = [["123456789012", "1", "1", "True", "1 s", ""], ["0a", "", "2.5", "False", "2", ""]]
    cols, kinds = parse_csv_columns(header, rows, text=("run_id",))
    assert kinds == {
        "run_id": "str", "n": "int?", "x": "float", "flag": "bool", "key": "str", "note": "float",
    }  # fmt: skip
    assert cols["run_id"] == ["123456789012", "0a"] and cols["n"] == [1, None]
    assert cols["x"] == [1.0, 2.5] and cols["key"] == ["1 s", "2"] and cols["note"] == [None, None]


def test_the_readme_example_runs(swept):
    """Results as data (docs/guides/results.md, moved from README.md): its run
    example (test_public runs it too) and its sweep example, on a sweep folder
    of ours."""
    d, _ = swept
    text = find_page("### Results as data").read_text(encoding="utf-8")
    section = text[text.index("### Results as data") :]
    blocks = []
    for fence in ("```python\n", "```py\n"):
        start = section.index(fence) + len(fence)
        blocks.append(section[start : section.index("```", start)])
    assert "r.requests" in blocks[0] and "twin.load_sweep(" in blocks[1]
    env: dict = {}
    code = "\n".join(blocks).replace("out/pool-ratio", str(d / "o"))
    exec(compile(code, "results.md", "exec"), env)
    assert len(env["per_request"]) == 160 and len(env["runs"]) == 4
    assert env["reqs"]["id"].is_monotonic_increasing
