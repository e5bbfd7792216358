"""Corpus preparation's vocabularies (kermt.data.corpus_prep) against upstream's scripts on the same input file.

tests/data/kermt_upstream_pretrain/vocab_input.csv: 300 sample SMILES, every third written non-canonically (kekulé,
another root atom), and one RDKit cannot parse. Upstream's documented flow, ``clean_smiles.py`` then
``build_vocab.py``, wrote the ``cleaned_*`` files; ``build_vocab.py`` on the raw file wrote the ``all_*`` files (README
there). Canonicalising changes the SMILES tokens and, through the bond direction of double-bond stereo (``/``,
``\\``: how the SMILES is written), some bond contexts.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from kermt.chem.vocab_smiles import SmilesVocab
from kermt.data.corpus_prep import VocabSettings, clean_smiles, count_vocab_tokens, vocabs_from_counts
from tests.conftest import FIXTURE_DIR

ORACLE_DIR = FIXTURE_DIR.parent / "kermt_upstream_pretrain"
UNPARSABLE = "C1CC(=O"


@pytest.fixture(scope="module")
def raw_smiles() -> list[str]:
    lines = (ORACLE_DIR / "vocab_input.csv").read_text().splitlines()
    assert lines[0] == "smiles" and UNPARSABLE in lines
    return lines[1:]


def corpus_vocabs(raw: list[str], canonicalize: bool):
    stored, reasons = clean_smiles(raw, canonicalize)
    assert [smi for smi, reason in zip(raw, reasons) if reason is not None] == [UNPARSABLE]
    return vocabs_from_counts(count_vocab_tokens([s for s in stored if s]), VocabSettings())


def upstream_json(name: str) -> dict:
    return json.loads((ORACLE_DIR / f"{name}.json").read_text())


def test_canonicalised_corpus_vocabs_equal_upstreams_clean_then_build(raw_smiles) -> None:
    atom, bond, smiles = corpus_vocabs(raw_smiles, canonicalize=True)
    assert atom.to_dict() == upstream_json("cleaned_atom_vocab")
    assert bond.to_dict() == upstream_json("cleaned_bond_vocab")
    upstream = SmilesVocab.load(ORACLE_DIR / "cleaned_smiles_vocab.pkl")
    assert (smiles.itos, dict(smiles.freqs)) == (upstream.itos, dict(upstream.freqs))


def test_raw_corpus_vocabs_equal_upstreams_build_but_for_the_unparsable_rows_tokens(raw_smiles) -> None:
    atom, bond, smiles = corpus_vocabs(raw_smiles, canonicalize=False)
    assert atom.to_dict() == upstream_json("all_atom_vocab")
    assert bond.to_dict() == upstream_json("all_bond_vocab")
    # upstream's SMILES counting reads every line, parsable or not; the corpus counts kept molecules only
    upstream = SmilesVocab.load(ORACLE_DIR / "all_smiles_vocab.pkl")
    expected = Counter(upstream.freqs)
    expected.subtract(smiles.tokenize(UNPARSABLE))
    assert dict(smiles.freqs) == {token: n for token, n in expected.items() if n}


def test_canonicalising_changes_upstreams_vocabs() -> None:
    """Both comparisons above are informative: the two upstream runs differ in SMILES tokens and bond contexts."""
    raw, cleaned = upstream_json("all_bond_vocab"), upstream_json("cleaned_bond_vocab")
    assert raw["freqs"] != cleaned["freqs"]
    assert SmilesVocab.load(ORACLE_DIR / "all_smiles_vocab.pkl").freqs != \
        SmilesVocab.load(ORACLE_DIR / "cleaned_smiles_vocab.pkl").freqs
