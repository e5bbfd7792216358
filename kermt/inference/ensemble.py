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
from kermt.inference.batches import InferenceBatch, run_batches
from kermt.inference.features import scale_features
from kermt.inference.members import task_names


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
        # the batches are collated with the first member's operators (members of one run share them; another
        # member derives its own from the index arrays)
        self.operators = self.models[0].kermt.aggregation_spec(training=False)

    def _load(self, checkpoint: Checkpoint) -> nn.Module:
        model, _ = load_finetune_model(checkpoint)
        return model.to(self.device).eval()

    def _member_features(self, molecules: FeaturizedMolecules) -> tuple[torch.Tensor | None, ...]:
        """Each member's features for ``molecules``, scaled with its own scaler (on the host)."""
        raw = molecules.features if molecules.features.shape[1] else None
        return tuple(scale_features(spec, raw) for spec in self.specs)

    @torch.no_grad()
    def _launch(self, batch: InferenceBatch) -> torch.Tensor:
        """Every member's prediction of ``batch`` (on the device): float64 [K, M, T], model units."""
        return torch.stack([model(batch.graph, features).prediction.double()
                            for model, features in zip(self.models, batch.inputs)])

    def _read(self, launched: torch.Tensor) -> np.ndarray:
        """float64 [K, M, T] in target units, on the host (each member de-scaled with its own scaler)."""
        values = launched.cpu().numpy()
        if self.dataset_type != "regression":
            return values
        return np.stack([spec.data_scaler.inverse_transform(member) if spec.data_scaler is not None else member
                         for spec, member in zip(self.specs, values)])

    def member_predictions(self, molecules: FeaturizedMolecules) -> np.ndarray:
        """One batch: every row must be valid. Returns float64 [K members, M, T] in target units."""
        batch = InferenceBatch.of(np.arange(len(molecules)), molecules, self.operators, self._member_features)
        return self._read(self._launch(batch.to(self.device)))

    def predict(self, molecules: FeaturizedMolecules, batch_size: int) -> EnsemblePrediction:
        """Predict a block whose first row starts a batch (see the module docstring for the batch rule)."""
        n, t = len(molecules), len(self.task_names)
        mean, std = np.full((n, t), np.nan), np.full((n, t), np.nan)
        batches = run_batches(molecules, batch_size, self.operators, self._member_features, self.device,
                              self._launch, self._read)
        for rows, members in batches:
            total = np.zeros_like(members[0])
            for values in members:  # upstream's order of summation
                total += values
            mean[rows] = total / len(members)
            std[rows] = members.std(axis=0)
        return EnsemblePrediction(mean, std)
