"""Shared fixtures. Real public data lives beside the project in ../shared/data
(or wherever TWIN_DATA points); tests that need it skip when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path | None:
    env = os.environ.get("TWIN_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "data")
    for c in candidates:
        if c.is_dir():
            return c
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    d = shared_data_dir()
    if d is None:
        pytest.skip("real public data not found: set TWIN_DATA or place it at ../shared/data")
    return d


@pytest.fixture
def tiny_plan_spec():
    """A one-node split spec small enough for the DistServe planner in seconds."""
    from twin.sim.spec import resolve_spec

    data = {
        "model": "llama-3.1-8b",
        "cluster": {"topology": "dgx-h100-ib400", "nodes": 1, "prefill": 1, "decode": 1},
        "workload": {"lengths": "azure-conv", "arrival": {"process": "poisson", "rate": 1},
                     "max_requests": 40},
        "engine": {"max_num_seqs": 16},
        "slo": {"ttft": "1 s", "tpot": "50 ms"},
    }  # fmt: skip
    return resolve_spec(data, "plan.yaml", Path.cwd())
