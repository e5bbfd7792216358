"""Native format: bit-exact round trips, restored ties, atomic replacement."""

from __future__ import annotations

import json

import pytest
import torch

from kermt.checkpoint import (
    convert_to_native,
    load_finetune_model,
    load_native,
    read_checkpoint,
    save_native,
    unbuilt_encoder_tensors,
)
from tests.conftest import FIXTURE_DIR


def _assert_same_tensors(left: dict, right: dict) -> None:
    assert left.keys() == right.keys()
    for key, tensor in left.items():
        assert tensor.dtype == right[key].dtype and torch.equal(tensor, right[key]), key


@pytest.mark.parametrize("name", ["ft_reg_ts", "ft_cls"])
def test_finetuned_round_trip_is_bit_identical(tmp_path, name):
    checkpoint = read_checkpoint(FIXTURE_DIR / f"ckpt_{name}.pt")
    model, _ = load_finetune_model(checkpoint)
    directory = convert_to_native(checkpoint, tmp_path / "model")
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "model.safetensors",
                                                            "passthrough.safetensors"]
    native = load_native(directory)
    _assert_same_tensors(native.state_dict, model.state_dict())
    _assert_same_tensors(native.passthrough, unbuilt_encoder_tensors(checkpoint))
    assert native.spec == checkpoint.spec and native.spec.to_dict() == checkpoint.spec.to_dict()
    assert native.provenance["source_sha256"] == checkpoint.provenance["source_sha256"]
    reloaded, report = load_finetune_model(read_checkpoint(directory))
    assert report.ignored == {} and report.fresh == ()
    _assert_same_tensors(reloaded.state_dict(), model.state_dict())


def test_shared_tensors_are_stored_once_and_tied_again(tmp_path):
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_pretrain_hybrid.pt")
    save_native(tmp_path / "hybrid", checkpoint.state_dict, checkpoint.spec)
    config = json.loads((tmp_path / "hybrid" / "config.json").read_text())
    assert config["format"] == "kermt-native" and config["format_version"] == 1 and config["kind"] == "hybrid"
    assert config["tied"]["latent_dist.kermt.encoders.node_blocks.0.W_i.weight"] == \
        "kermt.encoders.node_blocks.0.W_i.weight"
    native = load_native(tmp_path / "hybrid")
    _assert_same_tensors(native.state_dict, checkpoint.state_dict)
    assert native.state_dict["latent_dist.kermt.encoders.node_blocks.0.W_i.weight"] is \
        native.state_dict["kermt.encoders.node_blocks.0.W_i.weight"]

    ffn = read_checkpoint(FIXTURE_DIR / "ckpt_ft_cls.pt")
    model, _ = load_finetune_model(ffn)
    save_native(tmp_path / "cls", model.state_dict(), ffn.spec)
    tied = json.loads((tmp_path / "cls" / "config.json").read_text())["tied"]
    assert tied["mol_atom_from_atom_ffn.5.weight"] == "mol_atom_from_atom_ffn.2.weight"


def test_save_replaces_atomically_and_a_failed_save_keeps_the_old_one(tmp_path):
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_cls.pt")
    target = tmp_path / "model"
    save_native(target, checkpoint.state_dict, checkpoint.spec, provenance={"run": 1})
    save_native(target, checkpoint.state_dict, checkpoint.spec, provenance={"run": 2})
    assert load_native(target).provenance == {"run": 2}
    with pytest.raises(TypeError):
        save_native(target, checkpoint.state_dict, checkpoint.spec, provenance={"run": object()})
    assert load_native(target).provenance == {"run": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no staging leftovers


def test_not_a_native_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a native kermt checkpoint"):
        read_checkpoint(tmp_path)
