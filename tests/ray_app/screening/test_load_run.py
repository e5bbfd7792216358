"""kermt.load_run(path).predict gives `kermt predict`'s columns and numbers for the same run and SMILES: a
2-member regression ensemble with its calibration and applicability domain, and a calibrated classifier."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd

import kermt
from kermt.checkpoint import load_finetune_model, read_checkpoint
from kermt.data.featurize import featurize_smiles
from kermt.inference import Ensemble, plan_features, read_members
from kermt.uncertainty import fit_calibration, fit_class_calibration, save_calibrations, save_class_calibrations
from kermt.uncertainty.domain import embedding_identity, fit_domain, model_embeddings, save_domain
from tests.ray_app.screening.engines import main_predict
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import OUTPUTS, SMILES, ensemble_dir
from tests.kermt.uncertainty.test_domain import DEMO

QUERY = [*SMILES[:10], "not a smiles", *pd.read_csv(DEMO).smiles.tolist()[400:430]]


def _calibrated_ensemble(root) -> None:
    """fold_0 of a run: 2 members, calibrated on the fixture molecules (labels: the mean plus noise), with a
    domain fitted on demo molecules through member 0's embedding."""
    run = ensemble_dir(root)
    fold = run / "fold_0"
    members = read_members([fold / "model_0" / "model.pt", fold / "model_1" / "model"])
    molecules = featurize_smiles(SMILES, plan_features([m.spec for m in members]).generator)
    prediction = Ensemble(members).predict(molecules, 32)
    labels = prediction.mean + np.random.default_rng(0).normal(scale=0.1, size=prediction.mean.shape)
    save_calibrations(str(fold / "calibration.json"), {
        t: fit_calibration(t, prediction.mean[:, i], labels[:, i], prediction.std[:, i])
        for i, t in enumerate(("t1", "t2"))}, source="test")
    model, _ = load_finetune_model(members[0])
    smiles = pd.read_csv(DEMO).smiles.tolist()
    train, held_out = (model_embeddings(model, featurize_smiles(s, ("rdkit_2d_normalized",)), 32)
                       for s in (smiles[:200], smiles[200:260]))
    save_domain(str(fold), fit_domain(train, held_out, embedding_identity(model.state_dict())))


def _predicted(run, tmp_path, *flags) -> pd.DataFrame:
    pd.DataFrame({"smiles": QUERY}).to_csv(tmp_path / "q.csv", index=False)
    out = tmp_path / f"p{len(flags)}.parquet"
    assert main_predict(["--data_path", str(tmp_path / "q.csv"), "--output_path", str(out), "--checkpoint_dir",
                         str(run), *flags]) == 0
    return pd.read_parquet(out)


def _assert_same(ours: pd.DataFrame, theirs: pd.DataFrame) -> None:
    assert list(ours.columns) == list(theirs.columns)
    for name in ours.columns:
        a, b = ours[name].to_numpy(object), theirs[name].to_numpy(object)
        if name not in ("smiles", "error") and not name.endswith("_set") and name != "in_domain":
            np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=1e-9, atol=1e-12, equal_nan=True)
        else:
            assert [None if pd.isna(x) else x for x in a] == [None if pd.isna(x) else x for x in b], name


def test_a_calibrated_ensemble_with_a_domain_predicts_as_kermt_predict(tmp_path):
    run = tmp_path / "run"
    _calibrated_ensemble(run)
    theirs = _predicted(run, tmp_path, "--interval", "0.9", "--uncertainty", "--applicability_domain")
    ours = kermt.load_run(run).predict(QUERY, interval=0.9, domain=True, uncertainty=True)
    assert "t1_lower" in ours.columns and "in_domain" in ours.columns and not ours["valid"].iloc[10]
    assert ours["in_domain"].iloc[11:].any() and (ours["t1_upper"] > ours["t1_lower"]).iloc[:10].all()
    _assert_same(ours, theirs)
    _assert_same(kermt.load_run(run).predict(QUERY), _predicted(run, tmp_path))


def test_a_calibrated_classifier_predicts_as_kermt_predict(tmp_path):
    run = tmp_path / "cls_run"
    run.mkdir()
    shutil.copy(FIXTURE_DIR / "ckpt_ft_cls.pt", run / "model.pt")
    labels = pd.read_csv(FIXTURE_DIR / "smiles_cls.csv")
    save_class_calibrations(str(run / "classification_calibration.json"), {
        task: fit_class_calibration(task, OUTPUTS["ft_cls_final_prediction"][:, t], labels[task])
        for t, task in enumerate(("c1", "c2"))}, source="test")
    ours = kermt.load_run(run).predict(QUERY, interval=0.8)
    assert list(ours.columns) == ["smiles", "c1", "c2", "c1_calibrated", "c2_calibrated", "c1_set", "c2_set",
                                  "valid", "error"]
    _assert_same(ours, _predicted(run, tmp_path, "--interval", "0.8"))
    assert read_checkpoint(run / "model.pt").spec.head.dataset_type == "classification"
