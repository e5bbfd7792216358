"""The TorchTrainer every kermt training run uses (a finetune's members, a pretraining): Ray's, with three changes
that cost nothing in behaviour.

- Elastic runs (``--num_workers MIN-MAX``) are sized by :class:`~ray_app.common.elastic.LiveNodesElasticPolicy`,
  which counts only nodes that are alive (elastic.py says why); fixed-size runs keep Ray's own policy.
- ``train_loop_config`` reaches the workers through the object store. Ray hands it to the Train controller inside
  the run's context, and unpickling it there imports the module of every class in it (our plans and shard lists,
  with kermt under them); the loop function itself travels as an object the controller never opens, so the config
  rides along with it as a reference. The saving is small: the controller imports torch anyway, for Ray's
  TorchConfig; what it no longer imports is our code.
- A run given no Ray datasets starts no Ray Data actor (ray_internals.train_datasets_callback says why): our workers
  read their own shard files.

Ray's private names used here are described, and checked against the installed Ray, in
ray_app/common/ray_internals.py (the ``scaling_policy`` keyword of ``_initialize_and_run_controller``,
``_create_default_callbacks``, ``DatasetsCallback``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import ray
from ray.train.torch import TorchTrainer

from ray_app.common.elastic import ElasticScalingPolicy, LiveNodesElasticPolicy
from ray_app.common.ray_internals import SCALING_POLICY_KEYWORD, train_datasets_callback


def _with_stored_config(train_loop: Callable[[dict], Any], config: ray.ObjectRef) -> Any:
    return train_loop(ray.get(config))


class KermtTrainer(TorchTrainer):
    """``TorchTrainer(train_loop_per_worker, train_loop_config=..., ...)``, as Ray's, with the module's three
    changes."""

    def __init__(self, train_loop_per_worker: Callable[[dict], Any], *,
                 train_loop_config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if train_loop_config is not None:
            train_loop_per_worker = partial(_with_stored_config, train_loop_per_worker, ray.put(train_loop_config))
        super().__init__(train_loop_per_worker, **kwargs)

    def _initialize_and_run_controller(self, **controller_init_kwargs):
        if type(controller_init_kwargs.get(SCALING_POLICY_KEYWORD)) is ElasticScalingPolicy:
            controller_init_kwargs[SCALING_POLICY_KEYWORD] = LiveNodesElasticPolicy(self.scaling_config)
        return super()._initialize_and_run_controller(**controller_init_kwargs)

    def _create_default_callbacks(self):
        callbacks = super()._create_default_callbacks()
        if self.datasets:
            return callbacks
        datasets_callback = train_datasets_callback()
        return [callback for callback in callbacks if not isinstance(callback, datasets_callback)]


__all__ = ["KermtTrainer"]
