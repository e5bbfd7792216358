"""Vocabularies built here against the files upstream's own scripts/build_vocab.py wrote from the same molecules.

tests/data/kermt_upstream_pretrain/ holds the input (vocab_input.csv: 300 sample-data SMILES and one RDKit cannot
parse) and, per build_vocab.py run, upstream's atom / bond JSON vocabs and pickled SMILES vocab (see the README
there): default settings ("all"), ``--vocab_min_freq 2 --smiles_vocab_min_freq 2`` ("minfreq2") and
``--vocab_max_size 40 --smiles_vocab_max_size 20`` ("max40").
"""

from __future__ import annotations

import json

import pytest

from kermt.chem.vocab_context import ContextVocab
from kermt.chem.vocab_smiles import SmilesVocab
from tests.conftest import FIXTURE_DIR

ORACLE_DIR = FIXTURE_DIR.parent / "kermt_upstream_pretrain"
# build_vocab.py run -> (max_size, min_freq) it was given, for atom/bond and for SMILES
RUNS = {
    "all": ((None, 1), (None, 1)),
    "minfreq2": ((None, 2), (None, 2)),
    "max40": ((40, 1), (20, 1)),
}


@pytest.fixture(scope="module")
def smiles() -> list[str]:
    lines = (ORACLE_DIR / "vocab_input.csv").read_text().splitlines()
    assert lines[0] == "smiles"
    return lines[1:]


@pytest.mark.parametrize("kind", ["atom", "bond"])
@pytest.mark.parametrize("run", RUNS)
def test_context_vocab_build_equals_upstreams(smiles, run, kind) -> None:
    (max_size, min_freq), _ = RUNS[run]
    path = ORACLE_DIR / f"{run}_{kind}_vocab.json"
    ours = ContextVocab.build(smiles, kind, max_size=max_size, min_freq=min_freq)
    upstream = json.loads(path.read_text())
    assert list(ours.itos) == upstream["itos"]
    assert dict(ours.freqs) == upstream["freqs"]
    assert ours.to_dict() == upstream  # the whole file: stoi, vocab_type and special indices too
    assert ContextVocab.load(path) == ours


@pytest.mark.parametrize("run", RUNS)
def test_smiles_vocab_build_equals_upstreams(smiles, run) -> None:
    _, (max_size, min_freq) = RUNS[run]
    upstream = SmilesVocab.load(ORACLE_DIR / f"{run}_smiles_vocab.pkl")
    ours = SmilesVocab.build(smiles, max_size=max_size, min_freq=min_freq)
    assert ours.itos == upstream.itos
    assert dict(ours.freqs) == dict(upstream.freqs)
    assert ours.pattern == upstream.pattern


def test_runs_cut_where_asked() -> None:
    """The oracle exercises both cuts: sizes differ between runs, so a cut ignored here would show."""
    sizes = {run: len(json.loads((ORACLE_DIR / f"{run}_atom_vocab.json").read_text())["itos"]) for run in RUNS}
    assert sizes["max40"] == 42 < sizes["minfreq2"] < sizes["all"]
