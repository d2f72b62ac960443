"""Declared spec sections: the generic reader, defaults that live once, and the
checks a spec gets when it is loaded (scheduler parameters, ``perf:`` keys)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

import schedulers.colocated  # registers the built-ins when not installed
import schedulers.disagg
import schedulers.splitwise  # noqa: F401
from twin._declare import (
    BOOL,
    POSITIVE_INT,
    choice,
    declarations,
    declared,
    keys,
    nbytes,
    read,
    schema,
    seconds,
)
from twin.cli import main
from twin.errors import SpecError, TwinError, UnknownNameError
from twin.serving.engine import EngineConfig
from twin.serving.handoff import TransferConfig
from twin.serving.queuepolicy import QueuePolicyChoice
from twin.serving.speculative import SpeculativeConfig
from twin.sim.metrics import SLO
from twin.sim.spec import ClusterKeys, TopKeys, load_spec, resolve_spec
from twin.workload.sessions import Retention


@dataclass(frozen=True)
class Toy:
    """A section for the reader's own tests."""

    count: int = declared(2, POSITIVE_INT, "how many")
    size_bytes: float = declared("1 KiB", nbytes(), "how big", key="size")
    wait_s: float = declared(None, seconds(), "how long", key="wait", unset=math.inf)
    mode: str = declared("a", choice("a", "b"), "which one")
    limit: int = declared(10, POSITIVE_INT, "a cap, null for the default", nullable=True)


# -- the reader ----------------------------------------------------------------------
def test_left_out_keys_take_their_defaults_and_units_stay_as_written():
    r = read(Toy, {"count": 3}, "t.yaml: toy")
    assert r.value == Toy(count=3, size_bytes=1024.0, wait_s=math.inf, mode="a", limit=10)
    assert r.written == {"count": 3, "size": "1 KiB", "wait": None, "mode": "a", "limit": 10}
    assert r.given == {"count"}
    assert read(Toy, None, "t.yaml: toy").value == Toy()


def test_values_with_units_are_parsed_and_kept_as_written():
    r = read(Toy, {"size": "2 GiB", "wait": "250 ms"}, "t.yaml: toy")
    assert (r.value.size_bytes, r.value.wait_s) == (2 * 2**30, pytest.approx(0.25))
    assert (r.written["size"], r.written["wait"]) == ("2 GiB", "250 ms")
    assert read(Toy, {"size": 512, "wait": 2}, "t").value.size_bytes == 512.0


def test_a_null_on_a_nullable_key_means_left_out():
    r = read(Toy, {"limit": None}, "t.yaml: toy")
    assert r.value.limit == 10 and "limit" not in r.given
    with pytest.raises(SpecError, match=r"^t\.yaml: toy\.count: None must be a positive integer$"):
        read(Toy, {"count": None}, "t.yaml: toy")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"cont": 1}, "t.yaml: toy: unknown key 'cont'. Did you mean 'count'? "
                      "Expected one of count, size, wait, mode, limit"),
        ({"count": 0}, "t.yaml: toy.count: 0 must be a positive integer"),
        ({"count": True}, "t.yaml: toy.count: True must be a positive integer"),
        ({"count": "3"}, "t.yaml: toy.count: '3' must be a positive integer"),
        ({"size": "lots"}, "t.yaml: toy.size: 'lots' is not a size; expected a number with a "
                           "unit such as B, KiB, MiB, GiB, TiB, kB, MB, GB, TB, Gb, Gib"),
        ({"size": "-1 KiB"}, "t.yaml: toy.size: '-1 KiB' must be >= 0"),
        ({"wait": "1 parsec"}, "t.yaml: toy.wait: '1 parsec' is not a duration; expected a "
                               "number with one of s, ms, us, ns, min, h"),
        ({"wait": 0}, "t.yaml: toy.wait: 0 must be > 0"),
        ({"mode": "c"}, "t.yaml: toy.mode: 'c'; expected one of a, b"),
        ([1, 2], "t.yaml: toy: [1, 2] must be a mapping"),
    ],
)  # fmt: skip
def test_bad_values_name_the_file_the_key_and_the_value(data, message):
    with pytest.raises(SpecError) as e:
        read(Toy, data, "t.yaml: toy")
    assert str(e.value) == message


def test_one_declared_field_is_a_new_key_everywhere():
    @dataclass(frozen=True)
    class Toy2(Toy):
        fresh: bool = declared(False, BOOL, "a key added in one line")

    assert keys(Toy2) == (*keys(Toy), "fresh")
    assert read(Toy2, {"fresh": True}, "t").value.fresh is True
    assert read(Toy2, {}, "t").written["fresh"] is False
    s = schema(Toy2)["properties"]["fresh"]
    assert s == {"type": "boolean", "default": False, "description": "a key added in one line"}
    with pytest.raises(SpecError, match="t.fresh: 1 must be true or false"):
        read(Toy2, {"fresh": 1}, "t")


