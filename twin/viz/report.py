"""One self-contained HTML page of a sweep folder (``twin report DIR``), to open
from a file manager or attach to a review.

It holds, with nothing fetched from anywhere (no external URL, no CDN, no
fonts): the plots of :func:`twin.viz.plots.sweep_figures` as base64 PNG data
URIs; a table of the configurations (each one's knee from runs.csv and its
goodput from goodput.csv) and a table of the runs, both sorted by clicking a
header (a small inline script); the data hashes the runs recorded (code,
traces, profile, each run's resolved-spec sha256); the sweep spec as written
(``spec.yaml``) and the first run's resolved spec; and the sweep's notes (what
could not be drawn or read).

The page is deterministic: the same folder gives the same bytes (no dates).
A URL fragment ``#sort=TABLE:COLUMN:asc|desc`` (``configs`` or ``runs``, a
column's header text) sorts a table when the page opens, so a link can point at
a sorted view; ``#click=TABLE:COLUMN`` clicks a header as a person would;
several of either join with ``&``.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from twin._io import read_text
from twin.errors import TwinError
from twin.viz.attainment import knees
from twin.viz.canvas import (
    DEFAULT_TARGET,
    RATE_COLUMNS,
    RATE_UNIT,
    SVG_HASHSALT,
    _configs,
    _float,
    _read_csv,
    _styler,
    swept_columns,
)
from twin.viz.plots import sweep_figures
from twin.viz.style import PlotOptions

RUN_METRICS = (
    ("slo_attainment", "attainment"),
    ("ttft_s.p50", "TTFT p50 (s)"),
    ("ttft_s.p99", "TTFT p99 (s)"),
    ("tpot_s.p50", "TPOT p50 (s)"),
    ("tpot_s.p99", "TPOT p99 (s)"),
    ("throughput_rps", "throughput (req/s)"),
    ("completed", "completed"),
    ("requests", "requests"),
)
FIGURE_TITLES = {
    "attainment": "SLO attainment against the rate",
    "goodput": "Goodput per configuration",
    "cdf": "TTFT and TPOT CDFs at one rate",
}

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 12px; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f0f0f0; cursor: pointer; user-select: none; position: sticky; top: 0; }
th[aria-sort=ascending]::after { content: " \\25B2"; }
th[aria-sort=descending]::after { content: " \\25BC"; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: 0.6em; overflow: auto; font-size: 12px; }
code { font-size: 12px; }
.scroll { max-height: 36em; overflow: auto; display: inline-block; }
"""

