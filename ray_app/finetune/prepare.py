"""Driver-side data preparation for a finetune run: read, validate, featurise (on the cluster; here, in this
process, under --dry_run), split, scale.

Every input file is featurised once per run. Invalid SMILES never stop a run silently: each one is listed with
its file, row and reason (``invalid_smiles.csv``), and ``--on_invalid error`` turns them into an error.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kermt.chem.standardize import MoleculePrep
from kermt.chem.validation import InvalidSmiles
from kermt.data.dataset import MoleculeSet
from kermt.data.feature_files import load_features
from kermt.data.formats import row_place
from kermt.data.featurize import FeaturizedMolecules, featurize_smiles
from kermt.data.scalers import StandardScaler
from kermt.data.splits import (
    Split,
    crossval_split,
    index_predetermined_split,
    load_index_file,
    predetermined_split,
    random_split,
    scaffold_balanced_split,
)
from kermt.errors import UserError
from ray_app.common.progress import Progress
from ray_app.finetune.config import FinetuneConfig
from ray_app.finetune.inputs import read_labelled

ALREADY_NORMALISED = ("rdkit_2d_normalized",)
HERE_CHUNK_ROWS = 2048  # a dry run featurises this many rows between two progress checks
Featurizer = Callable[..., FeaturizedMolecules]  # (smiles, features_generator, label=, prep=)


@dataclass(frozen=True)
class SourceData:
    """The valid molecules of one input file. ``rows``: their data-row numbers in the file."""

    path: str
    target_names: list[str]
    rows: np.ndarray
    featurized: FeaturizedMolecules
    targets: np.ndarray
    invalid: tuple[InvalidSmiles, ...]

    def __len__(self) -> int:
        return len(self.rows)


def load_source(
    path: str, config: FinetuneConfig, target_names: list[str] | None, features_paths: list[str] | None,
    blinded_ok: bool = False,
) -> SourceData:
    """Read one file (see :func:`read_labelled`), featurise it on the cluster, drop (and remember) invalid rows."""
    table, blinded = read_labelled(path, config, target_names, blinded_ok)
    if blinded:
        print(f"{path}: no label columns, so it is a blinded test set (predictions only, no test score)", flush=True)
    featurized = featurizer(config)(table.smiles, config.features_generator or (), label=f"featurising {path}",
                                    prep=MoleculePrep(config.standardize, config.max_heavy_atoms))
    if features_paths:
        extra = [load_features(p, expected_rows=len(table))[0] for p in features_paths]
        featurized = dataclasses.replace(featurized, features=np.concatenate(extra, axis=1))
    invalid = tuple(featurized.invalid)
    if invalid and config.on_invalid == "error":
        shown = "; ".join(f"{row_place(path, bad.row)}: {bad.reason}: {bad.smiles!r}" for bad in invalid[:10])
        raise UserError(f"{path}: {len(invalid)} invalid SMILES (--on_invalid error): {shown}")
    rows = np.flatnonzero(featurized.valid)
    if len(rows) == 0:
        raise UserError(f"{path}: none of its {len(table)} rows has a valid SMILES")
    return SourceData(path, table.target_names, rows, featurized.select(rows), table.targets[rows], invalid)


def featurizer(config: FinetuneConfig) -> Featurizer:
    """Ray Data tasks on the cluster; under --dry_run, which starts no cluster, :func:`featurize_here` (the
    function each cluster task runs, so the same rows are found valid)."""
    if config.dry_run:
        return featurize_here
    from ray_app.common.featurize import featurize_on_cluster  # imports Ray

    return featurize_on_cluster


def featurize_here(smiles: Sequence[str], features_generator: Sequence[str] = (), label: str = "featurising",
                   prep: MoleculePrep = MoleculePrep()) -> FeaturizedMolecules:
    """Featurise ``smiles`` in this process, in chunks, with progress lines headed ``label`` for a long file."""
    progress, parts = Progress(label, total=len(smiles)), []
    for start in range(0, len(smiles), HERE_CHUNK_ROWS):
        parts.append(featurize_smiles(list(smiles[start:start + HERE_CHUNK_ROWS]), features_generator, prep=prep))
        progress.advance(len(parts[-1]))
    progress.finish()
    return FeaturizedMolecules.concat(parts) if parts else featurize_smiles([], features_generator, prep=prep)


def write_invalid(path: Path, sources: list[SourceData]) -> int:
    """invalid_smiles.csv: file, row (0-based data row), SMILES, reason. Returns how many."""
    count = sum(len(s.invalid) for s in sources)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "row", "smiles", "reason"])
        for source in sources:
            for bad in source.invalid:
                writer.writerow([source.path, bad.row, bad.smiles, bad.reason])
    return count


def fold_count(config: FinetuneConfig) -> int:
    if config.split_type == "index_predetermined":
        return len(load_index_file(config.crossval_index_file))  # one fold per entry, as upstream
    return config.num_folds


def split_for_fold(config: FinetuneConfig, data: SourceData, fold: int, has_val: bool, has_test: bool) -> Split:
    """Row positions (into ``data``) of train/val/test for ``fold``. Separate files replace the split parts.

    Upstream bug fixed (docs/upstream-compatibility.md#splits): with only a separate val file, the split is train/test
    (0.8/0.2); upstream discarded the 20 % and left the test set empty.
    """
    n, seed = len(data), config.seed + fold
    if config.split_type == "index_predetermined":
        return index_predetermined_split(config.crossval_index_file, fold, n)
    if config.split_type == "crossval":
        return crossval_split(config.crossval_index_dir, config.crossval_index_file, fold, n)
    if config.split_type == "predetermined":
        return predetermined_split(config.folds_file, config.test_fold_index, config.val_fold_index,
                                   config.split_sizes, seed, n)
    if has_val and has_test:
        return Split(list(range(n)), [], [])
    sizes = split_fractions(config, has_val, has_test)
    if config.split_type == "scaffold_balanced":
        return scaffold_balanced_split(list(data.featurized.smiles), sizes, seed)
    return random_split(n, sizes, seed)


def split_fractions(config: FinetuneConfig, has_val: bool, has_test: bool) -> tuple[float, float, float]:
    """The train/val/test fractions of ``data_path``: ``--split_sizes``, or 0.8/0.2 beside one separate file, all of
    it for training beside both."""
    if has_val and has_test:
        return 1.0, 0.0, 0.0
    return (0.8, 0.0, 0.2) if has_val else (0.8, 0.2, 0.0) if has_test else config.split_sizes


def check_train_labels(config: FinetuneConfig, data: SourceData, train_targets: np.ndarray, fold: int,
                       whole_file: bool) -> None:
    """Every task has a label in ``fold``'s train split (``whole_file``: the split is all of ``data``, as with both
    separate files). A task with none would train its head on nothing, a loss of 0 for every epoch: one line naming
    the task, the split and what to do, on the driver before any training. An empty train split is left to
    the empty-split error."""
    for t, task in enumerate(data.target_names if len(train_targets) else ()):
        if not np.isnan(train_targets[:, t]).all():
            continue
        labelled = int(np.count_nonzero(~np.isnan(data.targets[:, t])))
        fix = "or train on the other tasks with --target_columns"
        split = "the train split" + (", which is the whole file (--separate_val_path and --separate_test_path hold "
                                     "val and test)" if whole_file else "")
        if whole_file or not labelled:
            raise UserError(f"{data.path}: task {task!r} has no label in {split}: none of the file's valid molecules "
                            f"is labelled for it; label some, {fix}")
        raise UserError(f"fold {fold}: task {task!r} has no label in {split}: the {labelled} molecule(s) of "
                        f"{data.path} labelled for it all went to val/test (--split_type {config.split_type}, "
                        f"--seed {config.seed}); label more, change {config.split_flag} or --seed, {fix}")


def subset(data: SourceData, positions: list[int]) -> tuple[FeaturizedMolecules, np.ndarray]:
    rows = np.asarray(positions, dtype=np.int64)
    return data.featurized.select(rows), data.targets[rows]


@dataclass(frozen=True)
class ScaledSplits:
    train: MoleculeSet
    val: MoleculeSet
    test: MoleculeSet
    test_targets_raw: np.ndarray
    target_scaler: StandardScaler | None
    features_scaler: StandardScaler | None


def scale_splits(
    parts: dict[str, tuple[FeaturizedMolecules, np.ndarray]], dataset_type: str, scale_features: bool
) -> ScaledSplits:
    """Fit scalers on train only; targets of train/val are standardised (regression), test targets stay raw."""
    train_feats, train_targets = parts["train"]
    target_scaler = StandardScaler.fit(train_targets) if dataset_type == "regression" else None
    width = train_feats.features.shape[1]
    features_scaler = StandardScaler.fit(train_feats.features) if scale_features and width else None

    def molecule_set(name: str, scale_targets: bool) -> MoleculeSet:
        return scaled_set(*parts[name], features_scaler, target_scaler if scale_targets else None)

    return ScaledSplits(molecule_set("train", True), molecule_set("val", True), molecule_set("test", False),
                        parts["test"][1], target_scaler, features_scaler)


def scaled_set(feats: FeaturizedMolecules, targets: np.ndarray, features_scaler: StandardScaler | None,
               target_scaler: StandardScaler | None = None) -> MoleculeSet:
    """Molecules as a fold's model reads them: features standardised with the fold's (train) scaler, targets
    standardised when ``target_scaler`` is given (train and val; test and calibration molecules keep raw labels)."""
    features = feats.features
    if features_scaler is not None:
        features = np.nan_to_num(features_scaler.transform(features), nan=0.0)
    if target_scaler is not None:
        targets = target_scaler.transform(targets)
    return MoleculeSet(feats.graphs, features.astype(np.float32) if features.shape[1] else None,
                       np.asarray(targets, dtype=np.float32), feats.smiles)


def wants_feature_scaling(config: FinetuneConfig) -> bool:
    """Upstream requires --no_features_scaling with rdkit_2d_normalized (already CDF-normalised); we infer it."""
    generators = config.features_generator or ()
    if any(g in ALREADY_NORMALISED for g in generators):
        return False
    return not config.no_features_scaling
