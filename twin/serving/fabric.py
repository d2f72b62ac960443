"""The fabric in the router's view: what a hand-off between two instances would cost now.

:class:`HandoffFabric` is the :class:`twin.scheduler.FabricView` of a
simulation with a topology. It builds the flows a hand-off would start with
the hand-off's own code (:meth:`HandoffRoutes.paths`, :func:`~twin.net.shards.sized_flows`, the
fixed costs of :meth:`HandoffRoutes.costs`) and asks the network what they would
get now (:func:`twin.net.whatif.share_now`): no second formula for either the
bytes, the paths or the rates. It reads; it starts nothing.
"""

from __future__ import annotations

from twin.net.flows import FlowSpec
from twin.net.shards import sized_flows
from twin.net.topology import Topology
from twin.net.whatif import share_now
from twin.request import Request
from twin.scheduler import HandoffEstimate, LinkLoad
from twin.serving.handoff import HandoffRoutes


class HandoffFabric:
    """Hand-off estimates between the instances of one simulation (a
    :class:`twin.scheduler.FabricView`).

    An estimate is of a serialized hand-off of the request's prompt started
    now: the KV of the prompt less the leading prefix units the decode side's
    prefix cache holds (as its reservation would share them: at least the
    prompt's last token moves), over the shards' paths, at the rates
    :func:`~twin.net.whatif.share_now` gives, after the fixed costs.
    NOTE: a layer-wise stream hides most of its bytes behind the prefill;
    its estimate here is that of the same hand-off serialized."""

    __slots__ = ("_handoff", "_rails")

    def __init__(self, handoff: HandoffRoutes) -> None:
        self._handoff = handoff
        # (source, destination) -> whether each flow between nodes keeps its rail
        self._rails: dict[tuple[int, int], bool] = {}

    def handoff(self, prefill: int, decode: int, req: Request) -> HandoffEstimate:
        h = self._handoff
        if prefill == decode:  # the KV stays where it is
            return HandoffEstimate(prefill, decode)
        held = self._kept_tokens(decode, req)
        tokens = req.prompt_tokens - held
        kv_bytes = h.kv_bytes(prefill, tokens)
        flows = sized_flows(h.paths(prefill, decode), len(h.gpus[prefill]), kv_bytes)
        share = share_now(h.network, flows)
        _, before_s, after_s = h.costs(decode, tokens, 0.0)
        return HandoffEstimate(
            prefill,
            decode,
            bytes=kv_bytes,
            saved_tokens=held,
            saved_bytes=h.kv_bytes(prefill, held),
            flows=len(flows),
            rate_bytes_s=share.rate_bytes_s,
            bottleneck=share.bottleneck,
            transfer_s=share.time_s,
            fixed_s=before_s + after_s,
            links=share.links,
            rail_aligned=self._aligned(prefill, decode),
        )

    def path_links(self, prefill: int, decode: int) -> tuple[LinkLoad, ...]:
        if prefill == decode:
            return ()
        paths = self._handoff.paths(prefill, decode)
        return share_now(self._handoff.network, [f for f, _ in paths]).links

    def _kept_tokens(self, decode: int, req: Request) -> int:
        """Prompt tokens of ``req`` the decode side would share rather than
        receive: its cached leading units, all but the one with the prompt's
        last token (:meth:`Engine.reserve`)."""
        unit = req.prefix_block_tokens
        if not unit:
            return 0
        cached = self._handoff.engines[decode].cached_prefix_tokens(req)
        return min(cached, (req.prompt_tokens - 1) // unit * unit)

    def _aligned(self, prefill: int, decode: int) -> bool:
        got = self._rails.get((prefill, decode))
        if got is None:
            h = self._handoff
            got = all(_same_rail(h.topology, f) for f, _ in h.paths(prefill, decode))
            self._rails[prefill, decode] = got
        return got


def _same_rail(topology: Topology, flow: FlowSpec) -> bool:
    """Whether ``flow`` leaves its node and enters the other through NICs of
    the same number (True for a flow inside a node)."""
    node = topology.graph.nodes
    nics = [node[ln.dst]["index"] for ln in flow.path if node.get(ln.dst, {}).get("type") == "nic"]
    return len(nics) < 2 or nics[0] == nics[-1]
