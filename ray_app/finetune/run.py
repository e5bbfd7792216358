"""`kermt finetune`: upstream's `main.py finetune`, each ensemble member of each fold trained by a Ray TorchTrainer.

Driver flow: resolve settings -> featurise every file once on the cluster -> per fold: split, scale, put in the
object store once, written as shards by a Ray task, and let go of -> one Ray Tune run whose trials are the
(fold, member)s (``ensemble``): each builds its initial model (pretrained encoder + fresh head), trains it
data-parallel from the fold's shards and keeps the best epoch -> per fold, a Ray task reads the fold's shards for
the ensemble-average test predictions, the calibration and the domain index (``after_training``) -> upstream's
outputs and summary lines.
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
from kermt.metrics import nanmean
from kermt.run_layout import INVALID_SMILES_FILE, fold_name
from ray_app.common import outputs
from ray_app.common.cluster import connect
from ray_app.common.remote_files import publish
from ray_app.common.settings import Source, to_yaml
from ray_app.common.storage import is_uri
from ray_app.finetune.after_training import finish_folds
from ray_app.finetune.calibrate import in_training_split, load_calibration_file, overlap_line
from ray_app.finetune.config import FinetuneConfig
from ray_app.finetune.dry_run import dry_run_finetune
from ray_app.finetune.ensemble import train_members
from ray_app.finetune.fold_data import remove_folds, write_folds
from ray_app.finetune.prepare import fold_count, write_invalid
from ray_app.finetune.resume import start_finetune_run
from ray_app.finetune.run_setup import ENCODER_KEYS, RunSetup, user_set, features_width, fold_splits, \
    model_config, resolve_setup, task_line
from ray_app.report import announce_report, start_line


def put_folds(setup: RunSetup) \
        -> tuple[list[ray.ObjectRef], list[FinetuneModelConfig], dict[str, Any], list[int]]:
    """Split and scale every fold and put each in the object store once; returns each fold's reference and model
    config, the splits' record (splits.json) and how many of the --calibration_path file's molecules each fold's
    training split holds (empty without the file). Writes nothing: a setting that fails here leaves save_dir as
    it was."""
    fold_refs, fold_configs, record, overlaps = [], [], {}, []
    for fold in range(fold_count(setup.config)):
        split, splits = fold_splits(setup, fold)
        record[fold_name(fold)] = _split_record(setup, split)
        if setup.calibration is not None:
            overlaps.append(in_training_split(setup.calibration.featurized.smiles, splits.train.smiles))
        # built here so that a flag contradicting the checkpoint fails on the driver, not in a trial
        fold_configs.append(model_config(setup, features_width(splits)))
        fold_refs.append(ray.put(splits))  # the one copy of the fold's data, which its shards are written from
        del splits  # from here on the driver reads the object store's copy (zero-copy)
    warning = overlap_line(setup.calibration, overlaps) if setup.calibration is not None else None
    if warning:
        print(warning, flush=True)
    return fold_refs, fold_configs, record, [int(mask.sum()) for mask in overlaps]


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
    fold_refs, fold_configs, split_record, in_training = put_folds(setup)
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
    # the driver's hold on the folds' objects: from here on every step reads the shards (the members take the
    # scalers from fold_data), so the object store lets go of the folds before training
    del fold_refs
    try:
        train_members(setup, fold_data, [(fold, member) for fold in range(len(fold_data))
                                         for member in range(config.ensemble_size)], fold_configs)
        scores, calibrations, folds = finish_folds(setup, fold_configs, fold_data, calibration, in_training)
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

