"""Pretraining on the documented cluster layout (0-CPU head, worker nodes with private disks, S3): the corpus is
prepared from a CSV in the bucket into the bucket (3 shards) by tasks on the worker nodes, each training worker reads
the shards of its batches from the bucket itself, and a 2-worker pretraining run that loses one training node mid-run
resumes from its S3 checkpoint on a replacement node with the weights of an uninterrupted run. Run with
``pytest -m multinode``."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from kermt.checkpoint import load_native
from tests.multinode.conftest import ROOT, run_driver, s3

pytestmark = pytest.mark.multinode

# A tiny hybrid model, no dropout anywhere, 6 epochs (by default) of 59 training molecules (global batch 16: 4 steps per
# epoch), a checkpoint every 2 steps: the kill lands after the first of a dozen checkpoints.
TINY = ["--pretrain_mode", "hybrid", "--hidden_size", "16", "--depth", "2", "--num_attn_head", "2", "--latent_dim",
        "16", "--decoder_num_layers", "1", "--decoder_num_attention_heads", "2", "--decoder_ffn_hidden_size", "32",
        "--decoder_dropout", "0", "--save_interval", "2", "--train_interval", "2", "--seed", "5",
        "--batch_size", "8", "--num_workers", "2", "--shuffle_window", "2"]
# Tensors with an exactly-zero or tiny gradient where Adam turns float noise into lr-sized steps (as in
# tests/ray_app/pretrain/test_pretrain.py); every other tensor is compared at 1e-5.
NOISY = ("attn.linear_layers.1.", "cross_attn_q.", "cross_attn_k.")


@pytest.fixture(scope="module")
def corpus_uri(cluster) -> str:
    """`kermt corpus` from s3://.../in/demo.csv to s3://.../corpus in shards of 20 molecules, run as a driver on
    the head."""
    with open(ROOT / "data/sample/admet_demo.csv", "rb") as f:
        head = b"".join(f.readlines()[:61])  # header + 60 molecules
    source = "kermt-test/pretrain-in/demo.csv"
    with cluster.s3.filesystem().open_output_stream(source) as out:
        out.write(head)
    corpus = s3("pretrain-corpus")
    run_driver(cluster, ["corpus", "--data_path", f"s3://{source}", "--save_dir", corpus, "--rows_per_shard", "20"])
    return corpus


def _pretrain_args(cluster, corpus: str, name: str, epochs: int = 6) -> list[str]:
    return ["pretrain", "--data_path", corpus, "--save_dir", str(cluster.head_dir / name),
            "--storage_path", s3(name), "--epochs", str(epochs), *TINY]


def test_corpus_is_prepared_from_and_into_the_bucket(cluster, corpus_uri):
    keys = cluster.s3_listing("kermt-test/pretrain-corpus")
    assert any(key.endswith("manifest.json") for key in keys), keys
    assert sum(key.endswith(".parquet") for key in keys) == 3, keys


def test_a_corpus_on_the_heads_disk_is_read_on_the_head(cluster, corpus_uri):
    """--data_path a local corpus: only the head (0 CPUs) has it, so the training workers on the other nodes ask
    a task pinned to the driver's node for each shard, which comes to them through the object store."""
    import pyarrow.fs as pafs

    local = cluster.head_dir / "local-corpus"
    pafs.copy_files(corpus_uri.removeprefix("s3://"), str(local), source_filesystem=cluster.s3.filesystem(),
                    destination_filesystem=pafs.LocalFileSystem())
    out = run_driver(cluster, _pretrain_args(cluster, str(local), "pt-local", epochs=1))
    assert "2 worker(s) on 2 node(s)" in out.stdout, out.stdout[-3000:]
    assert (cluster.head_dir / "pt-local" / "model").is_dir()


def test_losing_a_pretraining_node_mid_run_changes_no_weight(cluster, corpus_uri):
    reference = run_driver(cluster, _pretrain_args(cluster, corpus_uri, "pt-ref")).stdout
    assert "2 worker(s) on 2 node(s)" in reference, reference[-3000:]
    driver = subprocess.Popen([sys.executable, "-m", "ray_app.cli", *_pretrain_args(cluster, corpus_uri, "pt-lost")],
                              cwd=cluster.head_dir, env=cluster.driver_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 600
    while not any(key.endswith("checkpoint_manager_snapshot.json") for key in cluster.s3_listing("kermt-test/pt-lost")):
        assert driver.poll() is None and time.monotonic() < deadline, "no checkpoint was registered in time"
        time.sleep(0.2)
    lost = sorted(cluster.nodes)[-1]
    assert cluster.kill_node(lost) > 0
    cluster.add_node("127.0.0.7", 1)  # the replacement an autoscaler would start
    out, _ = driver.communicate(timeout=900)
    assert driver.returncode == 0, out[-6000:]
    assert "[pretrain] resuming at step" in out, out[-4000:]
    expected = load_native(cluster.head_dir / "pt-ref" / "model").state_dict
    actual = load_native(cluster.head_dir / "pt-lost" / "model").state_dict
    assert expected.keys() == actual.keys()
    for name, value in expected.items():
        if not any(part in name for part in NOISY):
            torch.testing.assert_close(actual[name], value, rtol=0, atol=1e-5, msg=name)
