"""A pure build: the cluster a run needs, made complete from a resolved spec.

:func:`build_cluster` makes the network, the KV pools and tiers, the
hand-off's routes, the router's view (its fabric priced on those routes),
the hand-off and the engines, in that order, each
given its collaborators as it is made (nothing is set on a part after it is
made). The spec resolved with its instances placed and every check that
needs only the spec and the topology done (:mod:`twin.sim.layout`); what the
run decides (a lost request's retry, a stranded hand-off) comes in as
callbacks. An instance a policy adds during the run is made the same way
(:meth:`Cluster.add_instance`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

from twin.net.flows import Network
from twin.perf.build import build_perf_model
from twin.perf.gpus import GPUSpec
from twin.perf.iteration import PerfModel
from twin.scheduler import ClusterView, Objectives
from twin.serving.cluster import EngineView, Placement
from twin.serving.engine import Engine
from twin.serving.fabric import HandoffFabric
from twin.serving.handoff import HandoffRoutes, KVHandoff, pick_decode_with, rerouter
from twin.serving.kvcache import BlockManager
from twin.serving.kvpool import KVPools
from twin.serving.observer import Observer
from twin.serving.sequence import Sequence
from twin.serving.speculative import Speculation
from twin.serving.tiers import KVTiers, Tier, TierChain, build_chain, build_remote
from twin.sim.layout import instance_gpu, kv_blocks, perf_shape
from twin.sim.spec import ExperimentSpec

# What the run does with a sequence an instance cannot serve: (sequence, instance).
OnLost = Callable[[Sequence, int], None]


class Cluster:
    """A run's cluster, complete: ``engines`` and ``placements`` by instance id,
    the router's ``view`` of them, ``capacity`` (KV blocks each may fill, the
    watermark kept back), the perf models they share (``perfs``, by GPU and
    shape) and, as the spec has them, the ``network``, the KV ``handoff``,
    the KV ``pools`` and the KV ``tiers``."""

    def __init__(
        self,
        spec: ExperimentSpec,
        env: simpy.Environment,
        observer: Observer,
        view: ClusterView,
        network: Network | None,
        pools: KVPools | None,
        tiers: KVTiers | None,
        handoff: KVHandoff | None,
        engines: list[Engine],
        on_lost: OnLost,
        perf: PerfModel | None,
        placements: list[Placement],
    ) -> None:
        self.spec = spec
        self.env = env
        self.observer = observer
        self.view = view
        self.network = network
        self.pools = pools
        self.tiers = tiers
        self.handoff = handoff
        self.engines = engines  # the hand-off holds the same list
        self.placements = placements  # the KV pools hold the same list
        self.capacity: list[int] = []
        self.perfs: dict[tuple[Any, ...], PerfModel] = {}
        self._on_lost = on_lost
        self._perf = perf  # one model for every instance, instead of the spec's
        self._remote: Tier | None = None  # the KV tiers' remote store, made with the first chain

    def add_instance(
        self, p: Placement, role: str, tp: int, pp: int, ep: int = 1, dp: int = 1,
        *, starting: bool = False, model: str = "",
    ) -> Engine:  # fmt: skip
        """Instance ``p.instance``: its engine (its perf model shared by
        instances of the same model, GPU and shape), its hand-off queue and
        its view; ``ep`` and ``dp`` its expert-parallel layout (1, 1: dense);
        ``starting``: added during the run, down until it has started;
        ``model`` the model it serves in a spec of several ("": the spec's)."""
        spec = self.spec
        one = spec.part(model)  # the model's own spec: its model, perf and SLO
        assert p.instance == len(self.engines)
        gpu = instance_gpu(spec.topology, spec.gpu, p)
        key, a2a = perf_shape(spec.topology, gpu, p, tp, pp, ep, dp)
        key = (model, *key)
        if key not in self.perfs:
            self.perfs[key] = self._perf or build_perf_model(
                one.perf, one.model, gpu, tp, pp,
                where=f"{one.source}: perf", base_dir=spec.base_dir, ep=ep, dp=dp, a2a=a2a,
            )  # fmt: skip
        blocks = kv_blocks(one.model, spec.engine, gpu, role, tp, pp, ep, dp)
        watermark = int(spec.engine.watermark * blocks)
        self.placements.append(p)
        if self.handoff is not None:
            shape = (one.model.kv_bytes_per_token(), one.model.layers)
            self.handoff.add_instance(p.gpus, shape, model)
        sc = spec.engine.speculative
        eng = Engine(
            self.env, p.instance, self.perfs[key], BlockManager(blocks, spec.engine.block_size,
            watermark), spec.engine, self.observer, role=role, hooks=self.handoff,
            on_prompt=self.pools.keep_prompt if self.pools else None,
            speculation=None if sc is None else Speculation(
                sc, self.perfs[key], one.model, gpu, tp, spec.seed
            ),
            tiers=self._tier_chain(p, gpu, tp, pp),  # one model only (twin.sim.fleetspec)
            on_lost=self._lost_on(p.instance), starting=starting,
        )  # fmt: skip
        self.engines.append(eng)
        self.capacity.append(blocks - watermark)
        if self.tiers is not None and eng.cache is not None and eng.cache.tiers is not None:
            self.tiers.add(eng.id, eng.cache.tiers)
        fetch_s = self.pools.estimate_s if self.pools else None
        self.view.grow(EngineView(eng, p, fetch_s, self.tiers, model))
        return eng

    def _lost_on(self, instance: int) -> Callable[[Sequence], None]:
        """What instance ``instance`` does with a sequence it cannot serve (it is down)."""

        def lost(seq: Sequence) -> None:
            self._on_lost(seq, instance)

        return lost

    def _tier_chain(self, p: Placement, gpu: GPUSpec, tp: int, pp: int) -> TierChain | None:
        """The KV tiers below instance ``p``'s prefix cache (None without
        ``kv_tiers`` or prefix caching): its own DRAM and SSD, the cluster's
        remote store."""
        spec = self.spec
        keys = spec.kv_tiers
        if self.tiers is None or keys is None or not spec.engine.prefix_caching:
            return None
        block_bytes = spec.model.kv_bytes_per_token_tp(tp) * spec.engine.block_size
        if keys.remote is not None and self._remote is None:
            assert spec.topology is not None and self.network is not None
            self._remote = build_remote(
                keys.remote, block_bytes=block_bytes, network=self.network,
                topology=spec.topology,
            )  # fmt: skip
        return build_chain(
            self.env, keys, block_bytes=block_bytes, pcie_bytes_s=gpu.pcie_bytes_s * tp * pp,
            gpus=p.gpus, remote=self._remote,
        )  # fmt: skip


def build_cluster(
    spec: ExperimentSpec,
    env: simpy.Environment,
    observer: Observer,
    scheduler: object,
    rng: np.random.Generator,
    *,
    on_lost: OnLost,
    on_stranded: Callable[[Engine, Sequence], None],
    on_waiting: Callable[[Sequence], None],
    perf: PerfModel | None = None,
    link_series_s: float | None = None,
) -> Cluster:
    """The cluster of ``spec`` (resolved, its instances placed), complete:
    ``observer`` is told what happens, ``scheduler`` picks decode instances
    for the hand-off (through the view, with ``rng`` its random stream),
    ``on_lost`` takes a sequence an instance cannot serve (it is down),
    ``on_stranded`` a prefilled one no instance can decode, ``on_waiting``
    one whose transfer waits on a failed link; ``perf`` replaces the spec's
    perf model; ``link_series_s`` keeps each link's bytes per bucket."""
    topo = spec.topology
    network = None
    if topo is not None:
        network = Network(env, link_series_s, observer, reroute=rerouter(topo))
    pools = None
    kv_token = spec.model.kv_bytes_per_token()
    placed: list[Placement] = []  # by instance id, added instances included
    if spec.kv_pool_bytes is not None and topo is not None and network is not None:
        pools = KVPools(
            env, spec.kv_pool_bytes, topo, placed, network, kv_token,
            spec.engine.block_size, spec.kv_pool_ssd,
        )  # fmt: skip
    tiers = KVTiers(env) if spec.kv_tiers is not None else None
    engines: list[Engine] = []
    routes = None
    if topo is not None and network is not None:
        routes = HandoffRoutes(
            engines, [], topo, network, kv_token, spec.transfer, layers=spec.model.layers
        )
    slo = Objectives(spec.slo.ttft_s, spec.slo.tpot_s)
    # the view grows an instance at a time as the engines are made
    view = ClusterView(
        (), lambda: env.now, slo, pools.prefix if pools else None, rng=rng,
        fabric=HandoffFabric(routes) if routes is not None else None,
    )  # fmt: skip
    handoff = None
    if routes is not None:
        handoff = KVHandoff(
            env, routes, pick_decode_with(scheduler, view),
            on_stranded=on_stranded, on_waiting=on_waiting,
        )  # fmt: skip
    cluster = Cluster(
        spec, env, observer, view, network, pools, tiers, handoff, engines, on_lost, perf, placed
    )
    placements = iter(spec.placements)
    for g in spec.groups:
        for _ in range(g.count):
            cluster.add_instance(
                next(placements), g.role, g.tp, g.pp, g.ep, g.dp, model=g.model
            )  # fmt: skip
    assert next(placements, None) is None, "a spec resolved without its placement"
    return cluster
