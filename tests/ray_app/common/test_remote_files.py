"""URIs for inputs and outputs, against a local S3 endpoint (moto's server): downloads, the cache, mirrored
--save_dir, staged --output_path, and `kermt finetune` / `kermt predict` end to end with everything in the bucket."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import pandas as pd
import pyarrow.fs as pafs
import pytest
import yaml
from pydantic import BaseModel

from kermt.errors import UserError
from ray_app.cli import main as cli_main
from ray_app.common.remote_files import fetch_input, local_files
from ray_app.screening.config import PredictConfig
from tests.conftest import FIXTURE_DIR
from tests.s3_server import BUCKET, MotoS3

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = MotoS3(tmp_path_factory.mktemp("s3")).start()
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    os.environ["KERMT_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    os.environ.pop("KERMT_CACHE", None)
    server.stop()


def _put(s3: MotoS3, key: str, data: bytes) -> str:
    with s3.filesystem().open_output_stream(f"{BUCKET}/{key}") as out:
        out.write(data)
    return f"s3://{BUCKET}/{key}"


def _get(s3: MotoS3, key: str) -> bytes:
    with s3.filesystem().open_input_stream(f"{BUCKET}/{key}") as stream:
        return stream.read()


def test_an_input_uri_is_downloaded_once_and_again_when_it_changes(s3):
    uri = _put(s3, "in/data.csv", b"smiles,y\nCCO,1.0\n")
    first = fetch_input(uri, "--data_path")
    assert Path(first).read_bytes() == b"smiles,y\nCCO,1.0\n" and Path(first).name == "data.csv"
    assert fetch_input(uri, "--data_path") == first  # cached: same object, same local copy
    _put(s3, "in/data.csv", b"smiles,y\nCCO,1.0\nCCN,2.0\n")
    changed = fetch_input(uri, "--data_path")
    assert changed != first and Path(changed).read_bytes().endswith(b"CCN,2.0\n")
    assert fetch_input("relative/local.csv", "--data_path") == "relative/local.csv"


def test_a_missing_object_is_a_one_line_error_naming_flag_and_uri(s3):
    with pytest.raises(UserError, match=r"--checkpoint_path s3://kermt-test/nope.pt: no such object"):
        fetch_input(f"s3://{BUCKET}/nope.pt", "--checkpoint_path")


def test_output_file_is_uploaded_only_when_the_command_succeeded(s3, tmp_path):
    config = PredictConfig(data_path="in.csv", output_path=f"s3://{BUCKET}/out/a.csv", checkpoint_path="c.pt")
    with local_files(config, keep_remote=("data_path",)) as local:
        assert local.data_path == "in.csv" and not local.output_path.startswith("s3://")
        assert local.output_path.endswith("/a.csv")
        Path(local.output_path).write_text("done\n")
    assert _get(s3, "out/a.csv") == b"done\n"
    failed = config.model_copy(update={"output_path": f"s3://{BUCKET}/out/b.csv"})
    with pytest.raises(RuntimeError), local_files(failed, keep_remote=("data_path",)) as local:
        Path(local.output_path).write_text("half\n")
        raise RuntimeError("the run failed")
    assert f"{BUCKET}/out/b.csv" not in s3.listing(f"{BUCKET}/out")


def test_finetune_reads_and_writes_object_storage(ray_cluster, s3, capsys, monkeypatch):
    """--data_path, --checkpoint_path and --save_dir in the bucket, named by URIs that carry pyarrow's options in
    their query (the form for MinIO, Ceph and other S3-compatible stores; AWS_ENDPOINT_URL unset, so the endpoint
    can only come from the query); config.yaml keeps the URIs; a re-run of the same command finds the first run's
    files through the mirror and keeps its finished model. (The plain form: every other test in this file; workers
    writing a query-form --storage_path: -m slow tests/ray_app/common/test_storage_uris.py.)"""
    query = f"?endpoint_override=127.0.0.1:{s3.port}&scheme=http"
    with open(ROOT / "data/sample/admet_demo.csv", "rb") as f:
        data_uri = _put(s3, "in/demo.csv", b"".join(f.readlines()[:61])) + query
    ckpt_uri = _put(s3, "in/ckpt.pt", (FIXTURE_DIR / "ckpt_pretrain_vocab.pt").read_bytes()) + query
    save_uri = f"s3://{BUCKET}/runs/ft{query}"
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    args = ["finetune", "--data_path", data_uri, "--checkpoint_path", ckpt_uri, "--save_dir", save_uri,
            "--num_workers", "1", "--epochs", "1", "--batch_size", "16", "--ffn_hidden_size", "8"]
    assert cli_main(args) == 0
    keys = s3.listing(f"{BUCKET}/runs/ft")
    for name in ("config.yaml", "run.json", "fold_0/test_result.csv", "fold_0/model_0/model.pt",
                 "fold_0/model_0/model/config.json"):
        assert f"{BUCKET}/runs/ft/{name}" in keys, keys
    recorded = yaml.safe_load(_get(s3, "runs/ft/config.yaml"))
    assert (recorded["data_path"], recorded["checkpoint_path"], recorded["save_dir"]) == (data_uri, ckpt_uri, save_uri)
    run = json.loads(_get(s3, "runs/ft/run.json"))
    assert run["settings"]["data_path"] == {"value": data_uri, "source": "user"}
    first_result = _get(s3, "runs/ft/fold_0/test_result.csv")

    capsys.readouterr()
    assert cli_main(args) == 0  # the same command again: the mirror brings the finished model back, it is kept
    assert "kept 1 of 1 model(s) this run already saved; 0 to go" in capsys.readouterr().out
    assert _get(s3, "runs/ft/fold_0/test_result.csv") == first_result


def test_predict_with_checkpoint_and_output_in_the_bucket(ray_cluster, s3, tmp_path):
    ckpt_uri = _put(s3, "models/reg.pt", (FIXTURE_DIR / "ckpt_ft_reg.pt").read_bytes())
    local = tmp_path / "local.csv"
    assert cli_main(["predict", "--data_path", str(FIXTURE_DIR / "smiles.csv"), "--checkpoint_path", ckpt_uri,
                     "--output_path", f"s3://{BUCKET}/preds/p.csv"]) == 0
    assert cli_main(["predict", "--data_path", str(FIXTURE_DIR / "smiles.csv"), "--checkpoint_path",
                     str(FIXTURE_DIR / "ckpt_ft_reg.pt"), "--output_path", str(local)]) == 0
    remote = tmp_path / "remote.csv"
    remote.write_bytes(_get(s3, "preds/p.csv"))
    pd.testing.assert_frame_equal(pd.read_csv(remote), pd.read_csv(local))


class Outputs(BaseModel):
    """The output settings local_files handles, as every subcommand's schema names them."""

    save_dir: Optional[str] = None
    output_path: Optional[str] = None


