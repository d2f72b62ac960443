"""Fit the Roofline's terms of one GPU to a user's profile tables (``twin calibrate --profile``).

A native table (``twin profile`` writes one, with a JSON sidecar naming the model, the GPU and
the TP) becomes a :class:`~twin.perf.validate.Source`: prefill rows as prompt points, decode
rows as TPOT points. The fitted terms (:data:`DEFAULT_FIT`: the GPU's ``mfu``, ``mbu`` and
``attn_mfu`` and the software's ``overhead_s`` and ``seq_overhead_s``; ``fit=`` names others of
:data:`FITTABLE`) are shared by every table given, which must all be of one GPU; every other
term stays at the Roofline's default for that GPU and the ``engine`` preset. The fit is
bounded least squares on log(predicted / measured) with every table weighted equally, in log
space within :data:`twin.perf.calibrate._BOUNDS`, from the defaults and from calibrate's
starting point (the better wins), with calibrate's vectorised Roofline
(:class:`twin.perf.calibrate._Source`); the errors printed are recomputed with the real
:class:`~twin.perf.roofline.Roofline`.

Out of sample: with several tables (say, two models profiled on one GPU), each is scored with
the terms fitted on the others (leave-one-table-out: profile one model, predict another);
with one table, each point with the terms fitted on the other points (leave-one-point-out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from twin.errors import TwinError
from twin.perf.calibrate import _BOUNDS, _EFF, _LINK, _Source
from twin.perf.gpus import GPUSpec, get_gpu
from twin.perf.iteration import Batch
from twin.perf.llm import ModelSpec, get_model
from twin.perf.presets import (
    DEFAULT_ATTN_MFU,
    DEFAULT_HOP_LATENCY_S,
    DEFAULT_MBU,
    DEFAULT_MFU,
    ENGINE_OVERHEADS,
    ENGINE_TERMS,
    GPU_EFFICIENCY,
)
from twin.perf.roofline import Roofline
from twin.perf.tables import read_native
from twin.perf.validate import Point, Source, ValidationRow, format_validation, score

FITTABLE = (*_EFF, *_LINK, *ENGINE_TERMS)
DEFAULT_FIT = ("mfu", "mbu", "attn_mfu", "overhead_s", "seq_overhead_s")
_FAMILY = "profiled"  # the key of the fitted GPU's terms in calibrate's parameter names


@dataclass(frozen=True)
class Table:
    """One profile table as a fitting source, with the model and GPU it was measured for."""

    source: Source
    model: ModelSpec
    gpu: GPUSpec


def load_table(
    path: Path,
    model: str | None = None,
    gpu: str | None = None,
    tp: int | None = None,
    engine: str = "distserve",
) -> Table:
    """A native table and what it measured: ``model``, ``gpu`` and ``tp`` as given, else from
    its sidecar (``TABLE.json``, see :mod:`twin.perf.profile`)."""
    from twin.perf.profile import read_sidecar

    path = Path(path)
    prefill, decode, _ = read_native(path)
    side = read_sidecar(path) or {}
    where = f"{path}"
    if model is not None:
        spec = get_model(model, f"{where}: --model")
    elif isinstance(side.get("model"), dict | str):
        named = side["model"]
        if isinstance(named, dict) and named.get("weight_dtype_bytes") == 0:
            # an earlier sidecar wrote the unset field (0: as dtype_bytes) too
            named = {k: v for k, v in named.items() if k != "weight_dtype_bytes"}
        spec = get_model(named, f"{where} sidecar: model")
    else:
        raise TwinError(f"{where}: no sidecar names the model; give --model")
    g = gpu if gpu is not None else side.get("gpu")
    if not isinstance(g, str) or g == "cpu":
        raise TwinError(f"{where}: the GPU measured is {g!r}; give --gpu (a catalog GPU)")
    gspec = get_gpu(g, f"{where}: gpu")
    t = tp if tp is not None else side.get("tp", 1)
    if not isinstance(t, int) or t < 1:
        raise TwinError(f"{where}: tp={t!r} must be a positive integer")
    if engine not in ENGINE_OVERHEADS:
        raise TwinError(f"--engine {engine!r}; expected one of {', '.join(ENGINE_OVERHEADS)}")
    points = [Point("prompt", Batch(prefill=((p, 0),) * b), s)
              for (b, p), s in sorted(prefill.items())]  # fmt: skip
    points += [
        Point("tpot", Batch(decode_count=b, decode_context_sum=b * c), s)
        for (b, c), s in sorted(decode.items())
    ]
    name = f"{path.name} {spec.name} {gspec.name} tp{t}"
    return Table(Source(name, spec.name, gspec.name, t, tuple(points), engine=engine), spec, gspec)


def held_terms(gpu: GPUSpec, engine: str) -> dict[str, float]:
    """Every Roofline term's default for ``gpu`` and preset ``engine`` (calibrate's names)."""
    eff = GPU_EFFICIENCY.get(
        gpu.name,
        (DEFAULT_MFU, DEFAULT_MBU, DEFAULT_ATTN_MFU, 0.0, 0.0, 1.0, DEFAULT_HOP_LATENCY_S),
    )
    p = {f"{k}@{_FAMILY}": float(v) for k, v in zip((*_EFF, *_LINK), eff, strict=True)}
    p.update({f"{k}@{engine}": float(v) for k, v in ENGINE_OVERHEADS[engine].items()})
    return p


def _check_fit(fit: Sequence[str]) -> tuple[str, ...]:
    bad = [k for k in fit if k not in FITTABLE]
    if bad or not fit:
        raise TwinError(f"--fit {','.join(fit)!r}: expected names of {', '.join(FITTABLE)}")
    return tuple(dict.fromkeys(fit))


def _key(k: str, engine: str) -> str:
    return f"{k}@{engine}" if k in ENGINE_TERMS else f"{k}@{_FAMILY}"


class _Fitter:
    """Least squares of the ``fit`` terms over the points of some tables."""

    def __init__(self, tables: Sequence[Table], fit: Sequence[str]) -> None:
        gpus = {t.gpu.name for t in tables}
        engines = {t.source.engine for t in tables}
        if len(gpus) != 1 or len(engines) != 1:
            raise TwinError(
                f"twin calibrate --profile: one GPU and engine per fit; got {sorted(gpus)}"
            )
        self.engine = engines.pop()
        self.fit = _check_fit(fit)
        self.held = held_terms(tables[0].gpu, self.engine)
        self.srcs = [_Source(t.source, _FAMILY, t.model, t.gpu) for t in tables]
        self.keys = [_key(k, self.engine) for k in self.fit]
        self.lo = np.log([_BOUNDS[k][0] for k in self.fit])
        self.hi = np.log([_BOUNDS[k][1] for k in self.fit])
        start = [self.held[k] for k in self.keys]
        self.starts = [
            np.clip(np.log(np.maximum(start, 1e-300)), self.lo + 1e-9, self.hi - 1e-9),
            np.log([_BOUNDS[k][2] for k in self.fit]),
        ]

    def params(self, x: np.ndarray) -> dict[str, float]:
        p = dict(self.held)
        p.update(zip(self.keys, np.exp(x).tolist(), strict=True))
        return p

    def run(self, masks: Sequence[np.ndarray] | None = None, x0: np.ndarray | None = None
            ) -> np.ndarray:  # fmt: skip
        """The fitted log-parameters, on each source's points where ``masks`` is true."""
        ms = masks or [np.ones(s.meas.size, bool) for s in self.srcs]

        def res(x: np.ndarray) -> np.ndarray:
            p = self.params(x)
            out = []
            for s, m in zip(self.srcs, ms, strict=True):
                if m.any():
                    r = np.log(s.predict(p)[m] / s.meas[m])
                    out.append(r / math.sqrt(r.size))
            return np.concatenate(out)

        best, best_f = None, math.inf
        for x in [x0] if x0 is not None else self.starts:
            r = least_squares(res, x, bounds=(self.lo, self.hi), xtol=1e-12, ftol=1e-12,
                              gtol=1e-12)  # fmt: skip
            if r.cost < best_f:
                best, best_f = r.x, float(r.cost)
        assert best is not None
        return np.asarray(best)


