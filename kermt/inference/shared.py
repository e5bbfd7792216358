"""Several blocks predicted as if each were predicted alone, with the molecules of all of them sharing forwards.

Under the batch rule (:mod:`kermt.inference`) a block is cut into batches of ``batch_size`` consecutive rows. With
upstream's padding a molecule's numbers depend on its batch only through the batch's neighbour width, its largest
atom degree (docs/numerics.md#padding-modes): the padding row's message, and how many copies of it each sum adds,
are functions of the weights and that width alone. So every molecule is given the width of the batch the rule puts
it in within its own block; molecules of any blocks with the same width then share forwards collated at exactly that
width, cut by molecule and atom counts as suits the device, and each gets its own block's numbers (to float rounding
of the dense layers, which sum the same terms at a different batch size). Drug-like molecules have largest degrees
of 3 or 4, so a few groups hold nearly everything. With ``zero`` padding no number depends on the batch: every
molecule shares one group.

Who needs it: a service whose clients each send a few molecules (``ray_app.serve``): each client's numbers are
`kermt predict`'s for a file of its own SMILES, whoever else sent what at the same time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kermt.data.featurize import FeaturizedMolecules
from kermt.inference.batches import batch_starts
from kermt.inference.ensemble import Ensemble, EnsemblePrediction


def batch_widths(molecules: FeaturizedMolecules, batch_size: int) -> np.ndarray:
    """int64 [N]: the neighbour width of each valid row's batch under the batch rule (at least 1), 0 for an invalid
    row. The width a batch's collate takes: its valid molecules' largest atom degree."""
    degrees, valid = molecules.graphs.max_in_degrees(), molecules.valid
    widths = np.zeros(len(molecules), dtype=np.int64)
    for start in batch_starts(len(molecules), batch_size):
        rows = start + np.flatnonzero(valid[start:start + batch_size])
        if len(rows):
            widths[rows] = max(1, int(degrees[rows].max()))
    return widths


def predict_blocks(ensemble: Ensemble, blocks: Sequence[FeaturizedMolecules], batch_size: int,
                   batch_independent: bool, max_atoms: int | None = None) -> list[EnsemblePrediction]:
    """``ensemble.predict(block, batch_size)`` for every block, computed in shared forwards (module docstring) of
    at most ``max_atoms`` atoms (a molecule with more is a forward of its own), or without ``max_atoms`` of
    ``batch_size`` molecules. ``batch_independent``: the model's numbers do not depend on the batch (``zero``
    padding), so every molecule shares one group."""
    if not blocks:
        return []
    merged = FeaturizedMolecules.concat(blocks)
    if batch_independent:
        widths = merged.valid.astype(np.int64)  # width 1: each batch's own width, which changes nothing
    else:
        widths = np.concatenate([batch_widths(block, batch_size) for block in blocks])
    tasks = len(ensemble.task_names)
    mean, std = np.full((len(merged), tasks), np.nan), np.full((len(merged), tasks), np.nan)
    for width in np.unique(widths[widths > 0]).tolist():
        rows = np.flatnonzero(widths == width)
        forward_rows = batch_size if max_atoms is None else len(rows)  # with an atom budget, it alone cuts
        part = ensemble.predict(merged.select(rows), forward_rows, neighbour_width=width, max_atoms=max_atoms)
        mean[rows], std[rows] = part.mean, part.std
    bounds = np.cumsum([0] + [len(block) for block in blocks])
    return [EnsemblePrediction(mean[a:b], std[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


__all__ = ["batch_widths", "predict_blocks"]
