"""Search spaces and `kermt tune` settings: parsing, validation messages, conditionals, derived LRs (no Ray cluster)."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
import yaml

from kermt.errors import UserError
from kermt.run_layout import SWEEP_FILE
from ray_app.cli import main as cli_main
from ray_app.finetune.config import FinetuneConfig, resolve
from ray_app.tune.search_space import (
    PRESETS,
    TUNABLE,
    SearchSpaceError,
    load_space,
    parse_space,
    preset,
    trial_settings,
)
from ray_app.tune.command import main
from ray_app.tune.config import TuneConfig, sweep_changes, sweep_record
from tests.conftest import FIXTURE_DIR

ROOT = Path(__file__).resolve().parents[3]
BASE = FinetuneConfig(data_path="d.csv")
SMILES_CSV = str(FIXTURE_DIR / "smiles.csv")


def test_sample_space_file_parses_with_every_sampler_kind():
    space = load_space(ROOT / "jobs/configs/tune_space.yaml")
    kinds = {p.name: p.kind for p in space.parameters}
    assert kinds == {"max_lr": "loguniform", "final_lr_factor": "choice", "init_lr_factor": "fixed",
                     "dropout": "uniform", "self_attention": "choice", "attn_out": "choice",
                     "ffn_num_layers": "choice", "ffn_hidden_size": "choice", "batch_size": "choice"}
    attn_out = next(p for p in space.parameters if p.name == "attn_out")
    assert attn_out.values == (4, 8) and attn_out.when == (("self_attention", True),)


def test_conditional_parameter_is_sampled_only_when_its_condition_holds():
    space = parse_space({"self_attention": {"choice": [False, True]},
                         "attn_out": {"choice": [4, 8], "when": {"self_attention": True}},
                         "init_lr_factor": 10})
    # FixedTrial raises if asked for a parameter it was not given: attn_out must not be asked for here
    assert space(optuna.trial.FixedTrial({"self_attention": False})) == {"init_lr_factor": 10}
    on = optuna.trial.FixedTrial({"self_attention": True, "attn_out": 8})
    assert space(on) == {"init_lr_factor": 10} and on.params == {"self_attention": True, "attn_out": 8}


def test_sampled_values_stay_in_range_and_choices():
    space = parse_space({"max_lr": {"loguniform": [1e-4, 1e-2]}, "dropout": {"uniform": [0.0, 0.3]},
                         "batch_size": {"choice": [16, 32]}})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        space(trial)
        assert 1e-4 <= trial.params["max_lr"] <= 1e-2 and 0.0 <= trial.params["dropout"] <= 0.3
        assert trial.params["batch_size"] in (16, 32)


def test_conditions_on_sweep_settings_are_decided_once():
    all_mode = preset("all")
    assert "attn_out" not in all_mode.resolved(BASE).names
    with_readout = all_mode.resolved(BASE.model_copy(update={"self_attention": True}))
    assert "attn_out" in with_readout.names and dict(p.when for p in with_readout.parameters if p.when) == {}


def test_upstream_presets():
    openadmet = {p.name: p for p in preset("openadmet").parameters}
    assert openadmet["max_lr"].values == (5e-4, 1e-3, 1.5e-3, 2e-3)
    assert openadmet["final_lr_factor"].values == (10, 50, 100) and openadmet["ffn_num_layers"].values == (1,)
    assert openadmet["batch_size"].values == (32, 64, 128)
    everything = {p.name: p for p in preset("all").parameters}
    assert everything["ffn_hidden_size"].values == (700, 1300)
    assert everything["final_lr_factor"].values == (2, 4, 6, 8, 10)


def test_derived_learning_rates_follow_max_lr():
    settings = trial_settings({"max_lr": 1e-3, "final_lr_factor": 4, "init_lr_factor": 10, "dropout": 0.1}, BASE)
    assert settings == {"max_lr": 1e-3, "final_lr": 2.5e-4, "init_lr": 1e-4, "dropout": 0.1}
    # without a sampled max_lr the factor applies to the sweep's max_lr
    assert math.isclose(trial_settings({"final_lr_factor": 2}, BASE)["final_lr"], BASE.max_lr / 2)


@pytest.mark.parametrize("space, message", [
    ({"dropuot": {"choice": [0.1]}}, "dropuot: unknown setting (did you mean 'dropout'?)"),
    ({"data_path": "x.csv"}, "data_path: not a tunable setting"),
    ({"dropout": {"choise": [0.1]}}, "dropout: unknown key 'choise' (did you mean 'choice'?)"),
    ({"dropout": {"choice": [0.1], "uniform": [0, 1]}}, "dropout: give exactly one of"),
    ({"dropout": {"choice": []}}, "dropout: choice needs a non-empty list"),
    ({"dropout": {"choice": [0.1, 1.5]}}, "dropout: 1.5 is invalid: Input should be less than 1"),
    ({"batch_size": {"uniform": [16, 64]}}, "batch_size is not a float setting: use choice"),
    ({"max_lr": {"uniform": [1e-3, 1e-4]}}, "max_lr: uniform needs low < high"),
    ({"weight_decay": {"loguniform": [0.0, 1e-3]}}, "weight_decay: loguniform needs low > 0"),
    ({"dropout": {"uniform": [0.1]}}, "dropout: uniform needs [low, high] numbers"),
    ({"attn_out": {"choice": [4], "when": {"self_atention": True}}}, "did you mean 'self_attention'?"),
    ({"self_attention": {"choice": [False]}, "attn_out": {"choice": [4], "when": {"self_attention": True}}},
     "attn_out: when self_attention: True can never hold"),
    ({"final_lr": {"choice": [1e-4]}, "final_lr_factor": {"choice": [2]}}, "give final_lr or final_lr_factor"),
    ({"init_lr_factor": 0}, "init_lr_factor: 0 is not a positive number"),
    ([1, 2], "expected a non-empty mapping"),
])
def test_bad_spaces_name_the_key(space, message):
    with pytest.raises(SearchSpaceError) as error:
        parse_space(space, "space.yaml")
    assert message in str(error.value) and str(error.value).startswith("space.yaml")


def test_tune_settings_validate_the_sweep():
    config, sources = resolve(["--data_path", "d.csv", "--n_trials", "3", "--num_workers_per_trial", "2"],
                              TuneConfig, "kermt tune")
    assert (config.search, config.scheduler, config.hpo_mode) == ("optuna", "asha", None)
    base = config.finetune_base()
    assert type(base) is FinetuneConfig and base.worker_range == (2, 2) and base.max_concurrent_trials is None
    with pytest.raises(ValueError, match="setting 'n_trials'"):
        resolve(["--data_path", "d.csv"], TuneConfig, "kermt tune")
    with pytest.raises(ValueError, match="hpo_mode and search_space conflict"):
        resolve(["--data_path", "d", "--n_trials", "1", "--hpo_mode", "all", "--search_space", "s.yaml"],
                TuneConfig, "kermt tune")
    with pytest.raises(ValueError, match="num_folds and ensemble_size apply to `kermt finetune"):
        resolve(["--data_path", "d", "--n_trials", "1", "--num_folds", "3"], TuneConfig, "kermt tune")
    with pytest.raises(ValueError, match="overwrite is a `kermt finetune` setting: a sweep re-run .* resumes it"):
        resolve(["--data_path", "d", "--n_trials", "1", "--overwrite"], TuneConfig, "kermt tune")


def _tune_error(argv: list[str], capsys) -> str:
    """``kermt tune ARGV`` through the entry point: exit 2 and one error line (returned), before Ray starts."""
    assert cli_main(["tune", "--data_path", SMILES_CSV, *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kermt tune: error: "), lines
    return lines[0]


def test_cli_rejects_bad_input_before_starting_ray(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"max_lr": {"loguniform": [0, 1e-3]}}))
    assert "space.yaml: max_lr: loguniform needs low > 0" in _tune_error(["--n_trials", "2", "--search_space",
                                                                          str(space)], capsys)
    line = _tune_error(["--n_trials", "2", "--search_space", str(tmp_path / "none.yaml")], capsys)
    assert "cannot read search space" in line and "none.yaml" in line
    with pytest.raises(UserError, match="loguniform needs low > 0"):  # the library raises, the entry point prints
        main(["--data_path", "d.csv", "--n_trials", "2", "--search_space", str(space)])


def test_undirected_is_neither_a_flag_nor_a_tunable(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"undirected": {"choice": [False, True]}}))
    line = _tune_error(["--n_trials", "2", "--search_space", str(space)], capsys)
    assert "space.yaml: undirected: undirected message passing is not supported: upstream KERMT crashes" in line
    assert "--undirected: undirected message passing is not supported" in _tune_error(
        ["--n_trials", "2", "--undirected", "true"], capsys)
    assert "undirected" not in TUNABLE and "undirected" not in FinetuneConfig.model_fields
    assert all("undirected" not in space for space in PRESETS.values())


def test_an_unreadable_sweep_record_is_refused(tmp_path, capsys):
    """(A sweep of other settings is moved aside: tests/ray_app/tune/test_resume.py.)"""
    (tmp_path / "tune_config.yaml").write_text("n_trials: [4\n")
    line = _tune_error(["--n_trials", "6", "--save_dir", str(tmp_path)], capsys)
    assert "tune_config.yaml: cannot read the sweep's recorded settings" in line


def test_a_sweep_resumes_when_only_settings_that_change_no_trial_differ(tmp_path):
    """The settings a finetune may resume with changed (RESUMABLE_CHANGES) may change for a sweep too, also when
    the sweep's file still records them (written before they were left out of it)."""
    config = TuneConfig(data_path=SMILES_CSV, n_trials=4, save_dir=str(tmp_path))
    recorded = {**sweep_record(config), "tensorboard": False, "trust_checkpoint": False}
    (tmp_path / SWEEP_FILE).write_text(yaml.safe_dump(recorded))
    changed = config.model_copy(update={"tensorboard": True, "show_individual_scores": True, "max_failures": 1,
                                        "trust_checkpoint": True, "max_concurrent_trials": 2})
    assert sweep_changes(changed) == []
    assert sweep_changes(changed.model_copy(update={"epochs": 31})) == [f"epochs: {config.epochs} -> 31"]
