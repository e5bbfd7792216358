"""Contextual vocab, labels, label sampling and the SMILES vocab against upstream's fixtures."""

from __future__ import annotations

import math
import os
import pickle
import pickletools
import re
from pathlib import Path

import numpy as np
import pytest
from rdkit import Chem

from kermt.chem.vocab_context import ContextVocab, atom_context, bond_context, bonds_in_pair_order
from kermt.chem.vocab_labels import all_vocab_labels, sample_vocab_labels
from kermt.chem.vocab_smiles import END, PAD, START, UNK, SmilesVocab, encode_batch
from tests.conftest import FIXTURE_DIR


@pytest.fixture(scope="module")
def outputs() -> np.lib.npyio.NpzFile:
    return np.load(FIXTURE_DIR / "outputs.npz")


@pytest.fixture(scope="module")
def smiles() -> list[str]:
    return [str(s) for s in np.load(FIXTURE_DIR / "graph.npz")["smiles"]]


@pytest.fixture(scope="module")
def atom_vocab() -> ContextVocab:
    return ContextVocab.load(FIXTURE_DIR / "tiny_atom_vocab.json")


@pytest.fixture(scope="module")
def bond_vocab() -> ContextVocab:
    return ContextVocab.load(FIXTURE_DIR / "tiny_bond_vocab.json")


@pytest.fixture(scope="module")
def smiles_vocab() -> SmilesVocab:
    return SmilesVocab.load(FIXTURE_DIR / "tiny_smiles_vocab.pkl")


def test_context_strings_follow_upstream_format() -> None:
    ethanol = Chem.MolFromSmiles("CCO")
    assert atom_context(ethanol, ethanol.GetAtomWithIdx(1)) == "C_C-SINGLE1_O-SINGLE1"
    assert bond_context(ethanol, ethanol.GetBondWithIdx(1)) == "(SINGLE-STEREONONE-NONE)_C-(SINGLE-STEREONONE-NONE)1"


def test_bonds_in_pair_order_sorts_by_atom_pair() -> None:
    ring = Chem.MolFromSmiles("C1CC1O")  # rdkit order: 0-1, 1-2, 2-3, 2-0 (ring closure last)
    pairs = [sorted((b.GetBeginAtomIdx(), b.GetEndAtomIdx())) for b in bonds_in_pair_order(ring)]
    assert pairs == [[0, 1], [0, 2], [1, 2], [2, 3]]


def test_fixture_vocab_sizes(atom_vocab: ContextVocab, bond_vocab: ContextVocab) -> None:
    assert (len(atom_vocab), len(bond_vocab)) == (126, 101)
    assert atom_vocab.index("no such context") == 1


def test_all_labels_equal_upstream(smiles, atom_vocab, bond_vocab, outputs) -> None:
    labels = all_vocab_labels(smiles, atom_vocab, bond_vocab)
    np.testing.assert_array_equal(labels.atom, outputs["pt_av_labels_all"])
    np.testing.assert_array_equal(labels.bond, outputs["pt_bv_labels_all"])


def test_sampled_labels_reproduce_upstream_seeded_draws(smiles, atom_vocab, bond_vocab, outputs) -> None:
    labels = sample_vocab_labels(smiles, atom_vocab, bond_vocab, np.random.RandomState(0))
    np.testing.assert_array_equal(labels.atom, outputs["pt_av_labels_mask15_seed0"])
    np.testing.assert_array_equal(labels.bond, outputs["pt_bv_labels_mask15_seed0"])


def test_sampled_labels_with_generator_keep_ceil_fraction(smiles, atom_vocab, bond_vocab) -> None:
    labels = sample_vocab_labels(smiles, atom_vocab, bond_vocab, np.random.default_rng(7))
    n_atoms = [Chem.MolFromSmiles(s).GetNumAtoms() for s in smiles]
    assert int((labels.atom != 0).sum()) == sum(math.ceil(n * 0.15) for n in n_atoms)


def test_context_vocab_build_and_json_round_trip(tmp_path: Path, smiles, atom_vocab) -> None:
    rebuilt = ContextVocab.build(smiles, "atom")
    assert rebuilt.itos[:2] == ("<pad>", "<other>")
    counts = [rebuilt.freqs[t] for t in rebuilt.itos[2:]]
    assert counts == sorted(counts, reverse=True)
    atom_vocab.save(tmp_path / "v.json")
    assert ContextVocab.load(tmp_path / "v.json") == atom_vocab


def test_smiles_vocab_reads_upstream_pickle(smiles_vocab: SmilesVocab) -> None:
    assert len(smiles_vocab) == 41
    assert smiles_vocab.itos[:5] == ("<pad>", "<start>", "<end>", "<unk>", "<mask>")
    assert smiles_vocab.tokenize("F/C=C\\Cl") == ["F", "/", "C", "=", "C", "\\", "Cl"]
    ids = smiles_vocab.encode("c1ccccc1[Xe]")
    assert ids[0] == START and ids[-1] == END and ids[-2] == UNK
    assert smiles_vocab.decode(smiles_vocab.encode("CC(=O)O")) == "CC(=O)O"


def test_smiles_vocab_json_round_trip(tmp_path: Path, smiles_vocab: SmilesVocab) -> None:
    smiles_vocab.save(tmp_path / "smiles_vocab.json")
    assert SmilesVocab.load(tmp_path / "smiles_vocab.json") == smiles_vocab


def test_encoded_batch_equals_upstream_tokens(smiles, smiles_vocab, outputs) -> None:
    batch = encode_batch(smiles, smiles_vocab, max_seq_len=64)
    np.testing.assert_array_equal(batch.tokens, outputs["pt_hybrid_dec_tokens"])
    np.testing.assert_array_equal(batch.padding_mask[:, 1:], outputs["pt_hybrid_dec_padding_mask"])


def test_truncation_keeps_end_token(smiles_vocab: SmilesVocab) -> None:
    batch = encode_batch(["CCCCCCCCCC", "C"], smiles_vocab, max_seq_len=5)
    assert batch.tokens.shape == (2, 5)
    assert batch.tokens[0, -1] == END and batch.tokens[1, 3] == PAD


def test_pickle_with_foreign_global_is_refused(tmp_path: Path) -> None:
    # os.system, not print: a Ray session in the same process replaces builtins.print with its own function
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(pickle.UnpicklingError, match=re.escape(f"{os.system.__module__}.system")):
        SmilesVocab.load(path)


def test_upstream_pickle_references_only_known_globals() -> None:
    ops = pickletools.genops((FIXTURE_DIR / "tiny_smiles_vocab.pkl").read_bytes())
    strings = [arg for op, arg, _ in ops if op.name == "SHORT_BINUNICODE"]
    assert {"kermt.data.torchvocab", "SMILESVocab", "re", "_compile", "collections", "Counter"} <= set(strings)
