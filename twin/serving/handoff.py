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
moves, the prefill side frees only after the last byte landed."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import simpy

from twin._declare import BOOL, choice, declared
from twin.errors import SpecError
from twin.net.flows import FlowSpec, Network
from twin.net.topology import Topology
from twin.scheduler import ClusterView, decode_hook
from twin.serving.engine import Engine
from twin.serving.sequence import Sequence

MODES = ("serialized", "layerwise")
PROTOCOLS = ("push", "pull")


@dataclass(frozen=True, slots=True)
class TransferConfig:
    """How KV moves (the spec's ``transfer:``): ``mode`` serialized | layerwise,
    ``handoff`` push | pull, ``multi_nic`` spreads cross-node shares over all
    NICs of the source node."""

    mode: str = declared("serialized", choice(*MODES), "serialized | layerwise")
    handoff: str = declared("push", choice(*PROTOCOLS), "push | pull")
    multi_nic: bool = declared(False, BOOL, "spread each cross-node shard over all the node's NICs")

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpecError(f"transfer.mode: {self.mode!r}; expected one of {', '.join(MODES)}")
        if self.handoff not in PROTOCOLS:
            raise SpecError(
                f"transfer.handoff: {self.handoff!r}; expected one of {', '.join(PROTOCOLS)}"
            )
        if self.mode == "layerwise" and self.handoff != "push":
            raise SpecError(
                "mode 'layerwise' streams KV while it is produced, so the decode "
                "blocks must be reserved first; it needs handoff: push"
            )


def shard_flows(
    topology: Topology,
    src_gpus: Seq[int],
    dst_gpus: Seq[int],
    kv_bytes: float,
    *,
    multi_nic: bool = False,
) -> list[FlowSpec]:
    """The flows that move ``kv_bytes`` of KV from one instance's GPUs to another's.

    Source GPU ``i`` holds ``1/len(src_gpus)`` of the KV (TP shards the heads,
    PP the layers) and sends it to destination GPU ``i mod len(dst_gpus)``.
    NOTE: when the two sides' parallelism differs, a real system reshards; here
    each source shard goes whole to one destination GPU, so the per-GPU load on
    the destination side is approximate.
    """
    share = kv_bytes / len(src_gpus)
    flows: list[FlowSpec] = []
    for i, g in enumerate(src_gpus):
        d = dst_gpus[i % len(dst_gpus)]
        if g == d:
            continue  # the same GPU: nothing moves
        src_node = topology.node_of(g)
        if multi_nic and src_node != topology.node_of(d):
            n = topology.nic_count(src_node)
            for k in range(n):
                flows.append(FlowSpec(topology.path(g, d, nic=k), share / n))
        else:
            flows.append(FlowSpec(topology.path(g, d), share))
    return flows


class KVHandoff:
    """Moves KV between the engines of one simulation (the engines' hooks).

    It is made before the engines, which are built with it as their hooks:
    ``engines`` is the cluster's list of engines by id, complete before the
    run starts, and ``gpus`` the GPUs of each instance."""

    def __init__(
        self,
        env: simpy.Environment,
        engines: Seq[Engine],
        gpus: Seq[tuple[int, ...]],
        topology: Topology,
        network: Network,
        kv_bytes_per_token: int,
        config: TransferConfig,
        pick_decode: Callable[[Sequence], int],
        *,
        layers: int,
    ) -> None:
        self.env = env
        self.engines = engines
        self.gpus = gpus
        self.topology = topology
        self.network = network
        self.kv_bytes_per_token = kv_bytes_per_token
        self.config = config
        self.pick_decode = pick_decode
        self.layers = layers
        self.pending: list[deque[Sequence]] = [deque() for _ in gpus]
        self.bytes_moved = 0.0
        self.transfers = 0

    # -- engine hooks ----------------------------------------------------------------
    def on_prefill_start(self, engine: Engine, seq: Sequence, dt: float) -> None:
        if self.config.handoff != "push":
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
        if self.pending[d] or not self.engines[d].reserve(seq):
            return  # reserved later, in order, once the prompt is done
        if self.config.mode == "layerwise":
            self._start(seq, engine.id, d, stream_s=dt)

    def on_prefilled(self, engine: Engine, seq: Sequence) -> None:
        if isinstance(seq.transfer, _Stream):  # streaming: the rest goes at full speed
            seq.transfer.uncap()
            return
        d = self._decode_of(seq)
        if d == engine.id:  # picked now (pull): the KV stays, see on_prefill_start
            engine.keep(seq)
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

    def _pump(self, d: int) -> None:
        queue = self.pending[d]
        engine = self.engines[d]
        while queue and engine.reserve(queue[0]):
            seq = queue.popleft()
            self._start(seq, seq.prefill_instance, d)

    def _start(self, seq: Sequence, src: int, dst: int, stream_s: float | None = None) -> None:
        kv_bytes = float(self.kv_bytes_per_token * seq.prefill_len)
        flows = shard_flows(
            self.topology, self.gpus[src], self.gpus[dst], kv_bytes,
            multi_nic=self.config.multi_nic,
        )  # fmt: skip
        now = self.env.now
        first = seq.t_transfer_start < 0  # each timestamp keeps its first occurrence
        if first:
            seq.t_transfer_start = now
        self.bytes_moved += kv_bytes
        self.transfers += 1
        if stream_s is None:
            self._send(seq, src, dst, flows)
            return
        # Layer l's KV exists after l/L of the iteration: the stream starts one
        # layer late, each shard capped at the rate the prefill produces it.
        layer_s = stream_s / self.layers
        capped = [FlowSpec(f.path, f.size_bytes, f.size_bytes / stream_s) for f in flows]
        stream = _Stream()
        seq.transfer = stream
        if first:
            seq.t_transfer_start = now + layer_s

        def begin(_ev: object) -> None:
            stream.transfer = self._send(seq, src, dst, capped)
            if stream.uncapped:
                stream.transfer.set_cap(None)

        self.env.timeout(layer_s).callbacks.append(begin)

    def _send(self, seq: Sequence, src: int, dst: int, flows: list[FlowSpec]) -> Any:
        transfer = self.network.start(flows, label=f"kv {seq.req.id}")
        if seq.transfer is None:
            seq.transfer = transfer
        transfer.done.callbacks.append(lambda _ev: self._landed(seq, src, dst))
        return transfer

    def _landed(self, seq: Sequence, src: int, dst: int) -> None:
        if seq.t_transfer_end < 0:
            seq.t_transfer_end = self.env.now
        seq.transfer = None
        seq.landed = True
        self.engines[src].release(seq)
        self.engines[dst].receive(seq)


class _Stream:
    """A layer-wise transfer: started one layer into the prefill iteration,
    uncapped when the prefill ends (which may come first when L is 1)."""

    __slots__ = ("transfer", "uncapped")

    def __init__(self) -> None:
        self.transfer: Any = None
        self.uncapped = False

    def uncap(self) -> None:
        self.uncapped = True
        if self.transfer is not None:
            self.transfer.set_cap(None)


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
        return d

    return pick
