"""Finetune configuration: upstream flag names and defaults, YAML + flag precedence, clear errors."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from pydantic import ValidationError

from kermt.errors import UserError
from ray_app.common.settings import to_yaml
from ray_app.finetune.config import FinetuneConfig, resolve


def test_upstream_defaults_and_sources():
    config, sources = resolve(["--data_path", "d.csv", "--checkpoint_path", "m.pt", "--max_lr", "0.002",
                               "--self_attention"])
    assert (config.epochs, config.batch_size, config.init_lr, config.final_lr) == (30, 32, 1e-4, 1e-4)
    assert (config.dist_coff, config.bond_drop_rate, config.split_sizes) == (0.1, 0.0, (0.8, 0.1, 0.1))
    assert config.max_lr == 0.002 and config.self_attention is True
    assert config.dataset_type is None  # no silent classification default
    assert sources["max_lr"] == "user" and sources["epochs"] == "default"
    assert config.dropout_draws == "per_molecule"  # the Ray runner's default: N workers equal 1 with dropout on


def test_flags_override_config_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"data_path": "d.csv", "epochs": 5, "max_lr": 0.003}))
    config, sources = resolve(["--config", str(path), "--epochs", "7"])
    assert config.epochs == 7 and sources["epochs"] == "user"
    assert config.max_lr == 0.003 and sources["max_lr"] == "config"


def test_yaml_round_trip_replays_the_same_config(tmp_path):
    config, _ = resolve(["--data_path", "d.csv", "--features_generator", "rdkit_2d_normalized", "--epochs", "3"])
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(config))
    again, _ = resolve(["--config", str(path)])
    assert again == config


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--data_path", "d", "--max_lrr", "1"], "unknown argument '--max_lrr' (did you mean '--max_lr'?)"),
        (["--data_path", "d", "--features_generator", "rdkit2d"], "did you mean 'rdkit_2d'"),
        (["--data_path", "d", "--split_sizes", "0.7", "0.2", "0.2"], "split_sizes must sum to 1"),
        (["--data_path", "d", "--epochs", "0"], "setting 'epochs'"),
        (["--data_path", "d", "--split_type", "predetermined"], "needs folds_file"),
        (["--data_path", "d", "--checkpoint_path", "c.pt", "--pretrained_release"], "conflict"),
        (["--data_path", "d", "--dropout_draws", "numpy"], "dropout_draws"),
    ],
)
def test_bad_settings_name_the_key(argv, message):
    with pytest.raises(ValueError) as err:
        resolve(argv)
    assert message in str(err.value)


def test_unknown_yaml_key_suggests_the_closest(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("data_path: d.csv\nbatchsize: 8\n")
    with pytest.raises(ValueError, match=r"unknown key 'batchsize' \(did you mean 'batch_size'\?\)"):
        resolve(["--config", str(path)])


def test_config_is_frozen_and_typed():
    config = FinetuneConfig(data_path="d.csv")
    with pytest.raises(ValidationError, match="frozen"):
        config.epochs = 3


def test_undirected_is_refused_with_the_reason(tmp_path):
    """Upstream crashes with undirected message passing, so it is neither a flag nor a config key; a replay file
    written before its removal holds ``undirected: null`` and still runs."""
    with pytest.raises(UserError, match=r"^--undirected: undirected message passing is not supported: upstream "):
        resolve(["--data_path", "d.csv", "--undirected", "true"])
    path = tmp_path / "run.yaml"
    path.write_text("data_path: d.csv\nundirected: true\n")
    with pytest.raises(UserError, match=r"run\.yaml: undirected: True: undirected message passing is not supported"):
        resolve(["--config", str(path)])
    path.write_text("data_path: d.csv\nundirected: null\n")
    config, sources = resolve(["--config", str(path)])
    assert "undirected" not in sources and "undirected" not in to_yaml(config)


def test_defaults_are_upstream_finetunes_preset():
    """kermt.presets is the one place the numbers are written; the flags read them (architecture flags stay unset:
    the checkpoint's, or FROM_SCRATCH's, decide)."""
    from kermt.config import ENCODER_ARCHITECTURE_KEYS, HeadConfig
    from kermt.presets import UPSTREAM_FINETUNE

    config = FinetuneConfig(data_path="d.csv", checkpoint_path="m.pt")
    training, readout = UPSTREAM_FINETUNE.training, UPSTREAM_FINETUNE.readout
    assert {k: getattr(config, k) for k in dataclasses.asdict(training)} == dataclasses.asdict(training)
    assert {k: getattr(config, k) for k in dataclasses.asdict(readout)} == dataclasses.asdict(readout)
    # padding unset: the checkpoint's, or FROM_SCRATCH's zero
    assert (config.dropout, config.padding) == (UPSTREAM_FINETUNE.encoder.dropout, None)
    assert (config.ffn_num_layers, config.ffn_num_task_specific_layers) == (
        HeadConfig.ffn_num_layers, HeadConfig.ffn_num_task_specific_layers)
    assert all(getattr(config, k) is None for k in ENCODER_ARCHITECTURE_KEYS)
    assert (config.features_generator, config.ffn_hidden_size) == (None, None)


def test_without_a_checkpoint_unset_settings_take_the_from_scratch_recipe():
    """Issue 38: a finetune from scratch trains with the recipe measured for it (descriptors in the head, a model
    sized to the data); what the user gives, by flag or file, still wins, and a checkpoint keeps upstream's."""
    from kermt.presets import FROM_SCRATCH_TRAINING, UPSTREAM_FINETUNE

    recipe = FROM_SCRATCH_TRAINING.settings()
    config, sources = resolve(["--data_path", "d.csv", "--epochs", "3"])
    assert config.features_generator == ["rdkit_2d_normalized"]
    assert {k: getattr(config, k) for k in recipe if k != "epochs"} == {k: v for k, v in recipe.items()
                                                                        if k != "epochs"}
    assert config.epochs == 3 and sources["epochs"] == "user" and sources["dropout"] == "default"
    # a run of its own feature files gets no descriptors on top (the two cannot be combined); [] asks for none
    assert FinetuneConfig(data_path="d.csv", features_path=["f.npz"]).features_generator is None
    assert FinetuneConfig(data_path="d.csv", features_generator=[]).features_generator == []
    assert resolve(["--data_path", "d.csv", "--features_generator"])[0].features_generator == []
    for start in ({"checkpoint_path": "m.pt"}, {"pretrained_release": True}):
        upstream = FinetuneConfig(data_path="d.csv", **start)
        assert upstream.epochs == FinetuneConfig.model_fields["epochs"].default
        assert (upstream.features_generator, upstream.ffn_hidden_size) == (None, None)
        assert upstream.fine_tune_coff == UPSTREAM_FINETUNE.training.fine_tune_coff
    # a run's recorded config.yaml replays to the same settings
    assert FinetuneConfig(**yaml.safe_load(to_yaml(config))) == config
