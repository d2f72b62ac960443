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

Extension points, each with the module that defines it:

- a scheduling policy: ``@register("name")`` or the ``twin.schedulers``
  entry-point group (``twin/scheduler.py``; ``schedulers/`` for examples),
  with optional hooks ``pick_decode``, ``tick`` (returning ``SetRole``,
  ``AddInstance``, ``RemoveInstance``: scaling, ``twin/sim/scaling.py``) and
  ``on_event`` (told of each fault, ``twin/sim/faults.py``);
- a queue policy inside an instance: ``@register_queue_policy`` or the
  ``twin.queue_policies`` group (``twin/serving/queuepolicy.py``);
- faults: the spec's ``events:`` timeline, ``failures.random`` (``mtbf``) and
  ``retry:`` policy (``twin/sim/faults.py``; composed health in
  ``twin/sim/health.py``);
- KV tiers and pools below HBM: the spec's ``kv_tiers`` and ``kv_pool``
  (``twin/serving/tiers.py``, ``twin/serving/kvpool.py``);
- a performance model: any object with ``iteration_time(batch) -> seconds``,
  ``name`` and ``sha256``, given as ``Simulation(spec, perf=...)``
  (``twin/perf/iteration.py``), or the spec's ``perf:`` section
  (``twin/perf/build.py``); a model or GPU of the catalogs is one cited data
  file (``twin/data/models/``, ``twin/data/gpus/``, read by
  ``twin/perf/catalogs.py``);
- a workload: a trace file (``twin/workload/traces.py``), a length table or
  distribution (``twin/workload/lengths.py``), an arrival process and a rate
  schedule (``twin/workload/arrivals.py``, ``twin/workload/schedule.py``),
  or sessions of turns sent closed loop (``twin/workload/sessions.py``,
  ``twin/sim/sessions.py``);
- a KV retention policy between a session's turns: the spec's
  ``engine.session_retention``, or any object with ``decide(session)``
  given as ``Simulation(spec, retention=...)`` (``twin/workload/sessions.py``);
- an observer (``twin/serving/observer.py``) and a topology file
  (``topologies/README.md``, ``twin/net/topofile.py``).

