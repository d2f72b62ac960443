"""The client's share of TTFT and E2E (slo.client_latency)."""

from __future__ import annotations

import pytest
from helpers import small_spec

from twin.errors import SpecError
from twin.sim.simulation import Simulation


def _rows(**slo):
    rows: list[dict] = []
    spec = small_spec(requests=30, slo={"ttft": "1 s", "tpot": "50 ms", **slo})
    Simulation(spec, on_row=rows.append).run()
    return sorted(rows, key=lambda r: r["id"])


def test_the_client_latency_adds_to_ttft_and_e2e_only():
    plain, seen = _rows(), _rows(client_latency="40 ms")
    assert len(plain) == len(seen) == 30
    for a, b in zip(plain, seen, strict=True):
        assert b["ttft_s"] == pytest.approx(a["ttft_s"] + 0.040, abs=1e-12)
        assert b["e2e_s"] == pytest.approx(a["e2e_s"] + 0.040, abs=1e-12)
        # the serving side is the same: its instants and the gaps between tokens
        assert (b["first_token_s"], b["finish_s"], b["tpot_s"]) == (
            a["first_token_s"], a["finish_s"], a["tpot_s"],
        )  # fmt: skip


def test_a_negative_client_latency_is_an_error():
    with pytest.raises(SpecError, match="client_latency"):
        small_spec(slo={"ttft": "1 s", "client_latency": "-5 ms"})
