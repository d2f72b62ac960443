"""What is bundled (twin models | gpus | topologies | experiments), every
subcommand's --help, and model names: aliases, files and inline mappings."""

from __future__ import annotations

import argparse
import json
import shlex

import pytest
import yaml

from twin.bundled import bundled_names
from twin.cli import EXAMPLES, build_parser, main
from twin.errors import UnknownNameError
from twin.perf.gpus import get_gpu, gpu_names
from twin.perf.llm import HF_IDS, MODELS, get_model, normal_model_name

TINY = {"name": "tiny", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16,
        "intermediate": 128, "vocab": 100, "params": 1000}  # fmt: skip


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_argument_has_help_and_every_subcommand_an_example():
    subs = _subparsers()
    assert set(EXAMPLES) == set(subs)
    for name, sp in subs.items():
        for action in sp._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and action.help.strip(), (name, action.dest)
        assert sp.description, name
        epilog = sp.epilog or ""
        examples = [line.strip() for line in epilog.splitlines()[1:]]
        assert epilog.startswith("examples:") and examples, name
        for line in examples:
            assert line.startswith(f"twin {name}"), line
            # each example is a command line the parser accepts
            args = build_parser().parse_args(shlex.split(line)[1:])
            assert args.command == name
        assert "examples:\n  twin " in sp.format_help()


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_twin_models_lists_the_catalog(capsys):
    code, out, _ = run_cli(capsys, "models")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["model", "params", "(B)"]
    assert [line.split()[0] for line in lines[1:]] == sorted(MODELS)
    row = next(line for line in lines if line.startswith("llama-2-70b "))
    assert row.split()[1:6] == ["69.0", "80", "8", "327,680", "4,096"]
    code, out, _ = run_cli(capsys, "models", "--json", "-")
    rows = json.loads(out)["models"]
    assert [r["name"] for r in rows] == sorted(MODELS)
    for r in rows:
        m = MODELS[r["name"]]
        assert r["kv_bytes_per_token"] == m.kv_bytes_per_token() and r["params"] == m.params
        assert r["layers"] == m.layers and r["hf_id"] == HF_IDS.get(r["name"], "")


def test_twin_gpus_lists_the_catalog(capsys, tmp_path):
    path = tmp_path / "g.json"
    code, out, _ = run_cli(capsys, "gpus", "--json", str(path))
    assert code == 0 and "h100-sxm" in out
    rows = json.loads(path.read_text())["gpus"]
    assert [r["name"] for r in rows] == gpu_names()
    h100 = next(r for r in rows if r["name"] == "h100-sxm")
    g = get_gpu("h100-sxm")
    assert (h100["hbm_bytes_s"], h100["flops_bf16"], h100["memory_bytes"]) == (
        g.hbm_bytes_s, g.flops_bf16, int(g.memory_bytes),
    )  # fmt: skip
    row = next(line for line in out.splitlines() if line.startswith("h100-sxm "))
    assert row.split()[1:4] == ["80", "3,350", "989"]  # GiB, GB/s, TFLOP/s


def test_twin_topologies_and_experiments_list_the_bundled_files(capsys):
    from twin.net.topology import load_topology

    code, out, _ = run_cli(capsys, "topologies", "--json", "-")
    rows = json.loads(out)["topologies"]
    assert [r["name"] for r in rows] == bundled_names("topologies")
    for r in rows:
        topo = load_topology(r["name"])
        assert (r["nodes"], r["gpus"]) == (topo.num_nodes, len(topo.gpus))
        assert r["links"] == topo.graph.number_of_edges() and r["description"]
    ib = next(r for r in rows if r["name"] == "dgx-h100-ib400")
    assert (ib["nodes"], ib["gpus"], ib["gpu"], ib["nics"]) == (4, 32, "h100-sxm", 32)
    code, out, _ = run_cli(capsys, "experiments")
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == bundled_names("experiments")
    assert any(line.split()[:2] == ["pool-ratio", "sweep"] for line in lines)
    assert any(line.split()[:2] == ["compare-mooncake", "compare"] for line in lines)


