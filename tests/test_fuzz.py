"""A corpus of bad inputs: every case must end in exit 2 and exactly one
``twin: error:`` line on stderr, with no traceback and nothing accepted
silently.

The cases are data: :data:`CASES`, generated below from a few tiny valid
inputs (a spec, a topology, a file per trace format) and lists of what can be
wrong with them (keys, types, values, units, YAML syntax, encodings, sizes),
plus every subcommand's arguments. Each runs in-process through
:func:`twin.cli.main`; a handful run again as real subprocesses. ``{d}`` in an
argument is the case's temporary folder, where its ``files`` are written.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from twin.cli import main

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    files: dict[str, bytes] = field(default_factory=dict)
    match: str = ""  # a piece of the error line: the file, key or value it must name


def _b(text: str) -> bytes:
    return text.encode("utf-8")


# -- specs ---------------------------------------------------------------------------------

SPEC: dict[str, Any] = {
    "name": "tiny",
    "seed": 0,
    "model": "llama-3.1-8b",
    "gpu": "h100-sxm",
    "cluster": {"instances": 1, "tp": 1},
    "engine": {"block_size": 16, "max_num_seqs": 8},
    "perf": {"kind": "roofline"},
    "scheduler": {"name": "colocated"},
    "workload": {
        "lengths": "azure-conv",
        "arrival": {"process": "poisson", "rate": 2.0},
        "max_requests": 5,
    },
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}

SPLIT: dict[str, Any] = {
    **SPEC,
    "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "prefill": 1, "decode": 1},
    "scheduler": {"name": "disagg"},
}


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with ``path`` (dotted) set; ``...`` deletes it."""
    out = yaml.safe_load(yaml.safe_dump(doc))
    node = out
    *parents, last = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if value is ...:
        node.pop(last, None)
    else:
        node[last] = value
    return out


def _dump(doc: dict[str, Any]) -> bytes:
    return _b(yaml.safe_dump(doc, sort_keys=False))


# (key, bad value, a piece the message must show); each becomes a `twin spec` case
SPEC_VALUES: list[tuple[str, Any, str]] = [
    ("seed", "abc", "seed"),
    ("seed", -1, "seed"),
    ("seed", 1.5, "seed"),
    ("seed", [1], "seed"),
    ("seed", True, "seed"),
    ("model", "no-such-model", "no-such-model"),
    ("model", 7, "model"),
    ("model", {"layers": -1}, "model"),
    ("model", [], "model"),
    ("gpu", "h900", "h900"),
    ("gpu", 3, "gpu"),
    ("gpu", {"name": "x"}, "gpu"),
    ("name", [1, 2], "name"),
    ("name", {"a": 1}, "name"),
    ("description", ["a"], "description"),
    ("description", {"a": 1}, "description"),
    ("cluster", "big", "cluster"),
    ("cluster", [1], "cluster"),
    ("cluster.instances", 0, "cluster.instances"),
    ("cluster.instances", -3, "cluster.instances"),
    ("cluster.instances", 1.5, "cluster.instances"),
    ("cluster.instances", "four", "cluster.instances"),
    ("cluster.instances", 1e8, "instances x dp x tp x pp"),
    ("cluster.instances", 10**12, "instances x dp x tp x pp"),
    ("cluster.instances", True, "cluster.instances"),
    ("cluster.instances", None, "cluster.instances"),
    ("cluster.tp", 0, "cluster.tp"),
    ("cluster.tp", 3, "cluster.tp"),
    ("cluster.tp", -8, "cluster.tp"),
    ("cluster.tp", "eight", "cluster.tp"),
    ("cluster.tp", 1e9, "x 1000000000 x"),
    ("cluster.pp", 0, "cluster.pp"),
    ("cluster.pp", "x", "cluster.pp"),
    ("cluster.pp", 1e9, "x 1000000000)"),
    ("cluster.placement", "random", "placement"),
    ("cluster.gpus_per_node", 0, "gpus_per_node"),
    ("cluster.gpus_per_node", 1e9, "gpus_per_node"),
    ("cluster.nodes", 0, "nodes"),
    ("cluster.nodes", 1e8, "nodes"),
    ("cluster.topology", "no-such-topo", "no-such-topo"),
    ("cluster.topology", 5, "topology"),
    ("cluster.colour", "red", "colour"),
    ("engine", "vllm", "engine"),
    ("engine.block_size", 0, "block_size"),
    ("engine.block_size", -16, "block_size"),
    ("engine.block_size", "16 tokens", "block_size"),
    ("engine.max_num_seqs", 0, "max_num_seqs"),
    ("engine.max_num_seqs", "many", "max_num_seqs"),
    ("engine.max_batched_tokens", 0, "max_batched_tokens"),
    ("engine.max_batched_tokens", -1, "max_batched_tokens"),
    ("engine.chunked_prefill", "yes please", "chunked_prefill"),
    ("engine.chunked_prefill", 2, "chunked_prefill"),
    ("engine.prefix_caching", "maybe", "prefix_caching"),
    ("engine.gpu_memory_utilization", 0, "gpu_memory_utilization"),
    ("engine.gpu_memory_utilization", 1.5, "gpu_memory_utilization"),
    ("engine.gpu_memory_utilization", "90%", "gpu_memory_utilization"),
    ("engine.gpu_memory_utilization", -0.1, "gpu_memory_utilization"),
    ("engine.watermark", -1, "watermark"),
    ("engine.watermark", 2, "watermark"),
    ("engine.activation_reserve", "2 parsec", "activation_reserve"),
    ("engine.activation_reserve", -5, "activation_reserve"),
    ("engine.oversized", "ignore-it", "oversized"),
    ("engine.max_model_len", 0, "max_model_len"),
    ("engine.max_model_len", "long", "max_model_len"),
    ("engine.fast_forward", "sometimes", "fast_forward"),
    ("engine.turbo", True, "turbo"),
    ("perf", "fast", "perf"),
    ("perf.kind", "magic", "magic"),
    ("perf.kind", 3, "perf.kind"),
    ("perf.kind", {"x": 1}, "perf.kind"),
    ("perf.kind", ["roofline"], "perf.kind"),
    ("perf.table", "/no/such/table.csv", "perf"),
    ("scheduler", 5, "scheduler"),
    ("scheduler.name", "splitwse", "splitwse"),
    ("scheduler.name", 3, "scheduler.name"),
    ("scheduler.routing", "psychic", "psychic"),
    ("scheduler.priority", "high", "priority"),
    ("workload", "lots", "workload"),
    ("workload.lengths", "no-such-lengths", "no-such-lengths"),
    ("workload.lengths", 12, "lengths"),
    ("workload.arrival", "poisson", "arrival"),
    ("workload.arrival.process", "chaotic", "chaotic"),
    ("workload.arrival.rate", 0, "rate"),
    ("workload.arrival.rate", -2, "rate"),
    ("workload.arrival.rate", "fast", "rate"),
    ("workload.arrival.rate", ".inf", "rate"),
    ("workload.arrival.rate", float("nan"), "rate"),
    ("workload.arrival.rate", float("inf"), "rate"),
    ("workload.arrival.burst", 3, "burst"),
    ("workload.max_requests", 0, "max_requests"),
    ("workload.max_requests", -5, "max_requests"),
    ("workload.max_requests", 2.5, "max_requests"),
    ("workload.max_requests", "all", "max_requests"),
    ("workload.max_requests", 1e15, "max_requests"),
    ("workload.duration", "forever", "duration"),
    ("workload.duration", -1, "duration"),
    ("workload.trace", 5, "trace"),
    ("workload.trace", "/no/such/trace.csv", "trace"),
    ("workload.format", "parquet", "parquet"),
    ("workload.rate_scale", 0, "rate_scale"),
    ("workload.rate_scale", "x", "rate_scale"),
    ("slo", "tight", "slo"),
    ("slo.ttft", "1 parsec", "ttft"),
    ("slo.ttft", -1, "ttft"),
    ("slo.ttft", "0 s", "ttft"),
    ("slo.ttft", [1], "ttft"),
    ("slo.ttft", "nan s", "ttft"),
    ("slo.tpot", "fast", "tpot"),
    ("slo.tpot", "-5 ms", "tpot"),
    ("slo.tpot", {"ms": 5}, "tpot"),
    ("slo.target", 0, "target"),
    ("slo.target", 1.5, "target"),
    ("slo.target", "most", "target"),
    ("slo.ttft_at", "sometime", "ttft_at"),
    ("slo.client_latency", "-5 ms", "client_latency"),
    ("slo.e2e", "1 s", "e2e"),
    ("transfer.mode", "teleport", "teleport"),
    ("transfer.handoff", "throw", "throw"),
    ("transfer.per_descriptor", "2 parsec", "per_descriptor"),
    ("transfer.router_hop", -1, "router_hop"),
    ("transfer.control_rtt", "x", "control_rtt"),
    ("transfer.descriptors", "page", "descriptors"),
    ("transfer.multi_nic", "both", "multi_nic"),
    ("output", "everything", "output"),
    ("output.window", "0 s", "window"),
    ("output.window", "wide", "window"),
    ("colour", "blue", "colour"),
    ("workload.format", {"x": 1}, "format"),
    ("workload.format", ["azure"], "format"),
    ("workload.lengths", {"x": 1}, "lengths"),
    ("workload.arrival.process", {"x": 1}, "process"),
    ("workload.arrival.process", ["poisson"], "process"),
    ("workload.rate_schedule", {"kind": {"x": 1}}, "rate_schedule"),
    ("workload.rate_schedule", {"kind": "diurnal", "colour": 1}, "colour"),
    ("workload.rate_schedule", "diurnal", "rate_schedule"),
    ("transfer.mode", {"x": 1}, "mode"),
    ("transfer.handoff", ["push"], "handoff"),
    ("transfer.descriptors", {"x": 1}, "descriptors"),
    ("scheduler.routing", {"x": 1}, "routing"),
    ("scheduler.name", {"x": 1}, "scheduler"),
    ("scheduler.name", ["colocated"], "scheduler"),
    ("engine.oversized", {"x": 1}, "oversized"),
    ("cluster.placement", {"x": 1}, "placement"),
    ("slo.ttft_at", ["decode"], "ttft_at"),
    ("model", {"name": {"x": 1}}, "model"),
    ("gpu", {"name": ["h100"]}, "gpu"),
    ("events", "boom", "events"),
    ("events", [{"at": "1 s", "kind": {"x": 1}}], "events"),
    ("events", [{"at": "soon", "kind": "fail", "instance": 0}], "events"),
    ("events", [{"at": "1 s", "kind": "fail", "instance": 99}], "events"),
    ("events", [5], "events"),
    ("retry", "always", "retry"),
    ("failures", "often", "failures"),
    ("scaling", [1], "scaling"),
    ("sweep", "everything", "sweep"),
    ("compare", "everything", "compare"),
]

