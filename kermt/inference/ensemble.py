"""Ensembles of finetuned members predicting blocks of molecules in batches of consecutive rows (see the package
docstring for why batches are cut that way)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kermt.checkpoint import Checkpoint, load_finetune_model
from kermt.data.featurize import FeaturizedMolecules
from kermt.errors import UserError
from kermt.inference.features import scale_features
from kermt.inference.members import task_names

def batch_starts(n_rows: int, batch_size: int) -> range:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return range(0, n_rows, batch_size)


@dataclass
class EnsemblePrediction:
    """mean, std: float64 [N, T]; NaN rows for invalid molecules. ``std`` is the population std over members."""

    mean: np.ndarray
    std: np.ndarray


class Ensemble:
    """Finetuned members that predict together (mean over members, summed in member order as upstream)."""

    def __init__(self, members: Sequence[Checkpoint], device: torch.device | str = "cpu") -> None:
        if not members:
            raise ValueError("an ensemble needs at least one checkpoint")
        self.specs = [m.spec for m in members]
        names = {task_names(s) for s in self.specs}
        kinds = {s.head.dataset_type for s in self.specs}
        if len(names) > 1 or len(kinds) > 1:
            raise UserError(f"ensemble members disagree on tasks {sorted(names)} or dataset type {sorted(kinds)}: "
                            "their models were trained on different data; predict with each group separately")
        self.task_names = names.pop()
        self.dataset_type = kinds.pop()
        self.device = torch.device(device)
        self.models = [self._load(m) for m in members]

    def _load(self, checkpoint: Checkpoint) -> nn.Module:
        model, _ = load_finetune_model(checkpoint)
        return model.to(self.device).eval()

    @torch.no_grad()
    def member_predictions(self, molecules: FeaturizedMolecules) -> np.ndarray:
        """One batch: every row must be valid. Returns float64 [K members, M, T] in target units."""
        graph = molecules.batch_graph().to(self.device)
        raw = molecules.features if molecules.features.shape[1] else None
        out = []
        for spec, model in zip(self.specs, self.models):
            features = scale_features(spec, raw)
            prediction = model(graph, None if features is None else features.to(self.device)).prediction
            values = prediction.double().cpu().numpy()
            if spec.data_scaler is not None and self.dataset_type == "regression":
                values = spec.data_scaler.inverse_transform(values)
            out.append(values)
        return np.stack(out)

    def predict(self, molecules: FeaturizedMolecules, batch_size: int) -> EnsemblePrediction:
        """Predict a block whose first row starts a batch (see the module docstring for the batch rule)."""
        n, t = len(molecules), len(self.task_names)
        mean, std = np.full((n, t), np.nan), np.full((n, t), np.nan)
        for rows, members in map_valid_batches(molecules, batch_size, self.member_predictions):
            total = np.zeros_like(members[0])
            for values in members:  # upstream's order of summation
                total += values
            mean[rows] = total / len(members)
            std[rows] = members.std(axis=0)
        return EnsemblePrediction(mean, std)


def map_valid_batches(molecules: FeaturizedMolecules, batch_size: int, fn) -> list[tuple[np.ndarray, object]]:
    """``fn(valid rows of one batch)`` for every batch of consecutive rows -> [(row indices, result)]."""
    results = []
    valid = molecules.valid
    for start in batch_starts(len(molecules), batch_size):
        rows = start + np.flatnonzero(valid[start : start + batch_size])
        if len(rows):
            results.append((rows, fn(molecules.select(rows))))
    return results
