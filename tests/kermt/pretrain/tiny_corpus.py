"""A small in-process pretraining corpus (real RDKit featurisation, vocabularies built from the molecules) and a
tiny model config, shared by the pretraining tests."""

from __future__ import annotations

import csv

from kermt.chem.vocab_context import ContextVocab
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.config import EncoderConfig
from kermt.data.corpus import corpus_rows
from kermt.nn.pretrain.config import PretrainHeadsConfig
from kermt.pretrain.batch import PretrainData
from tests.conftest import FIXTURE_DIR


def fixture_smiles() -> list[str]:
    with open(FIXTURE_DIR / "smiles.csv", newline="") as f:
        return [row["smiles"] for row in csv.DictReader(f)]


def tiny_arrays(smiles: list[str]) -> tuple[PretrainData, dict[str, int]]:
    """The corpus rows of ``smiles`` (kermt.data.corpus, vocabularies built from them) and the vocab sizes."""
    atom_vocab, bond_vocab = ContextVocab.build(smiles, "atom"), ContextVocab.build(smiles, "bond")
    smiles_vocab = SmilesVocab.build(smiles)
    arrays = corpus_rows(smiles, atom_vocab, bond_vocab, smiles_vocab)
    sizes = {"atom_vocab_size": len(atom_vocab), "bond_vocab_size": len(bond_vocab),
             "smiles_vocab_size": len(smiles_vocab)}
    return PretrainData.of(arrays), sizes


TINY_ENCODER = EncoderConfig(hidden_size=16, depth=3, num_attn_head=2, activation="PReLU", dropout=0.0,
                             embedding_output_type="both")


def tiny_heads(mode: str, sizes: dict[str, int]) -> PretrainHeadsConfig:
    return PretrainHeadsConfig(pretrain_mode=mode, latent_dim=16, decoder_num_layers=1, decoder_num_attention_heads=2,
                               decoder_ffn_hidden_size=32, decoder_dropout=0.0, decoder_max_seq_len=64, **sizes)
