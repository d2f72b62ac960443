"""Results over simulated time: one row of metrics per window of ``W`` seconds.

:class:`Timeline` is fed by :class:`~twin.sim.metrics.Metrics` as requests
arrive and end and as instances change role, come up or go down; it keeps a
few counters, small latency sketches and some time integrals per window, so
its memory grows with the number of windows, not of requests. Once every
request that arrived in a window has ended and a later one has arrived, the
window's quantiles are taken and its sketches dropped (nothing can change
them any more), so a long run keeps about 300 bytes a window. Windows are ``[k W, (k+1) W)``
from time 0; the last one ends at the run's end (the last request's end) and
includes it, so it may be shorter than ``W``.

Only the windows in which something happens are kept: a request arrived,
began its prefill, landed or joined a decode batch, or ended, or an instance
changed. Between two of them, every window shows the same figures (nothing
arrived or ended there; the queues and instances held what they held across
it), so one record stands for them all, and a long span (a retry's backoff
of hours, a GPU slowed a million-fold, a window of a nanosecond) costs
memory and time by what happened in it, not by its length. A stretch of up
to :data:`GAP_ROWS` such windows gets its row each, as every other window; a
longer one gets one row from its start to its end.

A row (:data:`TIMELINE_COLUMNS`, in this order in ``--timeline-csv``):

- ``start_s``, ``end_s``: the window.
- ``arrived``: requests that arrived in the window; ``completed``,
  ``rejected``, ``failed``: how those requests ended (whenever they did).
- ``slo_met``, ``slo_attainment``: of the requests that arrived in the
  window, those that met both SLOs, and their share of ``arrived`` (rejected
  and failed requests count as misses, as in the summary). Attribution is by
  arrival, as goodput's is: a window's attainment is how the load offered in
  it was served, and the rows add up to the summary's figures.
- ``ttft_p50_s`` ... ``tpot_p99_s``: quantiles over the completed requests
  that arrived in the window (exact up to :data:`WINDOW_EXACT` values per
  window, then within 0.1%, see :class:`~twin.sim.metrics.Distribution`);
  empty when none.
- ``finished``: requests that ended (any outcome) in the window.
- ``queued``: requests waiting for their first prefill step (arrival to
  scheduled, the interval of the summary's ``queue_s``), summed over
  instances and averaged over the window's time; ``decode_queued``: requests
  whose KV has landed on the decode side, waiting to join its batch.
- ``instances_mixed``, ``instances_prefill``, ``instances_decode``: instances
  up in each role, and ``gpus_up``: their GPUs, each averaged over the
  window's time (whole numbers while nothing changes; a change inside a
  window shows as a fraction).
- ``transfer_p50_s``: the median KV hand-off time (the summary's
  ``transfer_s``: from the prompt's end to the KV's landing) of the completed
  requests that arrived in the window and moved; empty when none did.
- ``dram_bytes``, ``ssd_bytes`` (only in a run with ``kv_tiers``, after the
  others): the bytes each KV tier below HBM holds, summed over instances and
  averaged over the window's time (see ``KVTiers.occupancy``).
"""

from __future__ import annotations

import csv
import math
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from twin._io import atomic_write
from twin.errors import TwinError
from twin.serving.engine import ROLES
from twin.serving.observer import InstanceInfo
from twin.sim.distribution import Distribution

# Ten seconds: fine enough to show a failure's dip and recovery at the rates
# the bundled experiments run, coarse enough that an hour of trace is 360 rows;
# fixed (not a share of the run) so that runs of different lengths line up.
DEFAULT_WINDOW_S = 10.0
# Latencies kept exactly per window before folding into buckets (memory bound).
WINDOW_EXACT = 256
# Windows in which nothing happened, in a row, that still get a row each (1,000 s
# at the default window: any lull of a trace); more are one row (see above).
GAP_ROWS = 100

TIMELINE_COLUMNS = (
    "start_s",
    "end_s",
    "arrived",
    "completed",
    "rejected",
    "failed",
    "slo_met",
    "slo_attainment",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "finished",
    "queued",
    "decode_queued",
    *(f"instances_{r}" for r in ROLES),
    "gpus_up",
    "transfer_p50_s",
)

