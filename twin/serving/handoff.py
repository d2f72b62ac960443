"""The KV hand-off of disaggregated serving: prefill instance -> decode instance.

After its prompt is done, a request's KV stays in the prefill instance's
blocks until it has moved. It moves as flows over the topology, one per GPU
that holds a shard (each source GPU sends its share to a GPU of the decode
instance; with ``multi_nic`` a cross-node share is spread over every NIC of
the source node, as Mooncake's transfer engine does), sharing links with
every other transfer (twin.net.flows).

When the decode side takes its blocks decides the protocol:

- ``push`` (vLLM's connector): the decode instance is picked and its blocks
  reserved when the iteration that finishes the prompt starts, so the KV can
  leave the moment it exists (or, ``layerwise``, while it is produced). When
  they cannot be reserved then, the request waits as in pull mode.
- ``pull`` (DistServe): the decode instance is picked when the prompt is done
  and pulls the KV once it has the blocks; until then the prefill instance's
  memory is the queue.

``layerwise`` streams the KV during the prefill iteration: layer ``l`` is
sent once it is produced, so the flow starts one layer's time after the
iteration starts, capped at the rate the prefill produces KV, and is uncapped
when the prefill ends: only the residual after the last layer shows.

A request whose picked decode instance is the one that prefilled it (a
prefill instance the control loop has since made mixed) is not moved: it
decodes where its KV is.

Neither side ever over-commits blocks: the decode side allocates before a byte
moves, the prefill side frees only after the last byte landed.

Besides its bytes, a hand-off pays fixed costs (:class:`HandoffCosts`): a
control round trip (the decode side asks, the prefill side answers with its
block descriptors), memory registration, a cost per descriptor posted (one
per KV block per K/V region per layer on each source GPU, posted by the
source GPUs in parallel) and, behind a router, the second request hop that
hands the request to the decode side. They are taken in series with the
bytes, as one delay: before the flows of a serialized transfer, and split
around a layer-wise stream (the control round trip and registration before
it starts; the router hop and the descriptors of the layers the prefill
could not hide after its last byte).

With prefix caching on, the decode side keeps the KV it received as cached
prefix units (as a prefill instance keeps the prompts it computed): a
request whose leading units the decode instance already holds moves only
the rest (vLLM's NIXL connector reads only the blocks the decode side lacks),
so a repeated prefix crosses once."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import simpy

from twin._declare import BOOL, choice, declared, seconds
from twin.errors import SpecError
from twin.net.flows import FlowSpec, Network
from twin.net.shards import shard_paths, sized_flows
from twin.net.topology import Topology
from twin.scheduler import ClusterView, decode_hook
from twin.serving.engine import Engine
from twin.serving.kvcache import blocks_for
from twin.serving.sequence import LOST, Sequence

MODES = ("serialized", "layerwise")
PROTOCOLS = ("push", "pull")
_AT_LEAST_0 = seconds(positive=False)

# The defaults of the fixed costs, each from the source named beside it.
#
# Control round trip: vLLM's NIXL connector sends no separate request. The
# prefill side's answer to the router carries its block ids
# (``kv_transfer_params.remote_block_ids``, NixlConnector ``request_finished``)
# and the router hands them to the decode side with the request, which then
# reads (vLLM docs, "NixlConnector Usage Guide"; NVIDIA Dynamo docs,
# "Architecture Flow" steps S5-S7). That exchange is the router hop below, so
# the round trip of its own is 0 here; stacks whose decode side asks the
# prefill side directly (DistServe's pull, Mooncake's connector over ZMQ) set it.
CONTROL_RTT = "0 s"
# Registration: vLLM's NIXL connector registers the whole KV cache with the
# NIC once at start-up (``register_kv_caches`` -> ``register_memory``), as
# Mooncake's transfer engine registers its buffers once
# (``registerLocalMemory``; Mooncake docs, "Transfer Engine"): nothing per
# transfer. A stack that registers per transfer sets it.
REGISTRATION = "0 s"
# Per descriptor: fitted to vLLM issue #50913 (NixlConnector, TP4, 8 KB
# descriptors): a ~5k-token pull at block size 16 posts "tens of thousands" of
# descriptors (313 blocks x 2 x layers, 20k-40k) in a ~105 ms transfer window,
# and block size 64 (a quarter of the descriptors) cut the window by ~58 ms:
# 58 ms / (0.75 x 20k-40k) = 1.9-3.9 us each. The low end, 2 us, is chosen
# (part of the 58 ms is the step alignment that issue names). Bounds: NIXL's
# own post time in the same thread, 6.7 ms for the whole read, ~0.2 us each
# (posting alone, without the per-message work); UCX's cuda_ipc estimate,
# 4 us overhead per operation (openucx/ucx PR #8760).
PER_DESCRIPTOR = "2 us"
# Router hop: the prefill side's answer goes back through the router (vLLM's
# disaggregated proxy, Dynamo's PrefillRouter), which then sends the request
# to the decode side: one more request over the router. Chosen: 1 ms, one HTTP
# hop through a Python proxy. Published figures bound it: a compiled proxy
# adds 25-45 us per request (Percona, "ProxySQL overhead explained and
# measured", 2020); vLLM PR #51919 measured ~110 ms p50 of router dispatch and
# engine-step waits together around a 29 ms transfer, but the step waits are
# modelled here already (a landed request waits for the decode side's next step).
ROUTER_HOP = "1 ms"
KV_REGIONS_PER_LAYER = 2  # K and V: vLLM's paged layout keeps one region each per layer
# What one descriptor covers. "block": one paged KV block of one K/V region of
# a layer, as vLLM's NixlConnector posts them (vLLM issue #50913 above).
# "layer": one K/V region of a layer per source GPU, for a stack that keeps a
# request's KV contiguous per layer or gathers it before it sends. The default
# is "layer": the Mooncake Transfer Engine moves 40 GB between two 8 x 400
# Gbps RoCE nodes at 190 GB/s (Qin et al., FAST'25, section 5.4.1, Figure 12),
# which a cost of PER_DESCRIPTOR per 16-token block (1.3 M descriptors, 2.6 s)
# would hold to 15 GB/s.
DESCRIPTORS = ("layer", "block")


@dataclass(frozen=True, slots=True)
class TransferConfig:
    """How KV moves (the spec's ``transfer:``): ``mode`` serialized | layerwise,
    ``handoff`` push | pull, ``multi_nic`` spreads cross-node shares over all
    NICs of the source node."""

    mode: str = declared("serialized", choice(*MODES), "serialized | layerwise")
    handoff: str = declared("push", choice(*PROTOCOLS), "push | pull")
    multi_nic: bool = declared(False, BOOL, "spread each cross-node shard over all the node's NICs")
    control_rtt_s: float = declared(
        CONTROL_RTT, _AT_LEAST_0,
        "per hand-off: decode side asks, prefill side answers with block descriptors",
        key="control_rtt",
    )  # fmt: skip
    registration_s: float = declared(
        REGISTRATION, _AT_LEAST_0, "per hand-off: registering its memory with the NIC",
        key="registration",
    )  # fmt: skip
    per_descriptor_s: float = declared(
        PER_DESCRIPTOR, _AT_LEAST_0,
        "per descriptor posted (a KV block of one K/V region of a layer)", key="per_descriptor",
    )  # fmt: skip
    router_hop_s: float = declared(
        ROUTER_HOP, _AT_LEAST_0, "per hand-off: the request's second hop, router to decode side",
        key="router_hop",
    )  # fmt: skip
    descriptors: str = declared(
        "layer", choice(*DESCRIPTORS),
        "what a descriptor covers: layer (one K/V region of a layer) | block (each paged block)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpecError(f"transfer.mode: {self.mode!r}; expected one of {', '.join(MODES)}")
        if self.handoff not in PROTOCOLS:
            raise SpecError(
                f"transfer.handoff: {self.handoff!r}; expected one of {', '.join(PROTOCOLS)}"
            )
        if self.descriptors not in DESCRIPTORS:
            raise SpecError(
                f"transfer.descriptors: {self.descriptors!r}; expected one of "
                f"{', '.join(DESCRIPTORS)}"
            )
        if self.mode == "layerwise" and self.handoff != "push":
            raise SpecError(
                "mode 'layerwise' streams KV while it is produced, so the decode "
                "blocks must be reserved first; it needs handoff: push"
            )


@dataclass(frozen=True, slots=True)
class HandoffCosts:
    """The fixed costs of one hand-off (s), besides its bytes.

    ``descriptors`` is the count each source GPU posts: ``blocks`` moved (one
    per hand-off under ``descriptors: layer``) x :data:`KV_REGIONS_PER_LAYER`
    x ``layers`` (the source GPUs post theirs in parallel). ``layer_s`` is the
    length of one layer of the prefill iteration a layer-wise stream overlaps
    (0 for a serialized transfer).

    NOTE: every part is taken in series with the bytes. A stack that hands
    the request to the decode side while the bytes move (push) overlaps the
    router hop with them, which this counts in full after them; with
    PP a source GPU holds only its stage's layers and posts that share of
    the descriptors, so they are overcounted PP-fold.
    """

    control_s: float
    registration_s: float
    descriptors: int
    per_descriptor_s: float
    router_s: float
    layers: int
    layer_s: float = 0.0

    @property
    def descriptors_s(self) -> float:
        """Posting every descriptor, one after another."""
        return self.descriptors * self.per_descriptor_s

    @property
    def before_s(self) -> float:
        """The delay before the first byte moves."""
        if self.layer_s > 0:
            return self.control_s + self.registration_s
        return self.control_s + self.registration_s + self.descriptors_s + self.router_s

    @property
    def after_s(self) -> float:
        """The delay after the last byte of a layer-wise stream landed: the
        router hop and the descriptor posting the prefill could not hide.

        Layer ``l`` (1..L) exists at ``l x layer_s`` and its ``c`` s of posting
        follows that and the posting of layer ``l - 1``, so the posting ends at
        ``max_l(l x layer_s + (L - l + 1) x c)``: ``c`` after the prefill when
        ``c <= layer_s``, ``layer_s + L x c`` otherwise."""
        if self.layer_s <= 0:
            return 0.0
        c = self.descriptors_s / self.layers
        tail = max(c, self.layer_s + self.layers * c - self.layers * self.layer_s)
        return self.router_s + tail

    @property
    def total_s(self) -> float:
        return self.before_s + self.after_s


def handoff_costs(
    config: TransferConfig, blocks: int, layers: int, layer_s: float = 0.0
) -> HandoffCosts:
    """The fixed costs of moving ``blocks`` KV blocks of a ``layers``-layer model
    (``layer_s`` > 0: a layer-wise stream over layers of that length)."""
    return HandoffCosts(
        config.control_rtt_s,
        config.registration_s,
        (blocks if config.descriptors == "block" else min(blocks, 1))
        * KV_REGIONS_PER_LAYER
        * layers,
        config.per_descriptor_s,
        config.router_hop_s,
        layers,
        layer_s,
    )


class HandoffRoutes:
    """What moving KV between two instances of one simulation takes, before
    anything moves: the shards' paths and the fixed costs (both kept), over
    ``network`` on ``topology``. The hand-off (:class:`KVHandoff`) moves KV
    along them and the router's view of the fabric
    (:class:`twin.serving.fabric.HandoffFabric`) prices a hand-off with them,
    so both are made from it, before the engines: ``engines`` is the
    cluster's list of engines by id, complete before the run starts, and
    ``gpus`` the GPUs of each instance."""

    def __init__(
        self,
        engines: Seq[Engine],
        gpus: Seq[tuple[int, ...]],
        topology: Topology,
        network: Network,
        kv_bytes_per_token: int,
        config: TransferConfig,
        *,
        layers: int,
    ) -> None:
        self.engines = engines
        self.gpus = list(gpus)  # grows as instances are added
        self.topology = topology
        self.network = network
        self.kv_bytes_per_token = kv_bytes_per_token
        self.config = config
        self.layers = layers
        # each instance's (KV bytes per token, layers): its model's (a cluster
        # may serve several; KV moves only between instances of one)
        self.shapes: list[tuple[int, int]] = [(kv_bytes_per_token, layers)] * len(self.gpus)
        self.models: list[str] = [""] * len(self.gpus)
        # (source instance, destination instance) -> the shards' paths (static
        # routing: an instance's GPUs never change)
        self._paths: dict[tuple[int, int], list[tuple[FlowSpec, int]]] = {}
        # (descriptors per layer region, layer length, layers) -> the fixed costs
        # (immutable, shared) and their delays before the first byte and after the last
        self._costs: dict[tuple[int, float, int], tuple[HandoffCosts, float, float]] = {}

    def add_instance(
        self, gpus: tuple[int, ...], shape: tuple[int, int] | None = None, model: str = ""
    ) -> None:
        """An instance: the GPUs its KV lives on, its model's ``(KV bytes per
        token, layers)`` (None: the routes' own) and name ("": the only one)."""
        self.gpus.append(gpus)
        self.shapes.append(shape or (self.kv_bytes_per_token, self.layers))
        self.models.append(model)

    def kv_bytes(self, instance: int, tokens: int) -> float:
        """Bytes of ``tokens`` tokens of KV of ``instance``'s model."""
        return float(self.shapes[instance][0] * tokens)

    def paths(self, src: int, dst: int) -> list[tuple[FlowSpec, int]]:
        """The shards' paths from instance ``src`` to ``dst``
        (:func:`~twin.net.shards.shard_paths`), kept: routing is static and an
        instance's GPUs never change."""
        pair = (src, dst)
        paths = self._paths.get(pair)
        if paths is None:
            paths = self._paths[pair] = shard_paths(
                self.topology, self.gpus[src], self.gpus[dst], multi_nic=self.config.multi_nic
            )
        return paths

    def costs(self, dst: int, tokens: int, layer_s: float) -> tuple[HandoffCosts, float, float]:
        """The fixed costs of moving ``tokens`` tokens of KV to instance ``dst``
        (``layer_s`` > 0: streamed over layers of that length), with their
        delays before the first byte and after the last."""
        config = self.config
        # what handoff_costs reads of the blocks: all of them, or whether there is one
        if config.descriptors == "block":
            n = blocks_for(tokens, self.engines[dst].kv.block_size)
        else:
            n = 1 if tokens > 0 else 0
        layers = self.shapes[dst][1]
        got = self._costs.get((n, layer_s, layers))
        if got is None:
            if len(self._costs) >= 4096:
                self._costs.clear()
            costs = handoff_costs(config, n, layers, layer_s)
            got = self._costs[n, layer_s, layers] = (costs, costs.before_s, costs.after_s)
        return got


class KVHandoff:
    """Moves KV between the engines of one simulation (the engines' hooks),
    along ``routes``; ``pick_decode`` picks the decode instance of a prompt
    routed without one, ``on_stranded`` takes a prefilled sequence no live
    instance can decode, ``on_waiting`` is told of a transfer whose flows
    wait on a failed link. It is made before the engines, which are built
    with it as their hooks."""

    def __init__(
        self,
        env: simpy.Environment,
        routes: HandoffRoutes,
        pick_decode: Callable[[Sequence], int],
        *,
        on_stranded: Callable[[Engine, Sequence], None],
        on_waiting: Callable[[Sequence], None] | None = None,
    ) -> None:
        self.env = env
        self.routes = routes
        self.engines = routes.engines
        self.gpus = routes.gpus  # the same list: it grows as instances are added
        self.topology = routes.topology
        self.network = routes.network
        self.kv_bytes_per_token = routes.kv_bytes_per_token
        self.config = routes.config
        self.pick_decode = pick_decode
        self.layers = routes.layers
        self.pending: list[deque[Sequence]] = [deque() for _ in routes.gpus]
        # (source instance, destination instance, bytes) -> the flows that move them
        self._sized: dict[tuple[int, int, float], list[FlowSpec]] = {}
        self.bytes_moved = 0.0
        self.bytes_saved = 0.0  # KV the decode side's prefix cache held: not moved
        self.transfers = 0
        # Takes a prefilled sequence no live instance can decode (all failed):
        # (prefill engine, sequence).
        self.on_stranded = on_stranded
        # Told of a transfer whose flows wait on a failed link as they start
        # (the simulation bounds that wait by the retry deadline).
        self.on_waiting = on_waiting

    def add_instance(
        self, gpus: tuple[int, ...], shape: tuple[int, int] | None = None, model: str = ""
    ) -> None:
        """An instance (its engine joins ``engines``): the GPUs its KV lives
        on, its model's ``(KV bytes per token, layers)`` (None: the routes'
        own) and name ("": the only model), and its queue of hand-offs
        waiting for blocks."""
        self.routes.add_instance(gpus, shape, model)
        self.pending.append(deque())

    def _no_decode_up(self, seq: Sequence) -> bool:
        """No instance of ``seq``'s model that decodes is up (and none is picked)."""
        models = self.routes.models
        return seq.decode_instance is None and not any(
            e.up and e.role in ("decode", "mixed") and models[e.id] in ("", seq.req.model)
            for e in self.engines
        )

    # -- engine hooks ----------------------------------------------------------------
    def on_prefill_start(self, engine: Engine, seq: Sequence, dt: float) -> None:
        if self.config.handoff != "push" or self._no_decode_up(seq):
            return
        d = self._decode_of(seq)
        if d == engine.id:
            # A prefill instance that has since turned mixed may be picked to
            # decode what it prefills: the KV stays, and the prompt's end
            # joins the decode batch here. (Moved, it would be a transfer of
            # no flows that lands at once: a layer-wise stream then "landed"
            # before the prompt was done, and freeing its prefill-side
            # blocks failed.)
            seq.handoff = False
            return
        if self.pending[d] or not self.engines[d].receiver.reserve(seq):
            return  # reserved later, in order, once the prompt is done
        if self.config.mode == "layerwise":
            self._start(seq, engine.id, d, stream_s=dt)

    def on_prefilled(self, engine: Engine, seq: Sequence) -> None:
        if isinstance(seq.transfer, _Stream):  # streaming: the rest goes at full speed
            seq.transfer.uncap()
            return
        if self._no_decode_up(seq):
            self.on_stranded(engine, seq)
            return
        d = self._decode_of(seq)
        if d == engine.id:  # picked now (pull): the KV stays, see on_prefill_start
            engine.sender.keep(seq)
            return
        if seq.req.id in self.engines[d].reserved:  # reserved when the prefill started
            self._start(seq, engine.id, d)
            return
        self.pending[d].append(seq)
        self._pump(d)

    def on_blocks_freed(self, engine: Engine) -> None:
        if self.pending[engine.id]:
            self._pump(engine.id)

    # -- moving ----------------------------------------------------------------------
    def _decode_of(self, seq: Sequence) -> int:
        if seq.decode_instance is None:
            seq.decode_instance = self.pick_decode(seq)
        return seq.decode_instance

    # -- failures --------------------------------------------------------------------
    def drop(self, seq: Sequence) -> None:
        """``seq``'s attempt is lost (one end of its hand-off failed): stop its
        transfer, take it out of the queue for decode blocks and give back the
        blocks a live decode side reserved for it."""
        t: Any = seq.transfer
        if isinstance(t, _Stream):
            t.cancelled = True
            t = t.transfer
        if t is not None:
            self.network.cancel(t)
        seq.transfer = None
        for q in self.pending:
            if seq in q:
                q.remove(seq)
        d = seq.decode_instance
        if d is not None and self.engines[d].up and seq.req.id in self.engines[d].reserved:
            self.engines[d].receiver.unreserve(seq)

    def redirect(self, engine: Engine, seq: Sequence) -> None:
        """``seq``'s decode instance failed while its KV is still on prefill
        instance ``engine``: its transfer (if any) is stopped and the KV goes to
        the decode instance ``pick_decode`` gives now; a prompt not yet done
        picks one when it is (nothing is computed again)."""
        self.drop(seq)
        seq.decode_instance = None
        if engine.handoff.get(seq.req.id) is not None:
            self.on_prefilled(engine, seq)

    def _pump(self, d: int) -> None:
        queue = self.pending[d]
        engine = self.engines[d]
        while queue and engine.receiver.reserve(queue[0]):
            seq = queue.popleft()
            self._start(seq, seq.prefill_instance, d)

    def _start(self, seq: Sequence, src: int, dst: int, stream_s: float | None = None) -> None:
        if seq.state == LOST:
            return
        # Only what the decode side lacks moves: the leading prefix units its
        # prefix cache holds (taken with the reservation) stay out.
        engine = self.engines[dst]
        held = engine.receiver.prefix_tokens(seq)
        tokens = seq.prefill_len - held
        kv_bytes = self.routes.kv_bytes(src, tokens)
        saved = self.routes.kv_bytes(src, held)
        # The flows are immutable: those of a size moved before are taken again.
        flows = self._sized.get((src, dst, kv_bytes))
        if flows is None:
            if len(self._sized) >= 4096:
                self._sized.clear()
            flows = sized_flows(self.routes.paths(src, dst), len(self.gpus[src]), kv_bytes)
            self._sized[src, dst, kv_bytes] = flows
        now = self.env.now
        layer_s = 0.0 if stream_s is None else stream_s / self.routes.shapes[src][1]
        costs, before_s, after_s = self.routes.costs(dst, tokens, layer_s)
        # Layer l's KV exists after l/L of the iteration: a stream starts one
        # layer late (or once the control round trip and registration are
        # done, when later).
        lead = 0.0 if stream_s is None else max(layer_s, before_s)
        if seq.mark("t_transfer_start", now + lead):  # the request's (first) hand-off
            seq.handoff_costs = costs
            seq.kv_moved_bytes = kv_bytes
            seq.kv_saved_bytes = saved
        self.bytes_moved += kv_bytes
        self.bytes_saved += saved
        self.transfers += 1
        if stream_s is None:
            # The fixed costs come first, in one delay: the flows start after
            # it (the network takes the delay with the transfer, one event).
            self._send(seq, src, dst, flows, delay_s=before_s)
            return
        # Each shard is capped at the rate the prefill makes it.
        capped = [FlowSpec(f.path, f.size_bytes, f.size_bytes / stream_s) for f in flows]
        stream = _Stream()
        seq.transfer = stream

        def begin(_ev: object) -> None:
            if stream.cancelled:
                return
            stream.transfer = self._send(seq, src, dst, capped, after_s=after_s)
            if stream.uncapped:
                stream.transfer.set_cap(None)

        self.env.timeout(lead).callbacks.append(begin)

    def _send(
        self,
        seq: Sequence,
        src: int,
        dst: int,
        flows: list[FlowSpec],
        after_s: float = 0.0,
        delay_s: float = 0.0,
    ) -> Any:
        """Start the flows, ``delay_s`` from now; the KV lands when the last
        byte is in, ``after_s`` later."""

        def moves() -> bool:  # not lost, nor sent elsewhere, during the fixed costs
            return seq.state != LOST and seq.decode_instance == dst

        def started(t: Any) -> None:
            if self.on_waiting is not None and self.network.waits(t):
                self.on_waiting(seq)

        if delay_s <= 0 and not moves():
            return None
        transfer = self.network.start(
            flows, label=f"kv {seq.req.id}", delay_s=delay_s, guard=moves, on_start=started
        )
        if seq.transfer is None:
            seq.transfer = transfer
        if after_s > 0:

            def done(_t: object) -> None:
                self.env.timeout(after_s).callbacks.append(lambda _e: self._landed(seq, src, dst))

            transfer.then(done)
        else:
            transfer.then(lambda _t: self._landed(seq, src, dst))
        return transfer

    def _landed(self, seq: Sequence, src: int, dst: int) -> None:
        if seq.state == LOST or not self.engines[dst].up or seq.decode_instance != dst:
            return  # lost, or its decode side failed, during the fixed costs after the last byte
        seq.mark("t_transfer_end", self.env.now)
        seq.transfer = None
        seq.landed = True
        self.engines[src].sender.release(seq)
        self.engines[dst].receiver.receive(seq)
        self.engines[dst].observer.kv_landed(self.env.now, src, dst, seq.req)


class _Stream:
    """A layer-wise transfer: started one layer into the prefill iteration,
    uncapped when the prefill ends (which may come first when L is 1)."""

    __slots__ = ("transfer", "uncapped", "cancelled")

    def __init__(self) -> None:
        self.transfer: Any = None
        self.uncapped = False
        self.cancelled = False

    def uncap(self) -> None:
        self.uncapped = True
        if self.transfer is not None and not self.cancelled:
            self.transfer.set_cap(None)


def rerouter(topology: Topology) -> Callable[[str, str, frozenset], tuple[Any, ...] | None]:
    """For :attr:`twin.net.flows.Network.reroute`: a path from GPU vertex
    ``first`` to GPU vertex ``last`` that avoids the failed links: the GPU's
    own path or, across nodes, the one through any other NIC of its node, the
    widest first (then the least latency, then NIC order); None when every one
    crosses a failed link (or the ends are not GPUs), and the flow waits."""
    index = {name: i for i, name in enumerate(topology.gpus)}

    def reroute(first: str, last: str, down: frozenset) -> tuple[Any, ...] | None:
        g, d = index.get(first), index.get(last)
        if g is None or d is None:
            return None
        paths = [topology.path(g, d)]
        node = topology.node_of(g)
        if node != topology.node_of(d):
            paths += [topology.path(g, d, nic=k) for k in range(topology.nic_count(node))]
        ok = [p for p in paths if not any((ln.src, ln.dst) in down for ln in p)]
        if not ok:
            return None
        return min(ok, key=lambda p: (-topology.bottleneck_bytes_s(p), topology.latency_s(p)))

    return reroute


def pick_decode_with(scheduler: object, view: ClusterView) -> Callable[[Sequence], int]:
    """``pick_decode`` of the scheduler as the hand-off calls it, checked."""
    hook = decode_hook(scheduler)

    def pick(seq: Sequence) -> int:
        if hook is None:
            raise SpecError(
                f"scheduler {type(scheduler).__name__}: route() left the decode instance "
                "open but the policy has no pick_decode()"
            )
        d = hook.pick_decode(seq.req, view)
        if (
            not isinstance(d, int)
            or not 0 <= d < len(view)
            or view[d].role not in ("decode", "mixed")
        ):
            raise SpecError(
                f"scheduler {type(scheduler).__name__}: pick_decode() gave {d!r} for request "
                f"{seq.req.id}; expected the id of a decode or mixed instance"
            )
        if not view[d].up:
            raise SpecError(
                f"scheduler {type(scheduler).__name__}: pick_decode() gave instance {d} for "
                f"request {seq.req.id}, which is down (InstanceView.up is False)"
            )
        if not getattr(view[d], "accepting", True):
            raise SpecError(
                f"scheduler {type(scheduler).__name__}: pick_decode() gave instance {d} for "
                f"request {seq.req.id}, which is {view[d].state} (InstanceView.accepting is False)"
            )
        return d

    return pick
