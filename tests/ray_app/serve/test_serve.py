"""`kermt serve` on real Ray Serve (the session's local cluster) through a real HTTP client: predictions equal
`kermt predict`'s, bad input gets its own status, /models describes what is served. One app for the package
(conftest.py)."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest

from kermt.data.featurize import featurize_smiles
from kermt.inference import Embedder, Ensemble, find_checkpoints, read_members
from kermt.uncertainty.run_calibration import run_class_calibration
from ray_app.screening.commands import main_predict
from ray_app.serve.command import wait_for_stop_signal
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import SMILES
from tests.ray_app.serve.conftest import MAX_EMBED_MOLECULES, MAX_MOLECULES

REQUEST = SMILES[:5] + ["not_a_smiles"] + SMILES[5:9]  # 10 molecules, one invalid: one forward, as kermt predict's


def kermt_predict(tmp_path, checkpoint_flag: list[str], smiles: list[str], *flags: str) -> pd.DataFrame:
    pd.DataFrame({"smiles": smiles}).to_csv(tmp_path / "in.csv", index=False)
    assert main_predict(["--data_path", str(tmp_path / "in.csv"), "--output_path", str(tmp_path / "out.csv"),
                         *checkpoint_flag, "--uncertainty", *flags]) == 0
    return pd.read_csv(tmp_path / "out.csv", keep_default_na=False, na_values=[""])


def _column(predictions: list[dict], key: str) -> np.ndarray:
    return np.array([np.nan if p[key] is None else p[key] for p in predictions], dtype=float)


def _post(client, path: str, smiles, uncertainty: bool = False, **fields) -> dict:
    response = client.post(path, json={"smiles": smiles, "uncertainty": uncertainty, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def test_ensemble_predictions_equal_kermt_predict(served, tmp_path):
    config, client = served.config, served.client
    body = _post(client, "/predict", REQUEST, uncertainty=True)
    expected = kermt_predict(tmp_path, ["--checkpoint_dir", config.checkpoint_dir], REQUEST)
    predictions = body["predictions"]
    assert body["model"] == "cls"
    assert [p["smiles"] for p in predictions] == REQUEST
    assert [p["valid"] for p in predictions] == expected["valid"].tolist()
    assert [p["error"] or "" for p in predictions] == expected["error"].fillna("").tolist()
    tasks = [c for c in expected.columns if c not in ("smiles", "valid", "error")]
    assert len(tasks) == 6 and set(tasks) <= set(predictions[0])  # two tasks, their _std and _calibrated
    for task in tasks:
        np.testing.assert_allclose(_column(predictions, task), expected[task].to_numpy(), rtol=0, atol=1e-6)
    assert np.nanmax(_column(predictions, tasks[-1])) > 1e-4  # two different members: a spread that is not zero
    # one molecule, one number (issue 36): each SMILES sent alone over HTTP gets its number in the file (upstream
    # padding: alone, upstream's batching would collate a molecule of degree 3 at width 3, not the reference 4)
    alone = [_post(client, "/predict", [smiles], uncertainty=True)["predictions"][0] for smiles in REQUEST]
    for task in tasks:
        np.testing.assert_allclose(_column(alone, task), expected[task].to_numpy(), rtol=0, atol=1e-6)


def test_descriptor_model_predictions_equal_kermt_predicts_library_path(served):
    """The library calls kermt predict makes (bit for bit, tests/ray_app/screening/test_predict.py), here for a
    model with rdkit_2d_normalized features: featurise the request, one Ensemble.predict in batches of 32."""
    body = _post(served.client, "/models/reg/predict", REQUEST)
    assert body["model"] == "reg"
    members = read_members(find_checkpoints(served.reg_dir))
    expected = Ensemble(members).predict(featurize_smiles(REQUEST, ["rdkit_2d_normalized"]), 32).mean
    for t, task in enumerate(["t1", "t2"]):
        np.testing.assert_allclose(_column(body["predictions"], task), expected[:, t], rtol=0, atol=1e-6)


def test_intervals_spread_and_domain_equal_kermt_predict_interval_uncertainty_domain(served, tmp_path):
    body = _post(served.client, "/models/reg/predict", REQUEST, uncertainty=True, interval=0.9, domain=True)
    expected = kermt_predict(tmp_path, ["--checkpoint_dir", served.reg_dir], REQUEST, "--interval", "0.9",
                             "--applicability_domain")
    columns = [f"{t}{suffix}" for t in ("t1", "t2") for suffix in ("", "_std", "_lower", "_upper")]
    columns.append("domain_distance")
    in_domain = [p["in_domain"] for p in body["predictions"]]
    assert in_domain == [None if pd.isna(v) else v in (True, "True") for v in expected["in_domain"]]
    assert in_domain[5] is None  # the invalid SMILES
    assert set(columns) <= set(expected.columns) and set(columns) <= set(body["predictions"][0])
    for column in columns:
        np.testing.assert_allclose(_column(body["predictions"], column), expected[column].to_numpy(), rtol=0,
                                   atol=1e-6)
    widths = _column(body["predictions"], "t1_upper") - _column(body["predictions"], "t1_lower")
    assert np.nanmin(widths) > 0 and np.nanstd(widths) > 0  # normalised conformal: per-molecule widths


def test_a_classifiers_sets_and_calibrated_probabilities_equal_kermt_predict_interval(served, tmp_path):
    predictions = _post(served.client, "/predict", REQUEST, interval=0.9)["predictions"]
    expected = kermt_predict(tmp_path, ["--checkpoint_dir", served.config.checkpoint_dir], REQUEST,
                             "--interval", "0.9")
    calibrations = run_class_calibration(served.config.checkpoint_dir, ("c1", "c2"))
    for task in ("c1", "c2"):
        raw = _column(predictions, task)
        np.testing.assert_allclose(_column(predictions, f"{task}_calibrated"),
                                   expected[f"{task}_calibrated"].to_numpy(), rtol=0, atol=1e-6)
        np.testing.assert_allclose(_column(predictions, f"{task}_calibrated"),
                                   calibrations[task].calibrated(raw), rtol=0, atol=1e-9)
        assert [p[f"{task}_set"] for p in predictions] == calibrations[task].sets(raw, 0.9)
        sets = pd.read_csv(tmp_path / "out.csv", dtype=str, keep_default_na=False)[f"{task}_set"]  # "0", not 0.0
        written = [v if valid else None for v, valid in zip(sets, expected["valid"])]
        assert [p[f"{task}_set"] for p in predictions] == written
    assert predictions[5]["c1_set"] is None and predictions[5]["c1_calibrated"] is None  # the invalid SMILES
    assert not np.allclose(_column(predictions, "c1_calibrated"), _column(predictions, "c1"), equal_nan=True)


@pytest.mark.parametrize("path, level, message", [
    ("/predict", 0.99, "calibrated on 30"),             # the classifier: its sets at a level 30 cannot give
    ("/models/reg/predict", 0.99, "calibrated on 30"),  # a level its 30 calibration molecules cannot give
])
def test_an_interval_the_model_cannot_give_is_400_naming_it(served, path, level, message):
    response = served.client.post(path, json={"smiles": ["CCO"], "interval": level})
    assert response.status_code == 400 and message in response.json()["detail"], response.text
    assert response.json()["detail"].startswith("interval: ")


def test_depict_draws_valid_molecules_as_sanitised_svg(served):
    predictions = _post(served.client, "/predict", ["c1ccccc1O", "not_a_smiles"], depict=True)["predictions"]
    assert predictions[0]["svg"].startswith("<svg") and "<path" in predictions[0]["svg"]
    assert predictions[1]["svg"] is None and predictions[1]["valid"] is False
    assert "svg" not in _post(served.client, "/predict", ["CCO"])["predictions"][0]


def test_embed_returns_member_0s_atom_readouts_as_kermt_embed_computes_them(served):
    """The library calls of `kermt embed --checkpoint_path MEMBER_0` (EmbedStage: Embedder.outputs in batches of
    --batch_size): atom_from_atom then atom_from_bond, concatenated."""
    predictions = _post(served.client, "/models/reg/predict", REQUEST, embed=True)["predictions"]
    member_0 = read_members(find_checkpoints(served.reg_dir))[0]
    expected = np.full((len(REQUEST), 32), np.nan)
    for rows, values in Embedder(member_0).outputs(featurize_smiles(REQUEST), 32, None):
        expected[rows] = np.concatenate([values["atom_from_atom"], values["atom_from_bond"]], axis=1)
    assert predictions[5]["embedding"] is None and np.isnan(expected[5]).all()  # the invalid SMILES
    got = np.array([p["embedding"] or [np.nan] * 32 for p in predictions])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert np.nanstd(got) > 0.01  # molecules differ
    too_many = served.client.post("/predict", json={"smiles": ["CCO"] * (MAX_EMBED_MOLECULES + 1), "embed": True})
    assert too_many.status_code == 413 and too_many.json()["detail"].startswith("embed: "), too_many.text
    assert "embedding" not in _post(served.client, "/predict", ["CCO"])["predictions"][0]


def test_domain_of_a_model_without_one_is_400_saying_how_to_get_one(served):
    response = served.client.post("/predict", json={"smiles": ["CCO"], "domain": True})
    detail = response.json()["detail"]
    assert response.status_code == 400 and detail.startswith("domain: model 'cls' has no applicability domain")
    assert "domain.json" in detail and "kermt finetune" in detail, detail
    assert "domain_distance" not in _post(served.client, "/models/reg/predict", ["CCO"])["predictions"][0]


def test_an_invalid_smiles_is_its_own_entry_and_the_rest_are_predicted(served):
    client = served.client
    predictions = _post(client, "/predict", ["CCO", "CC(C)(C)(C)(C)C", "c1ccccc1"])["predictions"]
    assert [p["valid"] for p in predictions] == [True, False, True]
    assert "valence" in predictions[1]["error"]  # RDKit's own message: a five-valent carbon
    assert predictions[1]["c1"] is None and predictions[0]["error"] is None
    assert all(isinstance(predictions[i]["c1"], float) for i in (0, 2))
    assert "c1_std" not in predictions[0]  # uncertainty only when asked


def test_concurrent_clients_get_the_numbers_of_their_request_alone(served):
    client = served.client
    requests = [SMILES[i : i + 1 + i % 4] for i in range(12)]
    alone = [_post(client, "/models/reg/predict", r)["predictions"] for r in requests]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda r: _post(client, "/models/reg/predict", r)["predictions"], requests))
    for one, other in zip(alone, together):
        assert [p["smiles"] for p in other] == [p["smiles"] for p in one]
        np.testing.assert_allclose(_column(other, "t1"), _column(one, "t1"), rtol=0, atol=1e-6)


@pytest.mark.parametrize("content, field", [
    ('{"smiles": ["CCO"', None),                       # malformed JSON
    ('{"smiles": "CCO"}', "smiles"),                   # not a list
    ('{"smiles": ["CCO", 7]}', "smiles"),              # a non-string item
    ('{"smiles": ["CCO"], "uncertainity": true}', "uncertainity"),  # a typo is not ignored
    ('{"molecules": ["CCO"]}', "smiles"),              # missing
])
def test_malformed_bodies_are_422_naming_the_field(served, content, field):
    client = served.client
    response = client.post("/predict", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    if field is None:
        assert "json" in str(detail).lower()
    else:
        assert field in [str(part) for error in detail for part in error["loc"]]


def test_too_many_molecules_is_413_and_unknown_model_is_404(served):
    client = served.client
    response = client.post("/predict", json={"smiles": ["C"] * (MAX_MOLECULES + 1)})
    assert response.status_code == 413 and str(MAX_MOLECULES) in response.json()["detail"]
    response = client.post("/models/nope/predict", json={"smiles": ["CCO"]})
    assert response.status_code == 404 and "nope" in response.json()["detail"]
    assert _post(client, "/predict", [])["predictions"] == []


def test_healthz_and_models(served):
    client = served.client
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    models = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert set(models) == {"cls", "reg"} and models["cls"]["default"] and not models["reg"]["default"]
    assert models["cls"]["tasks"] == ["c1", "c2"] and models["cls"]["dataset_type"] == "classification"
    assert len(models["cls"]["members"]) == 2 and models["cls"]["calibrated"]
    assert (models["cls"]["calibration_method"], models["cls"]["calibration_size"]) == ("platt", 30)
    assert models["reg"]["features_generator"] == ["rdkit_2d_normalized"]
    assert (models["reg"]["domain"], models["reg"]["domain_missing"], models["cls"]["domain"]) == (True, None, False)
    assert "domain.json" in models["cls"]["domain_missing"]
    assert models["reg"]["embedding_size"] == 32  # 2 x hidden size 16
    assert models["cls"]["training"] is None  # no run.json
    assert models["reg"]["training"] == {
        "run_id": "20261204-000000-abcdef", "metric": "rmse", "split_type": "scaffold_balanced",
        "split": "given files: val /data/val.csv, test /data/test.csv; data_path: all for training",
        "overall_test_score": 0.25, "overall_test_std": 0.0, "fold_test_scores": [0.25],
        "task_test_scores": {"t1": pytest.approx(0.3), "t2": 0.3},  # members' mean; t2's NaN member skipped
        "calibration_method": "normalised", "calibration_size": {"t1": 30, "t2": 30},
        "calibration_source": "validation molecules"}
    assert (models["reg"]["calibrated"], models["reg"]["calibration_size"]) == (True, 30)
    fixture_sha = hashlib.sha256((FIXTURE_DIR / "ckpt_ft_reg.pt").read_bytes()).hexdigest()
    assert models["reg"]["members"][0]["sha256"] == fixture_sha
    assert client.get("/docs").status_code == 200 and "/predict" in client.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_foreground_wait_ends_on_sigterm_and_sigint(signum):
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signum))
    timer.start()
    assert wait_for_stop_signal() == signum
    timer.join()


def test_a_huge_molecule_is_an_invalid_entry_at_once_and_the_service_keeps_answering(served):
    # 5,000 heavy atoms: featurised and predicted it held a replica for minutes (HTTP 503, failed health checks)
    client, huge = served.client, "C" * 5000
    with ThreadPoolExecutor(2) as pool:
        started = time.perf_counter()
        request = pool.submit(_post, client, "/predict", ["CCO", huge, "c1ccccc1"])
        other = pool.submit(_post, client, "/predict", SMILES[:3])
        predictions, alone = request.result()["predictions"], other.result()["predictions"]
        seconds = time.perf_counter() - started
    assert [p["valid"] for p in predictions] == [True, False, True] and all(p["valid"] for p in alone)
    assert predictions[1]["error"] == "too large: 5000 heavy atoms, more than --max_heavy_atoms 200"
    assert predictions[1]["c1"] is None and isinstance(predictions[0]["c1"], float)
    assert seconds < 10, seconds  # two ordinary requests' time (milliseconds on an idle machine)
    assert client.get("/healthz").status_code == 200
