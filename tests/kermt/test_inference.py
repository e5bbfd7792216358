"""kermt.inference without Ray: upstream parity, the batch rule, ensembles, feature checks, checkpoint discovery."""

from __future__ import annotations

import shutil
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from kermt.checkpoint import (export_upstream, load_finetune_model, read_checkpoint, save_native,
                              unbuilt_encoder_tensors)
from kermt.checkpoint.spec import FeatureSettings
from kermt.data.featurize import featurize_smiles
from kermt.errors import UserError
from kermt.inference import (Embedder, Ensemble, FeatureMismatchError, find_checkpoints, valid_batches,
                             plan_features, read_members)
from tests.conftest import FIXTURE_DIR

OUTPUTS = np.load(FIXTURE_DIR / "outputs.npz")
SMILES = pd.read_csv(FIXTURE_DIR / "smiles.csv")["smiles"].tolist()
PARITY = 1e-5


@lru_cache(maxsize=None)
def featurized(generator: tuple[str, ...] = ()):
    return featurize_smiles(SMILES, generator)


def perturbed_member(source: Path, directory: Path, seed: int = 1, scale: float = 0.05) -> Path:
    """A second ensemble member laid out as `kermt finetune` writes it: model/ (native) + model.pt (export)."""
    checkpoint = read_checkpoint(source)
    model, _ = load_finetune_model(checkpoint)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
    passthrough = unbuilt_encoder_tensors(checkpoint)
    save_native(directory / "model", model.state_dict(), checkpoint.spec, passthrough=passthrough)
    export_upstream(directory / "model.pt", model.state_dict(), checkpoint.spec, passthrough=passthrough)
    return directory / "model"


def ensemble_dir(root: Path, name: str = "ckpt_ft_reg.pt") -> Path:
    """fold_0/model_0/model.pt (upstream file), fold_0/model_1/{model/, model.pt}, plus files that must be skipped."""
    (root / "fold_0" / "model_0").mkdir(parents=True)
    shutil.copy(FIXTURE_DIR / name, root / "fold_0" / "model_0" / "model.pt")
    shutil.copy(FIXTURE_DIR / name, root / "fold_0" / "model_0" / "last_checkpoint.pt")
    perturbed_member(FIXTURE_DIR / name, root / "fold_0" / "model_1")
    return root


@pytest.mark.parametrize("name", ["ft_reg", "ft_reg_ts", "ft_cls"])
def test_single_model_predictions_equal_upstream(name):
    members = read_members([FIXTURE_DIR / f"ckpt_{name}.pt"])
    plan = plan_features([m.spec for m in members])
    # one batch of 26, as upstream; upstream_batching: the batch's own width, upstream's numbers
    prediction = Ensemble(members, upstream_batching=True).predict(featurized(plan.generator), batch_size=32)
    expected = OUTPUTS[f"{name}_final_prediction" if name != "ft_cls" else f"{name}_model_output"]
    np.testing.assert_allclose(prediction.mean, expected, rtol=0, atol=PARITY)
    np.testing.assert_array_equal(prediction.std, np.zeros_like(expected))


def test_upstream_batching_batches_consecutive_rows_and_invalid_rows_stay_empty():
    members = read_members([FIXTURE_DIR / "ckpt_ft_cls.pt"])
    ensemble = Ensemble(members, upstream_batching=True)
    smiles = SMILES[:7] + ["not a smiles", ""] + SMILES[7:12]
    molecules = featurize_smiles(smiles)
    got = ensemble.predict(molecules, batch_size=4).mean
    assert np.isnan(got[[7, 8]]).all() and not np.isnan(np.delete(got, [7, 8], axis=0)).any()
    for start in range(0, len(smiles), 4):  # batch = the valid rows among rows [start, start + 4)
        rows = [r for r in range(start, min(start + 4, len(smiles))) if r not in (7, 8)]
        alone = ensemble.member_predictions(molecules.select(rows))[0]
        np.testing.assert_array_equal(got[rows], alone)
    # batch composition matters (upstream's padding row): one big batch gives (slightly) different numbers
    assert not np.array_equal(got, ensemble.predict(molecules, batch_size=64).mean)


# beside the sample: a single atom (degree 0), a quaternary carbon and a sulfonic acid (degree 4), sulfur hexafluoride
# (degree 6, wider than the reference width), an invalid row
CONTRACT_SMILES = SMILES + ["C", "CC(C)(C)C", "O=S(=O)(O)c1ccccc1", "FS(F)(F)(F)(F)F", "not a smiles"]


