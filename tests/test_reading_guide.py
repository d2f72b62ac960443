"""The reading guide (``help(twin)``) keeps the picture true: its layout names
every package and module of twin/ and nothing that is gone, every package is
one the distribution ships, and it names every extension point."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import twin

REPO = Path(__file__).resolve().parent.parent
PACKAGE = re.compile(r"^twin(/\w+)*/$")
MODULE = re.compile(r"^[\w]+\.py$")


def layout(doc: str) -> set[str]:
    """The modules the docstring's layout block names, as paths from the repo
    root: a line whose first word is ``twin/...`` starts a package, the
    ``name.py`` words of the lines below it are its modules."""
    block = doc.split("Layout:", 1)[1].split("::", 1)[1]
    named: set[str] = set()
    package = None
    for line in block.splitlines():
        words = line.split()
        if not words:
            continue
        if PACKAGE.match(words[0]):
            package = words[0]
            continue
        for w in words:
            if MODULE.match(w):
                assert package is not None, line
                named.add(package + w)
    return named


def modules(repo: Path = REPO) -> set[str]:
    return {p.relative_to(repo).as_posix() for p in (repo / "twin").rglob("*.py")}


def test_the_layout_names_every_module_and_no_other():
    named, found = layout(twin.__doc__ or ""), modules()
    assert not found - named, (
        f"modules missing from twin/__init__.py's layout: {sorted(found - named)}"
    )
    assert not named - found, f"named in the layout but gone: {sorted(named - found)}"


def test_the_layout_parser_sees_a_missing_module():
    doc = "Layout: x::\n\n    twin/\n      a.py b.py   the a and b\n    twin/net/\n      c.py\n"
    assert layout(doc) == {"twin/a.py", "twin/b.py", "twin/net/c.py"}


def test_every_package_ships():
    doc = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = set(doc["tool"]["setuptools"]["packages"])
    packages = {
        ".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "twin").rglob("__init__.py")
    }
    assert packages <= shipped, sorted(packages - shipped)


def test_every_extension_point_is_named():
    doc = twin.__doc__ or ""
    for point in (
        "@register", "twin.schedulers", "register_queue_policy", "twin.queue_policies",
        "events:", "failures.random", "retry:", "AddInstance", "RemoveInstance", "on_event",
        "kv_tiers", "kv_pool", "iteration_time", "perf:", "twin/data/models/",
        "twin/data/gpus/", "twin/workload/traces.py", "twin/serving/observer.py",
        "topologies/README.md",
    ):  # fmt: skip
        assert point in doc, point
