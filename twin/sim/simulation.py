"""The simulation: wires a spec's parts together, runs them, returns a Result.

One :class:`Simulation` owns everything mutable of a run: the SimPy
environment, the engines, the scheduler instance and the random streams
(spawned from one ``numpy.random.SeedSequence(seed)``: ``workload`` and
``scheduler``). The same spec and inputs give byte-identical results.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

import twin
from twin.errors import CapacityError, SpecError
from twin.net.flows import Network
from twin.perf.build import build_perf_model
from twin.perf.gpus import get_gpu
from twin.perf.iteration import PerfModel
from twin.request import Request
from twin.scheduler import (
    ClusterView,
    Objectives,
    Plan,
    Reject,
    Route,
    SetRole,
    build_scheduler,
)
from twin.serving.cluster import EngineView, place_instances, place_on_topology, placement_order
from twin.serving.engine import ROLES, Arrival, Engine, Sequence
from twin.serving.handoff import KVHandoff, pick_decode_with, shard_flows
from twin.serving.kvcache import BlockManager, blocks_for, kv_capacity_blocks
from twin.serving.kvpool import KVPool
from twin.sim.metrics import Metrics
from twin.sim.spec import ExperimentSpec
from twin.workload.stream import file_sha256, iter_requests

if TYPE_CHECKING:
    from twin.sim.trace import TraceRecorder


@dataclass(frozen=True)
class Result:
    """What a run produced: ``header`` (version, resolved spec, hashes) and
    ``summary`` (the stable keys of :meth:`twin.sim.metrics.Metrics.summary`)."""

    header: dict[str, Any]
    summary: dict[str, Any]
    instances: list[dict[str, Any]]
    links: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "header": self.header,
            "summary": self.summary,
            "instances": self.instances,
            "links": self.links,
        }


class Simulation:
    """One run of one spec. ``requests`` replaces the spec's workload (tests and
    tools); ``on_row`` receives one dict per ended request; ``log`` collects an
    event trace ``(time, kind, instance, ...)`` when given; ``scheduler`` is a
    policy object to use instead of the spec's (an unregistered one, say);
    ``link_series_s`` keeps each link's bytes per time bucket of that width;
    ``trace`` (a :class:`twin.sim.trace.TraceRecorder`) records iteration and
    transfer spans, and, like ``log``, turns the engines' fast-forward off."""

    def __init__(
        self,
        spec: ExperimentSpec,
        *,
        requests: Iterable[Request] | None = None,
        on_row: Callable[[dict[str, Any]], None] | None = None,
        log: list[tuple] | None = None,
        perf: PerfModel | None = None,
        scheduler: Any | None = None,
        link_series_s: float | None = None,
        trace: TraceRecorder | None = None,
    ) -> None:
        self.spec = spec
        self.env = simpy.Environment()
        self.log = log
        seeds = np.random.SeedSequence(spec.seed).spawn(2)
        self.rng_workload = np.random.default_rng(seeds[0])
        self.rng_scheduler = np.random.default_rng(seeds[1])
        self._requests = requests
        self.metrics = Metrics(spec.slo, on_row)
        self.scheduler = scheduler or build_scheduler(
            spec.scheduler, spec.scheduler_params, where=f"{spec.source}: scheduler"
        )
        self._name = spec.scheduler if scheduler is None else type(scheduler).__name__
        roles = [g.role for g in spec.groups for _ in range(g.count)]
        sizes = [g.tp * g.pp for g in spec.groups for _ in range(g.count)]
        shapes = [(g.tp, g.pp) for g in spec.groups for _ in range(g.count)]
        topo = spec.topology
        if topo is not None:
            order = placement_order(roles, spec.placement)
            placements = place_on_topology(topo, sizes, order, where=f"{spec.source}: cluster")
            gpus = [get_gpu(topo.gpu_type(p.gpus[0])) for p in placements]
            self.network: Network | None = Network(self.env, link_series_s, trace)
        else:
            placements = place_instances(len(roles), sizes[0], spec.gpus_per_node)
            gpus = [spec.gpu] * len(roles)
            self.network = None
        self.handoff: KVHandoff | None = None
        self.engines: list[Engine] = []
        self.capacity: list[int] = []
        perfs: dict[tuple[str, int, int], PerfModel] = {}
        views = []
        for p, role, gpu, (tp, pp) in zip(placements, roles, gpus, shapes, strict=True):
            key = (gpu.name, tp, pp)
            if key not in perfs:
                perfs[key] = perf or build_perf_model(
                    spec.perf, spec.model, gpu, tp, pp,
                    where=f"{spec.source}: perf", base_dir=spec.base_dir,
                )  # fmt: skip
            blocks = kv_capacity_blocks(
                gpu_memory_bytes=gpu.memory_bytes,
                memory_utilization=spec.memory_utilization,
                weight_bytes=spec.model.weight_bytes,
                activation_reserve_bytes=spec.activation_reserve_bytes,
                kv_bytes_per_token=spec.model.kv_bytes_per_token(),
                tp=tp,
                pp=pp,
                block_size=spec.engine.block_size,
            )
            watermark = int(spec.engine.watermark * blocks)
            kv = BlockManager(blocks, spec.engine.block_size, watermark)
            eng_perf: Any = perfs[key]
            eng_log: Any = log
            if trace is not None:  # prices and logs for the engine, and records spans
                eng_perf = eng_log = trace.tap(self.env, p.instance, perfs[key], log)
            eng = Engine(
                self.env, p.instance, eng_perf, kv, spec.engine, self._finished, eng_log, role=role
            )
            self.engines.append(eng)
            self.capacity.append(blocks - watermark)
            views.append(EngineView(eng, p, self._fetch_estimate))
        self.perfs = perfs
        self.placements = placements
        self.pools: list[KVPool] = []
        if spec.kv_pool_bytes is not None and topo is not None:
            self.pools = [KVPool(n, spec.kv_pool_bytes) for n in range(topo.num_nodes)]
            for eng in self.engines:
                eng.on_prompt = self._keep_prompt
        self._fetch_rates: dict[tuple[int, int], tuple[float, float]] = {}
        slo = Objectives(spec.slo.ttft_s, spec.slo.tpot_s)
        pools = self._pool_prefix if self.pools else None
        self.view = ClusterView(views, lambda: self.env.now, slo, pools, rng=self.rng_scheduler)
        self._apply_plan(self.scheduler.setup(self.view))
        if topo is not None and self.network is not None:
            self.handoff = KVHandoff(
                self.env,
                self.engines,
                [p.gpus for p in placements],
                topo,
                self.network,
                spec.model.kv_bytes_per_token(),
                spec.transfer,
                pick_decode_with(self.scheduler, self.view),
                ttft_at_decode=spec.ttft_at == "decode",
                layers=spec.model.layers,
            )
            for eng in self.engines:
                eng.hooks = self.handoff
        self._arrived = 0
        self.kv_bytes_fetched = 0.0
        self._arrivals_done = False
        self.events = 0
        self._tick_s = self._tick_period()
        # instance -> (role it is moving to, move number); role_changes lists
        # (time, instance, old role, new role) as the moves take effect.
        self._moving: dict[int, tuple[str, int]] = {}
        self._moves = 0
        self.role_changes: list[tuple[float, int, str, str]] = []
        self._update_limits()
        if trace is not None:
            trace.attach(self)

    def _update_limits(self) -> None:
        """Longest sequences that can always finish, even alone on an instance
        (of the roles instances have now)."""
        self._max_prompt_blocks = min(
            c for c, e in zip(self.capacity, self.engines, strict=True) if e.role != "decode"
        )
        self._max_blocks = min(
            c for c, e in zip(self.capacity, self.engines, strict=True) if e.role != "prefill"
        )

    def _apply_plan(self, plan: Plan) -> None:
        name = self.spec.scheduler
        for inst_id, role in plan.roles.items():
            if not 0 <= inst_id < len(self.engines):
                raise SpecError(f"scheduler {name!r}: setup names instance {inst_id}")
            if role not in ROLES:
                raise SpecError(
                    f"scheduler {name!r}: setup gives instance {inst_id} role {role!r}; "
                    f"expected one of {', '.join(ROLES)}"
                )
            self.engines[inst_id].role = role
        for key in ("max_batched_tokens", "max_num_seqs"):
            for inst_id, value in getattr(plan, key).items():
                if not (isinstance(inst_id, int) and 0 <= inst_id < len(self.engines)):
                    raise SpecError(f"scheduler {name!r}: setup sets {key} of instance {inst_id!r}")
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise SpecError(
                        f"scheduler {name!r}: setup sets {key} of instance {inst_id} to "
                        f"{value!r}; expected a positive integer"
                    )
                eng = self.engines[inst_id]
                limits: dict[str, Any] = {key: value}
                eng.config = dataclasses.replace(eng.config, **limits)
        self._check_roles(name)

    def _check_roles(self, name: str) -> None:
        roles = {e.role for e in self.engines}
        if roles - {"mixed"} and self.spec.topology is None:
            raise SpecError(
                f"scheduler {name!r} splits prefill and decode; the cluster needs a topology "
                "for the KV cache to travel over (cluster.topology)"
            )
        if not roles & {"prefill", "mixed"} or not roles & {"decode", "mixed"}:
            raise SpecError(
                f"scheduler {name!r}: the cluster has roles {sorted(roles)}; it needs instances "
                "that prefill (prefill or mixed) and instances that decode (decode or mixed)"
            )

    # -- processes -------------------------------------------------------------------
    def _request_stream(self) -> Iterator[Request]:
        if self._requests is not None:
            return iter(self._requests)
        return iter_requests(self.spec.workload, self.rng_workload)

    def arrive(self):  # noqa: ANN201 - a SimPy process
        """Feed requests in arrival order; route each one as it arrives."""
        env = self.env
        last = 0.0
        for req in self._request_stream():
            if req.arrival_s < last:
                raise SpecError(f"request {req.id}: arrival {req.arrival_s!r} s before {last!r} s")
            last = req.arrival_s
            if req.arrival_s > env.now:
                yield Arrival(env, req.arrival_s - env.now)
            self._arrived += 1
            if self.log is not None:
                self.log.append((round(env.now, 9), "arrive", -1, req.id))
            if self._oversized(req):
                continue
            decision = self.scheduler.route(req, self.view)
            if isinstance(decision, Reject):
                self.metrics.reject(req, decision.reason, env.now)
                if self.log is not None:
                    self.log.append((round(env.now, 9), "reject", -1, req.id))
                continue
            if not isinstance(decision, Route):
                raise SpecError(
                    f"scheduler {self.spec.scheduler!r}: route() returned {decision!r}; "
                    "expected Route or Reject"
                )
            self._dispatch(req, decision)
        self._arrivals_done = True

    # -- the periodic hook -----------------------------------------------------------
    def _tick_period(self) -> float | None:
        """``tick_s`` of a policy with a ``tick`` hook, checked; None without one."""
        if not callable(getattr(self.scheduler, "tick", None)):
            return None
        tick_s = getattr(self.scheduler, "tick_s", None)
        if (
            isinstance(tick_s, bool)
            or not isinstance(tick_s, int | float)
            or not math.isfinite(tick_s)
            or tick_s <= 0
        ):
            raise SpecError(
                f"scheduler {self._name!r} has tick() but tick_s is {tick_s!r}; "
                "expected the seconds between ticks, > 0"
            )
        return float(tick_s)

    def _ticker(self):  # noqa: ANN202 - a SimPy process
        """Call the policy's ``tick`` every ``tick_s`` while requests remain to
        arrive or to end; stop once none do (or nothing else is scheduled, so a
        stuck run still ends and fails its conservation check)."""
        env = self.env
        assert self._tick_s is not None
        while True:
            yield env.timeout(self._tick_s)
            done = self._arrivals_done and self.metrics.ended == self._arrived
            if done or (self._arrivals_done and env.peek() == math.inf and not self._moving):
                return
            actions = self.scheduler.tick(self.view)
            for action in actions or ():
                self._act(action)

    def _act(self, action: object) -> None:
        name, n = self._name, len(self.engines)
        if not isinstance(action, SetRole):
            raise SpecError(f"scheduler {name!r}: tick() returned {action!r}; expected SetRole")
        i, role, cost = action.instance, action.role, action.cost_s
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise SpecError(f"scheduler {name!r}: {action} names instance {i!r}; instances are "
                            f"0..{n - 1}")  # fmt: skip
        if role not in ROLES:
            raise SpecError(
                f"scheduler {name!r}: {action} gives role {role!r}; expected one of "
                f"{', '.join(ROLES)}"
            )
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost < math.inf:
            raise SpecError(f"scheduler {name!r}: {action}: cost_s {cost!r} must be >= 0 seconds")
        pending = self._moving.get(i)
        if pending is not None and pending[0] == role:
            return  # already on its way
        if pending is None and self.engines[i].role == role:
            return
        self._moves += 1
        self._moving[i] = (role, self._moves)
        if cost == 0:
            self._take_role(i, role, self._moves)
        else:
            move = self._moves
            self.env.timeout(cost).callbacks.append(lambda _ev: self._take_role(i, role, move))

    def _take_role(self, i: int, role: str, move: int) -> None:
        if self._moving.get(i, (None, -1))[1] != move:
            return  # replaced by a later move
        del self._moving[i]
        eng = self.engines[i]
        old = eng.role
        if old == role:
            return
        eng.role = role
        try:
            self._check_roles(self._name)
        except SpecError as e:
            eng.role = old
            raise SpecError(f"{e} (after moving instance {i} from {old} to {role})") from None
        self._update_limits()
        self.role_changes.append((self.env.now, i, old, role))
        if self.log is not None:
            self.log.append((round(self.env.now, 9), "role", i, role))

    def _dispatch(self, req: Request, decision: Route) -> None:
        name = self.spec.scheduler
        p, d = decision.prefill, decision.decode
        n = len(self.engines)
        if not (isinstance(p, int) and 0 <= p < n) or not (
            d is None or isinstance(d, int) and 0 <= d < n
        ):
            raise SpecError(
                f"scheduler {name!r}: route for request {req.id} names {decision}; "
                f"instances are 0..{n - 1}"
            )
        src = self.engines[p]
        if src.role == "decode":
            raise SpecError(
                f"scheduler {name!r}: request {req.id} routed to prefill on decode instance {p}"
            )
        seq = Sequence(req, self.env.now)
        if req.output_tokens == 1:
            pass  # done when the prompt is: its KV never moves
        elif d is not None and d != p:
            if self.engines[d].role == "prefill":
                raise SpecError(
                    f"scheduler {name!r}: request {req.id} routed to decode on prefill instance {d}"
                )
            if self.handoff is None:
                raise SpecError(
                    f"scheduler {name!r}: request {req.id} prefills on {p} and decodes on {d}; "
                    "moving KV needs a topology (cluster.topology)"
                )
            seq.handoff, seq.decode_instance = True, d
        elif d is None and src.role == "prefill":
            seq.handoff = True
        if decision.fetch_from is not None:
            self._fetch_then_submit(seq, src, decision.fetch_from)
        else:
            src.submit(seq)

    # -- KV pools (Mooncake's store) -------------------------------------------------
    def _cacheable(self, req: Request) -> tuple[int, ...]:
        return self.engines[0].cacheable(req)

    def _keep_prompt(self, engine: Engine, seq: Sequence) -> None:
        hashes = self._cacheable(seq.req)
        if hashes:
            unit_bytes = seq.req.prefix_block_tokens * self.spec.model.kv_bytes_per_token()
            self.pools[self.view[engine.id].node].insert(hashes, unit_bytes)

    def _pool_prefix(self, req: Request) -> dict[int, int]:
        hashes = self._cacheable(req)
        out = {}
        for pool in self.pools:
            n = pool.match(hashes)
            if n:
                out[pool.node] = n * req.prefix_block_tokens
        return out

    def _fetch_rate(self, instance: int, node: int) -> tuple[float, float]:
        """(latency s, bytes/s) of loading KV from ``node``'s pool to ``instance``
        on an idle network: over PCIe inside the node (every GPU of the instance
        in parallel), else from the pool node's NICs as flows, one per shard."""
        key = (instance, node)
        if key not in self._fetch_rates:
            topo = self.spec.topology
            gpus = self.placements[instance].gpus
            if node == self.placements[instance].node:
                pcie = get_gpu(topo.gpu_type(gpus[0])).pcie_bytes_s
                self._fetch_rates[key] = (0.0, pcie * len(gpus))
            else:
                src = topo.gpus_of_node(node)[: len(gpus)]
                probe = 1e9
                env = simpy.Environment()
                t = Network(env).start(shard_flows(topo, src, gpus, probe))
                env.run()
                lat = max(topo.latency_s(topo.path(a, b)) for a, b in zip(src, gpus, strict=False))
                self._fetch_rates[key] = (lat, probe / max(t.end_s - lat, 1e-12))
        return self._fetch_rates[key]

    def _fetch_estimate(self, instance: int, node: int, tokens: int) -> float:
        lat, rate = self._fetch_rate(instance, node)
        return lat + tokens * self.spec.model.kv_bytes_per_token() / rate

    def _fetch_then_submit(self, seq: Sequence, engine: Engine, node: int) -> None:
        name = self._name
        if not self.pools or not 0 <= node < len(self.pools):
            raise SpecError(
                f"scheduler {name!r}: request {seq.req.id} fetches from node {node!r}; "
                + ("nodes are 0.." + str(len(self.pools) - 1) if self.pools else
                   "the cluster has no KV pool (cluster.kv_pool)")
            )  # fmt: skip
        req = seq.req
        hashes = self._cacheable(req)
        pool = self.pools[node]
        n = pool.match(hashes)
        tokens = min(n * req.prefix_block_tokens, req.prompt_tokens - 1)
        if tokens <= engine.cached_prefix_tokens(req):
            engine.submit(seq)  # nothing to load that the instance does not hold
            return
        pool.touch(hashes[:n])
        nbytes = tokens * self.spec.model.kv_bytes_per_token()
        self.kv_bytes_fetched += nbytes
        inst = engine.id

        def landed(_ev: object) -> None:
            seq.preloaded_tokens = tokens
            engine.submit(seq)

        if node == self.placements[inst].node:
            lat, rate = self._fetch_rate(inst, node)
            self.env.timeout(lat + nbytes / rate).callbacks.append(landed)
        else:
            assert self.network is not None
            src = self.spec.topology.gpus_of_node(node)[: len(self.placements[inst].gpus)]
            flows = shard_flows(self.spec.topology, src, self.placements[inst].gpus, nbytes)
            self.network.start(flows, label=f"fetch {req.id}").done.callbacks.append(landed)

    def _oversized(self, req: Request) -> bool:
        bs = self.spec.engine.block_size
        need = blocks_for(req.prompt_tokens + req.output_tokens - 1, bs)
        if (
            need <= self._max_blocks
            and blocks_for(req.prompt_tokens, bs) <= self._max_prompt_blocks
        ):
            return False
        if self.spec.oversized == "reject":
            self.metrics.reject(req, "exceeds_kv_capacity", self.env.now)
            return True
        spec = self.spec
        holds = min(self._max_blocks, self._max_prompt_blocks)
        raise CapacityError(
            f"{spec.source}: request {req.id}: prompt {req.prompt_tokens} + output "
            f"{req.output_tokens} tokens need {need} KV blocks, but the smallest instance of "
            f"{spec.model.name} that would serve it holds {holds}; "
            "give instances more GPUs, or set engine.oversized: reject"
        )

    def _finished(self, s: Sequence) -> None:
        self.metrics.complete(s)

    # -- running ---------------------------------------------------------------------
    def run(self) -> Result:
        env = self.env
        env.process(self.arrive())
        if self._tick_s is not None:
            env.process(self._ticker())
        events = 0
        step = env.step
        try:
            while True:
                step()
                events += 1
        except simpy.core.EmptySchedule:
            pass
        self.events = events
        self._check_conservation()
        summary = self.metrics.summary()
        summary["kv_bytes_transferred"] = self.handoff.bytes_moved if self.handoff else 0.0
        summary["kv_bytes_fetched"] = self.kv_bytes_fetched
        links = self.network.link_stats() if self.network is not None else []
        return Result(self._header(), summary, self._instance_stats(), links)

    def _check_conservation(self) -> None:
        if self.metrics.ended != self._arrived:
            raise AssertionError(f"{self._arrived} requests arrived but {self.metrics.ended} ended")
        for e in self.engines:
            cached = e.cache.cached_blocks if e.cache is not None else 0
            idle = e.cache.evictable_blocks if e.cache is not None else 0
            held = e.running or e.waiting or e.handoff or e._landed or e.reserved
            if e.kv.free + cached != e.kv.total or idle != cached or held:
                raise AssertionError(f"instance {e.id} ended with work or blocks held")

    def _header(self) -> dict[str, Any]:
        spec = self.spec
        sources = (
            {}
            if self._requests is not None
            else {p.name: file_sha256(p) for p in spec.workload.sources()}
        )
        return {
            "tool": "pd-twin",
            "version": twin.__version__,
            "code_sha256": twin.code_sha256(),
            "spec": dict(spec.resolved),
            "spec_sha256": spec.sha256,
            "trace_sha256": sources,
            "profile_sha256": next((p.sha256 for p in self.perfs.values() if p.sha256), None),
            "perf_model": " + ".join(sorted(p.name for p in self.perfs.values())),
            "kv_blocks_per_instance": (
                self.engines[0].kv.total
                if len({e.kv.total for e in self.engines}) == 1
                else [e.kv.total for e in self.engines]
            ),
        }

    def _instance_stats(self) -> list[dict[str, Any]]:
        span = self.metrics.last_end_s
        return [
            {
                "id": e.id,
                "role": e.role,
                "node": v.node,
                "gpus": list(v.gpus),
                "kv_blocks": e.kv.total,
                "iterations": e.iterations,
                "busy_s": e.busy_s,
                "utilization": e.busy_s / span if span > 0 else 0.0,
                "preemptions": e.preemptions,
                "peak_kv_blocks": e.kv.peak_used,
            }
            for e, v in zip(self.engines, self.view.instances, strict=True)
        ]
