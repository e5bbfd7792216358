"""Ensembles of finetuned members predicting blocks of molecules in batches of consecutive rows (see the package
docstring for why batches are cut that way).

The std is the total one of :func:`kermt.uncertainty.estimators.total_std`: the members' spread, plus the mean of
their predicted variances when they have variance heads (``--loss mve``); with ``dropout_samples`` N every member
contributes N MC-dropout passes (:mod:`kermt.inference.mc_dropout`) instead of one eval-mode forward."""

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
from kermt.inference.widths import width_rule
from kermt.inference.columns import ensemble_mean
from kermt.inference.features import scale_features
from kermt.inference.mc_dropout import check_dropout, molecule_keys, sampled_outputs
from kermt.inference.members import task_names
from kermt.uncertainty.estimators import total_std


@dataclass
class EnsemblePrediction:
    """mean, std: float64 [N, T]; NaN rows for invalid molecules. ``std``: the population std over members (and
    passes), with variance heads the total std (module docstring)."""

    mean: np.ndarray
    std: np.ndarray


class Ensemble:
    """Finetuned members that predict together (mean over members, summed in member order as upstream)."""

    def __init__(self, members: Sequence[Checkpoint], device: torch.device | str = "cpu", dropout_samples: int = 0,
                 dropout_seed: int = 0, *, upstream_batching: bool = False, reference_width: int | None = None) -> None:
        """``dropout_samples``: MC-dropout passes per member (0: one eval-mode forward), masks seeded by
        ``dropout_seed`` and each molecule's SMILES. ``upstream_batching`` / ``reference_width``: which neighbour
        width each molecule is computed at (:func:`kermt.inference.widths.width_rule`)."""
        if not members:
            raise ValueError("an ensemble needs at least one checkpoint")
        self.specs = [m.spec for m in members]
        names = {task_names(s) for s in self.specs}
        kinds = {s.head.dataset_type for s in self.specs}
        if len(names) > 1 or len(kinds) > 1:
            raise UserError(f"ensemble members disagree on tasks {sorted(names)} or dataset type {sorted(kinds)}: "
                            "their models were trained on different data; predict with each group separately")
        self.task_names = names.pop()
        self.rule = width_rule(self.specs, upstream_batching, reference_width)
        self.dataset_type = kinds.pop()
        self.device = torch.device(device)
        check_dropout(self.specs, dropout_samples)
        self.dropout_samples, self.dropout_seed = dropout_samples, dropout_seed
        self.variance_heads = any(spec.head.variance for spec in self.specs)
        # the spec that de-scales each sample of _launch: a member's passes follow each other
        self._sample_specs = [spec for spec in self.specs for _ in range(max(dropout_samples, 1))]
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
    def _launch(self, batch: InferenceBatch, keys: np.ndarray | None = None) -> torch.Tensor:
        """Every sample's prediction of ``batch`` (on the device): float64 [S, M, T] (S = members x passes), model
        units; [S, M, 2T] with variance heads (the means, then the variances: 0 for a plain member). ``keys``: the
        block's molecule keys (MC dropout)."""
        samples = []
        for model, features in zip(self.models, batch.inputs):
            if self.dropout_samples:
                ids = torch.from_numpy(keys[batch.rows]).to(self.device)
                outputs = sampled_outputs(model, batch.graph, features, ids, self.dropout_samples, self.dropout_seed)
            else:
                outputs = [model(batch.graph, features)]
            samples += [self._values(output) for output in outputs]
        return torch.stack(samples)

    def _values(self, output) -> torch.Tensor:
        if not self.variance_heads:
            return output.prediction.double()
        variance = output.variance if output.variance is not None else torch.zeros_like(output.prediction)
        return torch.cat([output.prediction.double(), variance.double()], dim=1)

    def _read(self, launched: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
        """(means, variances or None): float64 [S, M, T] in target units, on the host (each sample de-scaled with
        its member's scaler)."""
        values = launched.cpu().numpy()
        tasks = len(self.task_names)
        means, variances = values[..., :tasks], values[..., tasks:] if self.variance_heads else None
        if self.dataset_type != "regression":
            return means, variances
        scalers = [spec.data_scaler for spec in self._sample_specs]
        means = np.stack([s.inverse_transform(m) if s is not None else m for s, m in zip(scalers, means)])
        if variances is not None:
            variances = np.stack([s.inverse_transform_variance(v) if s is not None else v
                                  for s, v in zip(scalers, variances)])
        return means, variances

    def member_predictions(self, molecules: FeaturizedMolecules) -> np.ndarray:
        """Every row must be valid; with ``upstream_batching`` they are one batch. Returns float64 [S samples, M, T]
        in target units (S = members, times the passes with MC dropout)."""
        out = np.full((len(self._sample_specs), len(molecules), len(self.task_names)), np.nan)
        for rows, (members, _) in self._batches(molecules, max(len(molecules), 1)):
            out[:, rows] = members
        return out

    def predict(self, molecules: FeaturizedMolecules, batch_size: int, *,
                max_atoms: int | None = None) -> EnsemblePrediction:
        """Predict a block of molecules in batches of ``batch_size`` (``max_atoms``: also cut a batch before it
        exceeds that many atoms). Each molecule's numbers depend on it and the model only: it is computed at its
        reference width (:mod:`kermt.inference.widths`); with ``upstream_batching``, at the width of its batch of
        consecutive rows, a block's first row starting a batch (the batch rule, module docstring)."""
        n, t = len(molecules), len(self.task_names)
        mean, std = np.full((n, t), np.nan), np.full((n, t), np.nan)
        for rows, (members, variances) in self._batches(molecules, batch_size, max_atoms):
            mean[rows] = ensemble_mean(members)  # upstream's order of summation
            std[rows] = total_std(members, variances)
        return EnsemblePrediction(mean, std)

    def _batches(self, molecules: FeaturizedMolecules, batch_size: int, max_atoms: int | None = None) -> list:
        keys = molecule_keys(molecules.smiles) if self.dropout_samples else None
        return run_batches(molecules, batch_size, self.operators, self._member_features, self.device,
                           lambda batch: self._launch(batch, keys), self._read,
                           widths=self.rule.widths(molecules.graphs, molecules.valid), max_atoms=max_atoms)
