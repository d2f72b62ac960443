"""How the configurations of a sweep look in its plots, so that a figure of 10
or 100 of them stays readable.

- :class:`PlotOptions`: what ``twin plot`` (and ``twin sweep``, ``twin
  goodput``, ``twin report``) let a person choose: ``facet`` (small multiples,
  one panel per value of a swept key), ``hue`` (color by the value of a swept
  key), ``size`` (inches), ``dpi``, ``labels`` (a key's name in labels) and
  ``at_rate`` (the rate the CDFs compare the configurations at);
- :class:`Styler`: from the configurations of a sweep (their values of the
  swept keys), the text that names each one (the keys that vary across the
  sweep only), its panel, its color, line style and marker, and the legend:
  one entry per configuration up to :data:`MAX_LEGEND`, else grouped (one entry
  per value of the hue key and of each styled key), a colorbar for a numeric
  hue of many values;
- :func:`layout_problems`: what a drawn figure gets wrong (overlapping tick
  labels, text outside the figure, a legend over the data, axes under half
  the figure), for the tests.

Only :mod:`twin.viz` imports this module; matplotlib is imported inside the
functions that draw.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from twin.errors import TwinError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Beyond this many entries a legend is grouped by key (or a colorbar): past a
# dozen, colors of one palette are no longer told apart at a glance.
MAX_LEGEND = 12
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h")
NO_VALUE = "none"  # a key a configuration leaves unset (the colocated baseline's prefill)
MAX_DPI = 1200
MAX_INCHES = 100.0


@dataclass(frozen=True)
class PlotOptions:
    """Choices for the sweep plots; the defaults draw what the folder holds."""

    facet: str | None = None
    hue: str | None = None
    size: tuple[float, float] | None = None
    dpi: int = 150
    labels: Mapping[str, str] = field(default_factory=dict)
    at_rate: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.dpi, int) and 10 <= self.dpi <= MAX_DPI):
            raise TwinError(f"--dpi: {self.dpi!r} must be an integer from 10 to {MAX_DPI}")
        if self.size is not None:
            w, h = self.size
            if not (0.5 <= w <= MAX_INCHES and 0.5 <= h <= MAX_INCHES):
                raise TwinError(
                    f"--size: {w:g},{h:g}: width and height must be 0.5 to {MAX_INCHES:g} inches"
                )
        if self.at_rate is not None and not (math.isfinite(self.at_rate) and self.at_rate > 0):
            raise TwinError(f"--at-rate: {self.at_rate!r} must be a positive number")


def parse_size(text: str) -> tuple[float, float]:
    """``--size W,H`` in inches."""
    try:
        w, h = (float(x) for x in text.split(","))
    except ValueError:
        raise TwinError(f"--size: {text!r}; expected W,H in inches, e.g. 10,6") from None
    if not (math.isfinite(w) and math.isfinite(h)):
        raise TwinError(f"--size: {text!r}; expected W,H in inches, e.g. 10,6")
    return (w, h)


def parse_labels(items: Sequence[str] | None) -> dict[str, str]:
    """``--label KEY=TEXT`` (repeatable): KEY reads TEXT in labels; an empty
    TEXT shows the value alone."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise TwinError(f"--label: {item!r}; expected KEY=TEXT, e.g. tag.trace=trace")
        out[key.strip()] = text.strip()
    return out


def short_key(key: str) -> str:
    """How a key reads in a label; the reading of the labels a sweep writes
    (:func:`twin.studies.sweep.short_key`): ``cluster.prefill.instances`` ->
    ``prefill``, ``scheduler.name`` -> ``scheduler``, ``tag.trace`` -> ``trace``."""
    if key == "cluster.instances":
        return "instances"
    parts = key.split(".")
    if len(parts) > 1 and parts[-1] in ("instances", "name"):
        parts = parts[:-1]
    if len(parts) > 1 and parts[0] in ("cluster", "workload", "tag"):
        parts = parts[1:]
    return ".".join(parts)