SPLIT_VALUES: list[tuple[str, Any, str]] = [
    ("cluster.prefill", 0, "prefill"),
    ("cluster.prefill", -1, "prefill"),
    ("cluster.prefill", "two", "prefill"),
    ("cluster.prefill", 1e8, "prefill"),
    ("cluster.decode", 0, "decode"),
    ("cluster.decode", {"instances": 0}, "decode"),
    ("cluster.decode", {"instances": 1, "tp": 3}, "decode"),
    ("cluster.decode", {"instances": 1e8}, "decode"),
    ("cluster.decode", {"instances": 1, "colour": 1}, "colour"),
    ("cluster.nodes", 0, "nodes"),
    ("cluster.nodes", -2, "nodes"),
    ("cluster.nodes", 1e8, "nodes"),
    ("cluster.nodes", "many", "nodes"),
    ("cluster.topology", "no-such-topology", "no-such-topology"),
    ("cluster.topology", {"name": "x"}, "topology"),
    ("scheduler.name", "colocated-typo", "colocated-typo"),
    ("transfer.mode", "teleport", "teleport"),
]

# raw spec texts: YAML syntax, encodings, duplicate keys, the top level
SPEC_TEXTS: list[tuple[str, bytes, str]] = [
    ("tab-indent", b"name: x\ncluster:\n\tinstances: 1\n", "line"),
    ("unclosed-bracket", b"cluster: [1, 2\n", "line"),
    ("unclosed-quote", b'name: "abc\n', "line"),
    ("bad-indent", b"cluster:\n  tp: 1\n instances: 2\n", "line"),
    ("colon-in-flow", b"a: {b: c: d}\n", "line"),
    ("anchor-missing", b"a: *nothing\n", "nothing"),
    ("list-top", b"- 1\n- 2\n", "mapping"),
    ("scalar-top", b"just text\n", "mapping"),
    ("number-top", b"42\n", "mapping"),
    ("dup-top", b"name: a\nseed: 1\nseed: 2\n", "seed"),
    ("dup-nested", b"cluster:\n  tp: 1\n  tp: 2\n", "tp"),
    ("dup-flow", b"slo: {ttft: 1 s, ttft: 2 s}\n", "ttft"),
    ("latin1", "name: caf\u00e9\n".encode("latin-1"), "0xe9"),
    ("latin1-line3", b"seed: 0\nmodel: llama-3.1-8b\nname: \xff\xfe\n", "line 3"),
    ("utf16", "name: x\n".encode("utf-16"), "UTF-8"),
    ("truncated-utf8", b"name: caf\xc3", "UTF-8"),
    ("nul-byte", b"name: a\x00b\n", "spec.yaml"),
    ("control-char", b"name: a\x07b\n", "spec.yaml"),
    ("python-tag", b"name: !!python/object:os.system ls\n", "spec.yaml"),
    ("unknown-tag", b"name: !custom x\n", "spec.yaml"),
    ("binary-garbage", bytes(range(256)), "spec.yaml"),
    ("empty-name-key", b": 1\n", "spec.yaml"),
    ("set-type", b"name: !!set {a, b}\n", "name"),
]


