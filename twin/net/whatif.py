"""What a transfer started now would get: the max-min share of a new set of flows.

:func:`share_now` answers, for flows not yet started, the rate each would be
given by the network's own max-min sharing (:func:`twin.net.maxmin.max_min_rates`,
the progressive filling the network runs) if it started now, and when it
would then be delivered. It reads only the aggregates the network keeps per
link (usable rate, the sum of the current rates, the number of flows sending:
:meth:`Network.link_loads`), so a query costs O(path length x flows of the
new transfer), whatever the number of flows in flight.

What it approximates. The new flows are filled, by the solver's progressive
filling, over what each link of their paths offers them with the current
flows' rates held where they are (before any reallocation): a link of usable
rate ``u`` carrying ``n`` flows at ``load`` in all offers ``m`` new flows
crossing it ``max(u - load, u x m / (n + m))``, the larger of the capacity
the current flows leave unused and the new flows' fair share of the link with
them. That is the new flows' instantaneous max-min share exactly when, on
each link of their paths, the current flows are all held at that link's fair
share (so the newcomers take ``u / (n + m)`` each) or leave it room enough;
it is a lower bound of that link's water level otherwise (a current flow held
below the fair share by another link, or by its cap, leaves more to share
than ``u x m / (n + m)``). It says nothing of later changes: flows that start
or end while the transfer runs change its rate, and the estimate assumes the
rate it would start with holds to the end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from twin.net.flows import Network
from twin.net.maxmin import max_min_rates
from twin.net.transfer import ABS_DONE, FlowSpec, LinkLike
from twin.scheduler import LinkLoad

_Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Share:
    """What flows started now would get (:func:`share_now`).

    ``rates`` is each flow's max-min rate (bytes/s, in flow order; ``inf`` for
    a local uncapped flow), ``times_s`` each flow's delivery time
    (path latency + size / rate), ``slowest`` the index of the flow that is
    delivered last (-1 with no flows), ``bottleneck`` the link of that flow's
    path that offers the new flows on it the least each (None when it has no
    links, or its cap is lower), and ``links`` each
    distinct link of the flows' paths, in first-use order."""

    rates: tuple[float, ...]
    times_s: tuple[float, ...]
    slowest: int
    bottleneck: LinkLoad | None
    links: tuple[LinkLoad, ...]

    @property
    def time_s(self) -> float:
        """When the last flow is delivered, s from its start (0 with no flows)."""
        return self.times_s[self.slowest] if self.slowest >= 0 else 0.0

    @property
    def rate_bytes_s(self) -> float:
        """The rate of the flow delivered last (``inf`` with no flows)."""
        return self.rates[self.slowest] if self.slowest >= 0 else math.inf

    @property
    def utilisation(self) -> float:
        """The highest utilisation among the links of the paths (0 with none)."""
        return max((ln.utilisation for ln in self.links), default=0.0)


def share_now(network: Network, flows: Sequence[FlowSpec]) -> Share:
    """The rate each of ``flows`` would get if they started now, and when
    each would be delivered, at the current link loads (see the module's
    docstring for what it approximates). Nothing of the network changes."""
    keys = [tuple((ln.src, ln.dst) for ln in f.path) for f in flows]
    first: dict[_Key, LinkLike] = {}
    mult: dict[_Key, int] = {}
    for f, ks in zip(flows, keys, strict=True):
        for ln, k in zip(f.path, ks, strict=True):
            first.setdefault(k, ln)
            mult[k] = mult.get(k, 0) + 1
    now = [
        LinkLoad(k[0], k[1], usable, load, n)
        for k, (usable, load, n) in zip(first, network.link_loads(first.values()), strict=True)
    ]
    offer = {k: _offer(ln, mult[k]) for k, ln in zip(first, now, strict=True)}
    rates = max_min_rates(keys, [f.rate_cap_bytes_s for f in flows], offer)
    times = tuple(_time_s(f, r) for f, r in zip(flows, rates, strict=True))
    if not flows:
        return Share((), (), -1, None, tuple(now))
    slowest = max(range(len(flows)), key=lambda i: (times[i], -i))
    by_key = dict(zip(first, now, strict=True))
    # the link of its path that offers each new flow on it the least, unless its cap holds it
    cap = flows[slowest].rate_cap_bytes_s
    tight = min(keys[slowest], key=lambda k: offer[k] / mult[k], default=None)
    bottleneck = None
    if tight is not None and (cap is None or cap > offer[tight] / mult[tight]):
        bottleneck = by_key[tight]
    return Share(tuple(rates), times, slowest, bottleneck, tuple(now))


def _offer(link: LinkLoad, m: int) -> float:
    """What ``link`` offers ``m`` new flows now: the capacity its flows leave
    unused, or the new flows' fair share of it with them, the larger."""
    u = link.usable_bytes_s
    return max(u - link.load_bytes_s, u * m / (link.flows + m))


def _time_s(f: FlowSpec, rate: float) -> float:
    """Delivery time of ``f`` at ``rate``, as the network counts it: dust
    moves in its latency alone; a local uncapped flow is instant."""
    if f.size_bytes <= ABS_DONE or rate == math.inf:
        return f.latency_s
    if rate <= 0.0:
        return math.inf
    return f.latency_s + f.size_bytes / rate
