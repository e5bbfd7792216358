"""What `kermt serve` reads beside the members, on the driver and without Ray: the applicability domain (or why a
model has none) and the run's recorded scores."""

from __future__ import annotations

import json

from kermt.inference import find_checkpoints, read_members
from ray_app.serve.models import load_domain_index
from ray_app.serve.run_metrics import training_metrics
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import ensemble_dir
from tests.ray_app.serve.conftest import RUN_RECORD, save_fold_domain


def test_a_model_without_a_usable_domain_says_why(tmp_path):
    run = ensemble_dir(tmp_path / "run", "ckpt_ft_reg.pt")
    members = read_members(find_checkpoints(run))
    index, why = load_domain_index(run, members)
    assert index is None and "no domain.json beside its first member" in why and "kermt finetune" in why
    save_fold_domain(run / "fold_0", FIXTURE_DIR / "ckpt_ft_cls.pt")  # another model's embedding: a stale file
    index, why = load_domain_index(run, members)
    assert index is None and "built from another model" in why, why
    save_fold_domain(run / "fold_0", run / "fold_0" / "model_0" / "model.pt")
    index, why = load_domain_index(run, members)
    assert why is None and index.training.shape[0] == 60
    one_file = run / "fold_0" / "model_0" / "model.pt"
    index, why = load_domain_index(one_file, members[:1])
    assert index is None and "one checkpoint" in why
    assert training_metrics(run) is None and training_metrics(one_file) is None  # no run.json


def test_the_training_record_says_what_the_calibration_was_fitted_on(tmp_path):
    run = ensemble_dir(tmp_path / "run", "ckpt_ft_reg.pt")
    (run / "run.json").write_text(json.dumps(RUN_RECORD))  # fold_0 calibrated on its validation split
    assert training_metrics(run).calibration_source == "validation molecules"
    on_file = {**RUN_RECORD["calibration"]["fold_0"], "source": "--calibration_path assay.csv (40 molecules)",
               "in_training_split": 3}  # what ray_app/finetune/calibrate.py records for --calibration_path
    (run / "run.json").write_text(json.dumps({**RUN_RECORD, "calibration": {"fold_0": on_file}}))
    metrics = training_metrics(run)
    assert metrics.calibration_source == "--calibration_path assay.csv (40 molecules)"
    assert (metrics.calibration_method, metrics.calibration_size) == ("normalised", {"t1": 30, "t2": 30})


def test_the_training_record_states_the_split_of_separate_files(tmp_path):
    """Upstream's summary key says scaffold_balanced; the record says the files (run.json's words, or for a run
    recorded before them, the same words from its settings)."""
    run = ensemble_dir(tmp_path / "run", "ckpt_ft_reg.pt")
    (run / "run.json").write_text(json.dumps(RUN_RECORD))
    metrics = training_metrics(run)
    assert (metrics.split_type, metrics.overall_test_score) == ("scaffold_balanced", 0.25)
    assert metrics.split == "given files: val /data/val.csv, test /data/test.csv; data_path: all for training"
    (run / "run.json").write_text(json.dumps({k: v for k, v in RUN_RECORD.items() if k != "split"}))
    assert training_metrics(run).split == metrics.split
    settings = {"split_type": RUN_RECORD["settings"]["split_type"]}
    (run / "run.json").write_text(json.dumps({**RUN_RECORD, "split": None, "settings": settings}))
    assert training_metrics(run).split == "scaffold_balanced"
