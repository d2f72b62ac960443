"""Check the analytical :class:`~twin.perf.roofline.Roofline` against measured profiles.

Sources (all under the shared data directory, ``profiles/``):

- splitwise-sim ``perf_model.csv``: llama2-70b at TP 2, 4, 8 and bloom-176b at
  TP 8, each on a100-80gb, h100-80gb and h100-80gb-pcap (the power-capped
  H100, its own GPU: see :mod:`twin.perf.gpus`). ``prompt_time`` for prompt
  size P and batch B is one prefill iteration of B prompts of P tokens
  (splitwise-sim prices a prompt batch by ``P x B`` batch tokens);
  ``token_time`` is the mean decode iteration of B
  sequences over the generation of T tokens, compared with one decode
  iteration at context ``P + T // 2`` each. Repeated runs are reduced to their
  median, as splitwise-sim does.
- DistServe's fitted A100-80GB coefficients for OPT-13B (TP 1, 2, 4) and
  OPT-66B (TP 2, 3, 4, 8), evaluated over the range they were fitted on:
  prefill of B prompts of L tokens, L in 64..2048 and B in 1..64 with
  ``L x B <= 16384``; decode of B in 1..128 sequences at context 128..2048.

Each source is compared with the Roofline under the software preset of the
engine it was measured on (``Source.engine``, a key of
:data:`twin.perf.presets.ENGINE_OVERHEADS`): ``splitwise-sim`` for splitwise-sim, ``distserve``
for DistServe; GPU efficiencies are the same for both.

Error = |predicted - measured| / measured, per point; each source reports the
median and the worst of the prompt (prefill) and the TPOT (decode) errors.
Target: median <= 15% and worst <= 35% on every source.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twin._io import read_text
from twin.bundled import find_data_dir as find_data_dir  # re-exported
from twin.errors import ProfileError, TwinError
from twin.perf.gpus import get_gpu
from twin.perf.iteration import Batch, PerfModel
from twin.perf.llm import get_model
from twin.perf.roofline import Roofline
from twin.perf.tables import DistServeFit

TARGET_MEDIAN = 0.15
TARGET_WORST = 0.35

SPLITWISE_CSV = Path("profiles/splitwise_sim/perf_model.csv")
DISTSERVE_JSON = Path("profiles/distserve/profiler-a100-80g.distserve.json")
VIDUR_COMPUTE = Path("profiles/vidur/compute")


@dataclass(frozen=True, slots=True)
class Point:
    """One measured iteration: the batch, its measured seconds, and its phase."""

    phase: str  # "prompt" or "tpot"
    batch: Batch
    measured_s: float


@dataclass(frozen=True, slots=True)
class Source:
    """A set of measured points for one (model, GPU, TP)."""

    name: str
    model: str
    gpu: str
    tp: int
    points: tuple[Point, ...]
    excluded: int = 0  # points dropped as physically inconsistent (see splitwise_sources)
    engine: str = "splitwise-sim"  # the serving engine measured (a key of ENGINE_OVERHEADS)
    part: str = "iteration"  # what was measured: "iteration" or "gemm" (see GemmPart)


@dataclass(frozen=True, slots=True)
class ValidationRow:
    """Errors of one source: relative errors as fractions (0.1 = 10%)."""

    source: str
    engine: str
    points: int
    excluded: int
    prompt_median: float
    prompt_worst: float
    tpot_median: float
    tpot_worst: float

    @property
    def passed(self) -> bool:
        return self.meets(TARGET_MEDIAN, TARGET_WORST)

    def meets(self, median: float, worst: float) -> bool:
        """Whether both phases' median errors are <= ``median`` and worst <= ``worst``."""
        return (
            max(self.prompt_median, self.tpot_median) <= median
            and max(self.prompt_worst, self.tpot_worst) <= worst
        )


# The (model, hardware) pairs of perf_model.csv used, in its names; every TP it has is used.
SPLITWISE_MODELS = ("llama2-70b", "bloom-176b")
SPLITWISE_HARDWARE = ("a100-80gb", "h100-80gb", "h100-80gb-pcap")


