"""Workload spec and generators: rates, limits, determinism, bundled tables, errors."""

from __future__ import annotations

import itertools
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twin.errors import SpecError, TraceError
from twin.request import Request
from twin.workload.arrivals import GammaArrivals, PoissonArrivals
from twin.workload.lengths import (
    BUNDLED_TABLES,
    EmpiricalLengths,
    FixedLength,
    LogNormalLength,
    bundled_table,
    bundled_table_path,
    fit_lengths,
)
from twin.workload.stream import EmpiricalFile, WorkloadSpec, file_sha256, iter_requests

SPLITWISE = (
    "request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,token_size\n"
    "0,2,0,1,1,4096,32\n1,2,0,3,1,2048,8\n2,2,0,4,1,2048,16\n"
)
LENGTHS = "num_prefill_tokens,num_decode_tokens,num_total_tokens\n10,1,11\n20,2,22\n30,3,33\n"
MOONCAKE = (
    '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}\n'
    '{"timestamp": 1000, "input_length": 512, "output_length": 4, "hash_ids": [0]}\n'
)


def run(m: dict, seed: int = 0, base_dir: Path | None = None) -> list[Request]:
    return list(iter_requests(WorkloadSpec.from_mapping(m, "w", base_dir), rng(seed)))


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "sw.csv").write_text(SPLITWISE)
    (tmp_path / "len.csv").write_text(LENGTHS)
    (tmp_path / "mc.jsonl").write_text(MOONCAKE)
    return tmp_path


POISSON5 = {"process": "poisson", "rate": 5.0}


# --------------------------------------------------------------------------- arrivals


def gaps_of(reqs: list[Request]) -> np.ndarray:
    return np.diff([0.0] + [r.arrival_s for r in reqs])


def test_poisson_rate_and_cv() -> None:
    reqs = run({"lengths": "azure-conv", "arrival": POISSON5, "max_requests": 200_000}, seed=1)
    g = gaps_of(reqs)
    # sd of the mean rate estimate is 1/sqrt(n) = 0.22 %; 1 % is > 4 sd
    assert len(reqs) / reqs[-1].arrival_s == pytest.approx(5.0, rel=0.01)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_rate_and_cv(cv: float) -> None:
    arrival = {"process": "gamma", "rate": 4.0, "cv": cv}
    reqs = run({"lengths": "azure-conv", "arrival": arrival, "max_requests": 200_000}, seed=2)
    g = gaps_of(reqs)
    assert 1 / g.mean() == pytest.approx(4.0, rel=0.015)
    assert g.std() / g.mean() == pytest.approx(cv, rel=0.03)


def test_arrival_processes_validate() -> None:
    with pytest.raises(SpecError, match=r"rate\(=0\) must be a number > 0"):
        PoissonArrivals(0)
    with pytest.raises(SpecError, match=r"cv\(=-1\)"):
        GammaArrivals(1.0, -1)


# --------------------------------------------------------------------------- determinism


def test_same_seed_same_stream_other_seed_differs() -> None:
    m = {"lengths": "azure-conv", "arrival": {"process": "gamma", "rate": 3, "cv": 1.5},
         "duration": "2 min"}  # fmt: skip
    a, b, c = run(m, 7), run(m, 7), run(m, 8)
    assert a == b
    assert a != c
    assert len(a) > 100


def test_rate_change_keeps_lengths() -> None:
    slow = run({"lengths": "azure-code", "arrival": POISSON5, "max_requests": 500})
    fast = run({"lengths": "azure-code", "arrival": {"process": "poisson", "rate": 50},
                "max_requests": 500})  # fmt: skip
    assert [(r.prompt_tokens, r.output_tokens) for r in slow] == [
        (r.prompt_tokens, r.output_tokens) for r in fast
    ]
    # exponential gaps scale with 1/rate from the same draws
    assert fast[-1].arrival_s == pytest.approx(slow[-1].arrival_s / 10, rel=1e-12)


# --------------------------------------------------------------------------- scaling, limits


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_rate_scale_on_trace(files: Path, scale: float) -> None:
    base = run({"trace": str(files / "sw.csv")})
    scaled = run({"trace": str(files / "sw.csv"), "rate_scale": scale})
    assert [r.arrival_s for r in base] == [1.0, 3.0, 4.0]
    assert [r.arrival_s for r in scaled] == [t / scale for t in (1.0, 3.0, 4.0)]


