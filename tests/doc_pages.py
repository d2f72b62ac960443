"""The pages a reader is shown: README.md and every page of the documentation
site (``docs/**/*.md``), in a fixed order. The tests that run the shell
examples, parse the YAML and run the Python of the README read these, so
that text moved from the README into a page stays tested."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def pages() -> list[Path]:
    """README.md, then the documentation pages sorted by path (the notebooks'
    folder, a link to ``notebooks/``, holds none)."""
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if p.is_file())
    return [README, *docs]


def name(page: Path) -> str:
    """The page's path from the repository root, as messages and test ids show it."""
    return page.relative_to(ROOT).as_posix()


def find_page(heading: str) -> Path:
    """The page that has ``heading`` (a whole line, ``## Experiment spec``)."""
    for page in pages():
        if heading in page.read_text(encoding="utf-8").splitlines():
            return page
    raise LookupError(f"no page has the heading {heading!r}")
