"""The public face: what ``import twin`` offers, and the docs using only it."""

import ast
import json
from pathlib import Path

import pytest
from doc_pages import pages

import twin

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["workload.max_requests=20"]


def test_every_public_name_is_there():
    assert sorted(set(twin.__all__)) == sorted(twin.__all__)
    for name in twin.__all__:
        assert getattr(twin, name) is not None, name


def test_run_takes_a_bundled_name_with_overrides():
    result = twin.run("quickstart", overrides=SMALL)
    assert isinstance(result, twin.Result)
    assert result.summary["requests"] == 20
    assert result.header["spec"]["workload"]["max_requests"] == 20


def test_run_takes_a_mapping_without_further_arguments():
    result = twin.run(
        {
            "model": "llama-3.1-8b",
            "workload": {
                "lengths": "azure-conv",
                "arrival": {"process": "poisson", "rate": 4},
                "max_requests": 30,
            },
        }
    )
    assert result.summary["completed"] == 30
    assert result.header["spec"]["name"] == "<spec>"


def test_run_of_a_loaded_spec_equals_the_simulation_of_it():
    spec = twin.load_spec("quickstart", SMALL)
    a = twin.run(spec).to_dict()
    b = twin.Simulation(spec).run().to_dict()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    with pytest.raises(twin.TwinError):
        twin.run(spec, overrides=SMALL)


def test_an_observer_hears_every_request_end_exactly_once():
    class Ends(twin.Observer):
        def __init__(self):
            self.ended = []

        def request_ended(self, now, instance, req, seq, outcome, reason):
            self.ended.append(req.id)

    ends = Ends()
    result = twin.run("disagg", overrides=SMALL, observers=[ends])
    assert sorted(ends.ended) == list(range(20)) == sorted(set(ends.ended))
    assert result.summary["completed"] + result.summary["rejected"] == 20


def _twin_imports(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("twin"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("twin"))
    return out


ALLOWED = {"twin", "twin.testing", "twin.viz"}


@pytest.mark.parametrize("nb", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_import_only_the_public_face(nb: Path):
    cells = json.loads(nb.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert _twin_imports(ast.parse(code)) <= ALLOWED


def _readme_python() -> list[str]:
    """The Python blocks of README.md and the documentation pages."""
    out = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        out += [b.split("\n", 1)[1].split("```", 1)[0] for b in text.split("```python")[1:]]
    return out


def test_the_readme_imports_only_the_public_face():
    code = _readme_python()
    assert len(code) >= 2, "the README shows Python"
    for c in code:
        assert _twin_imports(ast.parse(c)) <= ALLOWED


def test_the_readmes_python_runs(capsys):
    for c in _readme_python():
        exec(compile(c, "README.md", "exec"), {"__name__": "readme"})
    assert "SLO attainment" in capsys.readouterr().out


def test_importing_twin_loads_no_simulation_until_a_name_is_used():
    import subprocess
    import sys

    code = (
        "import sys, twin, twin.errors, twin.scheduler\n"
        "heavy = [m for m in ('twin.sim.simulation', 'scipy', 'networkx', 'matplotlib')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
        "twin.run\n"
        "print('twin.sim.simulation' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"]


def test_the_lazy_names_are_the_public_names():
    assert set(twin._LAZY) | {"__version__", "code_sha256"} == set(twin.__all__)
    assert sorted(dir(twin)) == sorted(twin.__all__)
