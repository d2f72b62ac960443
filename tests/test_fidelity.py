from __future__ import annotations

from pathlib import Path

import pytest

from twin.cli import main
from twin.perf.iteration import Batch
from twin.perf.validate import Point, Source
from twin.studies.fidelity import (
    IterationRecorder,
    _weighted_quantile,
    point_weights,
    weighted_score,
    workload_mix,
)


class Priced:
    """A perf model pricing each batch by a lookup: exact errors per point."""

    name = "priced"
    sha256 = None

    def __init__(self, table: dict[Batch, float]) -> None:
        self.table = table

    def iteration_time(self, batch: Batch) -> float:
        return self.table[batch]


def _p(n: int, tokens: int) -> Batch:
    return Batch(prefill=((tokens, 0),) * n)


def _d(b: int, ctx: int) -> Batch:
    return Batch(decode_count=b, decode_context_sum=b * ctx)


def test_weighted_quantile() -> None:
    assert _weighted_quantile([(0.3, 1), (0.1, 1), (0.2, 1)], 0.5) == 0.2
    assert _weighted_quantile([(0.1, 1), (0.5, 9)], 0.5) == 0.5
    assert _weighted_quantile([(0.1, 9), (0.5, 1)], 0.5) == 0.1
    assert _weighted_quantile([(0.1, 9), (0.5, 1)], 0.9) == 0.1
    assert _weighted_quantile([(0.1, 8), (0.5, 2)], 0.9) == 0.5


def test_weighted_score_counts_iterations_on_their_nearest_point() -> None:
    # Prompt points: 1 x 128 tokens (10% off), 1 x 2048 (40% off), 8 x 512 (0% off);
    # decode points: batch 1 at 512 (5% off), batch 64 at 512 (20% off).
    pts = (
        Point("prompt", _p(1, 128), 1.0),
        Point("prompt", _p(1, 2048), 1.0),
        Point("prompt", _p(8, 512), 1.0),
        Point("tpot", _d(1, 512), 1.0),
        Point("tpot", _d(64, 512), 1.0),
    )
    model = Priced(
        {_p(1, 128): 1.1, _p(1, 2048): 1.4, _p(8, 512): 1.0, _d(1, 512): 0.95, _d(64, 512): 1.2}
    )
    src = Source("toy", "llama-2-7b", "a100-80gb", 1, pts)
    rec = IterationRecorder()
    rec.prefill.update({(1, 1900): 3, (1, 150): 1, (7, 7 * 500): 1})  # (prompts, tokens)
    rec.decode.update({(60, 60 * 400): 9, (2, 2 * 600): 1})  # (batch, context sum)
    row = weighted_score(src, rec, model)
    # Prompt errors by weight: 0.4 x3, 0.1 x1, 0.0 x1 -> median 0.4, p90 0.4.
    assert row.prompt_median == pytest.approx(0.4) and row.prompt_p90 == pytest.approx(0.4)
    # Decode: 0.2 x9, 0.05 x1 -> median 0.2.
    assert row.tpot_median == pytest.approx(0.2) and row.tpot_p90 == pytest.approx(0.2)
    assert (row.prefill_iterations, row.decode_iterations) == (5, 10)
    # The grid median counts every point once: (0.0, 0.1, 0.4) -> 0.1.
    assert row.grid.prompt_median == pytest.approx(0.1)
    # the same counts per point, by index among the phase's points
    w = point_weights(src, rec)
    assert w["prompt"] == {1: 3, 0: 1, 2: 1} and w["tpot"] == {1: 9, 0: 1}
    rec.prefill.clear()
    assert weighted_score(src, rec, model).prompt_median is None


def test_calibrate_weighted_median_is_fidelitys() -> None:
    import numpy as np

    from twin.perf.calibrate import weighted_median

    for pairs in ([(0.3, 1), (0.1, 1), (0.2, 1)], [(0.1, 1), (0.5, 9)], [(0.1, 9), (0.5, 1)]):
        err, w = np.array([e for e, _ in pairs]), np.array([float(n) for _, n in pairs])
        assert weighted_median(err, w) == _weighted_quantile(pairs, 0.5)


