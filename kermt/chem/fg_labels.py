"""Functional-group labels of the vocab pretraining task (upstream's ``fgtasklabel``).

A molecule's 85 labels say which of RDKit's ``fr_*`` fragment patterns occur in it: the fragment count, non-zero
-> 1. Upstream computes them with descriptastorus' ``RDKit2D`` restricted to the ``fr_*`` properties, on the
molecule parsed from the data file's SMILES; a descriptor that raises counts as 0 there (descriptastorus stores a
default of 0.0), so it does here.

Only the 85 fragment functions run (descriptastorus' own function objects, so the SMARTS and counting are the
ones upstream calls), not the 200 RDKit-2D descriptors ``kermt.chem.descriptors`` computes for ``fgtasklabel``:
the labels are identical and cost a fraction of the time, which matters for a corpus of millions of molecules.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from descriptastorus.descriptors import rdDescriptors
from rdkit import Chem

from kermt.chem.descriptors import FG_COLUMNS
from kermt.chem.validation import quiet_rdkit  # thread by thread, not process-wide

FG_NAMES: tuple[str, ...] = FG_COLUMNS  # RDKit2D's fr_* columns, in upstream's label order
FG_SIZE = len(FG_NAMES)
_FG_FUNCS = tuple(rdDescriptors.FUNCS_V1[name] for name in FG_NAMES)


def _pattern(func) -> Chem.Mol | None:
    """The SMARTS pattern a fragment function counts the matches of (its ``pattern`` default: RDKit's ``Fragments``
    functions and descriptastorus' unbranched-alkane one all count one pattern), else None (then it is called)."""
    return next((d for d in func.__defaults__ or () if isinstance(d, Chem.Mol)), None)


# A label is count > 0, and a pattern has a match exactly when it has one or more: HasSubstructMatch stops at the
# first match where counting enumerates every one (a quarter of a corpus build's CPU time went there).
_FG_TESTS = tuple(func if (patt := _pattern(func)) is None else (lambda mol, patt=patt: mol.HasSubstructMatch(patt))
                  for func in _FG_FUNCS)


def _present(func, mol: Chem.Mol) -> int:
    try:
        count = func(mol)
    except Exception:  # descriptastorus records a failing descriptor as 0.0
        return 0
    return int(bool(count))


def fg_labels(mols: Sequence[Chem.Mol]) -> np.ndarray:
    """uint8 [n, 85]: 1 where fragment pattern j occurs in molecule i (order :data:`FG_NAMES`)."""
    out = np.zeros((len(mols), FG_SIZE), dtype=np.uint8)
    with quiet_rdkit():
        for row, mol in enumerate(mols):
            out[row] = [_present(func, mol) for func in _FG_TESTS]
    return out


__all__ = ["FG_NAMES", "FG_SIZE", "fg_labels"]
