"""Request length distributions: fixed, lognormal, empirical, bundled tables.

A length sampler draws ``(prompt_tokens, output_tokens)`` arrays of integers
>= 1 from a ``numpy.random.Generator`` passed in; none holds random state.

Bundled tables (``azure-conv``, ``azure-code``) are synthetic defaults that
need no data files: compact quantile tables of the Azure LLM inference trace
2023 (Splitwise, ISCA'24; CC-BY-4.0; see ``shared/data/traces/azure_llm_2023``)
stored in ``twin/data/lengths_azure_*.csv``. Each file holds, for 110
probabilities ``q`` (denser in both tails), the ``q``-quantile of
``ContextTokens`` (prompt) and ``GeneratedTokens`` (output), computed with
``numpy.quantile(..., method="linear")``, plus the Gaussian-copula correlation
of the two (the Pearson correlation of their normal scores). Sampling draws a
correlated normal pair, maps it to uniforms and interpolates the inverse CDF
linearly between the stored quantiles, then rounds. So marginals match the
trace to within interpolation between table points, and the prompt/output
dependence is kept to first order. To reproduce a table from the trace::

    python -m twin.workload.lengths \\
        shared/data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv \\
        azure-conv twin/data/lengths_azure_conv.csv

which calls :func:`fit_lengths` and :meth:`LengthTable.write_csv`; a test
checks the bundled tables against the trace whenever the data is present.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from twin._check import check_keys, is_int, is_number
from twin._io import read_text
from twin.errors import SpecError, TraceError, UnknownNameError
from twin.workload.arrivals import _positive
from twin.workload.traces import file_sha256, iter_trace, read_trace

if TYPE_CHECKING:
    import numpy as np

_HARD_MAX_TOKENS = 1 << 40  # keeps a heavy lognormal tail finite before the int cast


class LengthSampler(Protocol):
    """Draws ``n`` (prompt, output) length pairs, both int64 arrays of values >= 1."""

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]: ...


# --------------------------------------------------------------------------- marginals


@dataclass(frozen=True, slots=True)
class FixedLength:
    """Every request has ``value`` tokens."""

    value: int

    def __post_init__(self) -> None:
        if not is_int(self.value) or self.value < 1:
            raise SpecError(f"value(={self.value!r}) must be an integer >= 1")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        import numpy as np

        return np.full(n, self.value, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class LogNormalLength:
    """``round(exp(mu + sigma * Z))`` clipped to ``[min_tokens, max_tokens]``.

    NOTE: clipping (not truncation) puts the clipped mass on the bounds, so the
    mean moves slightly toward the inside of ``[min, max]`` compared with the
    unclipped law; pick bounds from the data (e.g. its min and max).
    """

    mu: float
    sigma: float
    min_tokens: int = 1
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.mu):
            raise SpecError(f"mu(={self.mu!r}) must be finite")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise SpecError(f"sigma(={self.sigma!r}) must be >= 0")
        if self.min_tokens < 1:
            raise SpecError(f"min(={self.min_tokens!r}) must be >= 1")
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise SpecError(f"max(={self.max_tokens!r}) must be >= min(={self.min_tokens!r})")

    @staticmethod
    def sigma_from_cv(cv: float) -> float:
        """The sigma whose lognormal has coefficient of variation ``cv``."""
        if not (math.isfinite(cv) and cv >= 0):
            raise SpecError(f"cv(={cv!r}) must be >= 0")
        return math.sqrt(math.log1p(cv * cv))

    @classmethod
    def from_median(
        cls, median: float, sigma: float, min_tokens: int = 1, max_tokens: int | None = None
    ) -> LogNormalLength:
        if not (math.isfinite(median) and median > 0):
            raise SpecError(f"median(={median!r}) must be > 0")
        return cls(math.log(median), sigma, min_tokens, max_tokens)

    @classmethod
    def from_mean(
        cls, mean: float, sigma: float, min_tokens: int = 1, max_tokens: int | None = None
    ) -> LogNormalLength:
        """Mean of the unclipped law is ``mean``: ``mu = ln(mean) - sigma^2 / 2``."""
        if not (math.isfinite(mean) and mean > 0):
            raise SpecError(f"mean(={mean!r}) must be > 0")
        return cls(math.log(mean) - sigma * sigma / 2, sigma, min_tokens, max_tokens)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        import numpy as np

        x = np.exp(self.mu + self.sigma * rng.standard_normal(n))
        hi = _HARD_MAX_TOKENS if self.max_tokens is None else self.max_tokens
        return np.clip(np.rint(np.minimum(x, hi)), self.min_tokens, hi).astype(np.int64)


Marginal = FixedLength | LogNormalLength


@dataclass(frozen=True, slots=True)
class IndependentLengths:
    """Prompt and output drawn independently from their own marginals."""

    prompt: Marginal
    output: Marginal

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.prompt.draw(rng, n), self.output.draw(rng, n)


@dataclass(frozen=True, slots=True, eq=False)
class EmpiricalLengths:
    """Rows drawn uniformly with replacement from measured (prompt, output) pairs."""

    prompts: np.ndarray
    outputs: np.ndarray

    @classmethod
    def from_file(
        cls, path: str | Path, format: str = "auto", max_total_tokens: int | None = None
    ) -> EmpiricalLengths:
        """Pairs from any trace :func:`~twin.workload.traces.read_trace` reads (times ignored).

        With ``max_total_tokens``, rows whose prompt + output exceeds it are left
        out of the sample, as a benchmark prunes its dataset to a model's context
        (DistServe's ShareGPT preparation drops pairs of 2,048 tokens or more for
        OPT); raises :class:`~twin.errors.SpecError` when no row is left.
        """
        import numpy as np

        prompts, outputs = array("q"), array("q")
        cap = max_total_tokens
        for r in iter_trace(path, format):
            if cap is not None and r.prompt_tokens + r.output_tokens > cap:
                continue
            prompts.append(r.prompt_tokens)
            outputs.append(r.output_tokens)
        if not prompts and max_total_tokens is not None:
            raise SpecError(
                f"{path}: no row has prompt + output <= max_total_tokens ({max_total_tokens})"
            )
        return cls(np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64))

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(0, len(self.prompts), size=n)
        return self.prompts[idx], self.outputs[idx]


# --------------------------------------------------------------------------- quantile tables


def quantile_grid() -> np.ndarray:
    """The 110 probabilities of a length table: 0, .001, .005, .01 ... .99, .995 ... .9999, 1.

    Dense in the upper tail, where linear interpolation between far-apart
    quantiles would otherwise inflate the mean of heavy-tailed outputs.
    """
    import numpy as np

    mid = np.round(np.arange(1, 100) / 100, 2)
    tail = [0.995, 0.996, 0.997, 0.998, 0.999, 0.9995, 0.9999, 1.0]
    return np.concatenate([[0.0, 0.001, 0.005], mid, tail])


@dataclass(frozen=True, eq=False)
class LengthTable:
    """Marginal quantiles of prompt and output lengths plus a Gaussian-copula correlation.

    ``meta`` records where the table came from (source file, its sha256, rows).
    """

    q: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    rho: float
    meta: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import numpy as np

        if not (len(self.q) == len(self.prompt) == len(self.output) >= 2):
            raise SpecError("a length table needs >= 2 rows of q, prompt, output")
        if self.q[0] != 0.0 or self.q[-1] != 1.0 or np.any(np.diff(self.q) <= 0):
            raise SpecError("length table q must increase strictly from 0 to 1")
        for name, col in (("prompt", self.prompt), ("output", self.output)):
            if np.any(np.diff(col) < 0) or col[0] < 1:
                raise SpecError(f"length table {name} quantiles must be >= 1 and non-decreasing")
        if not -1.0 <= self.rho <= 1.0:
            raise SpecError(f"length table rho(={self.rho!r}) must be in [-1, 1]")

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        import numpy as np

        z = rng.standard_normal((2, n))
        zo = self.rho * z[0] + math.sqrt(1.0 - self.rho * self.rho) * z[1]
        p = _tokens_at(z[0], self.q, self.prompt)
        o = _tokens_at(zo, self.q, self.output)
        return np.maximum(p, 1).astype(np.int64), np.maximum(o, 1).astype(np.int64)

    def write_csv(self, path: str | Path) -> None:
        lines = [f"# {k}: {v}" for k, v in self.meta.items()]
        lines.append(f"# gaussian_copula_rho: {self.rho:.6f}")
        lines.append("q,prompt_tokens,output_tokens")
        lines += [
            f"{q:.4f},{p:.6f},{o:.6f}"
            for q, p, o in zip(self.q, self.prompt, self.output, strict=True)
        ]
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")

    @classmethod
    def read_csv(cls, path: str | Path) -> LengthTable:
        import numpy as np

        path = Path(path)
        meta: dict[str, str] = {}
        rows: list[tuple[float, float, float]] = []
        for n, text in enumerate(read_text(path, "length table", TraceError).splitlines(), 1):
            if text.startswith("#"):
                key, _, value = text[1:].partition(":")
                meta[key.strip()] = value.strip()
            elif text.strip() and not text.startswith("q,"):
                try:
                    q, p, o = (float(x) for x in text.split(","))
                except ValueError:
                    raise TraceError(
                        f"{path}: line {n}: {text!r}; expected q,prompt_tokens,output_tokens"
                    ) from None
                rows.append((q, p, o))
        if "gaussian_copula_rho" not in meta:
            raise TraceError(f"{path}: missing '# gaussian_copula_rho: <value>' line")
        rho = float(meta.pop("gaussian_copula_rho"))
        a = np.array(rows, dtype=float).reshape(-1, 3)
        return cls(a[:, 0], a[:, 1], a[:, 2], rho, meta)


def fit_lengths(path: str | Path, format: str = "auto", name: str = "") -> LengthTable:
    """Fit a :class:`LengthTable` to a trace: quantiles on :func:`quantile_grid`, copula rho.

    rho is the Pearson correlation of the normal scores ``ndtri((rank - 0.5) / n)``
    of prompt and output (average ranks for ties).
    """
    import numpy as np
    from scipy.special import ndtri
    from scipy.stats import rankdata

    path = Path(path)
    records = read_trace(path, format)
    p = np.array([r.prompt_tokens for r in records], dtype=float)
    o = np.array([r.output_tokens for r in records], dtype=float)
    q = quantile_grid()
    n = len(p)
    if n >= 2:
        sp = ndtri((rankdata(p) - 0.5) / n)
        so = ndtri((rankdata(o) - 0.5) / n)
        rho = float(np.corrcoef(sp, so)[0, 1]) if sp.std() > 0 and so.std() > 0 else 0.0
    else:
        rho = 0.0
    meta = {
        "table": name or path.stem,
        "source": path.name,
        "source_sha256": file_sha256(path),
        "rows": str(n),
        "method": "numpy.quantile(method='linear') per column; Gaussian copula of normal scores",
    }
    return LengthTable(
        q, np.quantile(p, q, method="linear"), np.quantile(o, q, method="linear"), rho, meta
    )


BUNDLED_TABLES = {
    "azure-conv": "lengths_azure_conv.csv",
    "azure-code": "lengths_azure_code.csv",
}
"""Bundled length tables by name -> file in ``twin/data``."""


def bundled_table_path(name: str) -> Path:
    """The package file of a bundled length table."""
    if name not in BUNDLED_TABLES:
        raise UnknownNameError("length table", name, BUNDLED_TABLES)
    return Path(str(resources.files("twin.data").joinpath(BUNDLED_TABLES[name])))


def bundled_table(name: str) -> LengthTable:
    """A bundled length table (``azure-conv``, ``azure-code``) by name."""
    return LengthTable.read_csv(bundled_table_path(name))


def main(argv: list[str] | None = None) -> int:
    """``python -m twin.workload.lengths TRACE NAME OUT.csv``: fit a table and write it."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m twin.workload.lengths TRACE NAME OUT.csv", file=sys.stderr)
        return 2
    fit_lengths(args[0], name=args[1]).write_csv(args[2])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# The standard normal CDF through math.erfc agrees with scipy.special.ndtr to
