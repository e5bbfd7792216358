"""Shared test settings and fixture paths."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

DATA_DIR = Path(__file__).parent / "data"
FIXTURE_DIR = DATA_DIR / "kermt_upstream"
SPLITS_DIR = DATA_DIR / "kermt_upstream_splits"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for Ray processes that tests start themselves)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    return FIXTURE_DIR
