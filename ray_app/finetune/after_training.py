"""The step after a finetune's members are trained, one Ray task per fold that reads the fold's shards.

For each fold: the members' test predictions (``fold_k/test_result.csv``, ``test_spread.csv``, the scores), the
calibration (``ray_app.finetune.calibrate``) and the applicability-domain index (``ray_app.finetune.domain``). The
task reads the fold's shards a shard at a time (ray_app.finetune.fold_data: train, val and test, with the raw test
labels and the scalers in :class:`FoldData`): a test or validation shard is read once for a group of members, which
all predict it (every member is in one group at this project's sizes: MEMBER_WEIGHTS_IN_MEMORY). It keeps only
predictions, embeddings of the at most 50,000 training molecules of the index and per-molecule distances; the
driver, which made all this from the fold's object before, holds no fold after training. The task runs on the
driver's node at 0 CPUs, as ``write_folds`` pins its writers: it reads the members from save_dir and writes
``fold_k/`` there (the driver's disk, a staging directory when --save_dir is a URI), with the driver's torch thread
count, so the numbers are the ones the driver computed. What it printed comes back with its results, for the driver
to print, so the run's output is as it was.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kermt.checkpoint.native import WEIGHTS_FILE, saved_spec
from kermt.config import FinetuneModelConfig
from kermt.data.dataset import MoleculeSet
from kermt.inference.columns import ensemble_mean
from kermt.inference.widths import WidthRule, width_rule
from kermt.metrics import unscored_note
from kermt.nn.finetune import KermtFinetuneModel
from kermt.run_layout import RunLayout, fold_name
from kermt.train.step import score
from ray_app.common import outputs
from ray_app.finetune.calibrate import CalibrationSet, calibrate_fold, file_set, is_calibrated, label_units, \
    needs_distance, validation_source
from ray_app.finetune.domain import FoldDomain
from ray_app.finetune.fold_data import FoldData
from ray_app.finetune.fold_record import fold_record
from ray_app.finetune.members import predict_molecules
from ray_app.finetune.prepare import SourceData
from ray_app.finetune.resume import finished_member
from ray_app.finetune.run_setup import RunSetup

Prediction = tuple[np.ndarray, np.ndarray | None]  # a member's predictions of molecules, and variances or None
# The weights of a fold's members that the step after training holds at once. At this project's sizes (a few MB a
# member) a fold's members all fit, and each shard is read once; five members of a release-size model (GROVER large,
# ~100 M parameters: ~0.4 GB each) load in groups, each reading the shards again.
MEMBER_WEIGHTS_IN_MEMORY = 2**30


@dataclass(frozen=True)
class FoldOutcome:
    """What a fold's step after training gives the driver: the fold's task-averaged test score, its calibration
    record and its report record (run.json), and the lines it printed."""

    score: float
    calibration: dict[str, Any]
    record: dict[str, Any]
    output: str


def finish_folds(setup: RunSetup, fold_configs: Sequence[FinetuneModelConfig], fold_data: Sequence[FoldData],
                 calibration: SourceData | None = None, in_training: Sequence[int] = ()) \
        -> tuple[list[float], dict[str, Any], dict[str, Any]]:
    """Every fold's step after training, a fold at a time (one fold's shard, members and predictions in memory),
    each in a task on this (the driver's) node; prints what each printed. ``calibration``: the --calibration_path
    file (put once for every fold's task), ``in_training`` each fold's count of its molecules in the fold's
    training split. Returns each fold's score, and the calibration and report records by fold name."""
    rule = run_width_rule(setup, len(fold_data))
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    task = _finish_fold.options(num_cpus=0, scheduling_strategy=here)
    source = None if calibration is None else ray.put(calibration)
    scores, calibrations, folds = [], {}, {}
    for fold, (config, data) in enumerate(zip(fold_configs, fold_data)):
        outcome: FoldOutcome = ray.get(task.remote(setup.without_inputs(), fold, config, data, source,
                                                   in_training[fold] if calibration is not None else None, rule,
                                                   torch.get_num_threads()))
        print(outcome.output, end="", flush=True)
        scores.append(outcome.score)
        calibrations[fold_name(fold)], folds[fold_name(fold)] = outcome.calibration, outcome.record
    return scores, calibrations, folds


@ray.remote(num_cpus=0)
def _finish_fold(setup: RunSetup, fold: int, config: FinetuneModelConfig, data: FoldData,
                 calibration: SourceData | None, in_training: int | None, rule: WidthRule, threads: int) \
        -> FoldOutcome:
    torch.set_num_threads(threads)  # the driver's: the predictions are made as it made them
    with contextlib.redirect_stdout(io.StringIO()) as out:
        outcome = finish_fold(setup, fold, config, data, calibration, in_training, rule)
    return FoldOutcome(outcome.score, outcome.calibration, outcome.record, out.getvalue())


def finish_fold(setup: RunSetup, fold: int, config: FinetuneModelConfig, data: FoldData,
                calibration: SourceData | None = None, in_training: int | None = None,
                rule: WidthRule | None = None, weights_in_memory: int = MEMBER_WEIGHTS_IN_MEMORY) -> FoldOutcome:
    """One fold's step after training, in this process, from its shards (what the task runs; it prints as it
    goes, and the outcome's ``output`` is empty). The members are loaded a group at a time, as many as
    ``weights_in_memory`` bytes of weights hold; each group reads each shard once: a validation or test shard gives
    the group's predictions of it and, in the first group, member 0's domain distances in that one read."""
    val_targets = data.val.targets()
    on = CalibrationSet(None, label_units(val_targets, data.target_scaler), validation_source(fold)) \
        if calibration is None else file_set(calibration, data.features_scaler, in_training or 0)
    first, *rest = _member_groups(setup, fold, config, weights_in_memory)
    reads = _GroupReads(setup, data, on, rule)
    test_smiles: list[str] = []
    test_distances, distances = _first_group(setup, fold, config, data, first, reads, test_smiles)
    for group in rest:  # one group's models at a time: each list is gone before the next loads
        reads.every_split(_member_models(setup, fold, config, group))
    member_preds = [preds for preds, _ in reads.test_predictions]
    value = score_test_split(setup, fold, test_smiles, data.test_targets_raw, member_preds)
    cal = reads.calibration_predictions
    calibrated = calibrate_fold(setup, fold, on, [preds for preds, _ in cal], [v for _, v in cal], distances)
    targets = {"train": data.train.targets(), "val": val_targets, "test": data.test_targets_raw}
    return FoldOutcome(value, calibrated, fold_record(setup, fold, targets, test_smiles, member_preds,
                                                      test_distances), "")


def _first_group(setup: RunSetup, fold: int, config: FinetuneModelConfig, data: FoldData, members: list[int],
                 reads: "_GroupReads", test_smiles: list[str]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The first group's reads, in which member 0 also builds the fold's domain (``fold_k/domain.json``:
    ray_app.finetune.domain) and measures the distances the fold needs; returns the test molecules' and the
    calibration molecules' distances (None where not wanted). Notes the test SMILES in ``test_smiles``."""
    models = _member_models(setup, fold, config, members)
    domain = FoldDomain(setup, fold, data, models[0], reads.rule)
    fitted = domain.distances if domain.index is not None else None
    val_distances = reads.validation(models, fitted)
    index = domain.finish(val_distances)
    # a mondrian_domain calibration reads its molecules' distances, the fold's record the test's
    distance = fitted if needs_distance(setup) and index is not None else None
    return reads.test(models, distance, noting=test_smiles), reads.calibration(models, distance, val_distances)


def _member_groups(setup: RunSetup, fold: int, config: FinetuneModelConfig, weights_in_memory: int) \
        -> list[list[int]]:
    """The fold's members in groups of as many as ``weights_in_memory`` bytes of weights hold (at least one); the
    members of a fold share one architecture, so member 0's weights file tells the size of each."""
    members = list(range(setup.config.ensemble_size))
    size = (RunLayout(setup.layout.member(fold, 0)).model / WEIGHTS_FILE).stat().st_size
    per_group = max(1, weights_in_memory // max(size, 1))
    return [members[i:i + per_group] for i in range(0, len(members), per_group)]


class _GroupReads:
    """Each member's (predictions, variances or None) of the fold's validation, test and calibration molecules,
    gathered a group of members at a time, in member order; every call reads its split once for the group."""

    def __init__(self, setup: RunSetup, data: FoldData, on: CalibrationSet, rule: WidthRule | None):
        self.setup, self.data, self.on, self.rule = setup, data, on, rule
        self.val_predictions: list[Prediction] = []
        self.test_predictions: list[Prediction] = []
        self.file_predictions: list[Prediction] = []

    def _predicts(self, models: Sequence[KermtFinetuneModel]) -> list[Callable[[MoleculeSet], Prediction]]:
        c = self.setup.config
        return [partial(predict_molecules, model, target_scaler=self.data.target_scaler,
                        batch_size=c.step_batch_size, use_gpu=c.use_gpu, precision=c.precision, rule=self.rule)
                for model in models]

    def _calibrating(self, models: Sequence[KermtFinetuneModel]) -> list[Callable[[MoleculeSet], Prediction]]:
        return self._predicts(models) if is_calibrated(self.setup) else []

    def validation(self, models, distance=None) -> np.ndarray | None:
        """The validation split's read: predictions only when they calibrate; returns ``distance`` of it."""
        wanted = self._calibrating(models) if self.on.molecules is None else []
        if not wanted and distance is None:
            return None  # nothing to read it for
        found, distances = _read_once(self.data.val.sets(), wanted, distance)
        self.val_predictions += found
        return distances

    def test(self, models, distance=None, noting: list[str] | None = None) -> np.ndarray | None:
        parts = self.data.test.sets() if noting is None else _noting_smiles(self.data.test.sets(), noting)
        found, distances = _read_once(parts, self._predicts(models), distance)
        self.test_predictions += found
        return distances

    def calibration(self, models, distance=None, val_distances=None) -> np.ndarray | None:
        """The --calibration_path molecules' read (none without the file: the validation split calibrates);
        returns the calibration molecules' ``distance`` (``val_distances`` without the file)."""
        if self.on.molecules is None:
            return None if distance is None else val_distances
        found, distances = _read_once([self.on.molecules], self._calibrating(models), distance)
        self.file_predictions += found
        return distances

    def every_split(self, models: Sequence[KermtFinetuneModel]) -> None:
        self.validation(models)
        self.test(models)
        self.calibration(models)

    @property
    def calibration_predictions(self) -> list[Prediction]:
        return self.val_predictions if self.on.molecules is None else self.file_predictions


def _member_models(setup: RunSetup, fold: int, config: FinetuneModelConfig, members: Sequence[int]) \
        -> list[KermtFinetuneModel]:
    found = [finished_member(setup.layout.member(fold, member), setup.run_id, config) for member in members]
    assert all(f is not None for f in found), "train_members leaves every member in save_dir"
    return [f[0] for f in found]


def _read_once(parts: Iterable[MoleculeSet], predicts: Sequence[Callable[[MoleculeSet], Prediction]],
               distance: Callable[[MoleculeSet], np.ndarray] | None = None) \
        -> tuple[list[Prediction], np.ndarray | None]:
    """Each member's (predictions, variances or None) of a split, and its molecules' ``distance`` (None: not
    wanted), joined in order: every part (a shard) read once and predicted by every member in turn. A member
    predicts a part as it would alone, so the numbers are those of reading the split once a member."""
    per_member: list[list[Prediction]] = [[] for _ in predicts]
    distances: list[np.ndarray] = []
    for part in parts:
        for mine, predict in zip(per_member, predicts):
            mine.append(predict(part))
        if distance is not None:
            distances.append(distance(part))
    joined = None if distance is None else np.concatenate(distances or [np.zeros(0)])
    return [_joined(pairs) for pairs in per_member], joined


def score_test_split(setup: RunSetup, fold: int, test_smiles: Sequence[str], test_targets_raw: np.ndarray,
               member_preds: list[np.ndarray]) -> float:
    """Ensemble mean (summed in member order, as upstream) -> fold_k/test_result.csv; returns the fold's score."""
    c = setup.config
    ensemble = ensemble_mean(member_preds)
    blinded = len(setup.task_names) == 0 or bool(np.isnan(test_targets_raw).all())
    outputs.atomic_write_text(setup.layout.test_result(fold), outputs.test_result_csv(
        test_smiles, setup.task_names, ensemble, None if blinded else test_targets_raw))
    if blinded or len(test_smiles) == 0:
        return float("nan")
    value, per_task = score(ensemble, test_targets_raw, setup.metric, setup.dataset_type, None)
    print(f"Seed {c.seed + fold} ==> test {setup.metric} = {value:.6f}", flush=True)
    note = unscored_note(setup.task_names, ensemble, test_targets_raw, per_task, setup.dataset_type)
    if note:
        print(f"Seed {c.seed + fold} ==> {note}", flush=True)
    if c.show_individual_scores:
        for name, task_score in zip(setup.task_names, per_task):
            print(f"Seed {c.seed + fold} ==> test {name} {setup.metric} = {task_score:.6f}", flush=True)
    return value


def run_width_rule(setup: RunSetup, folds: int) -> WidthRule:
    """The width rule `kermt predict` applies to the run's saved members (all folds: its --checkpoint_dir ensemble),
    so test_result.csv, the calibration and the domain index are computed as predict computes."""
    return width_rule([saved_spec(RunLayout(setup.layout.member(fold, member)).model) for fold in range(folds)
                       for member in range(setup.config.ensemble_size)])


def _noting_smiles(parts: Iterator[MoleculeSet], smiles: list[str]) -> Iterator[MoleculeSet]:
    """``parts``, each one's SMILES appended to ``smiles`` on the way."""
    for part in parts:
        smiles.extend(part.smiles)
        yield part


def _joined(pairs: Sequence[Prediction]) -> Prediction:
    """(predictions, variances or None) of a split's parts, joined in order."""
    preds, variances = zip(*pairs)
    return np.concatenate(preds), None if variances[0] is None else np.concatenate(variances)


__all__ = ["FoldOutcome", "finish_fold", "finish_folds", "run_width_rule", "score_test_split"]
