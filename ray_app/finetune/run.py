"""`kermt finetune`: upstream's `main.py finetune`, each ensemble member of each fold trained by a Ray TorchTrainer.

Driver flow: resolve settings -> featurise every file once on the cluster -> per fold: split, scale, put in the
object store once -> one Ray Tune run whose trials are the (fold, member)s (``ensemble``): each builds its initial
model (pretrained encoder + fresh head), trains it data-parallel and keeps the best epoch -> ensemble-average test
predictions -> upstream's outputs and summary lines.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import ray

from kermt.config import FinetuneModelConfig
from kermt.data.splits import Split, split_description
from kermt.errors import Interrupted
from kermt.inference.columns import ensemble_mean
from kermt.metrics import nanmean, unscored_note
from kermt.checkpoint.native import saved_spec
from kermt.inference.widths import WidthRule, width_rule
from kermt.run_layout import INVALID_SMILES_FILE, RunLayout, fold_name
from kermt.train.step import score
from ray_app.common import outputs
from ray_app.common.cluster import connect
from ray_app.common.remote_files import publish
from ray_app.common.settings import Source, to_yaml
from ray_app.common.storage import is_uri
from ray_app.finetune.calibrate import calibrate_fold, calibration_predictions, file_set, in_training_split, \
    is_calibrated, load_calibration_file, needs_distance, overlap_line, validation_set
from ray_app.finetune.config import FinetuneConfig
from ray_app.finetune.domain import domain_distances, write_fold_domain
from ray_app.finetune.dry_run import dry_run_finetune
from ray_app.finetune.ensemble import train_members
from ray_app.finetune.fold_data import FoldData, remove_folds, write_folds
from ray_app.finetune.fold_record import fold_record
from ray_app.finetune.members import member_test_predictions
from ray_app.finetune.prepare import ScaledSplits, SourceData, fold_count, write_invalid
from ray_app.finetune.resume import finished_member, start_finetune_run
from ray_app.finetune.run_setup import ENCODER_KEYS, RunSetup, user_set, features_width, fold_splits, \
    model_config, resolve_setup, task_line
from ray_app.report import announce_report, start_line


def finish_fold(setup: RunSetup, fold: int, splits: ScaledSplits, member_preds: list[np.ndarray]) -> float:
    """Ensemble mean (summed in member order, as upstream) -> fold_k/test_result.csv; returns the fold's score."""
    c = setup.config
    ensemble = ensemble_mean(member_preds)
    blinded = len(setup.task_names) == 0 or bool(np.isnan(splits.test_targets_raw).all())
    outputs.atomic_write_text(setup.layout.test_result(fold), outputs.test_result_csv(
        splits.test.smiles, setup.task_names, ensemble, None if blinded else splits.test_targets_raw))
    if blinded or len(splits.test) == 0:
        return float("nan")
    value, per_task = score(ensemble, splits.test_targets_raw, setup.metric, setup.dataset_type, None)
    print(f"Seed {c.seed + fold} ==> test {setup.metric} = {value:.6f}", flush=True)
    note = unscored_note(setup.task_names, ensemble, splits.test_targets_raw, per_task, setup.dataset_type)
    if note:
        print(f"Seed {c.seed + fold} ==> {note}", flush=True)
    if c.show_individual_scores:
        for name, task_score in zip(setup.task_names, per_task):
            print(f"Seed {c.seed + fold} ==> test {name} {setup.metric} = {task_score:.6f}", flush=True)
    return value


def put_folds(setup: RunSetup) -> tuple[list[ray.ObjectRef], list[FinetuneModelConfig], dict[str, Any]]:
    """Split and scale every fold and put each in the object store once; returns each fold's reference and model
    config, and the splits' record (splits.json). Writes nothing: a setting that fails here leaves save_dir as it
    was."""
    fold_refs, fold_configs, record, overlaps = [], [], {}, []
    for fold in range(fold_count(setup.config)):
        split, splits = fold_splits(setup, fold)
        record[fold_name(fold)] = _split_record(setup, split)
        if setup.calibration is not None:
            overlaps.append(in_training_split(setup.calibration.featurized.smiles, splits.train.smiles))
        # built here so that a flag contradicting the checkpoint fails on the driver, not in a trial
        fold_configs.append(model_config(setup, features_width(splits)))
        fold_refs.append(ray.put(splits))  # the one copy of the fold's data, shared by every member and worker
        del splits  # from here on the driver reads the object store's copy (zero-copy)
    warning = overlap_line(setup.calibration, overlaps) if setup.calibration is not None else None
    if warning:
        print(warning, flush=True)
    return fold_refs, fold_configs, record


