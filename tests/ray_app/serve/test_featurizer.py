"""`--num_featurizers N`: requests featurised by a Featurizer deployment of their own, then predicted by the model
replicas, give the numbers of the model replicas that featurise their own requests (the package's app), also with
molecule features, intervals, domain, an invalid SMILES, and many clients at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from ray import serve

from ray_app.serve.application import FEATURIZER_DEPLOYMENT
from ray_app.serve.command import Serving, load_models
from ray_app.serve.config import ServeConfig
from tests.kermt.test_inference import SMILES

APP = "kermt-featurized"
BODIES = [{"smiles": SMILES[i : i + 1 + i % 5] + ["CC(C)(C)(C)(C)C"] * (i % 3 == 0), "uncertainty": True,
           "interval": 0.9, "domain": True} for i in range(12)]


def _close(value, expected) -> bool:
    """Equal, floats to 1e-6 (requests batched together share forwards: their numbers are those of a request alone
    to ~5e-7, kermt.inference.shared)."""
    if isinstance(value, float) and isinstance(expected, float):
        return abs(value - expected) <= 1e-6
    return value == expected


@pytest.fixture(scope="module")
def featurized_url(served):
    # the package's regression model (molecule features, calibration, domain) once more, its requests featurised
    # apart: 1 model replica and 1 featurizer beside the package's 2 replicas, within 4 of the session's CPUs
    config = ServeConfig(checkpoint_dir=served.reg_dir, name="reg", app_name=APP, num_featurizers=1)
    serving = Serving(config).start(load_models(config))
    try:
        yield f"{served.url}/{APP}/predict"
    finally:
        serving.stop()


def test_a_featurizer_deployment_runs_and_changes_no_number(served, featurized_url):
    deployments = serve.status().applications[APP].deployments
    assert deployments[FEATURIZER_DEPLOYMENT].replica_states.get("RUNNING") == 1
    with httpx.Client(timeout=120) as featurized, ThreadPoolExecutor(6) as pool:
        apart = list(pool.map(lambda body: featurized.post(featurized_url, json=body), BODIES))
    for body, response in zip(BODIES, apart):
        assert response.status_code == 200, response.text
        mine = served.client.post("/models/reg/predict", json=body).json()["predictions"]
        theirs = response.json()["predictions"]
        assert [p["valid"] for p in theirs] == [p["valid"] for p in mine]
        assert {"t1_lower", "t2_upper", "domain_distance"} <= set(theirs[0])
        for one, other in zip(theirs, mine):
            assert one.keys() == other.keys()
            assert all(_close(one[key], other[key]) for key in one), (one, other)
    assert not apart[0].json()["predictions"][-1]["valid"]  # the five-valent carbon is its own entry there too