def test_rate_scale_on_synthetic() -> None:
    m = {"lengths": "azure-conv", "arrival": POISSON5, "max_requests": 1000}
    base = run(m)
    double = run({**m, "rate_scale": 2.0})
    assert double[-1].arrival_s == pytest.approx(base[-1].arrival_s / 2, rel=1e-12)
    assert [r.prompt_tokens for r in double] == [r.prompt_tokens for r in base]


def test_duration_after_scaling(files: Path) -> None:
    # times 1, 3, 4 s at scale 2 are 0.5, 1.5, 2.0; duration 2 s keeps arrivals < 2 s
    reqs = run({"trace": str(files / "sw.csv"), "rate_scale": 2, "duration": "2 s"})
    assert [r.arrival_s for r in reqs] == [0.5, 1.5]
    reqs = run({"trace": str(files / "sw.csv"), "duration": "2000 ms"})
    assert [r.arrival_s for r in reqs] == [1.0]


def test_duration_on_synthetic() -> None:
    reqs = run({"lengths": "azure-conv", "arrival": POISSON5, "duration": "1 min"})
    assert reqs[-1].arrival_s < 60.0
    assert 300 * 0.8 < len(reqs) < 300 * 1.2
    longer = run({"lengths": "azure-conv", "arrival": POISSON5, "duration": "2 min"})
    assert longer[: len(reqs)] == reqs  # a prefix: same stream, cut later
    assert longer[len(reqs)].arrival_s >= 60.0


def test_max_requests(files: Path) -> None:
    assert len(run({"lengths": "azure-conv", "arrival": POISSON5, "max_requests": 17})) == 17
    assert [r.id for r in run({"trace": str(files / "sw.csv"), "max_requests": 2})] == [0, 1]
    assert len(run({"trace": str(files / "sw.csv"), "max_requests": 10})) == 3  # trace ends


def test_repeat_timed_trace(files: Path) -> None:
    reqs = run({"trace": str(files / "sw.csv"), "repeat": True, "max_requests": 7})
    # span 3 s over 3 rows: period 3 * 3 / 2 = 4.5 s
    assert [r.arrival_s for r in reqs] == [1.0, 3.0, 4.0, 5.5, 7.5, 8.5, 10.0]
    assert [r.prompt_tokens for r in reqs] == [4096, 2048, 2048] * 2 + [4096]
    assert [r.id for r in reqs] == list(range(7))
    by_time = run({"trace": str(files / "sw.csv"), "repeat": True, "duration": 8})
    assert [r.arrival_s for r in by_time] == [1.0, 3.0, 4.0, 5.5, 7.5]


def test_repeat_offsets_prefix_hashes(files: Path) -> None:
    reqs = run({"trace": str(files / "mc.jsonl"), "repeat": True, "max_requests": 4})
    assert [r.prefix_hashes for r in reqs] == [(0, 1), (0,), (2, 3), (2,)]
    assert [r.arrival_s for r in reqs] == [0.0, 1.0, 2.0, 3.0]
    assert all(r.prefix_block_tokens == 512 for r in reqs)
    custom = run({"trace": str(files / "mc.jsonl"), "prefix_block_tokens": 256})
    assert custom[0].prefix_block_tokens == 256


def test_repeat_needs_span(tmp_path: Path) -> None:
    p = tmp_path / "one.csv"
    p.write_text(SPLITWISE.splitlines()[0] + "\n0,2,0,1,1,4096,32\n")
    with pytest.raises(TraceError, match=r"one\.csv: cannot repeat a trace whose arrivals span 0"):
        run({"trace": str(p), "repeat": True, "max_requests": 3})


def test_ties_keep_file_order(tmp_path: Path) -> None:
    p = tmp_path / "ties.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,3,1\n0,1,1\n0,2,1\n1,9,1\n")
    reqs = run({"trace": str(p)})
    assert [(r.id, r.prompt_tokens) for r in reqs] == [(0, 3), (1, 1), (2, 2), (3, 9)]