# Sorts a table by a header's column, numbers by value (cells carry data-v), the rest as
# text; a second click reverses. #sort=TABLE:COLUMN:asc|desc sorts when the page opens,
# #click=TABLE:COLUMN clicks that header (several of either joined by &).
SCRIPT = """
"use strict";
function sortTable(table, col, dir) {
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  const key = (r) => {
    const c = r.cells[col];
    return c.dataset.v !== undefined ? parseFloat(c.dataset.v) : c.textContent;
  };
  const sign = dir === "desc" ? -1 : 1;
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    const xn = typeof x === "number", yn = typeof y === "number";
    if (xn && yn) {
      if (isNaN(x) !== isNaN(y)) return isNaN(x) ? 1 : -1;
      return sign * ((x > y) - (x < y));
    }
    return sign * String(x).localeCompare(String(y));
  });
  rows.forEach((r) => body.appendChild(r));
  Array.from(table.tHead.rows[0].cells).forEach((th, i) => {
    if (i === col) th.setAttribute("aria-sort", dir === "desc" ? "descending" : "ascending");
    else th.removeAttribute("aria-sort");
  });
  table.dataset.sorted = table.tHead.rows[0].cells[col].textContent + ":" + dir;
}
document.querySelectorAll("table.sortable").forEach((table) => {
  Array.from(table.tHead.rows[0].cells).forEach((th, i) => {
    th.addEventListener("click", () => {
      const asc = th.getAttribute("aria-sort") === "ascending";
      sortTable(table, i, asc ? "desc" : "asc");
    });
  });
});
decodeURIComponent(location.hash.slice(1)).split("&").forEach((part) => {
  const m = /^(sort|click)=([^:]+):(.+?)(?::(asc|desc))?$/.exec(part);
  const table = m && document.getElementById(m[2]);
  if (!table) return;
  const heads = Array.from(table.tHead.rows[0].cells);
  const col = heads.map((th) => th.textContent).indexOf(m[3]);
  if (col < 0) return;
  if (m[1] === "click") heads[col].click();
  else if (m[4]) sortTable(table, col, m[4]);
});
document.body.dataset.ready = "1";
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _cell(value: str | None, text_only: bool = False) -> str:
    """A ``<td>``: numbers right-aligned, carrying their value for sorting."""
    text = "" if value is None else str(value)
    v = None if text_only else _float(text)
    if v is None:
        if text.lower() == "nan":
            return '<td class="n" data-v="NaN">NaN</td>'
        return f"<td>{_e(text)}</td>"
    shown = f"{v:.6g}" if ("." in text or "e" in text.lower()) else text
    return f'<td class="n" data-v="{v!r}">{_e(shown)}</td>'


def _table(
    table_id: str, head: Sequence[str], rows: Sequence[Sequence[str | None]], text: int = 1
) -> str:
    """A sortable table; its first ``text`` columns are text whatever they hold
    (a run id of digits, a label)."""
    out = [f'<div class="scroll"><table class="sortable" id="{_e(table_id)}"><thead><tr>']
    out += [f"<th>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>" + "".join(_cell(c, i < text) for i, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _png(fig: Any, opts: PlotOptions) -> str:
    import matplotlib

    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": SVG_HASHSALT}):
        fig.savefig(buf, format="png", dpi=opts.dpi, metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _run_docs(
    d: Path, rows: Sequence[Mapping[str, str]], say: Callable[[str], None]
) -> dict[str, Any]:
    """Each run's JSON header by run_id (those that can be read)."""
    out: dict[str, Any] = {}
    missing = 0
    for r in rows:
        rid = r.get("run_id") or ""
        path = d / "runs" / f"{rid}.json"
        try:
            doc = json.loads(read_text(path))
        except (TwinError, ValueError):
            missing += 1
            continue
        header = doc.get("header") if isinstance(doc, dict) else None
        if isinstance(header, dict):
            out[rid] = header
        else:
            missing += 1
    if missing:
        say(f"{missing} of {len(rows)} runs have no readable {d / 'runs'}/<run_id>.json: "
            "their hashes are not shown")  # fmt: skip
    return out