def _spec_cases() -> list[Case]:
    cases = []
    for key, value, match in SPEC_VALUES:
        cases.append(
            Case(
                f"spec-{key}={value!r}",
                ("spec", "{d}/spec.yaml"),
                {"spec.yaml": _dump(_set(SPEC, key, value))},
                match,
            )
        )
    for key, value, match in SPLIT_VALUES:
        cases.append(
            Case(
                f"split-{key}={value!r}",
                ("spec", "{d}/spec.yaml"),
                {"spec.yaml": _dump(_set(SPLIT, key, value))},
                match,
            )
        )
    for name, text, match in SPEC_TEXTS:
        cases.append(
            Case(f"spectext-{name}", ("spec", "{d}/spec.yaml"), {"spec.yaml": text}, match)
        )
        if name in ("latin1", "dup-nested", "tab-indent"):
            cases.append(
                Case(f"run-spectext-{name}", ("run", "{d}/spec.yaml"), {"spec.yaml": text}, match)
            )
    # missing required pieces
    for key in ("model", "workload"):
        cases.append(
            Case(
                f"spec-missing-{key}-run",
                ("run", "-q", "{d}/spec.yaml"),
                {"spec.yaml": _dump(_set(SPEC, key, ...))},
                "",
            )
        )
    # --set on a bundled spec
    for item, match in [
        ("cluster.instances=0", "instances"),
        ("cluster.instances=1e8", "instances"),
        ("cluster.tp=abc", "tp"),
        ("slo.ttft=1 parsec", "ttft"),
        ("engine.block_size=-1", "block_size"),
        ("nosuch.key=1", "nosuch"),
        ("=3", "--set"),
        ("no-equals-sign", "--set"),
        ("workload.max_requests=1e20", "max_requests"),
        ("model=[", "model"),
        ("cluster={instances: 1, instances: 2}", "instances"),
    ]:
        cases.append(Case(f"set-{item}", ("spec", "quickstart", "--set", item), {}, match))
        cases.append(Case(f"run-set-{item}", ("run", "-q", "quickstart", "--set", item), {}, match))
    return cases


# -- traces --------------------------------------------------------------------------------

AZURE_OK = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
)
SPLITWISE_OK = (
    "request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,token_size\n"
    "0,2,0,0.0,1,100,10\n"
    "1,2,0,0.5,1,120,12\n"
)
VIDUR_OK = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,100,10\n0.5,120,12\n"
LENGTHS_OK = "num_prefill_tokens,num_decode_tokens\n100,10\n120,12\n"
MOONCAKE_OK = (
    '{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n'
    '{"timestamp": 500, "input_length": 120, "output_length": 12, "hash_ids": [1, 2]}\n'
)

# (format, file suffix, valid text, header line, a good data row as a list of cells)
CSV_FORMATS = [
    ("azure", AZURE_OK),
    ("splitwise", SPLITWISE_OK),
    ("vidur", VIDUR_OK),
    ("lengths", LENGTHS_OK),
]


def _csv_mutations(ok: str) -> list[tuple[str, str | bytes]]:
    header, row1, row2 = ok.strip("\n").split("\n")
    cells = row2.split(",")
    n = len(cells)
    out: list[tuple[str, str | bytes]] = [
        ("empty", ""),
        ("header-only", header + "\n"),
        ("blank-lines", "\n\n\n"),
        ("missing-column", ",".join(header.split(",")[:-1]) + "\n" + row1 + "\n"),
        ("short-row", f"{header}\n{row1}\n{','.join(cells[:-1])}\n"),
        ("long-row", f"{header}\n{row1}\n{row2},7\n"),
        (
            "latin1-row",
            (f"{header}\n{row1}\n").encode()
            + b"caf\xe9,"
            + b",".join(c.encode() for c in cells[1:])
            + b"\n",
        ),  # fmt: skip
        ("latin1-header", b"caf\xe9," + (f"{header}\n{row1}\n").encode()),
        ("utf16", ok.encode("utf-16")),
        ("huge-cell", f'{header}\n{row1}\n"{"9" * 200_000}",' + ",".join(cells[1:]) + "\n"),
        ("unclosed-quote", f'{header}\n{row1}\n"{row2}\n'),
        ("zero-tokens", f"{header}\n{row1}\n{','.join(cells[:-1])},0\n"),
        ("neg-tokens", f"{header}\n{row1}\n{','.join(cells[:-1])},-4\n"),
        ("frac-tokens", f"{header}\n{row1}\n{','.join(cells[:-1])},1.5\n"),
        ("word-tokens", f"{header}\n{row1}\n{','.join(cells[:-1])},ten\n"),
        ("nan-tokens", f"{header}\n{row1}\n{','.join(cells[:-1])},nan\n"),
        ("inf-tokens", f"{header}\n{row1}\n{','.join(cells[:-1])},inf\n"),
        ("nul-byte", f"{header}\n{row1}\n{','.join(cells[:-1])},1\x002\n"),
    ]
    if n > 2:  # a timed format: break the time column
        ti = [h.strip() for h in header.split(",")].index(
            next(
                h
                for h in header.split(",")
                if h in ("TIMESTAMP", "arrival_timestamp", "arrived_at")
            )  # fmt: skip
        )

        def with_time(v: str) -> str:
            c = list(cells)
            c[ti] = v
            return f"{header}\n{row1}\n{','.join(c)}\n"

        out += [
            ("time-word", with_time("soon")),
            ("time-neg", with_time("-1")),
            ("time-nan", with_time("nan")),
            ("time-inf", with_time("inf")),
            ("time-empty", with_time("")),
            (
                "time-decreasing",
                with_time("1970-01-01 00:00:00" if ti == 0 else "0.0")
                if False
                else f"{header}\n{row2}\n{row1}\n",
            ),  # fmt: skip
        ]
    return out


def _trace_spec(trace: str, fmt: str) -> bytes:
    doc = _set(SPEC, "workload.trace", trace)
    doc = _set(doc, "workload.format", fmt)
    doc["workload"].pop("lengths")
    if fmt == "lengths":
        doc["workload"]["lengths"] = trace
        doc["workload"].pop("trace")
        doc["workload"].pop("format")
    else:
        doc["workload"].pop("arrival")
    return _dump(doc)