def test_length_only_trace_with_arrivals(files: Path) -> None:
    m = {"trace": "len.csv", "arrival": POISSON5, "repeat": True, "max_requests": 7}
    reqs = run(m, base_dir=files)
    assert [r.prompt_tokens for r in reqs] == [10, 20, 30, 10, 20, 30, 10]
    assert [r.output_tokens for r in reqs] == [1, 2, 3, 1, 2, 3, 1]
    assert all(b.arrival_s > a.arrival_s for a, b in itertools.pairwise(reqs))


def test_length_only_trace_needs_arrival(files: Path) -> None:
    with pytest.raises(TraceError, match=r"len\.csv: a lengths trace has no arrival times"):
        run({"trace": str(files / "len.csv")})
    with pytest.raises(SpecError, match=r"w: a length-only trace needs an arrival process"):
        WorkloadSpec.from_mapping({"trace": "x.csv", "format": "lengths"}, "w")


def test_arrival_overrides_trace_times(files: Path) -> None:
    reqs = run({"trace": str(files / "sw.csv"), "arrival": {"process": "poisson", "rate": 100}})
    assert [r.prompt_tokens for r in reqs] == [4096, 2048, 2048]
    assert reqs[-1].arrival_s < 1.0  # 3 arrivals at 100/s, not the file's 1..4 s


def test_stream_is_lazy() -> None:
    spec = WorkloadSpec.from_mapping(
        {"lengths": "azure-conv", "arrival": POISSON5, "max_requests": 10**12}, "w"
    )
    first = list(itertools.islice(iter_requests(spec, rng(0)), 5))
    assert [r.id for r in first] == [0, 1, 2, 3, 4]
    tracemalloc.start()
    try:
        n = sum(1 for _ in itertools.islice(iter_requests(spec, rng(0)), 50_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 50_000
    assert peak < 4 * 2**20  # a list of 50k Requests would take > 8 MiB (the stream: < 1 MiB)


def _azure_file(path: Path, rows: int, bad_row: int | None = None) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(rows):
        h, rest = divmod(i, 3600)
        stamp = f"2023-11-16 {h:02d}:{rest // 60:02d}:{rest % 60:02d}.{i % 10}000000"
        lines.append(f"{stamp},{i + 1},2")
    if bad_row is not None:
        lines[bad_row] = "2023-11-16 99:00:00.0,1,1"
    path.write_text("\n".join(lines) + "\n")
    return path


def _peak_bytes(stream) -> tuple[int, int]:
    """(items consumed, peak traced bytes while consuming them)."""
    tracemalloc.start()
    try:
        n = sum(1 for _ in stream)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return n, peak


def test_a_trace_streams(tmp_path: Path) -> None:
    path = _azure_file(tmp_path / "big.csv", 10_000)
    spec = WorkloadSpec.from_mapping({"trace": str(path)}, "w")
    first = next(iter_requests(spec, rng(0)))
    assert (first.id, first.arrival_s, first.prompt_tokens) == (0, 0.0, 1)
    n, peak = _peak_bytes(iter_requests(spec, rng(0)))
    assert n == 10_000
    assert peak < 2**19  # the 10k records as a list take > 1.5 MiB (the stream: < 100 KiB)


def test_a_bad_row_raises_when_the_stream_reaches_it(tmp_path: Path) -> None:
    path = _azure_file(tmp_path / "bad.csv", 5, bad_row=4)  # the 4th request, line 5
    stream = iter_requests(WorkloadSpec.from_mapping({"trace": str(path)}, "w"), rng(0))
    assert [next(stream).id for _ in range(3)] == [0, 1, 2]
    with pytest.raises(TraceError, match=r"bad\.csv: line 5: column TIMESTAMP: '2023-11-16 99"):
        next(stream)


def test_a_repeated_trace_keeps_one_compact_pass(tmp_path: Path) -> None:
    path = _azure_file(tmp_path / "loop.csv", 2_000)
    spec = WorkloadSpec.from_mapping(
        {"trace": str(path), "repeat": True, "max_requests": 20_000}, "w"
    )
    reqs = list(itertools.islice(iter_requests(spec, rng(0)), 4_001))
    period = reqs[1_999].arrival_s * 2_000 / 1_999
    assert reqs[2_000].arrival_s == reqs[0].arrival_s + period
    assert reqs[4_000].arrival_s == reqs[0].arrival_s + 2 * period
    assert [r.prompt_tokens for r in reqs[2_000:2_003]] == [1, 2, 3]
    n, peak = _peak_bytes(iter_requests(spec, rng(0)))
    assert n == 20_000  # ten passes; as a list > 3 MiB
    assert peak < 2**20  # one pass, in arrays: about 40 bytes a row


def test_repeat_offsets_hashes_past_64_bits(tmp_path: Path) -> None:
    big = 2**64
    p = tmp_path / "huge.jsonl"
    p.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}\n'
        f'{{"timestamp": 1000, "input_length": 512, "output_length": 4, "hash_ids": [{big}]}}\n'
    )
    reqs = run({"trace": str(p), "repeat": True, "max_requests": 6})
    stride = big + 1
    assert [r.prefix_hashes for r in reqs] == [
        (0, 1), (big,), (stride, stride + 1), (stride + big,), (2 * stride, 2 * stride + 1),
        (2 * stride + big,),
    ]  # fmt: skip


