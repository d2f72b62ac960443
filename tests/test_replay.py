from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from twin.cli import main
from twin.perf.presets import ENGINE_OVERHEADS
from twin.sim.simulation import Simulation
from twin.sim.spec import load_spec
from twin.studies.replay import validate_replay


def _spec(tmp_path: Path) -> Path:
    """A one-instance Llama-2-7B spec priced by a small native table: prefill 20 ms
    + 0.1 ms per token, decode 10 ms + 0.05 ms per sequence (context ignored)."""
    rows = ["phase,batch_size,tokens,context,time_s"]
    for b in (1, 4):
        for t in (128, 1024, 4096):
            rows.append(f"prefill,{b},{t},0,{0.02 + 1e-4 * b * t}")
    for b in (1, 8, 64):
        for c in (128, 4096):
            rows.append(f"decode,{b},1,{c},{0.01 + 5e-5 * b}")
    (tmp_path / "table.csv").write_text("\n".join(rows) + "\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: tiny-replay\nseed: 3\nmodel: llama-2-7b\ngpu: a100-80gb\n"
        "cluster: {instances: 1, tp: 1}\nperf: {kind: profile, path: table.csv}\n"
        "scheduler: colocated\n"
        "workload: {lengths: azure-conv, arrival: {process: poisson, rate: 2.0},"
        " max_requests: 30}\n"
    )
    return spec


def _direct(spec: Path, overrides: tuple[str, ...] = ()) -> dict[str, float]:
    rows: list[dict[str, Any]] = []
    Simulation(load_spec(str(spec), overrides), on_row=rows.append).run()
    ok = [r for r in rows if r["status"] == "completed"]
    return {
        "completed": len(ok),
        "ttft": float(np.mean([r["ttft_s"] for r in ok])),
        "e2e": float(np.percentile([r["e2e_s"] for r in ok], 99)),
    }


def test_replay_columns_are_the_runs_themselves(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    c = validate_replay(str(spec))
    assert c.variants == ("profile", *(f"roofline {e}" for e in ENGINE_OVERHEADS))
    want = _direct(spec)
    # The few azure-conv prompts beyond Llama-2's 4,096-token context are rejected by all.
    assert c.requests == 30 and c.compared == want["completed"] >= 25
    assert c.values["ttft"]["profile"]["mean"] == pytest.approx(want["ttft"], rel=1e-12)
    assert c.values["e2e"]["profile"]["p99"] == pytest.approx(want["e2e"], rel=1e-12)
    for e in ENGINE_OVERHEADS:
        got = _direct(spec, (f"perf={{kind: roofline, engine: {e}}}",))
        assert c.values["ttft"][f"roofline {e}"]["mean"] == pytest.approx(got["ttft"], rel=1e-12)
    # The table's decode step is 10 ms + 0.05 ms per sequence: the TPOT lies within.
    tpot = c.values["tpot"]["profile"]
    assert 0.010 < tpot["p50"] <= tpot["p99"] < 0.010 + 5e-5 * 30 + 0.02 + 1e-4 * 4096


def test_replay_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path)
    assert main(["validate", "replay", str(spec), "--json"]) == 0
    first = capsys.readouterr().out
    assert main(["validate", "replay", str(spec), "--json"]) == 0
    assert capsys.readouterr().out == first  # deterministic
    assert json.loads(first)["requests"] == 30
    assert main(["validate", "replay", str(spec)]) == 0
    assert "TTFT mean" in capsys.readouterr().out
    assert main(["validate", "replay", "quickstart"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "perf.kind: 'roofline'" in err[0]
    assert main(["validate", "replay"]) == 2
    assert "needs SPEC" in capsys.readouterr().err
