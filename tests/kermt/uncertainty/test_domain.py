"""The applicability domain on real molecules and a real finetuned model (the tiny upstream fixture): training
molecules sit on the index, held-out drug-like molecules are mostly in domain, other chemotypes are not; the files
round-trip and a mismatched pair is refused."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from kermt.checkpoint import load_finetune_model, read_checkpoint
from kermt.data.featurize import featurize_smiles
from kermt.errors import UserError
from kermt.uncertainty.domain import (DOMAIN_ARRAYS_FILE, DOMAIN_FILE, DomainSearch, embedding_identity,
                                      fit_domain, load_domain, model_embeddings, save_domain)
from tests.conftest import DATA_DIR, FIXTURE_DIR

DEMO = DATA_DIR.parents[1] / "data/sample/admet_demo.csv"
OTHER_CHEMOTYPES = [
    "C" * 30, "C" * 40,  # long alkanes
    "FC(F)(F)C(F)(F)C(F)(F)C(F)(F)C(F)(F)C(F)(F)F", "ClC(Cl)(Cl)C(Cl)(Cl)Cl",  # perhalogenated
    "C[Sn](C)(C)C", "CC[Pb](CC)(CC)CC", "[Fe]", "[CH-]1C=CC=C1.[CH-]1C=CC=C1.[Fe+2]", "O=[Si]=O",  # metals
    "NCC(=O)NCC(=O)NCC(=O)NCC(=O)NCC(=O)NCC(=O)O",  # a glycine hexapeptide
]


@pytest.fixture(scope="module")
def embedded():
    """The model and its embeddings of 300 training, 100 validation and 100 test molecules (demo file order)."""
    model, _ = load_finetune_model(read_checkpoint(FIXTURE_DIR / "ckpt_ft_reg.pt"))
    smiles = pd.read_csv(DEMO).smiles.tolist()
    parts = {"train": smiles[:300], "val": smiles[300:400], "test": smiles[400:500], "other": OTHER_CHEMOTYPES}
    return model, {name: model_embeddings(model, featurize_smiles(s), 32) for name, s in parts.items()}


@pytest.fixture(scope="module")
def index(embedded):
    model, e = embedded
    return fit_domain(e["train"], e["val"], embedding_identity(model.state_dict()))


def test_training_molecules_sit_on_the_index(embedded, index):
    _, e = embedded
    near = DomainSearch(index).neighbour_distances(e["train"])
    assert near[:, 0].max() <= 1e-3 * near[:, 1].min()  # each molecule finds itself, far below any other molecule
    assert index.k == 5 and index.training.shape == (300, 64) and index.n_training_total == 300


def test_held_out_drug_like_in_domain_other_chemotypes_out(embedded, index):
    _, e = embedded
    search = DomainSearch(index)
    val, test, other = (search.distances(e[name]) for name in ("val", "test", "other"))
    assert index.in_domain(val).mean() == pytest.approx(0.95, abs=0.011)  # the threshold's own quantile
    assert index.in_domain(test).mean() >= 0.9
    assert not index.in_domain(other).any()
    assert other.min() > index.threshold and np.median(other) > 3 * np.median(test)
    assert np.median(search.distances(e["train"])) < np.median(test)


def test_invalid_rows_give_nan_and_a_tiny_validation_split_is_refused(embedded, index):
    model, e = embedded
    rows = model_embeddings(model, featurize_smiles(["CCO", "not a smiles", "c1ccccc1O"]), 32)
    distances = DomainSearch(index).distances(rows)
    assert np.isnan(distances[1]) and np.isfinite(distances[[0, 2]]).all()
    with pytest.raises(ValueError, match="a domain needs at least 2 and 10"):
        fit_domain(e["train"], e["val"][:9], "x")


def test_files_round_trip_and_a_mismatched_pair_is_refused(embedded, index, tmp_path):
    _, e = embedded
    save_domain(str(tmp_path), index)
    record = json.loads((tmp_path / DOMAIN_FILE).read_text())
    assert {record[k] for k in ("k", "embedding_dim", "components", "n_training")} >= {5, 256, 64, 300}
    assert record["quantile"] == 0.95 and record["model_identity"] == index.identity
    loaded = load_domain(str(tmp_path))
    np.testing.assert_array_equal(DomainSearch(loaded).distances(e["test"]), DomainSearch(index).distances(e["test"]))
    assert loaded.threshold == index.threshold
    other = fit_domain(e["train"][:200], e["val"], index.identity)
    save_domain(str(tmp_path / "other"), other)
    (tmp_path / DOMAIN_ARRAYS_FILE).write_bytes((tmp_path / "other" / DOMAIN_ARRAYS_FILE).read_bytes())
    with pytest.raises(UserError, match="is not the file .* was written with"):
        load_domain(str(tmp_path))
    with pytest.raises(UserError, match="does not exist"):
        load_domain(str(tmp_path / "missing"))


def test_subsample_is_seeded_and_the_identity_follows_the_weights(embedded):
    model, e = embedded
    first, second = (fit_domain(e["train"], e["val"], "x", max_training=120) for _ in range(2))
    assert first.training.shape[0] == 120 and first.n_training_total == 300
    np.testing.assert_array_equal(first.training, second.training)
    assert first.threshold == second.threshold
    state = model.state_dict()
    identity = embedding_identity(state)
    reloaded, _ = load_finetune_model(read_checkpoint(FIXTURE_DIR / "ckpt_ft_reg.pt"))
    assert identity == embedding_identity(reloaded.state_dict())
    name = next(k for k in state if k.startswith("readout."))
    changed = {**state, name: state[name] + torch.full_like(state[name], 1e-6)}
    assert embedding_identity(changed) != identity
