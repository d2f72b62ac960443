"""``twin report DIR``: one self-contained HTML page of a sweep folder, parsed
here and opened in headless Chromium (its tables sorted by the page's script)."""

from __future__ import annotations

import base64
import csv
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_plot_layout import write_pool_ratio

from twin.cli import main
from twin.viz.attainment import knees
from twin.viz.report import build_report
from twin.viz.style import PlotOptions

TRACE_SHA = "ab" * 32


class Page(HTMLParser):
    """The tables (id -> header, rows of cell texts), the images' and links'
    addresses, the scripts and the list items of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, tuple[list[str], list[list[str]]]] = {}
        self.urls: list[str] = []
        self.scripts: list[dict] = []
        self.items: list[str] = []
        self.attrs_of: dict[str, dict] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self._in_head = False
        self._li: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.attrs_of[a["id"]] = a
        for key in ("src", "href"):
            if key in a:
                self.urls.append(a[key])
        if tag == "body":
            self.attrs_of["<body>"] = a
        if tag == "script":
            self.scripts.append(a)
        if tag == "table":
            self._table = a.get("id", "")
            self.tables[self._table] = ([], [])
        elif tag == "thead":
            self._in_head = True
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "li":
            self._li = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            head, rows = self.tables[self._table]
            if self._in_head:
                head.extend(self._row)
            else:
                rows.append(self._row)
            self._row = None
        elif tag == "thead":
            self._in_head = False
        elif tag == "table":
            self._table = None
        elif tag == "li" and self._li is not None:
            self.items.append("".join(self._li))
            self._li = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._li is not None:
            self._li.append(data)


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A pool-ratio-shaped folder of 10 configurations, each run's JSON with its
    header, and its report, written by ``twin report``."""
    tmp_path = tmp_path_factory.mktemp("sweep")
    rows = write_pool_ratio(tmp_path, 1)
    (tmp_path / "runs").mkdir()
    for r in rows:
        header = {
            "tool": "pd-twin", "version": "0.1.0", "code_sha256": "c0de" * 16,
            "spec": {"name": "pool-ratio", "seed": 0}, "spec_sha256": r["run_id"] + "0" * 52,
            "trace_sha256": {"AzureLLMInferenceTrace_conv.csv": TRACE_SHA},
            "profile_sha256": None, "perf_model": "roofline:llama-2-13b@a100-80gbx1",
        }  # fmt: skip
        doc = {"params": {}, "header": header, "summary": {}}
        (tmp_path / "runs" / f"{r['run_id']}.json").write_text(json.dumps(doc))
    assert main(["report", str(tmp_path), "--dpi", "40"]) == 0
    return tmp_path, rows


def test_the_report_holds_every_configuration_run_hash_and_plot(sweep):
    d, rows = sweep
    notes: list[str] = []
    text = build_report(d, PlotOptions(dpi=40), note=notes.append)
    assert (d / "report.html").read_text(encoding="utf-8") == text  # the same bytes again
    page = parse(text)
    # every configuration, with its knee and goodput
    head, configs = page.tables["configs"]
    assert head[:4] == ["configuration", "trace", "scheduler", "prefill"]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    assert [c[0] for c in configs] == labels and len(labels) == 10
    with open(d / "runs.csv", newline="") as f:
        found = knees(list(csv.DictReader(f)), 0.9)
    knee_col = head.index("knee (workload.rate_scale)")
    assert [c[knee_col] for c in configs] == [
        "" if found[lab] is None else f"{found[lab]:g}" for lab in labels
    ]
    with open(d / "goodput.csv", newline="") as f:
        gp = {r["label"]: r for r in csv.DictReader(f)}
    g_col = head.index("goodput (req/s)")
    assert [float(c[g_col]) for c in configs] == [
        pytest.approx(float(gp[lab]["goodput_rps_mean"]), rel=1e-5) for lab in labels
    ]
    # every run, with its resolved spec's sha256; the hashes the runs recorded
    head, runs = page.tables["runs"]
    assert [r[0] for r in runs] == [r["run_id"] for r in rows]
    assert [r[-1] for r in runs] == [r["run_id"] + "0" * 52 for r in rows]
    hashes = dict(map(tuple, page.tables["hashes"][1]))
    assert hashes["trace AzureLLMInferenceTrace_conv.csv"] == TRACE_SHA
    assert hashes["code_sha256"] == "c0de" * 16
    # the plots are embedded PNGs; nothing is fetched from anywhere
    assert len(page.urls) == 2
    for url in page.urls:
        assert url.startswith("data:image/png;base64,")
        assert base64.b64decode(url.split(",", 1)[1], validate=True)[:8] == b"\x89PNG\r\n\x1a\n"
    assert all("src" not in s for s in page.scripts) and "<link" not in text
    # the sweep spec, and the notes of what could not be drawn
    assert "name: pool-ratio" in text and "slo: {ttft: 1 s" in text
    assert notes and page.items == notes
    assert any(n.startswith("no CDFs") for n in notes)