def test_fit_weighted_keeps_what_already_fits() -> None:
    # three sources whose "measured" times are the Roofline's own at the defaults: no target
    # misses, and the refit (one round) stays where every error is ~0
    from twin.perf.calibrate import default_params, fit_weighted, fitted_roofline

    sources, weights = [], {}
    for name, gpu, tp in (("a", "a100-80gb", 2), ("b", "h100-80gb", 8)):
        shell = Source(name, "llama2-70b", gpu, tp, ())
        model = fitted_roofline(default_params(), shell)
        batches = [("prompt", _p(1, n)) for n in (512, 2048, 8192)]
        batches += [("tpot", _d(b, 700)) for b in (1, 8, 64)]
        pts = tuple(Point(ph, bt, model.iteration_time(bt)) for ph, bt in batches)
        sources.append(Source(name, "llama2-70b", gpu, tp, pts))
        weights[name] = [[5, 1, 0, 3, 1, 0]]
    held = ("mfu@h100-sxm", "overhead_s@splitwise-sim")
    p = fit_weighted(sources, weights, {"b": [False] * 3 + [True] * 3}, rounds=1, held=held)
    assert p["misses"] == 0
    assert {k: p[k] for k in held} == {
        k: pytest.approx(default_params()[k], rel=1e-6) for k in held
    }
    for s in sources:
        m = fitted_roofline(p, s)
        for pt in s.points:
            assert m.iteration_time(pt.batch) == pytest.approx(pt.measured_s, rel=0.02)


def test_workload_mix_records_every_prompt_once() -> None:
    src = Source("toy", "llama-2-7b", "a100-80gb", 1, (), engine="distserve")
    rec = workload_mix(src, "azure-conv", requests=20, rate=0.5)
    # Every request ends; the few longer than the model's context are rejected.
    assert rec.requests == 20 and 15 <= rec.served < 20
    # No chunking, no prefix cache and a light load: each served prompt is one prefill
    # chunk, and the decode batches never exceed the requests.
    assert sum(n * k for (k, _), n in rec.prefill.items()) == rec.served
    assert rec.decode and max(b for b, _ in rec.decode) <= 20
    again = workload_mix(src, "azure-conv", requests=20, rate=0.5)
    assert (again.prefill, again.decode) == (rec.prefill, rec.decode)


def test_cli_bad_workload(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["validate", "perf", "--data", str(tmp_path), "--workload", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--workload: 'nope'" in err[0]
    assert main(["validate", "perf", "--data", str(tmp_path), "--workload", "azure-conv",
                 "--requests", "0"]) == 2  # fmt: skip
    assert "--requests: 0" in capsys.readouterr().err


def test_cli_weighted_table_on_real_data(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["validate", "perf", "--data", str(shared_data), "--workload", "azure-code",
                 "--requests", "20"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "workload: azure-code" in out
    row = [x for x in out.splitlines() if x.startswith("splitwise llama2-70b h100-80gb tp8")][-1]
    served, total = row.split()[-1].split("/")
    assert total == "20" and 0 < int(served) <= 20


def test_workload_mix_of_a_trace_file(tmp_path: Path) -> None:
    # Four requests, one second apart, each alone on the instance: four one-prompt
    # prefill iterations of exactly the trace's prompt lengths.
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.0,100,2\n2023-11-16 18:00:01.0,200,2\n"
        "2023-11-16 18:00:02.0,300,2\n2023-11-16 18:00:03.0,400,2\n"
    )
    src = Source("toy", "llama-2-7b", "a100-80gb", 1, (), engine="distserve")
    rec = workload_mix(src, str(trace), requests=10)
    assert (rec.requests, rec.served) == (4, 4)
    assert rec.prefill == {(1, 100): 1, (1, 200): 1, (1, 300): 1, (1, 400): 1}
    # The second token of each is one decode step of one sequence at its prompt + 1.
    assert rec.decode == {(1, 101): 1, (1, 201): 1, (1, 301): 1, (1, 401): 1}