def _variants(name: str) -> list[str]:
    """The forms people write a catalog model's name in."""
    forms = [name, name.upper(), name.replace("-", "_"), f"{name}-Instruct", f"{name}-chat-hf"]
    if name.startswith(("llama-", "opt-")):
        family, rest = name.split("-", 1)
        forms.append(family + rest)  # llama3.1-70b, opt13b
    if name in HF_IDS:
        forms += [HF_IDS[name], f"{HF_IDS[name]}-Instruct"]
    return forms


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_catalog_model_answers_to_its_common_names(name):
    for form in _variants(name):
        assert get_model(form) is MODELS[name], form


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("llama-3-70b", "llama-3-70b"),
        ("llama3-70b", "llama-3-70b"),
        ("Llama-3.1-70B", "llama-3.1-70b"),
        ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
        ("meta-llama/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
        ("meta-llama/Llama-2-70b-chat-hf", "llama-2-70b"),
        ("bigscience/bloom", "bloom-176b"),
        ("Qwen3_8B", "qwen3-8b"),
    ],
)
def test_aliases(alias, canonical):
    assert get_model(alias) is MODELS[canonical]
    assert normal_model_name("Meta-Llama-3.1-70B-Instruct") == "llama-3.1-70b"


def test_llama_3_is_not_llama_3_1():
    # same shapes, different context: the 8,192 of Llama 3, the 131,072 of 3.1
    assert get_model("llama-3-70b").max_context == 8192
    assert get_model("llama-3.1-70b").max_context == 131072


def test_an_unknown_name_lists_the_closest_catalog_names(capsys):
    with pytest.raises(UnknownNameError, match="Did you mean 'llama-3.1-70b'"):
        get_model("meta-llama/Llama-3.1-71B-Instruct")
    code, _, err = run_cli(capsys, "kv", "Llama-2-71B")
    assert code == 2 and err.count("\n") == 1
    assert (
        "twin kv: MODEL: unknown model 'Llama-2-71B'. Did you mean 'llama-2-7b' or 'llama-2-70b'"
        in err
    )


def test_a_spec_takes_an_alias(capsys):
    from twin.sim.spec import load_spec

    spec = load_spec("quickstart", ["model=meta-llama/Llama-2-70b-chat-hf"])
    assert spec.model is MODELS["llama-2-70b"]


def test_kv_takes_a_name_a_file_or_an_inline_mapping(capsys, tmp_path):
    code, by_name, _ = run_cli(capsys, "kv", "llama3-70b", "--tokens", "100")
    assert code == 0 and "llama-3-70b" in by_name and "327,680 B" in by_name
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(TINY))
    spec = tmp_path / "spec.yaml"  # a spec with an inline model: its model: mapping
    spec.write_text(yaml.safe_dump({"model": TINY, "workload": {"lengths": "azure-conv"}}))
    inline = "{" + ", ".join(f"{k}: {v}" for k, v in TINY.items()) + "}"
    outs = []
    for argv in (
        ["kv", str(path)], ["kv", "--model", str(path)], ["kv", str(spec)], ["kv", inline],
    ):  # fmt: skip
        code, out, err = run_cli(capsys, *argv, "--tokens", "10")
        assert code == 0, err
        outs.append(out)
    assert len(set(outs)) == 1
    assert "bytes per token  256 B" in outs[0]  # 2 (K, V) x 2 layers x 2 kv heads x 16 x 2 B


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["kv"], "twin kv: MODEL: missing"),
        (["kv", "a", "--model", "b"], "give the model once"),
        (["kv", "/nonexistent/m.yaml"], "twin kv: MODEL: /nonexistent/m.yaml: no such model file"),
        (["kv", "{name: x}"], "twin kv: MODEL (inline): missing 'layers'"),
        (["kv", "{name: [x"], "twin kv: MODEL (inline): not valid YAML"),
        (["handoff", "--tokens", "10", "--topology", "dgx-h100-box"], "twin handoff: MODEL"),
    ],
)
def test_bad_models_are_one_line(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("twin: error: ") and message in err, err


def test_handoff_takes_a_model_file(capsys, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(TINY))
    code, out, err = run_cli(
        capsys, "handoff", "--model", str(path), "--tokens", "100", "--topology", "dgx-h100-box",
        "--placement", "same-node", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["kv_bytes"] == 100 * 256
