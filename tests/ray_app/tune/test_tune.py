"""`kermt tune` on a real local Ray cluster: the shared sweep, its outputs, replay of the best trial, resume."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kermt.checkpoint import read_checkpoint
from ray_app.finetune.config import resolve
from ray_app.finetune.run import run_finetune
from ray_app.tune.command import main
from ray_app.tune.trial import trial_config
from tests.conftest import DATA_DIR
from tests.ray_app.tune.sweeps import SHARED_CONCURRENCY, SHARED_TRIALS, read_trials, sweep_argv, write_inputs

ROOT = DATA_DIR.parents[1]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    """80 molecules of the sample data (3 regression tasks) and the search space of sweeps.py."""
    return write_inputs(tmp_path_factory.mktemp("tune_inputs"))


@pytest.fixture
def sweep(tune_sweep) -> tuple[Path, list[str]]:
    """The session's shared sweep (tests/ray_app/conftest.py; the report tests read it too)."""
    return tune_sweep.save_dir, tune_sweep.argv


def test_sweep_records_every_trial_and_picks_the_best(sweep):
    save_dir, _ = sweep
    rows = read_trials(save_dir)
    assert len(rows) == SHARED_TRIALS and {r["status"] for r in rows} == {"completed"}
    objective = "objective (val_rmse, min)"
    best = min(rows, key=lambda r: float(r[objective]))
    summary = json.loads((save_dir / "sweep.json").read_text())
    assert summary["best_trial"] == best["trial_id"] and summary["best_objective"] == float(best[objective])
    for row in rows:  # the trial trained with its sampled parameters and the derived learning rates
        config = yaml.safe_load((save_dir / "trials" / row["trial_id"] / "config.yaml").read_text())
        max_lr = float(row["max_lr"])
        assert config["max_lr"] == max_lr and math.isclose(config["init_lr"], max_lr / 10)
        assert math.isclose(config["final_lr"], max_lr / float(row["final_lr_factor"]))
        assert (row["attn_out"] != "") == (row["self_attention"] == "True")
        assert config["self_attention"] == (row["self_attention"] == "True")
        assert float(row["test_rmse"]) > 0
        # each trial's TensorBoard events (tensorboard --logdir SAVE_DIR/trials compares them) hold its epochs
        events = EventAccumulator(str(save_dir / "trials" / row["trial_id"])).Reload()
        assert [e.step for e in events.Scalars("rmse_val")] == [0, 1]
        assert min(e.value for e in events.Scalars("rmse_val")) == pytest.approx(float(row[objective]), abs=1e-6)
    assert read_checkpoint(save_dir / "best_model").spec.kind == "finetuned"
    assert max_overlap(save_dir) <= SHARED_CONCURRENCY
    # fold 0's split was put in the object store once: every trial scored its test split from that one object
    objects = {json.loads((save_dir / "trials" / r["trial_id"] / "result.json").read_text())["splits_object"]
               for r in rows}
    assert len(objects) == 1


def max_overlap(save_dir: Path) -> int:
    """Most trials running at the same moment, from each trial's start and end times as Tune recorded them."""
    from ray import tune

    spans = []
    for trial in tune.ExperimentAnalysis(str(save_dir / "tune")).trials:
        end = trial.last_result["timestamp"]
        spans.append((end - trial.last_result["time_total_s"] + 1.0, end))  # timestamps are whole seconds
    return max(sum(start < t <= end for start, end in spans) for _, t in spans)


def test_best_config_replays_the_best_trial(sweep):
    save_dir, _ = sweep
    summary = json.loads((save_dir / "sweep.json").read_text())
    config, sources = resolve(["--config", str(save_dir / "best_config.yaml")])
    assert (config.num_folds, config.ensemble_size) == (1, 1)
    replay = run_finetune(config, sources)
    with open(Path(config.save_dir) / "fold_0/model_0/metrics.csv") as f:
        best_val = min(float(r["val_rmse"]) for r in csv.DictReader(f))
    assert best_val == pytest.approx(summary["best_objective"], rel=0, abs=1e-9)
    assert replay["overall_random_test_rmse"] == pytest.approx(summary["best_test_rmse"], rel=0, abs=1e-9)


def test_rerunning_a_finished_sweep_trains_nothing(sweep):
    save_dir, argv = sweep
    stamps = {p: p.stat().st_mtime_ns for p in (save_dir / "trials").glob("*/model.pt")}
    wall_s = json.loads((save_dir / "sweep.json").read_text())["wall_s"]
    assert main(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in (save_dir / "trials").glob("*/model.pt")} == stamps
    assert len(read_trials(save_dir)) == SHARED_TRIALS
    # the sweep's wall time counts every session: this one's (seconds) adds to the training's, never replaces it
    assert wall_s < json.loads((save_dir / "sweep.json").read_text())["wall_s"] < wall_s + 60


def test_every_trial_failing_is_an_error_with_the_first_traceback(ray_cluster, inputs, tmp_path, capsys):
    space = tmp_path / "bad.yaml"  # max_lr below the default init_lr 1e-4: every trial's settings are invalid
    space.write_text(yaml.safe_dump({"max_lr": {"choice": [1e-5, 2e-5]}}))
    argv = sweep_argv(inputs, tmp_path / "tune", n_trials=2, concurrent=2)
    argv[argv.index("--search_space") + 1] = str(space)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "kermt tune: error: no trial completed (2 of 2 failed)" in err
    assert 'tune/trial.py", line' in err and "init_lr 0.0001 must not exceed max_lr" in err  # the trial's traceback


def test_trial_settings_are_validated():
    from ray_app.finetune.config import FinetuneConfig

    base = FinetuneConfig(data_path="d.csv")
    assert trial_config(base, {"max_lr": 2e-3, "final_lr_factor": 4}).final_lr == 5e-4
    with pytest.raises(ValueError, match="dropout: Input should be less than 1"):
        trial_config(base, {"dropout": 1.2})


@pytest.mark.slow
def test_interrupted_sweep_resumes_only_the_remaining_trials(ray_cluster, inputs, tmp_path):
    """Kill the driver (SIGKILL) once 2 trials finished; the same command then runs only what is left."""
    import ray

    save_dir = tmp_path / "tune"
    argv = sweep_argv(inputs, save_dir, n_trials=4, concurrent=2)
    command = [sys.executable, "-m", "ray_app.cli", "tune", *argv, "--address", ray.get_runtime_context().gcs_address]
    driver = subprocess.Popen(command, cwd=ROOT, env=os.environ.copy(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 480
    while len(finished := sorted((save_dir / "trials").glob("*/result.json"))) < 2:
        assert driver.poll() is None and time.monotonic() < deadline, "the sweep ended or stalled before 2 trials"
        time.sleep(0.5)
    driver.kill()
    driver.wait()
    before = {p.parent.name: (p.stat().st_mtime_ns, (p.parent / "model.pt").stat().st_mtime_ns) for p in finished}
    assert len(before) >= 2

    assert main(argv) == 0
    rows = read_trials(save_dir)
    assert len(rows) == 4 and {r["status"] for r in rows} == {"completed"}
    assert set(before) <= {r["trial_id"] for r in rows}
    for trial_id, stamps in before.items():  # the finished trials were neither re-run nor re-saved
        result = save_dir / "trials" / trial_id / "result.json"
        assert (result.stat().st_mtime_ns, (result.parent / "model.pt").stat().st_mtime_ns) == stamps
