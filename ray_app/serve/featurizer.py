"""Featurisation as its own deployment: RDKit's work, scaled apart from the model replicas.

Featurising a request (parsing, atom and bond tables, molecule features) holds the interpreter lock; a forward
mostly does not. In the model replica's process the two share one lock, and featurisation was two thirds of a
replica's work (py-spy, bench/serve.py). Featurizer replicas are CPU processes of their own: the Gateway sends a
request's SMILES here and hands the result (a reference, never fetched by the Gateway) to the model replica, so a
GPU replica only runs forwards, and featurisation scales with ``--num_featurizers`` on any node with CPUs.

One pool serves every model: the molecule features a model needs travel with the request. Off by default
(``--num_featurizers 0``): on two CPU cores the extra call per request cost more than it freed (docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from ray import serve

from kermt.chem.standardize import DEFAULT_MAX_HEAVY_ATOMS, MoleculePrep
from kermt.data.featurize import FeaturizedMolecules, featurize_smiles
from kermt.registry import Standardization


@serve.deployment
class Featurizer:
    """Featurises requests' SMILES, for every model of the app, under the app's ``--max_heavy_atoms``."""

    def __init__(self, max_heavy_atoms: int = DEFAULT_MAX_HEAVY_ATOMS) -> None:
        self.max_heavy_atoms = max_heavy_atoms

    def featurize(self, requests: Sequence[tuple[str, ...]], features_generator: tuple[str, ...],
                  standardize: Standardization = "none") -> list[FeaturizedMolecules]:
        """Each request's SMILES featurised (one call carries the group of requests the ingress coalesced), with
        the model's molecule features and standardisation."""
        # a plain method: Serve runs it in a thread pool, so the replica's event loop keeps taking calls and
        # health checks while RDKit works (which holds the interpreter lock: one call featurised at a time)
        prep = MoleculePrep(standardize, self.max_heavy_atoms)
        return [featurize_smiles(smiles, features_generator, prep=prep) for smiles in requests]


__all__ = ["Featurizer"]
