"""Two ensemble members training at once: every epoch line of each member reaches the driver's output (Ray folds
lines that differ only in numbers, "[repeated 8x across cluster]", unless they are exempt: ray_app/__init__.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import ray_app
from tests.conftest import DATA_DIR, FIXTURE_DIR
from tests.ray_app.common.test_worker_fit import write_sample

ROOT = DATA_DIR.parents[1]
EPOCHS = 10


def test_progress_lines_match_the_exempt_pattern():
    for line in ("[fold 0 model 1] epoch    3  loss_train 0.1", "[trial 8f3a_00002] starting epoch 0: 1 worker(s)",
                 "[fold 1 model 0] resuming at epoch 4: 2 worker(s) on 1 node(s) (127.0.0.1)"):
        assert re.search(ray_app.PROGRESS_LINE, line)
    assert not re.search(ray_app.PROGRESS_LINE, "(raylet) a warning [repeated 3x across cluster]")


@pytest.mark.slow
def test_every_epoch_line_of_two_concurrent_members_reaches_the_driver(ray_cluster, tmp_path):
    import ray

    data = write_sample(tmp_path / "data.csv", 40)
    command = [sys.executable, "-m", "ray_app.cli", "finetune", "--data_path", str(data),
               "--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"), "--save_dir", str(tmp_path / "run"),
               "--epochs", str(EPOCHS), "--batch_size", "16", "--ffn_hidden_size", "8", "--ensemble_size", "2",
               "--max_concurrent_trials", "2", "--address", ray.get_runtime_context().gcs_address]
    env = {k: v for k, v in os.environ.items() if k != "RAY_DEDUP_LOGS_ALLOW_REGEX"}  # what a user's shell has
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    shown = {(int(m[1]), int(m[2])) for m in re.finditer(r"\[fold 0 model (\d)\] epoch +(\d+) ", run.stdout)}
    assert shown == {(member, epoch) for member in (0, 1) for epoch in range(EPOCHS)}, run.stdout[-3000:]
    assert "repeated" not in "\n".join(line for line in run.stdout.splitlines() if " epoch " in line)
