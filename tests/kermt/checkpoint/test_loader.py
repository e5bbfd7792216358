"""Strict loading into the real models: outputs equal upstream's, every key accounted for, clear errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from kermt.checkpoint import (
    CheckpointMismatchError,
    load_finetune_model,
    load_into_model,
    load_pretrain_model,
    load_pretrained_weights,
    read_checkpoint,
)
from kermt.checkpoint.merge import merge_finetune_config
from kermt.data.batch import BatchMolGraph
from kermt.nn.finetune import KermtFinetuneModel
from tests.conftest import FIXTURE_DIR

GRAPH = np.load(FIXTURE_DIR / "graph.npz")
OUTPUTS = np.load(FIXTURE_DIR / "outputs.npz")
BOND_BRANCH_REASON = "encoder bond-output branch, not built by this model (a finetune model only uses the atom outputs)"


def _batch() -> BatchMolGraph:
    names = ("f_atoms", "f_bonds", "a2b", "b2a", "b2revb", "a_scope", "b_scope", "a2a")
    return BatchMolGraph(**{name: torch.from_numpy(GRAPH[f"batch_{name}"]) for name in names})


def _predict(model: KermtFinetuneModel, features_size: int) -> np.ndarray:
    features = torch.from_numpy(GRAPH["rdkit2d_norm_datapoint"]).float() if features_size else None
    model.eval()
    with torch.no_grad():
        return model(_batch(), features).prediction.numpy()


@pytest.mark.parametrize("name", ["ft_reg", "ft_reg_ts", "ft_cls"])
def test_finetuned_checkpoint_reproduces_upstream_outputs(name):
    checkpoint = read_checkpoint(FIXTURE_DIR / f"ckpt_{name}.pt")
    model, report = load_finetune_model(checkpoint)
    assert set(report.used) == set(model.state_dict())
    assert report.fresh == ()
    assert {reason: len(keys) for reason, keys in report.ignored.items()} == {BOND_BRANCH_REASON: 14}
    output = _predict(model, checkpoint.spec.head.features_size)
    # 4e-7: float32 summation order differs from upstream's (same size as upstream's own run-to-run drift here)
    np.testing.assert_allclose(output, OUTPUTS[f"{name}_model_output"], rtol=0, atol=2e-6)
    if checkpoint.spec.data_scaler is not None:
        final = checkpoint.spec.data_scaler.inverse_transform(output)
        np.testing.assert_allclose(final, OUTPUTS[f"{name}_final_prediction"], rtol=0, atol=2e-6)


@pytest.mark.parametrize("name", ["vocab", "hybrid"])
def test_pretrain_checkpoints_load_strictly_into_the_pretraining_model(name):
    checkpoint = read_checkpoint(FIXTURE_DIR / f"ckpt_pretrain_{name}.pt")
    model, report = load_pretrain_model(checkpoint)
    assert len(report.used) == len(checkpoint.state_dict) and report.ignored == {}
    assert set(report.ignored_entries) == {"optimizer", "epoch", "scheduler_step", "batch_idx", "wandb_run_id"}


def _fresh_finetune_model(checkpoint) -> KermtFinetuneModel:
    config = merge_finetune_config(checkpoint.spec, readout={"self_attention": True},
                                   head={"num_tasks": 3, "dataset_type": "regression", "ffn_hidden_size": 8})
    return KermtFinetuneModel(config)


def test_hybrid_pretrain_into_fresh_finetune_head_reports_every_group():
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_pretrain_hybrid.pt")
    model = _fresh_finetune_model(checkpoint)
    head_before = model.mol_atom_from_atom_ffn[1].weight.clone()
    report = load_pretrained_weights(model, checkpoint)
    assert all(k.startswith("kermt.") for k in report.used)
    assert {k.split(".")[0] for k in report.fresh} == {"readout", "mol_atom_from_atom_ffn", "mol_atom_from_bond_ffn"}
    ignored = {reason.split(" (")[0].split(",")[0]: len(keys) for reason, keys in report.ignored.items()}
    assert ignored == {
        "encoder bond-output branch": 14,
        "second copy of the shared encoder in a cMIM/hybrid checkpoint": 80,
        "cMIM latent head": 3,  # latent_dist.readout.* is NOT loaded into the finetune readout (unlike upstream)
        "cMIM SMILES decoder": 57,
        "contextual-vocabulary pretraining heads": 21,
    }
    assert "optimizer" in report.ignored_entries
    assert torch.equal(model.mol_atom_from_atom_ffn[1].weight, head_before)  # fresh head untouched
    assert torch.equal(model.kermt.encoders.node_blocks[0].W_i.weight,
                       checkpoint.state_dict["kermt.encoders.node_blocks.0.W_i.weight"])
    assert "initialised fresh" in report.summary()


def test_fresh_head_without_the_explicit_prefixes_is_an_error():
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_pretrain_vocab.pt")
    model = _fresh_finetune_model(checkpoint)
    with pytest.raises(CheckpointMismatchError, match=r"missing key 'readout.attn.w1'"):
        load_into_model(model, checkpoint.state_dict)


def test_shape_mismatch_names_the_key_and_both_shapes_and_loads_nothing():
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_reg.pt")
    config = checkpoint.spec.finetune_model_config()
    model = KermtFinetuneModel(dataclasses.replace(config, head=dataclasses.replace(config.head, features_size=0)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointMismatchError) as info:
        load_into_model(model, checkpoint.state_dict)
    expected = "shape mismatch for 'mol_atom_from_atom_ffn.1.weight': checkpoint (24, 328), model (24, 128)"
    assert expected in str(info.value)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_unexplained_extra_key_is_an_error():
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_cls.pt")
    model = KermtFinetuneModel(checkpoint.spec.finetune_model_config())
    source = dict(checkpoint.state_dict, **{"mystery.weight": torch.zeros(2)})
    with pytest.raises(CheckpointMismatchError, match=r"unexpected key 'mystery.weight'"):
        load_into_model(model, source)


def test_tied_prelu_slope_must_agree_in_the_checkpoint():
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_cls.pt")
    model = KermtFinetuneModel(checkpoint.spec.finetune_model_config())
    source = dict(checkpoint.state_dict)
    source["mol_atom_from_atom_ffn.5.weight"] = source["mol_atom_from_atom_ffn.5.weight"] + 1
    with pytest.raises(CheckpointMismatchError, match="one shared parameter"):
        load_into_model(model, source)
