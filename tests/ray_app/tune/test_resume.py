"""A `kermt tune` --save_dir holds one sweep (ray_app.tune.resume): tune and finetune default to directories of their
own; a tune given a finetune's directory (or one holding a sweep of other settings) moves what is there aside and
says where, before Ray starts; a finetune does the same with a sweep's; an input the move would take away is refused.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from kermt.errors import UserError
from kermt.run_layout import RunLayout
from ray_app import cli
from ray_app.common.remote_files import with_absolute_paths
from ray_app.common.settings import resolve
from ray_app.finetune.config import FinetuneConfig
from ray_app.finetune.resume import start_finetune_run
from ray_app.tune.config import TuneConfig, sweep_record
from ray_app.tune.resume import claim_sweep_dir
from tests.conftest import FIXTURE_DIR

CHECKPOINT = str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt")


@pytest.fixture(scope="module")
def finetuned_folder(regression_run, tmp_path_factory) -> Path:
    """A folder laid out as after `kermt finetune --data_path data.csv` with its default --save_dir: the session's
    finished run (tests/ray_app/conftest.py) in runs/finetune beside its data file."""
    folder = tmp_path_factory.mktemp("first_hour")
    run = regression_run[0]
    shutil.copy(run.parent / "data.csv", folder / "data.csv")
    shutil.copytree(run, folder / "runs" / "finetune", ignore=shutil.ignore_patterns("ray_results"))
    return folder


@pytest.fixture
def workdir(finetuned_folder, tmp_path, monkeypatch) -> Path:
    """A copy of that folder (the tests move things), the working directory."""
    copy = shutil.copytree(finetuned_folder, tmp_path / "work", ignore=shutil.ignore_patterns("ray_results"))
    monkeypatch.chdir(copy)
    return copy


def _tune_settings(*argv: str) -> TuneConfig:
    """`kermt tune`'s settings as the command resolves them (local paths made absolute)."""
    config, _ = resolve(["--data_path", "data.csv", "--checkpoint_path", CHECKPOINT, "--n_trials", "2", *argv],
                        TuneConfig, "kermt tune")
    return with_absolute_paths(config)


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_finetune_and_tune_default_to_directories_of_their_own(workdir, capsys):
    finetune = workdir / "runs" / "finetune"
    before = _entries(finetune)
    assert {"fold_0", "report.html", "run.json", "run_state.json"} <= set(before)
    config = _tune_settings()
    assert Path(config.save_dir) == workdir / "runs" / "tune"
    assert FinetuneConfig(data_path="d.csv").save_dir == "runs/finetune"
    claim_sweep_dir(config)
    assert capsys.readouterr().out == ""
    assert _entries(finetune) == before and not (workdir / "runs" / "tune").exists()


def test_tune_moves_a_finetunes_run_aside_saying_where_and_finetune_does_the_same_with_a_sweep(workdir, capsys):
    save_dir = workdir / "runs" / "finetune"
    run_id = yaml.safe_load((save_dir / "run_state.json").read_text())["run_id"]
    before = _entries(save_dir)
    config = _tune_settings("--save_dir", str(save_dir))
    claim_sweep_dir(config)
    moved = save_dir / "earlier_runs" / run_id
    assert capsys.readouterr().out == (f"{save_dir} holds a kermt finetune run: moved its outputs to {moved} (delete "
                                       "that when you no longer need it)\n")
    assert _entries(save_dir) == ["earlier_runs"] and _entries(moved) == before
    # the sweep records itself (the driver writes tune_config.yaml); the same command then resumes it, moving nothing
    (save_dir / "tune_config.yaml").write_text(yaml.safe_dump(sweep_record(config)))
    (save_dir / "report.html").write_text("the sweep's report")
    claim_sweep_dir(config)
    assert capsys.readouterr().out == "" and _entries(save_dir) == ["earlier_runs", "report.html", "tune_config.yaml"]
    # a finetune given the sweep's directory moves the sweep aside: its report and record never mix with the run's
    start_finetune_run(save_dir, FinetuneConfig(data_path=str(workdir / "data.csv"), save_dir=str(save_dir)))
    line = capsys.readouterr().out
    assert line.startswith(f"{save_dir} holds an earlier run with no run record: moved its outputs to "
                           f"{save_dir / 'earlier_runs'}/before-")
    assert _entries(save_dir) == ["earlier_runs", "run_state.json"]
    assert len(_entries(save_dir / "earlier_runs")) == 2


def test_a_sweep_of_other_settings_is_moved_aside_unless_its_experiment_is_elsewhere(tmp_path, capsys):
    earlier = TuneConfig(data_path="d.csv", n_trials=4, save_dir=str(tmp_path))
    (tmp_path / "tune_config.yaml").write_text(yaml.safe_dump(sweep_record(earlier)))
    for folder in ("trials/t1", "tune", "best_model"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "all_trials.csv").write_text("trial_id\nt1\n")
    (tmp_path / "notes.txt").write_text("the user's own file stays")
    config = earlier.model_copy(update={"n_trials": 6})
    with pytest.raises(UserError, match=r"holds a sweep with other settings \(n_trials: 4 -> 6\) whose Tune "
                                        r"experiment is under --storage_path \(/shared/tune_storage/tune\)"):
        claim_sweep_dir(config.model_copy(update={"storage_path": "/shared/tune_storage"}))
    claim_sweep_dir(config.model_copy(update={"dry_run": True}))
    assert capsys.readouterr().out == (f"{tmp_path} holds a sweep with other settings (n_trials: 4 -> 6): a sweep "
                                       f"moves them to {tmp_path / 'earlier_runs'}/ first\n")
    assert "earlier_runs" not in _entries(tmp_path)
    claim_sweep_dir(config)
    assert f"{tmp_path} holds a sweep with other settings (n_trials: 4 -> 6): moved its outputs to " in (
        capsys.readouterr().out)
    assert _entries(tmp_path) == ["earlier_runs", "notes.txt"]
    (moved,) = (tmp_path / "earlier_runs").iterdir()
    assert _entries(moved) == ["all_trials.csv", "best_model", "trials", "tune", "tune_config.yaml"]


def test_an_input_the_move_would_take_away_is_refused_before_ray_starts(workdir, capsys):
    save_dir = workdir / "runs" / "finetune"
    model = RunLayout(save_dir).member(0, 0) / "model"
    assert cli.main(["tune", "--data_path", "data.csv", "--checkpoint_path", str(model), "--n_trials", "2",
                     "--save_dir", str(save_dir)]) == 2
    assert capsys.readouterr().err == (
        f"kermt tune: error: --checkpoint_path {model} is inside {save_dir / 'fold_0'}, which this sweep would move "
        f"to {save_dir / 'earlier_runs'}/ as an earlier run's output; give the sweep another --save_dir\n")
    assert "earlier_runs" not in _entries(save_dir)
