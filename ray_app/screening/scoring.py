"""`kermt eval`: score a trained model or ensemble on a labelled file (upstream's ``main.py eval``).

It is `kermt predict` (same checks, same streaming pipeline, same batches and so the same numbers) with the label
columns carried along each row. Upstream's metrics score the valid rows (upstream drops invalid SMILES; each is
reported here): per task on its labelled rows, then the task mean (NaN tasks skipped), as a finetune's test score.
Outputs: upstream's ``test_result.csv`` layout at ``--output_path`` (SMILES, ensemble-mean predictions, targets) and
the lines ``test {metric} = X`` (per task with ``--show_individual_scores``) and ``overall_test_{metric}=X``.
A calibrated model's interval metrics, and a classification model's ECE and Brier (with a
``classification_calibration.json`` also calibrated, with prediction sets), go to ``<stem>_uncertainty.json``;
with ``--calibration_path`` the calibration is first fitted on that file (ray_app.screening.uncertainty).
``--attributions``: ``<stem>_attributions.csv``, `kermt predict --attributions`' file of the input (every row: the
SMILES, predictions, attribution columns, id columns, each task's label as ``<task>_target``, valid, error), written
as the rows stream (upstream's test_result.csv has no place for them).

Memory: the model stage streams; the metrics (AUC, Spearman, ...) need every prediction at once, so the driver keeps
the valid rows' SMILES, predictions and labels (tens of bytes per row and task).
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from kermt.errors import UserError
from kermt.inference import task_names
from kermt.metric_names import resolve_metric
from kermt.metrics import nanmean, task_scores, unscored_note
from kermt.run_layout import ATTRIBUTIONS_FILE_SUFFIX, CALIBRATION_FILE, CLASS_CALIBRATION_FILE, beside_output
from kermt.uncertainty.run_calibration import calibration_files
from ray_app.common import outputs
from ray_app.report import report_of_finished_run
from ray_app.screening.config import EvalConfig, log
from ray_app.screening.files import Source, TableWriter, pick_columns
from ray_app.screening.labelled import LabelledRows
from ray_app.screening.engines import predict_stream, resolve_engine
from ray_app.screening.plan import PredictPlan, plan_predict
from ray_app.screening.run import unattributed_rows
from ray_app.screening.stream import LABEL_PREFIX, drain, input_progress
from ray_app.screening.uncertainty import calibrated_on_file
from ray_app.screening.uncertainty_scores import DEFAULT_EVAL_LEVEL, ClassificationScores, DomainRows, IntervalRows

TARGET_SUFFIX = "_target"  # <stem>_attributions.csv: each task's label column


def _labels(config: EvalConfig, tasks: tuple[str, ...], source: Source) -> tuple[str, ...]:
    labels = tuple(config.target_columns or tasks)
    if len(labels) != len(tasks):
        raise UserError(f"--target_columns names {len(labels)} column(s) but the model predicts {len(tasks)} tasks "
                        f"({', '.join(tasks)}); give one label column per task, in this order")
    pick_columns(source.table.columns, source.smiles_column, labels)
    return labels


def _calibrated(config: EvalConfig) -> bool:
    """Whether the model has a calibration to score: ``--calibration_path``, or the run's (regression or
    classification) unless MC dropout changes the spread and mean it was fitted on."""
    if config.calibration_path is not None:
        return True
    if not config.checkpoint_dir or config.dropout_samples:
        return False
    return any(calibration_files(config.checkpoint_dir, name) is not None
               for name in (CALIBRATION_FILE, CLASS_CALIBRATION_FILE))


def _planned(config: EvalConfig) -> tuple[EvalConfig, PredictPlan]:
    """plan_predict for eval: a calibrated model is scored at 0.9 by default (its intervals, or its prediction
    sets); ``--calibration_path`` is fitted here (on the cluster), before the file is scored."""
    config = resolve_engine(config, (config.calibration_path,))
    if config.interval is None and _calibrated(config):
        config = config.model_copy(update={"interval": DEFAULT_EVAL_LEVEL})
    return config, calibrated_on_file(config, plan_predict(config))


def run_eval(config: EvalConfig) -> int:
    started = time.perf_counter()
    config, checked = _planned(config)
    head = checked.members[0].spec.head
    tasks = task_names(checked.members[0].spec)
    labels = _labels(config, tasks, checked.source)
    metric = resolve_metric(config.metric, head.dataset_type, "from the checkpoint")  # before Ray starts
    rows = LabelledRows(config.data_path, tasks, labels, head.dataset_type == "classification")
    classes = (ClassificationScores(tasks, checked.class_calibrations, config.interval or DEFAULT_EVAL_LEVEL)
               if rows.classification else None)
    scored = IntervalRows(tasks, checked.calibrations, config.interval) if checked.calibrations else None
    if scored is not None:  # the spread is needed for the metrics
        config = config.model_copy(update={"uncertainty": True})
    domain = DomainRows(checked.domain.threshold) if config.applicability_domain else None
    attributed = AttributionFile(config, checked, labels) if config.attributions else None
    sinks = [sink.add for sink in (rows, scored, domain, attributed) if sink is not None]
    stats = drain(predict_stream(config, checked, labels), lambda block: [add(block) for add in sinks],
                  input_progress(config.data_path, "scoring"))
    if stats.valid == 0:
        if attributed is not None:
            attributed.abort()
        raise UserError(stats.all_invalid_message(config.data_path))
    if attributed is not None:
        attributed.commit()
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
    # <stem>_report.html (main_eval says where); the model colours its worst-predicted molecules by attribution
    # (read from <stem>_attributions.csv when --attributions wrote it, else computed for those few in this process)
    report_of_finished_run(Path(config.output_path), head.dataset_type,
                           model=str(config.checkpoint_dir or config.checkpoint_path),
                           trust_checkpoint=config.trust_checkpoint)
    return 0


class AttributionFile:
    """--attributions: ``<stem>_attributions.csv`` beside --output_path, each block as it streams by, the label
    columns named ``<task>_target``; the note on molecules over the attributions' budget once it is complete."""

    def __init__(self, config: EvalConfig, checked: PredictPlan, labels: tuple[str, ...]) -> None:
        output = Path(config.output_path)
        self.path = beside_output(output, ATTRIBUTIONS_FILE_SUFFIX)
        self.writer = TableWriter(self.path)
        tasks = task_names(checked.members[0].spec)
        self.targets = {LABEL_PREFIX + label: task + TARGET_SUFFIX for task, label in zip(tasks, labels)}
        self.unattributed = unattributed_rows(config, checked)

    def add(self, block: pa.Table) -> None:
        self.unattributed.add(block)
        self.writer.write(block.rename_columns([self.targets.get(name, name) for name in block.column_names]))

    def commit(self) -> None:
        self.writer.commit()
        self.unattributed.note()
        log(f"attributions: wrote {self.path}")

    def abort(self) -> None:
        self.writer.abort()


__all__ = ["AttributionFile", "LabelledRows", "run_eval"]
