"""SMILES validation: reasons and row numbers, no exceptions for bad input."""

from __future__ import annotations

import math

from kermt.chem.validation import EMPTY, NO_HEAVY_ATOMS, UNPARSABLE, InvalidSmiles, parse_many, parse_smiles


def test_each_invalid_kind_is_reported_with_its_row():
    rows = ["CCO", "", "C1CC", "[H][H]", "   ", "c1ccccc1", "[2H][2H]", None, math.nan, "not a smiles"]
    mols, invalid = parse_many(rows)
    assert [m is not None for m in mols] == [True, False, False, False, False, True, False, False, False, False]
    assert [(bad.row, bad.reason) for bad in invalid] == [
        (1, EMPTY), (2, UNPARSABLE), (3, NO_HEAVY_ATOMS), (4, EMPTY), (6, NO_HEAVY_ATOMS), (7, EMPTY),
        (8, EMPTY), (9, UNPARSABLE),
    ]
    assert str(invalid[1]) == "row 2: unparsable: 'C1CC'"


def test_single_heavy_atom_and_ions_are_valid():
    for smiles in ("C", "[Na+].[Cl-]", "[Fe+3]"):
        mol, reason = parse_smiles(smiles)
        assert reason is None and mol.GetNumHeavyAtoms() >= 1
    assert InvalidSmiles(0, "x", UNPARSABLE).row == 0
