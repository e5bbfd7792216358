"""How `kermt finetune`'s head settings reach the model a from-scratch run builds (run_setup.model_config)."""

from __future__ import annotations

from pathlib import Path

from ray_app.finetune.config import FinetuneConfig
from ray_app.finetune.run_setup import RunSetup, model_config


def _setup(**settings) -> RunSetup:
    config = FinetuneConfig(data_path="d.csv", **settings)
    return RunSetup(config, {}, Path("runs/x"), "run", "regression", "rmse", ["y"], None, None, None, None)


def test_the_features_ffn_is_built_only_where_there_are_features():
    head = model_config(_setup(features_ffn=True), features_size=200).head
    assert head.features_ffn and head.features_size == 200
    # --features_generator with no names: nothing to feed it, so the head is the plain one, not an error
    assert not model_config(_setup(features_ffn=True, features_generator=[]), features_size=0).head.features_ffn
    assert not model_config(_setup(features_ffn=False), features_size=200).head.features_ffn
