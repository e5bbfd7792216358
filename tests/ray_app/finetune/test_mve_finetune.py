"""`kermt finetune --loss mve` end to end: one member whose variance head gives the fold its own sigma, so the
fold is calibrated with normalised (adaptive) conformal instead of the one-member plain fallback; no upstream
model.pt (a log line says why); `kermt predict --uncertainty --interval` serves that std and adaptive intervals,
equal to the library's numbers. A finetune of its own (as test_calibration.py), so outside the default suite."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from kermt.checkpoint import read_checkpoint
from kermt.data.featurize import featurize_smiles
from kermt.inference import Ensemble, find_checkpoints, read_members
from kermt.uncertainty import intervals, load_calibrations
from tests.ray_app.screening.engines import main_predict
from tests.ray_app.finetune.tiny_runs import demo_head, tiny_finetune

pytestmark = pytest.mark.slow
TASKS = ["logp", "tpsa_100", "fsp3"]


def test_one_mve_member_is_calibrated_adaptively_and_predicts_its_own_std(ray_cluster, tmp_path):
    data = demo_head(120, tmp_path / "data.csv")  # 70 % of them validation: >= 20 labelled per task
    save_dir = tmp_path / "run"
    _, printed = tiny_finetune(save_dir, data, "--split_sizes", "0.2", "0.7", "0.1", "--loss", "mve")
    assert "no upstream model.pt: a variance head (--loss mve) has no upstream counterpart" in printed
    assert not (save_dir / "fold_0" / "model_0" / "model.pt").exists()
    assert "fold 0: calibrated (normalised conformal)" in printed and "plain conformal" not in printed
    assert read_checkpoint(save_dir / "fold_0" / "model_0" / "model").spec.head.variance  # recorded in its spec
    calibrations = load_calibrations(str(save_dir / "fold_0" / "calibration.json"))
    assert all(c.method == "normalised" for c in calibrations.values())

    val_rows = json.loads((save_dir / "splits.json").read_text())["fold_0"]["val"]
    val_csv = tmp_path / "val.csv"
    pd.read_csv(data).iloc[val_rows].to_csv(val_csv, index=False)
    preds = tmp_path / "preds.csv"
    assert main_predict(["--data_path", str(val_csv), "--output_path", str(preds), "--checkpoint_dir",
                         str(save_dir), "--interval", "0.9", "--uncertainty", "--drop_extra_columns"]) == 0
    frame = pd.read_csv(preds)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the 1-CPU actors
    try:
        expected = Ensemble(read_members(find_checkpoints(save_dir))).predict(
            featurize_smiles(frame["smiles"].tolist()), 32)  # predict's default --batch_size
    finally:
        torch.set_num_threads(threads)
    labels = pd.read_csv(val_csv)
    for t, task in enumerate(TASKS):
        std = frame[f"{task}_std"].to_numpy()
        np.testing.assert_allclose(std, expected.std[:, t], rtol=1e-12)
        assert (std > 0).all()
        lower, upper = intervals(calibrations[task], expected.mean[:, t], expected.std[:, t], 0.9)
        served_lower, served_upper = frame[f"{task}_lower"].to_numpy(), frame[f"{task}_upper"].to_numpy()
        np.testing.assert_allclose(served_lower, lower, rtol=1e-12)
        width = served_upper - served_lower
        assert width.std() > 0.01 * width.mean()  # adaptive: the widths follow the model's own std
        y = labels[task].to_numpy(float)
        covered = np.mean((served_lower <= y) & (y <= served_upper), where=~np.isnan(y))
        assert covered >= 0.89, (task, covered)  # its own calibration set
