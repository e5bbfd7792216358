"""`kermt pretrain` on the local Ray cluster: its files and report; a 2-worker run that loses a worker and stops,
re-run with the same command on 1 worker, ends with the weights of an uninterrupted 1-worker run with the same global
batch (slow lane); `kermt finetune` and `kermt embed` take the model.pt it writes."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from rdkit import Chem

from kermt.checkpoint import load_native, load_pretrain_model, read_checkpoint
from kermt.chem.molgraph import build_graphs
from kermt.data.collate import collate_graphs
from kermt.data.corpus_prep import prepare_corpus
from ray_app.cli import main as kermt
from tests.browser import console_errors, headless_chromium, keep_screenshot, rendered_images, requires_browser
from tests.conftest import DATA_DIR, FIXTURE_DIR

ROOT = DATA_DIR.parents[1]

# Encoder dropout 0.1, drawn per molecule from (seed, global step, molecule): the same masks whoever runs a step.
# What remains between a run on 2 workers x 8 and one on 1 x 16 is float summation order, which 14 Adam steps (lr up
# to 1e-3) grow to 2.6e-5 in the compared tensors (measured: an uninterrupted 2 x 8 run and the killed-and-rerun
# one differ from the 1 x 16 run by the same 2.6e-5, median 1e-7; with --dropout_draws torch by 9e-3, median 2.5e-3).
# Parameters whose exact gradient is ~0 are not compared: the attention key projection (softmax ignores any
# per-query shift of the keys) and cross-attention to one memory token; Adam turns float noise into lr-sized
# steps there (5e-4). tests/kermt/pretrain/test_step.py holds 1e-6 over 6 steps without Ray.
NULL_GRADIENT = ("attn.linear_layers.1.", "cross_attn_q.", "cross_attn_k.")
TINY = ["--pretrain_mode", "hybrid", "--hidden_size", "16", "--depth", "2", "--num_attn_head", "2", "--latent_dim",
        "16", "--decoder_num_layers", "1", "--decoder_num_attention_heads", "2", "--decoder_ffn_hidden_size", "32",
        "--decoder_dropout", "0", "--dropout", "0.1", "--epochs", "2", "--save_interval", "3", "--train_interval", "3",
        "--seed", "3", "--shuffle_window", "2"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """100 molecules of the sample data, prepared in-process (the format `kermt corpus` writes) in 4 shards (30,
    30, 30, 10 molecules): with --shuffle_window 2 an epoch reads 2 windows and some global batches span both."""
    with open(ROOT / "data/sample/admet_demo.csv", newline="") as f:
        smiles = [row["smiles"] for row in csv.DictReader(f)][:100]
    path = tmp_path_factory.mktemp("corpus") / "corpus"
    prepare_corpus({"admet_demo": smiles}, str(path), rows_per_shard=30)
    return path


def _pretrain(corpus: Path, save_dir: Path, *flags: str) -> dict[str, torch.Tensor]:
    assert kermt(["pretrain", "--data_path", str(corpus), "--save_dir", str(save_dir), *TINY, *flags]) == 0
    return load_native(save_dir / "model").state_dict


@pytest.fixture(scope="module")
def reference(ray_cluster, corpus, tmp_path_factory) -> Path:
    """One worker, global batch 16, uninterrupted: 99 training molecules -> 7 steps per epoch, the last of 3."""
    save_dir = tmp_path_factory.mktemp("one") / "run"
    _pretrain(corpus, save_dir, "--batch_size", "16", "--tensorboard")
    return save_dir


def _assert_same_weights(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> None:
    assert expected.keys() == actual.keys()
    differences = [float((actual[name] - value).abs().max()) for name, value in expected.items()]
    assert np.median(differences) < 1e-6  # most agree to float rounding (torch draws per rank: 2.5e-3)
    for name, value in expected.items():
        if not any(part in name for part in NULL_GRADIENT):
            torch.testing.assert_close(actual[name], value, rtol=0, atol=5e-5, msg=name)


def test_outputs(reference):
    assert read_checkpoint(reference / "model.pt").spec.kind == "hybrid"
    rows = list(csv.DictReader(open(reference / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [3, 6, 7, 9, 12, 14]  # every 3 steps and at each epoch end
    assert {"train_av", "train_bv", "train_fg", "train_cmim", "train_recon", "train_recon_accuracy",
            "val_loss"} <= rows[-1].keys()
    assert list(reference.glob("events.out.tfevents.*"))


@requires_browser
def test_the_report_draws_every_loss_term_accuracy_and_the_throughput(reference):
    """report.html, written as the run ended, opened in headless Chromium: the loss terms, the token accuracies,
    the learning rate and molecules/s each a figure that decodes, no console error; screenshot kept."""
    page = (reference / "report.html").read_text()
    with headless_chromium() as driver:
        driver.get((reference / "report.html").as_uri())
        images = rendered_images(driver)
        assert console_errors(driver) == []
        screenshot = keep_screenshot(driver, "pretrain_report")
    assert len(images) == 3
    assert all(i["kind"] == "img" and i["complete"] and i["natural"] > 0 and i["width"] > 0 for i in images)
    for shown in ("every loss term against the step", "token accuracies", "molecules/s (median)", "recon_accuracy",
                  "atom vocabulary", "history read from</td><td>metrics.csv", "status</td><td>finished"):
        assert shown in page, shown
    assert screenshot.stat().st_size > 50_000


def test_the_report_of_a_stopped_run_reads_its_newest_step_checkpoint(reference, tmp_path):
    """A run stopped (Ctrl-C) before its end has no metrics.csv or run.json: `kermt report` reads the history of
    its newest step checkpoint under ray_results/ (the resume point): the same rows up to that step."""
    stopped = shutil.copytree(reference, tmp_path / "run", ignore=shutil.ignore_patterns("model*", "events.*"))
    (stopped / "metrics.csv").unlink()
    (stopped / "run.json").unlink()
    assert kermt(["report", str(stopped)]) == 0
    page = (stopped / "report.html").read_text()
    assert "the newest step checkpoint: the run did not finish" in page
    assert "last logged step</td><td>14" in page
    assert page.count('<img src="data:image/png') == 3


def _kill_a_worker_after_a_checkpoint(storage: Path, done: threading.Event, killed: list) -> None:
    import ray
    from ray.util.state import list_actors

    # this test's cluster by address: with another Ray instance on the machine, an address-less call refuses to pick
    address = ray.get_runtime_context().gcs_address
    while not done.is_set():
        if list(storage.glob("*/checkpoint_*")):
            workers = list_actors(address=address,
                                  filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
            if workers:
                os.kill(max(int(w.pid) for w in workers), signal.SIGKILL)
                killed.append(True)
                return
        time.sleep(0.05)


# Runs with -m slow: its parts are in lanes CI runs. A pretraining run that loses workers and resumes from its
# checkpoint to the uninterrupted run's weights is the multi-node lane's (tests/multinode/test_pretrain_cluster.py,
# a node killed mid-run); 2 ranks x 8 equal to 1 x 16 step for step is tests/kermt/pretrain/test_step.py's (gloo, no
# Ray); a run resumed on fewer workers is the multi-node lane's elastic finetune.
@pytest.mark.slow
def test_two_workers_killed_stopped_and_rerun_on_one_equal_the_uninterrupted_run(reference, corpus, tmp_path):
    """2 workers x 8 lose a worker (SIGKILL) after their first checkpoint, Ray Train restarts them from it; the
    run stops after step 10; the same command re-run with 1 worker x 16 (same global batch) continues to the end.
    Every piece is exact, so the weights are the uninterrupted 1-worker run's."""
    save_dir = tmp_path / "run"
    done, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_a_worker_after_a_checkpoint, args=(save_dir / "ray_results", done, killed),
                              daemon=True)
    killer.start()
    try:
        stopped = _pretrain(corpus, save_dir, "--batch_size", "8", "--num_workers", "2", "--max_failures", "1",
                            "--stop_after_steps", "10")
    finally:
        done.set()
        killer.join(timeout=5)
    assert killed, "no worker was killed"
    expected = load_native(reference / "model").state_dict
    assert any(not torch.equal(stopped[k], v) for k, v in expected.items())  # step 10 of 14
    _assert_same_weights(expected, _pretrain(corpus, save_dir, "--batch_size", "16", "--num_workers", "1"))


