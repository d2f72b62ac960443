"""The ``vllm`` engine preset: the Roofline's software and kernel terms for vLLM's V1 engine.

What vLLM V1 (v0.11 and later, measured at v0.15.1) does per step, and the term that prices it:

- ``overhead_s``, per step: V1 runs one engine-core loop per step (schedule, prepare the inputs,
  launch, sample, hand the outputs to the API server process). Since v0.14 async scheduling is
  on by default (vLLM v0.14.0 release notes, "Async scheduling is now enabled by default",
  vllm-project/vllm#27614): the next step is scheduled while the current one runs, so the CPU
  time of scheduling and input preparation hides under the GPU time; what remains per step is
  the launch of the step's CUDA graph, the copy of the sampled token ids back to the host and
  the sampler's kernels. No measurement isolates it: it is fitted (below), held between
  0.1 ms and 3 ms.
- ``layer_overhead_s``, per layer per step: decode batches run as one full CUDA graph (vLLM
  design doc "CUDA Graphs", docs.vllm.ai/en/latest/design/cuda_graphs; ``cudagraph_mode``
  FULL_AND_PIECEWISE, the default, captures uniform decode batches whole and mixed batches
  piecewise, attention outside the graph), so no kernel is launched from the host per layer.
  What a layer still costs beyond its bytes and FLOPs is the floor of each of its ~10 small
  kernels (norms, rotary, activation, the all-reduce and the attention's split-KV reduction):
  a few microseconds each on an idle GPU whatever the batch. Fitted, held between 1 us and
  60 us per layer (the distserve preset's 100 us is a host launch per kernel, which graphs
  remove).
- ``seq_overhead_s``, per sequence per step: the scheduler's and the input preparation's work
  per running request; hidden under the GPU by async scheduling, priced 0.
- ``act_traffic``: element-wise passes of ``hidden x dtype`` bytes per token per layer that are
  not part of a GEMM: with V1's torch.compile fusions (fused residual-add + RMSNorm twice,
  rotary on q and k, SiLU-and-mul over the 2 x intermediate gate/up output, the all-reduce's
  buffer in and out) about 20 for a Llama-shaped layer; counted, not fitted.
- ``no_overlap`` 0: each kernel of a step is bound by its own compute or memory time, and a
  decode step's kernels are all memory-bound (weights and KV streamed once), so the step's
  roofline is ``max(compute, memory)``; a mixed step's GEMMs are compute-bound and its decode
  attention memory-bound, which ``max`` prices at the larger. Not fitted.
- ``hop_overhead_s``: vLLM all-reduces small TP activations with its own one-shot/two-shot
  kernel over NVLink peer memory (``vllm/distributed/device_communicators/custom_all_reduce``),
  a few microseconds per all-reduce on H100; the software's share per ring step is fitted,
  held at most 5 us.
- ``moe_efficiency``: vLLM's fused mixture-of-experts kernel (Triton ``fused_moe``) reads each
  active expert's weights in tiles sized for a batch of tokens; at decode batch sizes it
  streams below ``mbu``; the share is fitted on the mixture-of-experts runs, held in [0.3, 1].

What the client sees (``VLLM_CLIENT_LATENCY_S``, a replayed run's ``slo.client_latency``):
the load generator times TTFT and E2E at the client, around the engine's steps: its HTTP
request and the first streamed chunk, and in vLLM's OpenAI-compatible API server process
the request's parsing and tokenisation, its hand-over to the engine-core process and the
first output's detokenisation and server-sent event. None of it is an engine step, so it
is one constant per request, added to TTFT and E2E (ITL unchanged). The measured runs say
so: with the engine terms above (150 requests a stage replayed), the measured TTFT mean
less the twin's, at each run's first load stage, is 11.6 ms +- 2.0 ms (mean, s.d.) over
the 11 dense-model runs with 550- to 750-token prompts whatever the model (Llama-2-7B to
Llama-3.1-70B, TP 1 to 4), while their decode step runs from 6 to 19 ms: a fit of the
gap to ``c + k x step`` gives k = 0.17, where a request admitted one step later than the
twin admits it (vLLM's async scheduling) would give k near 1. Prefix caching is not the
cause: the twin reuses the 96 tokens (6 whole 16-token blocks) of each 100-token system
prompt that vLLM's block hashes can reuse, and no more. No measurement isolates the term:
it is fitted (the weighted median of the runs' gaps, which minimises the TTFT error;
:func:`twin.studies.calibrate_runs.best_client`), held between 0 and 30 ms.

Fitted: ``overhead_s``, ``layer_overhead_s``, ``hop_overhead_s`` and ``moe_efficiency``
on the mean of each run's E2E mean and ITL mean error, ``VLLM_CLIENT_LATENCY_S`` on its
TTFT mean error, by ``twin calibrate --runs ../shared/data/realruns --stage-requests 300``
(:mod:`twin.studies.calibrate_runs`: a coarse-to-fine search from the estimates above,
the first 300 requests of each load stage replayed) to the 17 runs of
``shared/data/realruns`` that are not overloaded (vLLM v0.15.1 on H100 SXM: Llama-2-7B/70B,
CodeLlama-34B, Llama-3.1-70B, Mistral-Nemo-12B, Qwen2.5-7B, Yi-34B and the Llama-4-Scout
FP8 mixture of experts; TP 1, 2 and 4; prefix-cached shared-prefix chat at 1 to 20
requests/s). The search moved ``layer_overhead_s`` from 15 to 10.7 us, ``moe_efficiency``
from 1 to 0.71, kept the others at their estimates, and put the client latency at 15.45
ms. In sample, mean (median) absolute error over the 17 runs: E2E mean 6.1% (5.0%), ITL
mean 6.1% (5.0%), TTFT mean 19.4% (16.9%). Leave one run out (the same command with
``--leave-one-out``: each run scored with the terms fitted, from the same estimates, to
the other 16): E2E mean 6.4% (5.5%), ITL mean 6.4% (5.4%), TTFT mean 20.5% (16.9%). The
worst TTFT runs are left as they are: Llama-4-Scout and Llama-2-7B at 1 request/s with
934-token questions (58%, 37%; engine-side: their gap is 3 to 8 times the dense runs')
and Llama-2-70B at 20 requests/s (36%: its second stage queues in the measured run, not
in the first 300 requests replayed).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# The fitted values: see the module docstring for each term's bounds, source and fit.
VLLM_TERMS: Mapping[str, float] = MappingProxyType(
    {
        "overhead_s": 0.0015,
        "layer_overhead_s": 1.071e-05,
        "seq_overhead_s": 0.0,
        "seq_shard_overhead_s": 0.0,
        "act_traffic": 20.0,
        "no_overlap": 0.0,
        "hop_overhead_s": 2e-06,
        "moe_efficiency": 0.7143,
    }
)
# The client's share of a measured TTFT and E2E against vLLM's OpenAI-compatible server (see
# the module docstring, "What the client sees"): ``slo.client_latency`` of a replayed run.
# Fitted on TTFT mean to the 17 runs above; leave-one-run-out error in the docstring.
VLLM_CLIENT_LATENCY_S = 0.01545
