"""Real tiny finetunes whose save_dirs the report tests read: 120 molecules of the demo file, 1 epoch, the fixture
pretrain checkpoint. A regression run of 2 tasks and 2 members (calibrated: 40 % validation), and a
classification run of 2 tasks (labels: logp > 2, tpsa_100 > 0.6)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.ray_app.finetune.tiny_runs import DEMO, tiny_finetune

TASKS = ["logp", "tpsa_100"]
THRESHOLDS = {"logp": 2.0, "tpsa_100": 0.6}


def demo_rows(count: int) -> list[list[str]]:
    """The header and ``count`` molecules of the demo file, with the columns smiles, logp, tpsa_100."""
    with open(DEMO) as f:
        return [row[:3] for row in list(csv.reader(f))[:count + 1]]


@pytest.fixture(scope="session")
def regression_run(ray_cluster, tmp_path_factory) -> tuple[Path, str]:
    """(save_dir, what the run printed)."""
    base = tmp_path_factory.mktemp("report_regression")
    rows = demo_rows(120)
    rows.insert(7, ["not_a_smiles", "1.0", "0.5"])  # an invalid row the data summary counts
    with open(base / "data.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    _, out = tiny_finetune(base / "run", base / "data.csv", "--ensemble_size", "2",
                           "--split_sizes", "0.4", "0.4", "0.2")
    return base / "run", out


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
