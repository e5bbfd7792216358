"""ucb, ei, pi and thompson through the real `kermt explore` command, on one surrogate: a greedy exploration trains
round 1's surrogate (a mean-variance head, --loss mve, so it gives a std), and each other acquisition resumes a
copy of it at round 1 (its settings file rewritten to that acquisition, explored.csv cut to round 0), so the command
reads the same surrogate and predictions and only the choice differs. Each batch is checked against the formula
computed here from the surrogate's predictions of the whole library.

Slow (one small finetune on a local Ray cluster): `-m slow`; the formulas alone are tests/kermt/explore."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from scipy.stats import norm

from kermt.explore.explored import Explored, read_explored, write_explored
from ray_app.cli import main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "data" / "sample" / "admet_demo.csv"
SURROGATE = ["--checkpoint_path", str(ROOT / "tests" / "data" / "kermt_upstream" / "ckpt_pretrain_vocab.pt"),
             "--loss", "mve", "--epochs", "6", "--batch_size", "32", "--max_lr", "0.002", "--final_lr", "0.0002",
             "--warmup_epochs", "1", "--ffn_hidden_size", "32"]
BATCH = 20
MARGIN = 0.01  # ei and pi ask for at least this improvement (MolPAL's xi)


def _explore(save_dir: Path, library: Path, acquisition: str, *flags: str) -> int:
    return main(["explore", "--library", str(library), "--objective", f"lookup:{library}:logp", "--init_size", "80",
                 "--acquire_size", str(BATCH), "--iterations", "1", "--acquisition", acquisition, "--seed", "3",
                 "--save_dir", str(save_dir), *flags, *SURROGATE])


@pytest.fixture(scope="module")
def greedy_run(ray_cluster, tmp_path_factory):
    folder = tmp_path_factory.mktemp("acquisitions")
    library = folder / "library.csv"
    pd.read_csv(DEMO).head(300).to_csv(library, index=False)
    assert _explore(folder / "greedy", library, "greedy") == 0
    return folder / "greedy", library


def _acquire_again(greedy_run, tmp_path: Path, acquisition: str, *flags: str, name: str = "run") -> Explored:
    """Round 1 acquired by ``acquisition`` from the greedy run's round-1 surrogate; the round's molecules."""
    greedy, library = greedy_run
    run = tmp_path / name
    shutil.copytree(greedy, run)
    settings = yaml.safe_load((run / "explore_config.yaml").read_text())
    settings.update(acquisition=acquisition, beta=float(flags[1]) if flags else settings["beta"])
    (run / "explore_config.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    write_explored(str(run / "explored.csv"), read_explored(str(run / "explored.csv")).before_round(1))
    assert _explore(run, library, acquisition, *flags) == 0
    explored = read_explored(str(run / "explored.csv"))
    return explored.select(np.flatnonzero(explored.round == 1))


def _library_predictions(greedy_run) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The surrogate's mean and std per library row, the rows round 0 took, and the best score it found."""
    greedy = greedy_run[0]
    table = pq.read_table(greedy / "round_1" / "library_predictions.parquet")
    mean, std = (table.column(c).to_numpy().astype(float) for c in ("score", "score_std"))
    first = read_explored(str(greedy / "explored.csv"))
    first = first.select(np.flatnonzero(first.round == 0))
    return mean, std, first.library_row, float(np.nanmax(first.score))


def _expected_batch(values: np.ndarray, taken: np.ndarray) -> list[int]:
    values = values.copy()
    values[taken] = np.nan
    order = np.lexsort((np.arange(len(values)), -np.nan_to_num(values, nan=-np.inf)))
    return order[:BATCH].tolist()


def test_ucb_with_beta_0_acquires_what_greedy_acquires(greedy_run, tmp_path):
    greedy = read_explored(str(greedy_run[0] / "explored.csv"))
    ucb = _acquire_again(greedy_run, tmp_path, "ucb", "--beta", "0")
    assert ucb.library_row.tolist() == greedy.library_row[greedy.round == 1].tolist()
    np.testing.assert_array_equal(ucb.acquisition_value, ucb.predicted_mean)


def test_ucb_ei_and_pi_acquire_the_best_by_their_formula(greedy_run, tmp_path):
    mean, std, taken, best = _library_predictions(greedy_run)
    assert (std[np.isfinite(std)] > 0).all()  # a mean-variance head: every molecule has a spread
    z = (mean - best - MARGIN) / std
    formulas = {"ucb": mean + 1.5 * std, "ei": (mean - best - MARGIN) * norm.cdf(z) + std * norm.pdf(z),
                "pi": norm.cdf(z)}
    for name, values in formulas.items():
        flags = ("--beta", "1.5") if name == "ucb" else ()
        batch = _acquire_again(greedy_run, tmp_path, name, *flags, name=name)
        assert batch.library_row.tolist() == _expected_batch(values, taken), name
        np.testing.assert_allclose(batch.acquisition_value, values[batch.library_row], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(batch.predicted_std, std[batch.library_row], rtol=1e-9)
    greedy = read_explored(str(greedy_run[0] / "explored.csv"))
    assert _expected_batch(formulas["ucb"], taken) != greedy.library_row[greedy.round == 1].tolist()


def test_thompson_draws_are_seeded(greedy_run, tmp_path):
    mean, std, taken, _ = _library_predictions(greedy_run)
    first, second = (_acquire_again(greedy_run, tmp_path, "thompson", name=n) for n in ("a", "b"))
    assert first.library_row.tolist() == second.library_row.tolist()  # the same seed, the same draws
    np.testing.assert_array_equal(first.acquisition_value, second.acquisition_value)
    draws = (first.acquisition_value - mean[first.library_row]) / std[first.library_row]
    assert np.all(draws != 0) and first.library_row.tolist() != _expected_batch(mean, taken)  # draws, not means
