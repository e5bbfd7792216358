"""Per-task sections of a report, from the predictions and measured values of a test set (a finetune's folds or
a file `kermt eval` scored): metrics, a parity plot and residuals (regression) or ROC, PR and the confusion matrix
(classification), and the worst-predicted molecules drawn next to their errors."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from kermt.metrics import METRICS, task_scores
from ray_app.report import figures
from ray_app.report.molecules import molecule_uri
from ray_app.report.page import Figure, Molecule, Section, Table, fmt

REGRESSION_METRICS = ("rmse", "mae", "r2", "spearmanr")
CLASSIFICATION_METRICS = ("auc", "prc-auc", "accuracy", "matthews_corrcoef")
WORST_SHOWN = 8


@dataclass
class TaskData:
    """One task's labelled test molecules: smiles, measured, predicted, and the interval when calibrated."""

    name: str
    smiles: list[str]
    measured: np.ndarray
    predicted: np.ndarray
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None


def labelled(name: str, smiles: list[str], measured: np.ndarray, predicted: np.ndarray,
             lower: np.ndarray | None = None, upper: np.ndarray | None = None) -> TaskData:
    """Only the molecules with a label and a finite prediction."""
    keep = ~np.isnan(measured) & np.isfinite(predicted)

    def pick(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a)[keep]

    return TaskData(name, [s for s, k in zip(smiles, keep) if k], measured[keep], predicted[keep],
                    pick(lower), pick(upper))


def metric_names(dataset_type: str) -> tuple[str, ...]:
    return CLASSIFICATION_METRICS if dataset_type == "classification" else REGRESSION_METRICS


def task_metrics(task: TaskData, dataset_type: str) -> dict[str, float]:
    """Every usual metric of the task (NaN where it is undefined, e.g. one class only)."""
    if not len(task.measured):
        return {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: task_scores(task.predicted[:, None], task.measured[:, None], name, dataset_type)[0]
                for name in metric_names(dataset_type) if name in METRICS}


def task_section(task: TaskData, dataset_type: str, source: str) -> Section:
    section = Section(title=f"Task {task.name}")
    if not len(task.measured):
        section.notes.append(f"{source} has no labels for {task.name}: nothing to score or plot (not recorded)")
        return section
    section.notes.append(f"{len(task.measured)} labelled molecule(s) in {source}")
    scores = task_metrics(task, dataset_type)
    section.tables.append(Table(list(scores), [[fmt(v) for v in scores.values()]], caption="test metrics"))
    if dataset_type == "classification":
        section.figures += _classification_figures(task, section)
    else:
        section.figures += _regression_figures(task, section)
    section.molecules = worst_molecules(task, dataset_type)
    section.molecules_title = f"{task.name}: the {len(section.molecules)} worst-predicted test molecules"
    return section


def _regression_figures(task: TaskData, section: Section) -> list[Figure]:
    if task.lower is not None:
        inside = float(np.mean((task.measured >= task.lower) & (task.measured <= task.upper)))
        section.notes.append(f"90% interval from the fold calibration: {inside:.0%} of the test labels inside, mean "
                             f"width {float(np.mean(task.upper - task.lower)):.4g}")
    return [Figure(f"{task.name}: predicted against measured" + (" (error bars: 90% interval)"
                                                                  if task.lower is not None else ""),
                   figures.parity(task.measured, task.predicted, task.name, task.lower, task.upper)),
            Figure(f"{task.name}: residuals", figures.residuals(task.measured, task.predicted, task.name))]


def _classification_figures(task: TaskData, section: Section) -> list[Figure]:
    classes = set(np.unique(task.measured).tolist())
    if not classes <= {0.0, 1.0}:
        section.notes.append(f"{task.name}: labels are not 0/1, so no ROC, PR or confusion matrix")
        return []
    shown = [Figure(f"{task.name}: confusion matrix at p >= 0.5",
                    figures.confusion(task.measured, task.predicted, task.name))]
    if len(classes) < 2:
        section.notes.append(f"{task.name}: the test set has one class only, so no ROC or PR curve")
        return shown
    return [Figure(f"{task.name}: ROC and precision-recall", figures.roc_and_pr(task.measured, task.predicted,
                                                                               task.name))] + shown


def worst_molecules(task: TaskData, dataset_type: str, count: int = WORST_SHOWN) -> list[Molecule]:
    """The ``count`` molecules with the largest absolute error, drawn, with measured, predicted and error."""
    error = task.predicted - task.measured
    order = np.argsort(-np.abs(error), kind="stable")[:count]
    kind = "probability" if dataset_type == "classification" else "predicted"
    shown = []
    for i in order:
        lines = [f"measured {fmt(float(task.measured[i]))}", f"{kind} {fmt(float(task.predicted[i]))}",
                 f"error {fmt(float(error[i]))}"]
        if task.lower is not None:
            lines.append(f"90% interval [{fmt(float(task.lower[i]))}, {fmt(float(task.upper[i]))}]")
        shown.append(Molecule(task.smiles[i], molecule_uri(task.smiles[i]), lines))
    return shown


__all__ = ["TaskData", "labelled", "metric_names", "task_metrics", "task_section", "worst_molecules"]