def _trace_cases() -> list[Case]:
    cases = []
    for fmt, ok in CSV_FORMATS:
        for name, text in _csv_mutations(ok):
            data = text if isinstance(text, bytes) else _b(text)
            for spec_fmt in (fmt, "auto") if fmt != "lengths" else (fmt,):
                cases.append(
                    Case(
                        f"trace-{fmt}-{name}-as-{spec_fmt}",
                        ("run", "-q", "{d}/spec.yaml"),
                        {"t.csv": data, "spec.yaml": _trace_spec("t.csv", spec_fmt)},
                        "t.csv",
                    )
                )
    row = '{"timestamp": 1000, "input_length": 10, "output_length": 5, "hash_ids": [3]}'
    first = MOONCAKE_OK.split("\n")[0]
    for name, text in [
        ("empty", b""),
        ("not-json", _b(first + "\n{timestamp: 1}\n")),
        ("list-line", _b(first + "\n[1, 2]\n")),
        ("string-line", _b(first + '\n"x"\n')),
        ("missing-key", _b(first + '\n{"timestamp": 1, "input_length": 2}\n')),
        ("ts-word", _b(first + "\n" + row.replace("1000", '"soon"') + "\n")),
        ("ts-neg", _b(first + "\n" + row.replace("1000", "-5") + "\n")),
        ("ts-decreasing", _b(row + "\n" + first + "\n")),
        ("ts-nan", _b(first + "\n" + row.replace("1000", "NaN") + "\n")),
        ("ts-inf", _b(first + "\n" + row.replace("1000", "Infinity") + "\n")),
        ("ts-bool", _b(first + "\n" + row.replace("1000", "true") + "\n")),
        ("ts-huge", _b(first + "\n" + row.replace("1000", "1e400") + "\n")),
        (
            "len-zero",
            _b(first + "\n" + row.replace('"input_length": 10', '"input_length": 0') + "\n"),
        ),
        (
            "len-float",
            _b(first + "\n" + row.replace('"input_length": 10', '"input_length": 2.5') + "\n"),
        ),
        (
            "len-str",
            _b(first + "\n" + row.replace('"input_length": 10', '"input_length": "ten"') + "\n"),
        ),
        (
            "len-list",
            _b(first + "\n" + row.replace('"input_length": 10', '"input_length": [10]') + "\n"),
        ),
        ("hash-str", _b(first + "\n" + row.replace("[3]", '"3"') + "\n")),
        ("hash-float", _b(first + "\n" + row.replace("[3]", "[3.5]") + "\n")),
        ("hash-nested", _b(first + "\n" + row.replace("[3]", "[[3]]") + "\n")),
        ("latin1", _b(first + "\n") + b'{"timestamp": 1000, "x": "caf\xe9"}\n'),
        ("utf16", MOONCAKE_OK.encode("utf-16")),
        ("truncated", _b(first + "\n" + row[:30])),
        ("bom-twice", b"\xef\xbb\xbf\xef\xbb\xbf" + _b(MOONCAKE_OK)),
        ("nul", _b(first + "\n") + b"\x00\n"),
    ]:
        for spec_fmt in ("mooncake", "auto"):
            cases.append(
                Case(
                    f"trace-mooncake-{name}-as-{spec_fmt}",
                    ("run", "-q", "{d}/spec.yaml"),
                    {"t.jsonl": text, "spec.yaml": _trace_spec("t.jsonl", spec_fmt)},
                    "t.jsonl",
                )
            )
    # auto-detection on files it cannot place
    for name, text in [
        ("unknown-header", b"a,b,c\n1,2,3\n"),
        ("latin1-header", b"caf\xe9,b\n1,2\n"),
        ("binary", bytes(range(1, 256))),
        ("empty", b""),
    ]:
        cases.append(
            Case(
                f"trace-auto-{name}",
                ("run", "-q", "{d}/spec.yaml"),
                {"t.csv": text, "spec.yaml": _trace_spec("t.csv", "auto")},
                "t.csv",
            )
        )
    return cases


# -- topologies ----------------------------------------------------------------------------

TOPO: dict[str, Any] = {
    "name": "tiny-topo",
    "node": {
        "gpu": "h100-sxm",
        "gpus": 8,
        "intra": {"kind": "nvswitch", "bandwidth": "450 GB/s"},
        "nics": {
            "count": 8,
            "kind": "infiniband",
            "bandwidth": "400 Gbps",
            "attach": "gpu",
            "pcie": "64 GB/s",
        },  # fmt: skip
    },
    "nodes": 2,
    "fabric": {"kind": "single-switch"},
}

TOPO_VALUES: list[tuple[str, Any, str]] = [
    ("nodes", 0, "nodes"),
    ("nodes", -1, "nodes"),
    ("nodes", 1.5, "nodes"),
    ("nodes", "two", "nodes"),
    ("nodes", 1e8, "nodes"),
    ("nodes", 10**15, "nodes"),
    ("node", "dgx", "node"),
    ("node.gpu", "h900", "h900"),
    ("node.gpus", 0, "gpus"),
    ("node.gpus", -8, "gpus"),
    ("node.gpus", 1e9, "gpus"),
    ("node.gpus", "eight", "gpus"),
    ("node.intra", "fast", "intra"),
    ("node.intra.kind", "telepathy", "telepathy"),
    ("node.intra.bandwidth", "fast", "bandwidth"),
    ("node.intra.bandwidth", -5, "bandwidth"),
    ("node.intra.bandwidth", "0 GB/s", "bandwidth"),
    ("node.intra.bandwidth", "450 parsec", "bandwidth"),
    ("node.nics", 8, "nics"),
    ("node.nics.count", 0, "count"),
    ("node.nics.count", -1, "count"),
    ("node.nics.count", 1e9, "count"),
    ("node.nics.kind", "carrier-pigeon", "carrier-pigeon"),
    ("node.nics.bandwidth", "lots", "bandwidth"),
    ("node.nics.bandwidth", "-400 Gbps", "bandwidth"),
    ("node.nics.attach", "nowhere", "nowhere"),
    ("node.nics.pcie", "x", "pcie"),
    ("node.nics.generation", "connectx-99", "connectx-99"),
    ("node.colour", "red", "colour"),
    ("fabric", "mesh", "fabric"),
    ("fabric.kind", "hypercube", "hypercube"),
    ("fabric.oversubscription", -1, "oversubscription"),
    ("colour", "red", "colour"),
    ("name", ["x"], "name"),
]

TOPO_TEXTS: list[tuple[str, bytes, str]] = [
    ("latin1", b"name: caf\xe9\nnodes: 1\n", "0xe9"),
    ("dup-key", b"name: a\nnodes: 1\nnodes: 2\n", "nodes"),
    ("syntax", b"name: [\n", "line"),
    ("list", b"- a\n", "topo.yaml"),
    ("empty", b"", "topo.yaml"),
    ("utf16", "name: x\n".encode("utf-16"), "UTF-8"),
]


def _topo_cases() -> list[Case]:
    cases = []
    for key, value, match in TOPO_VALUES:
        cases.append(
            Case(
                f"topo-{key}={value!r}",
                ("topo", "{d}/topo.yaml"),
                {"topo.yaml": _dump(_set(TOPO, key, value))},
                match,
            )
        )
    for name, text, match in TOPO_TEXTS:
        cases.append(
            Case(f"topotext-{name}", ("topo", "{d}/topo.yaml"), {"topo.yaml": text}, match)
        )
        spec = _dump(_set(SPLIT, "cluster.topology", "topo.yaml"))
        cases.append(
            Case(
                f"spec-topotext-{name}",
                ("spec", "{d}/spec.yaml"),
                {"topo.yaml": text, "spec.yaml": spec},
                "topo.yaml",
            )
        )
    for nodes, match in [("0", "--nodes"), ("-3", "--nodes"), ("100000000", "100000000"),
                         ("x", "--nodes")]:  # fmt: skip
        cases.append(Case(f"topo-arg-nodes={nodes}", ("topo", "dgx-h100-ib400", "--nodes", nodes),
                          {}, match))  # fmt: skip
    cases += [
        Case("topo-unknown", ("topo", "no-such-topology"), {}, "no-such-topology"),
        Case("topo-missing-file", ("topo", "{d}/nope.yaml"), {}, "nope.yaml"),
        Case("topo-dir", ("topo", "{d}"), {}, ""),
        Case(
            "topo-png-unwritable",
            ("topo", "dgx-h100-ib400", "--png", "/no/such/dir/x.png"),
            {},
            "x.png",
        ),  # fmt: skip
    ]
    return cases