def _number(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _sorted_values(values: Sequence[str]) -> list[str]:
    """Distinct values in the order first seen, numerically when all are
    numbers (unset last)."""
    seen = list(dict.fromkeys(values))
    set_ = [v for v in seen if v != ""]
    if set_ and all(_number(v) is not None for v in set_):
        set_.sort(key=lambda v: _number(v) or 0.0)
    return set_ + ([""] if "" in seen else [])


def wrap(text: str, width_in: float, fontsize: float) -> str:
    """``text`` broken into lines that fit ``width_in`` inches at ``fontsize``
    points (an average glyph is taken as 0.6 em wide)."""
    chars = max(20, int(width_in * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.wrap(text, chars)) if len(text) > chars else text


class Styler:
    """Names, panels and styles of the configurations of one sweep plot.

    ``configs``: each configuration's values of the swept ``keys`` (CSV cells:
    ``""`` for unset), in the sweep's order; ``where`` names the file in
    errors. A key that does not vary is left out of every label and stated
    once (:attr:`constant`); a key that varies in step with a ``tag.`` key
    (the trace path beside ``tag.trace``) is left out too."""

    def __init__(
        self,
        configs: Sequence[Mapping[str, str]],
        keys: Sequence[str],
        opts: PlotOptions,
        where: str,
    ):
        self.opts = opts
        self.configs = list(configs)
        keys = list(keys)
        for flag, key in (("--facet", opts.facet), ("--hue", opts.hue)):
            if key is not None and key not in keys:
                raise TwinError(
                    f"{flag}: {key!r} is not a swept key of {where}; "
                    f"expected one of {', '.join(keys) or '(none swept)'}"
                )
        values = {k: _sorted_values([c.get(k, "") for c in configs]) for k in keys}
        varying = [k for k in keys if len(values[k]) > 1]
        tags = [k for k in varying if k.startswith("tag.")]
        redundant = {
            k
            for k in varying
            if not k.startswith("tag.")
            and any(self._one_to_one(k, t) for t in tags)
            and k not in (opts.facet, opts.hue)
        }
        self.values = values
        # a key zipped with a tag reads as the tag (trace=code, not the trace's path)
        self._alias: dict[str, tuple[str, dict[str, str]]] = {}
        for k in varying:
            tag = next(
                (t for t in tags if not k.startswith("tag.") and self._one_to_one(k, t)), None
            )
            if tag is not None and k not in opts.labels:
                self._alias[k] = (tag, {c.get(k, ""): c.get(tag, "") for c in configs})
        self.constant = [
            (k, values[k][0]) for k in keys if len(values[k]) == 1 and values[k][0] != ""
        ]
        self.facet = opts.facet
        self.facets: list[str | None] = list(values[opts.facet]) if opts.facet else [None]
        self.shown = [k for k in varying if k not in redundant and k != opts.facet]
        if opts.facet is not None:  # what one panel's title says, its labels need not
            self.shown = [k for k in self.shown if not self._determined(k, [opts.facet])]
        per_panel = max(
            (sum(1 for c in configs if self.facet_of(c) == f) for f in self.facets), default=0
        )
        hue = opts.hue
        if hue is None and per_panel > MAX_LEGEND and self.shown:
            # the key of the most values a palette still tells apart, else the most values
            fits = [k for k in self.shown if len(values[k]) <= len(PALETTE)]
            hue = max(fits or self.shown, key=lambda k: len(values[k]))
        self.hue = hue
        # line style, then marker: the first keys the styles so far do not already tell
        # (prefill's color tells decode's value when the two are zipped)
        styled = [hue] if hue is not None else []
        self.linestyle_key = self._next_style(styled, len(LINESTYLES))
        styled += [self.linestyle_key] if self.linestyle_key else []
        self.marker_key = self._next_style(styled, len(MARKERS))
        styled += [self.marker_key] if self.marker_key else []
        self.unstyled = (
            [k for k in self.shown if not self._determined(k, styled)] if hue is not None else []
        )
        self._labels = {i: self.label(c) for i, c in enumerate(configs)}
        self._colors = {
            lab: PALETTE[n % len(PALETTE)]
            for n, lab in enumerate(sorted(set(self._labels.values())))
        }
        hv = values[hue] if hue is not None else []
        nums = [_number(v) for v in hv if v != ""]
        self.colorbar = len(hv) > len(PALETTE) and all(n is not None for n in nums)
        self._hue_colors: dict[str, str] = {}
        if hue is not None and not self.colorbar:
            self._hue_colors = {v: PALETTE[n % len(PALETTE)] for n, v in enumerate(hv)}

    def _determined(self, key: str, by: Sequence[str]) -> bool:
        """Whether the values of ``by`` tell ``key``'s value in every configuration."""
        seen: dict[tuple[str, ...], str] = {}
        for c in self.configs:
            v = c.get(key, "")
            if seen.setdefault(tuple(c.get(k, "") for k in by), v) != v:
                return False
        return True

    def _next_style(self, styled: Sequence[str], room: int) -> str | None:
        return next(
            (
                k for k in self.shown
                if k not in styled and len(self.values[k]) <= room
                and not self._determined(k, styled)
            ),
            None,
        )  # fmt: skip

    def _one_to_one(self, a: str, b: str) -> bool:
        ab: dict[str, str] = {}
        ba: dict[str, str] = {}
        for c in self.configs:
            x, y = c.get(a, ""), c.get(b, "")
            if ab.setdefault(x, y) != y or ba.setdefault(y, x) != x:
                return False
        return True

    # -- names -------------------------------------------------------------------------------
    def name(self, key: str) -> str:
        """A key as labels show it: its ``--label`` text, else its short form."""
        return self.opts.labels.get(key, short_key(key))

    def value_text(self, key: str, value: str) -> str:
        """A value as labels show it (a tag's value for a key zipped with it)."""
        if key in self._alias:
            value = self._alias[key][1].get(value, value)
        return value if value != "" else NO_VALUE

    def pair(self, key: str, value: str) -> str:
        if key in self._alias:
            tag, values = self._alias[key]
            key, value = tag, values.get(value, value)
        name = self.name(key)
        shown = value if value != "" else NO_VALUE
        return f"{name}={shown}" if name else shown

    def label(self, config: Mapping[str, str], keys: Sequence[str] | None = None) -> str:
        """The configuration by the keys that vary (set ones only)."""
        parts = [
            self.pair(k, config.get(k, "")) for k in (self.shown if keys is None else keys)
            if config.get(k, "") != ""
        ]  # fmt: skip
        return " ".join(parts) or "all"

    def facet_of(self, config: Mapping[str, str]) -> str | None:
        return config.get(self.facet, "") if self.facet is not None else None

    def facet_title(self, value: str | None) -> str:
        return "" if value is None or self.facet is None else self.pair(self.facet, value)

    def constants_text(self) -> str:
        """The keys every configuration shares, ``slo.ttft=1 s, slo.tpot=50 ms``."""
        return ", ".join(self.pair(k, v) for k, v in self.constant)

    @property
    def grouped(self) -> bool:
        """Whether the legend names values of keys rather than configurations."""
        return self.hue is not None

    # -- styles ------------------------------------------------------------------------------
    def color(self, config: Mapping[str, str]) -> str:
        if self.hue is None:
            return self._colors[self.label(config)]
        v = config.get(self.hue, "")
        if self.colorbar:
            if v == "":
                return "#7f7f7f"
            from matplotlib.colors import to_hex

            norm, cmap = self.scale()
            return str(to_hex(cmap(norm(_number(v) or 0.0))))
        return self._hue_colors[v]

    def scale(self) -> tuple[Any, Any]:
        """(norm, colormap) of a numeric hue drawn as a colorbar."""
        import matplotlib
        from matplotlib.colors import Normalize

        nums = [_number(v) or 0.0 for v in self.values[self.hue or ""] if v != ""]
        lo, hi = min(nums), max(nums)
        return Normalize(lo, hi if hi > lo else lo + 1.0), matplotlib.colormaps["viridis"]

    def linestyle(self, config: Mapping[str, str]) -> str:
        k = self.linestyle_key
        return LINESTYLES[self.values[k].index(config.get(k, ""))] if k else "-"

    def marker(self, config: Mapping[str, str]) -> str:
        k = self.marker_key
        return MARKERS[self.values[k].index(config.get(k, ""))] if k else "o"

    # -- the legend --------------------------------------------------------------------------
    def legend(
        self, fig: Figure, axes: Sequence[Axes], per_config: Sequence[tuple[Any, str]],
        extra: Sequence[tuple[Any, str]] = (), *, lines: bool = True,
    ) -> None:  # fmt: skip
        """The figure's legend, outside the axes on the right: ``per_config``
        (handle, text) when the configurations are few and no hue is set,
        else one section per styled key; ``extra`` entries (the target, the
        knee marker) after them. ``lines``: the configurations are lines
        (line styles and markers mean something), else bars."""
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        entries: list[tuple[Any, str]] = []
        title = "configuration"
        if not self.grouped:
            entries += list(per_config)
        else:
            title = ""

            def header(key: str) -> None:
                name = self.name(self._alias[key][0] if key in self._alias else key)
                entries.append((Line2D([], [], ls="", marker=""), f"{name or key}:"))

            if not self.colorbar and self.hue is not None:
                header(self.hue)
                for v in self.values[self.hue]:
                    c = self._hue_colors[v]
                    h = Line2D([], [], color=c, lw=2.5) if lines else Patch(color=c)
                    entries.append((h, f"  {self.value_text(self.hue, v)}"))
            if lines and self.linestyle_key:
                header(self.linestyle_key)
                for v, ls in zip(self.values[self.linestyle_key], LINESTYLES, strict=False):
                    entries.append(
                        (Line2D([], [], color="0.35", ls=ls, lw=1.6), f"  {v or NO_VALUE}")
                    )
            if lines and self.marker_key:
                header(self.marker_key)
                for v, m in zip(self.values[self.marker_key], MARKERS, strict=False):
                    h = Line2D([], [], color="0.35", ls="", marker=m, ms=6)
                    entries.append((h, f"  {self.value_text(self.marker_key, v)}"))
        entries += list(extra)
        if self.colorbar:
            from matplotlib.cm import ScalarMappable

            norm, cmap = self.scale()
            bar = ScalarMappable(norm=norm, cmap=cmap)
            name = self.name(self.hue or "")
            fig.colorbar(bar, ax=list(axes), label=name, location="right", shrink=0.8)
        if not entries:
            return
        height = fig.get_figheight()
        ncols = max(1, math.ceil(len(entries) * 0.24 / max(height - 0.6, 1.0)))
        leg = fig.legend(
            [h for h, _ in entries], [t for _, t in entries], loc="outside right upper",
            ncols=ncols, fontsize=8, title=title or None, title_fontsize=8, frameon=False,
        )  # fmt: skip
        for text, (_, t) in zip(leg.get_texts(), entries, strict=True):
            if t.endswith(":") and not t.startswith(" "):
                text.set_fontweight("bold")


def figure(width: float, height: float, opts: PlotOptions) -> Figure:
    """A constrained-layout figure of ``opts.size`` or the given default size."""
    from matplotlib.figure import Figure

    w, h = opts.size if opts.size is not None else (width, height)
    return Figure(figsize=(w, h), layout="constrained")


def grid(n: int) -> tuple[int, int]:
    """(rows, columns) of ``n`` small multiples: at most 3 columns."""
    cols = min(n, 3)
    return math.ceil(n / cols), cols


# -- layout checks ------------------------------------------------------------------------------
def layout_problems(fig: Figure) -> list[str]:
    """What a drawn ``fig`` gets wrong, as sentences: tick labels of one axis
    that overlap, a title or legend outside the figure, a legend over an
    axes' area, data axes covering less than half the figure. Draws the
    figure on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    renderer = canvas.get_renderer()
    box = fig.bbox
    problems: list[str] = []

    def inside(bb: Any, what: str) -> None:
        tol = 1.0
        if (
            bb.x0 < box.x0 - tol
            or bb.y0 < box.y0 - tol
            or bb.x1 > box.x1 + tol
            or bb.y1 > box.y1 + tol
        ):
            problems.append(f"{what} outside the figure: {bb.bounds} not in {box.bounds}")

    data_axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    area = 0.0
    for n, ax in enumerate(data_axes):
        area += ax.bbox.width * ax.bbox.height
        for axis_name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            boxes = [
                t.get_window_extent(renderer)
                for t in axis.get_ticklabels()
                if t.get_visible() and t.get_text()
            ]
            for i in range(len(boxes)):
                for j in range(i + 1, len(boxes)):
                    if boxes[i].overlaps(boxes[j]):
                        problems.append(f"axes {n}: {axis_name} tick labels {i} and {j} overlap")
        title = ax.title
        if title.get_text():
            inside(title.get_window_extent(renderer), f"axes {n} title")
    suptitle = getattr(fig, "_suptitle", None)  # the Text of fig.suptitle, None when unset
    if suptitle is not None and suptitle.get_text():
        inside(suptitle.get_window_extent(renderer), "the title")
    legends = list(fig.legends) + [ax.get_legend() for ax in data_axes]
    for leg in (x for x in legends if x is not None):
        bb = leg.get_window_extent(renderer)
        inside(bb, "the legend")
        for n, ax in enumerate(data_axes):
            if bb.overlaps(ax.bbox):
                problems.append(f"the legend covers axes {n}")
    if area < 0.5 * box.width * box.height:
        problems.append(f"the axes cover {area / (box.width * box.height):.0%} of the figure")
    return problems
