"""No import circles among the modules of twin/serving/.

Every import counts: at module level, inside functions and under
``if TYPE_CHECKING:`` (a back-reference for annotations only is still a
circle; :mod:`twin.serving.ports` gives the Protocols that stand in for one).
"""

from __future__ import annotations

import ast
from pathlib import Path

import twin.serving

PACKAGE = "twin.serving"
SERVING = Path(twin.serving.__file__).parent


def imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The modules of ``modules`` (short names) that ``tree`` imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            # `from twin.serving import engine` imports a module; `from
            # twin.serving.engine import Engine` the module it names
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            head, _, rest = name.partition(PACKAGE + ".")
            if head == "" and rest.split(".")[0] in modules:
                out.add(rest.split(".")[0])
    return out


def import_graph(folder: Path) -> dict[str, set[str]]:
    """Each module of ``folder`` (short name) -> the modules of it that it imports."""
    files = {p.stem: p for p in sorted(folder.glob("*.py")) if p.stem != "__init__"}
    mods = set(files)
    graph = {}
    for name, path in files.items():
        graph[name] = imported(ast.parse(path.read_text(), str(path)), mods) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module
    (Tarjan's algorithm), each sorted; empty when it has no circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_finder_sees_a_circle_through_a_type_checking_import(tmp_path):
    (tmp_path / "a.py").write_text("from twin.serving.b import B\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from twin.serving import c\n"
    )
    (tmp_path / "c.py").write_text("def f():\n    import twin.serving.a\n")
    (tmp_path / "d.py").write_text("from twin.serving.a import A\nfrom twin.net import flows\n")
    graph = import_graph(tmp_path)
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_twin_serving_has_no_import_circles():
    graph = import_graph(SERVING)
    assert "engine" in graph and graph["engine"]  # it read the package
    assert cycles(graph) == []
