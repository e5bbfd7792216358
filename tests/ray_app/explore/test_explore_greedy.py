"""`kermt explore` with a surrogate on the bundled demo data (a lookup of its RDKit logP): greedy finds more of the
library's top molecules than random from the same first batch, explored.csv records the surrogate's predictions,
and an exploration resumed after a finished round acquires what the uninterrupted one did.

Slow (three small finetunes on a local Ray cluster, minutes on 2 cores): `-m slow`. The default suite runs the
rounds without a surrogate (test_explore_random.py) and the acquisition functions (tests/kermt/explore)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest

from kermt.explore.explored import read_explored, write_explored
from ray_app.cli import main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "data" / "sample" / "admet_demo.csv"
SURROGATE = ["--checkpoint_path", str(ROOT / "tests" / "data" / "kermt_upstream" / "ckpt_pretrain_vocab.pt"),
             "--epochs", "30", "--batch_size", "32", "--features_generator", "rdkit_2d_normalized",
             "--no_features_scaling", "--max_lr", "0.002", "--final_lr", "0.0002", "--warmup_epochs", "1",
             "--ffn_hidden_size", "32"]


def _explore(save_dir: Path, acquisition: str) -> int:
    return main(["explore", "--library", str(DEMO), "--objective", f"lookup:{DEMO}:logp", "--init_size", "0.1",
                 "--acquire_size", "100", "--iterations", "2", "--acquisition", acquisition, "--seed", "1",
                 "--save_dir", str(save_dir), *SURROGATE])


def _top_rows(share: float) -> set[int]:
    with DEMO.open(newline="") as f:
        logp = [float(row["logp"]) if row["logp"] else np.nan for row in csv.DictReader(f)]
    values = np.array(logp)
    cut = np.nanquantile(values, 1 - share)
    return set(np.flatnonzero(values >= cut).tolist())


@pytest.fixture(scope="module")
def greedy_run(ray_cluster, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("explore") / "greedy"
    assert _explore(save_dir, "greedy") == 0
    return save_dir


def test_greedy_finds_more_top_molecules_than_random(greedy_run, tmp_path):
    assert _explore(tmp_path / "random", "random") == 0
    top = _top_rows(0.1)
    greedy, random = (read_explored(str(d / "explored.csv")) for d in (greedy_run, tmp_path / "random"))
    np.testing.assert_array_equal(greedy.library_row[greedy.round == 0], random.library_row[random.round == 0])
    found = {name: len(top.intersection(e.library_row[e.round > 0].tolist())) for name, e in
             (("greedy", greedy), ("random", random))}
    assert found["greedy"] > 1.5 * found["random"], found


def test_explored_records_the_surrogates_prediction(greedy_run):
    explored = read_explored(str(greedy_run / "explored.csv"))
    assert explored.round.tolist() == [0] * 200 + [1] * 100 + [2] * 100
    later = explored.round > 0
    assert np.isfinite(explored.predicted_mean[later]).all() and np.isnan(explored.predicted_mean[~later]).all()
    np.testing.assert_array_equal(explored.acquisition_value[later], explored.predicted_mean[later])  # greedy
    for k in (1, 2):  # each batch is the round's best predictions, best first
        values = explored.acquisition_value[explored.round == k]
        assert (np.diff(values) <= 0).all()
        assert (greedy_run / f"round_{k}" / "fold_0" / "model_0" / "model").is_dir()
    scored = explored.score[later]
    assert np.nanmean(scored) > np.nanmean(explored.score[~later])  # it went after high logP


def test_the_library_is_featurised_by_round_1_only(greedy_run):
    shards = sorted((greedy_run / "library").iterdir())
    assert [p.name for p in shards] == ["manifest.json", "shard_000000.parquet", "shard_000001.parquet"]
    written = max(p.stat().st_mtime_ns for p in shards)
    assert written <= (greedy_run / "round_1" / "library_predictions.parquet").stat().st_mtime_ns
    assert written < (greedy_run / "round_2" / "scored.csv").stat().st_mtime_ns  # round 2 read them as they were


def test_resuming_after_a_finished_round_makes_the_same_choices(greedy_run, tmp_path):
    resumed = tmp_path / "greedy"
    shutil.copytree(greedy_run, resumed)
    shutil.rmtree(resumed / "round_2")  # stopped after round 1: round 2's surrogate was never trained
    whole = read_explored(str(resumed / "explored.csv"))
    write_explored(str(resumed / "explored.csv"), whole.before_round(2))
    assert _explore(resumed, "greedy") == 0
    assert (resumed / "explored.csv").read_text() == (greedy_run / "explored.csv").read_text()


def test_a_validation_split_too_small_to_calibrate_names_validation_share(greedy_run):
    log = (greedy_run / "round_1" / "finetune.log").read_text()  # 156 scored: 16 held out, under the 20 it needs
    assert "no calibration" in log and "--validation_share" in log and "--split_sizes" not in log