# -- subcommands' arguments ----------------------------------------------------------------

SW_HEADER = (
    b"model,hardware,tensor_parallel,prompt_size,batch_size,token_size,prompt_time,token_time\n"
)
DS_JSON = "profiles/distserve/profiler-a100-80g.distserve.json"
GOOD_SPEC = {"spec.yaml": _dump(SPEC)}
SWEEP_SPEC = {"spec.yaml": _dump({**SPEC, "sweep": {"workload.arrival.rate": [1.0, 2.0]}})}

ARG_CASES: list[tuple[str, tuple[str, ...], dict[str, bytes], str]] = [
    ("no-command", (), {}, ""),
    ("unknown-command", ("frobnicate",), {}, "frobnicate"),
    ("unknown-flag", ("run", "--frobnicate"), {}, "--frobnicate"),
    # run
    ("run-missing-spec", ("run", "{d}/nope.yaml"), {}, "nope.yaml"),
    ("run-unknown-bundled", ("run", "quickstrat"), {}, "quickstrat"),
    ("run-spec-is-dir", ("run", "{d}"), {}, ""),
    ("run-window-word", ("run", "-q", "{d}/spec.yaml", "--window", "wide"), GOOD_SPEC, "--window"),
    ("run-window-zero", ("run", "-q", "{d}/spec.yaml", "--window", "0 s"), GOOD_SPEC, "--window"),
    ("run-window-neg", ("run", "-q", "{d}/spec.yaml", "--window", "-1 s"), GOOD_SPEC, "--window"),
    (
        "run-link-bucket",
        ("run", "-q", "{d}/spec.yaml", "--links-csv", "{d}/l.csv", "--link-bucket", "soon"),
        GOOD_SPEC,
        "--link-bucket",
    ),  # fmt: skip
    (
        "run-link-bucket-zero",
        ("run", "-q", "{d}/spec.yaml", "--links-csv", "{d}/l.csv", "--link-bucket", "0 s"),
        GOOD_SPEC,
        "--link-bucket",
    ),  # fmt: skip
    ("run-only-no-compare", ("run", "-q", "{d}/spec.yaml", "--only", "a"), GOOD_SPEC, "--only"),
    (
        "run-json-unwritable",
        ("run", "-q", "{d}/spec.yaml", "--json", "/no/such/dir/x.json"),
        GOOD_SPEC,
        "x.json",
    ),  # fmt: skip
    (
        "run-csv-unwritable",
        ("run", "-q", "{d}/spec.yaml", "--requests-csv", "/no/such/r.csv"),
        GOOD_SPEC,
        "r.csv",
    ),  # fmt: skip
    (
        "run-trace-unwritable",
        ("run", "-q", "{d}/spec.yaml", "--trace-out", "/no/such/t.json"),
        GOOD_SPEC,
        "t.json",
    ),  # fmt: skip
    (
        "run-timeline-unwritable",
        ("run", "-q", "{d}/spec.yaml", "--timeline-csv", "/no/such/t.csv"),
        GOOD_SPEC,
        "t.csv",
    ),  # fmt: skip
    ("run-sweep-spec", ("run", "-q", "{d}/spec.yaml"), SWEEP_SPEC, "sweep"),
    # kv
    ("kv-unknown-model", ("kv", "llama-99"), {}, "llama-99"),
    ("kv-tokens-word", ("kv", "llama-2-70b", "--tokens", "many"), {}, "--tokens"),
    ("kv-tokens-neg", ("kv", "llama-2-70b", "--tokens", "-1"), {}, "--tokens"),
    ("kv-block-zero", ("kv", "llama-2-70b", "--block-size", "0"), {}, "--block-size"),
    ("kv-block-word", ("kv", "llama-2-70b", "--block-size", "x"), {}, "--block-size"),
    ("kv-dtype", ("kv", "llama-2-70b", "--dtype", "fp7"), {}, "fp7"),
    ("kv-no-model", ("kv",), {}, "MODEL"),
    # handoff
    ("handoff-no-tokens", ("handoff", "llama-2-70b", "--topology", "dgx-h100-ib400"), {}, ""),
    (
        "handoff-tokens-neg",
        ("handoff", "llama-2-70b", "--tokens", "-5", "--topology", "dgx-h100-ib400"),
        {},
        "--tokens",
    ),  # fmt: skip
    (
        "handoff-tokens-zero",
        ("handoff", "llama-2-70b", "--tokens", "0", "--topology", "dgx-h100-ib400"),
        {},
        "--tokens",
    ),  # fmt: skip
    (
        "handoff-tp-zero",
        ("handoff", "llama-2-70b", "--tokens", "100", "--topology", "dgx-h100-ib400", "--tp", "0"),
        {},
        "tp",
    ),  # fmt: skip
    (
        "handoff-tp-3",
        ("handoff", "llama-2-70b", "--tokens", "100", "--topology", "dgx-h100-ib400", "--tp", "3"),
        {},
        "tp",
    ),  # fmt: skip
    (
        "handoff-tp-huge",
        (
            "handoff",
            "llama-2-70b",
            "--tokens",
            "100",
            "--topology",
            "dgx-h100-ib400",
            "--tp",
            "1024",
        ),
        {},
        "tp",
    ),  # fmt: skip
    (
        "handoff-topo-unknown",
        ("handoff", "llama-2-70b", "--tokens", "100", "--topology", "nope"),
        {},
        "nope",
    ),  # fmt: skip
    (
        "handoff-nodes-zero",
        (
            "handoff",
            "llama-2-70b",
            "--tokens",
            "100",
            "--topology",
            "dgx-h100-ib400",
            "--nodes",
            "0",
        ),
        {},
        "nodes",
    ),  # fmt: skip
    (
        "handoff-nodes-huge",
        (
            "handoff",
            "llama-2-70b",
            "--tokens",
            "100",
            "--topology",
            "dgx-h100-ib400",
            "--nodes",
            "100000000",
        ),
        {},
        "nodes",
    ),  # fmt: skip
    (
        "handoff-rtt",
        (
            "handoff",
            "llama-2-70b",
            "--tokens",
            "100",
            "--topology",
            "dgx-h100-ib400",
            "--control-rtt",
            "soon",
        ),
        {},
        "--control-rtt",
    ),  # fmt: skip
    (
        "handoff-rtt-neg",
        (
            "handoff",
            "llama-2-70b",
            "--tokens",
            "100",
            "--topology",
            "dgx-h100-ib400",
            "--router-hop",
            "-1 ms",
        ),
        {},
        "--router-hop",
    ),  # fmt: skip
    (
        "handoff-block",
        (
            "handoff",
            "llama-2-70b",
            "--tokens",
            "100",
            "--topology",
            "dgx-h100-ib400",
            "--block-size",
            "0",
        ),
        {},
        "--block-size",
    ),  # fmt: skip
    (
        "handoff-placement",
        (
            "handoff",
            "llama-2-70b",
            "--tokens",
            "100",
            "--topology",
            "dgx-h100-ib400",
            "--placement",
            "moon",
        ),
        {},
        "moon",
    ),  # fmt: skip
    (
        "handoff-model",
        ("handoff", "gpt-9", "--tokens", "100", "--topology", "dgx-h100-ib400"),
        {},
        "gpt-9",
    ),  # fmt: skip
    # provision
    ("provision-power-word", ("provision", "disagg", "--power", "lots"), {}, "--power"),
    ("provision-power-neg", ("provision", "disagg", "--power", "-5 kW"), {}, "--power"),
    ("provision-power-zero", ("provision", "disagg", "--power", "0"), {}, "--power"),
    ("provision-gpus-zero", ("provision", "disagg", "--gpus", "0"), {}, "--gpus"),
    ("provision-gpus-neg", ("provision", "disagg", "--gpus", "-8"), {}, "--gpus"),
    ("provision-gpus-huge", ("provision", "disagg", "--gpus", "100000000"), {}, "--gpus"),
    ("provision-sample-zero", ("provision", "disagg", "--sample", "0"), {}, "--sample"),
    ("provision-replicates", ("provision", "disagg", "--replicates", "0"), {}, "--replicates"),
    (
        "provision-convergence",
        ("provision", "disagg", "--convergence", "a,b"),
        {},
        "--convergence",
    ),  # fmt: skip
    (
        "provision-convergence-1",
        ("provision", "disagg", "--convergence", "1"),
        {},
        "--convergence",
    ),  # fmt: skip
    ("provision-jobs-word", ("provision", "disagg", "-j", "many"), {}, "many"),
    ("provision-jobs-zero", ("provision", "disagg", "-j", "0"), {}, "0"),
    ("provision-colocated", ("provision", "{d}/spec.yaml"), GOOD_SPEC, "spec.yaml"),
    ("provision-both", ("provision", "disagg", "--power", "1 kW", "--gpus", "8"), {}, "--gpus"),
    # plan
    (
        "plan-no-slo",
        ("plan", "{d}/spec.yaml"),
        {"spec.yaml": _dump(_set(SPEC, "slo", ...))},
        "slo",
    ),  # fmt: skip
    ("plan-target-rate-zero", ("plan", "disagg", "--target-rate", "0"), {}, "--target-rate"),
    ("plan-target-rate-word", ("plan", "disagg", "--target-rate", "fast"), {}, "--target-rate"),
    ("plan-target-rate-nan", ("plan", "disagg", "--target-rate", "nan"), {}, "--target-rate"),
    ("plan-sample-neg", ("plan", "disagg", "--sample", "-1"), {}, "--sample"),
    ("plan-replicates-word", ("plan", "disagg", "--replicates", "x"), {}, "--replicates"),
    ("plan-jobs-neg", ("plan", "disagg", "-j", "-2"), {}, "-2"),
    ("plan-executor", ("plan", "disagg", "--executor", "slurm"), {}, "slurm"),
    ("plan-bad-set", ("plan", "disagg", "--set", "slo.ttft=soon"), {}, "ttft"),
    # sweep
    (
        "sweep-no-section",
        ("sweep", "{d}/spec.yaml", "--out", "{d}/o", "--no-plots"),
        GOOD_SPEC,
        "sweep",
    ),  # fmt: skip
    (
        "sweep-not-mapping",
        ("sweep", "{d}/spec.yaml", "--out", "{d}/o", "--no-plots"),
        {"spec.yaml": _dump({**SPEC, "sweep": [1, 2]})},
        "sweep",
    ),  # fmt: skip
    (
        "sweep-values-not-list",
        ("sweep", "{d}/spec.yaml", "--out", "{d}/o", "--no-plots"),
        {"spec.yaml": _dump({**SPEC, "sweep": {"seed": 3}})},
        "seed",
    ),  # fmt: skip
    (
        "sweep-empty-list",
        ("sweep", "{d}/spec.yaml", "--out", "{d}/o", "--no-plots"),
        {"spec.yaml": _dump({**SPEC, "sweep": {"seed": []}})},
        "seed",
    ),  # fmt: skip
    (
        "sweep-bad-value",
        ("sweep", "{d}/spec.yaml", "--out", "{d}/o", "--no-plots", "-j", "1"),
        {"spec.yaml": _dump({**SPEC, "sweep": {"cluster.instances": [1, 0]}})},
        "instances",
    ),  # fmt: skip
    (
        "sweep-unknown-key",
        ("sweep", "{d}/spec.yaml", "--out", "{d}/o", "--no-plots", "-j", "1"),
        {"spec.yaml": _dump({**SPEC, "sweep": {"cluster.colour": [1, 2]}})},
        "colour",
    ),  # fmt: skip
    (
        "sweep-zip-uneven",
        ("sweep", "{d}/spec.yaml", "--out", "{d}/o", "--no-plots"),
        {"spec.yaml": _dump({**SPEC, "sweep": {"zip": [{"seed": [1, 2], "name": ["a"]}]}})},
        "zip",
    ),  # fmt: skip
    ("sweep-jobs-word", ("sweep", "{d}/spec.yaml", "-j", "lots"), SWEEP_SPEC, "lots"),
    ("sweep-jobs-zero", ("sweep", "{d}/spec.yaml", "-j", "0"), SWEEP_SPEC, "0"),
    ("sweep-executor", ("sweep", "{d}/spec.yaml", "--executor", "mpi"), SWEEP_SPEC, "mpi"),
    (
        "sweep-set-bad",
        ("sweep", "{d}/spec.yaml", "--set", "sweep.seed=notalist", "--out", "{d}/o", "--no-plots"),
        SWEEP_SPEC,
        "seed",
    ),  # fmt: skip
    (
        "sweep-out-is-file",
        ("sweep", "{d}/spec.yaml", "--out", "{d}/spec.yaml", "--no-plots", "-j", "1"),
        SWEEP_SPEC,
        "spec.yaml",
    ),  # fmt: skip
    # goodput
    ("goodput-rel-tol", ("goodput", "{d}/spec.yaml", "--rel-tol", "2"), SWEEP_SPEC, "--rel-tol"),
    (
        "goodput-rel-tol-word",
        ("goodput", "{d}/spec.yaml", "--rel-tol", "x"),
        SWEEP_SPEC,
        "--rel-tol",
    ),  # fmt: skip
    (
        "goodput-target-zero",
        ("goodput", "{d}/spec.yaml", "--target", "0"),
        SWEEP_SPEC,
        "--target",
    ),  # fmt: skip
    (
        "goodput-target-big",
        ("goodput", "{d}/spec.yaml", "--target", "1.5"),
        SWEEP_SPEC,
        "--target",
    ),  # fmt: skip
    ("goodput-seeds-zero", ("goodput", "{d}/spec.yaml", "--seeds", "0"), SWEEP_SPEC, "--seeds"),
    ("goodput-seeds-neg", ("goodput", "{d}/spec.yaml", "--seeds", "-1"), SWEEP_SPEC, "--seeds"),
    (
        "goodput-sample-zero",
        ("goodput", "{d}/spec.yaml", "--sample", "0"),
        SWEEP_SPEC,
        "--sample",
    ),  # fmt: skip
    ("goodput-rate-key", ("goodput", "{d}/spec.yaml", "--rate-key", "x"), SWEEP_SPEC, "x"),
    (
        "goodput-no-slo",
        ("goodput", "{d}/spec.yaml", "--out", "{d}/o", "--no-plots"),
        {"spec.yaml": _dump(_set(SPEC, "slo", ...))},
        "slo",
    ),  # fmt: skip
    ("goodput-jobs", ("goodput", "{d}/spec.yaml", "-j", "two"), SWEEP_SPEC, "two"),
    # compare
    (
        "compare-list",
        ("run", "-q", "{d}/spec.yaml"),
        {"spec.yaml": _dump({**SPEC, "compare": [1]})},
        "compare",
    ),  # fmt: skip
    (
        "compare-empty",
        ("run", "-q", "{d}/spec.yaml"),
        {"spec.yaml": _dump({**SPEC, "compare": {}})},
        "compare",
    ),  # fmt: skip
    (
        "compare-entry-scalar",
        ("run", "-q", "{d}/spec.yaml"),
        {"spec.yaml": _dump({**SPEC, "compare": {"a": 5}})},
        "compare",
    ),  # fmt: skip
    (
        "compare-bad-key",
        ("run", "-q", "{d}/spec.yaml"),
        {"spec.yaml": _dump({**SPEC, "compare": {"a": {"cluster.colour": 1}}})},
        "colour",
    ),  # fmt: skip
    (
        "compare-bad-value",
        ("run", "-q", "{d}/spec.yaml"),
        {"spec.yaml": _dump({**SPEC, "compare": {"a": {"cluster.instances": 0}}})},
        "instances",
    ),  # fmt: skip
    (
        "compare-only-unknown",
        ("run", "-q", "{d}/spec.yaml", "--only", "zz"),
        {"spec.yaml": _dump({**SPEC, "compare": {"a": {"engine.max_num_seqs": 4}}})},
        "zz",
    ),  # fmt: skip
    (
        "compare-requests-csv",
        ("run", "-q", "{d}/spec.yaml", "--requests-csv", "{d}/r.csv"),
        {"spec.yaml": _dump({**SPEC, "compare": {"a": {"seed": 1}}})},
        "--requests-csv",
    ),  # fmt: skip
    # spec
    ("spec-schema-and-set", ("spec", "nope-spec"), {}, "nope-spec"),
    ("spec-sweep", ("spec", "{d}/spec.yaml"), SWEEP_SPEC, "sweep"),
    ("spec-set-no-key", ("spec", "quickstart", "--set", "=1"), {}, "--set"),
    # schedulers
    ("schedulers-extra", ("schedulers", "extra"), {}, "extra"),
    # plot
    ("plot-nothing", ("plot",), {}, "twin plot"),
    ("plot-dir-missing", ("plot", "{d}/nope"), {}, "nope"),
    ("plot-dir-empty", ("plot", "{d}", "--out", "{d}/p"), {}, ""),
    ("plot-trace-missing", ("plot", "--trace", "{d}/nope.json", "--out", "{d}"), {}, "nope.json"),
    (
        "plot-trace-not-json",
        ("plot", "--trace", "{d}/t.json", "--out", "{d}"),
        {"t.json": b"{oops"},
        "t.json",
    ),  # fmt: skip
    (
        "plot-trace-latin1",
        ("plot", "--trace", "{d}/t.json", "--out", "{d}"),
        {"t.json": b'{"traceEvents": ["caf\xe9"]}'},
        "t.json",
    ),  # fmt: skip
    (
        "plot-trace-list",
        ("plot", "--trace", "{d}/t.json", "--out", "{d}"),
        {"t.json": b"[1,2]"},
        "t.json",
    ),  # fmt: skip
    (
        "plot-trace-events-str",
        ("plot", "--trace", "{d}/t.json", "--out", "{d}"),
        {"t.json": b'{"traceEvents": "x"}'},
        "t.json",
    ),  # fmt: skip
    (
        "plot-trace-ts-str",
        ("plot", "--trace", "{d}/t.json", "--out", "{d}"),
        {
            "t.json": b'{"traceEvents": [{"ph": "X", "ts": "soon", "dur": 5, "pid": 1, "tid": 1,'
            b' "name": "prefill"}]}'
        },
        "t.json",
    ),  # fmt: skip
    (
        "plot-trace-dur-str",
        ("plot", "--trace", "{d}/t.json", "--out", "{d}"),
        {
            "t.json": b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": "long", "pid": 1, "tid": 1,'
            b' "name": "decode"}]}'
        },
        "t.json",
    ),  # fmt: skip
    (
        "plot-trace-event-int",
        ("plot", "--trace", "{d}/t.json", "--out", "{d}"),
        {"t.json": b'{"traceEvents": [5]}'},
        "t.json",
    ),  # fmt: skip
    (
        "plot-trace-pid-list",
        ("plot", "--trace", "{d}/t.json", "--out", "{d}"),
        {
            "t.json": b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2, "pid": [1], "tid": 1,'
            b' "name": "decode"}]}'
        },
        "t.json",
    ),  # fmt: skip
    (
        "plot-window-word",
        ("plot", "--trace", "{d}/t.json", "--window", "a,b"),
        {"t.json": b'{"traceEvents": []}'},
        "--window",
    ),  # fmt: skip
    ("plot-window-no-trace", ("plot", "{d}", "--window", "0,1"), {}, "--window"),
    (
        "plot-requests-missing",
        ("plot", "--requests", "{d}/nope.csv", "--out", "{d}"),
        {},
        "nope.csv",
    ),  # fmt: skip
    (
        "plot-requests-garbage",
        ("plot", "--requests", "{d}/r.csv", "--out", "{d}"),
        {"r.csv": b"a,b\n1,2\n"},
        "r.csv",
    ),  # fmt: skip
    (
        "plot-requests-latin1",
        ("plot", "--requests", "{d}/r.csv", "--out", "{d}"),
        {"r.csv": b"id,ttft_s\n1,caf\xe9\n"},
        "r.csv",
    ),  # fmt: skip
    (
        "plot-requests-words",
        ("plot", "--requests", "{d}/r.csv", "--out", "{d}"),
        {"r.csv": b"id,ttft_s,tpot_s,finished\n1,soon,later,True\n"},
        "r.csv",
    ),  # fmt: skip
    (
        "plot-timeline-missing",
        ("plot", "--timeline", "{d}/nope.json", "--out", "{d}"),
        {},
        "nope.json",
    ),  # fmt: skip
    (
        "plot-timeline-garbage",
        ("plot", "--timeline", "{d}/t.json", "--out", "{d}"),
        {"t.json": b'{"timeline": 5}'},
        "t.json",
    ),  # fmt: skip
    (
        "plot-timeline-latin1",
        ("plot", "--timeline", "{d}/t.csv", "--out", "{d}"),
        {"t.csv": b"t_s,x\n\xe9,1\n"},
        "t.csv",
    ),  # fmt: skip
    (
        "plot-timeline-words",
        ("plot", "--timeline", "{d}/t.csv", "--out", "{d}"),
        {"t.csv": b"t_start_s,t_end_s,attainment\nsoon,later,most\n"},
        "t.csv",
    ),  # fmt: skip
    (
        "plot-dir-bad-runs",
        ("plot", "{d}/o", "--out", "{d}/p"),
        {"o/runs.csv": b"\xff\xfe"},
        "runs.csv",
    ),  # fmt: skip
    (
        "plot-dir-words-runs",
        ("plot", "{d}/o", "--out", "{d}/p"),
        {"o/runs.csv": b"run,goodput,ttft_p50_s\na,lots,soon\n"},
        "runs.csv",
    ),  # fmt: skip
    (
        "plot-dir-bad-goodput",
        ("plot", "{d}/o", "--out", "{d}/p"),
        {"o/goodput.csv": b"config,goodput_rps\na,fast\n"},
        "goodput.csv",
    ),  # fmt: skip
    # bench
    ("bench-sizes-word", ("bench", "--sizes", "abc"), {}, "abc"),
    ("bench-sizes-zero", ("bench", "--sizes", "0"), {}, "--sizes"),
    ("bench-sizes-neg", ("bench", "--sizes", "-10"), {}, "--sizes"),
    ("bench-sizes-empty", ("bench", "--sizes", ""), {}, "--sizes"),
    ("bench-sizes-comma", ("bench", "--sizes", ",,"), {}, "--sizes"),
    ("bench-sizes-huge", ("bench", "--sizes", "1e12"), {}, "--sizes"),
    ("bench-sizes-suffix", ("bench", "--sizes", "10q"), {}, "10q"),
    ("bench-config", ("bench", "--sizes", "10", "--config", "mixed"), {}, "mixed"),
    ("bench-repeat-zero", ("bench", "--sizes", "10", "--repeat", "0"), {}, "--repeat"),
    ("bench-repeat-word", ("bench", "--sizes", "10", "--repeat", "x"), {}, "--repeat"),
    (
        "bench-json-unwritable",
        ("bench", "--sizes", "10", "--json", "/no/such/b.json"),
        {},
        "b.json",
    ),  # fmt: skip
    # validate
    ("validate-what", ("validate", "everything"), {}, "everything"),
    ("validate-data-missing", ("validate", "perf", "--data", "{d}/nope"), {}, "nope"),
    ("validate-data-empty", ("validate", "perf", "--data", "{d}"), {}, ""),
    (
        "validate-splitwise-garbage",
        ("validate", "perf", "--data", "{d}"),
        {
            "profiles/splitwise_sim/perf_model.csv": b"a,b\n1,2\n",
            "profiles/distserve/profiler-a100-80g.distserve.json": b"{}",
        },
        "perf_model.csv",
    ),  # fmt: skip
    (
        "validate-splitwise-latin1",
        ("validate", "perf", "--data", "{d}"),
        {
            "profiles/splitwise_sim/perf_model.csv": b"model,hardware\n\xe9,x\n",
            "profiles/distserve/profiler-a100-80g.distserve.json": b"{}",
        },
        "perf_model.csv",
    ),  # fmt: skip
    (
        "validate-splitwise-words",
        ("validate", "perf", "--data", "{d}"),
        {
            "profiles/splitwise_sim/perf_model.csv": SW_HEADER
            + b"llama2-70b,a100-80gb,two,512,1,1,5,5\n",
            "profiles/distserve/profiler-a100-80g.distserve.json": b"{}",
        },
        "perf_model.csv",
    ),  # fmt: skip
    (
        "validate-distserve-garbage",
        ("validate", "perf", "--data", "{d}"),
        {
            "profiles/splitwise_sim/perf_model.csv": SW_HEADER,
            "profiles/distserve/profiler-a100-80g.distserve.json": b"{not json",
        },
        "profiler-a100-80g",
    ),  # fmt: skip
    (
        "validate-distserve-latin1",
        ("validate", "perf", "--data", "{d}"),
        {
            "profiles/splitwise_sim/perf_model.csv": SW_HEADER,
            "profiles/distserve/profiler-a100-80g.distserve.json": b'{"\xe9": 1}',
        },
        "profiler-a100-80g",
    ),  # fmt: skip
    (
        "validate-distserve-shape",
        ("validate", "perf", "--data", "{d}"),
        {
            "profiles/splitwise_sim/perf_model.csv": SW_HEADER,
            DS_JSON: b'{"facebook/opt-13b": {"1": [1, 2]}}',
        },
        "profiler-a100-80g",
    ),  # fmt: skip
]


