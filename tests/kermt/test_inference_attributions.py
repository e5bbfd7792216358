"""Per-atom attributions (kermt.inference.attributions): additive (the values add up to the prediction minus the
baseline), each molecule's independent of its batch-mates, an ensemble's the members' mean, and on a model that
counts halogens they land on the halogens (a tiny model trained here)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from bench.attributions import TinySettings, ensemble_of, halogen_counts, halogen_mask, train_model
from kermt.data.featurize import featurize_smiles
from kermt.inference import Ensemble, plan_features, read_members
from kermt.inference.attributions import MAX_ATOM_ROWS, Attributor, PathRule, unavailable_reason
from kermt.inference.columns import OutputPlan, filled_rows, prediction_columns
from kermt.inference.reference_atom import mean_rows, reference_rows
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import SMILES
from tests.kermt.uncertainty.test_domain import DEMO


def _ensemble(name: str, **kwargs) -> tuple[Ensemble, tuple[str, ...]]:
    members = read_members([FIXTURE_DIR / name])
    return Ensemble(members, **kwargs), plan_features([m.spec for m in members]).generator


def _residual(found) -> np.ndarray:
    """|sum of the values - (explained - baseline)| per row and task, over the mean |explained - baseline|."""
    sums = np.stack([atoms.sum(axis=0) for atoms in found.atoms]) + found.descriptors
    gap = found.explained - found.baseline
    return np.abs(sums - gap) / np.abs(gap).mean()


@pytest.mark.parametrize("name", ["ckpt_ft_reg.pt", "ckpt_ft_cls.pt"])
def test_values_add_up_to_the_prediction_minus_the_baseline(name):
    """Upstream padding (each molecule at its reference width), a regression with rdkit_2d_normalized descriptors
    (their share is the descriptors column) and a classifier (the mean logit)."""
    ensemble, generator = _ensemble(name)
    molecules = featurize_smiles(SMILES[:12], generator)
    found = Attributor(ensemble).attribute(molecules)
    assert [len(atoms) for atoms in found.atoms] == molecules.graphs.atom_counts.tolist()
    assert _residual(found).mean() < 0.05
    finer = Attributor(ensemble, PathRule.integrated_gradients(64)).attribute(molecules)
    assert _residual(finer).mean() < 0.015  # the quadrature's error, which more steps shrink
    if ensemble.dataset_type == "regression":  # the explained value is the prediction, in target units
        np.testing.assert_allclose(found.explained, ensemble.predict(molecules, 32).mean, atol=1e-5)
        assert np.abs(found.descriptors).mean() > 0.01
    else:
        assert (found.descriptors == 0).all()


def test_a_molecules_values_do_not_depend_on_its_batch_mates():
    ensemble, generator = _ensemble("ckpt_ft_reg.pt")
    molecules = featurize_smiles(SMILES[:10], generator)
    assert Attributor(ensemble).atoms_per_forward == MAX_ATOM_ROWS  # a narrow encoder: the cap bounds memory
    together = Attributor(ensemble).attribute(molecules)
    small_forwards = Attributor(ensemble, atoms_per_forward=200).attribute(molecules)  # a few molecules each
    for row in (0, 7):
        alone = Attributor(ensemble).attribute(molecules.select([row]))
        for found in (together, small_forwards):
            np.testing.assert_allclose(found.atoms[row], alone.atoms[0], rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(found.baseline[row], alone.baseline[0], rtol=1e-5)


def test_an_ensemble_attributes_the_mean_of_its_members(tmp_path):
    from tests.kermt.test_inference import ensemble_dir

    run = ensemble_dir(tmp_path / "run")
    paths = [run / "fold_0" / "model_0" / "model.pt", run / "fold_0" / "model_1" / "model"]
    members = read_members(paths)
    molecules = featurize_smiles(SMILES[:4], plan_features([m.spec for m in members]).generator)
    both = Attributor(Ensemble(members)).attribute(molecules)
    each = [Attributor(Ensemble([member])).attribute(molecules) for member in members]
    assert not np.allclose(each[0].atoms[0], each[1].atoms[0])
    for row in range(4):
        np.testing.assert_allclose(both.atoms[row], (each[0].atoms[row] + each[1].atoms[row]) / 2, atol=1e-9)
    np.testing.assert_allclose(both.descriptors, (each[0].descriptors + each[1].descriptors) / 2, atol=1e-9)


def test_invalid_and_over_budget_molecules_get_no_values_and_upstream_batching_none():
    ensemble, _ = _ensemble("ckpt_ft_cls.pt")
    molecules = featurize_smiles(["CCO", "not a smiles", "c1ccccc1CCCCCC"])
    found = Attributor(ensemble, max_heavy_atoms=5).attribute(molecules)
    assert found.atoms[0].shape == (3, 2) and found.atoms[1] is None and found.atoms[2] is None
    assert found.over_budget.tolist() == [False, False, True] and np.isnan(found.baseline[1:]).all()
    specs = ensemble.specs
    assert unavailable_reason(specs, upstream_batching=False) is None
    assert "--upstream_batching" in unavailable_reason(specs, upstream_batching=True)


def test_attribution_columns_are_json_lists_empty_where_a_molecule_has_none():
    ensemble, _ = _ensemble("ckpt_ft_cls.pt")
    molecules = featurize_smiles(["CCO", "not a smiles", "c1ccccc1CCCCCC"])
    found = Attributor(ensemble, max_heavy_atoms=5).attribute(molecules)
    plan = OutputPlan(("c1", "c2"), False, attributions=True)
    prediction = ensemble.predict(molecules, 32)
    columns = prediction_columns(plan, prediction.mean, prediction.std, molecules.valid, attributions=found)
    assert list(columns) == ["c1", "c2", "c1_atoms", "c1_baseline", "c2_atoms", "c2_baseline"]
    atoms = [None if cell is None else json.loads(cell) for cell in columns["c1_atoms"]]
    assert len(atoms[0]) == 3 and atoms[1] is None and atoms[2] is None
    np.testing.assert_allclose(atoms[0], found.atoms[0][:, 0], rtol=1e-3)
    assert filled_rows(plan, "c1_baseline", columns["c1_baseline"], molecules.valid).tolist() == [True, False, False]
    assert filled_rows(plan, "c1", columns["c1"], molecules.valid).tolist() == [True, False, True]


def test_the_reference_atom_is_the_mean_atom_of_the_demo_molecules():
    atom, bond = mean_rows(pd.read_csv(DEMO).smiles.tolist())
    reference_atom, reference_bond = reference_rows()
    np.testing.assert_allclose(reference_atom, atom, atol=5.1e-5)
    np.testing.assert_allclose(reference_bond, bond, atol=5.1e-5)


@pytest.fixture
def one_thread():
    """One torch thread while a test trains: on a shared 2-core machine two threads spin against other work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_halogen_counting_model_attributes_to_its_halogens(tmp_path, one_thread):
    smiles = pd.read_csv(DEMO).smiles.tolist()
    train, held_out = smiles[:800], [s for s in smiles[1900:] if halogen_mask(s).any()]
    settings = TinySettings(hidden_size=32, depth=2, num_attn_head=1, epochs=15, lr=3e-3)
    model = train_model(train, halogen_counts(train), "halogens", tmp_path, settings, log=lambda line: None)
    ensemble = ensemble_of(model)
    molecules = featurize_smiles(held_out)
    found = Attributor(ensemble).attribute(molecules)
    shares = [np.abs(values[mask, 0]).sum() / np.abs(values[:, 0]).sum()
              for values, mask in zip(found.atoms, map(halogen_mask, held_out))]
    halogen_fraction = np.mean([halogen_mask(s).mean() for s in held_out])
    assert np.mean(shares) > 0.5 > 5 * halogen_fraction, (np.mean(shares), halogen_fraction)  # measured: 0.70
