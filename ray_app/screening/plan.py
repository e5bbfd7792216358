"""What `kermt predict / eval` decide before Ray starts (:func:`plan_predict`): the members, their features, the
input's columns and what the output adds (:mod:`ray_app.screening.uncertainty`), so that a mistake costs a second,
not a cluster start. Checkpoints are read once here and shipped to the actors through the object store, so workers
need no access to the driver's files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kermt.checkpoint import Checkpoint
from kermt.data.feature_files import load_features_files
from kermt.errors import UserError, user_input
from kermt.inference import FeaturePlan, find_checkpoints, plan_features, read_members, task_names
from kermt.inference.attributions import unavailable_reason
from kermt.inference.columns import ERROR_COLUMN, MODEL_SMILES_COLUMN, SMILES_COLUMN, VALID_COLUMN, OutputPlan
from kermt.inference.mc_dropout import check_dropout
from kermt.inference.widths import upstream_batching_note, width_rule
from kermt.inputs import check_checkpoint_file
from kermt.uncertainty import Calibration, ClassCalibration
from kermt.uncertainty.domain import DomainIndex
from ray_app.screening.config import ModelScreeningConfig, ScreeningConfig, WidthFlags, log
from ray_app.screening.files import InputTable, Source, pick_columns
from ray_app.screening.first_rows import check_first_rows
from ray_app.screening.uncertainty import (CalibrationFile, check_calibration_file, plan_class_calibration,
                                           plan_domain, plan_intervals)


def source_columns(config: ScreeningConfig, output_columns: set[str] | None = None) -> Source:
    """``--data_path`` (its header read once, here) with its SMILES and id columns: ``--id_columns``; else, for a
    prediction file (``output_columns``: the names of its own columns), every other input column, as chemprop
    carries them; else a SMILES file's name column."""
    table = InputTable.open(config.data_path)
    check_first_rows(table, config.smiles_column)  # a ';'-separated .csv, a SMILES column with no SMILES
    names = table.columns
    if config.id_columns is not None:
        ids = tuple(config.id_columns)
    elif output_columns is not None:
        ids = _other_columns(table, pick_columns(names, config.smiles_column, ()), output_columns)
    else:
        ids = table.default_id_columns
    return Source(table, pick_columns(names, config.smiles_column, ids), ids)


def _other_columns(table: InputTable, smiles: str, output_columns: set[str]) -> tuple[str, ...]:
    """The input's columns besides SMILES, less those the output names itself (a label column named like its
    task: the prediction takes the name) and those with no text form; a log line names what is left out."""
    names, untextual = table.columns, set(table.untextual)
    left_out = [f"{n} ({'an output column' if n in output_columns else 'not text'})" for n in names
                if n != smiles and (n in output_columns or n in untextual)]
    if left_out:
        log(f"input columns not carried to the output: {', '.join(left_out)}")
    return tuple(n for n in names if n != smiles and n not in output_columns and n not in untextual)


