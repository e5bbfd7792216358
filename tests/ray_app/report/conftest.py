"""A real tiny finetune whose save_dir the report tests read: a classification run of 2 tasks (labels: logp > 2,
tpsa_100 > 0.6) on 120 molecules of the demo file, 1 epoch, the fixture pretrain checkpoint. The regression run
they read is the session's (tests/ray_app/conftest.py: other folders read it too)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.ray_app.finetune.tiny_runs import TASKS, demo_rows, tiny_finetune

THRESHOLDS = {"logp": 2.0, "tpsa_100": 0.6}


@pytest.fixture(scope="session")
def classification_run(ray_cluster, tmp_path_factory) -> tuple[Path, str]:
    base = tmp_path_factory.mktemp("report_classification")
    rows = demo_rows(120)
    with open(base / "data.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["smiles", "logp_high", "tpsa_high"])
        for smiles, *values in rows[1:]:
            labels = ("" if v == "" else int(float(v) > THRESHOLDS[t]) for v, t in zip(values, TASKS))
            writer.writerow([smiles, *labels])
    _, out = tiny_finetune(base / "run", base / "data.csv", "--dataset_type", "classification",
                           "--split_sizes", "0.6", "0.2", "0.2")
    return base / "run", out