def _profile_cases() -> list[Case]:
    """Profile tables a spec points at (perf.kind: table)."""
    cases = []
    native = b"phase,batch_size,tokens,context,time_s\n"
    for name, text in [
        ("latin1", native + b"prefill,1,\xe9,0,0.1\n"),
        ("words", native + b"prefill,one,10,0,0.1\n"),
        ("bad-phase", native + b"warmup,1,10,0,0.1\n"),
        ("header", b"a,b\n1,2\n"),
        ("empty", b""),
        ("utf16", native.decode().encode("utf-16")),
        ("huge-cell", native + b'prefill,1,"' + b"1" * 200_000 + b'",0,0.1\n'),
        ("neg-time", native + b"prefill,1,10,0,-0.1\n"),
        ("nan-time", native + b"prefill,1,10,0,nan\n"),
    ]:
        doc = _set(SPEC, "perf", {"kind": "profile", "path": "p.csv"})
        cases.append(
            Case(
                f"profile-{name}",
                ("run", "-q", "{d}/spec.yaml"),
                {"p.csv": text, "spec.yaml": _dump(doc)},
                "p.csv",
            )
        )
    return cases


def _arg_cases() -> list[Case]:
    return [Case(f"arg-{i}", argv, files, match) for i, argv, files, match in ARG_CASES]


