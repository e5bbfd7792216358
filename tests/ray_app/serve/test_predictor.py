"""How a replica batch of requests becomes forwards (no Ray): a request's numbers never depend on the others'."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kermt.inference import Ensemble, read_members
from ray_app.serve.predictor import predict_jobs
from ray_app.serve.schemas import PredictJob
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import SMILES

# small molecules next to a larger one with a high-degree atom: with upstream padding, sharing a forward with it
# would change the small ones' numbers
JOBS = [PredictJob(tuple(SMILES[:3])), PredictJob(("CC(C)(C)C(F)(F)F", "not_a_smiles"), uncertainty=True),
        PredictJob(tuple(SMILES[3:8]))]


def _ensemble(padding: str) -> Ensemble:
    members = read_members([FIXTURE_DIR / "ckpt_ft_cls.pt"])
    spec = members[0].spec
    encoder = dataclasses.replace(spec.encoder, padding=padding)
    return Ensemble([dataclasses.replace(members[0], spec=dataclasses.replace(spec, encoder=encoder))])


def _values(entries: list[dict], task: str = "c1") -> np.ndarray:
    return np.array([np.nan if e[task] is None else e[task] for e in entries], dtype=float)


@pytest.mark.parametrize("padding, merge", [("upstream", False), ("zero", True)])
def test_each_request_gets_the_numbers_it_gets_alone(padding, merge):
    ensemble = _ensemble(padding)
    together = predict_jobs(ensemble, (), JOBS, batch_size=32, merge=merge)
    for job, entries in zip(JOBS, together):
        alone = predict_jobs(ensemble, (), [job], batch_size=32, merge=False)[0]
        assert [e["smiles"] for e in entries] == list(job.smiles)
        np.testing.assert_allclose(_values(entries), _values(alone), rtol=0, atol=1e-6)
    assert together[1][1]["valid"] is False and together[1][1]["c1"] is None
    assert "c1_std" in together[1][0] and "c1_std" not in together[0][0]


def test_upstream_padding_would_not_allow_merging():
    """Why upstream-padding models are never merged: the same molecules, one forward with the others, differ."""
    ensemble = _ensemble("upstream")
    merged = predict_jobs(ensemble, (), JOBS, batch_size=32, merge=True)
    alone = predict_jobs(ensemble, (), JOBS, batch_size=32, merge=False)
    assert max(np.nanmax(np.abs(_values(a) - _values(b))) for a, b in zip(merged, alone)) > 1e-6
