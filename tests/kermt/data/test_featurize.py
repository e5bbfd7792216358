"""featurize_smiles: row alignment, validity, upstream feature values, array round trip, npz files."""

from __future__ import annotations

import numpy as np
import pytest

from kermt.chem.descriptors import RDKIT2D_COLUMNS, infinite_feature_reasons
from kermt.chem.validation import EMPTY, NO_HEAVY_ATOMS, UNPARSABLE
from kermt.chem import descriptors as descriptors_module
from kermt.data.feature_files import load_features, load_features_files, save_features
from kermt.data.featurize import UNFEATURIZABLE, FeaturizedMolecules, featurize_smiles
from tests.conftest import FIXTURE_DIR

GRAPH = np.load(FIXTURE_DIR / "graph.npz", allow_pickle=False)
FIXTURE_SMILES = [str(s) for s in GRAPH["smiles"]]
BAD = {1: "", 4: "C1CC", 7: "[H][H]", 9: "CC[Fe+7]"}


def _with_bad_rows() -> list[str]:
    rows = list(FIXTURE_SMILES)
    for row, smiles in sorted(BAD.items()):
        rows.insert(row, smiles)
    return rows


@pytest.fixture(scope="module")
def featurized() -> FeaturizedMolecules:
    return featurize_smiles(_with_bad_rows(), ("rdkit_2d_normalized", "fgtasklabel"))


def test_invalid_rows_keep_their_place_with_a_reason(featurized):
    assert len(featurized) == len(FIXTURE_SMILES) + len(BAD)
    reasons = {bad.row: bad.reason for bad in featurized.invalid}
    assert set(reasons) == set(BAD)
    assert (reasons[1], reasons[4], reasons[7]) == (EMPTY, f"{UNPARSABLE}: unclosed ring for input: 'C1CC'",
                                                     NO_HEAVY_ATOMS)
    assert reasons[9].startswith(UNFEATURIZABLE) and "+7" in reasons[9]
    assert np.isnan(featurized.features[list(BAD)]).all()
    assert (featurized.graphs.atom_counts[list(BAD)] == 0).all()


def test_valid_rows_equal_upstream_features_and_graph(featurized):
    valid = featurized.select(np.flatnonzero(featurized.valid))
    assert list(valid.smiles) == FIXTURE_SMILES
    np.testing.assert_allclose(valid.features[:, :200], GRAPH["rdkit2d_norm_datapoint"], rtol=0, atol=1e-6)
    assert not np.isnan(valid.features).any()  # NaN -> 0 on valid rows, as upstream's datapoint
    batch = valid.batch_graph()
    np.testing.assert_array_equal(batch.f_bonds.numpy(), GRAPH["batch_f_bonds"])
    np.testing.assert_array_equal(batch.a2a.numpy(), GRAPH["batch_a2a"])
    with pytest.raises(ValueError, match="row 1: empty"):
        featurized.batch_graph()


def test_flat_arrays_round_trip_without_pickling(featurized, tmp_path):
    arrays = featurized.to_arrays()
    assert all(a.dtype != object for a in arrays.values())
    np.savez(tmp_path / "batch.npz", **arrays)
    with np.load(tmp_path / "batch.npz", allow_pickle=False) as data:
        back = FeaturizedMolecules.from_arrays(dict(data))
    assert back.smiles == featurized.smiles and back.reasons == featurized.reasons
    np.testing.assert_array_equal(back.features, featurized.features)
    np.testing.assert_array_equal(back.graphs.f_atoms, featurized.graphs.f_atoms)


def test_feature_files_stay_aligned_with_csv_rows(featurized, tmp_path):
    path = tmp_path / "features.npz"
    save_features(path, featurized.features, featurized.valid)
    features, valid = load_features(path, expected_rows=len(featurized))
    np.testing.assert_array_equal(valid, featurized.valid)
    np.testing.assert_array_equal(features[valid], featurized.features[valid])
    with pytest.raises(ValueError, match="one row per CSV row"):
        load_features(path, expected_rows=len(FIXTURE_SMILES))


def test_upstream_style_file_without_mask_and_several_files(tmp_path):
    upstream = np.array([[1.0, np.nan], [np.nan, np.nan], [0.5, 2.0]])
    np.savez_compressed(tmp_path / "up.npz", features=upstream)
    save_features(tmp_path / "ours.npz", np.ones((3, 1)), np.array([True, True, False]))
    features, valid = load_features_files([tmp_path / "up.npz", tmp_path / "ours.npz"], expected_rows=3)
    assert valid.tolist() == [True, False, False]
    assert features[0].tolist() == [1.0, 0.0, 1.0]  # NaN inside a valid row -> 0, as upstream


def test_infinite_feature_reasons_name_generator_and_column():
    features = np.zeros((3, 200 + 2048))
    features[1, 5] = np.inf
    features[2, 200 + 17] = -np.inf
    features[2, 201 + 17] = np.inf
    reasons = infinite_feature_reasons(features, ("rdkit_2d", "morgan_count"))
    assert reasons == {1: f"infinite feature: rdkit_2d:{RDKIT2D_COLUMNS[5]} (column 5) is +inf",
                       2: "infinite feature: morgan_count:bit_17 (column 217) is -inf, and 1 more column(s)"}


def test_a_row_with_an_infinite_feature_is_invalid_naming_the_column(monkeypatch):
    # No small molecule overflows a descriptor, so one row of the real features is made infinite, as an overflowing
    # Ipc would be; everything else is the real pipeline.
    real = descriptors_module.molecule_features

    def with_an_overflow(mols, generators):
        features = real(mols, generators)
        features[1, RDKIT2D_COLUMNS.index("Ipc")] = np.inf
        return features

    monkeypatch.setattr(descriptors_module, "molecule_features", with_an_overflow)  # featurize imports it late
    done = featurize_smiles(["CCO", "c1ccccc1O", "CC(=O)N"], ("rdkit_2d",))
    assert done.valid.tolist() == [True, False, True]
    assert done.reasons[1] == f"{UNFEATURIZABLE}: infinite feature: rdkit_2d:Ipc (column " \
                              f"{RDKIT2D_COLUMNS.index('Ipc')}) is +inf"
    assert done.graphs.atom_counts[1] == 0 and np.isnan(done.features[1]).all()
    assert np.isfinite(done.features[[0, 2]]).all() and done.graphs.atom_counts[[0, 2]].tolist() == [3, 4]
