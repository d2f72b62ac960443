"""Sample sizes: independent samples, the interval of a goodput, the warnings."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t

from twin.cli import main
from twin.errors import SpecError
from twin.sim.spec import resolve_spec
from twin.studies.goodput import goodput
from twin.studies.samples import (
    HORIZONS,
    MAX_CI_FRACTION,
    ci95,
    format_convergence,
    horizon_s,
    replicate_samples,
    sample_warnings,
)
from twin.workload.stream import WorkloadSpec, iter_requests

SYNTHETIC = {
    "model": "llama-3.1-8b",
    "cluster": {"instances": 1, "tp": 1},
    "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 2.0},
                 "max_requests": 30},
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}  # fmt: skip


def _trace(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "t.csv"
    rows = [f"2023-11-16 18:15:{i // 2:02d}.{5 * (i % 2)}000000,{100 + i},{10 + i % 7}"
            for i in range(n)]  # fmt: skip
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def _trace_spec(tmp_path: Path, n: int, per_run: int | None) -> dict:
    d = copy.deepcopy(SYNTHETIC)
    d["workload"] = {"trace": str(_trace(tmp_path, n)), "format": "azure"}
    if per_run is not None:
        d["workload"]["max_requests"] = per_run
    return d


# -- the stream's skip ------------------------------------------------------------------
def test_skip_starts_the_stream_later_at_time_zero(tmp_path):
    path = _trace(tmp_path, 10)
    w = WorkloadSpec.from_mapping({"trace": str(path), "skip": 4, "max_requests": 3})
    reqs = list(iter_requests(w, np.random.default_rng(0)))
    assert [(r.id, r.arrival_s, r.prompt_tokens) for r in reqs] == [
        (0, 0.0, 104),
        (1, 0.5, 105),
        (2, 1.0, 106),
    ]
    past = WorkloadSpec.from_mapping({"trace": str(path), "skip": 10})
    with pytest.raises(SpecError, match=r"workload.skip: 10 is past the end of the trace"):
        list(iter_requests(past, np.random.default_rng(0)))


def test_skip_must_be_a_non_negative_integer():
    assert main(["spec", "quickstart", "--set", "workload.skip=-1"]) == 2


# -- replicates -------------------------------------------------------------------------
def test_synthetic_samples_are_seeds_and_the_first_is_the_runs_own():
    spec = resolve_spec(SYNTHETIC, "s.yaml", Path.cwd())
    samples = replicate_samples(spec, 10, 3)
    assert [len(s) for s in samples] == [10, 10, 10]
    rng = np.random.default_rng(np.random.SeedSequence(spec.seed).spawn(2)[0])
    assert samples[0] == list(iter_requests(spec.workload, rng))[:10]
    assert samples[0] != samples[1] != samples[2]


def test_trace_samples_are_consecutive_windows_as_far_as_the_trace_goes(tmp_path):
    spec = resolve_spec(_trace_spec(tmp_path, 25, None), "s.yaml", Path.cwd())
    samples = replicate_samples(spec, 10, 4)
    assert len(samples) == 2  # 25 requests hold two full windows of 10
    assert [r.prompt_tokens for r in samples[1]] == list(range(110, 120))
    assert samples[1][0].arrival_s == 0.0 and samples[1][-1].arrival_s == pytest.approx(4.5)


# -- the interval and the warnings ------------------------------------------------------
def test_ci95_is_student_t():
    assert ci95([1.0, 2.0, 3.0]) == pytest.approx(t.ppf(0.975, 2) / math.sqrt(3))
    assert math.isnan(ci95([4.0]))


def test_warnings_name_the_sample_that_would_do():
    w = sample_warnings(
        asked=500, got=50, target=0.9, replicates_asked=3, replicates=1, mean=10.0, ci=math.nan
    )
    assert w == [
        "the workload holds 50 requests, fewer than the 500 asked for",
        "a sample of 50 requests allows 5 misses at attainment >= 0.9: each verdict turns on "
        "fewer than 10 requests (use --sample >= 100)",
        "1 independent sample(s) of 50 requests, fewer than the 3 asked for (a trace gives one "
        "per window of --sample requests it holds); no confidence interval",
    ]
    # a half-width of 30% needs (30% / 15%)^2 = 4 times the sample
    w = sample_warnings(
        asked=1000, got=1000, target=0.9, replicates_asked=3, replicates=3, mean=10.0, ci=3.0
    )
    assert w == [
        "the goodput's 95% interval is +-30% over 3 samples of 1000 requests: too small a "
        f"sample (about --sample 4000 narrows it to +-{MAX_CI_FRACTION:.0%})"
    ]
    ok = sample_warnings(
        asked=1000, got=1000, target=0.9, replicates_asked=3, replicates=3, mean=10.0, ci=0.5,
        horizon_s=40.0,
    )  # fmt: skip
    assert ok == []  # 1000 requests at 10 req/s span 100 s >= 2 x 40 s
    short = sample_warnings(
        asked=1000, got=1000, target=0.9, replicates_asked=3, replicates=3, mean=10.0, ci=0.5,
        horizon_s=60.0,
    )  # fmt: skip
    assert len(short) == 1 and "spans 100 s, under 2 request lifetimes" in short[0]
    assert short[0].endswith(f"(use --sample >= {HORIZONS * 60 * 10})")


def test_horizon_is_a_lifetime_at_the_slos():
    spec = resolve_spec(SYNTHETIC, "s.yaml", Path.cwd())
    reqs = replicate_samples(spec, 20, 1)[0]
    mean_out = sum(r.output_tokens for r in reqs) / 20
    assert horizon_s(spec.slo, reqs) == pytest.approx(1.0 + 0.05 * mean_out)


def test_convergence_table_reads_against_the_largest_sample():
    text = format_convergence([(250, 250, "3:1", 94.5, 7.0), (1000, 1000, "2:2", 39.7, 1.0)], "P:D")
    lines = text.splitlines()
    assert lines[2].split() == ["250", "250", "3:1", "94.500", "7.000", "+138.0%"]
    assert lines[3].split() == ["1000", "1000", "2:2", "39.700", "1.000", "+0.0%"]


# -- in the searches --------------------------------------------------------------------
def test_goodput_replicates_a_trace_over_windows_not_identical_seeds(tmp_path):
    seen = []

    def runner(data, where, base_dir):
        seen.append((data["seed"], data["workload"].get("skip", 0)))
        return 1.0 if data["workload"]["rate_scale"] <= 2.0 else 0.0

    d = _trace_spec(tmp_path, 25, 10)
    g = goodput(d, "s.yaml", Path.cwd(), rel_tol=0.1, runner=runner)
    (row,) = g.rows
    assert {skip for _, skip in seen} == {0, 10}  # two windows of 10; no third
    assert row.seeds == (0, 1)
    assert any("2 independent sample(s) of 10 requests" in w for w in row.warnings)
    assert any("allows 1 misses" in w for w in row.warnings)
    assert "warning: (base): 2 independent sample(s)" in g.format_table()


def test_goodput_sample_sets_the_requests_per_run():
    seen = set()

    def runner(data, where, base_dir):
        seen.add(data["workload"]["max_requests"])
        return 1.0

    goodput(SYNTHETIC, "s.yaml", Path.cwd(), sample=7, seeds=1, max_steps=1, runner=runner)
    assert seen == {7}


def test_provision_gives_every_split_an_interval():
    from twin.studies.provision import format_provision, provision

    spec = {
        "model": "llama-3.1-8b",
        "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "tp": 4, "prefill": 1,
                    "decode": 1},
        "scheduler": "splitwise",
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 5},
                     "max_requests": 60},
        "slo": {"ttft": "500 ms", "tpot": "40 ms"},
    }  # fmt: skip
    p = provision(spec, "p.yaml", Path.cwd(), power_w=6000, sample=40, replicates=3)
    (c,) = p.candidates
    assert len(c.goodputs_rps) == 3 and c.goodput_rps == pytest.approx(np.mean(c.goodputs_rps))
    assert c.goodput_ci95 == pytest.approx(ci95(c.goodputs_rps))
    assert p.sample == 40
    text = format_provision(p)
    assert "(mean of 3 samples of 40 requests)" in text
    assert "warning: a sample of 40 requests allows 4 misses" in text


def test_plan_scores_the_chosen_configurations_on_every_sample(tiny_plan_spec):
    from twin.studies.planner import plan_distserve

    spec = tiny_plan_spec
    kw = dict(max_gpus_per_instance=1, max_decode_requests=100, iterations=3, sample_size=30)
    plan = plan_distserve(spec, replicates=2, **kw)
    assert len(plan.capacity_samples) == 2
    assert plan.capacity_samples[0] == pytest.approx(plan.capacity_rps)
    assert "over 2 samples of 30 requests (the counts kept)" in plan.explain()
    one = plan_distserve(spec, replicates=1, **kw)
    assert one.capacity_samples == (plan.capacity_rps,) and one.n_prefill == plan.n_prefill


def test_cli_sample_options_are_checked(capsys):
    assert main(["provision", "disagg", "--sample", "0"]) == 2
    assert "--sample: 0 must be a positive integer" in capsys.readouterr().err
    assert main(["plan", "disagg", "--replicates", "0"]) == 2
    assert "--replicates: 0 must be a positive integer" in capsys.readouterr().err
    assert main(["plan", "disagg", "--convergence", "250,x"]) == 2
    assert "--convergence: 'x' is not a sample size >= 2" in capsys.readouterr().err


def test_goodput_shows_each_window_and_says_when_windows_differ_in_kind(tmp_path):
    from twin.studies.goodput import over_context

    d = _trace_spec(tmp_path, 30, 10)
    d["engine"] = {"max_model_len": 1000}
    trace = Path(d["workload"]["trace"])
    lines = trace.read_text().splitlines()
    for i in range(11, 16):  # half of the second window is longer than the context
        t, _, out = lines[i].split(",")
        lines[i] = f"{t},2000,{out}"
    trace.write_text("\n".join(lines) + "\n")

    def runner(data, where, base_dir):
        spec = resolve_spec(data, where, base_dir)
        share = over_context(spec, spec.workload.max_requests)
        return (1.0 - share) if data["workload"]["rate_scale"] <= 2.0 else 0.0

    g = goodput(d, "s.yaml", Path.cwd(), seeds=3, rel_tol=0.1, runner=runner)
    (row,) = g.rows
    assert row.samples == ("requests 0-9", "requests 10-19", "requests 20-29")
    assert row.goodputs_rps[1] == 0.0 and min(row.goodputs_rps[::2]) > 0
    table = g.format_table()
    each = ", ".join(f"{n} {v:.3f}" for n, v in zip(row.samples, row.goodputs_rps, strict=True))
    assert f"(base): per sample req/s: {each}" in table
    (kind,) = [w for w in row.warnings if w.startswith("the samples differ in kind")]
    assert "requests 10-19 hold(s) up to 50.0% requests longer than the context (1,000" in kind
    assert not any("95% interval" in w for w in row.warnings)  # a larger sample is no remedy
