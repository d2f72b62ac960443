"""Speculative decoding: a cheap proposer drafts ``k`` tokens, the model verifies them at once.

Each decode step of a speculative instance is a *verify* step: for every
decoding sequence the target model processes ``k + 1`` query tokens (the
last emitted token and the ``k`` drafted ones) on that sequence's KV, and
emits the drafted tokens it accepts plus one of its own (the bonus token,
or the correction at the first rejection): ``1 .. k + 1`` tokens per step
(Leviathan et al., "Fast Inference from Transformers via Speculative
Decoding", ICML 2023, section 2.3). Only the accepted tokens' KV is kept.

The spec's ``engine.speculative``::

    speculative: {method: draft | eagle | mtp | ngram, k: 3,
                  acceptance: 0.7 | [0.73, 0.52, 0.35] | <row of the table>,
                  draft: <catalog model, method draft only>}

Acceptance (:class:`SpeculativeConfig.accept`, ``q``): ``q[j-1]`` is the
share of verify steps whose ``j``-th drafted token is accepted, which is
what vLLM reports per position (``spec_decode_num_accepted_tokens_per_pos``
over ``num_drafts``); a step emits ``1 + sum(q)`` tokens on average. A
number ``a`` is Leviathan et al.'s i.i.d. model, each drafted token
accepted with probability ``a`` given the ones before it: ``q[j-1] = a^j``.
A list gives ``q`` itself (``k`` values, none rising). A name picks a row of
the measured figures bundled in ``twin/data/speculative.json`` (each with its
source); its ``k`` must not exceed the draft length the row was measured at.

Draws (:meth:`Speculation.schedule`): when a sequence joins the decode batch
its accepted counts for every step until its last token are drawn at once,
one uniform per step, from a stream of its own: the run's seed, the request
id and the tokens it has produced so far name the stream, so the draws do
not depend on what else runs (a recomputed sequence draws again from where
it stands). Knowing each sequence's tokens per step ahead is what keeps the
engine's bookkeeping per step O(1) in the batch: its finish step and the
steps at which it needs a KV block are known at joining, and the batch's
context sum moves each step by the tokens the batch emits, summed at
joining into a per-step table.

Cost (:meth:`Speculation.iteration_time`): the perf model's time for the
batch with every decode sequence turned into a prefill chunk of ``k + 1``
tokens after its context (a prefill-like shape on each sequence's KV,
whose cost is linear in the contexts for the Roofline, so the chunks carry
the mean context), plus the proposer's own time:

- ``draft``: the draft model (a catalog model, priced by the Roofline of the
  same GPU and TP) runs one pass over the batch as it stands (its prompt
  chunks and one token per decode sequence), then ``k - 1`` decode steps.
- ``eagle`` / ``mtp``: the same passes on a head of the target's shape: one
  decoder layer plus the LM head (EAGLE: Li et al., ICML 2024, section 3.1,
  a single-layer autoregression head on the target's features; DeepSeek-V3's
  MTP module, arXiv 2412.19437 section 2.2, one transformer block sharing the
  embedding and output head).
- ``ngram``: zero. Prompt-lookup proposers match n-grams of the context on
  the CPU; their time is not priced.

A model with latent attention (DeepSeek's MLA) verifies with the absorbed
decode kernel, each of the ``k + 1`` positions a query over the cached
latent, so its verify is priced as ``k + 1`` decode sequences per sequence
(the prompt-chunk shape would price the non-absorbed prefill form and the
up-projection of the whole context). NOTE: each position then reads the
latent cache again, an overestimate at long contexts.

NOTE: the perf model prices the LM head once per sequence (a prefill chunk
needs only its last logits), so the verify's logits for the ``k`` drafted
positions are not priced; nor are a draft model's weights and KV taken out
of the KV capacity, nor the ``k`` lookahead KV slots vLLM reserves per
sequence for the drafted tokens (only accepted tokens take KV here).
Speculative instances step every iteration (no fast-forward: its closed
form prices steps whose contexts grow by one token each) and run one
pipeline stage (vLLM's speculative decoding does not run with pipeline
parallelism: its docs, "Speculative Decoding", v0.7 to v0.14).
"""

from __future__ import annotations

import dataclasses
import json
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from twin._check import check_keys, is_int, is_number
from twin.bundled import package_text
from twin.errors import SpecError
from twin.perf.gpus import GPUSpec
from twin.perf.iteration import Batch, PerfModel, decode_steps
from twin.perf.llm import ModelSpec, get_model
from twin.perf.roofline import Roofline

METHODS = ("draft", "eagle", "mtp", "ngram")
# The per-request streams' first spawn-key word, apart from the run's own
# children (twin.sim.simulation spawns 0 and 1 from the same seed).
_STREAM = 0x5BEC

