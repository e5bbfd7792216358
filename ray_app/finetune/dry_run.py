"""`kermt finetune --dry_run` (and the data part of `kermt tune --dry_run`): what a run checks before it trains,
in seconds and without Ray.

A dry run reads and checks every input with the run's own readers, featurises the molecules in this process with
the function each of the run's cluster tasks runs (so the same rows are found valid), splits and scales each fold,
builds the model and loads the checkpoint into it. It prints the settings (defaults marked), what it found in each
file, the split sizes and the plan. It starts no Ray cluster and connects to none (``--address`` or RAY_ADDRESS
included): whether the cluster has the CPUs and GPUs asked for, and whether a run's workers fit, is checked when the
run starts. It writes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kermt.data.formats import row_place
from kermt.nn.finetune import KermtFinetuneModel
from kermt.run_layout import INVALID_SMILES_FILE, fold_name
from ray_app.common.concurrency import worker_demand
from ray_app.common.settings import Source
from ray_app.common.storage import check_reachable, is_uri
from ray_app.finetune.calibrate import in_training_split, load_calibration_file, overlap_line
from ray_app.finetune.config import FinetuneConfig
from ray_app.finetune.prepare import SourceData, fold_count
from ray_app.finetune.resume import save_dir_outlook
from ray_app.finetune.run_setup import RunSetup, features_width, fold_splits, member_initial_state, model_config, \
    read_setup, task_line

INVALID_SHOWN = 3  # invalid rows a dry run names per file; a run lists them all in invalid_smiles.csv


def dry_run_finetune(config: FinetuneConfig, sources: dict[str, Source]) -> dict[str, Any]:
    """Print the settings, the data checks and the plan of `kermt finetune`; returns the plan. Everything is
    checked before anything is printed, so a bad input ends the dry run with its one-line error alone."""
    setup = checked_setup(config, sources)
    folds, parameters, fold_lines = plan_folds(setup, fold_count(config))
    runs = config.ensemble_size * len(folds)
    print_settings(config.model_dump(mode="json"), sources)
    print("\n".join([*data_lines(setup), *fold_lines,
                     f"would train {config.ensemble_size} model(s) x {len(folds)} fold(s) = {runs} run(s) of "
                     f"{config.epochs} epoch(s), {runs_at_once(config.max_concurrent_trials, runs)}, each with "
                     f"{workers_asked(config)}",
                     save_dir_outlook(setup.save_dir, config), not_checked_line(config)]), flush=True)
    return {"dry_run": True, "dataset_type": setup.dataset_type, "metric": setup.metric, "tasks": setup.task_names,
            "folds": folds, "model_parameters": parameters, "runs": runs,
            "resources_per_run": worker_demand(config.min_workers, config.use_gpu)}


def checked_setup(config: FinetuneConfig, sources: dict[str, Source]) -> RunSetup:
    """Every input read and checked as the run reads it (here, without Ray)."""
    assert config.dry_run, "only a dry run featurises in this process (prepare.featurizer)"
    if config.storage_path and is_uri(config.storage_path):
        check_reachable(config.storage_path)  # one listing; no cluster needed
    setup = read_setup(config, sources)
    return replace(setup, calibration=load_calibration_file(setup))


def data_lines(setup: RunSetup) -> list[str]:
    """What the run trains, and what each input file held."""
    files = (setup.data, setup.val, setup.test, setup.calibration)
    return [task_line(setup), *(source_line(source) for source in files if source is not None)]


def source_line(source: SourceData) -> str:
    """``data.csv: 26 rows, 25 with a valid SMILES; 1 skipped (line 5: ...)``."""
    rows = len(source) + len(source.invalid)
    line = f"{source.path}: {rows:,} rows, {len(source):,} with a valid SMILES"
    if not source.invalid:
        return line
    shown = "; ".join(f"{row_place(source.path, bad.row)}: {bad.reason}: {bad.smiles!r}"
                      for bad in source.invalid[:INVALID_SHOWN])
    more = f"; ... (a run lists all {len(source.invalid):,} in {INVALID_SMILES_FILE})" if (
        len(source.invalid) > INVALID_SHOWN) else ""
    return f"{line}; {len(source.invalid):,} skipped ({shown}{more})"


def print_settings(settings: Mapping[str, Any], sources: Mapping[str, Source]) -> None:
    print("resolved configuration (* = default):")
    for name, value in settings.items():
        print(f"  {'*' if sources.get(name, 'default') == 'default' else ' '} {name}: {value}")


def plan_folds(setup: RunSetup, folds: int,
               model: str = "model") -> tuple[dict[str, dict[str, int]], int, list[str]]:
    """Split and scale each fold and settle its model as the run does (a flag contradicting the checkpoint fails
    here too). Returns the split sizes by fold, the model's parameter count, and lines that tell them and how the
    checkpoint loads into the model."""
    sizes, config, overlaps = {}, None, []
    for fold in range(folds):
        splits = fold_splits(setup, fold)[1]
        sizes[fold_name(fold)] = {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)}
        config = model_config(setup, features_width(splits))
        if setup.calibration is not None:
            overlaps.append(in_training_split(setup.calibration.featurized.smiles, splits.train.smiles))
    assert config is not None, "a run has at least one fold"
    lines = [f"fold {fold[len('fold_'):]}: " + ", ".join(f"{part} {n:,}" for part, n in parts.items())
             for fold, parts in sizes.items()]
    warning = overlap_line(setup.calibration, overlaps) if setup.calibration is not None else None
    lines += [warning] if warning else []
    parameters = sum(p.numel() for p in KermtFinetuneModel(config).parameters())
    lines.append(f"{model}: {parameters:,} parameters")
    if setup.checkpoint is not None:
        _, load_summary = member_initial_state(setup, config, setup.config.seed)
        lines.append(f"checkpoint {setup.checkpoint.path} ({setup.checkpoint.spec.kind}):\n  "
                     + load_summary.replace("\n", "\n  "))
    return sizes, parameters, lines


def workers_asked(config: FinetuneConfig) -> str:
    """``2 worker(s) (1 CPU each)``, or a MIN-MAX range, ``+ 1 GPU each`` with --use_gpu."""
    low, high = config.worker_range
    count = str(low) if low == high else f"{low} to {high}"
    return f"{count} worker(s) (1 CPU{' and 1 GPU' if config.use_gpu else ''} each)"


def runs_at_once(requested: int | None, runs: int) -> str:
    """How many runs go at once: the user's cap; otherwise the cluster decides (ray_app.common.concurrency)."""
    if requested is not None:
        return f"at most {min(requested, runs)} at once (--max_concurrent_trials)"
    return "as many at once as the cluster's free resources hold when the run starts"


def not_checked_line(config: FinetuneConfig) -> str:
    address = config.address or os.environ.get("RAY_ADDRESS")
    ray = f"the Ray cluster at {address} was not contacted" if address else "no Ray cluster was started"
    return (f"resources are not checked by a dry run ({ray}): the cluster's CPUs and GPUs, and whether a run's "
            "workers fit, are checked when the run starts")