def test_a_goodput_folder_alone_makes_a_report(sweep, tmp_path):
    d, rows = sweep
    for name in ("goodput.csv", "spec.yaml"):
        (tmp_path / name).write_bytes((d / name).read_bytes())
    page = parse(build_report(tmp_path, PlotOptions(dpi=30)))
    head, configs = page.tables["configs"]
    assert [c[0] for c in configs] == list(dict.fromkeys(r["label"] for r in rows))
    assert "goodput (req/s)" in head and "runs" not in page.tables
    assert len(page.urls) == 1  # the goodput bars
    assert any("no attainment plot" in n for n in page.items)


def test_twin_report_refuses_what_is_not_a_sweep(sweep, tmp_path, capsys):
    d, _ = sweep
    assert (d / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(d), "--out", str(tmp_path / "r.html"), "--size", "x"]) == 2
    assert "--size: 'x'; expected W,H" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin: error: ") and "no runs.csv or goodput.csv" in err
    assert main(["report", str(d), "--facet", "nope"]) == 2
    assert "--facet: 'nope' is not a swept key" in capsys.readouterr().err


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt install chromium)"
)
def test_the_report_renders_in_chromium_and_its_tables_sort(sweep, tmp_path):
    d, rows = sweep
    # the configurations sorted by a link; the runs by two clicks on a header (up, then down)
    link = "#sort=configs:goodput%20(req%2Fs):desc&click=runs:run_id&click=runs:run_id"
    url = (d / "report.html").as_uri() + link
    argv = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
        "--dump-dom", url,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # the page's own console: nothing logged, nothing thrown
    console = [
        line for line in done.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line
    ]
    assert console == []
    page = parse(done.stdout)
    assert page.attrs_of["<body>"].get("data-ready") == "1"  # the script ran to its end
    head, configs = page.tables["configs"]
    g_col = head.index("goodput (req/s)")
    values = [float(c[g_col]) for c in configs]
    with open(d / "goodput.csv", newline="") as f:
        written = [float(r["goodput_rps_mean"]) for r in csv.DictReader(f)]
    assert values == pytest.approx(sorted(written, reverse=True), rel=1e-5)
    assert sorted(written, reverse=True) != written
    assert page.attrs_of["configs"]["data-sorted"] == "goodput (req/s):desc"
    ids = [r[0] for r in page.tables["runs"][1]]
    assert ids == sorted((r["run_id"] for r in rows), reverse=True)
    assert page.attrs_of["runs"]["data-sorted"] == "run_id:desc"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda lines: [lines[0], lines[1] + ",extra", *lines[2:]],
         "runs.csv: line 2: {n1} cells; the header (line 1) has {n}"),
        (lambda lines: [*lines[:3], lines[3].rsplit(",", 2)[0], *lines[4:]],
         "runs.csv: line 4: {n2} cells; the header (line 1) has {n}"),
        (lambda lines: [], "runs.csv: empty; expected a CSV with a header line"),
        (lambda lines: lines[:1], "runs.csv: a header and no runs"),
    ],
)  # fmt: skip
def test_a_ragged_or_empty_runs_csv_is_one_error_naming_the_line(
    sweep, tmp_path, capsys, edit, message
):
    d, _ = sweep
    lines = (d / "runs.csv").read_text().splitlines()
    n = len(lines[0].split(","))
    (tmp_path / "runs.csv").write_text("".join(f"{x}\n" for x in edit(lines)))
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"twin: error: {tmp_path / 'runs.csv'}: ")
    assert message.format(n=n, n1=n + 1, n2=n - 2) in err, err
    assert not (tmp_path / "report.html").exists()