# --------------------------------------------------------------------------- lengths


def test_fixed_and_lognormal_lengths() -> None:
    m = {
        "lengths": {
            "prompt": {"dist": "lognormal", "median": 1000, "sigma": 1.0, "min": 2, "max": 14050},
            "output": {"dist": "fixed", "value": 128},
        },
        "arrival": POISSON5,
        "max_requests": 50_000,
    }
    reqs = run(m)
    p = np.array([r.prompt_tokens for r in reqs])
    assert {r.output_tokens for r in reqs} == {128}
    assert np.median(p) == pytest.approx(1000, rel=0.03)
    assert p.min() >= 2 and p.max() == 14050  # exp(ln 1000 + 2.6 sd) > 14050: clipped mass


def test_lognormal_mean_cv() -> None:
    d = LogNormalLength.from_mean(500, LogNormalLength.sigma_from_cv(0.8), 1, None)
    x = d.draw(rng(3), 400_000)
    assert x.mean() == pytest.approx(500, rel=0.01)
    assert x.std() / x.mean() == pytest.approx(0.8, rel=0.03)
    assert FixedLength(3).draw(rng(0), 4).tolist() == [3, 3, 3, 3]


def test_empirical_lengths(files: Path) -> None:
    m = {"lengths": {"empirical": "len.csv"}, "arrival": POISSON5, "max_requests": 3000}
    reqs = run(m, base_dir=files)
    pairs = {(r.prompt_tokens, r.output_tokens) for r in reqs}
    assert pairs == {(10, 1), (20, 2), (30, 3)}  # whole rows, all drawn
    e = EmpiricalLengths.from_file(files / "sw.csv")
    assert sorted(e.prompts.tolist()) == [2048, 2048, 4096]


def test_empirical_lengths_leave_out_rows_past_max_total_tokens(files: Path) -> None:
    # DistServe's ShareGPT preparation drops pairs of 2,048 tokens or more (OPT's
    # context) from the sample; here rows of prompt + output <= 22 are kept
    m = {
        "lengths": {"empirical": "len.csv", "max_total_tokens": 22},
        "arrival": POISSON5,
        "max_requests": 3000,
    }
    pairs = {(r.prompt_tokens, r.output_tokens) for r in run(m, base_dir=files)}
    assert pairs == {(10, 1), (20, 2)}
    spec = WorkloadSpec.from_mapping(m, "w", files)
    assert spec.lengths == EmpiricalFile(files / "len.csv", "auto", 22)
    with pytest.raises(SpecError, match="max_total_tokens: 0 is not an integer"):
        WorkloadSpec.from_mapping({**m, "lengths": {"empirical": "len.csv", "max_total_tokens": 0}})
    with pytest.raises(SpecError, match=r"no row has prompt \+ output <= max_total_tokens \(5\)"):
        run({**m, "lengths": {"empirical": "len.csv", "max_total_tokens": 5}}, base_dir=files)


# PROVENANCE.md of azure_llm_2023: (mean, median, p90, p99, min, max) of prompt and output
AZURE_STATS = {
    "azure-conv": ((1154.7, 1020, 2735, 4142, 2, 14_050), (211.1, 129, 424, 601, 7, 1_000)),
    "azure-code": ((2047.8, 1469, 5194, 7436, 3, 7_437), (27.9, 13, 55, 252, 6, 1_899)),
}


