"""pd-twin: a digital twin of an LLM serving cluster.

Run an experiment and read its numbers::

    import twin

    result = twin.run("quickstart")                     # a bundled name or a YAML path
    result = twin.run({"model": "llama-3.1-8b",         # or a spec as a mapping
                       "workload": {"lengths": "azure-conv",
                                    "arrival": {"process": "poisson", "rate": 4}}})
    result.summary["slo_attainment"]
    result.requests                                     # pandas DataFrames (pd-twin[data])
    twin.load_sweep("out/pool-ratio")                   # a sweep folder's runs

Write a policy against :mod:`twin.scheduler` (``@twin.register("mine")``, the
:class:`Route`/:class:`Reject` decisions, the read-only :class:`ClusterView`)
and check it with :func:`twin.testing.check_scheduler`; listen to a run with an
:class:`Observer` (``twin.run(spec, observers=[...])``).

Reading guide: start with these files, in this order.

1. ``twin/request.py`` and ``twin/scheduler.py``: what a request is and the
   policy API (decisions, views, the registry); ``schedulers/`` holds the
   bundled policies, written only against it.
2. ``twin/sim/spec.py``: the experiment spec, YAML in, a resolved spec out.
3. ``twin/sim/build.py``: the cluster built complete from a resolved spec
   (network, KV pools and tiers, hand-off, engines, the router's view);
   ``twin/sim/simulation.py``: how a run drives it (arrivals, routing, the
   control loop of ``twin/sim/control.py``; failures and scaling act through
   ``twin/sim/ops.py``'s protocol), and what it returns.
4. ``twin/serving/engine.py``: one instance's continuous batching, one event
   per iteration, planned by ``twin/serving/plan.py``, its decodes kept by
   ``twin/serving/decodebatch.py``; ``twin/serving/fastforward.py`` jumps
   over quiet decode stretches in closed form (``twin/serving/pipeforward.py``
   over every pipeline lane's at once); ``twin/serving/handoff.py`` moves KV
   from prefill to decode over ``twin/net/flows.py``'s max-min shared links.
5. ``twin/perf/iteration.py``: the iteration-time interface, and its models in
   ``twin/perf/roofline.py`` and ``twin/perf/tables.py``.
6. ``twin/serving/observer.py``: what a run reports as it happens; the metrics
   (``twin/sim/metrics.py``), the event log and the Chrome trace
   (``twin/sim/trace.py``) subscribe to it.

The layers, each importing only those below it (checked by ``lint-imports``):
``cli`` -> ``studies`` | ``viz`` -> ``sim`` -> ``serving`` -> ``net`` ->
``perf`` | ``workload`` -> ``scheduler`` -> ``request`` -> base (``errors``,
``_declare``, ``_check``, ``_clock``, ``yamlio``, ``bundled``, ``units``).

Extension points: a scheduling policy (``@register`` or the
``twin.schedulers`` entry-point group), a queue policy inside an instance
(``@register_queue_policy`` or ``twin.queue_policies``), a performance model (any object with
``iteration_time(batch) -> seconds``, ``name`` and ``sha256``, given as
``Simulation(spec, perf=...)``), an observer, a topology file
(``topologies/README.md``) and a trace file (``twin/workload/traces.py``).
"""

from typing import TYPE_CHECKING, Any

from twin._version import code_sha256

if TYPE_CHECKING:
    from twin._version import __version__
    from twin.bundled import find_data_dir
    from twin.errors import SpecError, TwinError
    from twin.net.topology import Topology, load_topology
    from twin.perf.gpus import get_gpu
    from twin.perf.llm import get_model
    from twin.request import Request
    from twin.scheduler import (
        ClusterView,
        FabricView,
        HandoffEstimate,
        InstanceView,
        LinkLoad,
        Objectives,
        PicksDecode,
        Plan,
        Reject,
        Role,
        Route,
        Scheduler,
        SetRole,
        Ticks,
        register,
        require_split,
    )
    from twin.serving.observer import Observer
    from twin.serving.queuepolicy import PicksVictim, Queued, QueuePolicy, register_queue_policy
    from twin.sim.metrics import REQUEST_COLUMNS
    from twin.sim.simulation import Result, Simulation, run
    from twin.sim.spec import ExperimentSpec, load_spec, read_spec
    from twin.sim.summary import format_summary
    from twin.sim.trace import EventLog, TraceRecorder, write_chrome_trace
    from twin.studies.compare import run_compare
    from twin.studies.goodput import goodput
    from twin.studies.handoff import handoff_estimate
    from twin.studies.sweep import Executor, run_sweep
    from twin.studies.sweepdata import load_sweep

