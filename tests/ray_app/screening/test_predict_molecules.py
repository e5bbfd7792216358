"""`kermt predict` applies the model's standardisation (a salt gets its parent acid's number, and the output says
what the model saw), refuses a huge molecule as its own row, and passes RDKit's reason on."""

from __future__ import annotations

import numpy as np
import pandas as pd

import kermt

from kermt.inference.columns import MODEL_SMILES_COLUMN
from tests.ray_app.screening.engines import main_predict
from tests.kermt.chem.test_standardize import standardizing_checkpoint

ROWS = ["CC(=O)[O-].[Na+]", "CC(=O)O", "C" * 5000, "CC(C", "O=C([O-])c1ccccc1.[K+]", "O=C(O)c1ccccc1", "CCO"]


def test_a_salt_gets_its_parent_acids_number_and_a_huge_molecule_is_its_own_row(tmp_path):
    model = standardizing_checkpoint(tmp_path / "model")
    pd.DataFrame({"smiles": ROWS}).to_csv(tmp_path / "in.csv", index=False)
    assert main_predict(["--data_path", str(tmp_path / "in.csv"), "--output_path", str(tmp_path / "out.csv"),
                         "--checkpoint_path", str(model)]) == 0
    out = pd.read_csv(tmp_path / "out.csv", keep_default_na=False, na_values=[""])
    assert list(out.columns) == ["smiles", "c1", "c2", "valid", "error", MODEL_SMILES_COLUMN]
    assert out["valid"].tolist() == [True, True, False, False, True, True, True]
    assert out[MODEL_SMILES_COLUMN].fillna("").tolist() == ["CC(=O)O", "", "", "", "O=C(O)c1ccccc1", "", ""]
    values = out[["c1", "c2"]].to_numpy(float)
    np.testing.assert_allclose(values[0], values[1], rtol=0, atol=1e-6)  # the sodium salt is acetic acid
    np.testing.assert_allclose(values[4], values[5], rtol=0, atol=1e-6)  # the potassium salt is benzoic acid
    assert out["error"][2] == "too large: 5000 heavy atoms, more than --max_heavy_atoms 200"
    assert out["error"][3] == ("unparsable: extra open parentheses while parsing: CC(C; check for mistakes around "
                               "position 3")  # RDKit's own message
    ours = kermt.load_run(model).predict(ROWS)  # the library call: the same standardisation, columns and numbers
    assert list(ours.columns) == list(out.columns) and ours["error"].tolist() == out["error"].fillna("").tolist()
    assert ours[MODEL_SMILES_COLUMN].tolist() == out[MODEL_SMILES_COLUMN].fillna("").tolist()
    np.testing.assert_allclose(ours[["c1", "c2"]].to_numpy(float), values, rtol=0, atol=1e-9, equal_nan=True)


def test_an_atom_limit_below_one_is_one_line_before_any_work(tmp_path, capsys):
    pd.DataFrame({"smiles": ROWS}).to_csv(tmp_path / "in.csv", index=False)
    assert main_predict(["--data_path", str(tmp_path / "in.csv"), "--output_path", str(tmp_path / "out.csv"),
                         "--checkpoint_path", "no_such_model", "--max_heavy_atoms", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_heavy_atoms" in err[0] and not (tmp_path / "out.csv").exists()
