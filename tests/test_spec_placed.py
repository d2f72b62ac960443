"""Every check that needs to know where the instances run is done as the spec
resolves, so ``twin spec`` refuses what ``twin run`` refuses, with the same
one line: the instances fit the topology and leave room for a KV cache,
every fault target is a part of the cluster, a remote KV store sits on
a node of its own, and the perf model builds for every instance on the GPU
it is placed on."""

from __future__ import annotations

import re

import pytest

import schedulers.colocated  # registers the built-ins when not installed
import schedulers.disagg  # noqa: F401
from twin.cli import main
from twin.sim.spec import load_spec

TIERS = ["engine.prefix_caching=true", "kv_tiers.dram=1 TB"]

BAD = [
    ("disagg", ["events=[{at: 1 s, action: fail, node: 99}]"],
     r"disagg\.yaml: events\[0\]\.node: 99; instances run on nodes \[0, 1, 2, 3\]"),
    ("disagg", ["events=[{at: 1 s, action: fail, instance: 4}]"],
     r"disagg\.yaml: events\[0\]\.instance: 4; instances are 0\.\.3"),
    ("disagg", ["events=[{at: 1 s, action: degrade, gpu: 40, factor: 0.5}]"],
     r"disagg\.yaml: events\[0\]\.gpu: 40; instances run on GPUs 0\.\.31"),
    ("disagg", ["events=[{at: 1 s, action: fail, nic: n9.nic0}]"],
     r"disagg\.yaml: events\[0\]\.nic: 'n9\.nic0' is not a NIC of the topology"),
    ("disagg", ["events=[{at: 1 s, action: fail, link: n0.nic0 -> n1.nic0}]"],
     r"disagg\.yaml: events\[0\]\.link: 'n0\.nic0 -> n1\.nic0': "),
    ("quickstart", ["events=[{at: 1 s, action: fail, link: a -> b}]"],
     r"quickstart\.yaml: events\[0\]\.link: 'a -> b'; a link needs cluster\.topology"),
    ("quickstart", ["failures={random: [{component: nic, mtbf: 1 h, repair: 1 min}]}"],
     r"quickstart\.yaml: failures\.random\[0\]\.component: 'nic' needs cluster\.topology"),
    ("disagg", [*TIERS, "kv_tiers.remote={capacity: 1 TB, node: 99}"],
     r"disagg\.yaml: kv_tiers\.remote: node 99: the topology has nodes 0\.\.3"),
    ("disagg", [*TIERS, "kv_tiers.remote={capacity: 1 TB, node: 1}"],
     r"disagg\.yaml: kv_tiers\.remote: node 1 holds an instance; the store needs a node"),
    ("quickstart", [*TIERS, "kv_tiers.remote={capacity: 1 TB, node: 0}"],
     r"quickstart\.yaml: kv_tiers\.remote: the store is reached over the network"),
    ("disagg", ["cluster.prefill.instances=40"],
     r"disagg\.yaml: cluster: 42 instances need 336 GPUs in node-sized groups"),
    ("disagg", ["cluster.decode.tp=1"],
     r"disagg\.yaml: cluster\.decode: no memory left for the KV cache"),
    ("quickstart", ["model=llama-2-70b", "cluster.tp=1"],
     r"quickstart\.yaml: cluster: no memory left for the KV cache"),
    ("quickstart", ["perf={kind: roofline, moe_overlap_min_tokens: 10}"],
     r"quickstart\.yaml: perf\.moe_overlap_min_tokens: 10 acts only with moe_overlap: two-batch"),
]  # fmt: skip

# The perf model for each instance's GPU and shape: {table} is a profile
# table's path (the check refuses the kind before reading it), {data} the
# shared data folder.
WIDE_EP = [
    "model=deepseek-v3", "cluster.topology=dgx-h100-ib400", "cluster.nodes=8", "cluster.tp=1",
    "cluster.ep=16", "cluster.dp=16", "cluster.prefill={instances: 2}",
    "cluster.decode={instances: 1, ep: 32, dp: 32}", "scheduler.name=disagg",
]  # fmt: skip
BAD_PERF = [
    ("disagg", [*WIDE_EP, "perf={kind: profile, path: '{table}'}"],
     r"disagg\.yaml: perf\.kind: profile has no expert parallelism; use kind: roofline"),
]  # fmt: skip
BAD_TABLES = [
    ("quickstart",
     ["perf={kind: distserve, path: '{data}/profiles/distserve/profiler-a100-80g.distserve.json'}"],
     r"quickstart\.yaml: perf: .*profiler-a100-80g\.distserve\.json: no fit for "
     r"model='llama-3\.1-70b' tp=8"),
    ("quickstart", ["perf={kind: profile, path: '{data}/profiles/splitwise_sim/perf_model.csv'}"],
     r"quickstart\.yaml: perf: .*perf_model\.csv: no rows for model='llama-3\.1-70b' "
     r"hardware='h100-sxm' tp=8"),
]  # fmt: skip


def _error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and err.count("\n") == 1, err
    return err


def _refusals(capsys, spec: str, sets: list[str]) -> tuple[str, str]:
    """The error lines of `twin spec` and `twin run` for ``spec`` with ``sets``."""
    args = [a for s in [*sets, "workload.max_requests=5"] for a in ("--set", s)]
    return _error(capsys, "spec", spec, *args), _error(capsys, "run", spec, *args)


@pytest.mark.parametrize(("spec", "sets", "message"), BAD, ids=[m[:40] for *_, m in BAD])
def test_twin_spec_and_twin_run_refuse_it_with_the_same_line(capsys, spec, sets, message):
    said, run = _refusals(capsys, spec, sets)
    assert re.search(message, said), said
    assert run == said


@pytest.mark.parametrize(("spec", "sets", "message"), BAD_PERF, ids=[m[:40] for *_, m in BAD_PERF])
def test_a_perf_model_that_cannot_serve_an_instance_is_refused_alike(
    capsys, tmp_path, spec, sets, message
):
    table = tmp_path / "table.csv"
    table.write_text("")
    said, run = _refusals(capsys, spec, [s.replace("{table}", str(table)) for s in sets])
    assert re.search(message, said), said
    assert run == said


@pytest.mark.parametrize(
    ("spec", "sets", "message"), BAD_TABLES, ids=[m[:40] for *_, m in BAD_TABLES]
)
def test_a_table_without_rows_for_an_instance_is_refused_alike(
    capsys, shared_data, spec, sets, message
):
    said, run = _refusals(capsys, spec, [s.replace("{data}", str(shared_data)) for s in sets])
    assert re.search(message, said), said
    assert run == said


def test_a_resolved_spec_carries_where_its_instances_run():
    spec = load_spec("disagg")
    assert [(p.instance, p.node, p.gpus) for p in spec.placements] == [
        (i, i, tuple(range(8 * i, 8 * i + 8))) for i in range(4)
    ]
    assert len(load_spec("quickstart").placements) == load_spec("quickstart").instances
