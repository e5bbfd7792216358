"""`kermt eval`'s scores of what a prediction adds: the uncertainty metrics of a calibrated model's intervals on
the labelled file, per task (:class:`IntervalRows`); of a classification model, calibrated or not, ECE, Brier and
its prediction sets (:class:`ClassificationScores`); with ``--applicability_domain``, how much of the file is in
the domain and the model's error inside vs outside it (:class:`DomainRows`: the check that the domain means
something for this model: the error should be larger outside).

The stream carries ``<task>_std``, the bounds and the domain columns; the row keepers here keep them for the valid
rows (as ``LabelledRows`` keeps the predictions) and score them once the stream is drained (kermt.uncertainty.metrics).
Each writes a JSON file beside ``--output_path``: ``<stem>_uncertainty.json``, ``<stem>_domain.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from kermt.data import atomic_files
from kermt.inference.columns import DISTANCE_COLUMN, IN_DOMAIN_COLUMN, LOWER_SUFFIX, STD_SUFFIX, UPPER_SUFFIX
from kermt.metrics import nanmean, task_scores
from kermt.uncertainty import Calibration, ClassCalibration
from kermt.uncertainty.metrics import interval_report, probability_report, set_report
from kermt.run_layout import DOMAIN_SCORES_SUFFIX, UNCERTAINTY_SCORES_SUFFIX, beside_output

DEFAULT_EVAL_LEVEL = 0.9  # eval of a calibrated model without --interval scores its 90 % intervals


@dataclass
class IntervalRows:
    tasks: tuple[str, ...]
    calibrations: dict[str, Calibration]
    level: float
    parts: dict[str, list[np.ndarray]] = field(default_factory=lambda: {"sigma": [], "lower": [], "upper": []})

    def add(self, block: pa.Table) -> None:
        valid = block.column("valid").to_numpy(zero_copy_only=False).astype(bool)
        for key, suffix in (("sigma", STD_SUFFIX), ("lower", LOWER_SUFFIX), ("upper", UPPER_SUFFIX)):
            values = np.stack([block.column(t + suffix).to_numpy(zero_copy_only=False) for t in self.tasks], axis=1)
            self.parts[key].append(values[valid].astype(np.float64))

    def report(self, preds: np.ndarray, targets: np.ndarray) -> dict[str, dict[str, float]]:
        """Per task: coverage, width, width/RMSE and, with a spread, the z-scaled sigma's calibration metrics."""
        width = len(self.tasks)
        sigma, lower, upper = (np.concatenate(p) if p else np.zeros((0, width)) for p in self.parts.values())
        report = {}
        for t, task in enumerate(self.tasks):
            calibration = self.calibrations[task]
            scaled = calibration.calibrated_sigma(sigma[:, t]) if calibration.z_scale is not None else None
            report[task] = interval_report(targets[:, t], preds[:, t], scaled, lower[:, t], upper[:, t])
        return report

    def print_and_write(self, preds: np.ndarray, targets: np.ndarray, output_path: str) -> None:
        report = self.report(preds, targets)
        for task, values in report.items():
            print(f"test {task} {self.level:.0%} interval: " + ", ".join(f"{k} = {v:.4f}" for k, v in values.items()),
                  flush=True)
        path = Path(output_path)
        atomic_files.write_text(str(beside_output(path, UNCERTAINTY_SCORES_SUFFIX)), json.dumps(
            {"level": self.level, "method": next(iter(self.calibrations.values())).method, "tasks": report},
            indent=1) + "\n")


@dataclass
class ClassificationScores:
    """`kermt eval` of a classification model: per task ECE and Brier of the model's own probabilities; with a
    classification calibration, of the recalibrated ones too, and the coverage and size of its prediction sets at
    ``level``. Scored on the driver from the predictions ``LabelledRows`` keeps: the stream is not involved."""

    tasks: tuple[str, ...]
    calibrations: dict[str, ClassCalibration] | None
    level: float

    def report(self, preds: np.ndarray, targets: np.ndarray) -> dict[str, dict[str, float]]:
        report = {}
        for t, task in enumerate(self.tasks):
            y, p = targets[:, t], preds[:, t]
            report[task] = probability_report(y, p)
            if self.calibrations is not None:
                calibration = self.calibrations[task]
                report[task].update({f"calibrated_{k}": v
                                     for k, v in probability_report(y, calibration.calibrated(p)).items()})
                report[task].update(set_report(y, calibration.sets(p, self.level)))
        return report

    def print_and_write(self, preds: np.ndarray, targets: np.ndarray, output_path: str) -> None:
        report = self.report(preds, targets)
        method = None if self.calibrations is None else next(iter(self.calibrations.values())).method
        what = "probabilities" if method is None else f"probabilities ({method}-calibrated, {self.level:.0%} sets)"
        for task, values in report.items():
            print(f"test {task} {what}: " + ", ".join(f"{k} = {v:.4f}" for k, v in values.items()), flush=True)
        path = Path(output_path)
        atomic_files.write_text(str(beside_output(path, UNCERTAINTY_SCORES_SUFFIX)), json.dumps(
            {"kind": "classification", "level": None if method is None else self.level, "method": method,
             "tasks": report}, indent=1) + "\n")


@dataclass
class DomainRows:
    threshold: float
    inside: list[np.ndarray] = field(default_factory=list)
    distances: list[np.ndarray] = field(default_factory=list)

    def add(self, block: pa.Table) -> None:
        valid = block.column("valid").to_numpy(zero_copy_only=False).astype(bool)
        self.inside.append(block.column(IN_DOMAIN_COLUMN).to_numpy(zero_copy_only=False)[valid].astype(bool))
        self.distances.append(block.column(DISTANCE_COLUMN).to_numpy(zero_copy_only=False)[valid].astype(np.float64))

    def report(self, preds: np.ndarray, targets: np.ndarray, metric: str, dataset_type: str) -> dict[str, float]:
        """The fraction in domain and the task-mean ``metric`` on the molecules inside and outside it."""
        inside = np.concatenate(self.inside) if self.inside else np.zeros(0, bool)
        distances = np.concatenate(self.distances) if self.distances else np.zeros(0)
        report = {"threshold": self.threshold, "n": int(len(inside)), "n_in_domain": int(inside.sum()),
                  "fraction_in_domain": float(inside.mean()) if len(inside) else float("nan"),
                  "median_distance": float(np.median(distances)) if len(distances) else float("nan")}
        for name, rows in (("in_domain", inside), ("out_of_domain", ~inside)):
            report[f"{metric}_{name}"] = (nanmean(task_scores(preds[rows], targets[rows], metric, dataset_type))
                                          if rows.any() else float("nan"))
        return report

    def print_and_write(self, preds: np.ndarray, targets: np.ndarray, metric: str, dataset_type: str,
                        output_path: str) -> None:
        report = self.report(preds, targets, metric, dataset_type)
        print(f"test applicability domain: {report['n_in_domain']} of {report['n']} molecules in domain "
              f"({report['fraction_in_domain']:.1%}); {metric} {report[f'{metric}_in_domain']:.4f} inside, "
              f"{report[f'{metric}_out_of_domain']:.4f} outside", flush=True)
        path = Path(output_path)
        atomic_files.write_text(str(beside_output(path, DOMAIN_SCORES_SUFFIX)), json.dumps(report, indent=1) + "\n")


__all__ = ["DEFAULT_EVAL_LEVEL", "ClassificationScores", "DomainRows", "IntervalRows"]