@pytest.mark.parametrize("name", sorted(BUNDLED_TABLES))
def test_bundled_table_matches_published_stats(name: str) -> None:
    p, o = bundled_table(name).sample(rng(11), 300_000)
    for x, (mean, median, p90, p99, lo, hi) in zip((p, o), AZURE_STATS[name], strict=True):
        assert x.mean() == pytest.approx(mean, rel=0.02)
        assert np.median(x) == pytest.approx(median, rel=0.02, abs=1)
        assert np.percentile(x, 90) == pytest.approx(p90, rel=0.02)
        assert np.percentile(x, 99) == pytest.approx(p99, rel=0.03)
        assert lo <= x.min() and x.max() <= hi


@pytest.mark.parametrize(
    ("name", "file"),
    [("azure-conv", "AzureLLMInferenceTrace_conv.csv"),
     ("azure-code", "AzureLLMInferenceTrace_code.csv")],
)  # fmt: skip
def test_bundled_table_refits_from_trace(shared_data: Path, name: str, file: str) -> None:
    path = shared_data / "traces" / "azure_llm_2023" / file
    fitted, bundled = fit_lengths(path, name=name), bundled_table(name)
    assert bundled.meta["source_sha256"] == file_sha256(path)
    assert bundled.meta["rows"] == str(len(path.read_text().splitlines()) - 1)
    np.testing.assert_allclose(bundled.q, fitted.q, atol=5e-5)
    np.testing.assert_allclose(bundled.prompt, fitted.prompt, atol=1e-6)
    np.testing.assert_allclose(bundled.output, fitted.output, atol=1e-6)
    assert bundled.rho == pytest.approx(fitted.rho, abs=1e-6)


def test_table_roundtrip(tmp_path: Path, files: Path) -> None:
    t = fit_lengths(files / "len.csv", name="tiny")
    t.write_csv(tmp_path / "t.csv")
    back = type(t).read_csv(tmp_path / "t.csv")
    assert back.meta["table"] == "tiny" and back.meta["rows"] == "3"
    np.testing.assert_allclose(back.prompt, t.prompt, atol=1e-6)
    assert back.prompt[0] == 10 and back.prompt[-1] == 30
    assert back.rho == pytest.approx(t.rho, abs=1e-6) and t.rho > 0.9  # perfectly co-ranked


# --------------------------------------------------------------------------- spec


def test_spec_from_mapping_full(files: Path) -> None:
    spec = WorkloadSpec.from_mapping(
        {"trace": "sw.csv", "format": "splitwise", "arrival": {"process": "gamma", "rate": 5,
         "cv": 2}, "rate_scale": 1.5, "duration": "10 min", "max_requests": 1000, "repeat": True,
         "prefix_block_tokens": 256},
        "spec.yaml: workload",
        files,
    )  # fmt: skip
    assert spec == WorkloadSpec(files / "sw.csv", "splitwise", GammaArrivals(5, 2), None, 1.5,
                                600.0, 1000, True, 256)  # fmt: skip
    assert spec.sources() == [files / "sw.csv"]
    assert spec.source_hashes() == {str(files / "sw.csv"): file_sha256(files / "sw.csv")}


def test_spec_sources() -> None:
    s = WorkloadSpec.from_mapping({"lengths": "azure-conv", "arrival": POISSON5, "duration": 1})
    assert s.sources() == [bundled_table_path("azure-conv")]
    assert s.sources()[0].is_file()
    e = WorkloadSpec.from_mapping(
        {"lengths": {"empirical": "/x/y.csv"}, "arrival": POISSON5, "duration": 1}
    )
    assert e.lengths == EmpiricalFile(Path("/x/y.csv"))
    assert e.sources() == [Path("/x/y.csv")]


def test_from_yaml(tmp_path: Path, files: Path) -> None:
    (files / "exp.yaml").write_text("workload:\n  trace: sw.csv\n  rate_scale: 2\n")
    spec = WorkloadSpec.from_yaml(files / "exp.yaml")
    assert spec.trace == files / "sw.csv"
    assert [r.arrival_s for r in iter_requests(spec, rng(0))] == [0.5, 1.5, 2.0]