def file_features(paths: list[str] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """``--features_path``'s rows and their validity, or None without the flag."""
    return load_features_files(paths) if paths else None


def _members(config: ModelScreeningConfig) -> list[Checkpoint]:
    paths = find_checkpoints(config.checkpoint_dir) if config.checkpoint_dir else [Path(config.checkpoint_path)]
    for path in paths:
        check_checkpoint_file(path, "--checkpoint_dir member" if config.checkpoint_dir else "--checkpoint_path")
    members = read_members(paths, trust_pickle=config.trust_checkpoint, dataset_type=config.dataset_type)
    log(f"ensemble of {len(members)} model(s): " + ", ".join(str(m.path) for m in members))
    return members


def _feature_plan(config, specs) -> tuple[FeaturePlan, tuple[np.ndarray, np.ndarray] | None]:
    from_file = file_features(config.features_path)
    width = from_file[0].shape[1] if from_file is not None else None
    plan = plan_features(specs, config.features_generator, width)
    if plan.note:
        log(plan.note)
    return plan, from_file


@dataclass(frozen=True)
class PredictPlan:
    members: list[Checkpoint]
    features: FeaturePlan
    file_features: tuple[np.ndarray, np.ndarray] | None
    source: Source
    calibrations: dict[str, Calibration] | None = None  # --interval: each task's calibration
    # fold 0's index: for --applicability_domain's columns, or for intervals that read the distance
    domain: DomainIndex | None = None
    class_calibrations: dict[str, ClassCalibration] | None = None  # classification: each task's calibration
    calibration_file: CalibrationFile | None = None  # --calibration_path, checked (the fit waits for Ray)

    def outputs(self, config: ModelScreeningConfig) -> OutputPlan:
        """The prediction columns ``config`` asks of this plan (:mod:`kermt.inference.columns`)."""
        return output_plan(config, self.members, self.calibrations, self.class_calibrations,
                           config.applicability_domain, self.calibration_file is not None)


def output_plan(config: ModelScreeningConfig, members: list[Checkpoint], calibrations, class_calibrations,
                domain: bool, calibrated: bool = False) -> OutputPlan:
    spec = members[0].spec
    return OutputPlan(task_names(spec), spec.head.dataset_type == "regression", uncertainty=config.uncertainty,
                      interval=config.interval, calibrations=calibrations, class_calibrations=class_calibrations,
                      domain=domain, calibrated=calibrated, attributions=config.attributions,
                      descriptors=spec.head.features_size > 0)


def note_attributions(config: ModelScreeningConfig, members: list[Checkpoint]) -> None:
    """--attributions: a one-line note where this model or mode cannot give them (the columns stay empty) or where
    they explain another number than the prediction column."""
    if not config.attributions:
        return
    why_not = unavailable_reason([m.spec for m in members], config.upstream_batching)
    if why_not:
        log(f"note: the attribution columns stay empty: {why_not}")
    elif config.dropout_samples:
        log(f"note: --dropout_samples {config.dropout_samples}: the attributions explain the members' prediction "
            "without dropout, which <task>_baseline plus the shares add up to, not the MC-dropout mean")


def _check_members(config: ModelScreeningConfig, members: list[Checkpoint]) -> None:
    check_dropout([m.spec for m in members], config.dropout_samples)
    if config.dropout_samples and config.interval is not None and config.calibration_path is None:
        raise UserError(f"--dropout_samples {config.dropout_samples} with --interval {config.interval}: the "
                        "calibration was fitted on the std without MC dropout, so its intervals would not hold; "
                        "drop one of the two flags")
    if config.uncertainty and len(members) == 1 and not (members[0].spec.head.variance or config.dropout_samples):
        log("warning: --uncertainty with one model writes <task>_std = 0: a spread needs an ensemble of two or "
            "more members (--checkpoint_dir), a model trained with --loss mve, or --dropout_samples N")
    scaled = [str(m.path) for m in members if m.spec.features_scaler is not None]
    if config.no_features_scaling and scaled:
        raise UserError(f"--no_features_scaling contradicts {', '.join(scaled)}, trained with feature scaling "
                        "(its scaler is applied); drop the flag")


def note_widths(config: WidthFlags, specs: list) -> None:
    """``--upstream_batching`` / ``--reference_width`` checked before Ray starts, with a one-line note where they
    change nothing (a zero-padding model's numbers never depend on the batch)."""
    rule = width_rule(specs, config.upstream_batching, config.reference_width)
    note = upstream_batching_note(specs) if config.upstream_batching else None
    if note:
        log(note)
    elif config.reference_width is not None and rule.reference_width is None:
        log("note: --reference_width changes nothing for this model: it has zero padding")


def plan_predict(config: ModelScreeningConfig, carry_other_columns: bool = False) -> PredictPlan:
    """Everything predict checks before Ray starts; a ValueError here is about the input (a UserError).
    ``carry_other_columns``: without ``--id_columns``, every other input column is an id column."""
    with user_input():
        members = _members(config)
        _check_members(config, members)
        note_widths(config, [m.spec for m in members])
        note_attributions(config, members)
        classes = plan_class_calibration(config, members)  # first: it refuses a class file beside regression
        calibrations = plan_intervals(config, members)
        names = task_names(members[0].spec)
        domain = plan_domain(config, members, calibrations)
        plan, from_file = _feature_plan(config, [m.spec for m in members])
        calibration_file = check_calibration_file(config, names, from_file)
        outputs = output_plan(config, members, calibrations, classes, config.applicability_domain,
                              calibration_file is not None)
        written = {SMILES_COLUMN, *outputs.names(), VALID_COLUMN, ERROR_COLUMN}
        if plan.prep(config.max_heavy_atoms).standardizes:
            written.add(MODEL_SMILES_COLUMN)
        source = source_columns(config, written if carry_other_columns else None)
        clash = set(names) & set(source.id_columns) | set(names) & {source.smiles_column, VALID_COLUMN, ERROR_COLUMN}
        if clash:
            raise UserError(f"id/SMILES column names {sorted(clash)} clash with the model's task names")
    return PredictPlan(members, plan, from_file, source, calibrations, domain, classes, calibration_file)


__all__ = ["PredictPlan", "file_features", "note_widths", "output_plan", "plan_predict", "source_columns"]