# Time integrals kept per window: the two queues, instances per role, GPUs.
_QUEUED, _DECODE_QUEUED = 0, 1
_ROLE = {r: 2 + i for i, r in enumerate(ROLES)}
_GPUS = 2 + len(ROLES)
_AREAS = _GPUS + 1


class _Window:
    """One window's counters, time integrals and latency sketches; ``pending``
    counts the requests that arrived in it and have not ended; ``quantiles``,
    once it is sealed, holds what the sketches gave (and they are gone);
    ``gap`` the time integrals of each window after it up to the next one
    kept (the same in all of them)."""

    __slots__ = ("counts", "ttft", "tpot", "transfer", "area", "pending", "quantiles", "gap")

    def __init__(self) -> None:
        # arrived, completed, rejected, failed, slo_met, finished
        self.counts = [0, 0, 0, 0, 0, 0]
        self.ttft = Distribution(WINDOW_EXACT)
        self.tpot = Distribution(WINDOW_EXACT)
        self.transfer = Distribution(WINDOW_EXACT)
        self.area = array("d", bytes(8 * _AREAS))  # _AREAS zeros
        self.pending = 0
        self.quantiles: tuple[float | None, ...] | None = None
        self.gap = array("d", bytes(8 * _AREAS))

    def seal(self) -> None:
        """Take the quantiles; no request can add to the sketches any more."""
        self.quantiles = self._quantiles()
        del self.ttft, self.tpot, self.transfer

    def _quantiles(self) -> tuple[float | None, ...]:
        if self.quantiles is not None:
            return self.quantiles
        ttft, tpot = self.ttft, self.tpot
        return (_q(ttft, 0.50), _q(ttft, 0.99), _q(tpot, 0.50), _q(tpot, 0.99),
                _q(self.transfer, 0.50))  # fmt: skip

    def merge(self, other: _Window) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        sketches = (other.ttft, other.tpot, other.transfer)
        if self.quantiles is not None:
            # only a window past the run's end merges into the last one, and no
            # request that completed arrived in it
            assert all(d.count == 0 for d in sketches), "a sealed window got latencies"
        else:
            for mine, theirs in zip((self.ttft, self.tpot, self.transfer), sketches, strict=True):
                mine.merge(theirs)
        self.area = array("d", (a + b for a, b in zip(self.area, other.area, strict=True)))


_OUTCOME = {"completed": 1, "rejected": 2, "failed": 3}


