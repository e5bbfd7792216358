"""SMILES validation: reasons and row numbers, no exceptions for bad input."""

from __future__ import annotations

import math

import logging
import time

from kermt.chem.validation import (EMPTY, NO_HEAVY_ATOMS, TOO_LARGE, UNPARSABLE, InvalidSmiles, parse_many,
                                   parse_smiles, reason_kind)

UNCLOSED_RING = "unparsable: unclosed ring for input: 'C1CC'"


def test_each_invalid_kind_is_reported_with_its_row():
    rows = ["CCO", "", "C1CC", "[H][H]", "   ", "c1ccccc1", "[2H][2H]", None, math.nan, "not a smiles"]
    mols, invalid = parse_many(rows)
    assert [m is not None for m in mols] == [True, False, False, False, False, True, False, False, False, False]
    assert [(bad.row, bad.reason) for bad in invalid] == [
        (1, EMPTY), (2, UNCLOSED_RING), (3, NO_HEAVY_ATOMS), (4, EMPTY), (6, NO_HEAVY_ATOMS), (7, EMPTY),
        (8, EMPTY), (9, "unparsable: syntax error while parsing: not; check for mistakes around position 3"),
    ]
    assert str(invalid[1]) == f"row 2: {UNCLOSED_RING}: 'C1CC'"


def test_single_heavy_atom_and_ions_are_valid():
    for smiles in ("C", "[Na+].[Cl-]", "[Fe+3]"):
        mol, reason = parse_smiles(smiles)
        assert reason is None and mol.GetNumHeavyAtoms() >= 1
    assert InvalidSmiles(0, "x", UNPARSABLE).row == 0


def test_a_smiles_that_parses_but_breaks_chemistry_says_what_rdkit_rejected():
    # Pentavalent carbon and an odd aromatic ring parse as SMILES but fail sanitisation: the reason names the atom.
    _, invalid = parse_many(["CC(C)(C)(C)C", "c1cccc1", "C1CC", "CC(C"])
    assert [bad.reason for bad in invalid] == [
        "unparsable: Explicit valence for atom # 1 C, 5, is greater than permitted",
        "unparsable: Can't kekulize mol. Unkekulized atoms: 0 1 2 3 4",
        UNCLOSED_RING,  # a syntax error: RDKit's parser message, captured from its log
        "unparsable: extra open parentheses while parsing: CC(C; check for mistakes around position 3",
    ]
    assert {reason_kind(bad.reason) for bad in invalid} == {UNPARSABLE}


def test_rdkit_messages_are_captured_not_printed_and_other_records_pass(caplog):
    # the capture takes only this thread's records while it re-parses; RDKit's log keeps working otherwise
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    keep = Keep()
    logging.getLogger("rdkit").addHandler(keep)
    try:
        assert parse_smiles("C1CC")[1] == UNCLOSED_RING
        assert seen == []  # captured, not passed on
        logging.getLogger("rdkit").warning("a record of someone else's")
        assert seen == ["a record of someone else's"]
    finally:
        logging.getLogger("rdkit").removeHandler(keep)


def test_a_molecule_over_the_heavy_atom_limit_is_refused_from_its_smiles_in_milliseconds():
    huge = "C" * 5000  # RDKit takes seconds to sanitise this chain
    started = time.perf_counter()
    mol, reason = parse_smiles(huge, max_heavy_atoms=200)
    assert time.perf_counter() - started < 0.5
    assert mol is None and reason == "too large: 5000 heavy atoms, more than --max_heavy_atoms 200"
    assert reason_kind(reason) == TOO_LARGE
    # at the limit it is valid; a long SMILES of few heavy atoms ([2H] labels) too; no limit: no check
    assert parse_smiles("C" * 200, max_heavy_atoms=200)[1] is None
    assert parse_smiles("[2H]C([2H])([2H])" + "C" * 10, max_heavy_atoms=12)[1] is None
    assert parse_smiles("C" * 201, max_heavy_atoms=None)[1] is None


def test_a_rejected_rows_reason_survives_other_threads_parsing_valid_molecules():
    """Silencing RDKit is per thread: a service featurising valid molecules in one thread must not blank the reason
    another thread is reading for a rejected row (rdBase.BlockLogs silenced the whole process: a bare
    "unparsable" in kermt serve's Featurizer)."""
    import threading

    from kermt.chem.validation import parse_smiles

    stop, reasons = threading.Event(), []

    def valid_forever():
        while not stop.is_set():
            parse_smiles("c1ccccc1O")

    busy = [threading.Thread(target=valid_forever) for _ in range(2)]
    for thread in busy:
        thread.start()
    try:
        reasons = [parse_smiles("CC(C)(C)(C)(C)C")[1] for _ in range(200)]
    finally:
        stop.set()
        for thread in busy:
            thread.join()
    assert set(reasons) == {"unparsable: Explicit valence for atom # 1 C, 6, is greater than permitted"}
