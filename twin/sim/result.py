"""What a run returns: :class:`Result` (the header, the summary, per-instance
and per-link rows, the timeline, per-request rows) and :class:`Summary`, the
summary as a read-only mapping that also reads dotted keys."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from twin.errors import TwinError
from twin.sim.frames import flatten

# The columns of a link's row (twin/net/flows.py, Network.link_stats), besides
# "series" (with --links-csv)
LINK_COLUMNS = (
    "src", "dst", "usable_bytes_s", "bytes", "busy_s", "utilization", "peak_rate_bytes_s"
)  # fmt: skip


class Summary(Mapping[str, Any]):
    """A run's summary as a flat mapping: nested metrics by dotted keys
    (``summary["ttft_s.p99"]``, the columns of a sweep's ``runs.csv``), in the
    order of :meth:`twin.sim.metrics.Metrics.summary`. A nested key also reads
    as its mapping (``summary["ttft_s"]["p99"]``); :attr:`nested` is the
    summary as ``Result.to_dict()`` and ``--json`` write it."""

    __slots__ = ("nested", "_flat")

    def __init__(self, nested: Mapping[str, Any]) -> None:
        self.nested: dict[str, Any] = dict(nested)
        self._flat = flatten(self.nested)

    def __getitem__(self, key: str) -> Any:
        if key in self._flat:
            return self._flat[key]
        return self.nested[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._flat)

    def __len__(self) -> int:
        return len(self._flat)

    def __repr__(self) -> str:
        return f"Summary({self._flat!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Summary, (self.nested,))


@dataclass(frozen=True)
class Result:
    """What a run produced: ``header`` (version, resolved spec, hashes),
    ``summary`` (a :class:`Summary` of the stable keys of
    :meth:`twin.sim.metrics.Metrics.summary`) and its tables: per instance,
    per link (bytes, utilization), per window of simulated time
    (twin/sim/timeline.py) and, when the run kept them (``twin.run`` does by
    default, ``Simulation(spec, keep_requests=True)``), per request.

    The tables read as pandas DataFrames (the ``data`` extra; see
    twin/sim/frames.py): :attr:`requests`, :attr:`instances`, :attr:`links`,
    :attr:`timeline`; :meth:`to_dict` gives them as lists of rows."""

    header: dict[str, Any]
    summary: Mapping[str, Any]
    instance_rows: list[dict[str, Any]]
    link_rows: list[dict[str, Any]] = field(default_factory=list)
    timeline_rows: list[dict[str, Any]] = field(default_factory=list)  # twin.sim.timeline rows
    # The failures, repairs and degradations as they took effect (the spec's
    # events and random failures); None, and not in to_dict, without either.
    fault_log: list[dict[str, Any]] | None = None
    # One dict per ended request, in the order they ended (REQUEST_COLUMNS);
    # None when the run did not keep them. Not in to_dict.
    request_rows: list[dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    # Each class's timeline rows (twin.sim.classmetrics), in a run with classes of
    # traffic; None, and not in to_dict, without them.
    class_timelines: dict[str, list[dict[str, Any]]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.summary, Summary):
            object.__setattr__(self, "summary", Summary(self.summary))

    def to_dict(self) -> dict[str, Any]:
        assert isinstance(self.summary, Summary)
        out = {
            "header": self.header,
            "summary": self.summary.nested,
            "instances": self.instance_rows,
            "links": self.link_rows,
            "timeline": self.timeline_rows,
        }
        if self.fault_log is not None:
            out["fault_log"] = self.fault_log
        if self.class_timelines is not None:
            out["timeline_by_class"] = self.class_timelines
        return out

    # -- as data (pandas, imported here only) -----------------------------------------
    @property
    def requests(self) -> Any:
        """One row per request, in id order: the columns of ``--requests-csv``,
        typed (twin/sim/frames.py, REQUEST_KINDS), missing values NA or NaN."""
        from twin.sim.frames import requests_frame

        if self.request_rows is None:
            raise TwinError(
                "this result kept no per-request rows: run it with "
                "twin.run(spec, keep_requests=True) or Simulation(spec, keep_requests=True)"
            )
        return requests_frame(self.request_rows)

    @property
    def instances(self) -> Any:
        """One row per instance: id, role, node, gpus, KV blocks, iterations,
        busy time, utilization, preemptions, peak KV blocks."""
        from twin.sim.frames import records_frame

        return records_frame(self.instance_rows)

    @property
    def links(self) -> Any:
        """One row per directed link that carried KV (none without a topology)."""
        from twin.sim.frames import records_frame

        return records_frame(self.link_rows, LINK_COLUMNS)

    @property
    def timeline(self) -> Any:
        """One row per window of simulated time (``output.window``): arrivals,
        completions, attainment, latency percentiles, capacity."""
        from twin.sim.frames import records_frame
        from twin.sim.timeline import TIMELINE_COLUMNS

        return records_frame(self.timeline_rows, TIMELINE_COLUMNS)

    def _repr_html_(self) -> str:
        """A compact table for notebooks: the run and its headline metrics."""
        import html

        from twin.sim.summary import header_line

        s = self.summary
        cells = [
            ("requests", s["requests"]),
            ("completed", s["completed"]),
            ("rejected", s["rejected"]),
            ("TTFT p50 / p99 (s)", (s["ttft_s.p50"], s["ttft_s.p99"])),
            ("TPOT p50 / p99 (ms)", (_ms(s["tpot_s.p50"]), _ms(s["tpot_s.p99"]))),
            ("SLO attainment", s["slo_attainment"]),
            ("throughput (req/s)", s["throughput_rps"]),
            ("simulated (s)", s["simulated_s"]),
        ]
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:right'>{html.escape(_cell(v))}</td></tr>"
            for k, v in cells
        )
        head = html.escape(header_line(self.to_dict()))
        return f"<table><caption style='text-align:left'>{head}</caption>{rows}</table>"


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3


def _cell(v: Any) -> str:
    if isinstance(v, tuple):
        return " / ".join(_cell(x) for x in v)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return f"{v:,}" if isinstance(v, int) else str(v)
