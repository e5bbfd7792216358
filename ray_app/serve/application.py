"""The Serve application of `kermt serve`: the Gateway (HTTP) bound to one ModelReplica deployment per model."""

from __future__ import annotations

from ray_app.serve.app import Gateway
from ray_app.serve.auth import key_sha256, read_api_key
from ray_app.serve.config import ServeConfig
from ray_app.serve.featurizer import Featurizer
from ray_app.serve.models import ServedModel
from ray_app.serve.predictor import ModelReplica


# Serve notices a dead replica at its next health check (default every 10 s): requests sent meanwhile wait for a
# replica, so a replica crash cost 9-10 s of latency (tests/ray_app/serve/test_config_file.py); a ping every 2 s is
# cheap (the forward runs in a thread, the replica's event loop answers it).
HEALTH_CHECK_PERIOD_S = 2.0

# The ingress only validates and awaits the model replicas, so it holds many requests at once (Serve's default, 5,
# would cap how many requests from different clients can reach a model batch together).
GATEWAY_ONGOING_REQUESTS = 256

# Calls the ingress keeps in flight per model replica (the model's upper bound of replicas): two, so a replica
# featurises the next call's molecules while the current call's forwards run; requests arriving meanwhile wait in
# the ingress and leave together (ray_app/serve/coalesce.py)
CALLS_PER_REPLICA = 2

FEATURIZER_DEPLOYMENT = "featurizer"

# A featurizer queues requests itself, like the ingress: at 32, 64 clients left Serve's router backing off between
# retries (p99 4.5 s against 1.2 s at 256, bench/serve.py's 64-client phase with --num_featurizers 1)
FEATURIZER_ONGOING_REQUESTS = 256


def _calls_per_model(config: ServeConfig) -> int:
    """Calls the ingress keeps in flight to one model: CALLS_PER_REPLICA per replica of its upper bound."""
    return CALLS_PER_REPLICA * config.replica_range[1]


def deployment_name(model: str) -> str:
    return f"model-{model}"


def _replica_options(config: ServeConfig) -> dict:
    low, high = config.replica_range
    # a replica takes every call the ingress keeps in flight for its model (CALLS_PER_REPLICA per replica of the
    # upper bound: all of them while an autoscaling deployment is at its lower bound), and then some; before the
    # ingress coalesced requests, a bound of 2 batches' worth left the router backing off between retries at 64
    # clients and throughput fell to a fifth of 8 clients' (bench/serve.py: 117 vs 495 mol/s)
    ongoing = max(8 * config.max_batch_size, _calls_per_model(config))
    options: dict = {"max_ongoing_requests": ongoing, "health_check_period_s": HEALTH_CHECK_PERIOD_S}
    if config.use_gpu:
        options["ray_actor_options"] = {"num_gpus": config.num_gpus_per_replica}
    if low == high:
        return {**options, "num_replicas": low}
    return {**options, "autoscaling_config": {
        "min_replicas": low, "max_replicas": high, "target_ongoing_requests": config.target_ongoing_requests,
        "upscale_delay_s": config.upscale_delay_s, "downscale_delay_s": config.downscale_delay_s,
        "look_back_period_s": config.look_back_period_s,
        # replicas report their load this often: never slower than the window it is averaged over
        "metrics_interval_s": min(10.0, config.look_back_period_s)}}


def build_app(config: ServeConfig, models: list[ServedModel], api_key_sha256: str | None = None):
    """The Serve application: a Gateway bound to one ModelReplica deployment per model (``api_key_sha256``: the
    bearer key's digest when the API needs one)."""
    handles = {
        m.name: ModelReplica.options(name=deployment_name(m.name), **_replica_options(config)).bind(
            m, config.batch_size, config.max_batch_size, config.batch_wait_timeout_s, config.max_batch_atoms,
            "cuda" if config.use_gpu else "cpu", config.max_heavy_atoms)
        for m in models
    }
    featurizer = (Featurizer.options(name=FEATURIZER_DEPLOYMENT, num_replicas=config.num_featurizers,
                                     max_ongoing_requests=FEATURIZER_ONGOING_REQUESTS,
                                     health_check_period_s=HEALTH_CHECK_PERIOD_S,
                                     ray_actor_options={"num_cpus": config.featurizer_cpus}).bind(
                                         config.max_heavy_atoms)
                  if config.num_featurizers else None)
    return Gateway.options(num_replicas=1, max_ongoing_requests=GATEWAY_ONGOING_REQUESTS,
                           ray_actor_options={"num_cpus": 0}).bind(
        handles, [m.info for m in models], config.max_request_molecules,
        {m.name: m.calibrations for m in models if m.calibrations}, api_key_sha256,
        max_embed_molecules=config.max_embed_molecules, max_attribution_molecules=config.max_attribution_molecules,
        featurizer=featurizer,
        calls_per_model=_calls_per_model(config), max_requests_per_call=config.max_batch_size)


def serving_app(config: ServeConfig, models: list[ServedModel]):
    """The application ``config`` describes, its API key (``--api_key_env``) read from this process's environment:
    what `kermt serve` runs and what the Serve config file's builder (:mod:`ray_app.serve.builder`) returns."""
    key = read_api_key(config.api_key_env) if config.api_key_env else None
    return build_app(config, models, key and key_sha256(key))


__all__ = ["build_app", "deployment_name", "serving_app"]
