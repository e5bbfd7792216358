"""`kermt eval --applicability_domain`: how much of the labelled file is in the domain, and the model's error inside
vs outside it (the check that the domain means something for this model: the error should be larger outside).

The stream carries ``in_domain`` and ``domain_distance``; this keeps them for the valid rows (as ``LabelledRows``
keeps the predictions) and scores once the stream is drained: ``<stem>_domain.json`` beside --output_path."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from kermt.data import atomic_files
from kermt.metrics import nanmean, task_scores
from ray_app.screening.domain import DISTANCE_COLUMN, IN_DOMAIN_COLUMN


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
        atomic_files.write_text(str(path.with_name(f"{path.stem}_domain.json")), json.dumps(report, indent=1) + "\n")


__all__ = ["DomainRows"]
