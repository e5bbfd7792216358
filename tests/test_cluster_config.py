"""cluster.yaml is a valid Ray cluster-launcher config (Ray's own schema), shaped as documented."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from ray_app.serve.config import ServeConfig

ROOT = Path(__file__).resolve().parents[1]


def _load(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text())


def test_cluster_yaml_passes_rays_schema_and_autoscales_gpus_from_zero():
    config = _load("cluster.yaml")
    validate_config(prepare_config(copy.deepcopy(config)))
    nodes = config["available_node_types"]
    head = nodes[config["head_node_type"]]
    assert head["resources"] == {"CPU": 0} and "InstanceMarketOptions" not in head["node_config"]
    assert nodes["gpu_worker"]["min_workers"] == 0 and nodes["gpu_worker"]["max_workers"] > 0
    assert nodes["gpu_worker"]["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"


def test_schema_check_rejects_a_typo():
    config = _load("cluster.yaml")
    config["available_node_types"]["gpu_worker"]["min_wokers"] = 1
    with pytest.raises(Exception, match="min_wokers"):
        validate_config(prepare_config(config))


def test_job_specs_parse_and_point_at_the_entry_point():
    rayjob = _load("jobs/k8s/rayjob-finetune.yaml")
    assert rayjob["kind"] == "RayJob" and "python -m jobs.finetune" in rayjob["spec"]["entrypoint"]
    assert rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["minReplicas"] == 0
    assert rayjob["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is True  # the GPU group grows from 0 pods
    runtime_env = _load("jobs/runtime_env.yaml")
    assert ".venv" in runtime_env["excludes"]


def _ray_version_of_dockerfile() -> str:
    base = next(line.split()[1] for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("FROM"))
    return base.split(":")[1].split("-")[0]  # rayproject/ray:2.60.0-py311-gpu -> 2.60.0


def test_serve_config_file_passes_serves_schema_and_its_args_are_kermt_serve_settings():
    from ray.serve.schema import ServeDeploySchema

    config = _load("serve_config.yaml")
    ServeDeploySchema.model_validate(config)
    (application,) = config["applications"]
    settings = ServeConfig.model_validate(application["args"])
    assert application["import_path"] == "ray_app.serve.builder:build"
    assert config["http_options"]["host"] == "0.0.0.0" and settings.api_key_env  # every interface: with a key
    assert settings.use_gpu and settings.replica_range[0] >= 1


def test_rayservice_embeds_the_serve_config_file_on_cluster_yamls_shape():
    import ray

    service = _load("kuberay-rayservice.yaml")
    assert service["apiVersion"] == "ray.io/v1" and service["kind"] == "RayService"
    assert yaml.safe_load(service["spec"]["serveConfigV2"]) == _load("serve_config.yaml")  # one application
    cluster = service["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == _ray_version_of_dockerfile() == ray.__version__
    head, (gpu,) = cluster["headGroupSpec"], cluster["workerGroupSpecs"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # as cluster.yaml's head: no replica there
    assert _load("cluster.yaml")["available_node_types"]["head_cpu"]["resources"] == {"CPU": 0}
    rayjob_image = _load("jobs/k8s/rayjob-finetune.yaml")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"][
        "spec"]["containers"][0]["image"]
    containers = head["template"]["spec"]["containers"] + gpu["template"]["spec"]["containers"]
    assert {c["image"] for c in containers} == {rayjob_image}  # the repository's Dockerfile image
    # every Serve replica of the autoscaling range fits: one GPU each (num_gpus_per_replica 1), pods up to the max
    settings = ServeConfig.model_validate(_load("serve_config.yaml")["applications"][0]["args"])
    gpus_per_pod = int(gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus_per_pod // settings.num_gpus_per_replica >= 1
    assert gpu["maxReplicas"] * gpus_per_pod >= settings.replica_range[1] * settings.num_gpus_per_replica
    assert gpu["minReplicas"] * gpus_per_pod >= settings.replica_range[0] * settings.num_gpus_per_replica
    assert cluster["enableInTreeAutoscaling"] is True
    secret_env = {e["name"] for c in containers for e in c.get("env", [])}
    assert settings.api_key_env in secret_env  # read where Serve runs the builder