def test_schema_of_a_section_carries_help_defaults_units_and_bounds():
    s = schema(Toy)
    assert s["type"] == "object" and s["additionalProperties"] is False
    assert s["description"] == "A section for the reader's own tests."
    p = s["properties"]
    assert p["count"] == {"type": "integer", "exclusiveMinimum": 0, "default": 2,
                          "description": "how many"}  # fmt: skip
    assert p["size"]["default"] == "1 KiB" and p["size"]["x-unit"] == "bytes"
    assert p["wait"]["x-unit"] == "s" and "default" not in p["wait"]
    assert p["mode"]["enum"] == ["a", "b"]
    assert p["limit"]["anyOf"][1] == {"type": "null"}


# -- the spec's sections -------------------------------------------------------------
BASE = {
    "model": "llama-3.1-8b",
    "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                 "max_requests": 10},
}  # fmt: skip


def resolve(**over):
    return resolve_spec({**BASE, **over}, "s.yaml", Path.cwd())


def test_engine_defaults_live_in_engine_config_alone():
    spec = resolve()
    assert spec.engine == EngineConfig()
    assert spec.transfer == TransferConfig()
    assert dataclasses.replace(spec.slo) == SLO()
    assert spec.resolved["engine"] == {
        "block_size": 16,
        "max_num_seqs": 256,
        "max_batched_tokens": 8192,
        "chunked_prefill": False,
        "watermark": 0.01,
        "gpu_memory_utilization": 0.9,
        "activation_reserve": "2 GiB",
        "oversized": "error",
        "fast_forward": True,
        "prefix_caching": False,
        "max_model_len": None,
    }
    # every key but queue_policy, speculative and session_retention, written only
    # when given (results of specs without them read as before the keys came)
    later = ("queue_policy", "speculative", "session_retention")
    assert list(spec.resolved["engine"]) == [k for k in keys(EngineConfig) if k not in later]
    assert (spec.memory_utilization, spec.activation_reserve_bytes, spec.oversized) == (
        0.9, 2 * 2**30, "error")  # fmt: skip
    assert spec.resolved["slo"] == {
        "ttft": None, "tpot": None, "target": 0.9, "ttft_at": "decode", "client_latency": "0 s",
    }  # fmt: skip
    assert spec.resolved["transfer"] == {"mode": "serialized", "handoff": "push",
                                         "multi_nic": False, "control_rtt": "0 s",
                                         "registration": "0 s", "per_descriptor": "2 us",
                                         "router_hop": "1 ms", "descriptors": "layer"}  # fmt: skip


def test_every_declared_engine_key_is_read_from_yaml():
    given = {"block_size": 32, "max_num_seqs": 8, "max_batched_tokens": 512,
             "chunked_prefill": True, "watermark": 0.0, "gpu_memory_utilization": 0.8,
             "activation_reserve": "1 GiB", "oversized": "reject", "fast_forward": False,
             "prefix_caching": True, "max_model_len": 1024,
             "queue_policy": {"name": "priority"},
             "speculative": {"method": "ngram", "k": 2, "acceptance": 0.5},
             # keep: the other policies need a session workload (tests/test_sessions.py)
             "session_retention": {"policy": "keep"}}  # fmt: skip
    assert set(given) == set(keys(EngineConfig))
    spec = resolve(engine=given)
    assert spec.resolved["engine"] == given
    assert spec.engine == EngineConfig(
        32, 8, 512, True, 0.0, 0.8, 2**30, "reject", False, True, 1024,
        QueuePolicyChoice("priority", {}), SpeculativeConfig("ngram", 2, (0.5, 0.25)),
        Retention("keep"),
    )  # fmt: skip


def test_max_batched_tokens_follows_chunked_prefill_unless_given():
    assert resolve(engine={"chunked_prefill": True}).engine.max_batched_tokens == 2048
    spec = resolve(engine={"chunked_prefill": True, "max_batched_tokens": None})
    assert spec.resolved["engine"]["max_batched_tokens"] == 2048
    assert resolve(engine={"chunked_prefill": True, "max_batched_tokens": 4096}).engine == (
        EngineConfig(chunked_prefill=True, max_batched_tokens=4096)
    )


