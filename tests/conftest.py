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