def splitwise_sources(path: Path) -> list[Source]:
    """Every :data:`SPLITWISE_MODELS` x :data:`SPLITWISE_HARDWARE` x TP of ``perf_model.csv``.

    A (prompt size, batch size) configuration is dropped, prompt and decode
    points alike, when its median prompt time is under half that of a
    configuration with fewer batch tokens at the same (GPU, TP): a prefill
    of more tokens cannot be more than twice faster, so such a run did not do
    the work (llama2-70b at TP 2 with 512 x 64 = 32,768 prompt tokens measures
    794 ms on A100 against 6,633 ms for 512 x 32).
    """
    prompt: dict[tuple[str, str, int], dict[tuple[int, int], list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    token: dict[tuple[str, str, int], dict[tuple[int, int, int], list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    order = {m: i for i, m in enumerate(SPLITWISE_MODELS)}
    reader = csv.DictReader(io.StringIO(read_text(path, "profile", ProfileError), newline=""))
    cols = ("model", "hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size",
            "prompt_time", "token_time")  # fmt: skip
    try:
        for r in reader:
            missing = [c for c in cols if r.get(c) is None]
            if missing:
                raise ProfileError(
                    f"{path}: line {reader.line_num}: missing {', '.join(missing)}; expected "
                    f"splitwise-sim's columns {', '.join(cols)}"
                )
            if r["model"] not in order or r["hardware"] not in SPLITWISE_HARDWARE:
                continue
            key = (r["model"], r["hardware"], int(r["tensor_parallel"]))
            p, b, t = int(r["prompt_size"]), int(r["batch_size"]), int(r["token_size"])
            prompt[key][(p, b)].append(float(r["prompt_time"]) / 1e3)
            token[key][(p, b, t)].append(float(r["token_time"]) / 1e3)
    except (ValueError, csv.Error) as e:
        raise ProfileError(f"{path}: line {reader.line_num}: {e}") from None
    out = []
    for (model, hw, tp), pts in sorted(prompt.items(), key=lambda kv: (order[kv[0][0]], kv[0])):
        med = {k: statistics.median(v) for k, v in pts.items()}
        bad = {
            k
            for k, v in med.items()
            if any(k2[0] * k2[1] < k[0] * k[1] and v < 0.5 * v2 for k2, v2 in med.items())
        }
        points = [
            Point("prompt", Batch(prefill=((p, 0),) * b), s)
            for (p, b), s in sorted(med.items())
            if (p, b) not in bad
        ]
        excluded = len(bad)
        for (p, b, t), v in sorted(token[(model, hw, tp)].items()):
            if (p, b) in bad:
                excluded += 1
                continue
            ctx = p + t // 2
            points.append(
                Point(
                    "tpot", Batch(decode_count=b, decode_context_sum=b * ctx), statistics.median(v)
                )
            )
        out.append(
            Source(
                f"splitwise {model} {hw} tp{tp}",
                model,
                hw,
                tp,
                tuple(points),
                excluded,
                engine="splitwise-sim",
            )
        )
    return out


def distserve_sources(path: Path) -> list[Source]:
    """DistServe's OPT-13B and OPT-66B fits evaluated over their measured range."""
    out = []
    for model, tps in (("facebook/opt-13b", (1, 2, 4)), ("facebook/opt-66b", (2, 3, 4, 8))):
        for tp in tps:
            fit = DistServeFit.from_json(path, model, tp)
            points = []
            for length in (64, 128, 256, 512, 1024, 2048):
                for b in (1, 2, 4, 8, 16, 32, 64):
                    if length * b <= 16384:
                        batch = Batch(prefill=((length, 0),) * b)
                        points.append(Point("prompt", batch, fit.iteration_time(batch)))
            for b in (1, 2, 4, 8, 16, 32, 64, 128):
                for ctx in (128, 256, 512, 1024, 2048):
                    batch = Batch(decode_count=b, decode_context_sum=b * ctx)
                    points.append(Point("tpot", batch, fit.iteration_time(batch)))
            short = model.split("/")[1]
            out.append(Source(f"distserve {short} a100-80gb tp{tp}", short, "a100-80gb", tp,
                              tuple(points), engine="distserve"))  # fmt: skip
    return out


# Vidur's device folders and the catalog GPU each was profiled on (Vidur, MLSys'24, section 6:
# DGX A100 80GB and DGX H100 80GB SXM nodes).
VIDUR_DEVICES = {"a100": "a100-80gb", "h100": "h100-sxm"}
# The operators of Vidur's mlp.csv that are the layer's weight GEMMs (QKV, attention output,
# MLP gate+up and down projections); the element-wise ones (norms, residual add, rotary,
# activation) and the embedding are left out: the Roofline prices no kernel of theirs alone.
VIDUR_GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
# Vidur's points of up to this many tokens are scored as decode steps too (a decode batch of
# that many sequences runs the same GEMMs): the batch sizes serving forms.
VIDUR_DECODE_TOKENS = 512


def vidur_sources(root: Path) -> list[Source]:
    """Vidur's per-layer GEMM times (``mlp.csv``: the median of each operator, ms, per
    ``num_tokens`` and TP), one source per (device, model, TP), as whole-model GEMM time:
    layers x the sum of :data:`VIDUR_GEMMS`, rows repeated for the same (TP, tokens) reduced to
    their median. Every point is a prompt point (``num_tokens``
    tokens of one prompt); those of at most :data:`VIDUR_DECODE_TOKENS` tokens are decode
    points too (that many sequences). Scored with :class:`GemmPart` (``part="gemm"``); the
    source's ``engine`` is the default preset, which serves the workload of ``--workload``."""
    from twin.perf.presets import DEFAULT_ENGINE

    out = []
    for device in sorted(p.name for p in root.iterdir() if p.is_dir()):
        gpu = VIDUR_DEVICES.get(device)
        if gpu is None:
            continue
        for path in sorted((root / device).glob("*/*/mlp.csv")):
            hf = f"{path.parent.parent.name}/{path.parent.name}"
            model = get_model(hf, f"{path}")
            text = read_text(path, "profile", ProfileError)
            per_tp: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
            reader = csv.DictReader(io.StringIO(text, newline=""))
            try:
                for r in reader:
                    if int(r["n_embd"]) != model.hidden or int(r["n_expanded_embd"]) != (
                        model.intermediate
                    ):
                        raise ProfileError(
                            f"{path}: line {reader.line_num}: n_embd {r['n_embd']}, "
                            f"n_expanded_embd {r['n_expanded_embd']}; {model.name} has "
                            f"{model.hidden}, {model.intermediate}"
                        )
                    ms = sum(float(r[f"time_stats.{op}.median"]) for op in VIDUR_GEMMS)
                    tp, tokens = int(r["num_tensor_parallel_workers"]), int(r["num_tokens"])
                    per_tp[tp][tokens].append(ms * 1e-3 * model.layers)
            except (KeyError, ValueError, TypeError, csv.Error) as e:
                raise ProfileError(
                    f"{path}: line {reader.line_num}: not Vidur's mlp.csv ({e!r})"
                ) from None
            for tp, runs in sorted(per_tp.items()):
                pts = {n: statistics.median(v) for n, v in runs.items()}
                points = [
                    Point("prompt", Batch(prefill=((n, 0),)), s) for n, s in sorted(pts.items())
                ]
                points += [
                    Point("tpot", Batch(decode_count=n, decode_context_sum=n), s)
                    for n, s in sorted(pts.items())
                    if n <= VIDUR_DECODE_TOKENS
                ]
                out.append(Source(f"vidur {model.name} {gpu} tp{tp} gemm", model.name, gpu, tp,
                                  tuple(points), engine=DEFAULT_ENGINE, part="gemm"))  # fmt: skip
    return out


def load_sources(data_dir: Path) -> list[Source]:
    """Every validation source found under ``data_dir``; a TwinError if none is."""
    out: list[Source] = []
    if (data_dir / SPLITWISE_CSV).is_file():
        out += splitwise_sources(data_dir / SPLITWISE_CSV)
    if (data_dir / DISTSERVE_JSON).is_file():
        out += distserve_sources(data_dir / DISTSERVE_JSON)
    if (data_dir / VIDUR_COMPUTE).is_dir():
        out += vidur_sources(data_dir / VIDUR_COMPUTE)
    if not out:
        raise TwinError(
            f"{data_dir}: none of {SPLITWISE_CSV}, {DISTSERVE_JSON}, {VIDUR_COMPUTE} found"
        )
    return out


# The decode batch series of a splitwise-sim source: its token times after 512-token prompts
# with 128 generated (context 512 + 128 // 2 = 576), at every batch size measured (1 to 64).
DECODE_SERIES_CONTEXT = 512 + 128 // 2


def decode_series(source: Source) -> list[bool]:
    """Per point of ``source``: whether it is of the decode batch series (a splitwise-sim
    TPOT point at :data:`DECODE_SERIES_CONTEXT`), all False for other sources."""
    return [
        source.engine == "splitwise-sim"
        and p.phase == "tpot"
        and p.batch.decode_context_sum == p.batch.decode_count * DECODE_SERIES_CONTEXT
        for p in source.points
    ]


def iteration_sources(data_dir: Path) -> list[Source]:
    """The sources of :func:`load_sources` that measured whole iterations (what
    :mod:`twin.perf.calibrate` fits), not one part of them."""
    return [s for s in load_sources(data_dir) if s.part == "iteration"]


class GemmPart:
    """A Roofline's price of the weight GEMMs alone (:meth:`~twin.perf.roofline.Roofline.gemm_time`)
    of a batch's new tokens, for a source that measured only those kernels (``part="gemm"``)."""

    def __init__(self, roofline: Roofline) -> None:
        self.roofline = roofline

    def iteration_time(self, batch: Batch) -> float:
        return self.roofline.gemm_time(batch.decode_count + batch.prefill_tokens)


def _errors(model: PerfModel, points: Sequence[Point], phase: str) -> list[float]:
    return [
        abs(model.iteration_time(p.batch) - p.measured_s) / p.measured_s
        for p in points
        if p.phase == phase
    ]


def score(source: Source, model: PerfModel) -> ValidationRow:
    """Median and worst relative errors of ``model`` on ``source``."""
    pe = _errors(model, source.points, "prompt")
    te = _errors(model, source.points, "tpot")
    return ValidationRow(
        source.name,
        source.engine,
        len(source.points),
        source.excluded,
        statistics.median(pe) if pe else 0.0,
        max(pe, default=0.0),
        statistics.median(te) if te else 0.0,
        max(te, default=0.0),
    )


def default_roofline(source: Source, **params: Any) -> Any:
    """The Roofline a source is compared with: the defaults with the preset of the
    engine the source was measured on, unless ``params`` override; for a source that
    measured the GEMMs alone, its :class:`GemmPart`."""
    params.setdefault("engine", source.engine)
    r = Roofline(get_model(source.model), get_gpu(source.gpu), source.tp, **params)
    return GemmPart(r) if source.part == "gemm" else r


def validate_perf(
    data_dir: Path, make: Callable[[Source], PerfModel] = default_roofline
) -> list[ValidationRow]:
    """Score the Roofline with default efficiencies (or ``make(source)``) on every source."""
    return [score(s, make(s)) for s in load_sources(data_dir)]


def format_validation(
    rows: Sequence[ValidationRow],
    median: float = TARGET_MEDIAN,
    worst: float = TARGET_WORST,
    notes: Mapping[str, str] | None = None,
) -> str:
    """A fixed-width table of ``rows`` with a PASS/FAIL per row (median errors <= ``median``,
    worst <= ``worst``) and overall, then one line per ``notes`` entry (source: why)."""
    head = (
        f"{'source':<40} {'engine':<13} {'points':>6} {'excl':>4}  {'prompt med':>10} {'worst':>7}"
        f"  {'TPOT med':>8} {'worst':>7}  result"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.source:<40} {r.engine:<13} {r.points:>6} {r.excluded:>4}  {r.prompt_median:>10.1%}"
            f" {r.prompt_worst:>7.1%}  {r.tpot_median:>8.1%} {r.tpot_worst:>7.1%}"
            f"  {'PASS' if r.meets(median, worst) else 'FAIL'}"
        )
    n_ok = sum(r.meets(median, worst) for r in rows)
    lines.append(
        f"target: median <= {median:.0%}, worst <= {worst:.0%} per source: "
        f"{'PASS' if n_ok == len(rows) else 'FAIL'} ({n_ok}/{len(rows)} sources)"
    )
    lines += [f"  {k}: {v}" for k, v in (notes or {}).items()]
    return "\n".join(lines)
