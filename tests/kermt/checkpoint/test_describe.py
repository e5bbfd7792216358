"""Kind, architecture, tasks, scalers and feature settings of upstream checkpoints (values from the fixtures)."""

from __future__ import annotations

import ast
import json
from collections import OrderedDict

import pytest
import torch

from kermt.checkpoint.classify import classify_kind, describe_checkpoint
from kermt.checkpoint.keys import canonical_state_dict
from kermt.checkpoint.safe_load import load_pickled_checkpoint
from kermt.checkpoint.upstream import read_upstream_checkpoint
from kermt.errors import UserError
from tests.conftest import FIXTURE_DIR

STRUCTURE = json.loads((FIXTURE_DIR / "ckpt_structure.json").read_text())
KINDS = {"ckpt_pretrain_vocab": "vocab", "ckpt_pretrain_hybrid": "hybrid", "ckpt_ft_reg": "finetuned",
         "ckpt_ft_reg_ts": "finetuned", "ckpt_ft_cls": "finetuned"}


def _saved_args(name: str) -> dict:
    return STRUCTURE[name]["args"]


def _as_value(text):
    """ckpt_structure.json writes list-valued args as their repr ("['t1', 't2']")."""
    return ast.literal_eval(text) if isinstance(text, str) and text.startswith("[") else text


@pytest.mark.parametrize("name", sorted(KINDS))
def test_kind_and_encoder_architecture(name):
    ckpt = read_upstream_checkpoint(FIXTURE_DIR / f"{name}.pt")
    args = _saved_args(name)
    assert ckpt.spec.kind == KINDS[name]
    encoder = ckpt.spec.encoder
    for field in ("hidden_size", "depth", "num_attn_head", "num_mt_block", "activation", "bias", "undirected",
                  "embedding_output_type"):
        assert getattr(encoder, field) == args[field], field
    assert (encoder.atom_fdim, encoder.bond_fdim) == (151, 165)
    assert ckpt.spec.notes == ()  # everything came from the saved args and agreed with the shapes
    assert ckpt.sha256 and len(ckpt.sha256) == 64


@pytest.mark.parametrize("name", ["ckpt_ft_reg", "ckpt_ft_reg_ts", "ckpt_ft_cls"])
def test_finetuned_head_tasks_scalers_features(name):
    spec = read_upstream_checkpoint(FIXTURE_DIR / f"{name}.pt").spec
    args = _saved_args(name)
    assert spec.readout.self_attention is args["self_attention"]
    assert (spec.readout.attn_hidden, spec.readout.attn_out) == (4, 8)
    for field in ("num_tasks", "dataset_type", "features_size", "ffn_hidden_size", "ffn_num_layers",
                  "ffn_num_task_specific_layers", "ffn_task_specific_hidden_size"):
        assert getattr(spec.head, field) == args[field], field
    assert spec.task_names == tuple(_as_value(args["task_names"]))
    assert spec.features.features_generator == tuple(_as_value(args["features_generator"]) or ())
    assert spec.features.features_scaling is args["features_scaling"]
    assert spec.features.rdkit2D_normalization_type == "fast"
    if name == "ckpt_ft_cls":
        assert spec.data_scaler is None
    else:
        assert spec.data_scaler.to_dict() == {"means": [0.021538461538461524, 0.3429166666666667],
                                              "stds": [1.5986140446978832, 0.9046752601839453]}
    assert spec.features_scaler is None


def test_pretrain_settings_and_training_state():
    hybrid = read_upstream_checkpoint(FIXTURE_DIR / "ckpt_pretrain_hybrid.pt")
    assert hybrid.spec.readout is None and hybrid.spec.head is None
    assert {k: hybrid.spec.pretrain[k] for k in ("latent_dim", "atom_vocab_size", "bond_vocab_size", "fg_size",
                                                 "smiles_vocab_size", "decoder_num_layers")} == {
        "latent_dim": 16, "atom_vocab_size": 126, "bond_vocab_size": 101, "fg_size": 85, "smiles_vocab_size": 41,
        "decoder_num_layers": 2}
    assert set(hybrid.training_state) == {"optimizer", "epoch", "scheduler_step", "batch_idx", "wandb_run_id"}
    vocab = read_upstream_checkpoint(FIXTURE_DIR / "ckpt_pretrain_vocab.pt").spec
    assert "decoder_num_layers" not in vocab.pretrain and vocab.pretrain["atom_vocab_size"] == 126


def _raw(name: str) -> dict:
    return load_pickled_checkpoint(FIXTURE_DIR / f"{name}.pt")