# within a few units in the last place (both are accurate to ~1e-16 relative:
# Cephes' ndtr documentation, the C library's erfc), far inside this margin.
_CDF_MARGIN = 1e-12


def _tokens_at(z: np.ndarray, q: np.ndarray, col: np.ndarray) -> np.ndarray:
    """``rint(interp(ndtr(z), q, col))``, exactly, without importing scipy.

    The CDF is taken with :func:`math.erfc`; the interpolation is monotone, so
    where both ends of ``cdf * (1 -+ margin)`` round to the same integer, ndtr's
    value, which lies between them, rounds to it too. The rare draw whose band
    holds a rounding boundary takes scipy's ndtr itself."""
    import numpy as np

    erfc, k = math.erfc, -1.0 / math.sqrt(2.0)
    cdf = np.array([0.5 * erfc(k * v) for v in z.tolist()])
    lo = np.rint(np.interp(cdf * (1.0 - _CDF_MARGIN), q, col))
    hi = np.rint(np.interp(np.minimum(cdf * (1.0 + _CDF_MARGIN), 1.0), q, col))
    unsure = lo != hi
    if unsure.any():
        from scipy.special import ndtr  # here, not at the top: scipy is slow to import

        lo[unsure] = np.rint(np.interp(ndtr(z[unsure]), q, col))
    return lo