Layout: every package and module (``tests/test_reading_guide.py`` fails when
one is missing here, or named here and gone)::

    twin/
      __init__.py              the public face and this guide
      errors.py units.py       the one exception hierarchy; "400 Gbps" -> SI floats
      _check.py yamlio.py      shared validators; YAML 1.2, no duplicate keys
      _io.py _progress.py      files read and written as every command does; progress
      _declare.py _clock.py    declared spec sections; events at absolute times
      _threads.py _version.py  one BLAS thread; the version and the source's sha256
      bundled.py               bundled experiments and topologies by name; the data folder
      request.py scheduler.py  the request; the policy API (views, decisions, registry)
      testing.py               hand-built views and check_scheduler, for policy tests
    twin/data/
      __init__.py              shipped files: models/ and gpus/ (one cited file per
                               catalog entry), length tables, the vllm residuals
    twin/perf/                 how long a forward pass takes
      __init__.py iteration.py   the interface: Batch -> seconds
      llm.py gpus.py catalogs.py   model shapes and KV bytes; GPUs; the catalogs' files
      hfconfig.py kvreport.py  shapes from a config.json; what twin kv prints
      roofline.py presets.py   the analytical model; its calibrated defaults
      moe.py terms.py          mixture of experts (experts, all-to-alls); term checks
      tables.py build.py       measured profile tables and DistServe's fit; perf: -> a model
      vllm.py residuals.py     the vllm preset; prediction intervals
      validate.py calibrate.py fit_profile.py   checked and fitted against profiles
      profile.py               twin profile: a table measured with PyTorch
      kernel_fit.py            a GPU's shares of peak fitted to measured kernels
    twin/net/                  the network
      __init__.py topology.py  the graph: paths, injection, bisection
      topofile.py explicit.py topodef.py   the two YAML forms and what they share
      report.py                what twin topo prints
      flows.py transfer.py     the flow-level network; flows and transfers
      maxmin.py linkfaults.py  max-min fair filling; failed and degraded links
      whatif.py shards.py      what flows started now would get; a hand-off's shard flows
    twin/workload/             what arrives
      __init__.py stream.py    the workload: section -> the request stream
      traces.py lengths.py     trace readers; length distributions and tables
      arrivals.py schedule.py  Poisson and Gamma arrivals; rate schedules
      measured.py inference_perf.py shared_prefix.py   real runs' records; inference-perf
      classes.py records.py    classes of traffic; one request as a trace gives it
      columns.py               a trace's column of names: a request's class, its model
      sessions.py              sessions of turns, closed loop; KV retention's choices
    twin/serving/              one instance and what moves between instances
      __init__.py engine.py    continuous batching, one event per iteration
      lanes.py plan.py decodebatch.py   its loops; an iteration's plan; the decode batch
      config.py ports.py       the engine: section; what collaborators see of an engine
      faults.py holding.py prefixunits.py   speed and failure; the KV a sequence holds; prefix units
      sending.py receiving.py  the two sides of a KV hand-off
      fastforward.py pipeforward.py   closed-form jumps over quiet stretches
      speculative.py           speculative decoding: drafts verified at once
      sequence.py queuepolicy.py queuecost.py   a request's state; queue order; its cost
      kvcache.py tiers.py kvpool.py   KV blocks and prefix cache; tiers; node pools
      handoff.py cluster.py    the KV hand-off; placement and the live views
      fabric.py abandon.py     the fabric in the router's view; requests given up
      retention.py             a session's KV let go between its turns
      observer.py              what a run reports as it happens
    twin/sim/                  one run
      __init__.py spec.py layout.py   specs; where instances run
      build.py ops.py          the pure build of a cluster; what faults and scaling may do
      simulation.py control.py   wiring and driving a run; roles and ticks
      faults.py health.py scaling.py   faults and recovery; composed health; scaling
      timeouts.py sessions.py  client time-outs (workload.timeout); sessions' turns sent
      result.py                what a run returns: Result and its Summary
      metrics.py summary.py intervals.py   streaming summaries; the table; intervals
      classmetrics.py distribution.py   summaries per class; one latency's distribution
      fleet.py fleetspec.py    several models: their requests, views, limits; models:
      slowdown.py keypath.py   slowdown objectives; KEY.0.KEY paths of --set and sweeps
      timeline.py trace.py frames.py   results over time; the event log; data frames
    twin/studies/              many runs
      __init__.py sweep.py sweepdata.py workers.py   sweeps, their folders, workers
      goodput.py goodput_interval.py samples.py   goodput, its interval, sample sizes
      goodput_classes.py       goodput per class of traffic
      compare.py planner.py provision.py export.py   policies side by side; planning
      handoff.py bench.py catalog.py   the idle hand-off; twin bench; what ships
      validate_run.py realrun.py validate_realrun.py runmetrics.py runresiduals.py
      replay.py fidelity.py moe_fidelity.py calibrate_runs.py benchrun.py   against data
      runs.py                  measured runs read, whatever their kind
      kernel_table.py          measured kernel tables read and fitted
    twin/viz/                  pictures (matplotlib only here)
      __init__.py plots.py canvas.py style.py   a sweep folder's figures; shared parts
      attainment.py goodput.py cdf.py   attainment vs rate; goodput bars; CDFs
      timeline.py overtime.py kvtiers.py compare.py knees.py   runs and compare runs
      report.py topology.py    the HTML sweep report; topology drawings
    twin/cli/                  twin ..., a module per command group
      __init__.py __main__.py _common.py examples.py   the parser, main, shared flags
      run.py describe.py validate.py plan.py sweep.py plot.py bench.py
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
    from twin.sim.result import Result
    from twin.sim.simulation import Simulation, run
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
    "Result": "twin.sim.result",
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
