"""SMILES validation with a reason per row; never raises for bad input (docs/upstream-compatibility.md#invalid-smiles).

Upstream drops a row when its SMILES is '', does not parse, or has no heavy atoms. Here every row is kept and
classified, so callers can report invalid rows by row number and keep outputs aligned with the input.
RDKit's parse errors are silenced only while parsing (``rdBase.BlockLogs``), not process-wide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rdkit import Chem, rdBase

EMPTY = "empty"
UNPARSABLE = "unparsable"
NO_HEAVY_ATOMS = "no heavy atoms"


@dataclass(frozen=True)
class InvalidSmiles:
    """One rejected input row: 0-based ``row`` in the input sequence, the text, and why."""

    row: int
    smiles: str
    reason: str

    def __str__(self) -> str:
        return f"row {self.row}: {self.reason}: {self.smiles!r}"


def parse_smiles(smiles: object) -> tuple[Chem.Mol | None, str | None]:
    """Parse one SMILES. Returns (mol, None) when usable, else (None, reason).

    Non-strings (None, NaN from a CSV reader) and whitespace-only text count as empty.
    """
    if not isinstance(smiles, str) or not smiles.strip():
        return None, EMPTY
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None, UNPARSABLE
    if mol.GetNumHeavyAtoms() == 0:
        return None, NO_HEAVY_ATOMS
    return mol, None


def parse_many(smiles: Sequence[object]) -> tuple[list[Chem.Mol | None], list[InvalidSmiles]]:
    """Parse every row. Returns (mols with None at invalid rows, the invalid rows in input order)."""
    mols: list[Chem.Mol | None] = []
    invalid: list[InvalidSmiles] = []
    for row, text in enumerate(smiles):
        mol, reason = parse_smiles(text)
        mols.append(mol)
        if reason is not None:
            invalid.append(InvalidSmiles(row, str(text), reason))
    return mols, invalid


__all__ = ["EMPTY", "NO_HEAVY_ATOMS", "UNPARSABLE", "InvalidSmiles", "parse_many", "parse_smiles"]
