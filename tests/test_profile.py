"""`twin profile` on a CPU with a tiny model (needs the `profile` extra, PyTorch), and
`twin calibrate --profile` on tables generated from the Roofline with known terms."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from twin.cli import main
from twin.perf.build import build_perf_model
from twin.perf.fit_profile import DEFAULT_FIT, fit_tables, load_table
from twin.perf.gpus import get_gpu
from twin.perf.iteration import Batch
from twin.perf.llm import get_model
from twin.perf.profile import GRIDS, TINY, table_text
from twin.perf.roofline import Roofline
from twin.perf.tables import ProfileTable

TINY_INLINE = (
    "{name: tiny3, layers: 3, hidden: 64, heads: 4, kv_heads: 2, head_dim: 16, "
    "intermediate: 128, vocab: 256, params: 200000}"
)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def _profile(tmp_path: Path, capsys, *extra: str) -> tuple[Path, str]:
    out = tmp_path / "tiny.csv"
    rc = main(["profile", *extra, "--device", "cpu", "--grid", "tiny", "--out", str(out),
               "--warmup", "1", "--repeats", "2", "-q"])  # fmt: skip
    assert rc == 0
    return out, capsys.readouterr().out


def test_cpu_profile_end_to_end(torch, tmp_path, capsys):
    out, printed = _profile(tmp_path, capsys, "tiny")
    data = out.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    assert f"sha256 {sha}" in printed
    grid = GRIDS["tiny"]
    lines = data.decode().splitlines()
    assert lines[0] == "phase,batch_size,tokens,context,time_s"
    keys = [tuple(line.split(",")[:4]) for line in lines[1:]]
    assert keys == [("prefill", str(b), str(p), "0") for b, p in grid.prefill_points()] + [
        ("decode", str(b), "1", str(c)) for b, c in grid.decode_points()
    ]
    # read back by perf: {kind: profile}; the sha256 is the same on every read
    model = build_perf_model({"kind": "profile", "path": str(out)}, TINY, get_gpu("h100"), 1)
    again = ProfileTable.from_native(out)
    assert model.sha256 == again.sha256 == sha
    times = {tuple(line.split(",")[:4]): float(line.split(",")[4]) for line in lines[1:]}
    b, c = grid.decode_points()[-1]
    assert (
        model.iteration_time(Batch(decode_count=b, decode_context_sum=b * c))
        == times[("decode", str(b), "1", str(c))]
    )
    b, p = grid.prefill_points()[0]
    assert (
        model.iteration_time(Batch(prefill=((p, 0),) * b))
        == times[("prefill", str(b), str(p), "0")]
    )
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["table_sha256"] == sha
    assert side["torch"] == torch.__version__ and side["device"] == "cpu"
    assert side["cuda"] is None and side["gpu"] == "cpu"
    assert side["layers_timed"] == side["layers_total"] == 2
    assert "scaled_dot_product_attention" in side["attention"]
    assert side["grid"]["prompts"] == list(grid.prompts)
    (mixed,) = side["mixed"]
    assert (mixed["chunk_tokens"], mixed["decode_batch"], mixed["context"]) == grid.mixed[0]
    assert mixed["measured_s"] > 0 and mixed["table_s"] > 0
    assert all(float(t) > 0 for t in times.values())


def test_cpu_profile_inline_model_layers_scaled(torch, tmp_path, capsys):
    out, _ = _profile(tmp_path, capsys, TINY_INLINE, "--layers", "1", "--gpu", "h200")
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["model"]["name"] == "tiny3" and side["model"]["layers"] == 3
    assert side["layers_timed"] == 1 and "x 3/1" in side["layer_scaling"]
    assert side["gpu"] == "h200"
    # the sidecar names model, GPU and TP: calibrate needs no flags
    t = load_table(out)
    assert t.model.name == "tiny3" and t.gpu.name == "h200" and t.source.tp == 1


@pytest.mark.parametrize(
    "args, msg",
    [
        (["tiny", "--tp", "3"], "--tp 3"),
        (["tiny", "--layers", "5"], "--layers 5"),
        (["tiny", "--dtype", "int4"], "--dtype 'int4'"),
        (["no-such-model-x"], "no-such-model-x"),
    ],
)
def test_profile_bad_input_one_line(torch, tmp_path, capsys, args, msg):
    rc = main(["profile", *args, "--device", "cpu", "--out", str(tmp_path / "t.csv")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("twin: error: ") and msg in err and err.count("\n") == 1
    assert not (tmp_path / "t.csv").exists()


def test_profile_checks_the_output_folder_first(tmp_path, capsys):
    rc = main(["profile", "tiny", "--device", "cpu", "--out", str(tmp_path / "no" / "t.csv")])
    assert rc == 2 and "no folder" in capsys.readouterr().err


def test_profile_cuda_needs_a_gpu_name(tmp_path, capsys):
    rc = main(["profile", "tiny", "--out", str(tmp_path / "t.csv")])
    assert rc == 2 and "--gpu: missing" in capsys.readouterr().err


def test_simulation_core_never_imports_torch():
    code = (
        "import sys, twin, twin.sim.simulation, twin.perf.build, twin.perf.fit_profile, "
        "twin.perf.profile, twin.studies.validate_run; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ fitting a profile

TRUE = {"mfu": 0.61, "mbu": 0.74, "attn_mfu": 0.33, "overhead_s": 3.1e-3, "seq_overhead_s": 4.2e-5}


def _synthetic(path: Path, model: str, gpu: str = "h200", **terms: float) -> Path:
    """A native table of the Roofline with ``terms`` over the small grid, the other terms
    those of the distserve preset that ``twin calibrate --profile`` holds by default."""
    r = Roofline(get_model(model), get_gpu(gpu), 1, engine="distserve", **(terms or TRUE))
    grid = GRIDS["small"]
    rows = [("prefill", b, p, 0, r.iteration_time(Batch(prefill=((p, 0),) * b)))
            for b, p in grid.prefill_points()]  # fmt: skip
    rows += [("decode", b, 1, c, r.iteration_time(Batch(decode_count=b, decode_context_sum=b * c)))
             for b, c in grid.decode_points()]  # fmt: skip
    path.write_text(table_text(rows))
    return path


def test_calibrate_recovers_known_terms_within_2_percent(tmp_path, capsys):
    table = _synthetic(tmp_path / "syn.csv", "llama-3.1-8b")
    rc = main(["calibrate", "--profile", str(table), "--model", "llama-3.1-8b", "--gpu", "h200",
               "--json"])  # fmt: skip
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["fitted"]) == set(DEFAULT_FIT)
    for k, v in TRUE.items():
        assert doc["fitted"][k] == pytest.approx(v, rel=0.02), k
    assert doc["held_out_kind"] == "point"
    for row in (*doc["in_sample"], *doc["held_out"]):
        assert max(row["prompt_worst"], row["tpot_worst"]) < 0.01
    assert doc["engine"] == "distserve"


def test_calibrate_starting_far_from_the_defaults(tmp_path):
    terms = {"mfu": 0.3, "mbu": 0.5, "attn_mfu": 0.15, "overhead_s": 8e-3, "seq_overhead_s": 2e-4}
    table = _synthetic(tmp_path / "far.csv", "llama-3.1-8b", **terms)
    r = fit_tables([load_table(table, "llama-3.1-8b", "h200", 1)])
    for k, v in terms.items():
        assert r.fitted[k] == pytest.approx(v, rel=0.02), k


def test_calibrate_two_models_leave_one_table_out(tmp_path, capsys):
    a = _synthetic(tmp_path / "llama.csv", "llama-3.1-8b")
    b = _synthetic(tmp_path / "qwen.csv", "qwen3-8b")
    for path, model in ((a, "llama-3.1-8b"), (b, "qwen3-8b")):
        path.with_suffix(".json").write_text(json.dumps({"model": model, "gpu": "h200", "tp": 1}))
    # sidecars that name the model by catalog name (twin profile writes the full mapping)
    rc = main(["calibrate", "--profile", str(a), "--profile", str(b)])
    out = capsys.readouterr().out
    assert rc == 0 and "leave-one-table-out" in out
    assert out.count("PASS") >= 4 and "FAIL" not in out


def test_calibrate_bad_input(tmp_path, capsys):
    table = _synthetic(tmp_path / "syn.csv", "llama-3.1-8b")
    cases = [
        (["--profile", str(table)], "give --model"),
        (["--profile", str(table), "--model", "llama-3.1-8b"], "give --gpu"),
        (["--profile", str(tmp_path / "none.csv"), "--model", "x"], "cannot read"),
        (["--profile", str(table), "--model", "llama-3.1-8b", "--gpu", "h200", "--fit", "mfu,zz"],
         "--fit"),
    ]  # fmt: skip
    for args, msg in cases:
        assert main(["calibrate", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("twin: error: ") and msg in err and err.count("\n") == 1, err


GOOD_ROWS = [
    "prefill,1,512,0,0.050", "prefill,1,1024,0,0.090", "prefill,4,512,0,0.160",
    "decode,1,1,512,0.020", "decode,1,1,2048,0.024", "decode,8,1,512,0.022",
    "decode,8,1,2048,0.030",
]  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([*GOOD_ROWS, "prefill,1,256,0,0"], "line 9: column time_s: '0'; expected a time"),
        ([*GOOD_ROWS, "prefill,1,256,0,-0.01"], "line 9: column time_s: '-0.01'; expected"),
        ([*GOOD_ROWS, "prefill,1,256,0,nan"], "line 9: column time_s: 'nan'; expected"),
        ([*GOOD_ROWS, "decode,1,1,256,inf"], "line 9: column time_s: 'inf'; expected"),
        ([*GOOD_ROWS, "decode,1,1,256"], "line 9: 4 cells; the header has 5"),
        ([*GOOD_ROWS, "decode,1,1,256,0.1,9"], "line 9: 6 cells; the header has 5"),
        ([*GOOD_ROWS, "prefill,0,256,0,0.01"], "line 9: column batch_size: 0 must be >= 1"),
        (["prefill,1,-256,0,0.01", *GOOD_ROWS], "line 2: column tokens: -256 must be >= 1"),
        ([*GOOD_ROWS, "decode,1,1,-5,0.01"], "line 9: column context: -5 must be >= 0"),
        ([*GOOD_ROWS, "decode,1,x,5,0.01"], "line 9: column tokens: 'x' is not an integer"),
        ([], "no rows; expected a prefill or decode time per line"),
        (["prefill,1,512,0,0.05"], "1 point(s) for 5 terms"),
        (GOOD_ROWS[:5], "5 point(s) for 5 terms"),
    ],
)  # fmt: skip
def test_calibrate_refuses_a_bad_table_in_one_line(tmp_path, capsys, rows, message):
    path = tmp_path / "t.csv"
    path.write_text("".join(f"{r}\n" for r in ["phase,batch_size,tokens,context,time_s", *rows]))
    assert main(["calibrate", "--profile", str(path), "--model", "llama-3.1-8b",
                 "--gpu", "h100-sxm"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and err.count("\n") == 1, err
    assert str(path.name) in err and message in err, err


def test_calibrate_fits_as_few_points_as_it_fits_terms_plus_one(tmp_path, capsys):
    path = tmp_path / "t.csv"
    path.write_text("phase,batch_size,tokens,context,time_s\n" + "\n".join(GOOD_ROWS[:2]) + "\n")
    argv = ["calibrate", "--profile", str(path), "--model", "llama-3.1-8b", "--gpu", "h100-sxm"]
    assert main([*argv, "--fit", "mfu"]) == 0
    assert "mfu" in capsys.readouterr().out
