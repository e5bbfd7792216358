"""``--continue_from``: a vocab model continues as hybrid (encoder and vocab heads kept, latent head and decoder
new); the flags of an architecture the checkpoint fixes must agree with it. Driver-side, no Ray."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from kermt.checkpoint import ArchitectureConflictError
from kermt.data.corpus_prep import prepare_corpus
from kermt.nn.pretrain.config import PretrainLossConfig
from kermt.nn.pretrain.model import KermtPretrainModel
from kermt.pretrain.export import export_pretrain_upstream
from ray_app.pretrain.config import resolve
from ray_app.pretrain.inputs import check_pretrain_inputs
from ray_app.pretrain.run import model_configs, pretrain_initial_state
from tests.conftest import FIXTURE_DIR


@pytest.fixture(scope="module")
def vocab_checkpoint(tmp_path_factory) -> tuple[Path, KermtPretrainModel]:
    """A corpus and a vocab-mode model of its vocabularies saved as upstream's .pt."""
    with open(FIXTURE_DIR / "smiles.csv", newline="") as f:
        smiles = [row["smiles"] for row in csv.DictReader(f)]
    root = tmp_path_factory.mktemp("continue")
    prepare_corpus({"fixture": smiles}, str(root / "corpus"))
    config, sources = resolve(["--data_path", str(root / "corpus"), "--hidden_size", "16", "--num_attn_head", "2"])
    encoder, heads, _ = model_configs(config, sources, check_pretrain_inputs(config))
    torch.manual_seed(1)
    model = KermtPretrainModel(encoder, heads)
    export_pretrain_upstream(root / "vocab.pt", model, PretrainLossConfig())
    return root, model


def _settings(root: Path, *flags: str):
    config, sources = resolve(["--data_path", str(root / "corpus"), "--continue_from", str(root / "vocab.pt"),
                               "--latent_dim", "16", "--decoder_num_attention_heads", "2", *flags])
    return config, sources, check_pretrain_inputs(config)


def test_vocab_checkpoint_continues_as_hybrid(vocab_checkpoint):
    root, vocab_model = vocab_checkpoint
    config, sources, inputs = _settings(root, "--pretrain_mode", "hybrid")
    encoder, heads, _ = model_configs(config, sources, inputs)
    assert (encoder.hidden_size, heads.pretrain_mode) == (16, "hybrid")  # the architecture is the checkpoint's
    state = pretrain_initial_state(encoder, heads, inputs, seed=0)
    for name, value in vocab_model.state_dict().items():
        assert torch.equal(state[name], value), name
    assert torch.equal(state["latent_dist.kermt.encoders.node_blocks.0.W_i.weight"],
                       vocab_model.state_dict()["kermt.encoders.node_blocks.0.W_i.weight"])
    assert "decoder.token_embedding.weight" in state and "latent_dist.fc_mean_logscale.weight" in state


def test_architecture_flag_that_contradicts_the_checkpoint(vocab_checkpoint):
    config, sources, inputs = _settings(vocab_checkpoint[0], "--hidden_size", "32")
    with pytest.raises(ArchitectureConflictError, match="hidden_size"):
        model_configs(config, sources, inputs)
