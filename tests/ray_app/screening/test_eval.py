"""`kermt eval` scores against values computed independently: sklearn metrics on upstream's own predictions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import mean_squared_error, roc_auc_score

from tests.ray_app.screening.engines import main_eval
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import OUTPUTS, PARITY


def _printed(out: str, prefix: str) -> float:
    return float(next(line for line in out.splitlines() if line.startswith(prefix)).split("=")[-1])


def test_regression_rmse_equals_sklearn_on_upstream_predictions(tmp_path, capsys):
    data = pd.read_csv(FIXTURE_DIR / "smiles.csv")  # t2 has two missing labels: scored on its labelled rows only
    out = tmp_path / "test_result.csv"
    assert main_eval(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(out),
                      "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt"), "--show_individual_scores",
                      "--upstream_batching"]) == 0  # upstream's batch of 26: its outputs are the oracle
    printed = capsys.readouterr().out
    upstream = OUTPUTS["ft_reg_final_prediction"]
    expected = []
    for t, task in enumerate(["t1", "t2"]):
        labelled = data[task].notna().to_numpy()
        expected.append(mean_squared_error(data[task][labelled], upstream[labelled, t]) ** 0.5)
        assert _printed(printed, f"test {task} rmse = ") == pytest.approx(expected[-1], abs=1e-5)
    assert _printed(printed, "overall_test_rmse=") == pytest.approx(np.mean(expected), abs=1e-5)
    result = pd.read_csv(out, header=[0, 1], index_col=0)  # upstream's two header rows
    assert list(result.columns) == [("preds", "t1"), ("preds", "t2"), ("targets", "t1"), ("targets", "t2")]
    np.testing.assert_allclose(result["preds"].to_numpy(), upstream, rtol=0, atol=PARITY)
    np.testing.assert_array_equal(result["targets"].to_numpy(), data[["t1", "t2"]].to_numpy())


def test_classification_auc_with_renamed_labels_and_an_invalid_row(tmp_path, capsys):
    data = pd.read_csv(FIXTURE_DIR / "smiles_cls.csv").rename(columns={"c1": "active_a", "c2": "active_b"})
    with_invalid = pd.concat([data, pd.DataFrame({"smiles": ["not_a_smiles"], "active_a": [1], "active_b": [0]})])
    with_invalid.to_csv(tmp_path / "labelled.csv", index=False)
    assert main_eval(["--data_path", str(tmp_path / "labelled.csv"), "--output_path", str(tmp_path / "r.csv"),
                      "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_cls.pt"),
                      "--target_columns", "active_a", "active_b", "--upstream_batching"]) == 0
    captured = capsys.readouterr()
    upstream = OUTPUTS["ft_cls_final_prediction"]  # the same 26 valid molecules in one batch
    expected = []
    for t, column in enumerate(["active_a", "active_b"]):
        labelled = data[column].notna().to_numpy()
        expected.append(roc_auc_score(data[column][labelled], upstream[labelled, t]))
    assert _printed(captured.out, "overall_test_auc=") == pytest.approx(np.mean(expected), abs=1e-6)
    assert "1 invalid SMILES skipped" in captured.err
    assert len(pd.read_csv(tmp_path / "r.csv", header=[0, 1], index_col=0)) == 26


def test_label_mistakes_are_user_errors_before_ray_starts(tmp_path, capsys):
    common = ["--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_cls.pt"), "--output_path", str(tmp_path / "r.csv")]
    assert main_eval(["--data_path", str(FIXTURE_DIR / "smiles.csv"), *common]) == 2  # no c1/c2 columns
    assert "kermt eval: error: column 'c1' is not in the data" in capsys.readouterr().err
    assert main_eval(["--data_path", str(FIXTURE_DIR / "smiles.csv"), *common, "--target_columns", "t1"]) == 2
    assert "--target_columns names 1 column(s) but the model predicts 2 tasks" in capsys.readouterr().err
