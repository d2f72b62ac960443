"""What the client sees, token by token: TTFT, TPOT and max ITL on exact traces.

One request alone, 1,000 prompt tokens, the linear perf model of test_engine
(10 ms + 0.1 ms per prefill token + 1 ms per decode sequence): its prompt takes
110 ms, each decode step 11 ms. Split, its KV crosses nodes in T = the
hand-off's default fixed costs + latency + shard / bandwidth (eight TP shards,
each over its own NIC), landing at L = 110 ms + T on an idle decode instance,
which takes it up at once.
"""

from __future__ import annotations

import pytest
from helpers import small_spec
from test_disagg import L8, split_spec
from test_engine import Linear

from twin.net.topology import load_topology
from twin.request import Request
from twin.serving.handoff import TransferConfig, handoff_costs
from twin.serving.kvcache import blocks_for

PREFILL, STEP = 0.01 + 1e-4 * 1000, 0.01 + 1e-3


def transfer_s() -> float:
    topo = load_topology("dgx-h100-ib400", nodes=2)
    path = topo.path(0, 8)
    fixed = handoff_costs(TransferConfig(), blocks_for(1000, 16), L8.layers).before_s
    wire = topo.latency_s(path) + 1000 * L8.kv_bytes_per_token() / 8 / topo.bottleneck_bytes_s(path)
    return fixed + wire


def one(spec, n: int) -> dict:
    _, _, rows = run_with_linear(spec, Request(0, 0.0, 1000, n))
    return rows[0]


def run_with_linear(spec, req):
    from twin.sim.simulation import Simulation

    rows: list[dict] = []
    sim = Simulation(spec, requests=[req], on_row=rows.append, perf=Linear())
    result = sim.run()
    return sim, result, {r["id"]: r for r in rows}


def seen(r: dict) -> tuple:
    """TTFT, TPOT, max ITL, finish; one token has no TPOT nor ITL (None)."""
    return tuple(
        None if r[k] == "" else r[k] for k in ("ttft_s", "tpot_s", "max_itl_s", "finish_s")
    )


def same(got: tuple, want: tuple) -> bool:
    return all(
        (g is None and w is None) or (None not in (g, w) and g == pytest.approx(w, rel=1e-9))
        for g, w in zip(got, want, strict=True)
    )


@pytest.mark.parametrize(
    ("n", "expect"),
    [
        (1, (PREFILL, None, None, PREFILL)),
        (2, (PREFILL, STEP, STEP, PREFILL + STEP)),
        (3, (PREFILL, STEP, STEP, PREFILL + 2 * STEP)),
    ],
)
def test_colocated_tokens(n, expect):
    r = one(small_spec(cluster={"instances": 1, "tp": 1}), n)
    assert same(seen(r), expect)


@pytest.mark.parametrize("handoff", ["push", "pull"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_split_at_decode_token_1_is_seen_when_the_decode_side_takes_the_request_up(handoff, n):
    # Token 1 (made by the prefill) is released at L; the decode steps give
    # tokens 2 and 3 at L + 11 ms and L + 22 ms: every gap the client sees is
    # one step, so TPOT is a step (not 0 for n = 2, nor half a step for n = 3).
    r = one(split_spec(transfer={"handoff": handoff}), n)
    land = PREFILL + transfer_s()
    if n == 1:  # done with the prompt: nothing moves
        assert same(seen(r), (PREFILL, None, None, PREFILL))
        assert r["transfer_s"] == ""
        return
    assert r["transfer_s"] == pytest.approx(transfer_s(), rel=1e-9)
    assert r["first_token_s"] == pytest.approx(land, rel=1e-9)
    assert seen(r) == pytest.approx((land, STEP, STEP, land + (n - 1) * STEP), rel=1e-9)
    assert r["first_decode_s"] == pytest.approx(STEP, rel=1e-9)


@pytest.mark.parametrize("handoff", ["push", "pull"])
@pytest.mark.parametrize("n", [2, 3])
def test_split_at_prefill_the_hand_off_is_an_inter_token_gap(handoff, n):
    # Token 1 seen at 110 ms; token 2 at L + 11 ms, token 3 one step later.
    spec = split_spec(transfer={"handoff": handoff}, slo={"ttft": "1 s", "ttft_at": "prefill"})
    r = one(spec, n)
    t = transfer_s()
    finish = PREFILL + t + (n - 1) * STEP
    tpot = (finish - PREFILL) / (n - 1)
    assert seen(r) == pytest.approx((PREFILL, tpot, t + STEP, finish), rel=1e-9)