class Timeline:
    """Per-window metrics of one run (see the module's docstring)."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        if not (window_s > 0 and math.isfinite(window_s)):
            raise ValueError(f"window {window_s!r} s must be > 0")
        self.window_s = float(window_s)
        # the windows kept, by index, and their indices in order
        self._windows: dict[int, _Window] = {}
        self._keys: list[int] = []
        # instance -> [role, GPUs, up]; the step functions' last change
        self._instances: dict[int, list[Any]] = {}
        self._since = 0.0
        self._levels = [0.0] * _AREAS
        self._arriving = 0  # the window the latest arrival fell in

    # -- windows ---------------------------------------------------------------------
    def _window(self, t: float) -> _Window:
        return self._at(int(t // self.window_s))

    def _at(self, k: int) -> _Window:
        """Window ``k``, kept from now on: inside a stretch between two kept
        windows it starts with what that stretch's windows hold."""
        win = self._windows.get(k)
        if win is not None:
            return win
        keys = self._keys
        i = bisect_left(keys, k)
        win = _Window()
        if 0 < i < len(keys):
            held = self._windows[keys[i - 1]].gap
            win.area = array("d", held)
            win.gap = array("d", held)
        if k < self._arriving:  # past the arrivals: no request will arrive in it
            win.seal()
        keys.insert(i, k)
        self._windows[k] = win
        return win

    def _spread(self, a: float, b: float, slot: int, level: float) -> None:
        """Add ``level`` x the overlap of ``[a, b]`` with each window to its ``slot``."""
        if not b > a or level == 0:
            return
        w = self.window_s
        first, last = int(a // w), int(b // w)
        wins = self._windows
        if first == last:
            self._at(first).area[slot] += level * (b - a)
            return
        self._at(first).area[slot] += level * ((first + 1) * w - a)
        self._at(last).area[slot] += level * (b - last * w)
        keys = self._keys
        i = bisect_left(keys, first)
        full = level * w
        wins[first].gap[slot] += full  # the windows after it, up to the next kept one
        for k in keys[i + 1 : bisect_left(keys, last, i)]:
            win = wins[k]
            win.area[slot] += full
            win.gap[slot] += full

    # -- requests --------------------------------------------------------------------
    def arrived(self, arrival: float) -> None:
        """A request arrived (at non-decreasing times): it will end in
        :meth:`completed` or :meth:`ended`. Windows before this one whose
        requests have all ended are sealed."""
        win = self._window(arrival)
        win.pending += 1
        k = int(arrival // self.window_s)
        if k > self._arriving:
            keys = self._keys
            for j in keys[bisect_left(keys, self._arriving) : bisect_left(keys, k)]:
                past = self._windows[j]
                if past.pending == 0 and past.quantiles is None:
                    past.seal()
            self._arriving = k

    def _left(self, arrival: float, win: _Window) -> None:
        """A request that arrived in ``win`` ended; the window seals if it was the last."""
        win.pending -= 1
        if win.pending == 0 and int(arrival // self.window_s) < self._arriving:
            win.seal()

    def completed(
        self, arrival: float, finish: float, ttft: float, tpot: float | None, met: bool,
        scheduled: float, landed: float, decode_start: float, transfer: float | None = None,
    ) -> None:  # fmt: skip
        """A request completed at ``finish``; ``scheduled`` its first prefill
        step's start; ``landed``/``decode_start`` its KV's landing on the decode
        side and its joining that side's batch (-1 when it never moved);
        ``transfer`` its hand-off time (None when it never moved)."""
        win = self._window(arrival)
        if win.quantiles is not None:
            raise AssertionError(
                f"a request that arrived at {arrival!r} s ended twice, or without arriving"
            )
        c = win.counts
        c[0] += 1
        c[1] += 1
        c[4] += met
        win.ttft.add(ttft)
        if tpot is not None:
            win.tpot.add(tpot)
        if transfer is not None:
            win.transfer.add(transfer)
        self._window(finish).counts[5] += 1
        self._spread(arrival, scheduled, _QUEUED, 1.0)
        if landed >= 0.0:
            self._spread(landed, decode_start, _DECODE_QUEUED, 1.0)
        self._left(arrival, win)

    def ended(self, arrival: float, now: float, outcome: str) -> None:
        """A request ended at ``now`` without completing (``rejected``/``failed``)."""
        win = self._window(arrival)
        c = win.counts
        c[0] += 1
        c[_OUTCOME.get(outcome, 2)] += 1
        self._window(now).counts[5] += 1
        self._left(arrival, win)

    # -- capacity --------------------------------------------------------------------
    def start(self, instances: Sequence[InstanceInfo]) -> None:
        """The instances the run starts with, all up at time 0."""
        self._instances = {i.id: [i.role, len(i.gpus), True] for i in instances}
        self._since = 0.0
        self._levels = self._capacity()

    def _capacity(self) -> list[float]:
        levels = [0.0] * _AREAS
        for role, gpus, up in self._instances.values():
            if up:
                levels[_ROLE[role]] += 1.0
                levels[_GPUS] += gpus
        return levels

    def _advance(self, now: float) -> None:
        """Integrate the capacity levels held since the last change up to ``now``."""
        if now > self._since:
            for slot in range(2, _AREAS):
                self._spread(self._since, now, slot, self._levels[slot])
            self._since = now

    def _change(self, now: float, instance: int, role: str | None = None, up: bool | None = None,
                info: InstanceInfo | None = None) -> None:  # fmt: skip
        self._advance(now)
        if info is not None:
            self._instances[instance] = [info.role, len(info.gpus), True]
        state = self._instances.get(instance)
        if state is None:
            return  # an instance never described: nothing to count
        if role is not None:
            state[0] = role
        if up is not None:
            state[2] = up
        self._levels = self._capacity()

    def role_changed(self, now: float, instance: int, role: str) -> None:
        self._change(now, instance, role=role)

    def instance_up(self, now: float, instance: int, info: InstanceInfo | None = None) -> None:
        self._change(now, instance, up=True, info=info)

    def instance_down(self, now: float, instance: int) -> None:
        self._change(now, instance, up=False)

    # -- the rows --------------------------------------------------------------------
    def rows(self, end_s: float) -> list[dict[str, Any]]:
        """One row per window from 0 to ``end_s`` (the run's end), in order;
        none when nothing happened."""
        if not self._windows and end_s <= 0:
            return []
        w = self.window_s
        levels = self._levels
        self._advance(end_s)
        n = max(1, math.ceil(end_s / w))
        self._window(end_s)
        self._at(0)
        keys, wins = self._keys, self._windows
        while keys[-1] >= n:  # what ended exactly at the end belongs to the last window
            into = self._at(keys[-1] - 1)
            into.merge(wins.pop(keys.pop()))
        out = []
        nothing = (0, 0, 0, 0, 0, 0)
        for i, k in enumerate(keys):
            win = wins[k]
            end = end_s if k == n - 1 else (k + 1) * w
            out.append(
                _row(k * w, end, end - k * w, win.counts, win._quantiles(), win.area, levels)
            )
            after = keys[i + 1] if i + 1 < len(keys) else n
            if after - k - 1 > GAP_ROWS:  # one row for the stretch, each window's figures
                out.append(_row((k + 1) * w, after * w, w, nothing, _NONE, win.gap, levels))
                continue
            for j in range(k + 1, after):
                out.append(_row(j * w, (j + 1) * w, w, nothing, _NONE, win.gap, levels))
        return out


_NONE = (None,) * 5  # the quantiles of a window without latencies


def _row(
    start: float, end: float, dur: float, counts: Sequence[int],
    quantiles: Sequence[float | None], area: Sequence[float], levels: Sequence[float],
) -> dict[str, Any]:  # fmt: skip
    """A timeline row from ``start`` to ``end``: ``counts`` and ``quantiles`` as
    a window keeps them; the time integrals ``area`` over ``dur`` seconds (the
    levels held at the end where ``dur`` is 0)."""
    arrived, completed, rejected, failed, met, finished = counts
    ttft_p50, ttft_p99, tpot_p50, tpot_p99, transfer_p50 = quantiles
    row: dict[str, Any] = {
        "start_s": start,
        "end_s": end,
        "arrived": arrived,
        "completed": completed,
        "rejected": rejected,
        "failed": failed,
        "slo_met": met,
        "slo_attainment": met / arrived if arrived else None,
        "ttft_p50_s": ttft_p50,
        "ttft_p99_s": ttft_p99,
        "tpot_p50_s": tpot_p50,
        "tpot_p99_s": tpot_p99,
        "finished": finished,
    }
    row["queued"] = area[_QUEUED] / dur if dur > 0 else 0.0
    row["decode_queued"] = area[_DECODE_QUEUED] / dur if dur > 0 else 0.0
    for r in ROLES:
        row[f"instances_{r}"] = area[_ROLE[r]] / dur if dur > 0 else levels[_ROLE[r]]
    row["gpus_up"] = area[_GPUS] / dur if dur > 0 else levels[_GPUS]
    row["transfer_p50_s"] = transfer_p50
    return row


def _q(d: Distribution, q: float) -> float | None:
    return d.quantile(q) if d.count else None


def write_timeline_csv(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write timeline rows as CSV, columns :data:`TIMELINE_COLUMNS` in that
    order, then any others the first row has (a run with KV tiers adds
    ``dram_bytes``, ``ssd_bytes``: each tier's bytes summed over instances,
    averaged over the window), an empty cell for a value that is not there."""
    rows = list(rows)
    columns = list(TIMELINE_COLUMNS)
    if rows:
        columns += [c for c in rows[0] if c not in TIMELINE_COLUMNS]
    try:
        with atomic_write(path) as f:  # no partial CSV under the finished name
            w = csv.writer(f, lineterminator="\n")
            w.writerow(columns)
            for row in rows:
                w.writerow(["" if row.get(c) is None else row[c] for c in columns])
    except OSError as e:
        raise TwinError(f"{path}: cannot write: {e.strerror}") from None
    return Path(path)
