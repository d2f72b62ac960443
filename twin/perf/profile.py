"""``twin profile``: measure a native profile table on a real device with PyTorch.

The model's decoder layers are built from its catalog shapes (:class:`~twin.perf.llm.ModelSpec`:
hidden size, query and KV heads, head dimension, MLP width and kind) with random weights,
since the time of a forward pass does not depend on the weight values, and real forward
passes are timed: prefill iterations of ``B`` prompts of ``P`` tokens, decode iterations of
``B`` sequences at context ``C`` each, and mixed iterations (one prompt chunk beside a decode
batch). Each layer is RMSNorm, the fused QKV projection, rotary embedding, attention through
:func:`torch.nn.functional.scaled_dot_product_attention` over a contiguous KV cache, the output
projection, RMSNorm and the MLP (gated SwiGLU or plain GELU); after the layers, the final norm
and the LM head over each sequence's last token. With ``tp > 1`` one tensor-parallel rank's
shard is built and timed (heads, KV heads and MLP width divided by ``tp``); NOTE: the
all-reduces between ranks are not measured, so such a table prices a TP instance as if its
collectives were free.

Timing: on CUDA with CUDA events around each pass, after warm-up passes; on CPU with
:func:`time.perf_counter_ns` around each pass. Each point is the median of ``repeats`` passes.
``layers`` of the model's layers are timed (each with its own weights; default: all) and the
layers' time is scaled by ``model layers / layers``, the LM head timed once; the sidecar says
which. NOTE: the timed layers share one KV buffer; on short contexts it can stay in the
device's cache from one layer to the next, making attention a little faster than with one
cache per layer.

Outputs: the native CSV that ``perf: {kind: profile}`` reads (``phase,batch_size,tokens,
context,time_s``, see :class:`~twin.perf.tables.ProfileTable`), rows in a fixed order, no
date; and a JSON sidecar (``TABLE.json``) with the environment (torch and CUDA versions,
device name, attention kernel), the grid, the layers timed, the mixed iterations (measured,
and as the table prices them), the table's sha256 and the date of the measurement (the one
field of the sidecar that is a wall-clock time; the table holds none).

PyTorch is imported only inside the functions here (the ``profile`` extra); the simulation
never imports this module.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twin._io import read_text
from twin.errors import TwinError
from twin.perf.iteration import Batch
from twin.perf.llm import ModelSpec
from twin.perf.tables import ProfileTable

# A test model small enough to profile on a CPU in seconds: the shapes of a decoder layer at
# toy size (not a real model).
TINY = ModelSpec(
    name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128,
    vocab=256, params=2 * 12 * 64 * 64 + 2 * 256 * 64, max_context=4096,
)  # fmt: skip

# RoPE base of Llama 2/3 and Qwen config.json (``rope_theta``); only the cost matters here.
_ROPE_THETA = 10000.0
# RMSNorm epsilon of Llama config.json (``rms_norm_eps``).
_RMS_EPS = 1e-5


@dataclass(frozen=True)
class Grid:
    """The points measured: prefill ``batches x prompts`` (at most ``max_tokens`` tokens in
    one pass), decode ``batches x contexts`` (at most ``max_kv_tokens`` cached tokens in one
    pass), mixed ``(chunk tokens, decode batch, context)``."""

    prefill_batches: tuple[int, ...]
    prompts: tuple[int, ...]
    decode_batches: tuple[int, ...]
    contexts: tuple[int, ...]
    mixed: tuple[tuple[int, int, int], ...]
    max_tokens: int
    max_kv_tokens: int

    def prefill_points(self) -> list[tuple[int, int]]:
        return [
            (b, p) for b in self.prefill_batches for p in self.prompts if b * p <= self.max_tokens
        ]

    def decode_points(self) -> list[tuple[int, int]]:
        return [
            (b, c)
            for b in self.decode_batches
            for c in self.contexts
            if b * c <= self.max_kv_tokens
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefill_batches": list(self.prefill_batches),
            "prompts": list(self.prompts),
            "decode_batches": list(self.decode_batches),
            "contexts": list(self.contexts),
            "mixed": [list(m) for m in self.mixed],
            "max_tokens": self.max_tokens,
            "max_kv_tokens": self.max_kv_tokens,
        }


def _pow2(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(2**k for k in range(int(math.log2(lo)), int(math.log2(hi)) + 1))


GRIDS = {
    # The grid: prefill batch 1..8 x prompts 128..8,192 (at most 64Ki tokens a pass);
    # decode batch 1..256 x context 128..16,384 (at most 2Mi cached tokens a pass: 16 GB of
    # KV per layer for Llama-3.1-8B); mixed chunks of 512 and 2,048 beside 8 to 128 decodes.
    "full": Grid(
        prefill_batches=(1, 2, 4, 8),
        prompts=_pow2(128, 8192),
        decode_batches=_pow2(1, 256),
        contexts=_pow2(128, 16384),
        mixed=tuple((n, b, 2048) for n in (512, 2048) for b in (8, 32, 128)),
        max_tokens=65536,
        max_kv_tokens=2**21,
    ),  # fmt: skip
    # A quick look: a few points of each kind.
    "small": Grid(
        prefill_batches=(1, 2, 4, 8),
        prompts=(128, 512, 2048),
        decode_batches=(1, 8, 64),
        contexts=(128, 1024, 8192),
        mixed=((512, 8, 1024),),
        max_tokens=16384,
        max_kv_tokens=2**19,
    ),  # fmt: skip
    # For the tiny model on a CPU: seconds.
    "tiny": Grid(
        prefill_batches=(1, 2),
        prompts=(16, 64),
        decode_batches=(1, 4),
        contexts=(16, 128),
        mixed=((16, 2, 64),),
        max_tokens=256,
        max_kv_tokens=1024,
    ),  # fmt: skip
}


@dataclass(frozen=True)
class ProfileResult:
    """What :func:`profile` measured: the table rows and the sidecar document."""

    rows: list[tuple[str, int, int, int, float]]
    sidecar: dict[str, Any]


def table_text(rows: Sequence[tuple[str, int, int, int, float]]) -> str:
    """The native CSV of ``rows`` (``phase, batch_size, tokens, context, time_s``)."""
    lines = ["phase,batch_size,tokens,context,time_s"]
    lines += [f"{ph},{b},{n},{c},{t:.6e}" for ph, b, n, c, t in rows]
    return "\n".join(lines) + "\n"


def _check_shapes(model: ModelSpec, tp: int) -> None:
    problem = model.tp_problem(tp)
    if problem:
        raise TwinError(f"twin profile: --tp {tp}: {problem}")


class _Layers:
    """One TP rank's shard of ``n`` decoder layers, the final norm and the LM head, in torch."""

    def __init__(self, torch: Any, model: ModelSpec, tp: int, n: int, dev: Any, dtype: Any,
                 seed: int, max_pos: int) -> None:  # fmt: skip
        self.t = torch
        self.F = torch.nn.functional
        self.h = model.heads // tp
        self.kvh = model.kv_heads_per_gpu(tp)
        self.d = model.head_dim
        self.hidden = model.hidden
        self.gated = model.mlp == "gated"
        self.inter = model.intermediate // tp
        g = torch.Generator(device=dev)
        g.manual_seed(seed)

        def w(*shape: int) -> Any:
            return torch.randn(*shape, generator=g, device=dev, dtype=dtype) * 0.02

        qkv = (self.h + 2 * self.kvh) * self.d
        up = 2 * self.inter if self.gated else self.inter
        self.layers = [
            {
                "n1": torch.ones(self.hidden, device=dev, dtype=dtype),
                "qkv": w(qkv, self.hidden),
                "o": w(self.hidden, self.h * self.d),
                "n2": torch.ones(self.hidden, device=dev, dtype=dtype),
                "up": w(up, self.hidden),
                "down": w(self.hidden, self.inter),
            }
            for _ in range(n)
        ]
        self.norm = torch.ones(self.hidden, device=dev, dtype=dtype)
        self.head = w(model.vocab // tp if model.vocab % tp == 0 else model.vocab, self.hidden)
        inv = 1.0 / (_ROPE_THETA ** (torch.arange(0, self.d, 2, device=dev).float() / self.d))
        ang = torch.outer(torch.arange(max_pos, device=dev).float(), inv)
        self.cos = torch.cos(ang).to(dtype)
        self.sin = torch.sin(ang).to(dtype)
        self.dev, self.dtype = dev, dtype
        try:  # GQA without copying K/V (torch >= 2.5)
            q = torch.zeros(1, 2, 1, 4, device=dev, dtype=dtype)
            k = torch.zeros(1, 1, 1, 4, device=dev, dtype=dtype)
            self.F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
            self.gqa = True
        except (TypeError, RuntimeError):
            self.gqa = False

    def _rms(self, x: Any, wt: Any) -> Any:
        t = self.t
        v = x.float()
        v = v * t.rsqrt(v.pow(2).mean(-1, keepdim=True) + _RMS_EPS)
        return v.to(x.dtype) * wt

    def _rope(self, x: Any, pos: Any) -> Any:
        # x: [..., tokens, d], pos: [tokens]; rotate-half form
        cos = self.cos[pos].repeat(1, 2)
        sin = self.sin[pos].repeat(1, 2)
        half = self.d // 2
        rot = self.t.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    def _attn_prefill(self, q: Any, k: Any, v: Any) -> Any:
        # q: [B, H, P, d]; k, v: [B, KVH, P, d]; causal
        if self.gqa:
            return self.F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        g = self.h // self.kvh
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        return self.F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def _attn_decode(self, q: Any, k: Any, v: Any) -> Any:
        # q: [B, H, 1, d]; k, v: [B, KVH, C, d]: the query heads of one KV head attend as
        # rows of one query block (no copy of the cache).
        b = q.shape[0]
        g = self.h // self.kvh
        out = self.F.scaled_dot_product_attention(q.reshape(b, self.kvh, g, self.d), k, v)
        return out.reshape(b, self.h, 1, self.d)

    def inputs(self, prefill: tuple[int, int], decode: tuple[int, int]) -> tuple[Any, Any, Any]:
        """The hidden states entering the first layer and the positions, made before timing."""
        t = self.t
        (bp, p), (bd, c) = prefill, decode
        x = t.randn(bp * p + bd, self.hidden, device=self.dev, dtype=self.dtype) * 0.1
        pos_p = t.arange(p, device=self.dev) if bp else None
        pos_d = t.full((1,), c - 1, device=self.dev, dtype=t.long) if bd else None
        return x, pos_p, pos_d

    def layers_pass(
        self, prefill: tuple[int, int], decode: tuple[int, int], kv: Any, inp: tuple[Any, ...]
    ) -> Any:
        """One forward pass of every layer: ``prefill = (B, P)`` prompts (or (0, 0)) beside
        ``decode = (B, C)`` sequences at context C (or (0, 0)) whose cache is ``kv``; ``inp``
        from :meth:`inputs`."""
        t = self.t
        bp, p = prefill
        bd, c = decode
        x, pos_p, pos_d = inp
        qd, kd = self.h * self.d, self.kvh * self.d
        for lw in self.layers:
            hdn = self._rms(x, lw["n1"])
            qkv = self.F.linear(hdn, lw["qkv"])
            outs = []
            if bp:
                part = qkv[: bp * p].view(bp, p, -1)
                q = part[..., :qd].view(bp, p, self.h, self.d).transpose(1, 2)
                k = part[..., qd : qd + kd].view(bp, p, self.kvh, self.d).transpose(1, 2)
                v = part[..., qd + kd :].view(bp, p, self.kvh, self.d).transpose(1, 2)
                q, k = self._rope(q, pos_p), self._rope(k, pos_p)
                a = self._attn_prefill(q, k, v)
                outs.append(a.transpose(1, 2).reshape(bp * p, qd))
            if bd:
                part = qkv[bp * p :]
                q = part[:, :qd].view(bd, self.h, 1, self.d)
                k = part[:, qd : qd + kd].view(bd, self.kvh, 1, self.d)
                v = part[:, qd + kd :].view(bd, self.kvh, 1, self.d)
                q, k = self._rope(q, pos_d), self._rope(k, pos_d)
                kc, vc = kv
                kc[:, :, c - 1 : c] = k  # the new token's KV joins the cache
                vc[:, :, c - 1 : c] = v
                a = self._attn_decode(q, kc, vc)
                outs.append(a.reshape(bd, qd))
            a = outs[0] if len(outs) == 1 else t.cat(outs)
            x = x + self.F.linear(a, lw["o"])
            hdn = self._rms(x, lw["n2"])
            up = self.F.linear(hdn, lw["up"])
            if self.gated:
                gate, u = up.chunk(2, dim=-1)
                up = self.F.silu(gate) * u
            else:
                up = self.F.gelu(up)
            x = x + self.F.linear(up, lw["down"])
        return x

    def head_pass(self, x: Any) -> Any:
        """The final norm and the LM head over ``x``, the last token of each sequence."""
        return self.F.linear(self._rms(x, self.norm), self.head)


def _timer(
    torch: Any, cuda: bool, warmup: int, repeats: int
) -> Callable[[Callable[[], Any]], float]:
    """A function timing ``fn()``: median seconds of ``repeats`` passes after ``warmup``."""

    def run(fn: Callable[[], Any]) -> float:
        for _ in range(warmup):
            fn()
        times = []
        if cuda:
            torch.cuda.synchronize()
            for _ in range(repeats):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
        else:
            for _ in range(repeats):
                t0 = time.perf_counter_ns()
                fn()
                times.append((time.perf_counter_ns() - t0) * 1e-9)
        return float(statistics.median(times))

    return run


_DTYPES = ("bf16", "fp16", "fp32")


def profile(  # noqa: C901
    model: ModelSpec,
    gpu: str,
    *,
    tp: int = 1,
    device: str = "cuda",
    grid: Grid = GRIDS["full"],
    grid_name: str = "full",
    layers: int | None = None,
    dtype: str | None = None,
    warmup: int = 3,
    repeats: int = 5,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> ProfileResult:
    """Measure the table of ``model`` at ``tp`` on ``device`` over ``grid`` (see the module).

    The arguments are checked before PyTorch is looked for, so a mistyped
    option is told as such on a machine without it too."""
    _check_shapes(model, tp)
    if device not in ("cuda", "cpu"):
        raise TwinError(f"twin profile: --device {device!r}; expected cuda or cpu")
    cuda = device == "cuda"
    dtype = dtype or ("bf16" if cuda else "fp32")
    if dtype not in _DTYPES:
        raise TwinError(f"twin profile: --dtype {dtype!r}; expected one of {', '.join(_DTYPES)}")
    n_layers = model.layers if layers is None else layers
    if not 1 <= n_layers <= model.layers:
        raise TwinError(f"twin profile: --layers {n_layers}: expected 1..{model.layers}")
    for label, v in (("warmup", warmup), ("repeats", repeats)):
        if v < (0 if label == "warmup" else 1):
            raise TwinError(f"twin profile: --{label} {v} is too small")
    try:
        import torch
    except ImportError:
        raise TwinError("twin profile: needs PyTorch (pip install 'pd-twin[profile]')") from None
    if cuda and not torch.cuda.is_available():
        raise TwinError("twin profile: --device cuda: no CUDA device visible to PyTorch")
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    dev = torch.device(device)
    pre, dec = grid.prefill_points(), grid.decode_points()
    max_pos = max([p for _, p in pre] + [c for _, c in dec] + [m[0] for m in grid.mixed]
                  + [m[2] for m in grid.mixed] + [1])  # fmt: skip
    net = _Layers(torch, model, tp, n_layers, dev, tdtype, seed, max_pos)
    timer = _timer(torch, cuda, warmup, repeats)
    scale = model.layers / n_layers
    say = progress or (lambda _msg: None)

    def kv_cache(b: int, c: int) -> Any:
        shape = (b, net.kvh, c, net.d)
        return (torch.zeros(shape, device=dev, dtype=tdtype),
                torch.zeros(shape, device=dev, dtype=tdtype))  # fmt: skip

    head: dict[int, float] = {}

    def head_time(seqs: int) -> float:
        if seqs not in head:
            x = torch.randn(seqs, model.hidden, device=dev, dtype=tdtype) * 0.1
            head[seqs] = timer(lambda: net.head_pass(x))
        return head[seqs]

    def measure(prefill: tuple[int, int], decode: tuple[int, int]) -> float:
        kv = kv_cache(*decode) if decode[0] else None
        inp = net.inputs(prefill, decode)
        t = timer(lambda: net.layers_pass(prefill, decode, kv, inp))
        return t * scale + head_time(prefill[0] + decode[0])

    rows: list[tuple[str, int, int, int, float]] = []
    mixed: list[tuple[int, int, int, float]] = []
    threads = torch.get_num_threads()
    if not cuda:  # one thread: steadier times on a shared CPU
        torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            for b, p in pre:
                rows.append(("prefill", b, p, 0, measure((b, p), (0, 0))))
                say(f"prefill batch {b} x {p} tokens: {rows[-1][4] * 1e3:.3f} ms")
            for b, c in dec:
                rows.append(("decode", b, 1, c, measure((0, 0), (b, c))))
                say(f"decode batch {b} at context {c}: {rows[-1][4] * 1e3:.3f} ms")
            for n, b, c in grid.mixed:
                mixed.append((n, b, c, measure((1, n), (b, c))))
                say(f"mixed chunk {n} + {b} decodes at {c}: {mixed[-1][3] * 1e3:.3f} ms")
    finally:
        torch.set_num_threads(threads)
    text = table_text(rows)
    sha = hashlib.sha256(text.encode()).hexdigest()
    table = ProfileTable(
        "profile:measured", sha,
        {(b, n): t for ph, b, n, _, t in rows if ph == "prefill"},
        {(b, c): t for ph, b, _, c, t in rows if ph == "decode"},
    )  # fmt: skip
    if cuda:
        dev_name = torch.cuda.get_device_name(dev)
        backend = {
            "flash": bool(torch.backends.cuda.flash_sdp_enabled()),
            "mem_efficient": bool(torch.backends.cuda.mem_efficient_sdp_enabled()),
            "math": bool(torch.backends.cuda.math_sdp_enabled()),
        }
    else:
        import platform

        dev_name = platform.processor() or platform.machine()
        backend = {"cpu": True}
    sidecar = {
        "table_sha256": sha,
        # every field but an unset weight_dtype_bytes (0: "as dtype_bytes", not a width)
        "model": {
            k: getattr(model, k)
            for k in ModelSpec.__dataclass_fields__
            if k != "weight_dtype_bytes" or model.weight_dtype_bytes
        },
        "gpu": gpu,
        "tp": tp,
        "device": device,
        "device_name": dev_name,
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda if cuda else None,
        "dtype": dtype,
        "attention": "torch.nn.functional.scaled_dot_product_attention, contiguous KV",
        "attention_gqa": "enable_gqa" if net.gqa else "repeat_interleave (prefill)",
        "sdpa_backends_enabled": backend,
        "layers_timed": n_layers,
        "layers_total": model.layers,
        "layer_scaling": (
            f"the time of {n_layers} layers x {model.layers}/{n_layers}, plus the LM head"
            if n_layers != model.layers
            else "every layer timed, plus the LM head"
        ),
        "tp_note": "one TP rank's shard; all-reduces not measured" if tp > 1 else None,
        "timing": "CUDA events" if cuda else "time.perf_counter_ns",
        "warmup": warmup,
        "repeats": repeats,
        "statistic": "median",
        "seed": seed,
        "grid_name": grid_name,
        "grid": grid.as_dict(),
        "mixed": [
            {
                "chunk_tokens": n,
                "decode_batch": b,
                "context": c,
                "measured_s": t,
                "table_s": table.iteration_time(
                    Batch(prefill=((n, 0),), decode_count=b, decode_context_sum=b * c)
                ),
            }  # fmt: skip
            for n, b, c, t in mixed
        ],
        # The only wall-clock field: when the table was measured (the table holds no date).
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return ProfileResult(rows, sidecar)


def sidecar_path(table: Path) -> Path:
    """The sidecar of ``table``: the same name with ``.json`` for its suffix."""
    return table.with_suffix(".json")


def write(result: ProfileResult, out: Path) -> str:
    """Write the table to ``out`` and its sidecar beside it; the table's sha256."""
    text = table_text(result.rows)
    try:
        out.write_bytes(text.encode())
        with sidecar_path(out).open("w", encoding="utf-8") as f:
            json.dump(result.sidecar, f, indent=2, sort_keys=True)
            f.write("\n")
    except OSError as e:
        raise TwinError(f"twin profile: {out}: cannot write: {e.strerror}") from None
    return hashlib.sha256(text.encode()).hexdigest()


def read_sidecar(table: Path) -> dict[str, Any] | None:
    """The sidecar of ``table`` as written by :func:`write`, or None when there is none."""
    path = sidecar_path(table)
    if not path.is_file():
        return None
    try:
        doc = json.loads(read_text(path, "profile sidecar"))
    except ValueError as e:
        raise TwinError(f"{path}: not a profile sidecar ({e})") from None
    if not isinstance(doc, dict):
        raise TwinError(f"{path}: not a profile sidecar (a JSON object expected)")
    return doc


def command(
    model_arg: str,
    gpu: str | None,
    *,
    tp: int,
    out: str,
    device: str,
    grid: str,
    layers: int | None,
    dtype: str | None,
    warmup: int,
    repeats: int,
    quiet: bool,
) -> int:
    """``twin profile``: measure, write the table and its sidecar, print the sha256."""
    from twin.perf.gpus import get_gpu
    from twin.perf.llm import model_from_arg

    model = TINY if model_arg == "tiny" else model_from_arg(model_arg, "twin profile: MODEL")
    if gpu is None:
        if device != "cpu":
            raise TwinError("twin profile: --gpu: missing; the catalog GPU measured (twin gpus)")
        gpu_name = "cpu"
    else:
        gpu_name = get_gpu(gpu, "twin profile: --gpu").name
    if grid not in GRIDS:
        raise TwinError(f"twin profile: --grid {grid!r}; expected one of {', '.join(GRIDS)}")
    if tp < 1:
        raise TwinError(f"twin profile: --tp {tp} must be >= 1")
    path = Path(out)
    if not path.parent.is_dir():  # before minutes of measuring, not after
        raise TwinError(f"twin profile: --out {out}: no folder {path.parent}")
    result = profile(
        model, gpu_name, tp=tp, device=device, grid=GRIDS[grid], grid_name=grid,
        layers=layers, dtype=dtype, warmup=warmup, repeats=repeats,
        progress=None if quiet else (lambda msg: print(msg, flush=True)),
    )  # fmt: skip
    sha = write(result, path)
    print(f"{path}: {len(result.rows)} rows, sha256 {sha}")
    print(f"{sidecar_path(path)}: the environment and the mixed iterations")
    return 0
