"""``"attributions": true``: each molecule's per-atom attributions, the columns `kermt predict --attributions` writes.

Per task, ``<task>_atoms`` (a list with one value per heavy atom of the SMILES the model saw: ``model_smiles`` where
standardisation changed it, else the input), ``<task>_baseline`` and, for a model with molecule descriptors,
``<task>_descriptors`` (:mod:`kermt.inference.attributions`, :mod:`kermt.inference.columns`). The atom values are
predict's JSON list read back, so they are its numbers to the digit (4 significant digits).

The molecules of every request of a replica batch that asks share the attributor's forwards: each molecule is
collated at its reference width, so its values depend on the molecule and the model only, never on who else sent
what. A molecule without attributions (over the attributions' budget of heavy atoms, or a model that cannot give
them) keeps its prediction, gets null attribution values and a one-line ``attributions_note``; never an error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from kermt.data.featurize import FeaturizedMolecules
from kermt.inference import Ensemble
from kermt.inference.attributions import OVER_BUDGET, Attributions, Attributor, unavailable_reason
from kermt.inference.columns import ATOMS_SUFFIX
from ray_app.serve.schemas import PredictJob

ATTRIBUTIONS_NOTE = "attributions_note"  # why an entry's attribution values are null (null when they are there)


class ServedAttributions:
    """A replica's attributor (serve has no upstream batching, so today every model can give them; the reason
    a model could not is still each entry's note rather than an error)."""

    def __init__(self, ensemble: Ensemble) -> None:
        self.unavailable = unavailable_reason(ensemble.specs, ensemble.rule.upstream_batching)
        self.attributor = Attributor(ensemble) if self.unavailable is None else None

    def __call__(self, jobs: Sequence[PredictJob],
                 blocks: Sequence[FeaturizedMolecules]) -> list[Attributions | None]:
        """Each job's attributions (None: it did not ask, or the model cannot give them), computed for the jobs
        that ask in shared forwards."""
        asking = [i for i, job in enumerate(jobs) if job.attributions]
        out: list[Attributions | None] = [None] * len(jobs)
        if self.attributor is None or not asking:
            return out
        merged = self.attributor.attribute(FeaturizedMolecules.concat([blocks[i] for i in asking]))
        start = 0
        for i in asking:
            out[i] = _rows(merged, start, start + len(blocks[i]))
            start += len(blocks[i])
        return out

    def notes(self, valid: np.ndarray, explained: Attributions | None) -> list[str | None]:
        """Each molecule's ``attributions_note``: why its values are null (None: they are there, or it is
        invalid, which ``error`` explains)."""
        if explained is None:
            return [f"no attributions: {self.unavailable}" if ok else None for ok in valid]
        return [f"no attributions: {OVER_BUDGET}; the prediction is kept" if over else None
                for over in explained.over_budget]


def atom_lists(tasks: Sequence[str], entry: dict) -> None:
    """``entry``'s ``<task>_atoms`` (predict's JSON text) read back into lists, in place."""
    for name in (task + ATOMS_SUFFIX for task in tasks):
        if isinstance(entry.get(name), str):
            entry[name] = json.loads(entry[name])


def _rows(attributions: Attributions, start: int, stop: int) -> Attributions:
    return Attributions(attributions.atoms[start:stop], attributions.descriptors[start:stop],
                        attributions.baseline[start:stop], attributions.explained[start:stop],
                        attributions.over_budget[start:stop])


__all__ = ["ATTRIBUTIONS_NOTE", "ServedAttributions", "atom_lists"]
