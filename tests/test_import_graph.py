"""No import circles in twin/: every module parsed with ``ast``, each import
an edge (at the top, under ``if TYPE_CHECKING:`` and inside a function body
alike), and the graph must have no cycle (DESIGN.md, Layout: depend on a
Protocol instead of a back-reference)."""

from __future__ import annotations

import ast
from pathlib import Path

import twin

TWIN = Path(twin.__file__).parent


def modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (its file, whether it is a package's __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        init = parts[-1] == "__init__"
        out[".".join(parts[:-1] if init else parts)] = (path, init)
    return out


def _known(name: str, mods: dict[str, tuple[Path, bool]]) -> str | None:
    """``name``, or the nearest package above it, that is a module of the tree."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def module_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the tree it imports, anywhere in its body."""
    mods = modules(root, package)
    graph: dict[str, set[str]] = {}
    for name, (path, init) in mods.items():
        here = name if init else name.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(m for a in node.names if (m := _known(a.name, mods)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([base] if base else [])])
                for a in node.names:
                    sub = f"{base}.{a.name}"  # `from pkg import module`
                    target = sub if sub in mods else _known(base, mods)
                    if target:
                        out.add(target)
        out.discard(name)
        graph[name] = out
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module
    (each lies on a cycle), sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def a_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One cycle through ``comp``'s first module, as the modules in order."""
    inside = set(comp)
    path = [comp[0]]
    seen = {comp[0]}
    while True:
        nxt = sorted(graph[path[-1]] & inside)
        if comp[0] in nxt and len(path) > 1 or nxt == [comp[0]]:
            return [*path, comp[0]]
        step = next((m for m in nxt if m not in seen), None)
        if step is None:  # a dead end inside the component: back off
            path.pop()
            if not path:
                return comp
            continue
        path.append(step)
        seen.add(step)


def test_twin_has_no_import_circles():
    graph = module_graph(TWIN, "twin")
    circles = [
        f"{' -> '.join(a_cycle(graph, c))} (on a cycle together: {', '.join(c)})"
        for c in strongly_connected(graph)
    ]
    assert not circles, "import circles in twin/:\n" + "\n".join(circles)


def test_the_graph_counts_type_checking_function_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import X\n"
    )
    (pkg / "d.py").write_text("import pkg.sub.c\n")
    graph = module_graph(pkg, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.sub.c"}
    assert strongly_connected(graph) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]
    cycle = a_cycle(graph, ["pkg.a", "pkg.sub.b", "pkg.sub.c"])
    assert cycle == ["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]
    (pkg / "sub" / "c.py").write_text("")  # the back-reference gone: no circle
    assert strongly_connected(module_graph(pkg, "pkg")) == []
