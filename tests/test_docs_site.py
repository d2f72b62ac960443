"""The documentation site's generated parts (docs/hooks.py) and its measured
outputs (docs/measure.py, docs/data/): each marker of a page is filled from
the code, every declared spec key and every command is in the reference, and
each measured file is the output of the command its page names."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import shared_data_dir
from doc_pages import ROOT, name, pages

import twin
from twin.cli import build_parser
from twin.sim.spec import spec_schema

_MARK = re.compile(r"<!-- twin:([a-z-]+)(?: (\S+))? -->")


def _module(file: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_{Path(file).stem}", ROOT / file)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


hooks = _module("docs/hooks.py")
measure = _module("docs/measure.py")
MARKS = [(name(p), m.group(1), m.group(2)) for p in pages() for m in _MARK.finditer(p.read_text())]


def _paths(node: dict, path: str = "") -> set[str]:
    out = set()
    for key, child in node.get("properties", {}).items():
        here = f"{path}.{key}" if path else key
        out |= {here} | _paths(child, here)
    return out


def test_every_marker_names_a_generator_or_a_measured_file():
    kinds = {k for _, k, _ in MARKS}
    assert kinds >= {"spec-keys", "columns", "cli", "api", "include"}
    for page, kind, arg in MARKS:
        assert kind == "include" or kind in hooks.MAKERS, f"{page}: unknown marker {kind}"
        if kind == "include":
            assert (ROOT / arg).is_file(), f"{page}: {arg} is missing: run docs/measure.py"


def test_the_spec_reference_has_every_declared_key():
    table = hooks.spec_keys()
    keys = _paths(spec_schema())
    assert len(keys) > 50
    for key in keys:
        assert f"| {hooks._key(key)} |" in table, key


def test_the_command_reference_has_every_command_and_its_arguments():
    text = hooks.cli()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for cmd, sp in sub.choices.items():
        assert f"## `twin {cmd}`" in text
        assert sp.format_help().rstrip() in text


def test_the_column_reference_has_every_request_column():
    text = hooks.columns()
    for column in twin.REQUEST_COLUMNS:
        assert f"| `{column}` |" in text
    assert "| `slo_attainment` |" in text


def test_the_api_reference_documents_every_exported_name():
    text = hooks.api()
    for exported, module in twin._LAZY.items():
        if not exported.startswith("_") and exported != "REQUEST_COLUMNS":
            assert f"::: {module}.{exported}\n" in text


RAW_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`")


def _api_docstrings(extensions: list) -> list[str]:
    """The docstrings the API page renders: each exported object's and its members'."""
    import griffe

    loader = griffe.GriffeLoader(
        extensions=griffe.load_extensions(*extensions), search_paths=[str(ROOT)]
    )
    package = loader.load("twin")
    out: list[str] = []

    def walk(obj) -> None:
        if obj.docstring is not None:
            out.append(obj.docstring.value)
        for key, member in obj.members.items():
            if not key.startswith("_") and not member.is_alias:
                walk(member)

    for exported, module in twin._LAZY.items():
        if not exported.startswith("_") and exported != "REQUEST_COLUMNS":
            walk(package[f"{module.removeprefix('twin.')}.{exported}"])
    return out


def test_the_api_reference_reads_the_docstrings_roles_as_markdown():
    pytest.importorskip(
        "griffe", reason="the docs extra's (pip install '.[docs]'), which builds the site"
    )
    roles = _module("docs/griffe_roles.py")
    assert roles.markdown("see :class:`Result` and :func:`~twin.x.own_rate`") == (
        "see `Result` and `own_rate`"
    )
    assert "docs/griffe_roles.py:SphinxRoles" in (ROOT / "mkdocs.yml").read_text()
    assert any(RAW_ROLE.search(d) for d in _api_docstrings([]))  # the code writes roles
    assert not [d[:80] for d in _api_docstrings([roles.SphinxRoles()]) if RAW_ROLE.search(d)]


def test_each_measured_file_is_the_output_of_its_command():
    files = sorted((ROOT / "docs" / "data").glob("*.txt"))
    assert {f.stem for f in files} == set(measure.MEASURED)
    included = {arg for _, kind, arg in MARKS if kind == "include"}
    for f in files:
        first = f.read_text(encoding="utf-8").splitlines()[0]
        assert first == f"$ {measure.MEASURED[f.stem]}", f
        assert f"docs/data/{f.name}" in included, f"{f.name} is shown on no page"


# The measured outputs quick to rerun (seconds each), with whether they read the public data.
QUICK = {
    "validate-perf": True,
    "validate-replay-h100-tp8": True,
    "pp-decode": True,
    "handoff-llama-2-70b": False,
    "handoff-llama-2-70b-block": False,
    "handoff-llama-3.1-70b-multi-nic": False,
    "moe-fidelity": False,
}


@pytest.mark.parametrize("entry", sorted(QUICK))
def test_a_quick_measured_file_is_what_its_command_prints_now(entry, tmp_path, monkeypatch):
    """These depend only on the code (and the public data): each file must be
    what its command prints now, so a figure typed into it, or one the code
    has since moved, fails here (rerun docs/measure.py)."""
    if QUICK[entry] and shared_data_dir() is None:
        pytest.skip("reads the public data: set TWIN_DATA or place it at ../shared/data")
    kept = (ROOT / "docs" / "data" / f"{entry}.txt").read_text(encoding="utf-8")
    monkeypatch.setattr(measure, "DATA", tmp_path)
    monkeypatch.setattr(measure, "ROOT", ROOT)
    out = measure.measure(entry)
    assert out.read_text(encoding="utf-8") == kept, f"rerun: python docs/measure.py {entry}"


# Outputs a page may show typed out, each with why it is no measured figure.
TYPED_OUTPUTS = {
    # README.md: test_readme_commands checks it is what `twin run` prints, to the digit
    "twin run": "README.md",
    # a count of lines that grep found, run by test_readme_commands
    "twin spec classes --entry priority --set 'workload.classes[0].share=0.5'"
    " | grep -c '\"share\": 0.5'": "docs/guides/spec.md",
}


def _typed_figures(shown: str) -> list[str]:
    """The lines of a shown output that are neither error nor warning lines."""
    return [
        ln for ln in shown.splitlines()
        if ln.strip() and not ln.startswith(("twin: error: ", "twin: warning: "))
    ]  # fmt: skip


def test_no_page_shows_a_commands_output_typed_by_hand():
    """A page shows what a ``twin`` command prints through ``<!-- twin:include
    docs/data/NAME.txt -->`` (written by ``docs/measure.py``), never pasted
    into a ``$ twin ...`` block, where it would not follow the code; error
    lines are run and compared by tests/test_readme_commands.py."""
    from readme_commands import examples

    typed = [
        f"{name(p)}:{e.line}: {e.command}"
        for p in pages()
        for e in examples(p, name(p))
        if _typed_figures(e.shown) and TYPED_OUTPUTS.get(e.command) != name(p)
    ]
    assert not typed, "measure these (docs/measure.py) and include them:\n" + "\n".join(typed)


def test_the_typed_output_check_catches_a_pasted_table(tmp_path):
    from readme_commands import examples

    page = tmp_path / "page.md"
    page.write_text("```\n$ twin run\nTTFT (s) 0.065\n$ twin run --set x=1\n"
                    "twin: error: quickstart.yaml: x: unknown key\n```\n")  # fmt: skip
    shown = [_typed_figures(e.shown) for e in examples(page)]
    assert shown == [["TTFT (s) 0.065"], []]


def test_a_file_a_page_shows_is_the_one_its_measured_command_reads():
    """A measured command that reads a spec a page shows (``$ cat FILE``) reads
    the repository's copy of it, ``docs/examples/FILE``: the two are the same text."""
    from readme_commands import examples

    shown = {f: text for p in pages() for e in examples(p, name(p)) for f, text in e.files}
    read = {Path(a).name: a for c in measure.MEASURED.values() for a in c.split()
            if a.startswith("docs/examples/")}  # fmt: skip
    both = sorted(set(shown) & set(read))
    assert both, "no measured command reads a file the pages show"
    for file in both:
        assert shown[file] == (ROOT / read[file]).read_text(encoding="utf-8"), read[file]
