"""Input checks of a finetune (or tune) run that need no cluster: they run before Ray starts.

A mistake in a data file, a label, a column name or the checkpoint then costs a second, not a cluster start and
featurisation. Only light modules are imported here (no Ray, no torch until a checkpoint is read).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kermt.data.tables import MoleculeTable, check_classification_labels, load_molecule_table, read_table
from kermt.errors import UserError, user_input
from kermt.inputs import check_checkpoint_file
from ray_app.finetune.config import FinetuneConfig


def read_labelled(path: str, config: FinetuneConfig, target_names: list[str] | None,
                  blinded_ok: bool = False) -> tuple[MoleculeTable, bool]:
    """Read one file and parse its labels (a UserError names the file, row and column of a bad one); also
    whether it is blinded.

    ``blinded_ok``: a file that has none of ``target_names`` (a blinded test set: SMILES only) gets all-NaN labels;
    one that has only some of them is still an error naming the missing column."""
    blinded = blinded_ok and bool(target_names) and not set(target_names) & set(read_table(path, 1).columns)
    table = load_molecule_table(
        path, config.smiles_column, [] if blinded else (target_names or config.target_columns),
        require_targets=not blinded, max_rows=config.max_data_size,
    )
    if not blinded:
        return table, False
    return MoleculeTable(table.path, table.smiles, list(target_names or []),
                         np.full((len(table), len(target_names or [])), np.nan), table.extra_columns), True


def _optional_files(config: FinetuneConfig) -> list[tuple[str, str]]:
    """(flag, path) of every other file the run reads."""
    lists = ("features_path", "separate_val_features_path", "separate_test_features_path")
    single = ("folds_file", "crossval_index_file", "checkpoint_path")
    found = [(name, path) for name in lists for path in getattr(config, name) or ()]
    found += [(name, getattr(config, name)) for name in single if getattr(config, name)]
    return found


def check_inputs(config: FinetuneConfig) -> None:
    """What can be checked before Ray starts, so a mistake costs a second, not a cluster start: every data file is
    readable with its columns and numeric labels (read once here and again by the run; reading is cheap next to
    featurisation), classification labels are 0/1, other files exist, the checkpoint is one. Raises UserError."""
    data, _ = read_labelled(config.data_path, config, None)
    tables = [data]
    if config.separate_val_path:
        tables.append(read_labelled(config.separate_val_path, config, data.target_names)[0])
    if config.separate_test_path:
        tables.append(read_labelled(config.separate_test_path, config, data.target_names, blinded_ok=True)[0])
    if config.dataset_type == "classification":
        for table in tables:
            check_classification_labels(table.path, table.targets, data.target_names)
    for flag, path in _optional_files(config):
        if not Path(path).exists():
            raise UserError(f"--{flag} {path} does not exist")
    if config.checkpoint_path:
        from kermt.checkpoint import read_checkpoint

        check_checkpoint_file(config.checkpoint_path, "--checkpoint_path")
        with user_input(f"--checkpoint_path {config.checkpoint_path}"):
            read_checkpoint(config.checkpoint_path, trust_pickle=config.trust_checkpoint,
                            dataset_type=config.dataset_type)