def train_folds(setup: RunSetup, fold_refs: list[ray.ObjectRef], fold_configs: list[FinetuneModelConfig],
                calibration: SourceData | None = None, fold_data: list[FoldData] | None = None) \
        -> tuple[list[float], dict[str, Any], dict[str, Any]]:
    """Train every member of every fold (one Tune run, concurrently where resources allow) and write fold_k/;
    returns each fold's task-averaged test score, its calibration record (ray_app.finetune.calibrate: on the
    validation split, or on ``calibration``, the --calibration_path file) and its record for the report
    (ray_app.finetune.fold_record). ``fold_data``: each fold's shards, which the members' workers read."""
    c = setup.config
    train_members(setup, fold_refs, [(fold, member) for fold in range(len(fold_refs))
                                     for member in range(c.ensemble_size)], fold_configs, fold_data)
    scores, calibrations, folds = [], {}, {}
    rule = run_width_rule(setup, len(fold_refs))
    for fold, (ref, config) in enumerate(zip(fold_refs, fold_configs)):
        parts: ScaledSplits = ray.get(ref)
        on = file_set(calibration, parts) if calibration is not None else validation_set(fold, parts)
        member_preds, member_cal, member_cal_variances, distances, test_distances = [], [], [], None, None
        for member in range(c.ensemble_size):
            found = finished_member(setup.layout.member(fold, member), setup.run_id, config)
            assert found is not None, "train_members leaves every member in save_dir"
            member_preds.append(member_test_predictions(found[0], parts, c.step_batch_size, c.use_gpu, c.precision,
                                                        rule))
            if is_calibrated(setup):  # where the test predictions are made: on the driver, or a GPU task
                preds, variances = calibration_predictions(found[0], parts, on, c.step_batch_size, c.use_gpu,
                                                           c.precision, rule)
                member_cal.append(preds)
                member_cal_variances.append(variances)
            if member == 0:  # fold_k/domain.json: member 0's embedding of the train split (ray_app.finetune.domain)
                index = write_fold_domain(setup, fold, parts, found[0], rule)
                if needs_distance(setup):  # a mondrian_domain calibration: its molecules' distances, the test's
                    distances, test_distances = (domain_distances(setup, index, part, found[0], rule)
                                                 for part in (on.molecules, parts.test))
        scores.append(finish_fold(setup, fold, parts, member_preds))
        calibrations[fold_name(fold)] = calibrate_fold(setup, fold, parts, member_cal, member_cal_variances, on,
                                                       distances)
        folds[fold_name(fold)] = fold_record(setup, fold, parts, member_preds, test_distances)
    return scores, calibrations, folds


def run_width_rule(setup: RunSetup, folds: int) -> WidthRule:
    """The width rule `kermt predict` applies to the run's saved members (all folds: its --checkpoint_dir ensemble),
    so test_result.csv, the calibration and the domain index are computed as predict computes."""
    return width_rule([saved_spec(RunLayout(setup.layout.member(fold, member)).model) for fold in range(folds)
                       for member in range(setup.config.ensemble_size)])


