"""A pretraining model saved natively and as upstream's .pt reads back (safely) as the same model of its kind."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from kermt.checkpoint import load_pretrain_model, read_checkpoint
from kermt.nn.pretrain.config import PretrainHeadsConfig, PretrainLossConfig
from kermt.nn.pretrain.model import KermtPretrainModel
from kermt.pretrain.export import export_pretrain_upstream, save_pretrain_native
from tests.kermt.pretrain.tiny_corpus import TINY_ENCODER, fixture_smiles, tiny_arrays, tiny_heads


def _used(heads: PretrainHeadsConfig) -> dict:
    """The head settings a mode's model depends on (a vocab checkpoint stores no decoder settings, a cmim one
    no context-vocab sizes)."""
    values = dataclasses.asdict(heads)
    if not heads.uses_decoder:
        return {k: values[k] for k in ("pretrain_mode", "fg_size", "atom_vocab_size", "bond_vocab_size")}
    if not heads.uses_vocab:
        del values["atom_vocab_size"], values["bond_vocab_size"]
    return values


@pytest.mark.parametrize("mode", ["vocab", "cmim", "hybrid"])
def test_native_and_upstream_files_load_back(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = KermtPretrainModel(TINY_ENCODER, tiny_heads(mode, tiny_arrays(fixture_smiles()[:5])[1]))
    loss = PretrainLossConfig(dist_coff=0.2)
    saved = [save_pretrain_native(tmp_path / "native", model, loss),
             export_pretrain_upstream(tmp_path / "model.pt", model, loss, {"epoch": 3})]
    for path in saved:
        checkpoint = read_checkpoint(path)
        assert checkpoint.spec.kind == mode
        loaded, report = load_pretrain_model(checkpoint)
        assert _used(loaded.heads_config) == _used(model.heads_config)
        for name, value in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[name], value), name
