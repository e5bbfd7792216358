"""One `kermt serve` app for every test of the package (Ray Serve starts once): a calibrated classifier ensemble
(the default, no applicability domain), a calibrated regression ensemble with molecule features and fold 0's
applicability domain and run.json, and bearer-token auth on."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from kermt.checkpoint import load_finetune_model, read_checkpoint
from kermt.data.featurize import featurize_smiles
from kermt.run_layout import CLASS_CALIBRATION_FILE
from kermt.uncertainty import fit_calibration, fit_class_calibrations, save_calibrations, save_class_calibrations
from kermt.uncertainty.domain import embedding_identity, fit_domain, model_embeddings, save_domain
from ray_app.serve.command import Serving, load_models
from ray_app.serve.config import ServeConfig
from tests.conftest import free_port
from tests.kermt.test_inference import ensemble_dir
from tests.kermt.uncertainty.test_domain import DEMO

MAX_MOLECULES = 12
MAX_EMBED_MOLECULES = 10
MAX_ATTRIBUTION_MOLECULES = 11
API_KEY_ENV = "KERMT_TEST_SERVE_KEY"
API_KEY = "test-key-0123456789abcdef"


def calibrated_run(root: Path) -> Path:
    """A two-member regression run (t1, t2) whose fold holds a calibration.json, as `kermt finetune` writes it."""
    run = ensemble_dir(root, "ckpt_ft_reg.pt")
    rng = np.random.default_rng(0)
    mu, sigma = rng.normal(size=30), 0.05 + rng.random(30)
    y = mu + sigma * rng.normal(size=30)
    save_calibrations(str(run / "fold_0" / "calibration.json"),
                      {task: fit_calibration(task, mu, y, sigma) for task in ("t1", "t2")}, source="test")
    save_fold_domain(run / "fold_0", run / "fold_0" / "model_0" / "model.pt")
    (run / "run.json").write_text(json.dumps(RUN_RECORD))
    return run


def class_calibrated_run(root: Path) -> Path:
    """A two-member classifier run (c1, c2) whose fold holds a classification_calibration.json (Platt, 30
    molecules), as `kermt finetune` writes it."""
    run = ensemble_dir(root, "ckpt_ft_cls.pt")
    rng = np.random.default_rng(1)
    probs = rng.uniform(0.05, 0.95, size=(30, 2))
    labels = (rng.random((30, 2)) < probs).astype(float)
    save_class_calibrations(str(run / "fold_0" / CLASS_CALIBRATION_FILE),
                            fit_class_calibrations(("c1", "c2"), probs, labels, source="test"), source="test")
    return run


# the keys of run.json that GET /models reads, as ray_app/finetune/run.py writes them (a NaN: a task without labels),
# of a run given separate val and test files (upstream's summary key still names the split type)
SPLIT_FILES = {"separate_val_path": "/data/val.csv", "separate_test_path": "/data/test.csv"}
RUN_RECORD = {
    "settings": {"split_type": {"value": "scaffold_balanced", "source": "config"},
                 **{name: {"value": path, "source": "user"} for name, path in SPLIT_FILES.items()}},
    "split": "given files: val /data/val.csv, test /data/test.csv; data_path: all for training",
    "summary": {"dataset_type": "regression", "metric": "rmse", "fold_scores": [0.25],
                "overall_scaffold_balanced_test_rmse": 0.25, "std": 0.0, "run_id": "20261204-000000-abcdef"},
    "calibration": {"fold_0": {"file": "fold_0/calibration.json", "method": "normalised",
                               "tasks": {"t1": {"n": 30}, "t2": {"n": 30}}}},
    "folds": {"fold_0": {"member_test_scores": [{"t1": 0.2, "t2": float("nan")}, {"t1": 0.4, "t2": 0.3}]}},
}


def save_fold_domain(fold: Path, member_0: Path) -> None:
    """fold/domain.json from member 0's embedding (60 demo molecules index it, 20 set the threshold), as
    `kermt finetune` writes it."""
    model, _ = load_finetune_model(read_checkpoint(member_0))
    smiles = pd.read_csv(DEMO).smiles.tolist()
    train, val = (model_embeddings(model, featurize_smiles(s), 32) for s in (smiles[:60], smiles[60:80]))
    save_domain(str(fold), fit_domain(train, val, embedding_identity(model.state_dict())))


@dataclass
class Served:
    config: ServeConfig
    url: str
    client: httpx.Client  # sends the API key

    @property
    def reg_dir(self) -> str:
        return dict(self.config.model_sources())["reg"]


@pytest.fixture(scope="package")
def served(ray_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    config = ServeConfig(checkpoint_dir=str(class_calibrated_run(root / "cls_run")), name="cls",
                         model=[f"reg={calibrated_run(root / 'reg_run')}"], port=free_port(),
                         max_request_molecules=MAX_MOLECULES,
                         max_embed_molecules=MAX_EMBED_MOLECULES, max_attribution_molecules=MAX_ATTRIBUTION_MOLECULES,
                         app_name="kermt-test", api_key_env=API_KEY_ENV)
    os.environ[API_KEY_ENV] = API_KEY
    try:
        serving = Serving(config).start(load_models(config))
    finally:
        os.environ.pop(API_KEY_ENV)  # read at start: the running app no longer needs it
    try:
        with httpx.Client(base_url=serving.url, timeout=120,
                          headers={"authorization": f"Bearer {API_KEY}"}) as client:
            yield Served(config, serving.url, client)
    finally:
        serving.stop()
    import ray
    from ray import serve

    assert not serve.status().applications and ray.is_initialized()  # the app went, the session's cluster stays
