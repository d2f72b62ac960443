"""Size with a budget: no module of ``twin/`` or ``schedulers/`` over 800
lines, no function over 80. Today's offenders are listed in
``tests/size_baseline.json`` with their sizes; an entry may shrink but never
grow, and once it shrinks the baseline must be lowered with it (or the entry
removed), so the list only ever gets shorter.

Lines are physical lines: a module's is its line count, a function's is
``end_lineno - lineno + 1`` from :mod:`ast` (decorators not counted), named
``path:Qualified.name`` (a method as ``Class.method``, a nested function as
``outer.inner``)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = Path(__file__).resolve().parent / "size_baseline.json"
ROOTS = ("twin", "schedulers")
MODULE_LIMIT = 800
FUNCTION_LIMIT = 80


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function in ``tree``, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + node.name
            assert node.end_lineno is not None
            yield name, node.end_lineno - node.lineno + 1
            yield from _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:
            yield from _functions(node, prefix)


def measure(repo: Path = REPO) -> dict[str, int]:
    """Every module (``twin/units.py``) and function (``twin/units.py:parse_duration``) of
    the project with its size in lines, keyed as the baseline keys them."""
    sizes: dict[str, int] = {}
    for root in ROOTS:
        for path in sorted((repo / root).rglob("*.py")):
            rel = path.relative_to(repo).as_posix()
            text = path.read_text(encoding="utf-8")
            sizes[rel] = len(text.splitlines())
            for name, lines in _functions(ast.parse(text, filename=rel)):
                sizes[f"{rel}:{name}"] = lines
    return sizes


def limit_of(key: str) -> int:
    return FUNCTION_LIMIT if ":" in key else MODULE_LIMIT


def offenders(sizes: dict[str, int]) -> dict[str, int]:
    """The entries of ``sizes`` over their limit."""
    return {k: n for k, n in sorted(sizes.items()) if n > limit_of(k)}


def problems(sizes: dict[str, int], baseline: dict[str, int]) -> list[str]:
    """What breaks the budget, one line each; empty when it holds."""
    out = []
    for key, n in offenders(sizes).items():
        if key not in baseline:
            out.append(
                f"{key}: {n} lines, over the limit of {limit_of(key)}; split it "
                "(new offenders are not added to the baseline)"
            )
        elif n > baseline[key]:
            out.append(f"{key}: grew from {baseline[key]} to {n} lines; the baseline only shrinks")
    for key, recorded in sorted(baseline.items()):
        n = sizes.get(key)
        if n is None:
            out.append(f"{key}: gone; remove it from {BASELINE.name}")
        elif n <= limit_of(key):
            out.append(
                f"{key}: {n} lines, within the limit of {limit_of(key)} now; "
                f"remove it from {BASELINE.name}"
            )
        elif n < recorded:
            out.append(
                f"{key}: shrank from {recorded} to {n} lines; lower it to {n} in {BASELINE.name}"
            )
    return out


def test_sizes_within_budget():
    baseline = json.loads(BASELINE.read_text(encoding="utf-8"))
    found = problems(measure(), baseline)
    assert not found, "\n".join(found)


def test_budget_catches_new_grown_and_stale_entries():
    base = {"twin/big.py": 900, "twin/big.py:f": 100, "twin/gone.py": 850}
    sizes = {
        "twin/big.py": 901,  # grew
        "twin/big.py:f": 90,  # shrank: lower the baseline
        "twin/new.py": 801,  # new offender
        "twin/new.py:g": 81,  # new offender
        "twin/ok.py:h": 80,  # at the limit: fine
    }
    found = problems(sizes, base)
    assert found == [
        "twin/big.py: grew from 900 to 901 lines; the baseline only shrinks",
        "twin/new.py: 801 lines, over the limit of 800; split it "
        "(new offenders are not added to the baseline)",
        "twin/new.py:g: 81 lines, over the limit of 80; split it "
        "(new offenders are not added to the baseline)",
        "twin/big.py:f: shrank from 100 to 90 lines; lower it to 90 in size_baseline.json",
        "twin/gone.py: gone; remove it from size_baseline.json",
    ]
    assert problems({"twin/big.py": 800}, {"twin/big.py": 900}) == [
        "twin/big.py: 800 lines, within the limit of 800 now; remove it from size_baseline.json"
    ]


def test_functions_named_by_qualified_name(tmp_path):
    pkg = tmp_path / "twin"
    pkg.mkdir()
    (tmp_path / "schedulers").mkdir()
    (pkg / "m.py").write_text(
        "class A:\n    def f(self):\n        def g():\n            pass\n        return g\n\n"
        "@staticmethod\ndef h():\n    pass\n",
        encoding="utf-8",
    )
    assert measure(tmp_path) == {
        "twin/m.py": 9,
        "twin/m.py:A.f": 4,
        "twin/m.py:A.f.g": 2,
        "twin/m.py:h": 2,
    }
