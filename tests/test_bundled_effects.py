"""The bundled experiments run on models whose context fits their traffic,
nothing but the question they ask shapes them, and each shows the effect it
is named for (read from the run itself, not from its comments)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import schedulers.colocated
import schedulers.disagg  # noqa: F401
from twin.sim.simulation import run

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
# The seed papers' reproductions run the papers' own models on purpose.
PAPERS = {"distserve-chatbot", "splitwise-isopower"}
SHORT_CONTEXT = ("llama-2-", "opt-")  # 4,096 and 2,048 tokens: Azure conversations overflow them


def windows(rows: list[dict[str, Any]], key: str, lo: float, hi: float) -> list[float]:
    """``key`` of the timeline windows starting in [lo, hi) that have a value."""
    return [r[key] for r in rows if lo <= r["start_s"] < hi and r[key] is not None]


@pytest.mark.parametrize(
    "path", sorted(p for p in EXPERIMENTS.glob("*.yaml") if p.stem not in PAPERS), ids=str
)
def test_no_bundled_experiment_outside_the_papers_runs_a_short_context_model(path):
    text = yaml.safe_load(path.read_text())
    models = [
        text.get("model", ""),
        *(m.get("model", "") for m in (text.get("models") or {}).values()),
    ]
    for entry in (text.get("compare") or {}).values():
        models.append((entry or {}).get("model", "") if isinstance(entry, dict) else "")
    assert not [m for m in models if str(m).lower().startswith(SHORT_CONTEXT)], path.name


def assert_no_limit(s: dict[str, Any]) -> None:
    assert s["rejected"] == 0 and s["truncated"] == 0 and s["preemptions"] == 0
    assert "warnings" not in s and s.get("failed", 0) == 0


@pytest.mark.parametrize("name", ["quickstart", "disagg", "link-flap", "node-failure"])
def test_a_bundled_experiment_is_shaped_by_no_limit(name):
    assert_no_limit(run(name).summary)  # diurnal: checked where it runs below


def test_disagg_shows_the_interference_the_colocated_quickstart_suffers():
    # the same 32 GPUs, traffic and seed: colocated decode steps wait behind
    # the prompts batched with them, split ones never run beside a prompt
    split, mixed = run("disagg").summary, run("quickstart").summary
    assert split["requests"] == mixed["requests"]
    assert split["max_itl_s"]["p99"] < 0.1 * mixed["max_itl_s"]["p99"]
    assert split["max_itl_s"]["p99"] < 1.1 * split["tpot_s"]["p99"]
    assert mixed["max_itl_s"]["p50"] > 3 * mixed["tpot_s"]["p50"]


def test_link_flap_shows_each_flap_in_ttft_and_attainment_and_recovers():
    result = run("link-flap").to_dict()
    rows, s = result["timeline"], result["summary"]
    calm = run("link-flap", overrides=["events=[]"]).summary
    assert calm["slo_attainment"] == 1.0 and s["slo_attainment"] < calm["slo_attainment"]
    for t in (30, 50, 70):  # node 0's NICs down from t to t + 2 s
        assert max(windows(rows, "ttft_p99_s", t, t + 10)) > 1.0
        assert min(windows(rows, "slo_attainment", t, t + 10)) < 0.97
    assert max(windows(rows, "ttft_p99_s", 0, 20) + windows(rows, "ttft_p99_s", 80, 1e9)) < 0.5
    assert min(windows(rows, "slo_attainment", 80, 1e9)) == 1.0
    assert s["failed"] == 0 and len(result["fault_log"]) == 48  # 8 NICs x 3 flaps x 2


def test_node_failure_shows_the_failure_and_the_recovery():
    rows = run("node-failure").to_dict()["timeline"]
    assert windows(rows, "instances_prefill", 30, 40) == [1.0]  # node 0 down from 30 s
    assert max(windows(rows, "slo_attainment", 30, 40)) < 0.5
    assert min(windows(rows, "slo_attainment", 0, 30)) == 1.0
    assert min(windows(rows, "slo_attainment", 50, 1e9)) == 1.0  # back, empty, at 45 s


def test_diurnal_follows_the_load_and_its_peak_overloads_what_the_flat_rate_does_not():
    day = run("diurnal", overrides=["output.window=2 min"]).to_dict()
    assert_no_limit(day["summary"])
    # the flat rate is the same all day: a quarter of it tells
    flat = run("diurnal", overrides=["workload.rate_schedule=null", "workload.duration=5 min"])
    rows = day["timeline"]
    trough, peak = windows(rows, "tpot_p99_s", 0, 120), windows(rows, "tpot_p99_s", 540, 660)
    assert min(peak) > 2 * max(trough)  # TPOT follows the load
    assert min(windows(rows, "slo_attainment", 540, 660)) < 0.5
    assert min(windows(rows, "slo_attainment", 0, 240)) == 1.0
    assert flat.summary["slo_attainment"] > 0.99 > day["summary"]["slo_attainment"] + 0.1


# 72,000 requests twice (about 35 s); the budget's rule itself is held in the default run by
# test_multimodel.py's test_the_shared_budget_grants_the_model_under_pressure_and_never_exceeds_it
@pytest.mark.slow
def test_multi_model_moves_gpus_to_the_model_at_its_peak():
    """Two models with opposite diurnal loads on 8 GPUs: a static 4 + 4 split
    cannot serve either model's peak; the planners within the shared budget
    drain the model in its trough and start instances of the one at its peak,
    meeting more of both SLOs on fewer GPU-seconds."""
    from twin.studies.compare import run_compare

    runs = run_compare("multi-model", quiet=True).runs
    static, shared = runs["static"].summary, runs["shared"].summary
    assert static["requests"] == shared["requests"]
    for s in (static, shared):
        assert_no_limit({k: v for k, v in s.items() if k != "warnings"})
        per = s["models"]
        assert per["chat"]["gpu_seconds"] + per["code"]["gpu_seconds"] == pytest.approx(
            s["gpu_seconds"]
        )
    assert shared["slo_attainment"] > static["slo_attainment"] + 0.15
    assert shared["gpu_seconds"] < 0.95 * static["gpu_seconds"]
    # the model that overloads its static half gains most; neither loses much
    chat, code = (shared["models"][m]["slo_attainment"] - static["models"][m]["slo_attainment"]
                  for m in ("chat", "code"))  # fmt: skip
    assert chat > 0.3 and code > -0.05


# -- the experiments on the shipped engine preset (perf.engine: vllm) ----------------------
AZURE = "traces/azure_llm_2023/AzureLLMInferenceTrace_{}.csv"
MOONCAKE = "traces/mooncake_fast25/conversation_trace.jsonl"


# Mooncake's admission control (schedulers/mooncake.py): a policy's choice, not a limit
MOONCAKE_REJECTS = {"predicted_ttft", "predicted_decode_overload"}


def no_limit_but(s: dict[str, Any], policy: set[str] | frozenset[str] = frozenset()) -> None:
    """No limit shaped the run: none of its warnings, nothing truncated,
    preempted or failed, and nothing rejected but for a reason in ``policy``
    (an admission control's own)."""
    assert "warnings" not in s and s["truncated"] == 0 and s["preemptions"] == 0
    assert s.get("failed", 0) == 0
    assert set(s["rejected_by_reason"]) <= policy, s["rejected_by_reason"]


def compare(name: str, overrides: list[str], only: list[str] | None = None) -> dict[str, Any]:
    """Each entry's result (label -> Result), each checked to be shaped by no limit."""
    from twin.studies.compare import run_compare

    done = run_compare(name, overrides=overrides, only=only, quiet=True)
    for label, r in done.runs.items():
        no_limit_but(r.summary, MOONCAKE_REJECTS if label.startswith("mooncake") else set())
    return done.runs


def summaries(name: str, overrides: list[str], only: list[str] | None = None) -> dict[str, Any]:
    return {label: r.summary for label, r in compare(name, overrides, only).items()}


@pytest.mark.slow  # four policies over the whole experiment (about 15 s)
def test_compare_azure_conv_shows_each_policy_its_own_way(shared_data):
    s = summaries("compare-azure-conv", [f"workload.trace={shared_data / AZURE.format('conv')}"])
    col, dist, split, moon = s["colocated"], s["distserve"], s["splitwise"], s["mooncake"]
    slo_tpot, slo_ttft = 0.050, 1.0
    # colocated misses its TPOT SLO at the tail, the split policies hold it
    assert col["tpot_s"]["p99"] > slo_tpot > max(x["tpot_s"]["p99"] for x in (dist, split, moon))
    assert split["slo_attainment"] > 0.99 and col["slo_attainment"] < 0.98
    # distserve's pull hand-off costs TTFT; mooncake turns late requests away instead
    assert dist["ttft_s"]["p99"] > 3 * slo_ttft > 3 * split["ttft_s"]["p99"]
    assert moon["rejected_by_reason"]["predicted_ttft"] > 10 and moon["ttft_s"]["p99"] < 1.5
    assert col["rejected"] == dist["rejected"] == split["rejected"] == 0


def test_compare_mooncake_runs_distserve_past_its_knee_and_keeps_split_tpot_flat(shared_data):
    s = summaries("compare-mooncake", [f"workload.trace={shared_data / MOONCAKE}"])
    col, dist, split, moon = s["colocated"], s["distserve"], s["splitwise"], s["mooncake"]
    assert dist["ttft_s"]["p99"] > 30 and dist["slo_attainment"] < 0.8  # two prefill instances
    assert min(x["slo_attainment"] for x in (col, split, moon)) > 0.95
    assert max(dist["tpot_s"]["p50"], moon["tpot_s"]["p50"]) < 0.6 * col["tpot_s"]["p50"]
    assert moon["rejected_by_reason"]["predicted_ttft"] > 0


def test_compare_kv_tiers_reuses_more_below_hbm_and_by_routing(shared_data):
    only = ["round-robin", "llm-d", "llm-d+tiers", "mooncake", "mooncake+pool"]
    sets = [f"workload.trace={shared_data / MOONCAKE}", "workload.max_requests=1000"]
    s = summaries("compare-kv-tiers", sets, only)
    reuse = {label: x["prefix_hit_rate"] for label, x in s.items()}
    assert reuse["llm-d"] > 1.5 * reuse["round-robin"]  # KV-aware routing finds the prefixes
    assert reuse["llm-d+tiers"] > reuse["llm-d"] + 0.02  # DRAM and SSD keep what HBM drops
    assert s["llm-d+tiers"]["kv_tiers"]["dram"]["hit_rate"] > 0.01
    assert reuse["mooncake+pool"] > 1.5 * reuse["mooncake"]  # the store any instance reads
    assert s["mooncake+pool"]["ttft_s"]["p50"] < 0.5 * s["mooncake"]["ttft_s"]["p50"]


def test_deepseek_wide_ep_holds_tpot_where_colocated_ep_misses_it():
    s = summaries("deepseek-wide-ep", [])
    split, mixed = s["disagg"], s["colocated"]
    assert split["rejected"] == mixed["rejected"] == 0
    assert split["slo_attainment"] > 0.99 and mixed["slo_attainment"] < 0.5
    assert split["tpot_s"]["p99"] < 0.030 < mixed["tpot_s"]["p50"]  # the 30 ms TPOT SLO


@pytest.mark.slow  # ten simulated minutes twice (about 15 s)
def test_diurnal_autoscale_follows_the_peak_on_fewer_gpu_seconds():
    runs = compare("diurnal-autoscale", [])
    static, planned = runs["static"].summary, runs["sla-planner"].summary
    assert static["rejected"] == planned["rejected"] == 0
    assert min(static["slo_attainment"], planned["slo_attainment"]) > 0.99
    assert planned["gpu_seconds"] < 0.7 * static["gpu_seconds"]
    rows = runs["sla-planner"].timeline_rows  # it starts at 1P + 1D, the peak at 5 min
    start, peak, end = (windows(rows, "gpus_up", lo, lo + 60) for lo in (0, 270, 540))
    assert max(start) == 2 and min(peak) > 4 and min(end) < max(peak)  # up and down again


def test_mooncake_conv_replays_the_whole_trace_and_its_prompts_stall_decode(shared_data):
    s = run("mooncake-conv", overrides=[f"workload.trace={shared_data / MOONCAKE}"]).summary
    assert_no_limit(s)
    assert s["requests"] == s["completed"] == 12_031
    # long prompts, chunked beside the decodes: the tail steps wait behind their chunks
    assert s["max_itl_s"]["p50"] > 3 * s["tpot_s"]["p50"]
    assert s["tpot_s"]["p99"] > 3 * s["tpot_s"]["p50"]


def test_pool_ratio_knees_lie_inside_its_rates_and_the_report_says_when_not(shared_data, tmp_path):
    import csv

    from twin.sim.spec import read_spec
    from twin.studies.sweep import Executor, run_sweep
    from twin.viz.knees import knee_notes

    study, where, base_dir = read_spec("pool-ratio")
    rates = study["sweep"]["workload.rate_scale"]
    # at the spec's own SLO pair (1 s / 50 ms): the ratios the code trace tells
    # apart, and the conversation trace's two highest knees
    deployments = {("code", "9+3"), ("code", "4+8"), ("conv", "9+3"), ("conv", "colocated")}
    runs = {}
    for trace, deployment in sorted(deployments):
        data = dict(study, sweep={"workload.rate_scale": rates})
        data["workload"] = dict(study["workload"], trace=str(shared_data / AZURE.format(trace)))
        data["cluster"] = dict(study["cluster"])
        if deployment == "colocated":
            data["scheduler"], data["cluster"]["instances"] = "colocated", 12
        else:
            prefill, decode = (int(n) for n in deployment.split("+"))
            data["cluster"].update(prefill={"instances": prefill}, decode={"instances": decode})
        out = tmp_path / f"{trace}-{deployment}"
        run_sweep(data, where, base_dir, out, executor=Executor(jobs=1))
        runs[trace, deployment] = list(csv.DictReader((out / "runs.csv").open()))
        assert knee_notes(runs[trace, deployment], 0.9) == [], (trace, deployment)  # inside
    # cut at 8x, the colocated conversation knee is censored and the report says so
    low = [r for r in runs["conv", "colocated"] if float(r["workload.rate_scale"]) <= 8]
    (note,) = knee_notes(low, 0.9)
    assert "censored" in note and "at or above 8" in note
    # the code trace's long prompts want prefill: 9 + 3 holds where 4 + 8 does not
    at = {k: {float(r["workload.rate_scale"]): float(r["slo_attainment"]) for r in v}
          for k, v in runs.items()}  # fmt: skip
    assert at["code", "9+3"][3] > 0.9 > at["code", "4+8"][3] + 0.3
