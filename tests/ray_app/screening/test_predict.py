"""`kermt predict / fingerprint / embed` end to end on the local Ray cluster, against upstream's outputs."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import pandas as pd
import torch

from kermt.data.featurize import featurize_smiles
from kermt.inference import Ensemble, find_checkpoints, read_members
from ray_app.screening.commands import main_embed, main_fingerprint, main_predict
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import OUTPUTS, PARITY, SMILES, ensemble_dir

INVALID = ["not_a_smiles", "", "C1CC", "[Na+].[Cl-]x"]


def _screening_csv(path, rows: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Fixture SMILES repeated in a shuffled order (so batches differ), about 1 % invalid rows, an id column."""
    rng = random.Random(seed)
    smiles = [rng.choice(INVALID) if rng.random() < 0.01 else rng.choice(SMILES) for _ in range(rows)]
    frame = pd.DataFrame({"compound": [f"cpd-{i:05d}" for i in range(rows)], "smiles": smiles})
    frame.to_csv(path, index=False)
    return frame


def test_predictions_equal_upstream(ray_cluster, tmp_path):
    """(The classification and task-specific checkpoints are compared in tests/kermt/test_inference.py; every
    Ray run costs an actor start, so this file keeps to one parity run.)"""
    out = tmp_path / "preds.csv"
    assert main_predict(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(out),
                         "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt"), "--upstream_batching"]) == 0
    frame = pd.read_csv(out, keep_default_na=False)
    assert list(frame.columns) == ["smiles", "t1", "t2", "valid", "error"]  # upstream's columns first
    assert frame["smiles"].tolist() == SMILES and frame["valid"].all()
    np.testing.assert_allclose(frame[["t1", "t2"]].to_numpy(float), OUTPUTS["ft_reg_final_prediction"],
                               rtol=0, atol=PARITY)


def test_ensemble_of_two_streams_2000_rows_in_order_for_any_concurrency(ray_cluster, tmp_path):
    data = _screening_csv(tmp_path / "screen.csv")
    checkpoints = ensemble_dir(tmp_path / "run", "ckpt_ft_cls.pt")  # no descriptors: keeps the test fast
    common = ["--data_path", str(tmp_path / "screen.csv"), "--checkpoint_dir", str(checkpoints),
              "--id_columns", "compound", "--smiles_column", "smiles", "--batch_size", "50", "--uncertainty"]
    assert main_predict([*common, "--output_path", str(tmp_path / "a.csv"), "--concurrency", "1"]) == 0
    assert main_predict([*common, "--output_path", str(tmp_path / "b.parquet"), "--concurrency", "2"]) == 0
    csv_out = pd.read_csv(tmp_path / "a.csv", keep_default_na=False, na_values=[""])
    parquet_out = pd.read_parquet(tmp_path / "b.parquet")
    assert list(csv_out.columns) == ["smiles", "c1", "c2", "c1_std", "c2_std", "compound", "valid", "error"]
    for frame in (csv_out, parquet_out):
        assert frame["compound"].tolist() == data["compound"].tolist()
        assert frame["smiles"].fillna("").tolist() == data["smiles"].fillna("").tolist()
    invalid = ~parquet_out["valid"].to_numpy()
    assert invalid.sum() == data["smiles"].fillna("").isin(INVALID).sum() > 0
    assert (parquet_out["error"][invalid] != "").all() and parquet_out.loc[invalid, "c1"].isna().all()
    values = ["c1", "c2", "c1_std", "c2_std"]
    np.testing.assert_array_equal(parquet_out[values].to_numpy(), csv_out[values].to_numpy())  # 1 vs 2 actors

    # the numbers of one process predicting the whole file (one torch thread, as in the 1-CPU actors): each
    # molecule at its reference width, so only the dense layers' float rounding at other batch sizes differs
    ensemble = Ensemble(read_members(find_checkpoints(checkpoints)))
    molecules = featurize_smiles(data["smiles"].fillna("").tolist())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected = ensemble.predict(molecules, 50)
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_allclose(parquet_out[["c1", "c2"]].to_numpy(), expected.mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(parquet_out[["c1_std", "c2_std"]].to_numpy(), expected.std, rtol=0, atol=1e-6)


def test_feature_mismatch_is_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "p.csv"
    code = main_predict(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(out),
                         "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt"), "--features_generator", "morgan"])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert "kermt predict: error: --features_generator morgan does not match the checkpoint, which expects " \
           "--features_generator rdkit_2d_normalized (200 features)" in err
    code = main_predict(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(out),
                         "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt"), "--smiles_colum", "smiles"])
    assert code == 2 and "did you mean '--smiles_column'" in capsys.readouterr().err


def test_all_invalid_input_is_a_clear_message(ray_cluster, tmp_path, capsys):
    """Molecules RDKit reads but the run refuses (too large here); a SMILES column that RDKit reads nothing of is
    refused before Ray starts (tests/test_checks_before_ray.py)."""
    (tmp_path / "bad.csv").write_text("smiles,id\nCCO,1\n,2\nCCCC,3\n")
    out = tmp_path / "p.csv"
    code = main_predict(["--data_path", str(tmp_path / "bad.csv"), "--output_path", str(out),
                         "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_cls.pt"), "--max_heavy_atoms", "1"])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists() and not list(tmp_path.glob(".p.csv*"))
    assert "error: none of the 3 rows of" in err and "is a valid molecule" in err and "'CCO': too large" in err