def test_slo_durations_parse_and_stay_as_written():
    spec = resolve(slo={"ttft": "250 ms", "tpot": 0.05, "target": 1})
    assert (spec.slo.ttft_s, spec.slo.tpot_s, spec.slo.target) == (0.25, 0.05, 1.0)
    assert spec.resolved["slo"] == {"ttft": "250 ms", "tpot": 0.05, "target": 1.0,
                                    "ttft_at": "decode", "client_latency": "0 s"}  # fmt: skip


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"sed": 1}, "s.yaml: unknown key 'sed'. Did you mean 'seed'?"),
        ({"seed": -1}, "s.yaml: seed: -1 must be a non-negative integer"),
        ({"model": None, "engine": {}}, "s.yaml: model: None is neither a model name"),
        ({"engine": {"chunked_prefill": "yes"}},
         "s.yaml: engine.chunked_prefill: 'yes' must be true or false"),
        ({"engine": {"watermark": 1}}, "s.yaml: engine.watermark: 1 must be in [0, 1)"),
        ({"engine": {"activation_reserve": "-1 GiB"}},
         "s.yaml: engine.activation_reserve: '-1 GiB' must be >= 0"),
        ({"transfer": {"mode": "layerwise", "handoff": "pull"}},
         "s.yaml: transfer: mode 'layerwise' streams KV while it is produced"),
        ({"cluster": {"prefill": {"instances": 0}, "decode": 1}},
         "s.yaml: cluster.prefill.instances: 0 must be a positive integer"),
        ({"cluster": {"kv_pool": "0 GiB"}}, "s.yaml: cluster.kv_pool: '0 GiB' must be > 0"),
        ({"cluster": {"kv_pool": "1 GiB"}}, "s.yaml: cluster.kv_pool: needs cluster.topology"),
        ({"cluster": {"kv_pool_ssd": "-4 TB"}}, "s.yaml: cluster.kv_pool_ssd: '-4 TB' must be > 0"),
        ({"cluster": {"kv_pool_ssd": "4 TB"}},
         "s.yaml: cluster.kv_pool_ssd: is below the DRAM pool; give cluster.kv_pool too"),
        ({"cluster": {"kv_pool_ssd_read_bandwidth": "fast"}},
         "s.yaml: cluster.kv_pool_ssd_read_bandwidth: 'fast'"),
        ({"cluster": {"topology": "dgx-h100-ib400", "kv_pool": "1 GiB",
                      "kv_pool_ssd_latency": "1 ms"}},
         "s.yaml: cluster.kv_pool_ssd_latency: needs cluster.kv_pool_ssd"),
        ({"slo": {"target": 0}}, "s.yaml: slo.target: 0 must be in (0, 1]"),
    ],
)  # fmt: skip
def test_spec_errors_name_the_file_the_key_and_the_value(over, message):
    with pytest.raises(SpecError) as e:
        resolve(**over)
    assert str(e.value).startswith(message), str(e.value)


def test_required_keys_say_how_to_give_them():
    with pytest.raises(SpecError, match=r"^s\.yaml: model: missing; name a catalog model"):
        resolve_spec({"workload": BASE["workload"]}, "s.yaml", Path.cwd())
    with pytest.raises(SpecError, match=r"^s\.yaml: workload: missing; give a trace"):
        resolve_spec({"model": "llama-3.1-8b", "workload": None}, "s.yaml", Path.cwd())


def test_the_key_lists_come_from_the_declarations():
    assert keys(TopKeys) == ("name", "description", "seed", "model", "gpu", "cluster", "engine",
                             "perf", "scheduler", "workload", "slo", "transfer", "events",
                             "retry", "failures", "scaling", "output", "kv_tiers",
                             "models", "gpu_budget")  # fmt: skip
    assert keys(ClusterKeys) == ("instances", "gpus", "tp", "pp", "ep", "dp", "gpus_per_node",
                                 "topology", "nodes", "prefill", "decode", "placement",
                                 "kv_pool", "kv_pool_ssd", "kv_pool_ssd_read_bandwidth",
                                 "kv_pool_ssd_write_bandwidth",
                                 "kv_pool_ssd_latency")  # fmt: skip
    for cls in (TopKeys, ClusterKeys, EngineConfig, TransferConfig, SLO):
        assert all(d.help for _, d in declarations(cls)), cls


