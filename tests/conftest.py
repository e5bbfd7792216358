"""Shared test settings and fixture paths."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA_DIR = Path(__file__).parent / "data"
FIXTURE_DIR = DATA_DIR / "kermt_upstream"
SPLITS_DIR = DATA_DIR / "kermt_upstream_splits"


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    return FIXTURE_DIR
