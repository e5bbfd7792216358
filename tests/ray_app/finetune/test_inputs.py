"""Finetune input checks before Ray starts: every format is accepted, each mistake names its file, row or flag."""

from __future__ import annotations

import pytest

from kermt.errors import UserError
from ray_app.finetune.config import FinetuneConfig
from ray_app.finetune.inputs import check_finetune_inputs, read_labelled
from tests.conftest import FIXTURE_DIR
from tests.kermt.data.test_formats import fixture_frame, write_formats


def test_compressed_training_file_and_a_smiles_file_as_blinded_test_set(tmp_path):
    paths = write_formats(fixture_frame(), tmp_path)
    config = FinetuneConfig(data_path=str(paths["csv.zst"]), target_columns=["t1", "t2"],
                            separate_test_path=str(paths["smi"]), checkpoint_path=str(FIXTURE_DIR / "ckpt_ft_reg.pt"))
    check_finetune_inputs(config)
    test, blinded = read_labelled(str(paths["smi"]), config, ["t1", "t2"], blinded_ok=True)
    assert blinded and len(test) == 26 and test.target_names == ["t1", "t2"]


def test_each_mistake_is_a_user_error_naming_where(tmp_path):
    good = str(FIXTURE_DIR / "smiles.csv")
    (tmp_path / "val.csv").write_text("smiles,t1,t2\nCCO,1,x\n")
    (tmp_path / "cls.csv").write_text("smiles,y\nCCO,1\nCCC,2\n")
    (tmp_path / "unlabelled.csv").write_text("smiles,y,z\nCCO,,1\nCCC,,2\n")
    (tmp_path / "twice.csv").write_text("smiles,y,y\nCCO,1,2\nCCC,2,3\n")
    cases = [
        (dict(data_path=good, separate_val_path=str(tmp_path / "val.csv")),
         r"val.csv: line 2, column 't2': label 'x' is not a number"),
        (dict(data_path=str(tmp_path / "cls.csv"), dataset_type="classification"),
         r"cls.csv: line 3, column 'y': label 2 is not 0 or 1"),
        (dict(data_path=good, features_path=[str(tmp_path / "f.npz")]), r"--features_path .*f.npz does not exist"),
        (dict(data_path=good, checkpoint_path=str(tmp_path / "val.csv")), r"val.csv is not a checkpoint"),
        (dict(data_path=good, target_columns=["t3"]),
         r"smiles.csv: no column 't3'; columns are \['smiles', 't1', 't2'\]"),
        # the first hour's silent trainings: a label column with no label at all (30 epochs of loss 0), and a header
        # naming a column twice (pandas would have read the second as 'y.1', a task of its own)
        (dict(data_path=str(tmp_path / "unlabelled.csv")),
         r"unlabelled.csv: target column 'y' holds no label in any of its 2 rows; fill it, or train on the other "),
        (dict(data_path=str(tmp_path / "twice.csv")), r"twice.csv: column 'y' appears 2 times in the header"),
    ]
    for settings, message in cases:
        with pytest.raises(UserError, match=message):
            check_finetune_inputs(FinetuneConfig(**settings))
