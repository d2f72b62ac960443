"""A run's result as the readable table ``twin run`` prints."""

from __future__ import annotations

import math
from typing import Any

from twin.units import format_bytes


def _fmt(x: float | None, scale: float = 1.0, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x * scale:.{digits}f}"


def _name(entry: Any) -> str:
    return entry if isinstance(entry, str) else str(entry.get("name", "custom"))


def _group_text(g: dict[str, Any]) -> str:
    role = "" if g["role"] == "mixed" else f"{g['role']} "
    pp = f" PP{g['pp']}" if g["pp"] > 1 else ""
    moe = (f" DP{g['dp']}" if g.get("dp", 1) > 1 else "") + (
        f" EP{g['ep']}" if g.get("ep", 1) > 1 else ""
    )
    return f"{g['instances']} x {role}TP{g['tp']}{pp}{moe}"


def _topology_text(topo: Any) -> str:
    """A topology as the header names it: a bundled name or path as given, an
    inline mapping by its ``name`` (else "an inline topology")."""
    if isinstance(topo, dict):
        name = topo.get("name")
        return f"{name} (inline)" if name else "an inline topology"
    return str(topo)


# Rejections that say the requests can never be served as the spec stands.
_LIMITS = {
    "context_length": "longer than the context (engine.max_model_len or the model's)",
    "exceeds_kv_capacity": "more KV than an instance holds",
}


def run_warnings(summary: dict[str, Any]) -> list[str]:
    """What made a run degenerate, in words (DESIGN: every run states what
    shaped it): no request arrived, or none completed, with what ended them."""
    n, done = summary["requests"], summary["completed"]
    if n == 0:
        return ["no request arrived: the workload ended before its first request"]
    if done:
        return []
    why = dict(summary["rejected_by_reason"])
    why.update({f"failed: {k}": v for k, v in summary.get("failed_by_reason", {}).items()})
    for reason, words in _LIMITS.items():
        if why.get(reason) == n:
            return [f"no request completed: every one of the {n:,} requests is {words}"]
    ends = ", ".join(f"{k} {v:,}" for k, v in why.items())
    return [f"no request completed: of {n:,} requests, " + (ends or "none ended served")]


def limit_warnings(summary: dict[str, Any]) -> list[str]:
    """Requests some (not all) of which a limit turned away: the attainment
    they cap, in one line per limit."""
    n, done = summary["requests"], summary["completed"]
    if not n or not done:
        return []  # run_warnings says it
    out = []
    for reason, words in _LIMITS.items():
        k = summary["rejected_by_reason"].get(reason, 0)
        if k:
            out.append(
                f"a limit shaped this run: {k:,} of the {n:,} requests ({k / n:.1%}) are {words} "
                f"and were rejected, so SLO attainment cannot exceed {1 - k / n:.1%}"
            )
    return out


def trace_warnings(ran_out_s: float | None, duration_s: float | None) -> list[str]:
    """A trace that ran out before ``workload.duration``: the run's end saw no arrivals."""
    if ran_out_s is None or duration_s is None or ran_out_s >= duration_s:
        return []
    return [
        f"the trace ran out at {ran_out_s:.1f} s, before workload.duration {duration_s:g} s: "
        "nothing arrived after it (repeat: true loops the trace; a higher rate ends it sooner)"
    ]


def saturation_warnings(
    timeline: list[dict[str, Any]], first_fault_s: float | None, target: float
) -> list[str]:
    """A run that missed its SLO target before its first failure or
    degradation: what the failure did is mixed with an overload it did not
    cause. Judged on the requests that arrived in the windows ending by then."""
    if first_fault_s is None:
        return []
    before = [r for r in timeline if r["end_s"] <= first_fault_s]
    arrived = sum(r["arrived"] for r in before)
    met = sum(r["slo_met"] for r in before)
    if not arrived or met / arrived >= target:
        return []
    return [
        f"the system missed its SLO target before the first failure at {first_fault_s:g} s "
        f"({met / arrived:.1%} of the {arrived:,} requests that arrived before it met the SLO; "
        f"target {target:.0%}): the failure's effect is mixed with overload (lower the rate)"
    ]


