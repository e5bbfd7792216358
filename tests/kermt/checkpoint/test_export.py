"""Export to upstream's model.pt layout: exact re-import, and upstream's own predict path accepts it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from kermt.checkpoint import (
    UnfaithfulExportError,
    export_upstream,
    load_finetune_model,
    load_pickled_checkpoint,
    read_checkpoint,
    unbuilt_encoder_tensors,
)
from tests.conftest import FIXTURE_DIR
from tests.kermt.nn.upstream_fixtures import fixture_batch

UPSTREAM = Path(os.environ.get("KERMT_UPSTREAM_DIR", "/work/upstream_kermt"))
PREDICT_SCRIPT = Path(__file__).with_name("upstream_predict.py")
# What upstream's load_checkpoint / build_model / make_predictions read from a checkpoint's args.
REQUIRED_ARGS = {
    "hidden_size", "depth", "num_attn_head", "num_mt_block", "dropout", "activation", "bias", "undirected", "dense",
    "embedding_output_type", "backbone", "cuda", "self_attention", "attn_hidden", "attn_out", "ffn_hidden_size",
    "ffn_num_layers", "ffn_num_task_specific_layers", "ffn_task_specific_hidden_size", "features_only",
    "features_size", "features_dim", "num_tasks", "output_size", "dataset_type", "features_generator",
    "rdkit2D_normalization_type", "use_cuikmolmaker_featurization", "features_scaling", "task_names",
    "parser_name", "fingerprint",
}


def _export(tmp_path: Path, name: str = "ft_reg", with_passthrough: bool = True) -> tuple[Path, list[str]]:
    checkpoint = read_checkpoint(FIXTURE_DIR / f"ckpt_{name}.pt")
    model, _ = load_finetune_model(checkpoint)
    passthrough = unbuilt_encoder_tensors(checkpoint) if with_passthrough else None
    path = tmp_path / "export" / "model.pt"
    return path, export_upstream(path, model.state_dict(), checkpoint.spec, passthrough=passthrough)


@pytest.mark.parametrize("name", ["ft_reg", "ft_reg_ts", "ft_cls"])
def test_export_reimports_safely_to_the_original_tensors_and_args(tmp_path, name):
    path, warnings = _export(tmp_path, name)
    assert warnings == []
    exported = load_pickled_checkpoint(path)  # safe loader: plain data only
    original = load_pickled_checkpoint(FIXTURE_DIR / f"ckpt_{name}.pt")
    assert list(exported) == ["args", "state_dict", "data_scaler", "features_scaler"]
    assert exported["state_dict"].keys() == original["state_dict"].keys()
    for key, tensor in original["state_dict"].items():
        assert torch.equal(exported["state_dict"][key], tensor), key
    args, saved = vars(exported["args"]), vars(original["args"])
    assert REQUIRED_ARGS <= set(args)
    for key in REQUIRED_ARGS - {"cuda", "features_dim", "features_generator", "bond_drop_rate"}:
        assert args[key] == saved[key], key
    assert args["features_generator"] == saved["features_generator"] and args["cuda"] is False
    if original["data_scaler"] is None:
        assert exported["data_scaler"] is None
    else:
        for stat in ("means", "stds"):
            assert exported["data_scaler"][stat].dtype == np.float64
            np.testing.assert_array_equal(exported["data_scaler"][stat], original["data_scaler"][stat])


def test_missing_bond_branches_are_zero_filled_with_a_warning(tmp_path):
    path, warnings = _export(tmp_path, with_passthrough=False)
    assert len(warnings) == 1 and "14 encoder bond-output branch tensors" in warnings[0]
    state = load_pickled_checkpoint(path)["state_dict"]
    assert state["kermt.encoders.ffn_bond_from_atom.W_1.weight"].shape == (64, 181)
    assert not state["kermt.encoders.ffn_bond_from_atom.W_1.weight"].any()


def test_only_finetuned_models_export(tmp_path):
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_pretrain_vocab.pt")
    with pytest.raises(ValueError, match="only finetuned"):
        export_upstream(tmp_path / "x.pt", checkpoint.state_dict, checkpoint.spec)


def test_a_zero_padding_model_is_not_exported_because_upstream_would_predict_otherwise(tmp_path):
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_reg.pt")
    model, _ = load_finetune_model(checkpoint)
    zero_spec = dataclasses.replace(checkpoint.spec,
                                    encoder=dataclasses.replace(checkpoint.spec.encoder, padding="zero"))
    zero_model, _ = load_finetune_model(dataclasses.replace(checkpoint, spec=zero_spec))
    graph = fixture_batch()
    features = torch.rand(graph.a_scope.shape[0], checkpoint.spec.head.features_size,
                          generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the same weights predict differently in the two modes: the file cannot say which
        upstream_mode, zero_mode = (m.eval()(graph, features).prediction for m in (model, zero_model))
    assert not torch.allclose(upstream_mode, zero_mode, atol=1e-4)
    path = tmp_path / "model.pt"
    with pytest.raises(UnfaithfulExportError, match=r"model\.pt: cannot export a model trained with "
                                                    r"padding='zero' to upstream's model\.pt"):
        export_upstream(path, zero_model.state_dict(), zero_spec, passthrough=unbuilt_encoder_tensors(checkpoint))
    assert not path.exists() and list(tmp_path.iterdir()) == []


def _upstream_predict(checkpoint_dirs: list[Path]) -> list[np.ndarray]:
    """Upstream ``main.py predict`` on each directory (one subprocess); predictions [26, 2] per directory."""
    outputs = [directory / "predictions.csv" for directory in checkpoint_dirs]
    pairs = [f"{directory}={output}" for directory, output in zip(checkpoint_dirs, outputs)]
    command = [sys.executable, str(PREDICT_SCRIPT), *pairs, "--", "--data_path", str(FIXTURE_DIR / "smiles.csv"),
               "--features_generator", "rdkit_2d_normalized", "--no_features_scaling", "--no_cuda"]
    env = dict(os.environ, PYTHONPATH=str(UPSTREAM))
    done = subprocess.run(command, cwd=checkpoint_dirs[0], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [pd.read_csv(output)[["t1", "t2"]].to_numpy() for output in outputs]


@pytest.mark.skipif(not (UPSTREAM / "task" / "predict.py").is_file(), reason="no upstream KERMT checkout")
def test_upstream_predict_gives_the_same_predictions_from_the_export(tmp_path):
    path, _ = _export(tmp_path)
    original_dir = tmp_path / "original"
    original_dir.mkdir()
    (original_dir / "model.pt").write_bytes((FIXTURE_DIR / "ckpt_ft_reg.pt").read_bytes())
    from_export, from_original = _upstream_predict([path.parent, original_dir])
    np.testing.assert_array_equal(from_export, from_original)
    # Both differ from the recorded fixture by ~5e-7 here (this machine's descriptastorus/float order), equally.
    np.testing.assert_allclose(from_export, np.load(FIXTURE_DIR / "outputs.npz")["ft_reg_final_prediction"],
                               rtol=0, atol=2e-6)
