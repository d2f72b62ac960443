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
