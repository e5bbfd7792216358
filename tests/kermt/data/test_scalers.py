from __future__ import annotations

import numpy as np
import pytest
import torch

from kermt.data.scalers import StandardScaler
from kermt.errors import UserError
from tests.conftest import FIXTURE_DIR


def _targets() -> np.ndarray:
    import csv

    with open(FIXTURE_DIR / "smiles.csv") as f:
        rows = list(csv.reader(f))[1:]
    return np.array([[float(x) if x != "" else np.nan for x in r[1:]] for r in rows])


def test_fit_on_fixture_targets_equals_upstream_ckpt_scaler():
    # ckpt_ft_reg was trained on smiles.csv with a random split; its scaler was fit on that train split. Here we
    # check the statistics themselves on the whole file against numpy's nan-aware population formulas.
    y = _targets()
    scaler = StandardScaler.fit(y)
    np.testing.assert_allclose(scaler.means, np.nanmean(y, axis=0), rtol=0, atol=0)
    np.testing.assert_allclose(scaler.stds, np.nanstd(y, axis=0, ddof=0), rtol=0, atol=0)
    back = scaler.inverse_transform(scaler.transform(y))
    np.testing.assert_allclose(back, y, atol=1e-12)
    assert np.isnan(back[4, 1]) and np.isnan(back[10, 1])


def test_degenerate_columns_and_round_trip():
    x = np.array([[1.0, np.nan, 5.0], [1.0, np.nan, 7.0]])
    scaler = StandardScaler.fit(x)
    assert scaler.means.tolist() == [1.0, 0.0, 6.0]
    assert scaler.stds.tolist() == [1.0, 1.0, 1.0]
    again = StandardScaler.from_dict(scaler.to_dict())
    assert np.array_equal(again.means, scaler.means) and np.array_equal(again.stds, scaler.stds)
    assert StandardScaler.from_dict(None) is None


def test_reads_upstream_checkpoint_scaler():
    ckpt = torch.load(FIXTURE_DIR / "ckpt_ft_reg.pt", weights_only=False)
    scaler = StandardScaler.from_dict(ckpt["data_scaler"])
    np.testing.assert_allclose(scaler.means, [0.02153846, 0.34291667], atol=1e-8)
    np.testing.assert_allclose(scaler.stds, [1.59861404, 0.90467526], atol=1e-8)


def test_infinite_values_are_an_error_naming_row_and_column():
    x = np.array([[1.0, 2.0], [np.nan, 3.0], [4.0, np.inf], [5.0, -np.inf]])
    with pytest.raises(UserError, match=r"cannot fit a scaler on infinite values: row 2, column 1 is \+inf "
                                         r"\(2 infinite value\(s\) in all"):
        StandardScaler.fit(x)
    scaler = StandardScaler.fit(x[:2])  # NaN is a missing value, not an error
    assert scaler.means.tolist() == [1.0, 2.5]
    with pytest.raises(ValueError, match=r"cannot scale infinite values: row 0, column 1 is -inf"):
        scaler.transform(x[3:])
    with pytest.raises(ValueError, match=r"row 1, column 0 is \+inf"):
        StandardScaler.fit(np.array([0.5, np.inf]))
