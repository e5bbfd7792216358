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
from kermt.errors import UserError
from kermt.inference import find_checkpoints
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
    with pytest.raises(UserError, match="not a native kermt checkpoint"):
        read_checkpoint(tmp_path)


def _interrupted_replacement(tmp_path, checkpoint, runs: int = 1):
    """The file-system state a crash between the two renames of a replacement leaves: the old checkpoint parked
    as ``.model.old``, no ``model``, and a complete staging copy of the new one that never moved in."""
    target = tmp_path / "model"
    save_native(target, checkpoint.state_dict, checkpoint.spec, provenance={"run": runs})
    staging = tmp_path / ".model.tmp-crashed"
    save_native(staging, checkpoint.state_dict, checkpoint.spec, provenance={"run": runs + 1})
    target.rename(tmp_path / ".model.old")
    assert not target.exists()
    return target


def test_a_reader_recovers_a_checkpoint_left_aside_by_a_crash(tmp_path):
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_cls.pt")
    target = _interrupted_replacement(tmp_path, checkpoint)
    recovered = read_checkpoint(target)
    assert recovered.format == "native" and recovered.provenance == {"run": 1}
    _assert_same_tensors(recovered.state_dict, load_native(target).state_dict)
    assert target.is_dir() and not (tmp_path / ".model.old").exists()


def test_the_next_save_recovers_then_replaces(tmp_path):
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_cls.pt")
    target = _interrupted_replacement(tmp_path, checkpoint)
    save_native(target, checkpoint.state_dict, checkpoint.spec, provenance={"run": 3})
    assert load_native(target).provenance == {"run": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.tmp-crashed", "model"]  # the crash's staging


def test_a_crash_after_the_new_copy_moved_in_reads_the_new_one(tmp_path):
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_cls.pt")
    target = tmp_path / "model"
    save_native(tmp_path / ".model.old", checkpoint.state_dict, checkpoint.spec, provenance={"run": 1})
    save_native(target, checkpoint.state_dict, checkpoint.spec, provenance={"run": 2})
    assert load_native(target).provenance == {"run": 2}  # the stale aside copy is not taken
    save_native(target, checkpoint.state_dict, checkpoint.spec, provenance={"run": 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_finding_members_recovers_a_checkpoint_left_aside(tmp_path):
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_cls.pt")
    member = tmp_path / "fold_0" / "model_0"
    member.mkdir(parents=True)
    target = _interrupted_replacement(member, checkpoint)
    assert find_checkpoints(tmp_path) == [target]
    assert load_native(target).provenance == {"run": 1}
