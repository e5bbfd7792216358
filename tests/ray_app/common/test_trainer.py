"""Ray's TorchTrainer with kermt's three changes (ray_app/common/trainer.py): the elastic policy it hands to the
controller, the callbacks it starts a run with, and the loop config that reaches the workers but not the
controller."""

from __future__ import annotations

import pytest
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy

from ray_app.common.elastic import LiveNodesElasticPolicy
from ray_app.common.trainer import KermtTrainer


class _PolicySeen(Exception):
    pass


class _StopsAtTheController(TorchTrainer):
    """Below KermtTrainer in the MRO: sees the policy the controller would get, and launches nothing."""

    def _initialize_and_run_controller(self, **controller_init_kwargs):
        raise _PolicySeen(controller_init_kwargs["scaling_policy"])


class _ElasticTrainerProbe(KermtTrainer, _StopsAtTheController):
    pass


@pytest.mark.parametrize("num_workers, policy", [((1, 2), LiveNodesElasticPolicy), (2, FixedScalingPolicy)])
def test_an_elastic_run_gets_the_live_nodes_policy_and_a_fixed_run_rays_own(ray_cluster, tmp_path, num_workers,
                                                                             policy):
    trainer = _ElasticTrainerProbe(lambda: None, scaling_config=ScalingConfig(num_workers=num_workers),
                                   run_config=RunConfig(name="probe", storage_path=str(tmp_path)))
    with pytest.raises(_PolicySeen) as seen:
        trainer.fit()
    assert type(seen.value.args[0]) is policy


def test_a_run_without_ray_datasets_gets_no_ray_data_callback_and_one_with_them_keeps_it(ray_cluster, tmp_path):
    import ray.data

    from ray_app.common.ray_internals import train_datasets_callback

    def callback_types(trainer_type, **datasets) -> set[str]:
        trainer = trainer_type(lambda: None, scaling_config=ScalingConfig(num_workers=1), datasets=datasets or None,
                               run_config=RunConfig(name="callbacks", storage_path=str(tmp_path)))
        return {type(callback).__name__ for callback in trainer._create_default_callbacks()}

    name = train_datasets_callback().__name__
    assert name in callback_types(TorchTrainer)  # Ray's own: a DatasetManager actor for every run
    ours = callback_types(KermtTrainer)
    assert name not in ours and ours == callback_types(TorchTrainer) - {name}
    assert name in callback_types(KermtTrainer, train=ray.data.range(4))


def _what_the_loop_got(config: dict) -> dict:
    return {"seen": config["marker"], "ref_resolved": ray.get(config["ref"])}


def test_the_loop_gets_its_config_and_the_controller_only_a_reference(ray_cluster, tmp_path):
    """The run's context, which the Train controller unpickles, holds no loop config; the function the workers call
    gets it whole, object references inside it included (called here: every finetune test runs it on workers)."""
    trainer = KermtTrainer(_what_the_loop_got, train_loop_config={"marker": "config", "ref": ray.put(7)},
                           scaling_config=ScalingConfig(num_workers=1),
                           run_config=RunConfig(name="config", storage_path=str(tmp_path)))
    assert trainer.train_loop_config is None and trainer.train_run_context.train_loop_config is None
    assert trainer.train_loop_per_worker() == {"seen": "config", "ref_resolved": 7}
