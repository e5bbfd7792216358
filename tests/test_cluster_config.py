"""cluster.yaml is a valid Ray cluster-launcher config (Ray's own schema), shaped as documented."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

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