def _doomed_bucket(s3: MotoS3) -> tuple[Outputs, Callable[[], None]]:
    """Outputs in a bucket of their own, and a way to delete that bucket so that their upload fails."""
    s3.make_bucket("doomed")
    config = Outputs(save_dir="s3://doomed/run", output_path="s3://doomed/out.csv")
    filesystem = pafs.S3FileSystem(endpoint_override=s3.endpoint, access_key="testing", secret_key="testing",
                                   region="us-east-1", allow_bucket_deletion=True)
    return config, lambda: filesystem.delete_dir("doomed")


def test_a_failed_run_keeps_its_error_when_the_upload_fails_too(s3, capsys):
    config, delete_bucket = _doomed_bucket(s3)
    with pytest.raises(RuntimeError, match="the run failed") as raised, local_files(config) as local:
        (Path(local.save_dir) / "epoch_1.pt").write_text("state\n")
        Path(local.output_path).write_text("half\n")
        delete_bucket()
        raise RuntimeError("the run failed")
    upload_failure = "--save_dir s3://doomed/run: the upload failed"
    assert any(note.startswith(upload_failure) and local.save_dir in note for note in raised.value.__notes__)
    assert upload_failure in capsys.readouterr().err  # also said when the run's error is a one-line user error
    assert (Path(local.save_dir) / "epoch_1.pt").read_text() == "state\n"  # kept, as the message says
    assert not Path(local.output_path).parents[1].exists()  # the staging directory of the half-written output