def header_line(result: dict[str, Any]) -> str:
    """The first line of the summary: version, name, model, cluster, scheduler, perf model."""
    h = result["header"]
    spec = h["spec"]
    cl = spec["cluster"]
    gpu = _name(spec["gpu"])
    if "models" in spec:  # several models: each one's model, instances and policy
        ms = spec["models"]
        model = " + ".join(f"{n}: {_name(m['model'])}" for n, m in ms.items())
        sched = " + ".join(f"{n}: {m['scheduler']['name']}" for n, m in ms.items())
        shape = " + ".join(_group_text(g) for m in ms.values() for g in m["cluster"]["groups"])
    else:
        model, sched = _name(spec["model"]), spec["scheduler"]["name"]
        shape = " + ".join(_group_text(g) for g in cl["groups"])
    where = f" on {_topology_text(cl['topology'])}" if "topology" in cl else ""
    return (
        f"pd-twin {h['version']} | {spec['name']} | {model}, {shape} on {gpu}{where} | "
        f"scheduler {sched} | perf {h['perf_model']}"
    )


def _bounds(d: dict[str, Any] | None, scale: float) -> str:
    if d is None:
        return "-"
    hi = "inf" if d["hi"] is None else _fmt(d["hi"], scale)
    return f"{_fmt(0.0 if d['lo'] is None else d['lo'], scale)}-{hi}"


def interval_lines(iv: dict[str, Any]) -> list[str]:
    """The summary's block of prediction intervals (``summary["intervals"]``)."""
    lines = [
        "",
        f"{iv['coverage'] * 100:.0f}% prediction intervals (the perf model's error on "
        f"{iv['runs']} measured runs: {iv['source']})",
    ]
    for key, label, scale in (
        ("ttft_s", "TTFT (s)", 1.0),
        ("tpot_s", "TPOT (ms)", 1e3),
        ("e2e_s", "E2E (s)", 1.0),
    ):
        d = iv.get(key, {})
        lines.append(
            f"{label:14}"
            + "".join(f"{_bounds(d.get(q), scale):>18}" for q in ("mean", "p50", "p90", "p99"))
        )
    if iv.get("no_residuals"):
        lines.append(f"no residuals for {', '.join(iv['no_residuals'])}: no interval there")
    return lines


def slowdown_line(got: dict[str, Any], written: dict[str, Any]) -> str:
    """The line of a run with ``slo.slowdown``: each bounded percentile's slowdown
    against its bound (``written``: the resolved spec's ``slo.slowdown``), and
    whether all hold (:mod:`twin.sim.slowdown`)."""
    parts = []
    for metric, pcts in got.items():
        if metric == "met":
            continue
        for name, v in pcts.items():
            shown = "-" if v is None else f"{v:.2f}"
            parts.append(f"{metric} {name} {shown}/{written[metric][name]:g}")
    ref = f"{written['gpu']} TP{written.get('tp', 1)}"
    return f"slowdown vs {ref} alone ({'met' if got['met'] else 'MISSED'}): " + ", ".join(parts)


def class_lines(classes: dict[str, dict[str, Any]], of: str = "class") -> list[str]:
    """The summary's block of classes of traffic (or, ``of`` "model", of
    models): each one's priority (or GPU-seconds), requests, attainment
    against its own SLO, TTFT and TPOT p50/p99."""
    width = max(5, *(len(n) for n in classes))
    extra, w = ("prio", 4) if of == "class" else ("GPU-s", 7)
    lines = [
        f"{of:{width}} {extra:>{w}} {'requests':>9} {'SLO (TTFT, TPOT)':>18} "
        f"{'attained':>9} {'TTFT p50/p99 (s)':>17} {'TPOT p50/p99 (ms)':>18}",
    ]
    for name, c in classes.items():
        slo = c["slo"]
        ttft, tpot = c["ttft_s"], c["tpot_s"]
        t, p = slo["ttft_s"], slo["tpot_s"]
        goal = ("-" if t is None else f"{t:g} s") + ", " + ("-" if p is None else f"{p * 1e3:g} ms")
        lines.append(
            f"{name:{width}} {c.get('priority', _fmt(c.get('gpu_seconds'), 1, 0)):>{w}} "
            f"{c['requests']:>9,} {goal:>18} "
            f"{_fmt(c['slo_attainment'], 100, 1) + '%':>9} "
            f"{_fmt(ttft['p50']) + '/' + _fmt(ttft['p99']):>17} "
            f"{_fmt(tpot['p50'], 1e3, 1) + '/' + _fmt(tpot['p99'], 1e3, 1):>18}"
        )
    return lines


