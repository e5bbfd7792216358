"""End-to-end `kermt finetune` from a fixture pretrain checkpoint: upstream's output layout, ensembles and folds trained
concurrently, re-runs, new runs and --overwrite in a save_dir that holds an earlier run."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kermt.checkpoint import load_finetune_model, read_checkpoint
from kermt.chem.standardize import MoleculePrep
from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import featurize_smiles
from kermt.train.step import predict
from ray_app.finetune.config import resolve
from ray_app.finetune.run import run_finetune
from tests.conftest import DATA_DIR, FIXTURE_DIR

ROOT = DATA_DIR.parents[1]


@pytest.fixture(scope="module")
def demo_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "demo.csv"
    with open(ROOT / "data/sample/admet_demo.csv") as f:
        rows = list(csv.reader(f))[:81]
    rows.insert(5, ["not_a_smiles", "1.0", "", ""])
    rows.insert(9, ["", "2.0", "0.5", ""])
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def test_finetune_writes_upstream_layout(run_after_the_ensemble, demo_csv):
    """The one-member run (a scaffold split, self-attention, dropout, bond dropout, MAE, TensorBoard; the ensemble
    run's settings): upstream's files and the lines its users parse. Two workers per member: the multi-node lane's
    runs and tests/ray_app/finetune/test_fold_data.py's."""
    save_dir, summary, out = run_after_the_ensemble

    # invalid rows are reported with their data-row numbers, and skipped
    with open(save_dir / "invalid_smiles.csv") as f:
        invalid = list(csv.DictReader(f))
    assert [(r["row"], r["reason"]) for r in invalid] == [  # RDKit's own message
        ("4", "unparsable: syntax error while parsing: not_a_smiles; check for mistakes around position 3"),
        ("8", "empty")]

    # summary lines upstream users parse, and their values
    overall = summary["overall_scaffold_balanced_test_mae"]
    assert f"overall_scaffold_balanced_test_mae={overall:.6f}" in out and "std=0.000000" in out
    assert summary["dataset_type"] == "regression" and summary["fold_scores"] == [overall]

    # test_result.csv: upstream's two header rows; preds equal a reload of the saved best model
    with open(save_dir / "fold_0/test_result.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["", "preds", "preds", "preds", "targets", "targets", "targets"]
    assert rows[1] == ["", "logp", "tpsa_100", "fsp3", "logp", "tpsa_100", "fsp3"]
    smiles = [r[0] for r in rows[2:]]
    written = np.array([[float(v) for v in r[1:4]] for r in rows[2:]])
    checkpoint = read_checkpoint(save_dir / "fold_0/model_0/model")
    model, _ = load_finetune_model(checkpoint)
    assert checkpoint.spec.features.standardize == "parent"  # every new finetune's default, applied here too
    done = featurize_smiles(smiles, prep=MoleculePrep(checkpoint.spec.features.standardize))
    test_set = MoleculeSet(done.graphs, None, np.zeros((len(smiles), 3), np.float32), done.smiles)
    again = checkpoint.spec.data_scaler.inverse_transform(predict(model, test_set, np.arange(len(smiles)), 16))
    np.testing.assert_allclose(written, again, rtol=0, atol=1e-6)

    # splits.json covers every valid row exactly once; metrics.csv has one row per epoch
    splits = json.loads((save_dir / "splits.json").read_text())["fold_0"]
    assert sorted(splits["train"] + splits["val"] + splits["test"]) == [r for r in range(82) if r not in (4, 8)]
    with open(save_dir / "fold_0/model_0/metrics.csv") as f:
        assert [int(r["epoch"]) for r in csv.DictReader(f)] == [0, 1]
    assert (save_dir / "fold_0/model_0/model.pt").exists()
    # the TensorBoard events hold metrics.csv's numbers, epoch by epoch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(save_dir / "fold_0/model_0")).Reload()
    with open(save_dir / "fold_0/model_0/metrics.csv") as f:
        epochs = list(csv.DictReader(f))
    for tag, column in (("loss/train", "train_loss"), ("mae_val", "val_mae"), ("learning_rate", "lr")):
        scalars = events.Scalars(tag)
        assert [e.step for e in scalars] == [0, 1]
        np.testing.assert_allclose([e.value for e in scalars], [float(r[column]) for r in epochs], rtol=1e-6)

    # run.json records where each setting came from; config.yaml replays the run
    record = json.loads((save_dir / "run.json").read_text())
    assert record["settings"]["epochs"] == {"value": 2, "source": "user"}
    assert record["settings"]["max_lr"]["source"] == "default"
    assert record["settings"]["hidden_size"] == {"value": 16, "source": "checkpoint"}
    assert resolve(["--config", str(save_dir / "config.yaml")])[0] == resolve(_one_member_args(demo_csv, save_dir))[0]

    # the workers read their shards themselves: Ray Train started no Ray Data coordinator for the run
    import ray
    from ray.util.state import list_actors

    started = {a.class_name for a in list_actors(address=ray.get_runtime_context().gcs_address, limit=10_000)}
    assert "RayTrainWorker" in started and "DatasetManager" not in started
    # one model: the driver coordinated its TorchTrainer, no Tune run (ray_app.finetune.one_model)
    assert not (save_dir / "ray_results" / f"{summary['run_id']}-members").exists()
    assert (save_dir / "ray_results" / f"{summary['run_id']}-fold0-model0").is_dir()

    report = subprocess.run([sys.executable, "-m", "ray_app.cli", "inspect", str(save_dir / "fold_0/model_0/model")],
                            capture_output=True, text=True, check=True)
    described = json.loads(report.stdout)
    assert described["kind"] == "finetuned" and described["tasks"]["task_names"] == ["logp", "tpsa_100", "fsp3"]


# Runs with -m slow: the member loop under bf16 (training, validation) is tests/kermt/train/test_loop.py's, bf16
# predictions tests/kermt/nn/test_precision.py's, and the GPU lane runs a bf16 finetune on Ray
@pytest.mark.slow
def test_bf16_finetune_stays_close_to_fp32(run_after_the_ensemble, demo_csv, tmp_path):
    """--precision bf16 end to end (training steps, validation, test predictions): a different computation whose
    test score stays within a few percent of the fp32 run's (docs/numerics.md). The fp32 run is the same command's
    that the new-run test below checks."""
    fp32 = run_after_the_ensemble[1][SCORE]
    config, sources = resolve([*_one_member_args(demo_csv, tmp_path / "bf16"), "--precision", "bf16"])
    bf16 = run_finetune(config, sources)[SCORE]
    assert bf16 != fp32  # autocast really ran
    assert bf16 == pytest.approx(fp32, rel=0.05)


def _ensemble_run(demo_csv, save_dir) -> dict:
    """2 folds x 2 members, 2 at a time, with the one-member runs' other settings (``_one_member_args``)."""
    config, sources = resolve([*_one_member_args(demo_csv, save_dir), "--ensemble_size", "2", "--num_folds", "2",
                               "--max_concurrent_trials", "2"])
    return run_finetune(config, sources)


@pytest.fixture(scope="module")
def parallel_run(ray_cluster, demo_csv, tmp_path_factory) -> tuple[Path, dict, str]:
    """2 folds x 2 members trained 2 at a time: (save_dir, summary, the run's output). The earlier run of the
    rerun, new-run and overwrite tests below."""
    save_dir = tmp_path_factory.mktemp("ensemble") / "parallel"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        summary = _ensemble_run(demo_csv, save_dir)
    return save_dir, summary, out.getvalue()


def _member_trials(save_dir: Path, run_id: str) -> list:
    from ray import tune

    return tune.ExperimentAnalysis(str(save_dir / "ray_results" / f"{run_id}-members")).trials


def test_four_members_train_two_at_a_time_from_their_folds_shards_and_no_folds_object(parallel_run):
    """The 2 folds x 2 members train 2 at a time from their fold's shards, written once: both members of a fold
    report the same shards, the two folds different ones; and no trial got a fold's object (a member takes the
    fold's scalers from its FoldData, so the driver lets go of the folds' objects once their shards are written)."""
    save_dir, summary, out = parallel_run
    assert "training 4 models (2 fold(s) x 2 member(s)), 2 at a time" in out
    trials = _member_trials(save_dir, summary["run_id"])
    shards = {(t.config["job"]["fold"], t.config["job"]["member"]): t.last_result["fold_shards"] for t in trials}
    assert sorted(shards) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert shards[0, 0] == shards[0, 1] and shards[1, 0] == shards[1, 1] and shards[0, 0] != shards[1, 0]
    assert shards[0, 0].endswith("fold_0/train") and not any("splits_object" in t.last_result for t in trials)


def test_a_member_trained_beside_others_equals_the_same_member_trained_alone(parallel_run, run_after_the_ensemble):
    """fold 0's member 0 of the 2 x 2 run, trained two at a time beside the others, and the only member of a one-model
    run of the same settings: the same weights and epochs, since a member is seeded from (seed, fold, member) and
    fold k is split with seed + k, whatever else trains. The run's folds and members are distinct and its score is
    the mean of its folds'."""
    from safetensors.numpy import load_file

    (parallel_dir, parallel, _), alone_dir = parallel_run, run_after_the_ensemble[0]
    assert not np.isnan(parallel["fold_scores"]).any()
    assert parallel[SCORE] == pytest.approx(np.mean(parallel["fold_scores"]), abs=1e-12)
    member = "fold_0/model_0"
    beside, by_itself = (load_file(run / member / "model" / "model.safetensors") for run in (parallel_dir, alone_dir))
    assert beside.keys() == by_itself.keys() and all(np.array_equal(beside[k], by_itself[k]) for k in beside)
    assert _epochs(parallel_dir / member) == _epochs(alone_dir / member)
    for fold in (0, 1):  # ensemble members differ by seed: different heads
        members = [load_file(parallel_dir / f"fold_{fold}/model_{m}/model/model.safetensors") for m in (0, 1)]
        assert any(not np.array_equal(members[0][k], members[1][k]) for k in members[0])
        assert (parallel_dir / f"fold_{fold}/model_1/model.pt").exists()
    splits = json.loads((parallel_dir / "splits.json").read_text())
    assert splits["fold_0"]["test"] != splits["fold_1"]["test"]  # fold k is split with seed + k


TIME_COLUMNS = ("train_time_s", "val_time_s")  # metrics.csv's columns of seconds


def _epochs(member: Path) -> list[dict[str, str]]:
    """A member's metrics.csv rows less their seconds."""
    with open(member / "metrics.csv") as f:
        return [{k: v for k, v in row.items() if k not in TIME_COLUMNS} for row in csv.DictReader(f)]


def test_rerun_keeps_saved_members_and_takes_finished_ones_from_the_tune_run(parallel_run, demo_csv, capsys):
    """A driver that died after a trial finished but before it copied the member's files: the same command restores
    the Tune run, trains nothing again, copies the missing member from its trial and leaves the others as they
    were."""
    save_dir, earlier, _ = parallel_run
    missing = save_dir / "fold_1" / "model_1"
    weights = (missing / "model" / "model.safetensors").read_bytes()
    shutil.rmtree(missing)
    kept = {p: p.stat().st_mtime_ns for p in save_dir.glob("fold_*/model_*/**/*") if p.is_file()}
    assert _ensemble_run(demo_csv, save_dir) == earlier
    out = capsys.readouterr().out
    assert "finished before with these settings" in out and "kept 3 of 4 model(s) this run already saved" in out
    assert (missing / "model" / "model.safetensors").read_bytes() == weights
    assert (missing / "metrics.csv").exists() and not (missing / "result.json").exists()
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # the kept members' files were not rewritten
    assert len(_member_trials(save_dir, earlier["run_id"])) == 4  # the restored run added no trial


def _copy_run(run_dir: Path, target: Path) -> Path:
    shutil.copytree(run_dir, target)
    return target


def test_a_runs_members_are_its_own_fold_models_not_tunes_copies(parallel_run, tmp_path):
    from kermt.inference import find_checkpoints

    save_dir = parallel_run[0]
    assert list(save_dir.glob("ray_results/**/checkpoint_*/model"))  # Tune's copies of the same models are there
    members = [p.relative_to(save_dir).as_posix() for p in find_checkpoints(save_dir)]
    assert members == [f"fold_{f}/model_{m}/model" for f in (0, 1) for m in (0, 1)]


def _one_member_args(demo_csv: Path, save_dir: Path) -> list[str]:
    """One member of one fold, 2 epochs (the ensemble run adds its members and folds to these)."""
    return ["--data_path", str(demo_csv), "--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"),
            "--save_dir", str(save_dir), "--epochs", "2", "--batch_size", "16", "--ffn_hidden_size", "8",
            "--split_type", "scaffold_balanced", "--self_attention", "--dropout", "0.1", "--bond_drop_rate", "0.1",
            "--dist_coff", "0.15", "--metric", "mae", "--tensorboard"]


SCORE = "overall_scaffold_balanced_test_mae"  # the summary's score of _one_member_args' runs


@pytest.fixture(scope="module")
def run_after_the_ensemble(parallel_run, demo_csv, tmp_path_factory) -> tuple[Path, dict, str]:
    """One member (fp32) run in a copy of the ensemble run's save_dir: (save_dir, summary, the run's output). The
    new-run test checks what it did with the earlier run; the bf16 test compares its score with this one's, and the
    ensemble test its member with the ensemble's (what a save_dir held before changes no number of the run)."""
    save_dir = _copy_run(parallel_run[0], tmp_path_factory.mktemp("after_ensemble") / "run")
    with contextlib.redirect_stdout(io.StringIO()) as out:
        summary = run_finetune(*resolve(_one_member_args(demo_csv, save_dir)))
    return save_dir, summary, out.getvalue()


def test_a_new_run_moves_the_earlier_one_aside_and_predict_refuses_stale_members(parallel_run,
                                                                                    run_after_the_ensemble):
    """--ensemble_size 1 --num_folds 1 after 2 x 2 in the same save_dir: the earlier run's files go to
    earlier_runs/<its id>/ (a run of its own there), the new run holds one member, and a stale member put back by
    hand is refused by name instead of being averaged in."""
    from kermt.errors import UserError
    from kermt.inference import find_checkpoints

    earlier = parallel_run[1]
    save_dir, summary, out = run_after_the_ensemble
    moved = save_dir / "earlier_runs" / earlier["run_id"]
    assert f"moved its outputs to {moved}" in out
    assert "other settings (ensemble_size, num_folds, save_dir)" in out
    assert sorted(p.name for p in save_dir.iterdir()) == [
        "config.yaml", "earlier_runs", "fold_0", "invalid_smiles.csv", "ray_results", "report.html", "run.json",
        "run_state.json", "splits.json"]
    assert [p.relative_to(save_dir).as_posix() for p in find_checkpoints(save_dir)] == ["fold_0/model_0/model"]
    assert [p.relative_to(moved).as_posix() for p in find_checkpoints(moved)] == [
        f"fold_{f}/model_{m}/model" for f in (0, 1) for m in (0, 1)]
    assert json.loads((moved / "run.json").read_text())["summary"] == earlier

    shutil.copytree(moved / "fold_0" / "model_1", save_dir / "fold_0" / "model_1")
    with pytest.raises(UserError, match=f"fold_0/model_1 was saved by run {earlier['run_id']}, not by the run "
                                        f"this directory holds \\({summary['run_id']}"):
        find_checkpoints(save_dir)


def test_overwrite_deletes_the_earlier_run_and_a_failed_check_keeps_it(parallel_run, demo_csv, tmp_path, capsys):
    from kermt.checkpoint import ArchitectureConflictError

    earlier_dir, earlier, _ = parallel_run
    save_dir = _copy_run(earlier_dir, tmp_path / "run")
    before = sorted(p.relative_to(save_dir) for p in save_dir.rglob("*"))
    common = ["--data_path", str(demo_csv), "--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"),
              "--save_dir", str(save_dir), "--epochs", "1", "--batch_size", "16", "--ffn_hidden_size", "8"]
    with pytest.raises(ArchitectureConflictError):  # found before the earlier run is touched
        run_finetune(*resolve([*common, "--hidden_size", "32"]))
    assert sorted(p.relative_to(save_dir) for p in save_dir.rglob("*")) == before
    capsys.readouterr()
    summary = run_finetune(*resolve([*common, "--overwrite", "--max_data_size", "40"]))
    assert f"--overwrite: deleted the earlier run's outputs in {save_dir}" in capsys.readouterr().out
    assert not (save_dir / "earlier_runs").exists() and not (save_dir / "fold_1").exists()
    assert summary["run_id"] != earlier["run_id"]
    assert sorted(p.name for p in (save_dir / "fold_0").iterdir()) == ["model_0", "test_result.csv"]
