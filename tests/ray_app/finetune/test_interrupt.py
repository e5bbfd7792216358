"""Ctrl-C on a real `kermt finetune` driver (a subprocess attached to the test cluster): one line, exit 130, and the
same command resumes the run."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from ray_app.cli import main
from tests.conftest import DATA_DIR, FIXTURE_DIR

ROOT = DATA_DIR.parents[1]
# enough epochs that the run is still training when Ctrl-C follows its first checkpoint (the first run stops there
# and the re-run trains the rest in this test's time)
EPOCHS = 10


@pytest.fixture
def small_csv(tmp_path):
    with open(ROOT / "data/sample/admet_demo.csv") as f:
        rows = list(csv.reader(f))[:81]
    path = tmp_path / "small.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def test_ctrl_c_stops_with_one_line_and_the_same_command_resumes(ray_cluster, small_csv, tmp_path, capsys):
    import ray

    save_dir = tmp_path / "run"
    argv = ["finetune", "--data_path", str(small_csv), "--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"),
            "--save_dir", str(save_dir), "--epochs", str(EPOCHS), "--batch_size", "16", "--ffn_hidden_size", "16"]
    command = [sys.executable, "-m", "ray_app.cli", *argv, "--address", ray.get_runtime_context().gcs_address]
    with open(tmp_path / "stderr.txt", "w") as stderr, open(tmp_path / "stdout.txt", "w") as stdout:
        driver = subprocess.Popen(command, cwd=ROOT, env=os.environ.copy(), stdout=stdout, stderr=stderr)
        deadline = time.monotonic() + 300
        epoch_checkpoints = "*-fold0-model0/checkpoint_*/training_state.pt"  # Ray Train's, one per epoch
        while not list((save_dir / "ray_results").glob(epoch_checkpoints)):
            assert driver.poll() is None and time.monotonic() < deadline, "the run ended or stalled before epoch 0"
            time.sleep(0.2)
        driver.send_signal(signal.SIGINT)
        assert driver.wait(timeout=120) == 130
    err, out = (tmp_path / "stderr.txt").read_text(), (tmp_path / "stdout.txt").read_text()
    assert "Traceback" not in err and "Tuner.restore" not in err
    # the first line says where everything lands; Ray's lines about its own bookkeeping are not shown
    assert out.splitlines()[0] == (f"outputs: {save_dir} (the report, {save_dir / 'report.html'}, is written when "
                                   "the run ends)"), out
    for noise in ("Configuration for experiment", "View detailed results", "tensorboard --logdir",
                  "Checkpoint successfully created", "Progress bars disabled"):
        assert noise not in out + err, f"{noise!r} in the driver's output:\n{out}\n{err}"
    advice = (f"kermt finetune: interrupted; finished models and each member's last epoch are kept in {save_dir} "
              f"and {save_dir / 'ray_results'}; re-run the same command to resume")
    assert advice in err.splitlines()  # Ray may still forward a worker's log line after it
    assert not (save_dir / "fold_0" / "test_result.csv").exists()
    assert "no finished member: learning curves not recorded" in (save_dir / "report.html").read_text()

    capsys.readouterr()
    assert main(argv) == 0  # the same command: resumes from the kept epoch and finishes
    resumed = capsys.readouterr().out
    # from the interrupted run's last checkpoint, not from scratch (on a loaded machine the member may have trained
    # every epoch before Tune stopped it: then it resumes at EPOCHS and trains nothing again)
    resumed_at = re.search(r"\[fold 0 model 0\] resuming at epoch (\d+)", resumed)
    assert resumed_at and 1 <= int(resumed_at[1]) <= EPOCHS, resumed[-4000:]
    with open(save_dir / "fold_0" / "model_0" / "metrics.csv") as f:
        epochs = [int(row["epoch"]) for row in csv.DictReader(f)]
    assert epochs == list(range(EPOCHS))
    assert (save_dir / "fold_0" / "test_result.csv").exists()