BAD_SPECS = [
    ({"trace": "a.csv", "rates": 5},
     r"^w: unknown key 'rates'\..* Expected one of trace, format, arrival, lengths, rate_scale, "
     r"duration, max_requests, repeat, prefix_block_tokens, skip, rate_schedule, output_tokens, "
     r"prefixes, priority, rate, classes, timeout$"),
    ({"lengths": "azure-conv", "arrival": POISSON5},
     r"w: a synthetic workload needs duration or max_requests"),
    ({"trace": "a.csv", "repeat": True}, r"w: repeat: true needs duration or max_requests"),
    ({"lengths": "azure-conv", "duration": 5}, r"w: synthetic lengths need an arrival process"),
    ({"trace": "a.csv", "lengths": "azure-conv", "arrival": POISSON5, "duration": 1},
     r"w: give exactly one of trace and lengths"),
    ({}, r"w: give exactly one of trace and lengths"),
    ({"lengths": "azure-cnv", "arrival": POISSON5, "duration": 1},
     r"w: lengths 'azure-cnv' unknown; expected one of azure-conv, azure-code"),
    ({"trace": "a.csv", "duration": "5 parsec"}, r"w\.duration: '5 parsec' is not a duration"),
    ({"trace": "a.csv", "duration": -1}, r"w: duration\(=-1.0\) must be a number > 0"),
    ({"trace": "a.csv", "format": "csv"}, r"w: format 'csv' unknown; expected one of auto, azure"),
    ({"trace": "a.csv", "rate_scale": 0}, r"rate_scale\(=0\) must be a number > 0"),
    ({"trace": "a.csv", "max_requests": 1.5}, r"max_requests\(=1.5\) must be an integer >= 1"),
    ({"trace": "a.csv", "repeat": "yes"}, r"repeat\(='yes'\) must be true or false"),
    ({"trace": "a.csv", "arrival": {"process": "weibull", "rate": 1}},
     r"w\.arrival\.process: 'weibull' unknown; expected one of poisson, gamma"),
    ({"trace": "a.csv", "arrival": {"process": "poisson"}}, r"w\.arrival: missing key 'rate'"),
    ({"trace": "a.csv", "arrival": {"process": "gamma", "rate": 1, "cv": 0}},
     r"^w\.arrival: cv\(=0\) must be a number > 0$"),
    ({"lengths": {"prompt": {"dist": "lognormal", "mean": 5, "cv": "x"},
                  "output": {"dist": "fixed", "value": 1}}, "arrival": POISSON5, "duration": 1},
     r"^w\.lengths\.prompt: cv\(='x'\) must be a number > 0$"),
    ({"trace": "a.csv", "arrival": {"process": "poisson", "rate": 1, "cv": 2}},
     r"w\.arrival: unknown key 'cv'\. Expected one of process, rate"),
    ({"lengths": {"prompt": {"dist": "lognormal", "median": 5, "mean": 5, "sigma": 1},
                  "output": {"dist": "fixed", "value": 1}}, "arrival": POISSON5, "duration": 1},
     r"w\.lengths\.prompt: give exactly one of median and mean"),
    ({"lengths": {"prompt": {"dist": "fixed", "value": 0}, "output": {"dist": "fixed", "value": 1}},
      "arrival": POISSON5, "duration": 1}, r"w\.lengths\.prompt: value\(=0\) must be"),
    ({"lengths": {"prompt": {"dist": "zipf"}, "output": {"dist": "fixed", "value": 1}},
      "arrival": POISSON5, "duration": 1},
     r"w\.lengths\.prompt\.dist: 'zipf' unknown; expected one of fixed, lognormal"),
    ({"lengths": {"prompt": {"dist": "lognormal", "median": 9, "sigma": 1, "min": 10, "max": 5},
                  "output": {"dist": "fixed", "value": 1}}, "arrival": POISSON5, "duration": 1},
     r"w\.lengths\.prompt: max\(=5\) must be >= min\(=10\)"),
    ({"lengths": {"prompt": {"dist": "fixed", "value": 1}}, "arrival": POISSON5, "duration": 1},
     r"w\.lengths: missing key 'output'"),
]  # fmt: skip


