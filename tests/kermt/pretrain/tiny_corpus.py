"""A small in-process pretraining corpus (real RDKit featurisation, vocabularies built from the molecules) and a
tiny model config, shared by the pretraining tests."""

from __future__ import annotations

import csv

import numpy as np
from rdkit import Chem

from kermt.chem.fg_labels import fg_labels
from kermt.chem.molgraph import build_graphs
from kermt.chem.vocab_context import ContextVocab
from kermt.chem.vocab_labels import all_vocab_labels
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.config import EncoderConfig
from kermt.nn.pretrain_config import PretrainHeadsConfig
from kermt.pretrain.batch import PretrainArrays
from tests.conftest import FIXTURE_DIR


def fixture_smiles() -> list[str]:
    with open(FIXTURE_DIR / "smiles.csv", newline="") as f:
        return [row["smiles"] for row in csv.DictReader(f)]


def tiny_arrays(smiles: list[str]) -> tuple[PretrainArrays, dict[str, int]]:
    """The arrays of ``smiles`` and the vocab sizes (atom, bond, smiles)."""
    mols = [Chem.MolFromSmiles(s) for s in smiles]
    graphs, errors = build_graphs(mols)
    assert not any(errors)
    atom_vocab, bond_vocab = ContextVocab.build(smiles, "atom"), ContextVocab.build(smiles, "bond")
    labels = all_vocab_labels(smiles, atom_vocab, bond_vocab)
    smiles_vocab = SmilesVocab.build(smiles)
    tokens = [smiles_vocab.encode(s) for s in smiles]
    arrays = PretrainArrays(
        graphs=graphs, fg_labels=fg_labels(mols), atom_labels=labels.atom[1:].astype(np.int32),
        bond_labels=labels.bond[1:].astype(np.int32), tokens=np.concatenate(tokens).astype(np.int32),
        token_counts=np.array([len(t) for t in tokens], dtype=np.int32),
    )
    sizes = {"atom_vocab_size": len(atom_vocab.itos), "bond_vocab_size": len(bond_vocab.itos),
             "smiles_vocab_size": len(smiles_vocab)}
    return arrays, sizes


TINY_ENCODER = EncoderConfig(hidden_size=16, depth=3, num_attn_head=2, activation="PReLU", dropout=0.0,
                             embedding_output_type="both")


def tiny_heads(mode: str, sizes: dict[str, int]) -> PretrainHeadsConfig:
    return PretrainHeadsConfig(pretrain_mode=mode, latent_dim=16, decoder_num_layers=1, decoder_num_attention_heads=2,
                               decoder_ffn_hidden_size=32, decoder_dropout=0.0, decoder_max_seq_len=64, **sizes)