@pytest.mark.parametrize("name", ["ckpt_ft_cls.pt", "ckpt_ft_reg_ts.pt"])
def test_a_molecules_number_depends_on_the_molecule_and_the_model_only(name):
    """Upstream padding: batch size, order and batch-mates change nothing; each molecule is computed at
    max(its largest degree, W), as it would be alone."""
    members = read_members([FIXTURE_DIR / name])
    generator = plan_features([m.spec for m in members]).generator
    ensemble = Ensemble(members)
    molecules = featurize_smiles(CONTRACT_SMILES, generator)
    reference = ensemble.predict(molecules, 32).mean
    reverse = np.arange(len(molecules))[::-1]
    for got in (ensemble.predict(molecules, 1).mean, ensemble.predict(molecules, 5).mean,
                ensemble.predict(molecules.select(reverse), 32).mean[reverse]):
        np.testing.assert_allclose(got, reference, rtol=0, atol=1e-6)
    assert np.isnan(reference[-1]).all() and not np.isnan(reference[:-1]).any()
    alone = np.concatenate([ensemble.member_predictions(molecules.select([row]))[0] for row in range(len(SMILES))])
    np.testing.assert_allclose(alone, reference[:len(SMILES)], rtol=0, atol=1e-6)
    # the test can fail: upstream's batching of the same rows moves them
    upstream = Ensemble(members, upstream_batching=True).predict(molecules, 1).mean
    assert np.nanmax(np.abs(upstream - reference)) > 1e-3
    # W is the model's: another reference width is another function
    wider = Ensemble(members, reference_width=6).predict(molecules, 32).mean
    assert np.nanmax(np.abs(wider - reference)) > 1e-3


def test_the_reference_width_is_the_models_record_or_the_default():
    from dataclasses import replace

    from kermt.inference.widths import DEFAULT_REFERENCE_WIDTH, width_rule

    spec = _spec("ckpt_ft_cls.pt")
    assert width_rule([spec]).reference_width == DEFAULT_REFERENCE_WIDTH  # upstream's file records none
    assert width_rule([replace(spec, reference_width=3), replace(spec, reference_width=5)]).reference_width == 5
    assert width_rule([spec], reference_width=2).reference_width == 2
    zero = replace(spec, encoder=replace(spec.encoder, padding="zero"))
    assert width_rule([zero], reference_width=2).reference_width is None
    with pytest.raises(UserError, match="--reference_width must be >= 1"):
        width_rule([spec], reference_width=0)
    with pytest.raises(UserError, match="disagree on padding"):
        width_rule([spec, zero])


def test_ensemble_mean_and_std_use_each_members_own_scalers(tmp_path):
    paths = find_checkpoints(ensemble_dir(tmp_path))
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == ["fold_0/model_0/model.pt", "fold_0/model_1/model"]
    members = read_members(paths)
    molecules = featurized(("rdkit_2d_normalized",))
    singles = [Ensemble([m], upstream_batching=True).predict(molecules, 32).mean for m in members]
    together = Ensemble(members, upstream_batching=True).predict(molecules, 32)
    np.testing.assert_allclose(singles[0], OUTPUTS["ft_reg_final_prediction"], rtol=0, atol=PARITY)
    np.testing.assert_allclose(together.mean, (singles[0] + singles[1]) / 2, rtol=0, atol=1e-12)
    np.testing.assert_allclose(together.std, np.abs(singles[0] - singles[1]) / 2, rtol=0, atol=1e-12)
    assert np.abs(singles[0] - singles[1]).min() > 0


def test_find_checkpoints_natural_order_and_errors(tmp_path):
    for fold in (10, 2):
        (tmp_path / f"fold_{fold}").mkdir()
        (tmp_path / f"fold_{fold}" / "model.pt").write_bytes(b"")
    (tmp_path / "fold_2" / "training_state.pt").write_bytes(b"")
    assert [p.parent.name for p in find_checkpoints(tmp_path)] == ["fold_2", "fold_10"]
    with pytest.raises(UserError, match="no checkpoint under"):
        find_checkpoints(_empty(tmp_path))


def test_find_checkpoints_refuses_a_sweep_and_an_unfinished_run(tmp_path):
    sweep = tmp_path / "sweep"
    (sweep / "trials" / "a").mkdir(parents=True)
    (sweep / "trials" / "a" / "model.pt").write_bytes(b"")
    (sweep / "tune_config.yaml").write_text("n_trials: 2\n")
    with pytest.raises(UserError, match="is a `kermt tune` sweep: .* --checkpoint_path .*best_model"):
        find_checkpoints(sweep)
    run = tmp_path / "run"
    (run / "fold_0" / "model_0").mkdir(parents=True)
    (run / "run_state.json").write_text('{"run_id": "r2", "settings": {}}')
    (run / "run.json").write_text('{"summary": {"run_id": "r1"}}')  # the earlier run's record
    with pytest.raises(UserError, match="its run r2 has not finished"):
        find_checkpoints(run)


def _empty(root: Path) -> Path:
    (root / "empty").mkdir()
    return root / "empty"


def _spec(name: str):
    return read_checkpoint(FIXTURE_DIR / name).spec