SCHEMA = {
    "type": "object",
    "required": ["method", "k", "acceptance"],
    "properties": {
        "method": {"enum": list(METHODS)},
        "k": {"type": "integer", "exclusiveMinimum": 0},
        "acceptance": {
            "anyOf": [
                {"type": "number", "minimum": 0, "maximum": 1},
                {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}},
                {"type": "string"},
            ]
        },
        "draft": {"type": "string"},
    },
    "additionalProperties": False,
}


@cache
def table() -> Mapping[str, Mapping[str, Any]]:
    """The bundled measured acceptance figures, by row name (``twin/data/speculative.json``)."""
    return json.loads(package_text("speculative.json"))["rows"]  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """``engine.speculative``: the proposer, the draft length and the acceptance
    per position (the module docstring); ``draft`` names the draft model."""

    method: str
    k: int
    accept: tuple[float, ...]
    draft: str | None = None

    @property
    def mean_emitted(self) -> float:
        """Tokens a verify step emits on average (accepted plus the bonus)."""
        return 1.0 + sum(self.accept)


def parse(value: Any, where: str) -> SpeculativeConfig:
    """``engine.speculative`` from YAML (``where`` names it in errors)."""
    if not isinstance(value, dict):
        raise SpecError(f"{where}: {value!r} must be a mapping with method, k and acceptance")
    check_keys(value, where, ("method", "k", "acceptance"), ("draft",))
    method = value["method"]
    if method not in METHODS:
        raise SpecError(f"{where}.method: {method!r}; expected one of {', '.join(METHODS)}")
    k = value["k"]
    if not is_int(k) or k <= 0:
        raise SpecError(f"{where}.k: {k!r} must be a positive integer (tokens drafted per step)")
    draft = value.get("draft")
    if method == "draft":
        if not isinstance(draft, str):
            raise SpecError(f"{where}.draft: {draft!r}; method draft needs a catalog model name")
        get_model(draft, f"{where}.draft")
    elif draft is not None:
        raise SpecError(f"{where}.draft: {draft!r} is for method draft only (method is {method})")
    accept = _acceptance(value["acceptance"], k, f"{where}.acceptance")
    return SpeculativeConfig(method, k, accept, draft)


def _acceptance(value: Any, k: int, where: str) -> tuple[float, ...]:
    if is_number(value):
        if not 0.0 <= value <= 1.0:
            raise SpecError(f"{where}: {value!r} must be a probability in [0, 1]")
        return tuple(float(value) ** j for j in range(1, k + 1))
    if isinstance(value, str):
        rows = table()
        if value not in rows:
            raise SpecError(f"{where}: unknown figure {value!r}; expected one of {', '.join(rows)}")
        row = rows[value]
        if k > row["k"]:
            raise SpecError(
                f"{where}: {value!r} was measured drafting {row['k']} tokens; k is {k}"
                " (set k to at most that, or give the acceptance as a number)"
            )
        return tuple(float(q) for q in row["per_position"][:k])
    if isinstance(value, list):
        if len(value) != k or not all(is_number(q) and 0.0 <= q <= 1.0 for q in value):
            raise SpecError(
                f"{where}: {value!r} must be {k} probabilities in [0, 1], one per drafted position"
            )
        if any(b > a for a, b in zip(value, value[1:], strict=False)):
            raise SpecError(
                f"{where}: {value!r} rises; the share of steps accepting position j+1 is at"
                " most the share accepting position j"
            )
        return tuple(float(q) for q in value)
    raise SpecError(f"{where}: {value!r} must be a number, a list or a figure's name")


def head_model(model: ModelSpec, method: str) -> ModelSpec:
    """An EAGLE head or MTP module of ``model``'s shape: one decoder layer and the
    LM head (the embedding it shares is looked up, not multiplied: its weights
    are not read). Its parameters: one layer's share of the body plus the head."""
    head = model.vocab * model.hidden
    body = max(model.params - 2 * head, model.layers)
    return dataclasses.replace(
        model, name=f"{model.name}-{method}-head", layers=1, dense_layers=0,
        sliding_layers=0, sliding_window=0, params=body // model.layers + head,
    )  # fmt: skip


# The Roofline's terms a proposer shares with the target it runs beside: the
# software and GPU efficiencies, and (a head of a mixture-of-experts target,
# sharded as its layers are) the expert-parallel layout.
_TERMS = (
    "engine", "mfu", "mbu", "attn_mfu", "layer_overhead_s", "seq_overhead_s",
    "seq_shard_overhead_s", "hop_latency_s", "tp_mfu_exponent", "act_traffic", "no_overlap",
    "hop_overhead_s", "throttle", "throttle_knee_s", "l2_speedup",
)  # fmt: skip
_MOE_TERMS = (
    "moe_efficiency", "ep", "dp", "expert_skew", "a2a_intra_bytes_s", "a2a_inter_bytes_s",
    "a2a_ranks_per_node", "a2a_latency_s", "moe_dispatch_dtype", "moe_overlap",
    "moe_dispatch_nodes", "moe_overlap_min_tokens",
)  # fmt: skip