def format_summary(result: dict[str, Any]) -> str:
    """The readable table ``twin run`` prints."""
    s = result["summary"]
    spec = result["header"]["spec"]
    lines = [
        header_line(result),
        f"requests {s['requests']:,}  completed {s['completed']:,}  rejected {s['rejected']:,}"
        f"  simulated {s['simulated_s']:.1f} s  preemptions {s['preemptions']:,}",
        "",
        f"{'':14}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for key, label, scale in (
        ("ttft_s", "TTFT (s)", 1.0),
        ("tpot_s", "TPOT (ms)", 1e3),
        ("max_itl_s", "max ITL (ms)", 1e3),
        ("e2e_s", "E2E (s)", 1.0),
        ("queue_s", "queue (s)", 1.0),
    ):
        d = s[key]
        lines.append(
            f"{label:14}"
            + "".join(f"{_fmt(d[q], scale):>10}" for q in ("mean", "p50", "p90", "p99"))
        )
    slo = spec["slo"]
    att = s["slo_attainment"]
    iv = s.get("intervals")
    if iv is not None:
        lines += interval_lines(iv)
    att_iv = ""
    if iv is not None and "slo_attainment" in iv:
        a = iv["slo_attainment"]
        att_iv = f" [{_fmt(a['lo'], 100, 1)}, {_fmt(a['hi'], 100, 1)}]"
    goal = (
        "each request against its class's SLO"
        if "classes" in s
        else f"TTFT <= {slo['ttft'] or 'inf'}, TPOT <= {slo['tpot'] or 'inf'}"
    )
    lines += [
        "",
        f"SLO attainment {_fmt(att, 100, 1)}%{att_iv}  ({goal}; target {slo['target'] * 100:.0f}%)",
        f"throughput {_fmt(s['throughput_rps'], 1, 2)} req/s, "
        f"{_fmt(s['output_tokens_per_s'], 1, 0)} output tokens/s",
    ]
    if "classes" in s:
        lines += class_lines(s["classes"])
    if "models" in s:
        lines += class_lines(s["models"], "model")
    if "slowdown" in s:
        lines.append(slowdown_line(s["slowdown"], slo["slowdown"]))
    if s.get("kv_bytes_transferred") or s.get("kv_bytes_saved"):
        tr = s["transfer_s"]
        saved = s.get("kv_bytes_saved")
        lines.append(
            f"KV hand-off: {format_bytes(s['kv_bytes_transferred'])} moved"
            + (f", {format_bytes(saved)} saved (held by the decode side)" if saved else "")
            + f"; transfer after prefill p50 {_fmt(tr['p50'], 1e3)} ms, "
            f"p99 {_fmt(tr['p99'], 1e3)} ms"
        )
    if s["rejected_by_reason"]:
        reasons = ", ".join(f"{k}: {v}" for k, v in s["rejected_by_reason"].items())
        lines.append(f"rejected: {reasons}")
    if "failed" in s:  # a run with failures (events:, failures: or retry:)
        reasons = ", ".join(f"{k}: {v}" for k, v in s["failed_by_reason"].items())
        lines.append(
            f"failures: {s['retries']:,} retries, {s['lost_tokens']:,} KV tokens lost; "
            f"failed {s['failed']:,}" + (f" ({reasons})" if reasons else "")
        )
    rates = result["header"].get("trace_rate_rps")
    if rates:  # a trace replayed at its own times
        lines.append(
            f"trace: its own rate {rates['own']:.3g} req/s, replayed at "
            f"{rates['replayed']:.3g} req/s (workload.rate or rate_scale)"
        )
    lines += [f"warning: {w}" for w in s.get("warnings", ())]
    return "\n".join(lines)