def run_finetune(config: FinetuneConfig, sources: dict[str, Source],
                 recorded: FinetuneConfig | None = None) -> dict[str, Any]:
    """The whole run; returns the summary (also written to run.json). ``recorded``: the settings as the user gave
    them, when ``config`` has local copies in place of URIs (config.yaml and run.json keep the URIs)."""
    recorded = recorded or config
    if config.dry_run:  # the plan, without Ray
        return dry_run_finetune(config, sources)
    resources = connect(config.address)
    setup = resolve_setup(config, sources)
    setup = replace(setup, calibration=load_calibration_file(setup))  # featurised like the data, before training
    print(start_line(str(recorded.save_dir), of_file=False), flush=True)
    print(task_line(setup), flush=True)
    inputs = [s for s in (setup.data, setup.val, setup.test, setup.calibration) if s is not None]
    n_invalid = sum(len(s.invalid) for s in inputs)
    if n_invalid:
        print(f"skipping {n_invalid} invalid SMILES (listed in {INVALID_SMILES_FILE})", flush=True)
    fold_refs, fold_configs, split_record = put_folds(setup)
    setup.save_dir.mkdir(parents=True, exist_ok=True)
    setup = replace(setup, run_id=start_finetune_run(setup.save_dir, recorded)[0])
    if is_uri(recorded.save_dir):  # a killed driver uploads nothing; a re-run must still find this run's id
        publish(setup.layout.run_state, recorded.save_dir, "--save_dir")
    outputs.atomic_write_text(setup.layout.config, to_yaml(recorded))
    write_invalid(setup.layout.invalid_smiles, inputs)
    outputs.atomic_write_text(setup.layout.splits, json.dumps(split_record) + "\n")
    # The folds are in the object store now: the driver lets go of the featurised files (at 1M molecules ~0.5 GB of
    # graph arrays plus the SMILES) for the rest of the run; it keeps the calibration file's molecules.
    calibration, setup = setup.calibration, setup.without_inputs()
    fold_data = write_folds(setup.storage, setup.run_id, fold_refs)  # by Ray tasks: what the training workers read
    try:
        scores, calibrations, folds = train_folds(setup, fold_refs, fold_configs, calibration, fold_data)
        remove_folds(setup.storage, setup.run_id)
    except (Interrupted, RuntimeError):  # stopped, or a member failed: the report shows the members that finished
        announce_report(setup.save_dir, recorded.save_dir)
        raise
    mean = nanmean(scores)
    std = float(np.nanstd(scores)) if not np.isnan(mean) else float("nan")
    summary = {"dataset_type": setup.dataset_type, "metric": setup.metric, "fold_scores": scores,
               f"overall_{config.split_type}_test_{setup.metric}": mean, "std": std, "run_id": setup.run_id}
    # the split in words: the summary key keeps upstream's name, which says split_type whatever the separate files
    split = split_description(config.split_type, recorded.separate_val_path, recorded.separate_test_path)
    extra = {"summary": summary, "split": split, "config_yaml": str(setup.layout.config),
             "calibration": calibrations, "folds": folds}
    settings, setting_sources = _settings_with_checkpoint_values(setup)
    given, used = recorded.model_dump(mode="json"), config.model_dump(mode="json")
    settings.update({k: given[k] for k in given if given[k] != used[k]})  # the URIs, not their local copies
    outputs.atomic_write_text(setup.layout.run_record, outputs.run_record(
        settings, setting_sources, resources, extra))
    print(f"overall_{config.split_type}_test_{setup.metric}={mean:.6f}", flush=True)
    print(f"std={std:.6f}", flush=True)
    announce_report(setup.save_dir, recorded.save_dir)
    return summary


def _settings_with_checkpoint_values(setup: RunSetup) -> tuple[dict[str, Any], dict[str, str]]:
    """Every setting and its source; architecture values the checkpoint decided are marked "checkpoint"."""
    settings: dict[str, Any] = setup.config.model_dump(mode="json")
    sources: dict[str, str] = dict(setup.sources)
    if setup.checkpoint is not None:
        for key in ENCODER_KEYS:
            if not user_set(setup.sources, key):
                settings[key], sources[key] = getattr(setup.checkpoint.spec.encoder, key), "checkpoint"
    return settings, sources


def _split_record(setup: RunSetup, split: Split) -> dict[str, list[int]]:
    """Data-row numbers (in the data file) of each part; separate val/test files are marked as such."""
    def to_rows(positions) -> list[int]:
        return setup.data.rows[np.asarray(positions, dtype=np.int64)].tolist()

    record = {"train": to_rows(split.train)}
    record["val"] = "separate_val_path" if setup.val else to_rows(split.val)
    record["test"] = "separate_test_path" if setup.test else to_rows(split.test)
    return record