def proposer_model(
    model: ModelSpec, perf: PerfModel, gpu: GPUSpec, tp: int, *, moe: bool
) -> Roofline:
    """The Roofline of a proposer ``model`` on the target's GPUs: the target's
    terms where it is a Roofline (its expert-parallel layout too with ``moe``),
    else the default ones, and no per-step overhead: the proposer's passes run
    inside the engine step, whose loop (schedule, inputs, sampling) the
    target's pass already pays."""
    if not isinstance(perf, Roofline):
        return Roofline(model, gpu, tp, overhead_s=0.0)
    names = _TERMS + (_MOE_TERMS if moe else ())
    kw = {name: getattr(perf, name) for name in names}
    return Roofline(model, perf.gpu, perf.tp, **kw, overhead_s=0.0)


class Speculation:
    """One instance's speculative decoding: its draws and the price of its steps.

    ``perf`` is the instance's perf model (the target's); ``model``, ``gpu`` and
    ``tp`` build the proposer's; ``seed`` is the run's."""

    def __init__(
        self,
        config: SpeculativeConfig,
        perf: PerfModel,
        model: ModelSpec,
        gpu: GPUSpec,
        tp: int,
        seed: int,
    ) -> None:
        self.config = config
        self.perf = perf
        self.seed = seed
        self.k = config.k
        import numpy as np  # here, not at import: checking a spec needs no numerics

        self._np = np
        self._neg_q = -np.asarray(config.accept, dtype=np.float64)
        self.latent = model.is_mla
        self.proposer: PerfModel | None = None
        if config.method == "draft":
            assert config.draft is not None
            self.proposer = proposer_model(get_model(config.draft), perf, gpu, tp, moe=False)
        elif config.method in ("eagle", "mtp"):
            head = head_model(model, config.method)
            self.proposer = proposer_model(head, perf, gpu, tp, moe=True)
        self._steps = decode_steps(self.proposer) if self.proposer is not None else None

    def schedule(self, req_id: int, generated: int, remaining: int) -> list[int]:
        """The tokens a sequence has emitted after each of its next steps:
        ``[0, e1, e1 + e2, ..., remaining]`` (one entry per step and a leading
        0), each step's ``1 + accepted`` drawn from the request's own stream
        (named by the seed, ``req_id`` and ``generated``); the last step emits
        only what is left of ``remaining``."""
        np = self._np
        ss = np.random.SeedSequence(self.seed, spawn_key=(_STREAM, req_id, generated))
        u = np.random.default_rng(ss).random(remaining)
        emitted = np.searchsorted(self._neg_q, -u, side="left") + 1
        cum = np.cumsum(emitted)
        last = int(np.searchsorted(cum, remaining, side="left"))
        out = [0, *cum[: last + 1].tolist()]
        out[-1] = remaining
        return out

    def verify_batch(self, batch: Batch) -> Batch:
        """``batch`` with each decode sequence as a prefill chunk of ``k + 1``
        tokens after its context (the context sum spread evenly, to the token)."""
        n = batch.decode_count
        if n == 0:
            return batch
        w = self.k + 1
        if self.latent:
            # each position a decode query over the latent cache (the absorbed kernel)
            return Batch(batch.prefill, n * w, w * batch.decode_context_sum + n * w * self.k // 2)
        q, r = divmod(batch.decode_context_sum - n, n)  # cached: the context less its new token
        chunks = ((w, q + 1),) * r + ((w, q),) * (n - r)
        return Batch(batch.prefill + chunks)

    def iteration_time(self, batch: Batch) -> float:
        """Seconds of one iteration of ``batch`` with its decodes verifying:
        the verify shape on the perf model (at least ``batch`` as it is) plus
        the proposer's passes."""
        t = self.perf.iteration_time(self.verify_batch(batch))
        if batch.decode_count:
            # it reads the weights and KV a decode step reads and computes more
            # tokens: never less (a fitted model's prompt and decode fits may
            # disagree at a few tokens, DistServe's among them)
            t = max(t, self.perf.iteration_time(batch))
        if self.proposer is None or batch.is_empty:
            return t
        t += self.proposer.iteration_time(batch)
        n = batch.decode_count
        if n and self.k > 1:
            assert self._steps is not None
            t += sum(self._steps(n, batch.decode_context_sum + n, self.k - 1))
        return t


def blocks_step(cum: list[int], step: int, join: int, prefill_len: int, tokens: int) -> int:
    """The first step from ``step`` at which a sequence that joined at step
    ``join`` with the emission schedule ``cum`` (:meth:`Speculation.schedule`)
    holds more than ``tokens`` tokens of context: ``prefill_len + 1 + cum[j]``
    at its ``j``-th step; past its last step when never."""
    j = bisect_right(cum, tokens - prefill_len - 1, lo=step - join)
    return join + j