def test_legacy_grover_file_without_args_is_inferred_from_shapes():
    raw = _raw("ckpt_pretrain_vocab")
    legacy = OrderedDict((k.replace("kermt.", "grover.", 1), v) for k, v in raw["state_dict"].items()
                         if k.startswith("kermt."))
    sd = canonical_state_dict(legacy)
    assert all(k.startswith("kermt.") for k in sd)
    spec = describe_checkpoint({}, sd, {}, source="legacy.pt")
    assert spec.kind == "grover_base"
    encoder = spec.encoder
    assert (encoder.hidden_size, encoder.num_attn_head, encoder.num_mt_block, encoder.activation, encoder.bias,
            encoder.embedding_output_type) == (16, 2, 1, "PReLU", False, "both")
    notes = " ".join(spec.notes)
    assert "hidden_size=16 inferred" in notes and "depth not stored" in notes and "undirected not stored" in notes


def test_cmim_checkpoint_uses_its_latent_encoder_copy():
    sd = {k: v for k, v in _raw("ckpt_pretrain_hybrid")["state_dict"].items()
          if not k.startswith(("kermt.", "vocab_module."))}
    canonical = canonical_state_dict(sd)
    assert classify_kind(list(canonical)) == "cmim"
    assert torch.equal(canonical["kermt.encoders.node_blocks.0.W_i.weight"],
                       sd["latent_dist.kermt.encoders.node_blocks.0.W_i.weight"])


def test_hybrid_encoder_copies_must_agree():
    sd = dict(_raw("ckpt_pretrain_hybrid")["state_dict"])
    key = "latent_dist.kermt.encoders.node_blocks.0.W_i.weight"
    sd[key] = sd[key].clone() + 1
    with pytest.raises(ValueError, match="kermt.encoders.node_blocks.0.W_i.weight and latent_dist"):
        canonical_state_dict(sd)


def test_saved_args_contradicting_the_tensors_are_an_error():
    raw = _raw("ckpt_ft_reg")
    args = dict(vars(raw["args"]), hidden_size=32)
    with pytest.raises(ValueError, match=r"hidden_size=32 but the tensors imply 16"):
        describe_checkpoint(args, canonical_state_dict(raw["state_dict"]), raw, source="x.pt")
    args = dict(vars(raw["args"]), features_size=0)
    with pytest.raises(ValueError, match=r"features_size=0 but the tensors imply 200"):
        describe_checkpoint(args, canonical_state_dict(raw["state_dict"]), raw, source="x.pt")


def test_not_a_kermt_checkpoint():
    with pytest.raises(ValueError, match="no encoder keys"):
        classify_kind(["linear.weight"])


@pytest.mark.parametrize(("name", "expected"), [("ckpt_ft_reg", "regression"), ("ckpt_ft_cls", "classification")])
def test_argless_finetuned_file_takes_its_dataset_type_from_the_data_scaler_entry(name, expected):
    raw = _raw(name)
    assert (raw["data_scaler"] is None) == (expected == "classification")  # upstream: statistics for regression
    spec = describe_checkpoint({}, canonical_state_dict(raw["state_dict"]), raw, source="argless.pt")
    assert spec.head.dataset_type == expected
    assert any(note.startswith(f"dataset_type={expected!r} inferred") for note in spec.notes)


def test_finetuned_file_without_args_or_scaler_entry_needs_the_users_dataset_type():
    raw = _raw("ckpt_ft_cls")
    sd = canonical_state_dict(raw["state_dict"])
    with pytest.raises(UserError, match=r"bare\.pt: .*cannot tell regression from classification; pass "
                                         r"--dataset_type"):
        describe_checkpoint({}, sd, {"state_dict": raw["state_dict"]}, source="bare.pt")
    spec = describe_checkpoint({}, sd, {"state_dict": raw["state_dict"]}, source="bare.pt",
                               dataset_type="classification")
    assert spec.head.dataset_type == "classification"
    assert "dataset_type='classification' given (not stored in the checkpoint)" in spec.notes


def test_a_users_dataset_type_contradicting_the_saved_one_is_an_error():
    raw = _raw("ckpt_ft_cls")
    args, sd = dict(vars(raw["args"])), canonical_state_dict(raw["state_dict"])
    assert describe_checkpoint(args, sd, raw, "x.pt", "classification").head.dataset_type == "classification"
    with pytest.raises(ValueError, match="trained as classification but dataset_type='regression'"):
        describe_checkpoint(args, sd, raw, source="x.pt", dataset_type="regression")


def test_saved_undirected_true_is_refused_naming_the_file():
    raw = _raw("ckpt_ft_reg")
    args = dict(vars(raw["args"]), undirected=True)
    with pytest.raises(ValueError, match=r"x\.pt: saved args say undirected=True"):
        describe_checkpoint(args, canonical_state_dict(raw["state_dict"]), raw, source="x.pt")
