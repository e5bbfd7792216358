"""Per-task sections of a report, from the predictions and measured values of a test set (a finetune's folds or
a file `kermt eval` scored): metrics, a parity plot and residuals (regression) or ROC, PR and the confusion matrix
(classification), and the worst-predicted molecules drawn next to their errors."""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kermt.metrics import METRICS, task_scores
from ray_app.report import figures
from ray_app.report.attributions import NO_MODEL, Explained, colour_molecules, explain, timing_note
from ray_app.report.molecules import molecule_uri
from ray_app.report.page import Figure, Molecule, Section, Table, fmt

REGRESSION_METRICS = ("rmse", "mae", "r2", "spearmanr")
CLASSIFICATION_METRICS = ("auc", "prc-auc", "accuracy", "matthews_corrcoef")
WORST_SHOWN = 8


@dataclass
class TaskData:
    """One task's labelled test molecules: smiles, measured, predicted, the interval when calibrated, and the
    model that predicted each (what ``kermt.load_run`` takes; None: not known, so no attributions)."""

    name: str
    smiles: list[str]
    measured: np.ndarray
    predicted: np.ndarray
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None
    models: list[str] | None = None


def labelled(name: str, smiles: list[str], measured: np.ndarray, predicted: np.ndarray,
             lower: np.ndarray | None = None, upper: np.ndarray | None = None, model: str | None = None) -> TaskData:
    """Only the molecules with a label and a finite prediction; ``model``: the one that predicted them all."""
    keep = ~np.isnan(measured) & np.isfinite(predicted)

    def pick(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a)[keep]

    kept = [s for s, k in zip(smiles, keep) if k]
    return TaskData(name, kept, measured[keep], predicted[keep], pick(lower), pick(upper),
                    None if model is None else [model] * len(kept))


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


def task_section(task: TaskData, dataset_type: str, source: str,
                 explained: Sequence[Explained | str] | None = None) -> Section:
    """``explained``: the attributions of the worst molecules (:func:`explain_worst`), which colour their drawings."""
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
    if explained is not None:
        colour_molecules(section, task.name, explained, dataset_type == "classification")
    return section


def explain_worst(per_task: Sequence[TaskData], notes: list[str],
                  trust_checkpoint: bool = False) -> list[list[Explained | str]]:
    """The attributions of each task's worst molecules (:func:`worst_rows`), each by the model that predicted it;
    all the tasks' molecules of one model in one call. A line on the time taken is added to ``notes``."""
    picks = [worst_rows(task) for task in per_task]
    requests: dict[str, list[str]] = defaultdict(list)
    for task, rows in zip(per_task, picks):
        for i in rows if task.models is not None else ():
            requests[task.models[i]].append(task.smiles[i])
    found = explain(requests, trust_checkpoint)
    if requests:
        notes.append(timing_note(found, len({(m, s) for m, smiles in requests.items() for s in smiles}),
                                 list(requests)))
    return [[NO_MODEL if task.models is None else found.get(task.models[i], task.smiles[i], task.name)
             for i in rows] for task, rows in zip(per_task, picks)]


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


def worst_rows(task: TaskData, count: int = WORST_SHOWN) -> np.ndarray:
    """The rows of the ``count`` molecules with the largest absolute error, largest first."""
    return np.argsort(-np.abs(task.predicted - task.measured), kind="stable")[:count]


def worst_molecules(task: TaskData, dataset_type: str, count: int = WORST_SHOWN) -> list[Molecule]:
    """The ``count`` molecules with the largest absolute error, drawn, with measured, predicted and error."""
    error = task.predicted - task.measured
    order = worst_rows(task, count)
    kind = "probability" if dataset_type == "classification" else "predicted"
    shown = []
    for i in order:
        lines = [f"measured {fmt(float(task.measured[i]))}", f"{kind} {fmt(float(task.predicted[i]))}",
                 f"error {fmt(float(error[i]))}"]
        if task.lower is not None:
            lines.append(f"90% interval [{fmt(float(task.lower[i]))}, {fmt(float(task.upper[i]))}]")
        shown.append(Molecule(task.smiles[i], molecule_uri(task.smiles[i]), lines))
    return shown


__all__ = ["TaskData", "explain_worst", "labelled", "metric_names", "task_metrics", "task_section", "worst_molecules",
           "worst_rows"]
