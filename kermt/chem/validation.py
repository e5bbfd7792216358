"""SMILES validation with a reason per row; never raises for bad input (docs/upstream-compatibility.md#invalid-smiles).

Upstream drops a row when its SMILES is '', does not parse, or has no heavy atoms. Here every row is kept and
classified, so callers can report invalid rows by row number and keep outputs aligned with the input.
RDKit's parse errors are silenced only while parsing (``rdBase.BlockLogs``), not process-wide. A SMILES that parses
but fails RDKit's sanitisation (valence, aromaticity) gets RDKit's own message in its reason, e.g.
"unparsable: Explicit valence for atom # 1 C, 5, is greater than permitted", so a chemist can fix the row.
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
        return None, _why_unparsable(smiles)
    if mol.GetNumHeavyAtoms() == 0:
        return None, NO_HEAVY_ATOMS
    return mol, None


def reason_kind(reason: str) -> str:
    """The category of a reason (``EMPTY``, ``UNPARSABLE`` or ``NO_HEAVY_ATOMS``), without RDKit's detail: what
    summaries count by."""
    return reason.partition(":")[0]


def _why_unparsable(smiles: str) -> str:
    """The reason a SMILES that ``MolFromSmiles`` rejected is unusable: plain ``UNPARSABLE`` for a syntax error,
    with RDKit's sanitisation message when the syntax is fine but the chemistry is not. Only called for rejected
    rows, so the second parse costs nothing on valid input."""
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles, sanitize=False)
        if mol is None:
            return UNPARSABLE
        try:
            Chem.SanitizeMol(mol)
        except Exception as error:  # RDKit raises its own MolSanitizeException subclasses; any message will do
            message = " ".join(str(error).split())
            return f"{UNPARSABLE}: {message}" if message else UNPARSABLE
    return UNPARSABLE


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


__all__ = ["EMPTY", "NO_HEAVY_ATOMS", "UNPARSABLE", "InvalidSmiles", "parse_many", "parse_smiles", "reason_kind"]