@pytest.mark.parametrize(("m", "pattern"), BAD_SPECS, ids=[p[:40] for _, p in BAD_SPECS])
def test_bad_specs(m: dict, pattern: str) -> None:
    with pytest.raises(SpecError, match=pattern):
        WorkloadSpec.from_mapping(m, "w")


# --------------------------------------------------------------------------- property


@pytest.fixture(scope="module")
def toy_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("toy") / "mc.jsonl"
    p.write_text(MOONCAKE)
    return p


arrivals = st.one_of(
    st.builds(lambda r: {"process": "poisson", "rate": r}, st.floats(0.01, 1e4)),
    st.builds(lambda r, c: {"process": "gamma", "rate": r, "cv": c},
              st.floats(0.01, 1e4), st.floats(0.05, 10)),
)  # fmt: skip
marginals = st.one_of(
    st.builds(lambda v: {"dist": "fixed", "value": v}, st.integers(1, 10**6)),
    st.builds(lambda m, s: {"dist": "lognormal", "median": m, "sigma": s},
              st.floats(1, 1e5), st.floats(0, 4)),
    st.builds(lambda m, c, hi: {"dist": "lognormal", "mean": m, "cv": c, "max": hi},
              st.floats(1, 1e5), st.floats(0.01, 5), st.integers(1, 10**5)),
)  # fmt: skip
lengths = st.one_of(
    st.sampled_from(sorted(BUNDLED_TABLES)),
    st.builds(lambda p, o: {"prompt": p, "output": o}, marginals, marginals),
)


@settings(max_examples=60, deadline=None)
@given(
    source=st.one_of(st.just("trace"), lengths),
    arrival=st.one_of(st.none(), arrivals),
    rate_scale=st.floats(0.01, 100),
    duration=st.one_of(st.none(), st.floats(0.001, 1e4)),
    max_requests=st.integers(1, 3000),
    repeat=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_stream_invariants(toy_trace, source, arrival, rate_scale, duration, max_requests,
                           repeat, seed) -> None:  # fmt: skip
    m: dict = {"rate_scale": rate_scale, "max_requests": max_requests, "duration": duration}
    if source == "trace":
        m |= {"trace": str(toy_trace), "repeat": repeat}
        if arrival is not None:
            m["arrival"] = arrival
    else:
        m |= {"lengths": source, "arrival": arrival or {"process": "poisson", "rate": 1.0}}
    reqs = run(m, seed)
    assert [r.id for r in reqs] == list(range(len(reqs)))
    assert len(reqs) <= max_requests
    times = [r.arrival_s for r in reqs]
    assert all(math.isfinite(t) and t >= 0 for t in times)
    assert all(a <= b for a, b in itertools.pairwise(times))
    if duration is not None:
        assert all(t < duration for t in times)
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in reqs)
    assert all(isinstance(r.prompt_tokens, int) and isinstance(r.output_tokens, int) for r in reqs)
    assert reqs == run(m, seed)


def test_an_arrival_without_a_process_says_it_is_missing():
    with pytest.raises(SpecError, match=r"arrival\.process: missing; expected one of poisson"):
        WorkloadSpec.from_mapping(
            {"lengths": "azure-conv", "arrival": {"rate": 4}, "max_requests": 10}, where="w"
        )


def test_length_tables_sample_exactly_as_scipys_ndtr_would():
    # the copula's CDF is taken without scipy; the integers drawn must be those
    # rint(interp(scipy.special.ndtr(z))) gives, tails and rounding ties included
    import numpy as np
    from scipy.special import ndtr, ndtri

    from twin.workload.lengths import _tokens_at, bundled_table

    table = bundled_table("azure-conv")
    z = np.random.default_rng(7).standard_normal(200_000) * 2.5
    for col in (table.prompt, table.output):
        want = np.rint(np.interp(ndtr(z), table.q, col))
        assert np.array_equal(_tokens_at(z, table.q, col), want)
    # 2 * cdf crosses 0.5 (round half to even: 0 below, 1 above) at cdf = 0.25:
    # draws right at it take the exact path
    q, col = np.array([0.0, 1.0]), np.array([0.0, 2.0])
    z = ndtri(0.25) + np.array([-1e-15, 0.0, 1e-15, 1e-13, -1e-13])
    assert np.array_equal(_tokens_at(z, q, col), np.rint(np.interp(ndtr(z), q, col)))
