"""The reference atom and bond that attributions start from (:mod:`kermt.inference.attributions`).

An average drug-like atom: the mean of the 151 atom feature columns over every atom of the 2,000 molecules of
data/sample/admet_demo.csv (the first 2,000 SMILES of upstream KERMT's tests/data/train_val.csv), and the mean of
the 14 bond feature columns over their bonds; columns whose mean rounds to 0 at 4 decimals are left out.
:func:`mean_rows` recomputes them (tests/kermt/test_inference_attributions.py checks these values against it).

Why not the empty (all-zero) input: an encoder block projects the raw features without a bias and layer-normalises
them, so near zero every model jumps from its bias to its normalised input within a tiny stretch of the path, where
the gradient is huge and any sampling of the path misses most of the change; and bench/attributions.py measured a
lower agreement with Crippen's atom contributions from it (docs/attributions.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from kermt.chem.features import ATOM_FDIM, BOND_ONLY_FDIM

# column -> mean over the reference molecules' atoms (kermt.chem.features's atom layout)
REFERENCE_ATOM: Mapping[int, float] = {
    5: 0.7375, 6: 0.1285, 7: 0.0944, 8: 0.0151, 14: 0.0001, 15: 0.0146, 16: 0.0082, 34: 0.0015, 52: 0.0001,
    102: 0.0783, 103: 0.1039, 104: 0.5801, 105: 0.2377, 108: 0.9988, 109: 0.0008, 113: 0.0005, 114: 0.9893,
    115: 0.0054, 116: 0.0053, 119: 0.4688, 120: 0.3303, 121: 0.1407, 122: 0.0602, 125: 0.0051, 126: 0.7065,
    127: 0.2884, 131: 0.5368, 132: 0.1335, 133: 0.4848, 134: 0.3143, 135: 0.1407, 136: 0.0602, 141: 0.182,
    142: 0.0487, 143: 0.0024, 144: 0.02, 145: 0.0052, 146: 0.0034, 147: 0.1928, 148: 0.5332,
}
# column -> mean over their bonds (the 14 bond-only columns)
REFERENCE_BOND: Mapping[int, float] = {
    1: 0.4414, 2: 0.0523, 3: 0.0023, 4: 0.504, 5: 0.6618, 6: 0.6703, 7: 0.9981, 9: 0.0006, 10: 0.0014,
}


def _row(columns: Mapping[int, float], width: int) -> np.ndarray:
    row = np.zeros(width, dtype=np.float32)
    row[list(columns)] = list(columns.values())
    return row


def reference_rows() -> tuple[np.ndarray, np.ndarray]:
    """(atom row float32 [151], bond row float32 [14])."""
    return _row(REFERENCE_ATOM, ATOM_FDIM), _row(REFERENCE_BOND, BOND_ONLY_FDIM)


def mean_rows(smiles: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The mean atom row and bond row (float64) over every atom and bond of the valid ``smiles``."""
    from kermt.data.featurize import featurize_smiles

    molecules = featurize_smiles(list(smiles))
    graphs = molecules.select(np.flatnonzero(molecules.valid)).graphs
    return graphs.f_atoms.astype(np.float64).mean(axis=0), graphs.bond_feats.astype(np.float64).mean(axis=0)


__all__ = ["REFERENCE_ATOM", "REFERENCE_BOND", "mean_rows", "reference_rows"]