def test_feature_plan_defaults_to_the_checkpoint_and_refuses_mismatches():
    reg, cls = _spec("ckpt_ft_reg.pt"), _spec("ckpt_ft_cls.pt")
    plan = plan_features([reg])
    assert (plan.generator, plan.width, plan.from_file) == (("rdkit_2d_normalized",), 200, False)
    assert "rdkit_2d_normalized" in plan.note
    assert plan_features([reg], ["rdkit_2d_normalized"]).note is None
    assert plan_features([reg], features_path_width=200).from_file
    assert plan_features([cls]).width == 0
    expects = r"expects --features_generator rdkit_2d_normalized \(200 features\)"
    with pytest.raises(FeatureMismatchError, match=r"--features_generator morgan does not match.*" + expects):
        plan_features([reg], ["morgan"])
    with pytest.raises(FeatureMismatchError, match=r"--features_generator \(none\) does not match.*" + expects):
        plan_features([reg], [])
    with pytest.raises(FeatureMismatchError, match=r"--features_path has 100 features.*" + expects):
        plan_features([reg], features_path_width=100)
    with pytest.raises(FeatureMismatchError, match="expects no molecule features"):
        plan_features([cls], ["rdkit_2d_normalized"])
    with pytest.raises(FeatureMismatchError, match="different molecule features"):
        plan_features([reg, cls])


def test_feature_plan_for_precomputed_and_cuik_features():
    import dataclasses

    reg = _spec("ckpt_ft_reg.pt")
    from_file = dataclasses.replace(reg, features=FeatureSettings((), False))
    with pytest.raises(FeatureMismatchError, match=r"expects 200 precomputed features.*--features_path"):
        plan_features([from_file])
    cuik = dataclasses.replace(reg, features=FeatureSettings(("rdkit_2d_normalized",), False, "fast", True))
    with pytest.raises(FeatureMismatchError, match="cuik-molmaker"):
        plan_features([cuik])


def test_pretraining_checkpoints_are_refused_as_predictors():
    with pytest.raises(ValueError, match="use `kermt fingerprint` or `kermt embed`"):
        read_members([FIXTURE_DIR / "ckpt_pretrain_vocab.pt"])


@pytest.mark.parametrize("name,key", [("ckpt_pretrain_vocab.pt", "pt_vocab"), ("ckpt_pretrain_hybrid.pt", "pt_hybrid"),
                                      ("ckpt_ft_reg.pt", "ft_reg")])
def test_fingerprints_equal_upstream(name, key):
    embedder = Embedder(read_checkpoint(FIXTURE_DIR / name), upstream_batching=True)
    [(rows, outputs)] = embedder.outputs(featurized(), 32, "both")  # one batch of 26, as upstream
    fps = outputs["fps"]
    np.testing.assert_array_equal(rows, np.arange(len(SMILES)))
    np.testing.assert_allclose(fps, OUTPUTS[f"{key}_fingerprint_both"], rtol=0, atol=PARITY)
    atom = embedder.fingerprints(featurized(), "atom")
    np.testing.assert_array_equal(atom, fps[:, : atom.shape[1]])


def test_outputs_of_many_batches_are_each_batchs_own():
    """``outputs`` reads batch k back after launching batch k + 1: each batch must still get its own rows'
    values, as one batch at a time gives them."""
    embedder = Embedder(read_checkpoint(FIXTURE_DIR / "ckpt_pretrain_hybrid.pt"), upstream_batching=True)
    molecules = featurize_smiles(SMILES[:7] + ["not a smiles"] + SMILES[7:20])
    batches = embedder.outputs(molecules, 6, None)
    expected = list(valid_batches(molecules, 6))
    assert [len(rows) for rows, _ in batches] == [6, 5, 6, 3]  # the invalid row 7 is left out of the second
    for (rows, got), (expected_rows, part) in zip(batches, expected, strict=True):
        np.testing.assert_array_equal(rows, expected_rows)
        for name, values in embedder.embeddings(part).items():
            np.testing.assert_array_equal(got[name], values)


@pytest.mark.parametrize("name,key", [("ckpt_pretrain_vocab.pt", "pt_vocab"), ("ckpt_pretrain_hybrid.pt", "pt_hybrid")])
def test_embeddings_of_canonical_smiles_equal_upstream(name, key):
    from rdkit import Chem

    embedder = Embedder(read_checkpoint(FIXTURE_DIR / name), upstream_batching=True)
    canonical = [Chem.MolToSmiles(Chem.MolFromSmiles(s)) for s in SMILES]
    got = embedder.embeddings(featurize_smiles(canonical))
    expected = {k.split("_extract_embeddings_")[1] for k in OUTPUTS.files if k.startswith(f"{key}_extract_embeddings_")}
    assert set(got) == expected  # four families, + projected for the hybrid checkpoint
    for family, values in got.items():
        np.testing.assert_allclose(values, OUTPUTS[f"{key}_extract_embeddings_{family}"], rtol=0, atol=PARITY)


def test_finetuned_model_without_bond_branches_offers_atom_fingerprints_only(tmp_path):
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_cls.pt")
    model, _ = load_finetune_model(checkpoint)
    save_native(tmp_path / "model", model.state_dict(), checkpoint.spec)  # no passthrough: atom branches only
    embedder = Embedder(read_checkpoint(tmp_path / "model"))
    assert embedder.families == ("atom_from_atom", "atom_from_bond")
    embedder.check_source("atom")
    with pytest.raises(ValueError, match="is a finetuned model: .*--fingerprint_source atom"):
        embedder.check_source("both")
    full = Embedder(checkpoint).fingerprints(featurized(), "atom")
    np.testing.assert_array_equal(embedder.fingerprints(featurized(), "atom"), full)