def roofline(p: dict[str, float], t: Table, fit: Sequence[str]) -> Roofline:
    """The real Roofline of table ``t`` at the fitted terms ``p`` (the others at defaults)."""
    kw: dict[str, Any] = {k: p[_key(k, t.source.engine)] for k in fit}
    return Roofline(t.model, t.gpu, t.source.tp, engine=t.source.engine, **kw)


@dataclass(frozen=True)
class FitReport:
    fitted: dict[str, float]  # term -> value
    in_sample: list[ValidationRow]
    held_out: list[ValidationRow]
    held_out_kind: str  # "table" or "point"


def fit_tables(tables: Sequence[Table], fit: Sequence[str] = DEFAULT_FIT) -> FitReport:
    """Fit ``fit`` to ``tables``; in-sample and leave-one-out errors (see the module)."""
    if not tables:
        raise TwinError("twin calibrate --profile: no table")
    terms, points = _check_fit(fit), sum(len(t.source.points) for t in tables)
    if points <= len(terms):  # a fit leaving a point out still has one per term
        raise TwinError(
            f"twin calibrate --profile: {'; '.join(t.source.name for t in tables)}: {points} "
            f"point(s) for {len(terms)} terms ({', '.join(terms)}); the fit and its leave-one-out "
            f"check need at least {len(terms) + 1}: measure more (twin profile) or fit fewer "
            "(--fit)"
        )
    f = _Fitter(tables, fit)
    x = f.run()
    p = f.params(x)
    inside = [score(t.source, roofline(p, t, f.fit)) for t in tables]
    held: list[ValidationRow] = []
    if len(tables) > 1:
        kind = "table"
        for i, t in enumerate(tables):
            others = [u for j, u in enumerate(tables) if j != i]
            fo = _Fitter(others, fit)
            held.append(score(t.source, roofline(fo.params(fo.run(x0=x)), t, f.fit)))
    else:
        kind = "point"
        t, s = tables[0], f.srcs[0]
        pred = np.empty(s.meas.size)
        for i in range(s.meas.size):
            mask = np.ones(s.meas.size, bool)
            mask[i] = False
            pred[i] = s.predict(f.params(f.run([mask], x0=x)))[i]
        held.append(_row(t.source, pred, s.meas, s.prompt))
    fitted = {k: p[_key(k, f.engine)] for k in f.fit}
    return FitReport(fitted, inside, held, kind)


