"""`kermt eval`: score a trained model or ensemble on a labelled file (upstream's ``main.py eval``).

It is `kermt predict` (same checks, same streaming pipeline, same batches and so the same numbers) with the label
columns carried along each row. Upstream's metrics score the valid rows (upstream drops invalid SMILES; each is
reported here): per task on its labelled rows, then the task mean (NaN tasks skipped), as a finetune's test score.
Outputs: upstream's ``test_result.csv`` layout at ``--output_path`` (SMILES, ensemble-mean predictions, targets) and
the lines ``test {metric} = X`` (per task with ``--show_individual_scores``) and ``overall_test_{metric}=X``.
A calibrated model's interval metrics, and a classification model's ECE and Brier (with a
``classification_calibration.json`` also calibrated, with prediction sets), go to ``<stem>_uncertainty.json``.

Memory: the model stage streams; the metrics (AUC, Spearman, ...) need every prediction at once, so the driver keeps
the valid rows' SMILES, predictions and labels (tens of bytes per row and task).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from kermt.data.tables import check_classification_labels, parse_labels
from kermt.errors import UserError
from kermt.inference import task_names
from kermt.metric_names import resolve_metric
from kermt.metrics import nanmean, task_scores, unscored_note
from kermt.run_layout import CLASS_CALIBRATION_FILE
from kermt.uncertainty.run_calibration import calibration_files, run_class_calibration
from ray_app.common import outputs
from ray_app.report import report_of_finished_run
from ray_app.screening.config import EvalConfig, log
from ray_app.screening.domain_scores import DomainRows
from ray_app.screening.files import column_names, pick_columns
from ray_app.screening.interval_scores import DEFAULT_EVAL_LEVEL, ClassificationScores, IntervalRows
from ray_app.screening.run import PredictPlan, input_progress, plan_predict, predict_stream
from ray_app.screening.stream import LABEL_PREFIX, drain


@dataclass
class LabelledRows:
    """The valid rows of the stream: SMILES, predictions [N, T] and labels [N, T] (NaN: missing)."""

    path: str
    tasks: tuple[str, ...]
    labels: tuple[str, ...]
    classification: bool
    rows_seen: int = 0
    smiles: list[str] = field(default_factory=list)
    preds: list[np.ndarray] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)

    def add(self, block: pa.Table) -> None:
        columns = [parse_labels(self.path, pd.Series(block.column(LABEL_PREFIX + name).to_pylist(), dtype=object),
                                name, self.rows_seen) for name in self.labels]
        targets = np.stack(columns, axis=1)
        if self.classification:
            check_classification_labels(self.path, targets, self.labels, self.rows_seen)
        valid = block.column("valid").to_numpy(zero_copy_only=False).astype(bool)
        preds = np.stack([block.column(t).to_numpy(zero_copy_only=False) for t in self.tasks], axis=1)
        self.smiles += [s for s, ok in zip(block.column("smiles").to_pylist(), valid) if ok]
        self.preds.append(preds[valid].astype(np.float64))
        self.targets.append(targets[valid])
        self.rows_seen += block.num_rows

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        width = len(self.tasks)
        stack = (lambda parts: np.concatenate(parts) if parts else np.zeros((0, width)))
        return stack(self.preds), stack(self.targets)


def _labels(config: EvalConfig, tasks: tuple[str, ...], smiles_column: str) -> tuple[str, ...]:
    labels = tuple(config.target_columns or tasks)
    if len(labels) != len(tasks):
        raise UserError(f"--target_columns names {len(labels)} column(s) but the model predicts {len(tasks)} tasks "
                        f"({', '.join(tasks)}); give one label column per task, in this order")
    pick_columns(column_names(config.data_path), smiles_column, labels)
    return labels


def _class_calibrated(config: EvalConfig) -> bool:
    return bool(config.checkpoint_dir) and calibration_files(config.checkpoint_dir, CLASS_CALIBRATION_FILE) is not None


def _classification_scores(config: EvalConfig, tasks: tuple[str, ...], level: float | None) -> ClassificationScores:
    """ECE/Brier always; the calibrated ones and the sets at ``level`` (default 0.9) with a classification
    calibration, whose level is checked here, before Ray starts."""
    if not _class_calibrated(config):
        return ClassificationScores(tasks, None, DEFAULT_EVAL_LEVEL)
    calibrations = run_class_calibration(config.checkpoint_dir, tasks)
    level = DEFAULT_EVAL_LEVEL if level is None else level
    for calibration in calibrations.values():
        calibration.quantile(level)
    first = next(iter(calibrations.values()))
    log(f"{level:.0%} prediction sets and {first.method}-calibrated probabilities, calibrated on {first.n} "
        "molecule(s) per task")
    return ClassificationScores(tasks, calibrations, level)


def _planned(config: EvalConfig) -> tuple[EvalConfig, PredictPlan, float | None]:
    """plan_predict for eval: a calibrated regression model is scored at 0.9 by default; a classification
    calibration's ``--interval`` is kept for its sets (scored on the driver) and not passed to the stream."""
    # a calibrated model is scored at 0.9 too, unless MC dropout changes the spread the calibration was fitted on
    if config.interval is None and config.checkpoint_dir and not config.dropout_samples \
            and calibration_files(config.checkpoint_dir) is not None:
        config = config.model_copy(update={"interval": DEFAULT_EVAL_LEVEL})
    class_calibrated, set_level = _class_calibrated(config), config.interval
    if class_calibrated:
        config = config.model_copy(update={"interval": None})
    checked = plan_predict(config)
    dataset_type = checked.members[0].spec.head.dataset_type
    if class_calibrated and dataset_type != "classification":
        raise UserError(f"--checkpoint_dir {config.checkpoint_dir} holds {CLASS_CALIBRATION_FILE}, but the model is "
                        f"{dataset_type}: remove that file")
    return config, checked, set_level


