"""A trace names each request's model (its ``model`` column, a Mooncake
line's ``model`` key) when a spec of several models gives no shares, as its
``class`` column names each request's class; a value that is no model of
``models:`` is one error line naming the file, line, column and value."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from twin import yamlio
from twin.cli import main
from twin.errors import SpecError, TraceError
from twin.sim.simulation import Simulation
from twin.sim.spec import resolve_spec

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens,model"
ROWS = [(0.0, 300, 4, "chat"), (0.01, 200, 3, "small"), (0.02, 100, 2, "small"),
        (0.03, 400, 5, "chat"), (0.04, 250, 2, "small")]  # fmt: skip
DIURNAL = {"kind": "diurnal", "period": "10 min", "min": 0.5, "max": 1.5, "peak": "5 min"}
TWO: dict[str, Any] = {
    "name": "two",
    "models": {
        "chat": {"model": "llama-3.1-8b", "cluster": {"instances": 1}},
        "small": {"model": "llama-3.2-1b", "cluster": {"instances": 1}},
    },
    "slo": {"ttft": "1 s", "tpot": "50 ms"},
}


def _csv(tmp_path: Path, rows: list[tuple[Any, ...]] = ROWS, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([HEADER, *(",".join(map(str, r)) for r in rows)]) + "\n")
    return path


def _spec(tmp_path: Path, workload: dict[str, Any], data: dict[str, Any] = TWO) -> Any:
    data = copy.deepcopy(data)
    data["workload"] = workload
    return resolve_spec(data, str(tmp_path / "s.yaml"), tmp_path)


def _models(spec: Any) -> dict[int, str]:
    rows: list[dict[str, Any]] = []
    Simulation(spec, on_row=rows.append).run()
    return {r["id"]: r["model"] for r in rows}


def test_the_trace_model_column_names_each_requests_model(tmp_path):
    spec = _spec(tmp_path, {"trace": str(_csv(tmp_path))})
    assert _models(spec) == {i: r[3] for i, r in enumerate(ROWS)}
    assert "share" not in spec.resolved["models"]["chat"]
    assert [p.share for p in spec.models] == [None, None]


def test_skip_and_max_requests_keep_each_row_with_its_model(tmp_path):
    spec = _spec(tmp_path, {"trace": str(_csv(tmp_path)), "skip": 1, "max_requests": 3})
    assert _models(spec) == {0: "small", 1: "small", 2: "chat"}


def test_a_mooncake_trace_names_models_by_key_and_a_repeat_reads_them_again(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = [
        json.dumps({"timestamp": 10 * i, "input_length": 600, "output_length": 4,
                    "hash_ids": [i], "model": m})
        for i, m in enumerate(["small", "chat", "small"])
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    spec = _spec(tmp_path, {"trace": str(path), "repeat": True, "max_requests": 7})
    models = _models(spec)
    assert [models[i] for i in range(7)] == ["small", "chat", "small"] * 2 + ["small"]
    path.write_text("\n".join([lines[0], lines[1].replace(', "model": "chat"', ""), lines[2]]))
    with pytest.raises(TraceError, match=r"m\.jsonl: line 2: no key 'model'; models without"):
        _models(_spec(tmp_path, {"trace": str(path)}))


def test_a_model_not_in_models_is_one_error_naming_file_line_column_and_value(tmp_path, capsys):
    rows = [*ROWS[:3], (0.03, 400, 5, "coder"), ROWS[4]]
    trace = _csv(tmp_path, rows)
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({**TWO, "workload": {"trace": str(trace)}}))
    code = main(["run", str(spec)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err == (
        f"twin: error: {trace}: line 5: column model: 'coder' is not a model of models; "
        "expected one of chat, small\n"
    )


def test_a_trace_without_a_model_column_is_one_error_when_models_give_no_shares(tmp_path):
    path = tmp_path / "v.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,1\n")
    with pytest.raises(TraceError, match=r"v\.csv: line 1: missing column\(s\) model"):
        _models(_spec(tmp_path, {"trace": str(path)}))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"chat": {"share": 0.5}}, r"models\.small: give every model a share .* or none"),
        ({"small": {"rate_schedule": DIURNAL}},
         r"models\.small\.rate_schedule: a schedule changes a model's share"),
    ],
)  # fmt: skip
def test_shares_on_some_models_or_a_schedule_without_shares_are_refused(tmp_path, change, message):
    data = copy.deepcopy(TWO)
    for name, keys in change.items():
        data["models"][name].update(keys)
    with pytest.raises(SpecError, match=message):
        _spec(tmp_path, {"trace": str(_csv(tmp_path))}, data)


def test_shares_on_a_trace_draw_the_models_and_leave_the_column_unread(tmp_path):
    data = copy.deepcopy(TWO)
    data["models"]["chat"]["share"] = 1
    data["models"]["small"]["share"] = 1e-9
    rows = [(r[0], r[1], r[2], "nobody") for r in ROWS]
    spec = _spec(tmp_path, {"trace": str(_csv(tmp_path, rows))}, data)
    assert set(_models(spec).values()) == {"chat"}


def test_without_models_a_model_column_is_not_read(tmp_path):
    """One model: the column is ignored, as a class column without classes;
    the run is the run of the same trace without the column."""
    one = {"name": "one", "model": "llama-3.1-8b", "cluster": {"instances": 1},
           "slo": TWO["slo"]}  # fmt: skip
    rows = [(*r[:3], "nobody") for r in ROWS]
    plain = tmp_path / "plain.csv"
    plain.write_text(
        "\n".join([HEADER.rsplit(",", 1)[0], *(f"{a},{b},{c}" for a, b, c, _ in ROWS)])
    )
    out = []
    for path in (_csv(tmp_path, rows), plain):
        got: list[dict[str, Any]] = []
        Simulation(_spec(tmp_path, {"trace": str(path)}, one), on_row=got.append).run()
        out.append(got)
    assert out[0] == out[1] and len(out[0]) == len(ROWS)


def test_the_bundled_fixture_names_its_models():
    path = FIXTURES / "two-models.yaml"
    spec = resolve_spec(yamlio.load(path.read_text(encoding="utf-8")), str(path), FIXTURES)
    column = [line.rsplit(",", 1)[1] for line in (FIXTURES / "two-models.csv").read_text().split()]
    assert column[0] == "model" and column[1:].count("chat") == 7  # as the guide says
    assert _models(spec) == dict(enumerate(column[1:]))


def test_a_trace_format_without_columns_is_refused_when_models_give_no_shares(tmp_path):
    path = FIXTURES / "vllm-bench-serve.synthetic.json"
    with pytest.raises(TraceError, match="a vllm-bench trace carries no 'model' column; give each"):
        _models(_spec(tmp_path, {"trace": str(path)}))
