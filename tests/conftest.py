"""Shared test settings and fixture paths.

Ray is configured by hundreds of environment variables (``RAY_DEDUP_LOGS=0`` is a common debugging setting), read
when ``ray`` is imported and inherited by every process a test starts. The suite's assertions are about Ray's
defaults plus the settings the app and the tests choose themselves (tests/ray_app/conftest.py), so the variables
a user exported are taken out of this process's environment here, before anything imports ray, and the session's
header names them. Tests that check how the app treats a user's own setting set it themselves.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

DATA_DIR = Path(__file__).parent / "data"
FIXTURE_DIR = DATA_DIR / "kermt_upstream"
SPLITS_DIR = DATA_DIR / "kermt_upstream_splits"

# Ray's, Ray Tune's and Ray AIR's variables. RAY_TMPDIR only says where Ray writes (a short path for its sockets,
# a disk with room), never what a test sees, so a user's stays.
RAY_VARIABLE_PREFIXES = ("RAY_", "TUNE_", "AIR_")
KEPT_RAY_VARIABLES = frozenset({"RAY_TMPDIR"})


def _drop_users_ray_variables() -> dict[str, str]:
    dropped = {key: value for key, value in os.environ.items()
               if key.upper().startswith(RAY_VARIABLE_PREFIXES) and key not in KEPT_RAY_VARIABLES}
    for key in dropped:
        del os.environ[key]
    return dropped


USERS_RAY_VARIABLES = _drop_users_ray_variables()

# One torch (OpenMP) thread in this process and every process it starts (Ray's workers too), set before anything
# imports torch. The suite's models are tiny and its processes share 2 cores with Ray's: a second thread gains no
# wall time on an idle machine (a 2-epoch member fit: 0.37 s on two threads, 0.36 s on one) and spins for as long
# as it waits, so beside other busy processes the same fit took 1.9 s against 0.43 s, and three in-process test
# files 190 s against 56 s (tests/kermt/{data/test_molecule_shards,nn/pretrain/test_generate,train/test_loop}.py).
# The app's own drivers choose their thread count themselves (ray_app.common.torch_threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_report_header() -> str | None:
    if not USERS_RAY_VARIABLES:
        return None
    names = " ".join(f"{key}={value}" for key, value in sorted(USERS_RAY_VARIABLES.items()))
    return f"Ray variables from your environment, not used by these tests (tests/conftest.py says why): {names}"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for Ray processes that tests start themselves)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Under pytest-xdist (`pytest -n N --dist loadgroup`, docs/getting-started.md#the-tests) each test file runs whole
# on one worker, as with --dist loadfile, so its module fixtures are built once. Two kinds of file share more than a
# module: the serve tests share one Serve application (and one HTTP proxy) per Ray session, and the tune and report
# tests read one session-wide `kermt tune` sweep; each kind runs on one worker so that its Serve app and its sweep
# exist once. Every xdist worker starts its own local Ray cluster.
SHARED_SESSION_GROUPS = {"serve": "tests/ray_app/serve/", "tune_sweep": "tune_sweep"}


def _xdist_groups(items: list[pytest.Item]) -> dict[str, str]:
    """Each test file's group: its own path, or the shared-session group of any of its tests."""
    groups: dict[str, str] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path.startswith(SHARED_SESSION_GROUPS["serve"]):
            groups[path] = "serve"
        elif SHARED_SESSION_GROUPS["tune_sweep"] in getattr(item, "fixturenames", ()):
            groups[path] = "tune_sweep"
        else:
            groups.setdefault(path, path)
    return groups


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    groups = _xdist_groups(items)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid.split("::", 1)[0]]))
    # the shared groups are the largest: handed out first (to xdist's workers), they do not leave one worker busy
    # at the end
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: groups[item.nodeid.split("::", 1)[0]] not in SHARED_SESSION_GROUPS)


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    return FIXTURE_DIR
