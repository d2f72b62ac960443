"""Spec builders shared by the tests."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any

from twin.sim.spec import ExperimentSpec, resolve_spec


def small_spec(*, rate: float = 4.0, requests: int = 200, **over: Any) -> ExperimentSpec:
    """Two colocated Llama-3.1-8B instances on H100, Azure-conversation lengths,
    Poisson arrivals; top-level keys in ``over`` replace the defaults."""
    data: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "gpu": "h100-sxm",
        "cluster": {"instances": 2, "tp": 1},
        "workload": {
            "lengths": "azure-conv",
            "arrival": {"process": "poisson", "rate": rate},
            "max_requests": requests,
        },
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }
    data.update(over)
    return resolve_spec(data, "test.yaml", Path.cwd())


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid``, from /proc (Linux)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def own_policies() -> list[str]:
    """The policies this project ships, sorted: the ``twin.schedulers`` entry
    points its pyproject.toml declares, each module imported (so registered).
    The entry points installed in the environment are not loaded: a user's
    plugin is not this suite's to hold to the contract, and one that fails
    to load must not stop the suite from being collected."""
    doc = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    declared = doc["project"]["entry-points"]["twin.schedulers"]
    for target in declared.values():
        importlib.import_module(target.partition(":")[0])
    return sorted(declared)
