"""A finetune model's predictions of a split (a :class:`~kermt.data.dataset.MoleculeSet`): what a finetune writes
to test_result.csv and calibrates on, computed under the rule `kermt predict` follows, so the file equals a
prediction of the saved model: each molecule at its reference width (:mod:`kermt.inference.widths`), molecules of
one width sharing batches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from kermt.data.dataset import MoleculeBatch, MoleculeSet
from kermt.data.prefetch import prefetch, read_behind
from kermt.inference.batches import row_batches
from kermt.inference.widths import WidthRule
from kermt.nn.precision import autocast
from kermt.train.step import predict_with_variance


@torch.no_grad()
def predict_split(model: nn.Module, data: MoleculeSet, batch_size: int, rule: WidthRule, precision: str = "fp32",
                  rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Eval-mode predictions [n, T] float64 in the model's (scaled) space of ``rows`` (default: every row, n of
    them) and, for a variance head, its variances (None for a plain model). With ``rule.upstream_batching``:
    batches of consecutive rows, as upstream."""
    rows = np.arange(len(data)) if rows is None else np.asarray(rows, dtype=np.int64)
    if rule.upstream_batching:
        return predict_with_variance(model, data, rows, batch_size, precision)
    core = getattr(model, "module", model)
    variance = core.config.head.variance
    tasks = data.targets.shape[1]
    out = np.full((len(rows), tasks * (2 if variance else 1)), np.nan)
    was_training = core.training
    core.eval()
    device = next(core.parameters()).device  # batches follow the model, wherever the caller put it
    launched = ((batch.rows, _launch(core, batch, variance, precision, device))
                for batch in prefetch(_batches(core, data, rows, batch_size, rule), device))
    for positions, values in read_behind(launched, lambda pair: (pair[0], pair[1].cpu().numpy())):
        out[positions] = values
    core.train(was_training)
    return (out[:, :tasks], out[:, tasks:]) if variance else (out, None)


def _batches(core: nn.Module, data: MoleculeSet, rows: np.ndarray, batch_size: int,
             rule: WidthRule) -> Iterator[MoleculeBatch]:
    """The batches of ``rows``; each batch's ``rows`` are positions in ``rows``."""
    operators = core.kermt.aggregation_spec(training=False)
    every_row = np.ones(len(rows), dtype=bool)  # a split holds valid molecules only
    widths = rule.widths(data.graphs)[rows]
    for positions, width in row_batches(every_row, batch_size, widths):
        yield replace(data.batch(rows[positions], operators=operators, neighbour_width=width), rows=positions)


def _launch(core: nn.Module, batch: MoleculeBatch, variance: bool, precision: str,
            device: torch.device) -> torch.Tensor:
    with autocast(precision, device):
        output = core(batch.graph, batch.features)
    if variance:
        return torch.cat([output.prediction.double(), output.variance.double()], dim=1)
    return output.prediction.double()


__all__ = ["predict_split"]
