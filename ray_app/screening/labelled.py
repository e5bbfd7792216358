"""The valid rows of a prediction stream whose label columns travel along (``label::<name>``): what `kermt eval`
scores and what ``--calibration_path`` fits a calibration on (ray_app.screening.uncertainty)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from kermt.data.tables import check_classification_labels, parse_labels
from kermt.inference.columns import DISTANCE_COLUMN, STD_SUFFIX
from ray_app.screening.stream import LABEL_PREFIX


@dataclass
class LabelledRows:
    """The valid rows of the stream: SMILES, predictions [N, T], labels [N, T] (NaN: missing) and, when the stream
    carries ``<task>_std``, the spreads [N, T]."""

    path: str
    tasks: tuple[str, ...]
    labels: tuple[str, ...]
    classification: bool
    rows_seen: int = 0
    smiles: list[str] = field(default_factory=list)
    preds: list[np.ndarray] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)
    spreads: list[np.ndarray] = field(default_factory=list)
    distances: list[np.ndarray] = field(default_factory=list)

    def add(self, block: pa.Table) -> None:
        columns = [parse_labels(self.path, pd.Series(block.column(LABEL_PREFIX + name).to_pylist(), dtype=object),
                                name, self.rows_seen) for name in self.labels]
        targets = np.stack(columns, axis=1)
        if self.classification:
            check_classification_labels(self.path, targets, self.labels, self.rows_seen)
        valid = block.column("valid").to_numpy(zero_copy_only=False).astype(bool)
        self.smiles += [s for s, ok in zip(block.column("smiles").to_pylist(), valid) if ok]
        self.preds.append(self._columns(block, "")[valid])
        if self.tasks[0] + STD_SUFFIX in block.column_names:
            self.spreads.append(self._columns(block, STD_SUFFIX)[valid])
        if DISTANCE_COLUMN in block.column_names:
            self.distances.append(block.column(DISTANCE_COLUMN).to_numpy(zero_copy_only=False)[valid])
        self.targets.append(targets[valid])
        self.rows_seen += block.num_rows

    def _columns(self, block: pa.Table, suffix: str) -> np.ndarray:
        return np.stack([block.column(t + suffix).to_numpy(zero_copy_only=False) for t in self.tasks],
                        axis=1).astype(np.float64)

    def _stacked(self, parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros((0, len(self.tasks)))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(predictions, labels) of the valid rows."""
        return self._stacked(self.preds), self._stacked(self.targets)

    def spread(self) -> np.ndarray:
        """The valid rows' ``<task>_std`` [N, T] (the stream must carry it)."""
        return self._stacked(self.spreads)

    def distance(self) -> np.ndarray | None:
        """The valid rows' ``domain_distance`` [N] (None when the stream does not carry it)."""
        return np.concatenate(self.distances).astype(np.float64) if self.distances else None


__all__ = ["LabelledRows"]