def _hashes(headers: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(what, value) of the hashes and versions the runs recorded, each distinct value once."""
    seen: dict[tuple[str, str], None] = {}
    for h in headers.values():
        for key in ("version", "code_sha256", "perf_model", "profile_sha256"):
            if h.get(key) is not None:
                seen[(key, str(h[key]))] = None
        traces = h.get("trace_sha256")
        if isinstance(traces, dict):
            for name, sha in sorted(traces.items()):
                seen[(f"trace {name}", str(sha))] = None
    return list(seen)


def build_report(  # noqa: C901
    d: str | Path, opts: PlotOptions | None = None, note: Callable[[str], None] | None = None
) -> str:
    """The report page of the sweep folder ``d`` as HTML text; ``note`` hears
    what could not be drawn or read (the page lists it too)."""
    import yaml

    from twin import yamlio

    d = Path(d)
    if not d.is_dir():
        raise TwinError(f"{d}: not a folder")
    runs_csv, goodput_csv = d / "runs.csv", d / "goodput.csv"
    if not runs_csv.is_file() and not goodput_csv.is_file():
        raise TwinError(f"{d}: no runs.csv or goodput.csv; is it a twin sweep or goodput folder?")
    rows = _read_csv(runs_csv) if runs_csv.is_file() else []
    if runs_csv.is_file() and not rows:
        raise TwinError(f"{runs_csv}: a header and no runs; expected a row per run (twin sweep)")
    gp_rows = _read_csv(goodput_csv) if goodput_csv.is_file() else []
    opts = opts or PlotOptions()
    notes: list[str] = []

    def say(msg: str) -> None:
        notes.append(msg)
        if note is not None:
            note(msg)

    spec_text = ""
    spec: dict[str, Any] = {}
    if (d / "spec.yaml").is_file():
        try:
            spec_text = read_text(d / "spec.yaml", "sweep spec")
            loaded = yamlio.load(spec_text)
        except yaml.YAMLError as e:
            raise TwinError(f"{d / 'spec.yaml'}: cannot read: {e}") from None
        spec = loaded if isinstance(loaded, dict) else {}
    else:
        say(f"no {d / 'spec.yaml'}: the sweep spec is not shown")
    slo = spec.get("slo")
    slo = slo if isinstance(slo, dict) else {}
    target = _float(slo.get("target")) or DEFAULT_TARGET
    figs = sweep_figures(d, opts, say)
    if rows and any(c in rows[0] for c in RATE_COLUMNS) and "slo_attainment" in rows[0]:
        from twin.viz.knees import knee_notes

        for line in knee_notes(rows, target, str(runs_csv)):
            say(line)
    images = {name: _png(fig, opts) for name, fig in figs.items()}
    headers = _run_docs(d, rows, say) if rows else {}

    name = str(spec.get("name") or d.name)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(name)}: sweep report</title><style>{STYLE}</style></head><body>",
        f"<h1>{_e(name)}: sweep report</h1>",
    ]
    if spec.get("description"):
        parts.append(f"<p>{_e(spec['description'])}</p>")

    # -- overview
    rate_col = next((c for c in RATE_COLUMNS if rows and c in rows[0]), None)
    facts = []
    if rows:
        labels = list(dict.fromkeys(r.get("label") or "all" for r in rows))
        facts.append(f"{len(rows)} runs of {len(labels)} configurations")
        if rate_col is not None:
            rates = sorted({v for r in rows if (v := _float(r.get(rate_col))) is not None})
            unit = RATE_UNIT[rate_col]
            facts.append(
                f"{len(rates)} rates ({rate_col}: {', '.join(f'{x:g}' for x in rates)}{unit})"
            )
        seeds = sorted({r.get("seed", "") for r in rows} - {""})
        if seeds:
            facts.append(f"seeds {', '.join(seeds)}")
    if gp_rows:
        facts.append(f"goodput of {len(gp_rows)} configurations")
    facts.append(f"SLO target {target:g}")
    parts.append("<p>" + _e("; ".join(facts)) + "</p>")

    # -- figures
    if images:
        parts.append("<h2>Plots</h2>")
    for key, data in images.items():
        title = FIGURE_TITLES.get(key, key)
        img = f'<img alt="{_e(title)}" src="data:image/png;base64,{data}">'
        parts.append(f'<figure id="fig-{key}">{img}<figcaption>{_e(title)}</figcaption></figure>')

    # -- configurations: knee and goodput
    parts.append("<h2>Configurations</h2>")
    parts.append(_configs_table(rows, gp_rows, target, opts, str(d)))

    # -- runs
    if rows:
        keys = swept_columns(rows[0].keys(), "run_id", "label")
        params = _configs(rows, keys)
        styler = _styler(
            list(params.values()), keys, PlotOptions(labels=opts.labels), str(runs_csv)
        )
        metrics = [(c, t) for c, t in RUN_METRICS if c in rows[0]]
        shown = [k for k in styler.shown if k in rows[0]]
        extra = [c for c in (rate_col, "seed") if c and c in rows[0]]
        head = ["run_id", *(styler.name(k) or k for k in shown), *extra, *(t for _, t in metrics),
                "spec sha256"]  # fmt: skip
        body = []
        for r in rows:
            rid = r.get("run_id", "")
            sha = str(headers.get(rid, {}).get("spec_sha256", ""))
            body.append([rid, *(r.get(k, "") for k in shown), *(r.get(c, "") for c in extra),
                         *(r.get(c, "") for c, _ in metrics), sha])  # fmt: skip
        parts.append(f"<h2>Runs</h2><p>{len(rows)} runs; click a header to sort.</p>")
        parts.append(_table("runs", head, body))

    # -- hashes and specs
    parts.append("<h2>Data and code</h2>")
    hashes = _hashes(headers)
    if hashes:
        parts.append(_table("hashes", ["what", "value"], hashes))
    else:
        parts.append("<p>No run recorded its hashes here.</p>")
    if spec_text:
        parts.append("<h2>Sweep spec (spec.yaml)</h2>")
        parts.append(f"<pre>{_e(spec_text)}</pre>")
    first = next(iter(headers.values()), None)
    if first is not None and isinstance(first.get("spec"), dict):
        resolved = yaml.safe_dump(first["spec"], sort_keys=False)
        rid = next(iter(headers))
        parts.append(f"<details><summary>Resolved spec of run {_e(rid)} (the others differ in "
                     "the swept keys above)</summary>")  # fmt: skip
        parts.append(f"<pre>{_e(resolved)}</pre></details>")

    # -- notes
    parts.append("<h2>Notes</h2>")
    if notes:
        parts.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    else:
        parts.append("<p>None: every plot and table could be made.</p>")
    parts.append(f"<script>{SCRIPT}</script></body></html>")
    return "\n".join(parts) + "\n"


def _configs_table(
    rows: list[dict[str, str]], gp_rows: list[dict[str, str]], target: float,
    opts: PlotOptions, where: str,
) -> str:  # fmt: skip
    """One row per configuration: its varying keys, knee, goodput."""
    found = knees(rows, target) if rows and any(c in rows[0] for c in RATE_COLUMNS) else {}
    rate_col = next((c for c in RATE_COLUMNS if rows and c in rows[0]), "")
    by_label = {r.get("label") or "": r for r in gp_rows}
    if rows:
        keys = swept_columns(rows[0].keys(), "run_id", "label")
        params = _configs(rows, keys)
    else:
        keys = swept_columns(gp_rows[0].keys(), "label", "goodput_rps_mean") if gp_rows else []
        params = _configs(gp_rows, keys)
    styler = _styler(list(params.values()), keys, PlotOptions(labels=opts.labels), where)
    head = ["configuration", *(styler.name(k) or k for k in styler.shown)]
    if found:
        head.append(f"knee ({rate_col})")
    if gp_rows:
        head += ["goodput (req/s)", "± 95% CI", "per GPU", "seeds", "GPUs"]
    body = []
    for label, cfg in params.items():
        row: list[str | None] = [label, *(cfg.get(k, "") for k in styler.shown)]
        if found:
            k = found.get(label)
            row.append(repr(k) if k is not None else "")
        if gp_rows:
            g = by_label.get(label, {})
            row += [g.get("goodput_rps_mean"), g.get("goodput_rps_ci95"),
                    g.get("goodput_per_gpu"), g.get("seeds"), g.get("gpus")]  # fmt: skip
        body.append(row)
    note = "knee: the largest rate meeting the target before the first that misses it; "
    note += "empty when even the lowest rate misses it. " if found else ""
    return f"<p>{_e(note)}Click a header to sort.</p>" + _table("configs", head, body)


def write_report(
    d: str | Path,
    out: str | Path | None = None,
    opts: PlotOptions | None = None,
    note: Callable[[str], None] | None = None,
) -> Path:
    """:func:`build_report` written to ``out`` (default ``d/report.html``)."""
    path = Path(out) if out is not None else Path(d) / "report.html"
    text = build_report(d, opts, note)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        raise TwinError(f"{path}: cannot write: {e.strerror}") from None
    return path
