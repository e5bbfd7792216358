"""`kermt serve`'s settings: errors name the flag, before anything starts."""

from __future__ import annotations

import pytest

from kermt.errors import UserError
from ray_app.serve.command import load_models, main
from ray_app.serve.config import ServeConfig
from tests.conftest import FIXTURE_DIR


def test_defaults_bind_loopback_and_models_come_default_first():
    config = ServeConfig(checkpoint_dir="runs/a", model=["b=s3://bucket/b", "c=runs/c"])
    assert (config.host, config.port, config.max_request_molecules) == ("127.0.0.1", 8000, 1000)
    assert config.model_sources() == [("default", "runs/a"), ("b", "s3://bucket/b"), ("c", "runs/c")]
    assert ServeConfig(model=["x=runs/x"]).model_sources() == [("x", "runs/x")]
    assert ServeConfig(checkpoint_dir="a", num_replicas="1-4").replica_range == (1, 4)


@pytest.mark.parametrize("argv, message", [
    ([], "--checkpoint_dir"),
    (["--model", "runs/x"], "NAME=DIR_OR_URI"),
    (["--checkpoint_dir", "a", "--model", "default=b"], "given twice"),
    (["--checkpoint_dir", "a", "--num_replicas", "4-2"], "num_replicas"),
    (["--checkpoint_dir", "a", "--max_request_molecules", "0"], "max_request_molecules"),
])
def test_bad_settings_are_user_errors_naming_the_setting(argv, message):
    with pytest.raises(UserError, match=message):
        main(argv)


def test_a_missing_model_is_named_before_ray_starts(tmp_path):
    config = ServeConfig(checkpoint_dir=str(FIXTURE_DIR / "ckpt_ft_cls.pt"), model=[f"tox={tmp_path / 'nope'}"])
    with pytest.raises(UserError, match="tox"):
        load_models(config)


def test_use_gpu_gives_each_model_replica_its_gpus():
    from ray_app.serve.application import _replica_options

    assert "ray_actor_options" not in _replica_options(ServeConfig(checkpoint_dir="a"))
    options = _replica_options(ServeConfig(checkpoint_dir="a", use_gpu=True, num_gpus_per_replica=0.5,
                                           num_replicas="1-3"))
    assert options["ray_actor_options"] == {"num_gpus": 0.5} and options["autoscaling_config"]["max_replicas"] == 3
