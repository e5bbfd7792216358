"""SMILES -> graphs + molecule-level features + validity, one row per input SMILES.

This is the library's featurisation entry point. It is batch-oriented and stateless, so a Ray Data
``map_batches`` can call it on each block, and its result converts to and from flat numpy arrays
(``to_arrays`` / ``from_arrays``: concatenated per-atom / per-bond arrays plus per-row counts), which store
as Arrow columns without pickling.

Row alignment: every input row has a result row. Invalid rows (empty, unparsable, no heavy atoms, more heavy atoms
than the limit, or a graph upstream cannot featurise) have a reason, zero atoms and bonds, and a NaN feature row.
Valid rows have NaN features replaced by 0, as upstream's MoleculeDatapoint does. A :class:`MoleculePrep` says the
limit and how molecules are standardised (kermt.chem.standardize); ``model_smiles`` holds the SMILES the model
sees where standardisation changed the molecule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kermt.chem.molgraph import FlatGraphs, build_graphs
from kermt.chem.standardize import MoleculePrep, standardize
from kermt.chem.validation import InvalidSmiles, parse_many
from kermt.data.batch import BatchMolGraph
from kermt.data.collate import collate_graphs
from kermt.data.operators import OperatorSpec

UNFEATURIZABLE = "unfeaturizable"


@dataclass(frozen=True)
class FeaturizedMolecules:
    """Featurised rows. ``reasons[i]`` is None for a valid row, else why it is invalid.

    graphs    FlatGraphs with one entry per row (invalid rows: 0 atoms, 0 bonds), the compact store
    features  float64 [n_rows, width] for ``features_generator`` (width 0 when none); NaN rows = invalid.
              float64 on purpose: feature scalers are fitted and applied in float64 as upstream does (rdkit_2d
              values are not exact in float32); MoleculeSet keeps the scaled features as float32.
    model_smiles  the SMILES of the molecule the model sees, "" where it is the input's (no standardisation, or
              none needed); () means "" for every row
    """

    smiles: tuple[str, ...]
    reasons: tuple[str | None, ...]
    graphs: FlatGraphs
    features: np.ndarray
    features_generator: tuple[str, ...] = ()
    model_smiles: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.model_smiles and self.smiles:
            object.__setattr__(self, "model_smiles", ("",) * len(self.smiles))

    def __len__(self) -> int:
        return len(self.smiles)

    @property
    def valid(self) -> np.ndarray:
        """bool [n_rows]."""
        return np.array([r is None for r in self.reasons], dtype=bool)

    @property
    def invalid(self) -> list[InvalidSmiles]:
        return [InvalidSmiles(i, s, r) for i, (s, r) in enumerate(zip(self.smiles, self.reasons)) if r is not None]

    def select(self, rows: Sequence[int] | np.ndarray) -> "FeaturizedMolecules":
        """The given rows, in that order (e.g. ``fm.select(np.flatnonzero(fm.valid))``)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == len(self) and np.array_equal(rows, np.arange(len(self))):
            return self  # every row in order: frozen, so shared (a copy at 1M molecules is ~0.5 GB of driver memory)
        return FeaturizedMolecules(
            smiles=tuple(self.smiles[i] for i in rows),
            reasons=tuple(self.reasons[i] for i in rows),
            graphs=self.graphs.select(rows),
            features=self.features[rows],
            features_generator=self.features_generator,
            model_smiles=tuple(self.model_smiles[i] for i in rows),
        )

    def batch_graph(self, operators: OperatorSpec | None = None, neighbour_width: int = 1) -> BatchMolGraph:
        """Collate all rows into one BatchMolGraph, with the neighbour-sum operators ``operators`` names (the
        model's ``aggregation_spec``) when given and neighbour tables at least ``neighbour_width`` wide. Every row
        must be valid (select valid rows first)."""
        if not self.valid.all():
            raise ValueError(f"cannot batch invalid rows: {', '.join(map(str, self.invalid[:3]))}")
        return collate_graphs(self.graphs, operators, neighbour_width)

    @classmethod
    def concat(cls, parts: Sequence["FeaturizedMolecules"]) -> "FeaturizedMolecules":
        """The rows of ``parts``, one after the other (they must share a features generator)."""
        if len(parts) == 1:
            return parts[0]
        generators = {part.features_generator for part in parts}
        if len(generators) != 1:
            raise ValueError(f"cannot concatenate molecules featurised with different generators: {generators}")
        arrays = [part.to_arrays() for part in parts]
        merged = {name: np.concatenate([a[name] for a in arrays]) for name in arrays[0] if name != "features_generator"}
        return cls.from_arrays({**merged, "features_generator": arrays[0]["features_generator"]})

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Flat numpy arrays (no object dtype): per-row columns plus the concatenated graph arrays."""
        return {
            "smiles": np.array(self.smiles, dtype=str),
            "reason": np.array([r or "" for r in self.reasons], dtype=str),
            "features": self.features,
            "features_generator": np.array(self.features_generator, dtype=str),
            "model_smiles": np.array(self.model_smiles, dtype=str),
            **self.graphs.to_arrays(),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "FeaturizedMolecules":
        return cls(
            smiles=tuple(str(s) for s in arrays["smiles"]),
            reasons=tuple(str(r) or None for r in arrays["reason"]),
            graphs=FlatGraphs.from_arrays(arrays),
            features=np.asarray(arrays["features"]),
            features_generator=tuple(str(s) for s in arrays["features_generator"]),
            model_smiles=tuple(str(s) for s in arrays.get("model_smiles", ())),  # arrays stored before it: ()
        )


def featurize_smiles(
    smiles: Sequence[str],
    features_generator: Sequence[str] = (),
    bond_drop_rate: float = 0.0,
    rng: np.random.Generator | None = None,
    prep: MoleculePrep = MoleculePrep(),
) -> FeaturizedMolecules:
    """Featurise every row of ``smiles``; never raises for bad SMILES.

    ``features_generator``: upstream generator names (rdkit_2d, rdkit_2d_normalized, morgan, morgan_count,
    fgtasklabel), concatenated in the given order. ``bond_drop_rate`` / ``rng``: see
    ``kermt.chem.molgraph.build_graphs``.
    ``prep``: the heavy-atom limit and the model's standardisation (default: the limit, no standardisation).
    """
    mols, invalid = parse_many(smiles, prep.max_heavy_atoms)
    reasons: list[str | None] = [None] * len(mols)
    for bad in invalid:
        reasons[bad.row] = bad.reason
    model_smiles = [""] * len(mols)
    for row, mol in enumerate(mols):
        if mol is not None:
            mols[row], model_smiles[row] = standardize(mol, prep.standardize)
    # features before graphs, so a row with an infinite feature is invalid like any other (no atoms, NaN features)
    generators = tuple(features_generator)
    features = _molecule_features(mols, generators)
    for row, reason in _infinite_feature_reasons(features, generators).items():
        reasons[row], mols[row] = f"{UNFEATURIZABLE}: {reason}", None
    graphs, errors = build_graphs(mols, bond_drop_rate, rng)
    for row, error in enumerate(errors):
        if error is not None:  # e.g. a formal charge upstream's layout cannot encode
            reasons[row], mols[row] = f"{UNFEATURIZABLE}: {error}", None
    valid_rows = np.array([m is not None for m in mols], dtype=bool)
    features[~valid_rows] = np.nan
    features[valid_rows] = np.nan_to_num(features[valid_rows], nan=0.0, posinf=np.inf, neginf=-np.inf)
    return FeaturizedMolecules(
        smiles=tuple(str(s) for s in smiles),
        reasons=tuple(reasons),
        graphs=graphs,
        features=features,
        features_generator=generators,
        model_smiles=tuple(model_smiles),
    )


# kermt.chem.descriptors is imported where descriptors are computed, not with this module: descriptastorus (and
# SciPy under it) costs about half a CPU-second to import, and every Ray worker that trains, predicts or serves
# imports this module, most of them for models without descriptors.
def _molecule_features(mols: list, generators: tuple[str, ...]) -> np.ndarray:
    """float64 [n, total width] (kermt.chem.descriptors.molecule_features); [n, 0] without generators."""
    if not generators:
        return np.zeros((len(mols), 0))
    from kermt.chem.descriptors import molecule_features

    return molecule_features(mols, generators)


def _infinite_feature_reasons(features: np.ndarray, generators: tuple[str, ...]) -> dict[int, str]:
    if not generators:
        return {}
    from kermt.chem.descriptors import infinite_feature_reasons

    return infinite_feature_reasons(features, generators)


__all__ = ["FeaturizedMolecules", "UNFEATURIZABLE", "featurize_smiles"]
