from __future__ import annotations

from pathlib import Path

import pytest

from twin.errors import TwinError
from twin.validate import (
    TARGET_MEDIAN,
    TARGET_WORST,
    ValidationRow,
    find_data_dir,
    format_validation,
    validate_perf,
)


def test_find_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_data_dir(str(tmp_path)) == tmp_path
    monkeypatch.setenv("TWIN_DATA", str(tmp_path))
    assert find_data_dir(None) == tmp_path
    monkeypatch.delenv("TWIN_DATA")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TwinError, match="pass --data"):
        find_data_dir(None)


def test_format_marks_pass_and_fail() -> None:
    good = ValidationRow("a", "splitwise-sim", 10, 0, 0.05, 0.2, 0.1, 0.3)
    bad = ValidationRow("b", "distserve", 10, 1, 0.05, 0.5, 0.1, 0.3)
    text = format_validation([good, bad])
    assert text.splitlines()[2].endswith("PASS") and text.splitlines()[3].endswith("FAIL")
    assert "FAIL (1/2 sources)" in text


def test_validation_on_real_data(shared_data: Path) -> None:
    rows = {r.source: r for r in validate_perf(shared_data)}
    assert len(rows) == 13
    # The two anomalous TP-2 runs (512 x 64 prompt tokens) are the only exclusions.
    assert sum(r.excluded for r in rows.values()) == 4
    assert {r.engine for n, r in rows.items() if n.startswith("splitwise")} == {"splitwise-sim"}
    assert {r.engine for n, r in rows.items() if n.startswith("distserve")} == {"distserve"}
    # What the calibrated defaults reach today (see twin/perf.py and twin/calibrate.py): every
    # source but three meets the target.
    misses = {
        # splitwise-sim's A100 prompt time per token rises with the batch's total tokens
        # (0.20 ms at 2,048 tokens, 0.33 ms at 32,768 at TP 4) whatever the prompt split.
        "splitwise llama2-70b a100-80gb tp4",
        "splitwise llama2-70b a100-80gb tp8",
        # H100 TP 8: batches of 2 to 4 short prompts, and decode at batch 32 to 64.
        "splitwise llama2-70b h100-80gb tp8",
    }
    assert misses < set(rows)
    for name, r in rows.items():
        if name not in misses:
            assert max(r.prompt_median, r.tpot_median) <= TARGET_MEDIAN, r
            assert max(r.prompt_worst, r.tpot_worst) <= TARGET_WORST, r
        else:  # the known misses: within 20% median and 45% worst
            assert max(r.prompt_median, r.tpot_median) <= 0.20, r
            assert max(r.prompt_worst, r.tpot_worst) <= 0.45, r