# name -> the module that defines it; imported on first use, so that `import twin`
# (and every `import twin.x`) stays cheap and the CLI starts fast.
_LAZY = {
    "ClusterView": "twin.scheduler",
    "EventLog": "twin.sim.trace",
    "Executor": "twin.studies.sweep",
    "ExperimentSpec": "twin.sim.spec",
    "FabricView": "twin.scheduler",
    "HandoffEstimate": "twin.scheduler",
    "InstanceView": "twin.scheduler",
    "LinkLoad": "twin.scheduler",
    "Objectives": "twin.scheduler",
    "Observer": "twin.serving.observer",
    "PicksVictim": "twin.serving.queuepolicy",
    "Queued": "twin.serving.queuepolicy",
    "QueuePolicy": "twin.serving.queuepolicy",
    "PicksDecode": "twin.scheduler",
    "Plan": "twin.scheduler",
    "REQUEST_COLUMNS": "twin.sim.metrics",
    "Reject": "twin.scheduler",
    "Request": "twin.request",
    "Result": "twin.sim.simulation",
    "Role": "twin.scheduler",
    "Route": "twin.scheduler",
    "Scheduler": "twin.scheduler",
    "SetRole": "twin.scheduler",
    "Simulation": "twin.sim.simulation",
    "SpecError": "twin.errors",
    "Ticks": "twin.scheduler",
    "Topology": "twin.net.topology",
    "TraceRecorder": "twin.sim.trace",
    "TwinError": "twin.errors",
    "__version__": "twin._version",
    "find_data_dir": "twin.bundled",
    "format_summary": "twin.sim.summary",
    "get_gpu": "twin.perf.gpus",
    "get_model": "twin.perf.llm",
    "goodput": "twin.studies.goodput",
    "handoff_estimate": "twin.studies.handoff",
    "load_spec": "twin.sim.spec",
    "load_sweep": "twin.studies.sweepdata",
    "load_topology": "twin.net.topology",
    "read_spec": "twin.sim.spec",
    "register": "twin.scheduler",
    "register_queue_policy": "twin.serving.queuepolicy",
    "require_split": "twin.scheduler",
    "run": "twin.sim.simulation",
    "run_compare": "twin.studies.compare",
    "run_sweep": "twin.studies.sweep",
    "write_chrome_trace": "twin.sim.trace",
}


__all__ = [
    # running
    "run",
    "load_spec",
    "read_spec",
    "ExperimentSpec",
    "Simulation",
    "Result",
    "format_summary",
    "REQUEST_COLUMNS",
    # policies
    "register",
    "Scheduler",
    "PicksDecode",
    "Ticks",
    "require_split",
    "Request",
    "Route",
    "Reject",
    "Plan",
    "SetRole",
    "Role",
    "ClusterView",
    "InstanceView",
    "Objectives",
    "FabricView",
    "HandoffEstimate",
    "LinkLoad",
    "register_queue_policy",
    "QueuePolicy",
    "PicksVictim",
    "Queued",
    # listening
    "Observer",
    "EventLog",
    "TraceRecorder",
    "write_chrome_trace",
    # studies
    "run_sweep",
    "load_sweep",
    "Executor",
    "goodput",
    "run_compare",
    "handoff_estimate",
    # catalogs and data
    "get_model",
    "get_gpu",
    "load_topology",
    "Topology",
    "find_data_dir",
    # errors and provenance
    "TwinError",
    "SpecError",
    "__version__",
    "code_sha256",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'twin' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
