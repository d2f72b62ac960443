"""The seed papers on their own setups (README, Fidelity): DistServe's (OSDI
2024, section 6, Fig. 8 chatbot) KV memory and its OPT-13B comparison with
vLLM in the bundled ``distserve-chatbot``; Splitwise's (ISCA 2024, section VI)
token stalls in the bundled ``splitwise-isopower``."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import twin
from twin.perf.gpus import get_gpu
from twin.perf.llm import get_model
from twin.serving.kvcache import kv_capacity_blocks
from twin.sim.spec import parse_yaml, read_spec_text
from twin.studies.sweep import Run, expand

TOKENS = "profiles/distserve/max_num_tokens.csv"


def _kv_tokens(model: str, tp: int, pp: int, utilization: float) -> int:
    m = get_model(model)
    return 16 * kv_capacity_blocks(
        gpu_memory_bytes=get_gpu("a100-80gb").memory_bytes,
        memory_utilization=utilization,
        weight_bytes=m.weight_bytes,
        activation_reserve_bytes=2 * 2**30,  # the engine's default reserve
        kv_bytes_per_token=m.kv_bytes_per_token_tp(tp),
        tp=tp,
        pp=pp,
        block_size=16,
    )


def test_kv_capacity_at_the_papers_memory_share_is_distserves_own_table(shared_data: Path):
    # DistServe's launch arguments give the engine 95% of each GPU
    # (evaluation/2-benchmark-serving/2-start-api-server.py); at that share the
    # twin's KV capacity is DistServe's measured max_num_tokens.csv, all 76 rows:
    # within 1% for OPT-13B and OPT-66B, 3.2% for OPT-175B. The KV capacity is
    # not what keeps a decode instance from the paper's goodput.
    rows = list(csv.DictReader((shared_data / TOKENS).open()))
    assert len(rows) == 76
    for r in rows:
        tp, pp, measured = int(r["tp"]), int(r["pp"]), int(r["max_num_tokens"])
        err = _kv_tokens(r["model"], tp, pp, 0.95) / measured - 1
        limit = 0.032 if r["model"].endswith("175b") else 0.01
        assert abs(err) <= limit, (r, err)
    # OPT-66B's decode at TP2 without pipeline stages holds 11,600 tokens (about
    # 11 ShareGPT requests): it runs out of KV memory, in the paper's table too;
    # the paper's placement, TP2 x PP2, holds 78,512.
    assert _kv_tokens("opt-66b", 2, 1, 0.95) == pytest.approx(11_600, rel=0.01)
    assert _kv_tokens("opt-66b", 2, 2, 0.95) == pytest.approx(78_512, rel=0.01)


def _runs(experiment: str) -> list[Run]:
    """The runs of a bundled sweep, each with its swept values and spec data."""
    text, where, base_dir = read_spec_text(experiment)
    return expand(parse_yaml(text, where), where, base_dir)[1]


def _rows(model: str) -> dict[str, dict]:
    runs = _runs("distserve-chatbot")
    return {r.params["tag.system"]: r.data for r in runs if r.params["tag.model"] == model}


def _attainment(data: dict, per_gpu_rate: float, gpus: int) -> float:
    data["workload"]["arrival"]["rate"] = per_gpu_rate * gpus
    return float(twin.run(data).summary["slo_attainment"])


def test_distserve_chatbot_opt13b_wins_per_gpu_on_its_engine(shared_data: Path, monkeypatch):
    # Fig. 8 (OPT-13B, chatbot): DistServe (prefill TP2 + decode TP1, 3 GPUs)
    # serves more per GPU than vLLM (TP1) at TTFT 0.25 s / TPOT 0.1 s for 90%
    # of the requests. At 0.8 req/s per GPU DistServe holds the SLOs and vLLM,
    # priced by its own engine's fit, does not; the same vLLM deployment on
    # DistServe's engine fit holds them: the engine, not the split, carries
    # the difference at this load.
    monkeypatch.setenv("TWIN_DATA", str(shared_data))
    rows = _rows("opt-13b")
    assert _attainment(rows["distserve"], 0.8, 3) >= 0.9
    assert _attainment(rows["vllm"], 0.8, 1) < 0.9
    assert _attainment(rows["vllm-on-distserve-fit"], 0.8, 1) >= 0.9


def test_splitwise_baseline_stalls_its_tokens_where_a_mean_tpot_does_not_see_it(
    shared_data: Path, monkeypatch
):
    # Splitwise (ISCA 2024, section VI-A) scores time between tokens by percentiles
    # of each request's mean gap; a stall inside a request averages away. On the
    # bundled iso-power setup at the same load, the chunked Baseline-H100 machines,
    # mixing 2,048-token prompt chunks into their decode iterations, make each
    # request's longest gap over twice the token machines': the stall a mean
    # hides.
    monkeypatch.setenv("TWIN_DATA", str(shared_data))
    out = {}
    for r in _runs("splitwise-isopower"):
        r.data["workload"].update(rate_scale=7.0, max_requests=500)
        out[r.params["tag.system"]] = twin.run(r.data).summary
    base, split = out["baseline-h100-chunked"], out["splitwise-hh-3-5"]
    assert base["slo_attainment"] >= 0.9 and split["slo_attainment"] >= 0.9
    assert base["max_itl_s"]["p50"] >= 2 * split["max_itl_s"]["p50"]


def test_splitwise_sweep_judges_the_papers_slowdown_slos_and_its_baselines_batching():
    # Splitwise (ISCA 2024, section VI-A) bounds the P50/P90/P99 slowdowns against a request
    # alone on a DGX-A100: TTFT 2x/3x/6x, time between tokens and E2E 1.25x/1.5x/5x (the
    # bounds of splitwise-sim's notebooks/plots.ipynb, get_slo)
    text, where, _ = read_spec_text("splitwise-isopower")
    sd = parse_yaml(text, where)["slo"]["slowdown"]
    assert (sd["gpu"], sd["tp"]) == ("a100-80gb", 8)
    assert sd["ttft"] == {"p50": 2, "p90": 3, "p99": 6}
    assert sd["tbt"] == sd["e2e"] == {"p50": 1.25, "p90": 1.5, "p99": 5}
    # its Baseline-H100 batches whole prompts (splitwise-sim's baseline start state)
    engines = {r.params["tag.system"]: r.data["engine"] for r in _runs("splitwise-isopower")}
    assert engines["baseline-h100"]["chunked_prefill"] is False
    assert engines["baseline-h100-chunked"]["chunked_prefill"] is True