# --------------------------------------------------------------------------- the spec's laws


def int_tokens(m: Mapping[str, object], key: str, where: str, default: int | None) -> int | None:
    """``m[key]`` (``default`` when absent), an integer token count >= 1, or None."""
    v = m.get(key, default)
    if v is None:
        return None
    if not is_int(v) or v < 1:
        raise SpecError(f"{where}.{key}: {v!r} is not an integer token count >= 1")
    return v


def _value(m: Mapping[str, object], where: str) -> object:
    if "value" not in m:
        raise SpecError(f"{where}: missing key 'value'")
    return m["value"]


def parse_marginal(value: object, where: str) -> Marginal:
    """A length law of the spec (``{dist: fixed, value: N}`` or lognormal) at ``where``."""
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: {value!r} is not a mapping; expected {{dist: fixed, value: N}}")
    dist = value.get("dist")
    if dist == "fixed":
        check_keys(value, where, (), ("dist", "value"))
        return FixedLength(_value(value, where))  # type: ignore[arg-type]
    if dist != "lognormal":
        raise SpecError(f"{where}.dist: {dist!r} unknown; expected one of fixed, lognormal")
    check_keys(value, where, (), ("dist", "median", "mean", "sigma", "cv", "min", "max"))
    if ("median" in value) == ("mean" in value):
        raise SpecError("give exactly one of median and mean")
    if ("sigma" in value) == ("cv" in value):
        raise SpecError("give exactly one of sigma and cv")
    if "sigma" in value:
        sigma = value["sigma"]
        if not is_number(sigma):
            raise SpecError(f"sigma(={sigma!r}) must be a number >= 0")
    else:
        sigma = LogNormalLength.sigma_from_cv(_positive("cv", value["cv"]))
    lo = int_tokens(value, "min", where, 1) or 1
    hi = int_tokens(value, "max", where, None)
    if "median" in value:
        return LogNormalLength.from_median(_positive("median", value["median"]), sigma, lo, hi)
    return LogNormalLength.from_mean(_positive("mean", value["mean"]), sigma, lo, hi)