CASES: list[Case] = _spec_cases() + _trace_cases() + _topo_cases() + _profile_cases() + _arg_cases()


# -- running -------------------------------------------------------------------------------


def _materialize(case: Case, d: Path) -> list[str]:
    for name, data in case.files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return [a.replace("{d}", str(d)) for a in case.argv]


def run_case(case: Case, d: Path, capsys: Any) -> tuple[int, str]:
    argv = _materialize(case, d)
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
    return code, capsys.readouterr().err


def test_corpus_size():
    assert len(CASES) >= 300
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fuzz_case(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = run_case(case, tmp_path, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert code == 2, f"exit {code}; stderr: {err!r}"
    assert len(lines) == 1 and lines[0].startswith("twin: error: "), err
    assert case.match.replace("{d}", str(tmp_path)) in lines[0], lines[0]


SUBPROCESS = [
    "spectext-latin1",
    "spec-cluster.instances=100000000.0",
    "trace-mooncake-latin1-as-auto",
    "arg-bench-sizes-word",
    "topotext-dup-key",
]


@pytest.mark.parametrize("case_id", SUBPROCESS)
def test_fuzz_subprocess(case_id, tmp_path):
    case = next(c for c in CASES if c.id == case_id)
    argv = _materialize(case, tmp_path)
    p = subprocess.run(
        [sys.executable, "-m", "twin.cli", *argv], capture_output=True, text=True, cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("twin: error: "), p.stderr
