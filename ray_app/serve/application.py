"""The Serve application of `kermt serve`: the Gateway (HTTP) bound to one ModelReplica deployment per model."""

from __future__ import annotations

from ray_app.serve.app import Gateway
from ray_app.serve.config import ServeConfig
from ray_app.serve.models import ServedModel
from ray_app.serve.predictor import ModelReplica


def deployment_name(model: str) -> str:
    return f"model-{model}"


def _replica_options(config: ServeConfig) -> dict:
    low, high = config.replica_range
    if low == high:
        return {"num_replicas": low}
    return {"autoscaling_config": {"min_replicas": low, "max_replicas": high}}


def build_app(config: ServeConfig, models: list[ServedModel]):
    """The Serve application: a Gateway bound to one ModelReplica deployment per model."""
    handles = {
        m.name: ModelReplica.options(name=deployment_name(m.name), **_replica_options(config)).bind(
            m, config.batch_size, config.max_batch_size, config.batch_wait_timeout_s)
        for m in models
    }
    return Gateway.options(num_replicas=1, ray_actor_options={"num_cpus": 0}).bind(
        handles, [m.info for m in models], config.max_request_molecules)


__all__ = ["build_app", "deployment_name"]
