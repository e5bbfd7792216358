"""Validity, uniqueness and novelty of generated SMILES on inputs whose figures are counted by hand."""

from __future__ import annotations

import numpy as np

from kermt.pretrain.generation_metrics import (INPUTS_REFERENCE, GenerationTally, canonical_smiles, molecule_keys,
                                               reference_keys)
from kermt.pretrain.reconstruct import score


def _tally() -> GenerationTally:
    """Two blocks: 8 strings, 5 valid, 3 distinct molecules (ethanol 3x, benzene, ethylamine); inputs CCO, CCN."""
    tally = GenerationTally()
    tally.add(["CCO", "CCO", None, "c1ccccc1"], ["CCO"])
    tally.add(["CCO", "CCN", None, None], ["CCN"])
    return tally


def test_novelty_against_the_inputs():
    metrics = _tally().metrics()
    assert (metrics.generated, metrics.valid, metrics.unique, metrics.novel) == (8, 5, 3, 1)  # benzene is new
    assert (metrics.validity, metrics.uniqueness, metrics.novelty) == (5 / 8, 3 / 5, 1 / 3)
    assert metrics.reference == INPUTS_REFERENCE
    assert metrics.line() == ("validity 62.5 % (5 of 8 parse), uniqueness 60.0 % (3 distinct molecules), "
                              f"novelty 33.3 % (1 not in {INPUTS_REFERENCE})")


def test_novelty_against_a_training_set_in_other_spellings():
    training = reference_keys(["C1=CC=CC=C1", "OCC", "not a smiles"], canonical=False)  # benzene, ethanol
    assert len(training) == 2
    metrics = _tally().metrics(training, "the corpus")
    assert (metrics.unique, metrics.novel, metrics.novelty, metrics.reference) == (3, 1, 1 / 3, "the corpus")
    assert _tally().metrics(reference_keys(["CCC"], canonical=True), "propane").novel == 3


def test_a_collapsed_decoder_is_valid_but_not_unique():
    """The issue's case: 48 copies of one 511-character chain all parse, and are one molecule."""
    chain = score("CCO", "C" * 511)
    assert chain.parses and chain.canonical == "C" * 511
    tally = GenerationTally()
    tally.add([chain.canonical] * 48, ["CCO"])
    metrics = tally.metrics()
    assert (metrics.validity, metrics.unique, metrics.uniqueness, metrics.novelty) == (1.0, 1, 1 / 48, 1.0)


def test_keys_are_canonical_smiles_hashes():
    assert canonical_smiles("OCC") == canonical_smiles("C(O)C") == "CCO"
    assert canonical_smiles("C1CC") is None and canonical_smiles("") is None
    keys = molecule_keys(["CCO", "CCN", "CCO"])
    assert keys.dtype == np.uint64 and keys[0] == keys[2] != keys[1]
    assert score("CCO", "OCC").canonical == "CCO" and score("CCO", "C1CC").canonical is None
