"""`kermt tune --dry_run` without Ray: the sweep's settings, data checks and plan; nothing written; a sweep of the
same settings in --save_dir is said to be resumed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kermt.run_layout import SWEEP_FILE
from ray_app.common.settings import resolve
from ray_app.tune.command import main
from ray_app.tune.config import TuneConfig, sweep_record
from tests.ray_app.finetune.test_dry_run import NOT_CHECKED, in_subprocess, tree
from tests.ray_app.tune.sweeps import sweep_argv, write_inputs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    return write_inputs(tmp_path_factory.mktemp("tune_dry"))


def test_a_dry_run_prints_the_plan_without_ray_and_writes_nothing(inputs, tmp_path):
    save_dir = tmp_path / "tune"
    out, imported_ray = in_subprocess(["tune", *sweep_argv(inputs, save_dir, n_trials=3, concurrent=2),
                                       "--dry_run"])
    assert not imported_ray
    lines = out.splitlines()
    assert "    n_trials: 3" in lines and "  * scheduler: asha" in lines
    assert f"{inputs[0]}: 80 rows, 80 with a valid SMILES" in lines
    assert "objective=val_rmse (min)" in lines and "  attn_out: choice [4, 8] when self_attention=True" in lines
    assert "  init_lr_factor: 10 (init_lr = max_lr / init_lr_factor)" in lines
    assert "fold 0: train 64, val 8, test 8" in lines
    assert ("would run 3 trials (optuna search, asha scheduler) of 2 epoch(s), at most 2 at once "
            "(--max_concurrent_trials), each with 1 worker(s) (1 CPU each)") in lines
    assert f"a run starts the sweep in {save_dir}" in lines
    assert lines[-1] == f"resources are not checked by a dry run (no Ray cluster was started): {NOT_CHECKED}"
    assert not save_dir.exists()


def test_a_sweep_of_the_same_settings_is_said_to_resume(inputs, tmp_path, capsys):
    save_dir = tmp_path / "tune"
    argv = sweep_argv(inputs, save_dir, n_trials=3, concurrent=2)
    save_dir.mkdir()
    recorded = resolve(argv, TuneConfig, "kermt tune")[0]
    (save_dir / SWEEP_FILE).write_text(yaml.safe_dump(sweep_record(recorded), sort_keys=False))
    before = tree(save_dir)
    assert main([*argv, "--dry_run"]) == 0
    assert (f"the sweep in {save_dir} has these settings: a run resumes it, keeping its finished trials"
            in capsys.readouterr().out.splitlines())
    assert tree(save_dir) == before
