"""`kermt explore`'s settings: finetune's flags configure each round's surrogate; the ones explore decides are not
flags of it."""

from __future__ import annotations

import pytest

from kermt.errors import UserError
from ray_app.common.settings import resolve
from ray_app.explore.config import EXPLORE_DECIDES, ExploreConfig
from ray_app.finetune.config import FinetuneConfig

BASE = ["--library", "lib.csv", "--objective", "lookup:lib.csv:y", "--init_size", "0.01", "--acquire_size", "50",
        "--iterations", "3"]


def _config(*flags: str) -> ExploreConfig:
    return resolve([*BASE, *flags], ExploreConfig, "kermt explore")[0]


def test_each_round_is_a_finetune_of_what_was_scored_with_the_users_flags():
    config = _config("--epochs", "7", "--ensemble_size", "3", "--acquisition", "ucb", "--seed", "4",
                     "--validation_share", "0.2", "--features_generator", "rdkit_2d_normalized")
    surrogate = config.surrogate(2, "runs/x/round_2/scored.csv", "runs/x/round_2")
    assert isinstance(surrogate, FinetuneConfig)
    assert (surrogate.data_path, surrogate.save_dir, surrogate.smiles_column, surrogate.target_columns) == (
        "runs/x/round_2/scored.csv", "runs/x/round_2", "smiles", ["score"])
    assert surrogate.split_sizes == pytest.approx((0.8, 0.2, 0.0))  # a validation share, no test split
    assert (surrogate.epochs, surrogate.ensemble_size, surrogate.seed, surrogate.dataset_type) == (
        7, 3, 4, "regression")
    assert surrogate.features_generator == ["rdkit_2d_normalized"]


@pytest.mark.parametrize("flag", ["--data_path", "--split_sizes", "--separate_test_path", "--num_folds"])
def test_what_explore_decides_is_not_a_flag(flag):
    assert flag.removeprefix("--") in EXPLORE_DECIDES
    with pytest.raises(UserError, match=f"unknown argument '{flag}'"):
        _config(flag, "x")


def test_a_surrogate_setting_finetune_refuses_is_refused_before_any_work():
    with pytest.raises(UserError, match="pretrained_release and checkpoint_path conflict"):
        _config("--pretrained_release", "--checkpoint_path", "model.pt")


def test_an_ensemble_or_mve_gives_the_uncertainty_ucb_needs():
    assert _config("--acquisition", "thompson", "--loss", "mve").uncertainty_missing() is None
    assert _config("--acquisition", "ei", "--ensemble_size", "2").uncertainty_missing() is None
    assert "no spread" in _config().uncertainty_missing()


def test_a_surrogates_messages_name_validation_share_not_split_sizes():
    surrogate = _config("--validation_share", "0.2").surrogate(1, "scored.csv", "round_1")
    assert surrogate.split_flag == "--validation_share"  # e.g. a validation split too small to calibrate on
    assert surrogate.model_copy(update={"epochs": 3}).split_flag == "--validation_share"
    assert FinetuneConfig(data_path="x.csv").split_flag == "--split_sizes"


def test_warm_start_starts_a_surrogate_from_the_previous_rounds_model():
    config = _config("--warm_start", "--checkpoint_path", "encoder.pt")
    assert config.surrogate(1, "scored.csv", "round_1").checkpoint_path == "encoder.pt"  # round 1: no previous
    warm = config.surrogate(2, "scored.csv", "round_2", previous_model="round_1/fold_0/model_0/model")
    assert (warm.checkpoint_path, warm.pretrained_release) == ("round_1/fold_0/model_0/model", False)