# -- checked when loaded -------------------------------------------------------------
@pytest.mark.parametrize(
    ("sets", "error", "message"),
    [
        (["scheduler.name=colocatd"], UnknownNameError,
         "quickstart.yaml: scheduler.name: unknown scheduler 'colocatd'. "
         "Did you mean 'colocated'?"),
        (["scheduler=colocatd"], UnknownNameError,
         "quickstart.yaml: scheduler: unknown scheduler 'colocatd'."),
        (["scheduler.routng=x"], SpecError,
         "quickstart.yaml: scheduler.routng: unknown parameter of scheduler 'colocated'; "
         "expected one of routing"),
        (["scheduler.routing=random"], SpecError,
         "quickstart.yaml: scheduler.routing: 'random'; expected one of least_loaded"),
        (["scheduler.name=5"], SpecError, "quickstart.yaml: scheduler.name: 5 must be a string"),
        (["scheduler={name: splitwise, tick_interval: 0 ms}"], SpecError,
         "quickstart.yaml: scheduler.tick_interval: '0 ms' must be > 0"),
        (["scheduler={name: disagg, decode_at: never}"], SpecError,
         "quickstart.yaml: scheduler.decode_at: 'never'; expected one of prefill_end, arrival"),
    ],
)  # fmt: skip
def test_scheduler_parameters_are_checked_when_the_spec_is_loaded(sets, error, message):
    with pytest.raises(error) as e:
        load_spec("quickstart", sets)
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize(
    ("perf", "error", "message"),
    [
        ("{kind: roofline, mfuu: 0.4}", SpecError,
         "quickstart.yaml: perf: unknown key 'mfuu' for kind roofline; expected one of kind, mfu"),
        ("{kind: table}", SpecError,
         "quickstart.yaml: perf.kind: 'table'; expected one of roofline, profile, distserve"),
        ("{mfu: 0.5}", SpecError, "quickstart.yaml: perf.kind: None; expected one of"),
        ("{kind: roofline, mfu: 1.5}", SpecError,
         "quickstart.yaml: perf.mfu: 1.5 must be in (0, 1]"),
        ("{kind: roofline, overhead: 3 parsec}", SpecError,
         "quickstart.yaml: perf.overhead: '3 parsec' is not a duration"),
        ("{kind: roofline, throttle_knee: -1 s}", SpecError,
         "quickstart.yaml: perf.throttle_knee: '-1 s' must be >= 0"),
        ("{kind: roofline, engine: distserv}", UnknownNameError,
         "quickstart.yaml: perf.engine: unknown serving engine 'distserv'. "
         "Did you mean 'distserve'?"),
        ("{kind: profile}", SpecError, "quickstart.yaml: perf.path: missing; expected a file path"),
        ("{kind: profile, path: no-such.csv}", SpecError, "quickstart.yaml: perf.path: '"),
        ("{kind: distserve, path: 5}", SpecError,
         "quickstart.yaml: perf.path: 5; expected a file path"),
        ("{kind: distserve, path: fit.json, token_overhead: -1 us}", SpecError,
         "quickstart.yaml: perf.token_overhead: '-1 us' must be >= 0"),
        ("{kind: distserve, path: fit.json, ray_overhead: 2 ms}", SpecError,
         "quickstart.yaml: perf: unknown key 'ray_overhead' for kind distserve"),
        ("{kind: profile, path: no.csv, hardwre: h100}", SpecError,
         "quickstart.yaml: perf: unknown key 'hardwre' for kind profile"),
    ],
)  # fmt: skip
def test_perf_keys_are_checked_when_the_spec_is_loaded(perf, error, message):
    with pytest.raises(error) as e:
        load_spec("quickstart", [f"perf={perf}"])
    assert str(e.value).startswith(message), str(e.value)


def test_a_profile_table_is_found_and_read_when_the_spec_resolves(tmp_path):
    # the table is read as the spec resolves (twin/sim/layout.py: check_perf), so
    # twin spec refuses a bad one as twin run does
    (tmp_path / "prof.csv").write_text("not a table yet\n")
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({**BASE, "perf": {"kind": "profile", "path": "prof.csv",
                                                 "format": "native", "tp": 1}}))  # fmt: skip
    with pytest.raises(TwinError, match="prof.csv: header"):  # found beside the spec, read
        load_spec(str(spec))
    with pytest.raises(SpecError, match=f"{spec}: perf.tp: 0 must be a positive integer"):
        load_spec(str(spec), ["perf.tp=0"])  # the key is checked before the table is read
    (tmp_path / "prof.csv").write_text("phase,batch_size,tokens,context,time_s\n")
    with pytest.raises(TwinError, match="prof.csv"):  # read, and holds nothing to serve with
        load_spec(str(spec))


def test_twin_spec_prints_the_resolved_spec_and_its_hash(capsys):
    assert main(["spec", "quickstart", "--set", "seed=3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    spec = load_spec("quickstart", ["seed=3"])
    assert doc == {"spec": json.loads(json.dumps(spec.resolved)), "spec_sha256": spec.sha256}
    assert main(["spec", "compare-mooncake"]) == 2
    assert "has compare:" in capsys.readouterr().err
