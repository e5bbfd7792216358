"""Storage URIs that carry pyarrow options in their query (``s3://bucket/run?endpoint_override=host:port&scheme=http``,
the form for MinIO, Ceph and other S3-compatible stores), and plain ones whose endpoint comes from
``AWS_ENDPOINT_URL``: an ensemble, its resume, a sweep and its resume against a local S3 (moto's server).

The commands run in a Ray session of their own (tests/ray_app/cli_session.py), started with the credentials (and,
for the plain form, the endpoint) in its environment: Tune trials and Train workers write the storage themselves.
The re-runs happen in the same session, after a pause (each session costs a Ray start).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kermt.data import atomic_files
from tests.conftest import DATA_DIR, FIXTURE_DIR
from tests.ray_app.cli_session import PAUSE, PAUSED
from tests.s3_server import BUCKET, MotoS3

ROOT = DATA_DIR.parents[1]
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def test_join_extends_the_path_and_keeps_the_query_last():
    query = "?endpoint_override=127.0.0.1:9000&scheme=http"
    assert atomic_files.join(f"s3://b/run{query}", "id-members") == f"s3://b/run/id-members{query}"
    assert atomic_files.join(f"s3://b/run/{query}", "tune", "t1") == f"s3://b/run/tune/t1{query}"
    assert atomic_files.join(f"s3://b{query}", "x") == f"s3://b/x{query}"
    assert atomic_files.join("s3://b/run/", "x") == "s3://b/run/x"
    assert atomic_files.join("/tmp/odd?name", "x") == "/tmp/odd?name/x"  # a local path has no query


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = MotoS3(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """60 molecules of the sample data (3 regression tasks) and a two-point search space."""
    folder = tmp_path_factory.mktemp("uri_inputs")
    with open(ROOT / "data/sample/admet_demo.csv") as f:
        rows = list(csv.reader(f))[:61]
    with open(folder / "data.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    (folder / "space.yaml").write_text(yaml.safe_dump({"max_lr": {"choice": [1e-3, 2e-3]}}))
    return folder


def _uri(s3: MotoS3, prefix: str, endpoint_in: str) -> str:
    uri = f"s3://{BUCKET}/{prefix}"
    return f"{uri}?endpoint_override=127.0.0.1:{s3.port}&scheme=http" if endpoint_in == "query" else uri


@contextlib.contextmanager
def _session(s3: MotoS3, endpoint_in: str, tmp_path: Path, commands: list[list[str]]) -> Iterator[subprocess.Popen]:
    """The commands running in a session of their own (stdin and stdout are pipes; stderr goes to a file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(CREDENTIALS, KERMT_CACHE=str(tmp_path / "cache"))
    if endpoint_in == "env":
        env["AWS_ENDPOINT_URL"] = s3.endpoint
    with open(tmp_path / "session.err", "w") as stderr:
        session = subprocess.Popen([sys.executable, "-m", "tests.ray_app.cli_session", json.dumps(commands)],
                                   cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                   text=True)
        try:
            yield session
        finally:
            if session.poll() is None:  # a failed check while it waits at its pause
                session.kill()
                session.wait()


def _wait_for_the_pause(session: subprocess.Popen, tmp_path: Path) -> None:
    lines = []
    for line in session.stdout:
        if line.rstrip("\n") == PAUSED:
            return
        lines.append(line)
    session.wait()
    pytest.fail(f"the session ended (exit {session.returncode}) before its pause:\n{''.join(lines)[-4000:]}\n"
                f"{(tmp_path / 'session.err').read_text()[-6000:]}")


def _printed_after_the_pause(session: subprocess.Popen, tmp_path: Path) -> str:
    session.stdin.write("\n")
    session.stdin.close()
    out = session.stdout.read()
    assert session.wait() == 0, f"{out[-4000:]}\n{(tmp_path / 'session.err').read_text()[-6000:]}"
    return out


def _finetune_args(inputs: Path, save_dir: str, storage: str) -> list[str]:
    return ["finetune", "--data_path", str(inputs / "data.csv"), "--checkpoint_path",
            str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"), "--save_dir", save_dir, "--storage_path", storage,
            "--ensemble_size", "2", "--num_workers", "1", "--epochs", "1", "--batch_size", "16",
            "--ffn_hidden_size", "8"]


def _tune_args(inputs: Path, save_dir: Path, storage: str) -> list[str]:
    return ["tune", "--data_path", str(inputs / "data.csv"), "--checkpoint_path",
            str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"), "--save_dir", str(save_dir), "--storage_path", storage,
            "--search_space", str(inputs / "space.yaml"), "--n_trials", "2", "--max_concurrent_trials", "2",
            "--num_workers_per_trial", "1", "--epochs", "1", "--batch_size", "16", "--ffn_hidden_size", "8"]


def _read(s3: MotoS3, key: str) -> bytes:
    with s3.filesystem().open_input_stream(f"{BUCKET}/{key}") as stream:
        return stream.read()


# Slow, both forms (70-130 s each on 2 cores). The default suite covers the paths: the query form end to end for the
# driver's inputs and mirrored --save_dir (tests/ray_app/common/test_remote_files.py, with AWS_ENDPOINT_URL unset),
# Train workers and Tune trials writing an S3 --storage_path and an ensemble resuming from it (-m multinode:
# tests/multinode/test_cluster_runs.py), a sweep's resume (tests/ray_app/tune/test_tune.py).
@pytest.mark.slow
@pytest.mark.parametrize("endpoint_in", ["query", "env"])
def test_ensemble_and_sweep_run_and_resume_in_object_storage(s3, inputs, tmp_path, endpoint_in):
    """An ensemble (--save_dir and --storage_path in the bucket) and a sweep. Then one member's metrics.csv is
    removed from the bucket, and the same commands run again: the ensemble restores its Tune run from the storage URI
    and brings the member back from its checkpoint; the sweep resumes, trains nothing."""
    save, storage = _uri(s3, f"{endpoint_in}/ft", endpoint_in), _uri(s3, f"{endpoint_in}/ray", endpoint_in)
    finetune = _finetune_args(inputs, save, storage)
    tune = _tune_args(inputs, tmp_path / "sweep", _uri(s3, f"{endpoint_in}/sweep", endpoint_in))
    with _session(s3, endpoint_in, tmp_path, [finetune, tune, PAUSE, finetune, tune]) as session:
        _wait_for_the_pause(session, tmp_path)
        run_id = json.loads(_read(s3, f"{endpoint_in}/ft/run_state.json"))["run_id"]
        experiment = s3.listing(f"{BUCKET}/{endpoint_in}/ray/{run_id}-members")
        assert any(key.endswith("tuner.pkl") for key in experiment), experiment
        result = _read(s3, f"{endpoint_in}/ft/fold_0/test_result.csv")
        assert s3.listing(f"{BUCKET}/{endpoint_in}/sweep/tune"), "the sweep's Tune state is in the bucket"
        assert len(list(csv.DictReader(open(tmp_path / "sweep" / "all_trials.csv")))) == 2

        s3.filesystem().delete_file(f"{BUCKET}/{endpoint_in}/ft/fold_0/model_1/metrics.csv")
        out = _printed_after_the_pause(session, tmp_path)
    assert "kept 1 of 2 model(s)" in out
    assert f"resuming the Tune run in {atomic_files.join(storage, run_id + '-members')}" in out
    assert f"resuming the sweep in {atomic_files.join(tune[tune.index('--storage_path') + 1], 'tune')}" in out
    assert f"{BUCKET}/{endpoint_in}/ft/fold_0/model_1/metrics.csv" in s3.listing(f"{BUCKET}/{endpoint_in}/ft")
    assert _read(s3, f"{endpoint_in}/ft/fold_0/test_result.csv") == result  # the same two models, not retrained
    rows = list(csv.DictReader(open(tmp_path / "sweep" / "all_trials.csv")))
    assert [r["status"] for r in rows] == ["completed", "completed"]
