"""Several blocks predicted in shared forwards, each block getting the numbers it would get alone.

A molecule's numbers depend on the molecule and the model only (:mod:`kermt.inference.widths`): each is computed at
its reference width, and molecules of any blocks with the same width share forwards collated at exactly that width,
cut by molecule and atom counts as suits the device. Drug-like molecules have largest degrees of 3 or 4, so a few
groups hold nearly everything; with ``zero`` padding every molecule shares one group.

Who needs it: a service whose clients each send a few molecules (``ray_app.serve``): each client's numbers are
`kermt predict`'s for a file of its own SMILES, whoever else sent what at the same time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kermt.data.featurize import FeaturizedMolecules
from kermt.inference.ensemble import Ensemble, EnsemblePrediction


def predict_blocks(ensemble: Ensemble, blocks: Sequence[FeaturizedMolecules], batch_size: int,
                   max_atoms: int | None = None) -> list[EnsemblePrediction]:
    """``ensemble.predict(block, batch_size)`` for every block, computed in shared forwards (module docstring) of
    at most ``max_atoms`` atoms (a molecule with more is a forward of its own), or without ``max_atoms`` of
    ``batch_size`` molecules. The ensemble must follow the batch-independent rule (no ``upstream_batching``)."""
    if ensemble.rule.upstream_batching:
        raise ValueError("predict_blocks shares forwards between blocks: it needs an ensemble without "
                         "upstream_batching, whose numbers depend on each block's batches")
    if not blocks:
        return []
    merged = FeaturizedMolecules.concat(blocks)
    forward_rows = batch_size if max_atoms is None else max(len(merged), 1)  # with an atom budget, it alone cuts
    prediction = ensemble.predict(merged, forward_rows, max_atoms=max_atoms)
    bounds = np.cumsum([0] + [len(block) for block in blocks])
    return [EnsemblePrediction(prediction.mean[a:b], prediction.std[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


__all__ = ["predict_blocks"]