def run_eval(config: EvalConfig) -> int:
    started = time.perf_counter()
    config, checked, set_level = _planned(config)
    head = checked.members[0].spec.head
    tasks = task_names(checked.members[0].spec)
    labels = _labels(config, tasks, checked.source.smiles_column)
    metric = resolve_metric(config.metric, head.dataset_type, "from the checkpoint")  # before Ray starts
    rows = LabelledRows(config.data_path, tasks, labels, head.dataset_type == "classification")
    classes = _classification_scores(config, tasks, set_level) if rows.classification else None
    scored = IntervalRows(tasks, checked.calibrations, config.interval) if checked.calibrations else None
    if scored is not None:  # the spread is needed for the metrics
        config = config.model_copy(update={"uncertainty": True})
    domain = DomainRows(checked.domain.threshold) if checked.domain is not None else None
    sinks = [sink.add for sink in (rows, scored, domain) if sink is not None]
    stats = drain(predict_stream(config, checked, labels), lambda block: [add(block) for add in sinks],
                  input_progress(config.data_path, "scoring"))
    if stats.valid == 0:
        raise UserError(stats.all_invalid_message(config.data_path))
    preds, targets = rows.arrays()
    outputs.atomic_write_text(Path(config.output_path), outputs.test_result_csv(rows.smiles, tasks, preds, targets))
    log(f"scored {stats.valid} rows ({stats.rows - stats.valid} invalid SMILES skipped); wrote {config.output_path} "
        f"in {time.perf_counter() - started:.1f} s")
    per_task = task_scores(preds, targets, metric, head.dataset_type)
    if config.show_individual_scores:
        for name, value in zip(tasks, per_task):
            print(f"test {name} {metric} = {value:.6f}", flush=True)
    note = unscored_note(tasks, preds, targets, per_task, head.dataset_type)
    if note:
        print(f"test {metric}: {note}", flush=True)
    value = nanmean(per_task)
    print(f"test {metric} = {value:.6f}", flush=True)
    print(f"overall_test_{metric}={value:.6f}", flush=True)
    for scores in (scored, classes):
        if scores is not None:
            scores.print_and_write(preds, targets, config.output_path)
    if domain is not None:
        domain.print_and_write(preds, targets, metric, head.dataset_type, config.output_path)
    report_of_finished_run(Path(config.output_path), head.dataset_type)  # <stem>_report.html; main_eval says where
    return 0


__all__ = ["LabelledRows", "run_eval"]
