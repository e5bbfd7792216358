"""SMILES validation: reasons and row numbers, no exceptions for bad input."""

from __future__ import annotations

import math

from kermt.chem.validation import (EMPTY, NO_HEAVY_ATOMS, UNPARSABLE, InvalidSmiles, parse_many, parse_smiles,
                                  reason_kind)


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


def test_a_smiles_that_parses_but_breaks_chemistry_says_what_rdkit_rejected():
    # Pentavalent carbon and an odd aromatic ring parse as SMILES but fail sanitisation: the reason names the atom.
    _, invalid = parse_many(["CC(C)(C)(C)C", "c1cccc1", "C1CC"])
    assert [bad.reason for bad in invalid] == [
        "unparsable: Explicit valence for atom # 1 C, 5, is greater than permitted",
        "unparsable: Can't kekulize mol. Unkekulized atoms: 0 1 2 3 4",
        UNPARSABLE,  # a syntax error (unclosed ring): RDKit gives no sanitisation message to pass on
    ]
    assert {reason_kind(bad.reason) for bad in invalid} == {UNPARSABLE}
