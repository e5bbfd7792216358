"""The report of a 2,000-molecule test set stays small. The test_result.csv is written by the run's own writer from
the 2,000 molecules of data/sample/admet_demo.csv: the measured values are the file's columns, the predictions
those values plus seeded Gaussian noise (no model: the page's size depends on the count of points, not on their
source)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ray_app.common import outputs
from ray_app.report import write_report

TASKS = ["logp", "tpsa_100", "fsp3"]
LIMIT = 3_000_000


def test_report_of_2000_test_molecules_is_under_3_mb(tmp_path):
    data = pd.read_csv("data/sample/admet_demo.csv")
    assert len(data) == 2000
    measured = data[TASKS].to_numpy(dtype=np.float64)
    predicted = measured + np.random.default_rng(0).normal(0, 0.2, measured.shape) * np.nanstd(measured, axis=0)
    predicted = np.where(np.isnan(predicted), np.nanmean(measured, axis=0), predicted)
    (tmp_path / "run" / "fold_0").mkdir(parents=True)
    (tmp_path / "run" / "fold_0" / "test_result.csv").write_text(
        outputs.test_result_csv(data["smiles"].tolist(), TASKS, predicted, measured))
    finetune = write_report(tmp_path / "run")
    scored = write_report(tmp_path / "run" / "fold_0" / "test_result.csv")  # the kermt eval report of the file
    assert scored.name == "test_result_report.html"
    for path in (finetune, scored):
        size = path.stat().st_size
        print(f"{path.name}: {size / 1e6:.2f} MB for 2,000 molecules x 3 tasks")
        assert 100_000 < size < LIMIT
