"""Censored knees and rejection caps: the sweep report says when a knee is
censored or a cap binds, and the attainment figure marks a censored knee
apart from a found one."""

from __future__ import annotations

import csv
import json

import pytest

from twin.viz.knees import knee_notes


def rows(label: str, atts: list[float], rejected: int = 0) -> list[dict[str, str]]:
    why = json.dumps({"context_length": rejected} if rejected else {})
    return [
        {"run_id": f"{label}{i}", "label": label, "workload.rate_scale": str(rate),
         "slo_attainment": str(a), "requests": "100", "rejected": str(rejected),
         "rejected_by_reason": why}
        for i, (rate, a) in enumerate(zip([0.5, 1.0, 2.0], atts, strict=True))
    ]  # fmt: skip


def test_notes_say_when_a_knee_is_censored_or_a_cap_binds():
    data = rows("found", [1.0, 0.95, 0.5]) + rows("above", [1.0, 1.0, 0.99])
    data += rows("capped", [0.88, 0.87, 0.6], rejected=12)
    notes = knee_notes(data, 0.9)
    assert notes[0].startswith(
        "1 of 3 configurations met the target at every rate tried: their knee is censored "
        "(at or above 2x, the highest rate;"
    ) and notes[0].endswith(": above")
    assert notes[1].startswith("1 of 3 configurations missed the target at every rate tried")
    assert notes[1].endswith("(below 0.5x, the lowest rate): capped")
    assert notes[2].startswith(
        "capped: a cap binds: at least 12.0% of its requests are rejected at every rate "
        "(context_length 36 over its runs), more than the 10% the target lets miss"
    )
    assert len(notes) == 3
    assert knee_notes(rows("found", [1.0, 0.95, 0.5]), 0.9) == []


def test_the_figure_marks_a_censored_knee_as_censored():
    pytest.importorskip("matplotlib")
    from twin.viz.attainment import CENSORED_HANDLE, attainment_figure

    fig = attainment_figure(rows("found", [1.0, 0.95, 0.5]) + rows("above", [1.0, 1.0, 1.0]))
    texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    texts += [
        t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()
    ]
    assert any("above (knee >= 2x)" in t for t in texts), texts
    assert any("found (knee 1x)" in t for t in texts), texts
    assert CENSORED_HANDLE in texts


def test_a_wide_goodput_interval_does_not_stretch_the_axis():
    pytest.importorskip("matplotlib")
    from twin.viz.goodput import GOODPUT_REACH, goodput_figure
    from twin.viz.style import layout_problems

    head = "label,goodput_rps_mean,goodput_rps_ci95,goodput_per_gpu,seeds,gpus\n"
    text = head + "a,10,1,1,3,10\nb,8,100,0.8,3,10\n"  # b's interval: +-1,250%
    fig = goodput_figure(list(csv.DictReader(text.splitlines())))
    ax = fig.axes[0]
    assert ax.get_xlim()[1] < 10 * GOODPUT_REACH * 2  # not the 108 the interval reaches
    texts = [t.get_text() for t in ax.texts]
    assert any(t.endswith("(CI ±100 cut)") for t in texts), texts
    assert not any("cut" in t for t in texts if "±100" not in t)
    assert layout_problems(fig) == []


def test_coincident_curves_are_drawn_apart():
    pytest.importorskip("matplotlib")
    from twin.viz.attainment import COINCIDENT_SHIFT_PT, attainment_figure

    data = rows("a", [1.0, 0.95, 0.5]) + rows("b", [1.0, 0.95, 0.5]) + rows("c", [1.0, 0.5, 0.2])
    fig = attainment_figure(data)
    fig.canvas.draw()
    curves = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) == 3]
    ys = [tuple(ln.get_transform().transform(ln.get_xydata())[:, 1]) for ln in curves]
    assert ys[0] != ys[1]  # a and b hold the same points, and both show
    lift = (ys[1][0] - ys[0][0]) * 72 / fig.dpi
    assert lift == pytest.approx(COINCIDENT_SHIFT_PT)
    assert [tuple(ln.get_ydata()) for ln in curves[:2]] == [(100.0, 95.0, 50.0)] * 2
