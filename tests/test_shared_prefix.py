"""inference-perf's shared_prefix workload: prompt cycle, prefix hashes (system prompt
blocks shared within a group, repeats and later turns sharing a session's blocks),
turn growth, determinism, and its spec keys."""

from __future__ import annotations

import numpy as np
import pytest

from twin.errors import SpecError
from twin.workload.shared_prefix import SharedPrefix
from twin.workload.stream import WorkloadSpec, iter_requests

# 2 groups x 2 users; system prompt 40 tokens = 2 full 16-token blocks + 8
TINY = SharedPrefix(groups=2, users=2, system_prompt_len=40, question_len=30, output_len=5)


def test_single_turn_hashes_share_the_system_prompt_blocks_within_a_group_only():
    # session s is in group s // 2; prompt = 70 tokens -> 4 full blocks
    h = {s: TINY.hashes(s // 2, s, TINY.prompt_tokens()) for s in range(4)}
    assert all(len(v) == 70 // 16 == 4 for v in h.values())
    assert h[0][:2] == h[1][:2] and h[2][:2] == h[3][:2]  # same group: 2 shared blocks
    assert not set(h[0][:2]) & set(h[2][:2])  # other group: none
    # the block that holds the end of the system prompt and the question is the session's
    assert len({v[2] for v in h.values()}) == 4 and len({v[3] for v in h.values()}) == 4
    flat = [x for v in h.values() for x in v]
    assert len(set(flat)) == 2 * 2 + 4 * 2 and min(flat) >= 0


def test_single_turn_cycles_a_shuffled_prompt_list_and_repeats_exact_hashes():
    rng = np.random.default_rng(7)
    order = TINY.order(rng)
    assert sorted(order.tolist()) == [0, 1, 2, 3]
    drawn = [TINY.draw(order, n) for n in range(12)]
    assert all(d[0] == 70 and d[1] == 5 and d[3] == 16 for d in drawn)
    for n in range(8):
        assert drawn[n][2] == drawn[n + 4][2]  # period groups x users
    assert len({d[2] for d in drawn[:4]}) == 4


def test_multi_turn_prompts_grow_by_a_turn_and_keep_the_earlier_turns_as_prefix():
    mt = SharedPrefix(groups=1, users=2, system_prompt_len=16, question_len=10, output_len=6,
                      multi_turn=True)  # fmt: skip
    s, q, o = 16, 10, 6
    assert [mt.prompt_tokens(r) for r in range(3)] == [s + (s + q), s + 2 * (s + q) + o,
                                                       s + 3 * (s + q) + 2 * o]  # fmt: skip
    order = np.array([1, 0])
    d = [mt.draw(order, n) for n in range(6)]  # rounds 0, 0, 1, 1, 2, 2
    assert [x[0] for x in d] == [42, 42, 74, 74, 106, 106]
    for n in range(4):  # the same session two requests later: its earlier prompt is a prefix
        assert d[n + 2][2][: len(d[n][2])] == d[n][2]
        assert len(d[n + 2][2]) == d[n + 2][0] // 16
    assert d[0][2][0] == d[1][2][0]  # one group: the system prompt block is shared
    assert d[0][2][1] != d[1][2][1]  # the rest is each session's own


def test_stream_from_the_workload_spec_is_seeded_and_deterministic():
    w = WorkloadSpec.from_mapping({
        "lengths": {"shared_prefix": {"groups": 2, "users": 2, "system_prompt_len": 40,
                                      "question_len": 30, "output_len": 5}},
        "arrival": {"process": "poisson", "rate": 2.0}, "max_requests": 9,
    })  # fmt: skip
    a = list(iter_requests(w, np.random.default_rng(3)))
    b = list(iter_requests(w, np.random.default_rng(3)))
    assert a == b and len(a) == 9
    assert all(r.prompt_tokens == 70 and r.prefix_block_tokens == 16 for r in a)
    assert [r.prefix_hashes for r in a[:5]] == [r.prefix_hashes for r in a[4:9]]


def test_prefixes_put_the_workload_hashes_on_a_trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("index,arrival_s,input_tokens,output_tokens,has_error,ttft_s,e2e_s\n"
                 "0,0.0,75,3,0,0.1,1\n1,1.0,50,3,0,0.1,1\n2,2.0,70,3,0,0.1,1\n")  # fmt: skip
    sp = {"groups": 1, "users": 2, "system_prompt_len": 32, "question_len": 38, "output_len": 9}
    w = WorkloadSpec.from_mapping({"trace": str(p), "output_tokens": 9,
                                   "prefixes": {"shared_prefix": sp}})  # fmt: skip
    reqs = list(iter_requests(w, np.random.default_rng(0)))
    assert [r.output_tokens for r in reqs] == [9, 9, 9]
    assert [len(r.prefix_hashes) for r in reqs] == [4, 3, 4]  # 70 // 16, cut to 50 // 16
    assert reqs[0].prefix_hashes[:2] == reqs[1].prefix_hashes[:2]  # the system prompt
    assert reqs[0].prefix_hashes == reqs[2].prefix_hashes  # the cycle's period is 2


@pytest.mark.parametrize(
    ("m", "msg"),
    [
        ({"groups": 0, "users": 1, "system_prompt_len": 1, "question_len": 1, "output_len": 1},
         r"workload.lengths.shared_prefix: groups\(=0\) must be an integer >= 1"),
        ({"groups": 1, "users": 1, "system_prompt_len": 1, "question_len": 1},
         r"workload.lengths.shared_prefix: missing 'output_len'"),
        ({"groups": 1, "users": 1, "system_prompt_len": 1, "question_len": 1, "output_len": 1,
          "multi_turn": "yes"}, r"multi_turn\(='yes'\) must be true or false"),
        ({"groups": 1, "users": 1, "system_prompt_len": 1, "question_len": 1, "output_len": 1,
          "turns": 2}, r"unknown key 'turns'"),
    ],
)  # fmt: skip
def test_bad_shared_prefix_keys_are_one_line_errors(m, msg):
    with pytest.raises(SpecError, match=msg):
        WorkloadSpec.from_mapping(
            {"lengths": {"shared_prefix": m}, "arrival": {"process": "poisson", "rate": 1.0},
             "max_requests": 3}
        )  # fmt: skip


def test_prefixes_and_output_tokens_belong_to_a_trace():
    base = {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1.0},
            "max_requests": 3}  # fmt: skip
    with pytest.raises(SpecError, match="output_tokens"):
        WorkloadSpec.from_mapping({**base, "output_tokens": 5})
    sp = {"groups": 1, "users": 1, "system_prompt_len": 1, "question_len": 1, "output_len": 1}
    with pytest.raises(SpecError, match="prefixes applies to trace only"):
        WorkloadSpec.from_mapping({**base, "prefixes": {"shared_prefix": sp}})


def test_the_engine_prefix_cache_hits_the_system_prompt_then_the_whole_prompt():
    import twin
    from twin.studies.realrun import twin_metrics

    spec = {
        "model": "llama-2-7b", "gpu": "h100-sxm", "cluster": {"instances": 1, "tp": 1},
        "engine": {"prefix_caching": True, "chunked_prefill": True, "max_batched_tokens": 2048},
        "workload": {"lengths": {"shared_prefix": {"groups": 2, "users": 2,
                                                   "system_prompt_len": 40, "question_len": 30,
                                                   "output_len": 5}},
                     "arrival": {"process": "poisson", "rate": 0.5}, "max_requests": 8},
    }  # fmt: skip
    result = twin.run(spec)
    rows = sorted(result.request_rows, key=lambda r: r["id"])
    w = WorkloadSpec.from_mapping(spec["workload"])
    reqs = list(iter_requests(w, np.random.default_rng(np.random.SeedSequence(0).spawn(2)[0])))
    group = [r.prefix_hashes[0] for r in reqs]  # the first block names the group
    seen: set[tuple[int, ...]] = set()
    groups_seen: set[int] = set()
    for row, req in zip(rows, reqs, strict=True):
        # each request ends before the next arrives (0.5 req/s, tens of ms each), so
        # a repeat hits its 4 full blocks, a new prompt of a group seen its 2
        # system-prompt blocks, a new group nothing
        want = 64 if req.prefix_hashes in seen else 32 if group[req.id] in groups_seen else 0
        assert row["hbm_hit_tokens"] == want
        seen.add(req.prefix_hashes)
        groups_seen.add(group[req.id])
    assert {r["hbm_hit_tokens"] for r in rows} == {0, 32, 64}
    m = twin_metrics(result, ((0.5, 100.0),))
    assert m[0]["e2e_mean"] == pytest.approx(np.mean([r["e2e_s"] for r in rows]))