def test_a_finished_run_whose_uploads_fail_raises_the_first_and_keeps_every_file(s3):
    config, delete_bucket = _doomed_bucket(s3)
    with pytest.raises(UserError, match="--save_dir s3://doomed/run: the upload failed") as raised:
        with local_files(config) as local:
            (Path(local.save_dir) / "model.pt").write_text("model\n")
            Path(local.output_path).write_text("done\n")
            delete_bucket()
    assert [note.split(": the")[0] for note in raised.value.__notes__] == ["--output_path s3://doomed/out.csv"]
    assert (Path(local.save_dir) / "model.pt").read_text() == "model\n"
    assert Path(local.output_path).read_text() == "done\n"


def test_the_mirror_starts_from_what_the_uri_holds_now(s3):
    """A re-run resumes from the URI, not from files an earlier run left on this disk (nor uploads those again)."""
    config = Outputs(save_dir=f"s3://{BUCKET}/runs/fresh")
    with local_files(config) as first:
        (Path(first.save_dir) / "run_state.json").write_text("{}\n")
        (Path(first.save_dir) / "old_model.pt").write_text("old\n")
    assert not Path(first.save_dir).exists()  # uploaded, so not kept
    s3.filesystem().delete_file(f"{BUCKET}/runs/fresh/old_model.pt")  # the URI changed since
    with local_files(config) as second:
        assert sorted(p.name for p in Path(second.save_dir).iterdir()) == ["run_state.json"]
        assert second.save_dir != first.save_dir
    assert s3.listing(f"{BUCKET}/runs/fresh") == [f"{BUCKET}/runs/fresh/run_state.json"]


def test_recorded_settings_name_absolute_paths_and_keep_uris(tmp_path, monkeypatch):
    """config.yaml / run.json replay from any directory: local paths become absolute, URIs stay."""
    from ray_app.common.remote_files import with_absolute_paths
    from ray_app.finetune.config import FinetuneConfig

    monkeypatch.chdir(tmp_path)
    config = FinetuneConfig(data_path="data/train.csv", features_path=["f.npz", "s3://b/g.npz"],
                            checkpoint_path="hf://nvidia/NV-KERMT-70M-v2", save_dir="runs/a", folds_file="~/folds.json")
    absolute = with_absolute_paths(config)
    assert absolute.data_path == str(tmp_path / "data/train.csv") and absolute.save_dir == str(tmp_path / "runs/a")
    assert absolute.features_path == [str(tmp_path / "f.npz"), "s3://b/g.npz"]
    assert absolute.checkpoint_path == "hf://nvidia/NV-KERMT-70M-v2"
    assert absolute.folds_file == str(Path.home() / "folds.json") and absolute.separate_val_path is None
    assert with_absolute_paths(absolute) == absolute


def test_what_the_run_removed_from_its_mirror_is_removed_at_the_uri_and_a_published_file_is_there_at_once(s3):
    """A new run moves the earlier one aside in the mirror: the URI then holds the same, not a stale copy of the
    earlier run's members beside the new ones; files others wrote under the prefix meanwhile are kept."""
    from ray_app.common.remote_files import publish

    for key in ("fold_0/model_1/metrics.csv", "run.json"):
        _put(s3, f"runs/moved/{key}", b"earlier run\n")
    config = Outputs(save_dir=f"s3://{BUCKET}/runs/moved")
    with local_files(config) as local:
        mirror = Path(local.save_dir)
        (mirror / "earlier_runs" / "r1").mkdir(parents=True)
        for name in ("fold_0", "run.json"):
            os.replace(mirror / name, mirror / "earlier_runs" / "r1" / name)
        (mirror / "run_state.json").write_text('{"run_id": "r2"}\n')
        publish(mirror / "run_state.json", config.save_dir, "--save_dir")
        assert _get(s3, "runs/moved/run_state.json") == b'{"run_id": "r2"}\n'  # before the command ends
        _put(s3, "runs/moved/ray_results/experiment_state.json", b"written by Tune meanwhile\n")
    assert s3.listing(f"{BUCKET}/runs/moved") == [f"{BUCKET}/runs/moved/{key}" for key in (
        "earlier_runs/r1/fold_0/model_1/metrics.csv", "earlier_runs/r1/run.json", "ray_results/experiment_state.json",
        "run_state.json")]
