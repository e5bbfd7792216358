"""`kermt pretrain` on the local Ray cluster: 2 workers equal 1 worker with the double batch, a stopped run re-run
with the same command and a run that loses a worker both end with the uninterrupted run's weights, and
`kermt finetune` starts from the model.pt it writes."""

from __future__ import annotations

import csv
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from kermt.checkpoint import load_native, read_checkpoint
from kermt.data.corpus_prep import prepare_corpus
from ray_app.cli import main as kermt
from tests.conftest import DATA_DIR, FIXTURE_DIR

ROOT = DATA_DIR.parents[1]

# Parameters whose exact gradient is 0 (attention key bias; cross-attention to one memory token): Adam turns float
# noise into lr-sized steps there, so they are not compared (tests/kermt/pretrain/test_step.py checks the same).
# Elsewhere 14 Adam steps (lr up to 1e-3) grow float noise to a few 1e-6 in parameters with tiny gradients, as in
# the finetune test (docs/numerics.md#parity-tolerances); the 6-step kermt test holds 1e-6.
NULL_GRADIENT = ("attn.linear_layers.1.bias", "cross_attn_q.", "cross_attn_k.")
TINY = ["--pretrain_mode", "hybrid", "--hidden_size", "16", "--depth", "2", "--num_attn_head", "2", "--latent_dim",
        "16", "--decoder_num_layers", "1", "--decoder_num_attention_heads", "2", "--decoder_ffn_hidden_size", "32",
        "--decoder_dropout", "0", "--epochs", "2", "--save_interval", "3", "--train_interval", "3", "--seed", "3"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """100 molecules of the sample data, prepared in-process (the format `kermt corpus` writes)."""
    with open(ROOT / "data/sample/admet_demo.csv", newline="") as f:
        smiles = [row["smiles"] for row in csv.DictReader(f)][:100]
    path = tmp_path_factory.mktemp("corpus") / "corpus"
    prepare_corpus({"admet_demo": smiles}, str(path))
    return path


def _pretrain(corpus: Path, save_dir: Path, *flags: str) -> dict[str, torch.Tensor]:
    assert kermt(["pretrain", "--data_path", str(corpus), "--save_dir", str(save_dir), *TINY, *flags]) == 0
    return load_native(save_dir / "model").state_dict


@pytest.fixture(scope="module")
def reference(ray_cluster, corpus, tmp_path_factory) -> dict[str, torch.Tensor]:
    """One worker, global batch 16: 99 training molecules -> 7 steps per epoch, the last of 3 molecules."""
    return _pretrain(corpus, tmp_path_factory.mktemp("one") / "run", "--batch_size", "16")


def _assert_same_weights(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> None:
    assert expected.keys() == actual.keys()
    for name, value in expected.items():
        if not any(part in name for part in NULL_GRADIENT):
            torch.testing.assert_close(actual[name], value, rtol=0, atol=1e-5, msg=name)


def test_two_workers_equal_one_worker_with_double_batch(reference, corpus, tmp_path):
    # global batch 16 = 2 x 8: the tail batch of 3 is split 2 + 1
    _assert_same_weights(reference, _pretrain(corpus, tmp_path / "two", "--batch_size", "8", "--num_workers", "2"))
    rows = list(csv.DictReader(open(tmp_path / "two" / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [3, 6, 7, 9, 12, 14]  # every 3 steps and at each epoch end
    assert {"train_av", "train_bv", "train_fg", "train_cmim", "train_recon", "train_recon_accuracy",
            "val_loss"} <= rows[-1].keys()


def test_same_command_rerun_continues_the_stopped_run_exactly(reference, corpus, tmp_path):
    save_dir = tmp_path / "run"
    stopped = _pretrain(corpus, save_dir, "--batch_size", "16", "--stop_after_steps", "5")  # mid-epoch 0
    assert any(not torch.equal(stopped[k], v) for k, v in reference.items())
    _assert_same_weights(reference, _pretrain(corpus, save_dir, "--batch_size", "16"))


def _kill_a_worker_after_a_checkpoint(storage: Path, done: threading.Event, killed: list) -> None:
    import ray
    from ray.util.state import list_actors

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


def test_killed_worker_resumes_mid_epoch_with_the_same_result(reference, corpus, tmp_path):
    done, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_a_worker_after_a_checkpoint,
                              args=(tmp_path / "run" / "ray_results", done, killed), daemon=True)
    killer.start()
    try:
        resumed = _pretrain(corpus, tmp_path / "run", "--batch_size", "8", "--num_workers", "2",
                            "--max_failures", "1")
    finally:
        done.set()
        killer.join(timeout=5)
    assert killed, "no worker was killed"
    _assert_same_weights(reference, resumed)


def test_finetune_starts_from_the_pretrained_model_pt(reference, corpus, tmp_path):
    model_pt = tmp_path / "pre" / "model.pt"
    _pretrain(corpus, tmp_path / "pre", "--batch_size", "16", "--epochs", "1")
    assert read_checkpoint(model_pt).spec.kind == "hybrid"
    pretrained = load_native(tmp_path / "pre" / "model").state_dict
    assert kermt(["finetune", "--data_path", str(FIXTURE_DIR / "smiles.csv"), "--checkpoint_path",
                  str(model_pt), "--epochs", "1", "--fine_tune_coff", "0", "--dataset_type", "regression",
                  "--save_dir", str(tmp_path / "ft")]) == 0
    finetuned = load_native(tmp_path / "ft" / "fold_0" / "model_0" / "model").state_dict
    encoder = [k for k in finetuned if k.startswith("kermt.")]
    assert encoder and all(torch.equal(finetuned[k], pretrained[k]) for k in encoder)  # frozen: exactly the same
