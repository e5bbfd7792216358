"""`kermt predict / eval --applicability_domain` on the local Ray cluster: the columns equal the library's distances
on the same molecules, twice the same, other chemotypes out of domain; eval's fraction in domain and error inside vs
outside; a model without a domain (or another model's) is a one-line error before Ray starts. The index here is
built by the library beside the upstream fixture model; the finetune that writes it itself is in
tests/ray_app/finetune/test_domain_finetune.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from kermt.checkpoint import load_finetune_model, read_checkpoint
from kermt.data.featurize import featurize_smiles
from kermt.uncertainty.domain import (DOMAIN_FILE, DomainSearch, embedding_identity, fit_domain, model_embeddings,
                                      save_domain)
from tests.ray_app.screening.engines import main_predict
from tests.conftest import FIXTURE_DIR
from tests.kermt.uncertainty.test_domain import DEMO, OTHER_CHEMOTYPES

TASKS = ["t1", "t2"]  # the fixture model's tasks (tests/data/kermt_upstream/README.md)


@pytest.fixture(scope="module")
def model_with_domain(tmp_path_factory):
    """(directory with the fixture model and its domain, the index, the model, the query CSV): 300 demo molecules
    index it, 100 set the threshold; the query is 60 held-out molecules, 4 training ones, other chemotypes and an
    invalid row."""
    root = tmp_path_factory.mktemp("domain")
    model_dir = root / "model"
    model_dir.mkdir()
    shutil.copy(FIXTURE_DIR / "ckpt_ft_reg.pt", model_dir)
    model, _ = load_finetune_model(read_checkpoint(FIXTURE_DIR / "ckpt_ft_reg.pt"))
    smiles = pd.read_csv(DEMO).smiles.tolist()
    train, val = (model_embeddings(model, featurize_smiles(s), 32) for s in (smiles[:300], smiles[300:400]))
    index = fit_domain(train, val, embedding_identity(model.state_dict()))
    save_domain(str(model_dir), index)
    query = root / "query.csv"
    pd.DataFrame({"smiles": smiles[400:460] + smiles[:4] + OTHER_CHEMOTYPES + ["not a smiles"]}).to_csv(query,
                                                                                                      index=False)
    return model_dir, index, model, query


def _predict(model_dir, query, output, *flags) -> pd.DataFrame:
    assert main_predict(["--data_path", str(query), "--output_path", str(output), "--checkpoint_dir", str(model_dir),
                         "--batch_size", "32", *flags]) == 0
    return pq.read_table(output).to_pandas()


def test_predict_writes_the_library_distances_twice_the_same(model_with_domain, tmp_path):
    model_dir, index, model, query = model_with_domain
    frame = _predict(model_dir, query, tmp_path / "a.parquet", "--applicability_domain")
    assert list(frame.columns) == ["smiles", *TASKS, "domain_distance", "in_domain", "valid", "error"]
    smiles = pd.read_csv(query).smiles.tolist()
    expected = DomainSearch(index).distances(model_embeddings(model, featurize_smiles(smiles), 32))
    np.testing.assert_allclose(frame.domain_distance.to_numpy(float), expected, rtol=1e-6, equal_nan=True)
    again = _predict(model_dir, query, tmp_path / "b.parquet", "--applicability_domain")
    pd.testing.assert_frame_equal(frame, again)
    inside = frame.in_domain.to_numpy(object)
    assert np.mean(inside[:60].astype(bool)) >= 0.9 and all(inside[60:64])  # held out, then training molecules
    assert not any(inside[64:-1]) and pd.isna(frame.domain_distance.iloc[-1]) and pd.isna(inside[-1])
    plain = _predict(model_dir, query, tmp_path / "c.parquet")  # without the flag: as before
    assert list(plain.columns) == ["smiles", *TASKS, "valid", "error"]
    pd.testing.assert_frame_equal(plain, frame[plain.columns])


def test_a_model_without_a_domain_or_another_models_is_refused(model_with_domain, tmp_path, capsys):
    model_dir, _, _, query = model_with_domain
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(model_dir / "ckpt_ft_reg.pt", old)
    args = ["--data_path", str(query), "--output_path", str(tmp_path / "p.csv"), "--applicability_domain"]
    assert main_predict([*args, "--checkpoint_dir", str(old)]) == 2
    err = capsys.readouterr().err
    assert "has no applicability domain" in err and "it was trained before the domain existed" in err
    assert "`kermt finetune` saves each fold's applicability domain" in err
    assert main_predict([*args, "--checkpoint_path", str(old / "ckpt_ft_reg.pt")]) == 2
    assert "--applicability_domain needs the finetune run: pass --checkpoint_dir" in capsys.readouterr().err
    stale = tmp_path / "stale"
    shutil.copytree(model_dir, stale)
    record = json.loads((stale / DOMAIN_FILE).read_text())
    (stale / DOMAIN_FILE).write_text(json.dumps({**record, "model_identity": "0" * 64}))
    assert main_predict([*args, "--checkpoint_dir", str(stale)]) == 2
    assert "was built from another model than" in capsys.readouterr().err
    assert not (tmp_path / "p.csv").exists()


def test_eval_reports_the_fraction_in_domain_and_the_error_inside_and_outside(model_with_domain,
                                                                            tmp_path, capsys):
    from tests.ray_app.screening.engines import main_eval

    model_dir, index, _, _ = model_with_domain
    demo = pd.read_csv(DEMO)
    labelled = pd.concat([demo.iloc[400:460], pd.DataFrame({"smiles": OTHER_CHEMOTYPES, "logp": 1.0, "tpsa_100": 1.0})])
    data = tmp_path / "labelled.csv"
    labelled[["smiles", "logp", "tpsa_100"]].to_csv(data, index=False)
    assert main_eval(["--data_path", str(data), "--output_path", str(tmp_path / "test_result.csv"),
                      "--checkpoint_dir", str(model_dir), "--target_columns", "logp", "tpsa_100",
                      "--applicability_domain"]) == 0
    report = json.loads((tmp_path / "test_result_domain.json").read_text())
    assert report["n"] == 60 + len(OTHER_CHEMOTYPES) and report["threshold"] == index.threshold
    assert 54 <= report["n_in_domain"] <= 60
    assert np.isfinite([report["rmse_in_domain"], report["rmse_out_of_domain"]]).all()
    assert f"test applicability domain: {report['n_in_domain']} of {report['n']} molecules in domain" in \
        capsys.readouterr().out
