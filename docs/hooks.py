"""The pages' generated parts, made from the code at build time (mkdocs hook).

A page asks for one with a marker on a line of its own:

- ``<!-- twin:spec-keys -->``: every key of the declared spec (``twin spec
  --schema``), its type, default, unit and help line;
- ``<!-- twin:columns -->``: every column of the per-request table, the
  timeline and the links table, and every summary key of a small run;
- ``<!-- twin:cli -->``: every command's ``--help``;
- ``<!-- twin:api -->``: the public face of ``twin`` (mkdocstrings);
- ``<!-- twin:include PATH -->``: a file of the repository (a measured
  output under ``docs/data/``, written by ``docs/measure.py``), as a block.

Nothing here is typed by hand: change the code and the pages follow.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_MARK = re.compile(r"^<!-- twin:([a-z-]+)(?: (\S+))? -->$", re.M)


def _cli(args: list[str]) -> str:
    from twin.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(args)
    return out.getvalue()


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _key(path: str) -> str:
    """A dotted key as code that may break after its dots, and only there."""
    return '<code class="twin-key">' + ".<wbr>".join(path.split(".")) + "</code>"


def _type(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if "type" in node:
        t = node["type"]
        return " \\| ".join(t) if isinstance(t, list) else t
    kinds = [_type(n) for n in node.get("anyOf", []) + node.get("oneOf", [])]
    return " or ".join(k for k in dict.fromkeys(kinds) if k) or "any"


def _walk(node: dict[str, Any], path: str, rows: list[str]) -> None:
    for key, child in node.get("properties", {}).items():
        here = f"{path}.{key}" if path else key
        default = f"`{json.dumps(child['default'])}`" if "default" in child else ""
        unit = child.get("x-unit", "")
        rows.append(
            f"| {_key(here)} | {_type(child)} | {default} | {unit} | "
            f"{_cell(child.get('description', ''))} |"
        )
        _walk(child, here, rows)
        if isinstance(child.get("additionalProperties"), dict):  # a mapping by name (models:)
            _walk(child["additionalProperties"], f"{here}.<name>", rows)
        if child.get("type") == "array" and isinstance(child.get("items"), dict):
            _walk(child["items"], f"{here}[]", rows)


def spec_keys() -> str:
    schema = json.loads(_cli(["spec", "--schema"]))
    required = set(schema.get("required", []))
    rows = ["| key | type | default | unit | what |", "|---|---|---|---|---|"]
    _walk(schema, "", rows)
    either = " or ".join(f"`{k}`" for o in schema.get("anyOf", []) for k in o.get("required", []))
    return (
        f"Required: {', '.join(f'`{k}`' for k in sorted(required))}"
        + (f"; and {either}. " if either else ". ")
        + f"{len(rows) - 2} keys, from `twin spec --schema`.\n\n"
        + "\n".join(rows)
    )


def columns() -> str:
    import twin
    from twin.sim.classmetrics import CLASS_TIMELINE_COLUMNS
    from twin.sim.frames import REQUEST_KINDS
    from twin.sim.metrics import CLASS_COLUMN, MODEL_COLUMN
    from twin.sim.result import LINK_COLUMNS
    from twin.sim.timeline import TIMELINE_COLUMNS

    out = ["## Per-request rows (`--requests-csv`, `result.requests`)", ""]
    out += ["| column | kind |", "|---|---|"]
    out += [f"| `{c}` | {REQUEST_KINDS[c]} |" for c in twin.REQUEST_COLUMNS]
    out += [f"| `{CLASS_COLUMN}` | str: the request's class, after the others in a run with "
            "`workload.classes` only |"]  # fmt: skip
    out += [f"| `{MODEL_COLUMN}` | str: the request's model, last, in a run of several models "
            "(`models:`) only |"]  # fmt: skip
    out += ["", "## Timeline rows (`--timeline-csv`, `result.timeline`)", ""]
    out += ["| column |", "|---|"] + [f"| `{c}` |" for c in TIMELINE_COLUMNS]
    out += ["", "## Link rows (`--links-csv`, besides `series`)", ""]
    out += ["| column |", "|---|"] + [f"| `{c}` |" for c in LINK_COLUMNS]
    spec = "quickstart"
    sets = ["workload.max_requests=200"]
    result = twin.run(spec, overrides=sets)
    out += ["", "## Summary keys (`result.summary`, the columns of a sweep's `runs.csv`)", ""]
    out += [
        f"Every key of the summary, with its value in `twin run {spec} "
        f"--set {sets[0]}` (computed when these pages were built).",
        "",
        "| key | example |",
        "|---|---|",
    ]
    for key, value in result.summary.items():
        if isinstance(value, dict):
            continue  # its flat keys follow
        shown = f"{value:.6g}" if isinstance(value, float) else value
        out.append(f"| `{key}` | {_cell(shown)} |")
    sets = ["workload.max_requests=200", "compare=null", "engine.queue_policy=priority"]
    classed = twin.run("classes", overrides=sets)
    first = next(iter(classed.summary["classes"]))
    out += ["", "## Per-class keys (`summary.classes.<name>`, `timeline_by_class.<name>`)", ""]
    out += [
        "A run with `workload.classes` adds, for each class, these keys (its requests "
        "only, judged against its SLO), with their values for the class "
        f"`{first}` in `twin run classes --set {' --set '.join(sets)}`; and in "
        "`--json`, `timeline_by_class.<name>`: the class's timeline rows, of the columns "
        f"{', '.join(f'`{c}`' for c in CLASS_TIMELINE_COLUMNS)}.",
        "",
        "| key | example |",
        "|---|---|",
    ]
    for key, value in classed.summary.items():
        if key.startswith(f"classes.{first}.") and not isinstance(value, dict):
            shown = f"{value:.6g}" if isinstance(value, float) else value
            out.append(f"| `{key.replace(first, '<name>', 1)}` | {_cell(shown)} |")
    return "\n".join(out)


def cli() -> str:
    from twin.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    out = ["## `twin`", "", "```text", parser.format_help().rstrip(), "```"]
    for name, sp in sub.choices.items():  # type: ignore[attr-defined]
        out += ["", f"## `twin {name}`", "", "```text", sp.format_help().rstrip(), "```"]
    return "\n".join(out)


def api() -> str:
    import twin

    out = []
    for name, module in sorted(twin._LAZY.items()):
        if name.startswith("_") or name == "REQUEST_COLUMNS":
            continue
        out += [f"::: {module}.{name}", "    options:", "      heading_level: 2", ""]
    return "\n".join(out)


def include(path: str) -> str:
    from mkdocs.exceptions import PluginError

    file = ROOT / path
    if not file.is_file():
        raise PluginError(f"{path}: missing; run `python docs/measure.py` to write it")
    return "```text\n" + file.read_text(encoding="utf-8").rstrip() + "\n```"


MAKERS = {"spec-keys": spec_keys, "columns": columns, "cli": cli, "api": api}
_CACHE: dict[str, str] = {}


def render(markdown: str) -> str:
    def one(m: re.Match[str]) -> str:
        name, arg = m.group(1), m.group(2)
        if name == "include":
            return include(arg)
        if name not in _CACHE:
            _CACHE[name] = MAKERS[name]()
        return _CACHE[name]

    return _MARK.sub(one, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return render(markdown)
