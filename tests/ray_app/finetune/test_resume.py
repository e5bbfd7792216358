"""Re-running a finetune in the same save_dir: the run id is kept for the same settings, finished members are found
only when completely written by that run (the driver-death test on a cluster is in tests/multinode/)."""

from __future__ import annotations

import json

import torch

from kermt.checkpoint import load_finetune_model, read_checkpoint, save_native
from kermt.run_layout import RUN_STATE_FILE
from ray_app.common.run_ids import claim_run_id
from ray_app.finetune.config import RESUMABLE_CHANGES, FinetuneConfig
from ray_app.finetune.resume import finished_member
from tests.conftest import FIXTURE_DIR


def _claim(save_dir, config: FinetuneConfig) -> tuple[str, bool]:
    """The run id a finetune's settings claim (RESUMABLE_CHANGES may differ on a re-run)."""
    return claim_run_id(save_dir, settings=config.model_dump(mode="json"), resumable=RESUMABLE_CHANGES)


def test_same_settings_resume_the_run_and_other_settings_start_a_new_one(tmp_path, capsys):
    config = FinetuneConfig(data_path="d.csv", save_dir=str(tmp_path))
    first, resumed = _claim(tmp_path, config)
    assert not resumed and json.loads((tmp_path / RUN_STATE_FILE).read_text())["run_id"] == first
    # settings that do not change what is computed may differ
    again, resumed = _claim(tmp_path, config.model_copy(update={"max_concurrent_trials": 3,
                                                                      "storage_path": "s3://b/p"}))
    assert (again, resumed) == (first, True)
    other, resumed = _claim(tmp_path, config.model_copy(update={"epochs": 7}))
    assert other != first and not resumed
    assert "other settings (epochs)" in capsys.readouterr().out
    assert json.loads((tmp_path / RUN_STATE_FILE).read_text())["run_id"] == other


def test_a_member_counts_as_finished_only_when_complete_and_from_this_run(tmp_path):
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_reg_ts.pt")
    model, _ = load_finetune_model(checkpoint)
    member = tmp_path / "fold_0" / "model_1"
    save_native(member / "model", model.state_dict(), checkpoint.spec, provenance={"run_id": "run-a"})
    assert finished_member(member, "run-a", model.config) is None  # metrics.csv (written last) is missing
    (member / "metrics.csv").write_text("epoch,train_loss,val_rmse\n0,1.5,0.25\n1,1.0,\n")
    assert finished_member(member, "run-b", model.config) is None  # saved by another run
    loaded, history = finished_member(member, "run-a", model.config)
    assert history == [{"epoch": 0.0, "train_loss": 1.5, "val_rmse": 0.25}, {"epoch": 1.0, "train_loss": 1.0}]
    for key, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], tensor), key


def test_calibration_settings_are_not_part_of_the_runs_identity(tmp_path, capsys):
    config = FinetuneConfig(data_path="d.csv", save_dir=str(tmp_path))
    first, _ = _claim(tmp_path, config)
    recalibrated = config.model_copy(update={"calibration_method": "mondrian", "class_calibration_method": "isotonic",
                                             "calibration_path": "assay.csv"})
    assert _claim(tmp_path, recalibrated) == (first, True)  # the trained members are kept
    # a run recorded before the calibration settings left the identity (its state lists calibration_method)
    state = json.loads((tmp_path / RUN_STATE_FILE).read_text())
    state["settings"]["calibration_method"] = "plain"
    (tmp_path / RUN_STATE_FILE).write_text(json.dumps(state))
    assert _claim(tmp_path, config) == (first, True)
    assert "other settings" not in capsys.readouterr().out