def _row(source: Source, pred: np.ndarray, meas: np.ndarray, prompt: np.ndarray) -> ValidationRow:
    err = np.abs(pred - meas) / meas
    pe, te = err[prompt], err[~prompt]

    def med(e: np.ndarray) -> float:
        return float(np.median(e)) if e.size else 0.0

    def top(e: np.ndarray) -> float:
        return float(e.max()) if e.size else 0.0

    return ValidationRow(source.name, source.engine, int(meas.size), 0,
                         med(pe), top(pe), med(te), top(te))  # fmt: skip


def format_report(r: FitReport, engine: str) -> str:
    """The fitted terms, the errors, and a ``perf:`` block with them."""
    lines = ["fitted (the other terms at the GPU's defaults and the engine preset):"]
    for k, v in r.fitted.items():
        lo, hi, _ = _BOUNDS[k]
        at = " (at its lower bound)" if v <= lo * 1.001 else (
            " (at its upper bound)" if v >= hi * 0.999 else "")  # fmt: skip
        lines.append(f"  {k:<16} {v:.4g}{at}")
    lines += ["", "in sample", format_validation(r.in_sample), ""]
    what = "each table fitted on the others" if r.held_out_kind == "table" else (
        "each point fitted on the other points")  # fmt: skip
    lines += [f"held out (leave-one-{r.held_out_kind}-out: {what})",
              format_validation(r.held_out), "", "perf: for a spec on this GPU:"]  # fmt: skip
    keys = {"overhead_s": "overhead", "layer_overhead_s": "layer_overhead",
            "seq_overhead_s": "seq_overhead", "seq_shard_overhead_s": "seq_shard_overhead",
            "hop_latency_s": "hop_latency", "throttle_knee_s": "throttle_knee"}  # fmt: skip
    body = ", ".join(
        f"{keys.get(k, k)}: " + (f"'{v * 1e6:.4g} us'" if k in keys else f"{v:.4g}")
        for k, v in r.fitted.items()
    )
    lines.append(f"  perf: {{kind: roofline, engine: {engine}, {body}}}")
    return "\n".join(lines)


def command(
    paths: Sequence[str],
    model: str | None = None,
    gpu: str | None = None,
    tp: int | None = None,
    engine: str = "distserve",
    fit: str | None = None,
    as_json: bool = False,
) -> int:
    """``twin calibrate --profile``: print the fit (or, with ``as_json``, its JSON)."""
    import json

    tables = [load_table(Path(p), model, gpu, tp, engine) for p in paths]
    terms = DEFAULT_FIT if fit is None else tuple(k.strip() for k in fit.split(",") if k.strip())
    r = fit_tables(tables, terms)
    if as_json:
        doc = {
            "fitted": r.fitted,
            "engine": engine,
            "in_sample": [_asdict(row) for row in r.in_sample],
            "held_out_kind": r.held_out_kind,
            "held_out": [_asdict(row) for row in r.held_out],
        }  # fmt: skip
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(format_report(r, engine))
    return 0


def _asdict(row: ValidationRow) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(row)
