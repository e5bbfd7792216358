"""One local Ray cluster for the whole ray_app test session (starting one costs ~10 s), and the real runs that tests
in several folders read."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

# Set before ray is imported anywhere: test-friendly Ray behaviour (see ../shared/docs/ray-notes.md §7).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "300")
os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from ray_app.common.cluster import connect, count_as_joined

    # 5 logical CPUs on a 2-core machine: 2 train workers plus Ray Data tasks must never starve each other, and
    # one CPU of headroom: Ray 2.60 can leave an actor of a finished Ray Data pool holding its CPU when the pool is
    # shut down while that actor is still being created ('Mismatched ActorID: ignoring KillActor ... NIL_ID' in the
    # worker's log; seen after test_reconstruct's 2-actor run), and the serve tests' two applications need 4.
    resources = connect(num_cpus=5, object_store_mb=256)
    # it stands for a user's running cluster: `--engine auto` streams small inputs on it, as it would on theirs
    # (a cluster a command started for itself would not count: ray_app.screening.engines)
    count_as_joined()
    yield resources
    ray.shutdown()


@pytest.fixture(scope="session")
def tune_sweep(ray_cluster, tmp_path_factory):
    """The one real `kermt tune` sweep that tests/ray_app/tune and tests/ray_app/report read (each ran its own)."""
    from tests.ray_app.tune.sweeps import run_shared_sweep

    return run_shared_sweep(tmp_path_factory.mktemp("shared_sweep"))


@pytest.fixture(scope="session")
def regression_run(ray_cluster, tmp_path_factory) -> tuple[Path, str]:
    """A finished tiny finetune (save_dir, what it printed) that the report and resume tests read: 120 molecules of
    the demo file and one invalid row, 2 tasks, 2 members calibrated on a 40 % validation split, 1 epoch, the fixture
    pretrain checkpoint. Read, never changed: a test that moves things works on a copy."""
    from tests.ray_app.finetune.tiny_runs import demo_rows, tiny_finetune

    base = tmp_path_factory.mktemp("report_regression")
    rows = demo_rows(120)
    rows.insert(7, ["not_a_smiles", "1.0", "0.5"])  # an invalid row the data summary counts
    with open(base / "data.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    _, out = tiny_finetune(base / "run", base / "data.csv", "--ensemble_size", "2",
                           "--split_sizes", "0.4", "0.4", "0.2")
    return base / "run", out
