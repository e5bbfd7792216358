"""Reconstruction from upstream's hybrid fixture checkpoint: keyed samples, conditioning, vocab and kind checks,
scoring."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest

from kermt.checkpoint import load_pretrain_model, read_checkpoint
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.data.featurize import featurize_smiles
from kermt.errors import UserError
from kermt.nn.pretrain.generate import SamplingConfig
from kermt.nn.pretrain.config import PretrainLossConfig
from kermt.pretrain.export import save_pretrain_native
from kermt.pretrain.reconstruct import (ReconstructSettings, Reconstructor, check_reconstruct_checkpoint,
                                        edit_distance, find_smiles_vocab, read_smiles_vocab, score)
from tests.conftest import FIXTURE_DIR

SMILES = pd.read_csv(FIXTURE_DIR / "smiles.csv").iloc[:6, 0].tolist()
SAMPLING = SamplingConfig(temperature=1.0, top_k=10, max_len=40)


@pytest.fixture(scope="module")
def checkpoint():
    return read_checkpoint(FIXTURE_DIR / "ckpt_pretrain_hybrid.pt")


@pytest.fixture(scope="module")
def model(checkpoint) -> Reconstructor:
    return Reconstructor(checkpoint, read_smiles_vocab(FIXTURE_DIR / "tiny_smiles_vocab.pkl", checkpoint))


def test_samples_depend_on_row_and_sample_number_only(model) -> None:
    molecules = featurize_smiles(SMILES)
    rows = np.arange(100, 106)
    settings = ReconstructSettings(SAMPLING, num_samples=3, seed=5)
    whole = model.reconstruct(molecules, rows, settings)
    assert [len(samples) for samples in whole] == [3] * 6
    # molecule 4 alone (the encoder sees another batch, the draws are the same): same strings
    alone = model.reconstruct(molecules.select(np.array([4])), rows[4:5], settings)
    assert alone == whole[4:5]
    fewer = model.reconstruct(molecules, rows, ReconstructSettings(SAMPLING, num_samples=2, seed=5))
    assert fewer == [samples[:2] for samples in whole]  # more samples only add samples
    other_seed = model.reconstruct(molecules, rows, ReconstructSettings(SAMPLING, num_samples=3, seed=6))
    assert other_seed != whole
    assert len({s for samples in whole for s in samples}) > 10  # draws differ between rows and samples


def test_native_export_reconstructs_the_same_strings(model, checkpoint, tmp_path) -> None:
    """kermt.pretrain.export's native directory (with our JSON vocab beside it) generates what the upstream .pt does."""
    pretrain_model, _ = load_pretrain_model(checkpoint)
    save_pretrain_native(tmp_path / "model", pretrain_model, PretrainLossConfig())
    model.vocab.save(tmp_path / "smiles_vocab.json")
    native = read_checkpoint(tmp_path / "model")
    again = Reconstructor(native, read_smiles_vocab(find_smiles_vocab(native.path), native))
    molecules, settings = featurize_smiles(SMILES[:3]), ReconstructSettings(SAMPLING, num_samples=2)
    assert again.reconstruct(molecules, np.arange(3), settings) == model.reconstruct(molecules, np.arange(3), settings)


def test_latent_mean_with_greedy_decoding_is_deterministic(model) -> None:
    molecules = featurize_smiles(SMILES[:3])
    settings = ReconstructSettings(SamplingConfig(temperature=0, max_len=40), use_mean=True, num_samples=2)
    first = model.reconstruct(molecules, np.arange(3), settings)
    assert all(a == b for a, b in first)
    assert model.reconstruct(molecules, np.arange(50, 53), settings) == first  # no draw is used


def test_only_cmim_and_hybrid_checkpoints_reconstruct() -> None:
    vocab_mode = read_checkpoint(FIXTURE_DIR / "ckpt_pretrain_vocab.pt")
    with pytest.raises(UserError, match=r"reconstruct needs a cmim or hybrid checkpoint; .*ckpt_pretrain_vocab.pt "
                                        r"is vocab$"):
        check_reconstruct_checkpoint(vocab_mode)


def test_smiles_vocab_is_found_next_to_the_checkpoint_and_checked(checkpoint, tmp_path) -> None:
    assert find_smiles_vocab(FIXTURE_DIR / "ckpt_pretrain_hybrid.pt") == FIXTURE_DIR / "tiny_smiles_vocab.pkl"
    native = tmp_path / "run" / "model"
    native.mkdir(parents=True)
    SmilesVocab.load(FIXTURE_DIR / "tiny_smiles_vocab.pkl").save(tmp_path / "run" / "smiles_vocab.json")
    assert find_smiles_vocab(native) == tmp_path / "run" / "smiles_vocab.json"  # beside a native directory
    shutil.copy(FIXTURE_DIR / "tiny_smiles_vocab.pkl", tmp_path / "run" / "pretrain_smiles_vocab.pkl")
    with pytest.raises(UserError, match="several SMILES vocabs"):
        find_smiles_vocab(native)
    with pytest.raises(UserError, match="no SMILES vocab"):
        find_smiles_vocab(tmp_path / "elsewhere" / "model.pt")
    small = SmilesVocab.build(["CCO"])
    small.save(tmp_path / "small.json")
    with pytest.raises(UserError, match=r"has 7 tokens but the decoder .* has 41"):
        read_smiles_vocab(tmp_path / "small.json", checkpoint)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(UserError, match="not a SMILES vocab"):
        read_smiles_vocab(tmp_path / "broken.json", checkpoint)


def test_scoring_as_upstream() -> None:
    assert edit_distance("CCO", "OCC") == 2 and edit_distance("", "CC") == 2
    assert edit_distance("c1ccccc1", "c1ccccc1") == 0
    same = score("CCO", "OCC")  # another spelling of ethanol
    assert same.parses and same.exact_match and same.edit_distance == 2
    other = score("CCO", "CCN")
    assert other.parses and not other.exact_match and other.edit_distance == 1
    for broken in ("C1CC", "", "(("):
        assert score("CCO", broken) == type(same)(broken, False, False, None)

