"""The simulation: wires a spec's parts together, runs them, returns a Result.

One :class:`Simulation` owns everything mutable of a run: the SimPy
environment, the engines, the scheduler instance and the random streams
(spawned from one ``numpy.random.SeedSequence(seed)``: ``workload`` and
``scheduler``). The same spec and inputs give byte-identical results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

import twin
from twin.cluster import EngineView, place_instances
from twin.engine import Arrival, Engine, Sequence
from twin.errors import CapacityError, SpecError
from twin.kvcache import BlockManager, blocks_for, kv_capacity_blocks
from twin.metrics import Metrics
from twin.perf import PerfModel, build_perf_model
from twin.request import Request
from twin.scheduler import ClusterView, Reject, Route, build_scheduler
from twin.spec import ExperimentSpec
from twin.workload import file_sha256, iter_requests


@dataclass(frozen=True)
class Result:
    """What a run produced: ``header`` (version, resolved spec, hashes) and
    ``summary`` (the stable keys of :meth:`twin.metrics.Metrics.summary`)."""

    header: dict[str, Any]
    summary: dict[str, Any]
    instances: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"header": self.header, "summary": self.summary, "instances": self.instances}


class Simulation:
    """One run of one spec. ``requests`` replaces the spec's workload (tests and
    tools); ``on_row`` receives one dict per ended request; ``log`` collects an
    event trace ``(time, kind, instance, ...)`` when given."""

    def __init__(
        self,
        spec: ExperimentSpec,
        *,
        requests: Iterable[Request] | None = None,
        on_row: Callable[[dict[str, Any]], None] | None = None,
        log: list[tuple] | None = None,
        perf: PerfModel | None = None,
    ) -> None:
        self.spec = spec
        self.env = simpy.Environment()
        self.log = log
        seeds = np.random.SeedSequence(spec.seed).spawn(2)
        self.rng_workload = np.random.default_rng(seeds[0])
        self.rng_scheduler = np.random.default_rng(seeds[1])
        self._requests = requests
        self.metrics = Metrics(spec.slo, on_row)
        self.perf = perf or build_perf_model(
            spec.perf,
            spec.model,
            spec.gpu,
            spec.tp,
            spec.pp,
            where=f"{spec.source}: perf",
            base_dir=spec.base_dir,
        )
        self.capacity_blocks = kv_capacity_blocks(
            gpu_memory_bytes=spec.gpu.memory_bytes,
            memory_utilization=spec.memory_utilization,
            weight_bytes=spec.model.weight_bytes,
            activation_reserve_bytes=spec.activation_reserve_bytes,
            kv_bytes_per_token=spec.model.kv_bytes_per_token(),
            tp=spec.tp,
            pp=spec.pp,
            block_size=spec.engine.block_size,
        )
        self.scheduler = build_scheduler(
            spec.scheduler, spec.scheduler_params, where=f"{spec.source}: scheduler"
        )
        placements = place_instances(spec.instances, spec.tp * spec.pp, spec.gpus_per_node)
        self.engines: list[Engine] = []
        views = []
        watermark = int(spec.engine.watermark * self.capacity_blocks)
        for p in placements:
            kv = BlockManager(self.capacity_blocks, spec.engine.block_size, watermark)
            eng = Engine(self.env, p.instance, self.perf, kv, spec.engine, self._finished, log)
            self.engines.append(eng)
            views.append(EngineView(eng, p, "mixed"))
        self.view = ClusterView(views, lambda: self.env.now)
        plan = self.scheduler.setup(self.view)
        for inst_id, role in plan.roles.items():
            if not 0 <= inst_id < len(views):
                raise SpecError(f"scheduler {spec.scheduler!r}: setup names instance {inst_id}")
            if role != "mixed":
                raise SpecError(
                    f"scheduler {spec.scheduler!r}: role {role!r} for instance {inst_id}; "
                    "this cluster runs colocated instances only (role 'mixed')"
                )
        self._arrived = 0
        self.events = 0
        # Longest sequence that can always finish, even alone on an instance.
        self._max_blocks = self.capacity_blocks - watermark

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
            target = decision.prefill
            if not 0 <= target < len(self.engines) or decision.decode not in (None, target):
                raise SpecError(
                    f"scheduler {self.spec.scheduler!r}: route for request {req.id} names "
                    f"{decision}; instances are 0..{len(self.engines) - 1}, colocated"
                )
            self.engines[target].submit(Sequence(req, env.now))

    def _oversized(self, req: Request) -> bool:
        need = blocks_for(req.prompt_tokens + req.output_tokens - 1, self.spec.engine.block_size)
        if need <= self._max_blocks:
            return False
        if self.spec.oversized == "reject":
            self.metrics.reject(req, "exceeds_kv_capacity", self.env.now)
            return True
        spec = self.spec
        raise CapacityError(
            f"{spec.source}: request {req.id}: prompt {req.prompt_tokens} + output "
            f"{req.output_tokens} tokens need {need} KV blocks, but an instance of "
            f"{spec.model.name} (tp={spec.tp}, pp={spec.pp}) on {spec.gpu.name} holds "
            f"{self._max_blocks}; give instances more GPUs, or set engine.oversized: reject"
        )

    def _finished(self, s: Sequence) -> None:
        self.metrics.complete(s)

    # -- running ---------------------------------------------------------------------
    def run(self) -> Result:
        env = self.env
        env.process(self.arrive())
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
        return Result(self._header(), self.metrics.summary(), self._instance_stats())

    def _check_conservation(self) -> None:
        if self.metrics.ended != self._arrived:
            raise AssertionError(f"{self._arrived} requests arrived but {self.metrics.ended} ended")
        for e in self.engines:
            if e.kv.free != e.kv.total or e.running or e.waiting:
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
            "spec": dict(spec.resolved),
            "spec_sha256": spec.sha256,
            "trace_sha256": sources,
            "profile_sha256": self.perf.sha256,
            "perf_model": self.perf.name,
            "kv_blocks_per_instance": self.capacity_blocks,
        }

    def _instance_stats(self) -> list[dict[str, Any]]:
        span = self.metrics.last_end_s
        return [
            {
                "id": e.id,
                "iterations": e.iterations,
                "busy_s": e.busy_s,
                "utilization": e.busy_s / span if span > 0 else 0.0,
                "preemptions": e.preemptions,
                "peak_kv_blocks": e.kv.peak_used,
            }
            for e in self.engines
        ]
