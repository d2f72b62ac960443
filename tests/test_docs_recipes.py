"""The recipes of the guides that a new user follows in Python, run as written:
the policy of "Your own scheduler" run against the built-ins as "Your policy
against the built-ins" shows (docs/guides/policies.md)."""

from __future__ import annotations

import re

from doc_pages import ROOT

POLICIES_PAGE = ROOT / "docs" / "guides" / "policies.md"
LABELS = ("colocated", "mine")


def _blocks(heading: str) -> list[str]:
    text = POLICIES_PAGE.read_text(encoding="utf-8")
    section = text.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_your_policy_against_the_built_ins_runs_as_written(capsys):
    (policy,) = _blocks("## Your own scheduler")
    (recipe,) = _blocks("### Your policy against the built-ins")
    scope: dict = {"__name__": "readme"}  # as tests/test_public.py runs the pages' Python
    for code in (policy, recipe):
        exec(compile(code, "docs/guides/policies.md", "exec", dont_inherit=True), scope)
    lines = capsys.readouterr().out.splitlines()
    rows = {
        ln.split()[0]: ln.split() for ln in lines if ln.split()[:1] in (["colocated"], ["mine"])
    }
    assert rows["mine"][1] == "shortest-queue" and rows["colocated"][1] == "colocated"
    assert rows["mine"][2] == rows["colocated"][2] == "32"  # the same GPUs
    assert rows["mine"][3] == rows["colocated"][3] == "1,000"  # the same requests
