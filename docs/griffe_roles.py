"""Read the code's Sphinx cross-reference roles as Markdown (a Griffe extension).

The docstrings name other objects the Sphinx way (``:class:`Result```,
``:func:`~twin.workload.stream.own_rate```) and write literals between double
backquotes; the site renders docstrings as Markdown, where a role would show
raw. As each object is loaded, this rewrites every role to the code span a
reader sees in Sphinx: the target as written, or its last component after
``~``. Field lists (``:param x:``, ``:returns:``) are left to the Sphinx
docstring parser that the handler runs.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj|const|type):`(~?)([^`]+)`")


def markdown(text: str) -> str:
    """``text`` with each cross-reference role written as a code span."""

    def span(m: re.Match[str]) -> str:
        target = m.group(2).strip()
        if m.group(1):
            target = target.rsplit(".", 1)[-1]
        return f"`{target}`"

    return ROLE.sub(span, text)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
