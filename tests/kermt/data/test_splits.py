"""Splits equal upstream's indices on upstream's own data (tests/data/kermt_upstream_splits/splits.json)."""

from __future__ import annotations

import csv
import json

import pytest

from kermt.data.splits import (
    split_description,
    index_predetermined_split,
    load_index_file,
    predetermined_split,
    random_split,
    scaffold_balanced_split,
)
from tests.conftest import SPLITS_DIR


@pytest.fixture(scope="module")
def smiles() -> list[str]:
    with open(SPLITS_DIR / "train_val.csv") as f:
        return [row[0] for row in list(csv.reader(f))[1:]]


@pytest.fixture(scope="module")
def upstream() -> dict:
    return json.loads((SPLITS_DIR / "splits.json").read_text())


@pytest.mark.parametrize("seed", [0, 1])
def test_random_split_equals_upstream(smiles, upstream, seed):
    split = random_split(len(smiles), (0.8, 0.1, 0.1), seed)
    assert split.to_dict() == upstream[f"random_0.8_0.1_0.1_seed{seed}"]


@pytest.mark.parametrize("seed", [0, 1])
def test_scaffold_balanced_split_equals_upstream(smiles, upstream, seed):
    split = scaffold_balanced_split(smiles, (0.8, 0.1, 0.1), seed)
    assert split.to_dict() == upstream[f"scaffold_balanced_0.8_0.1_0.1_seed{seed}"]


def test_scaffold_split_without_test_fraction_keeps_every_molecule(smiles, upstream):
    ref = upstream["scaffold_balanced_0.8_0.2_0.0_seed0"]
    split = scaffold_balanced_split(smiles, (0.8, 0.2, 0.0), 0)
    assert split.train == ref["train"]
    # upstream puts the leftover scaffold sets into a test part that it then discards; we keep them in val
    assert split.val == ref["val"] + ref["test"] and split.test == []
    assert sorted(split.train + split.val) == list(range(len(smiles)))


def test_split_sizes_are_validated():
    with pytest.raises(ValueError, match="summing to 1"):
        random_split(10, (0.8, 0.1, 0.2), 0)


def test_index_predetermined_and_predetermined_folds(tmp_path):
    idx = tmp_path / "folds.json"
    idx.write_text(json.dumps([[[0, 1, 2], [3], [4]], [[2, 3, 4], [0], [1]]]))
    assert index_predetermined_split(idx, 1, 5).to_dict() == {"train": [2, 3, 4], "val": [0], "test": [1]}
    with pytest.raises(ValueError, match="fold 2 requested"):
        index_predetermined_split(idx, 2, 5)
    with pytest.raises(ValueError, match="not a row index"):
        index_predetermined_split(idx, 0, 3)

    folds = tmp_path / "groups.json"
    folds.write_text(json.dumps([[0, 1], [2, 3], [4, 5]]))
    # val_fold_index 0 is a real index (upstream treated it as absent)
    split = predetermined_split(folds, test_fold_index=2, val_fold_index=0, sizes=(0.8, 0.2, 0.0), seed=0, n=6)
    assert split.to_dict() == {"train": [2, 3], "val": [0, 1], "test": [4, 5]}


def test_pickled_index_files_are_refused(tmp_path):
    path = tmp_path / "folds.pkl"
    path.write_bytes(b"not even read")
    with pytest.raises(ValueError, match="Convert it to JSON"):
        load_index_file(path)


def test_the_split_in_words_says_which_parts_came_from_separate_files():
    """Upstream's summary key says split_type whatever the files; run.json, the report and the service page say this."""
    assert split_description("scaffold_balanced") == "scaffold_balanced"
    assert split_description("random", "/d/val.csv", "/d/test.csv") == (
        "given files: val /d/val.csv, test /d/test.csv; data_path: all for training")
    assert split_description("scaffold_balanced", "/d/val.csv") == (
        "given file: val /d/val.csv; data_path: train/test by scaffold_balanced")
    assert split_description("random", None, "/d/test.csv") == (
        "given file: test /d/test.csv; data_path: train/val by random")
    assert split_description("predetermined", None, "/d/test.csv") == (
        "given file: test /d/test.csv; data_path: predetermined, its test part unused")