def test_the_model_directory_holds_every_vocab_it_was_trained_with(reference, corpus, tmp_path):
    """Beside model.pt (and model/) lie the corpus's vocabularies under the release's names, and the corpus record;
    `kermt reconstruct` plans a run on either checkpoint with no --smiles_vocab_path."""
    from kermt.chem.vocab_context import ContextVocab
    from kermt.chem.vocab_smiles import SmilesVocab
    from kermt.data.corpus import open_corpus
    from kermt.pretrain.export import read_corpus_record
    from ray_app.screening.config import ReconstructConfig
    from ray_app.screening.reconstruct import plan_reconstruct

    prepared = open_corpus(str(corpus))
    assert ContextVocab.load(reference / "pretrain_atom_vocab.json").itos == prepared.atom_vocab.itos
    assert ContextVocab.load(reference / "pretrain_bond_vocab.json").itos == prepared.bond_vocab.itos
    assert SmilesVocab.load(reference / "pretrain_smiles_vocab.json").itos == prepared.smiles_vocab.itos
    assert read_corpus_record(reference / "model.pt") == str(corpus.resolve())
    (tmp_path / "in.csv").write_text("smiles\nCCO\n")
    for checkpoint in ("model.pt", "model"):
        config = ReconstructConfig(data_path=str(tmp_path / "in.csv"), output_path=str(tmp_path / "out.csv"),
                                   checkpoint_path=str(reference / checkpoint))
        plan = plan_reconstruct(config)
        assert plan.vocab.itos == prepared.smiles_vocab.itos