def test_fingerprints_equal_upstream_and_keep_invalid_rows(ray_cluster, tmp_path):
    smiles = SMILES[:10] + ["not_a_smiles"] + SMILES[10:]
    pd.DataFrame({"smiles": smiles}).to_csv(tmp_path / "in.csv", index=False)
    out = tmp_path / "fps.npz"
    assert main_fingerprint(["--data_path", str(tmp_path / "in.csv"), "--output_path", str(out),
                             "--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"),
                             "--fingerprint_source", "both", "--batch_size", "64", "--upstream_batching"]) == 0
    with np.load(out) as saved:
        fps, valid = saved["fps"], saved["valid"]
    assert fps.dtype == np.float32 and fps.shape == (27, 64) and valid.tolist() == [i != 10 for i in range(27)]
    assert np.isnan(fps[10]).all()
    np.testing.assert_allclose(np.delete(fps, 10, axis=0), OUTPUTS["pt_vocab_fingerprint_both"], rtol=0, atol=PARITY)


def test_embed_hybrid_npy_directory_equals_upstream(ray_cluster, tmp_path):
    out = tmp_path / "emb"
    assert main_embed(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(out),
                       "--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_hybrid.pt"), "--upstream_batching"]) == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["smiles"] == SMILES and all(meta["valid"]) and meta["n_molecules"] == 26
    assert meta["embedding_types"] == ["atom_from_atom", "atom_from_bond", "bond_from_atom", "bond_from_bond",
                                       "projected"]
    for family in meta["embedding_types"]:
        np.testing.assert_allclose(np.load(out / f"{family}.npy"), OUTPUTS[f"pt_hybrid_extract_embeddings_{family}"],
                                   rtol=0, atol=PARITY)


def test_upstream_no_features_scaling_flag_is_accepted_only_where_true(tmp_path, capsys):
    import dataclasses

    from kermt.checkpoint import load_finetune_model, read_checkpoint, save_native
    from kermt.data.scalers import StandardScaler

    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_reg.pt")
    model, _ = load_finetune_model(checkpoint)
    scaler = StandardScaler(np.zeros(200), np.ones(200))
    save_native(tmp_path / "scaled", model.state_dict(), dataclasses.replace(checkpoint.spec, features_scaler=scaler))
    code = main_predict(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(tmp_path / "p.csv"),
                         "--checkpoint_path", str(tmp_path / "scaled"), "--no_features_scaling"])
    assert code == 2 and "--no_features_scaling contradicts" in capsys.readouterr().err


def _zero_padding_copy(directory):
    """The fixture classifier saved natively with zero padding (its numbers never depend on the width)."""
    import dataclasses

    from kermt.checkpoint import read_checkpoint, save_native

    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_cls.pt")
    spec = dataclasses.replace(checkpoint.spec, encoder=dataclasses.replace(checkpoint.spec.encoder, padding="zero"))
    return save_native(directory, checkpoint.state_dict, spec, passthrough=checkpoint.passthrough)


@pytest.mark.parametrize("padding", ["upstream", pytest.param("zero", marks=pytest.mark.slow)])
def test_a_molecules_number_is_the_same_for_any_batch_size_order_or_actor_count(ray_cluster, tmp_path, padding):
    """Issue 36's contract end to end: batch size 1 on 2 actors, and 32 on 1 actor with the input reversed, give each
    molecule the same numbers (1e-6); upstream's own batching of the same file does not (the test can fail)."""
    model = FIXTURE_DIR / "ckpt_ft_cls.pt" if padding == "upstream" else _zero_padding_copy(tmp_path / "zero")
    rows = SMILES + INVALID[:1]
    pd.DataFrame({"smiles": rows}).to_csv(tmp_path / "in.csv", index=False)
    pd.DataFrame({"smiles": rows[::-1]}).to_csv(tmp_path / "reversed.csv", index=False)
    outputs = []
    for data, batch, actors in (("in.csv", "1", "2"), ("reversed.csv", "32", "1")):
        assert main_predict(["--data_path", str(tmp_path / data), "--output_path", str(tmp_path / f"{data}.parquet"),
                             "--checkpoint_path", str(model), "--batch_size", batch, "--concurrency", actors]) == 0
        outputs.append(pd.read_parquet(tmp_path / f"{data}.parquet").set_index("smiles")[["c1", "c2"]])
    single, reversed_batched = outputs[0], outputs[1].loc[rows]
    np.testing.assert_allclose(single.to_numpy(float), reversed_batched.to_numpy(float), rtol=0, atol=1e-6,
                               equal_nan=True)
    if padding == "upstream":
        upstream = Ensemble(read_members([model]), upstream_batching=True).predict(featurize_smiles(SMILES[::-1]), 32)
        assert np.abs(upstream.mean[::-1] - single.to_numpy(float)[:-1]).max() > 1e-4
