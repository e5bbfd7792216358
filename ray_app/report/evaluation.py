"""The report of a file `kermt eval` scored (upstream's test_result.csv layout at its --output_path): per task the
same metrics and plots a finetune's test set gets, and the worst-predicted molecules."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kermt.run_layout import UNCERTAINTY_SCORES_SUFFIX, beside_output
from ray_app.report.attributions import recorded_beside
from ray_app.report.page import Report, Section, Table, fmt
from ray_app.report.results import TestResult, read_test_result
from ray_app.report.run_files import read_json
from ray_app.report.tasks import explain_worst, labelled, task_section


def guessed_dataset_type(result: TestResult) -> str:
    """The file does not say: labels all 0/1 with predictions in [0, 1] are a classification's."""
    if result.targets is None:
        return "regression"
    labels, preds = result.targets[~np.isnan(result.targets)], result.preds[np.isfinite(result.preds)]
    binary = labels.size > 0 and set(np.unique(labels).tolist()) <= {0.0, 1.0}
    return "classification" if binary and preds.size and preds.min() >= 0 and preds.max() <= 1 else "regression"


def eval_report(path: Path, dataset_type: str | None = None, model: str | None = None,
                trust_checkpoint: bool = False) -> Report:
    """The worst-predicted molecules are coloured by the attributions kermt eval --attributions wrote beside the
    file (``<stem>_attributions.csv``), else by ``model``'s (the one that scored the file, what ``kermt.load_run``
    takes, computed for them); with neither they are drawn plain."""
    result = read_test_result(path)
    model = recorded_beside(path) or model
    dataset_type = dataset_type or guessed_dataset_type(result)
    overview = Section("Scored file", notes=[f"{len(result.smiles)} scored molecule(s), {len(result.tasks)} task(s): "
                                             f"{', '.join(result.tasks)}; read as {dataset_type}"])
    if result.targets is None:
        overview.notes.append("the file has no measured values (blinded): nothing to score (not recorded)")
        return Report(f"kermt eval report: {path.name}", str(path), [overview])
    uncertainty = _uncertainty_table(path)
    if uncertainty is not None:
        overview.tables.append(uncertainty)
    per_task = [labelled(task, result.smiles, result.targets[:, t], result.preds[:, t], model=model)
                for t, task in enumerate(result.tasks)]
    explained = explain_worst(per_task, overview.notes, trust_checkpoint)
    sections = [task_section(task, dataset_type, path.name, why) for task, why in zip(per_task, explained)]
    return Report(f"kermt eval report: {path.name}", str(path), [overview, *sections])


def _uncertainty_table(path: Path) -> Table | None:
    """The interval scores eval wrote beside the file (``<stem>_uncertainty.json``, a calibrated model), if any."""
    record = read_json(beside_output(path, UNCERTAINTY_SCORES_SUFFIX))
    tasks = (record or {}).get("tasks")
    if not isinstance(tasks, dict) or not tasks:
        return None
    names = list(dict.fromkeys(k for values in tasks.values() for k in values))
    caption = f"{fmt(record.get('level'))} interval ({fmt(record.get('method'))} conformal) on this file"
    if record.get("kind") == "classification":  # ECE/Brier; with a calibration, calibrated ones and the sets
        caption = "probabilities on this file" + (f" ({record['method']}-calibrated, {fmt(record.get('level'))} "
                                                  "prediction sets)" if record.get("method") else "")
    return Table(["task", *names], [[task, *(fmt(values.get(k)) for k in names)] for task, values in tasks.items()],
                 caption=caption)


__all__ = ["eval_report", "guessed_dataset_type"]
