"""Trace readers: real files (row counts and spans from each PROVENANCE.md), bad files."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from twin.errors import TraceError, UnknownNameError
from twin.workload.traces import (
    _azure_ns,
    _azure_ns_strptime,
    detect_format,
    file_sha256,
    read_azure,
    read_lengths,
    read_mooncake,
    read_splitwise,
    read_trace,
    read_vidur,
)

T = "traces"

# file, format, rows, span seconds (None: length-only)
REAL = [
    ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv", "azure", 19_366, 3501.721937),
    ("azure_llm_2023/AzureLLMInferenceTrace_code.csv", "azure", 8_819, 3435.948056),
    ("mooncake_fast25/conversation_trace.jsonl", "mooncake", 12_031, 3536.999),
    ("mooncake_fast25/synthetic_trace.jsonl", "mooncake", 3_993, 1022.025),
    ("sharegpt_lengths_sarathi/sharegpt_8k_filtered_stats_llama2_tokenizer.csv", "lengths", 30_731,
     None),
    ("vidur_processed/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", "lengths",
     28_257, None),
    ("splitwise_sim/test_trace.csv", "splitwise", 3, 3.0),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fmt", "rows", "span"), REAL, ids=[r[0] for r in REAL])
def test_real_traces(shared_data: Path, name: str, fmt: str, rows: int, span: float | None) -> None:
    path = shared_data / T / name
    assert detect_format(path) == fmt
    records = read_trace(path)
    assert len(records) == rows
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in records)
    if span is None:
        assert all(r.arrival_s is None for r in records)
    else:
        times = [r.arrival_s for r in records]
        assert times == sorted(times)
        assert times[-1] - times[0] == pytest.approx(span, abs=1e-9)


def test_azure_conv_values(shared_data: Path) -> None:
    recs = read_azure(shared_data / T / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv")
    # first rows: 18:15:46.6805900,374,44 and 18:15:50.9951690,396,109
    assert (recs[0].arrival_s, recs[0].prompt_tokens, recs[0].output_tokens) == (0.0, 374, 44)
    assert recs[1].arrival_s == 4.314579  # exact: 50.9951690 - 46.6805900
    assert (recs[1].prompt_tokens, recs[1].output_tokens) == (396, 109)
    prompts = sorted(r.prompt_tokens for r in recs)
    outputs = [r.output_tokens for r in recs]
    assert (prompts[0], prompts[-1]) == (2, 14_050)
    assert (min(outputs), max(outputs)) == (7, 1_000)
    assert sum(prompts) / len(prompts) == pytest.approx(1154.7, abs=0.05)
    assert sum(outputs) / len(outputs) == pytest.approx(211.1, abs=0.05)


def test_azure_code_stats(shared_data: Path) -> None:
    recs = read_azure(shared_data / T / "azure_llm_2023/AzureLLMInferenceTrace_code.csv")
    prompts = [r.prompt_tokens for r in recs]
    outputs = [r.output_tokens for r in recs]
    assert (min(prompts), max(prompts), min(outputs), max(outputs)) == (3, 7_437, 6, 1_899)
    assert recs[:2][1].arrival_s == pytest.approx(0.052, abs=1e-9)  # 04.0319600 - 03.9799600


def test_mooncake_values(shared_data: Path) -> None:
    recs = read_mooncake(shared_data / T / "mooncake_fast25/conversation_trace.jsonl")
    first = recs[0]
    assert (first.arrival_s, first.prompt_tokens, first.output_tokens) == (0.0, 6758, 500)
    assert first.prefix_hashes == tuple(range(14))
    assert first.prefix_block_tokens == 512
    assert recs[1].prefix_hashes[0] == 0  # shared first block
    assert all(len(r.prefix_hashes) == math.ceil(r.prompt_tokens / 512) for r in recs)
    assert min(r.output_tokens for r in recs) == 1
    assert sum(r.prompt_tokens for r in recs) / len(recs) == pytest.approx(12_035.1, abs=0.05)
    assert sum(len(r.prefix_hashes) for r in recs) == 288_500
    assert len({h for r in recs for h in r.prefix_hashes}) == 182_790


def test_splitwise_values(shared_data: Path) -> None:
    recs = read_splitwise(shared_data / T / "splitwise_sim/test_trace.csv")
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in recs] == [
        (1.0, 4096, 32),
        (3.0, 2048, 8),
        (4.0, 2048, 16),
    ]


def test_lengths_values(shared_data: Path) -> None:
    recs = read_lengths(shared_data / T / "sharegpt_lengths_sarathi" /
                        "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")  # fmt: skip
    assert (recs[0].prompt_tokens, recs[0].output_tokens) == (74, 918)
    assert max(r.prompt_tokens for r in recs) == 8_141
    assert max(r.output_tokens for r in recs) == 1_024


def test_file_sha256_matches_provenance(shared_data: Path) -> None:
    path = shared_data / T / "splitwise_sim/test_trace.csv"
    assert file_sha256(path) == "4048699985519151427ba5ba47bb39176db94bc21c8b253bfc84531c6dbd3391"


# --------------------------------------------------------------------------- small files


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_azure_exact_fraction(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "a.csv",
        AZ_HEADER + "2023-11-16 23:59:59.9999999,10,2\n"
        "2023-11-17 00:00:00.0000001,11,3\n"
        "2023-11-17 00:00:00.0000001,12,4\n",
    )
    recs = read_azure(p)
    assert [r.arrival_s for r in recs] == [0.0, 2e-7, 2e-7]
    assert [r.prompt_tokens for r in recs] == [10, 11, 12]


# Texts the field-by-field reading takes, and texts it leaves to strptime (which
# accepts some: unpadded fields, two spaces; and rejects others).
STAMPS = [
    "2023-11-16 18:15:46.6805900", "2023-11-16 18:15:46", " 2023-11-16 18:15:46.123456789 ",
    "2024-02-29 23:59:59.9999999", "1969-12-31 23:59:59.5", "0001-01-01 00:00:00.0000001",
    "9999-12-31 23:59:59.999999999", "2023-11-16 8:15:46.5", "2023-1-6 18:15:46",
    "2023-11-16  18:15:46.1", "2023-11-16 18:15:46.", "2023-11-16 18:15:46.1234567890",
    "2023-02-29 00:00:00", "2023-13-01 00:00:00", "2023-11-16 24:00:00", "2023-11-16 23:60:00",
    "2023-11-16 23:59:60", "2023-11-16T18:15:46", "2023-11-16 18:15:46.12x", "18:15:46",
    "2023-11-16 18:15:4\uff16", "2023-11-16 18:15:46.\u0661",
]  # fmt: skip


def _ns(parse, raw: str) -> int | str:
    try:
        return parse(Path("t.csv"), 2, "TIMESTAMP", raw)
    except TraceError as e:
        return str(e)


@pytest.mark.parametrize("raw", STAMPS)
def test_azure_timestamps_read_as_strptime_reads_them(raw: str) -> None:
    assert _ns(_azure_ns, raw) == _ns(_azure_ns_strptime, raw)


@pytest.mark.parametrize("name", ["conv", "code"])
def test_azure_timestamps_of_the_real_traces(shared_data: Path, name: str) -> None:
    path = shared_data / T / f"azure_llm_2023/AzureLLMInferenceTrace_{name}.csv"
    stamps = [line.split(",")[0] for line in path.read_text().splitlines()[1:]]
    fast = [_azure_ns(path, 0, "TIMESTAMP", s) for s in stamps]
    assert fast == [_azure_ns_strptime(path, 0, "TIMESTAMP", s) for s in stamps]


def test_vidur_reader(tmp_path: Path) -> None:
    p = write(
        tmp_path, "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,6\n0.5,7.0,8\n"
    )
    assert detect_format(p) == "vidur"
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in read_vidur(p)] == [
        (0.0, 5, 6),
        (0.5, 7, 8),
    ]


BAD = [
    # (name, content, reader, regex fragments that must all appear)
    ("neg.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,6\n-1,5,6\n", read_vidur,
     ["neg.csv", "line 3", "arrived_at", "'-1'", "negative"]),
    ("dec.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n2,5,6\n1.5,5,6\n", read_vidur,
     ["dec.csv", "line 3", "arrived_at", "'1.5'", "earlier than line 2", "non-decreasing"]),
    ("azdec.csv", AZ_HEADER + "2023-11-16 18:15:46.6805900,1,1\n2023-11-16 18:15:46.6805899,1,1\n",
     read_azure, ["azdec.csv", "line 3", "TIMESTAMP", "46.6805899", "non-decreasing"]),
    ("azts.csv", AZ_HEADER + "16/11/2023 18:15,1,1\n", read_azure,
     ["azts.csv", "line 2", "TIMESTAMP", "16/11/2023", "YYYY-MM-DD"]),
    ("frac.csv", "num_prefill_tokens,num_decode_tokens\n5,6\n7,2.5\n", read_lengths,
     ["frac.csv", "line 3", "num_decode_tokens", "'2.5'", "not an integer"]),
    ("word.csv", AZ_HEADER + "2023-11-16 18:15:46.6805900,ten,1\n", read_azure,
     ["word.csv", "line 2", "ContextTokens", "'ten'", "integer"]),
    ("zero.csv", "num_prefill_tokens,num_decode_tokens\n5,0\n", read_lengths,
     ["zero.csv", "line 2", "num_decode_tokens", "'0'", ">= 1"]),
    ("zerop.csv", "request_id,request_type,application_id,arrival_timestamp,batch_size,"
     "prompt_size,token_size\n0,2,0,1,1,0,8\n", read_splitwise,
     ["zerop.csv", "line 2", "prompt_size", "'0'", ">= 1"]),
    ("miss.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,1\n", read_azure,
     ["miss.csv", "line 1", "missing column", "GeneratedTokens",
      "TIMESTAMP, ContextTokens, GeneratedTokens"]),
    ("empty.csv", "", read_azure, ["empty.csv", "empty file", "TIMESTAMP"]),
    ("hdr.csv", "num_prefill_tokens,num_decode_tokens\n", read_lengths,
     ["hdr.csv", "no requests"]),
    ("short.csv", "num_prefill_tokens,num_decode_tokens\n5,6\n5\n", read_lengths,
     ["short.csv", "line 3", "1 fields", "expected 2"]),
    ("empty.jsonl", "\n", read_mooncake, ["empty.jsonl", "empty file", "hash_ids"]),
    ("m0.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1]}\n',
     read_mooncake, ["m0.jsonl", "line 1", "output_length", "0", ">= 1"]),
    ("mkey.jsonl", '{"timestamp": 0, "input_length": 5, "hash_ids": [1]}\n', read_mooncake,
     ["mkey.jsonl", "line 1", "missing key", "output_length"]),
    ("mjson.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}\n'
     '{oops\n', read_mooncake,
     ["mjson.jsonl", "line 2", "not valid JSON"]),
    ("mdec.jsonl", '{"timestamp": 5, "input_length": 5, "output_length": 1, "hash_ids": []}\n'
     '{"timestamp": 4, "input_length": 5, "output_length": 1, "hash_ids": []}\n', read_mooncake,
     ["mdec.jsonl", "line 2", "timestamp", "4", "non-decreasing"]),
    ("mhash.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}\n',
     read_mooncake, ["mhash.jsonl", "line 1", "hash_ids", "list of integers"]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "reader", "parts"), BAD, ids=[b[0] for b in BAD])
def test_bad_files(tmp_path: Path, name: str, text: str, reader, parts: list[str]) -> None:
    p = write(tmp_path, name, text)
    with pytest.raises(TraceError) as info:
        reader(p)
    msg = str(info.value)
    assert "\n" not in msg
    for part in parts:
        assert part in msg, f"{part!r} not in {msg!r}"


def test_error_names_full_path(tmp_path: Path) -> None:
    p = write(tmp_path, "x.csv", "num_prefill_tokens,num_decode_tokens\n-3,1\n")
    with pytest.raises(TraceError, match=re.escape(str(p)) + r": line 2: column num_prefill"):
        read_lengths(p)


def test_detect_format(tmp_path: Path) -> None:
    assert detect_format(write(tmp_path, "a.csv", AZ_HEADER)) == "azure"
    assert detect_format(write(tmp_path, "b.jsonl", "{}")) == "mooncake"
    sw = "request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,"
    sw += "token_size"
    assert detect_format(write(tmp_path, "c.csv", sw + "\n")) == "splitwise"
    assert detect_format(write(tmp_path, "d.csv", "num_prefill_tokens,num_decode_tokens\n")) == (
        "lengths"
    )
    with pytest.raises(TraceError, match=r"e\.csv: line 1: cannot tell the trace format.*'a,b'"):
        detect_format(write(tmp_path, "e.csv", "a,b\n1,2\n"))
    with pytest.raises(TraceError, match=r"f\.csv: empty file"):
        detect_format(write(tmp_path, "f.csv", ""))


def test_explicit_format_override(tmp_path: Path) -> None:
    # a vidur file read as length-only: times ignored
    p = write(tmp_path, "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,6\n")
    assert read_trace(p, "lengths")[0].arrival_s is None
    assert read_trace(p, "vidur")[0].arrival_s == 0.0
    with pytest.raises(UnknownNameError, match="Did you mean 'vidur'"):
        read_trace(p, "vidurr")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"nope\.csv: cannot read trace"):
        read_trace(tmp_path / "nope.csv")