def test_finetune_starts_from_the_pretrained_model_pt(reference, tmp_path):
    pretrained = load_native(reference / "model").state_dict
    assert kermt(["finetune", "--data_path", str(FIXTURE_DIR / "smiles.csv"), "--checkpoint_path",
                  str(reference / "model.pt"), "--epochs", "1", "--fine_tune_coff", "0", "--dataset_type",
                  "regression", "--save_dir", str(tmp_path / "ft")]) == 0
    finetuned = load_native(tmp_path / "ft" / "fold_0" / "model_0" / "model").state_dict
    encoder = [k for k in finetuned if k.startswith("kermt.")]
    assert encoder and all(torch.equal(finetuned[k], pretrained[k]) for k in encoder)  # frozen: exactly the same


def test_embed_reads_the_pretrained_model_pt(reference, tmp_path):
    """`kermt embed` on model.pt gives the latent means of the native model computed here (one batch of 26, collated
    at its own width: --upstream_batching)."""
    with open(FIXTURE_DIR / "smiles.csv", newline="") as f:
        smiles = [row["smiles"] for row in csv.DictReader(f)]
    assert kermt(["embed", "--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(tmp_path / "emb"),
                  "--checkpoint_path", str(reference / "model.pt"), "--batch_size", "64", "--upstream_batching"]) == 0
    model, _ = load_pretrain_model(read_checkpoint(reference / "model"))
    graphs, errors = build_graphs([Chem.MolFromSmiles(s) for s in smiles])
    assert not any(errors)
    with torch.no_grad():
        expected = model.eval().latent_dist(collate_graphs(graphs)).mean.numpy()
    np.testing.assert_allclose(np.load(tmp_path / "emb" / "projected.npy"), expected, rtol=0, atol=1e-5)


# Runs with -m slow: a bf16 pretraining step against the fp32 one is tests/kermt/pretrain/test_step.py's (no Ray),
# as is the GPU lane's bf16 pretraining step on CUDA (tests/gpu/test_pipelines.py)
@pytest.mark.slow
def test_bf16_pretraining_logs_the_fp32_run_s_losses(reference, corpus, tmp_path):
    """`--precision bf16` end to end: the same run as the reference with every forward under bf16 autocast logs the
    same losses to bf16's precision (measured: within 3e-4 relative over the 14 steps; bound 1e-2, as
    tests/kermt/pretrain/test_step.py's per step)."""
    weights = _pretrain(corpus, tmp_path / "bf16", "--batch_size", "16", "--precision", "bf16")
    fp32 = list(csv.DictReader(open(reference / "metrics.csv")))
    bf16 = list(csv.DictReader(open(tmp_path / "bf16" / "metrics.csv")))
    assert [r["step"] for r in bf16] == [r["step"] for r in fp32]
    for ours, theirs in zip(bf16, fp32):
        for name in ("train_loss", "val_loss"):
            if theirs.get(name):
                assert float(ours[name]) == pytest.approx(float(theirs[name]), rel=1e-2), (ours["step"], name)
    assert all(torch.isfinite(value).all() for value in weights.values())
    assert any(float(ours["train_loss"]) != float(theirs["train_loss"]) for ours, theirs in zip(bf16, fp32))


@pytest.mark.slow
def test_two_workers_log_the_one_worker_losses_step_for_step(reference, corpus, tmp_path):
    """2 workers x 8, uninterrupted, each reading the shards of every global batch itself: the losses logged at
    steps 3, 6 and 7 (the epoch end, with validation) are the 1 x 16 reference's, whose batches span the corpus's
    two shuffle windows. The same seed drew the same batches in both runs, or the losses would differ by far more
    than float summation order."""
    _pretrain(corpus, tmp_path / "two", "--batch_size", "8", "--num_workers", "2", "--stop_after_steps", "7")
    one = {r["step"]: r for r in csv.DictReader(open(reference / "metrics.csv"))}
    two = list(csv.DictReader(open(tmp_path / "two" / "metrics.csv")))
    assert [r["step"] for r in two] == ["3", "6", "7"]
    for row in two:
        for name in ("train_loss", "train_av", "train_cmim", "train_recon", "val_loss"):
            if one[row["step"]].get(name):
                assert float(row[name]) == pytest.approx(float(one[row["step"]][name]), rel=1e-5, abs=1e-6), \
                    (row["step"], name)
