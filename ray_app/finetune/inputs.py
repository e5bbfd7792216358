"""Input checks of a finetune (or tune) run that need no cluster: they run before Ray starts.

A mistake in a data file, a label, a column name or the checkpoint then costs a second, not a cluster start and
featurisation. Only light modules are imported here (no Ray, no torch until a checkpoint is read).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kermt.data.tables import MoleculeTable, check_classification_labels, infer_dataset_type, load_molecule_table, \
    read_table
from kermt.errors import UserError, user_input
from kermt.inputs import check_checkpoint_file
from kermt.metric_names import resolve_metric
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
    lists = ("features_path", "separate_val_features_path", "separate_test_features_path", "calibration_features_path")
    single = ("folds_file", "crossval_index_file", "checkpoint_path")
    found = [(name, path) for name in lists for path in getattr(config, name) or ()]
    found += [(name, getattr(config, name)) for name in single if getattr(config, name)]
    return found


def settle_task(config: FinetuneConfig, train_targets: np.ndarray, labelled: list[tuple[str, np.ndarray]],
                target_names: list[str]) -> tuple[str, str]:
    """(dataset_type, metric) of the run: ``--dataset_type`` or the one the training labels imply, and ``--metric``
    or its default; a metric of the other dataset type, or a classification label that is not 0/1 in any of the
    ``labelled`` (path, targets) files, is a UserError. Checked before Ray starts and again where the run settles
    them, so a run never trains to fail at its first validation."""
    dataset_type = config.dataset_type or infer_dataset_type(train_targets)
    metric = resolve_metric(config.metric, dataset_type, "" if config.dataset_type else "inferred from the labels")
    if dataset_type == "classification":
        for path, targets in labelled:
            check_classification_labels(path, targets, target_names)
    return dataset_type, metric


def check_finetune_inputs(config: FinetuneConfig) -> MoleculeTable:
    """What can be checked before Ray starts, so a mistake costs a second, not a cluster start: every data file is
    readable with its columns and numeric labels (read once here and again by the run; reading is cheap next to
    featurisation), the dataset type (given or inferred from the labels) fits the metric and every file's labels,
    the calibration file can calibrate every task, other files exist, the checkpoint is one. Raises UserError;
    returns the training file's table."""
    data, _ = read_labelled(config.data_path, config, None)
    _check_every_task_is_labelled(data)
    tables = [data]
    if config.separate_val_path:
        tables.append(read_labelled(config.separate_val_path, config, data.target_names)[0])
    if config.separate_test_path:
        tables.append(read_labelled(config.separate_test_path, config, data.target_names, blinded_ok=True)[0])
    if config.calibration_path:
        tables.append(read_labelled(config.calibration_path, config, data.target_names)[0])
    dataset_type, _ = settle_task(config, data.targets, [(t.path, t.targets) for t in tables], data.target_names)
    if config.calibration_path:
        check_calibration_labels(config.calibration_path, tables[-1].targets, data.target_names, dataset_type)
    for flag, path in _optional_files(config):
        if not Path(path).exists():
            raise UserError(f"--{flag} {path} does not exist")
    kind = None
    if config.checkpoint_path:
        from kermt.checkpoint import read_checkpoint

        check_checkpoint_file(config.checkpoint_path, "--checkpoint_path")
        with user_input(f"--checkpoint_path {config.checkpoint_path}"):
            kind = read_checkpoint(config.checkpoint_path, trust_pickle=config.trust_checkpoint,
                                   dataset_type=config.dataset_type).spec.kind
    check_model_settings(config, data.target_names, kind)
    return data


def _check_every_task_is_labelled(data: MoleculeTable) -> None:
    """A target column of the training file with no label in any row would train a task on nothing (a loss of 0
    for every epoch): one line naming it, before Ray starts."""
    for t, name in enumerate(data.target_names):
        if len(data) and np.isnan(data.targets[:, t]).all():
            raise UserError(f"{data.path}: target column {name!r} holds no label in any of its {len(data)} rows; "
                            "fill it, or train on the other columns with --target_columns")


def check_calibration_labels(path: str, targets: np.ndarray, task_names: list[str], dataset_type: str,
                             note: str = "") -> None:
    """``--calibration_path``'s labels can calibrate every task: at least MIN_CALIBRATION_ROWS labelled molecules
    per task, and both classes for a classification task. Checked before Ray starts (on the file's rows) and again
    on its valid molecules once featurised (``note`` says so), both before any training."""
    from kermt.uncertainty.conformal import MIN_CALIBRATION_ROWS

    for t, task in enumerate(task_names):
        labels = targets[:, t][~np.isnan(targets[:, t])]
        if len(labels) < MIN_CALIBRATION_ROWS:
            raise UserError(f"--calibration_path {path}: column {task!r} has {len(labels)} labelled molecule(s)"
                            f"{note}; a calibration needs at least {MIN_CALIBRATION_ROWS} per task")
        if dataset_type == "classification" and len(np.unique(labels)) < 2:
            raise UserError(f"--calibration_path {path}: column {task!r}: every labelled molecule is class "
                            f"{int(labels[0])}; a classification calibration needs both classes")


def check_model_settings(config: FinetuneConfig, task_names: list[str], checkpoint_kind: str | None) -> None:
    """Settings the model refuses only when it is built, inside each member's training worker (after Ray started
    and the data was featurised); ``checkpoint_kind``: None without a checkpoint."""
    if config.use_mtl_loss and len(task_names) < 2:
        raise UserError(f"--use_mtl_loss weighs each task's loss against the others', so it needs at least 2 tasks; "
                        f"{config.data_path} has 1 ({task_names[0]}): drop the flag or add --target_columns")
    # a finetuned checkpoint's head decides these; otherwise the head is built from the flags
    if checkpoint_kind != "finetuned" and config.ffn_num_task_specific_layers > 0 \
            and config.ffn_task_specific_hidden_size is None:
        raise UserError(f"--ffn_num_task_specific_layers {config.ffn_num_task_specific_layers} needs "
                        "--ffn_task_specific_hidden_size (the width the shared FFN hands each task's layers)")
