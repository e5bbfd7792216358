"""How a replica batch of requests becomes forwards (no Ray): the requests' molecules share forwards, and still
each request gets the numbers `kermt predict` gives a file of its own SMILES."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kermt.data.featurize import featurize_smiles
from kermt.inference import Ensemble
from ray_app.serve.models import load_served_model
from ray_app.serve.predictor import Predictor
from ray_app.serve.schemas import PredictJob
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import SMILES

# small molecules next to ones with high-degree atoms: with upstream's batching, sharing a batch with them would change
# the small ones' numbers
JOBS = [PredictJob(tuple(SMILES[:3])), PredictJob(("CC(C)(C)C(F)(F)F", "not_a_smiles", "C"), uncertainty=True),
        PredictJob(tuple(SMILES[3:12])), PredictJob(("O=S(=O)(O)c1ccccc1", *SMILES[12:15]))]
BATCH_SIZE = 2  # each request is cut into several batches of the batch rule, of different widths


def _model(padding: str):
    served = load_served_model("m", FIXTURE_DIR / "ckpt_ft_cls.pt", default=True, trust_checkpoint=False)
    member = served.members[0]
    spec = dataclasses.replace(member.spec, encoder=dataclasses.replace(member.spec.encoder, padding=padding))
    return dataclasses.replace(served, members=[dataclasses.replace(member, spec=spec)],
                               info=served.info.model_copy(update={"padding": padding}))


def _values(entries: list[dict], task: str = "c1") -> np.ndarray:
    return np.array([np.nan if e[task] is None else e[task] for e in entries], dtype=float)


@pytest.mark.parametrize("padding", ["upstream", "zero"])
@pytest.mark.parametrize("max_batch_atoms", [None, 40])
def test_each_request_gets_kermt_predicts_numbers_for_its_own_file(padding, max_batch_atoms):
    predictor = Predictor(_model(padding), BATCH_SIZE, max_batch_atoms)
    together = predictor.predict_smiles(JOBS)
    for job, entries in zip(JOBS, together):
        # what kermt predict --batch_size 2 computes for a file holding this request's SMILES
        alone = predictor.ensemble.predict(featurize_smiles(job.smiles), BATCH_SIZE).mean[:, 0]
        assert [e["smiles"] for e in entries] == list(job.smiles)
        np.testing.assert_allclose(_values(entries), alone, rtol=0, atol=1e-6)
    assert together[1][1]["valid"] is False and together[1][1]["c1"] is None
    assert "c1_std" in together[1][0] and "c1_std" not in together[0][0]


@pytest.mark.parametrize("padding", ["upstream", "zero"])
def test_single_smiles_requests_equal_a_batch_prediction(padding):
    """Serve follows the batch-independent rule: a SMILES sent alone gets the number it gets in a file of many."""
    predictor = Predictor(_model(padding), 32)
    smiles = [s for job in JOBS for s in job.smiles]
    batch = predictor.ensemble.predict(featurize_smiles(smiles), 32).mean[:, 0]
    alone = predictor.predict_smiles([PredictJob((s,)) for s in smiles])  # each SMILES its own request
    singles = np.concatenate([_values(entries) for entries in alone])
    np.testing.assert_allclose(singles, batch, rtol=0, atol=1e-6)
    if padding == "upstream":  # the test can fail: upstream's batching of the same file moves the numbers
        upstream = Ensemble(_model(padding).members, upstream_batching=True).predict(featurize_smiles(smiles),
                                                                                     BATCH_SIZE)
        assert np.nanmax(np.abs(upstream.mean[:, 0] - batch)) > 1e-4


def test_a_standardising_model_gives_a_salt_its_parent_acids_entry(tmp_path):
    from tests.kermt.chem.test_standardize import standardizing_checkpoint

    served = load_served_model("m", standardizing_checkpoint(tmp_path / "model"), default=True,
                               trust_checkpoint=False)
    assert served.info.standardize == "parent"
    salt, acid, plain = Predictor(served, BATCH_SIZE).predict_smiles(
        [PredictJob(("CC(=O)[O-].[Na+]", "CCO")), PredictJob(("CC(=O)O",)), PredictJob(("C" * 300,))])
    assert [e["model_smiles"] for e in salt] == ["CC(=O)O", ""] and acid[0]["model_smiles"] == ""
    np.testing.assert_allclose(_values(salt[:1]), _values(acid), rtol=0, atol=1e-6)
    assert plain[0]["valid"] is False and plain[0]["error"].startswith("too large: 300 heavy atoms")
    # a model that records no standardisation (upstream's) keeps the counter-ion and has no model_smiles
    upstream = Predictor(_model("zero"), BATCH_SIZE).predict_smiles([PredictJob(("CC(=O)[O-].[Na+]",))])[0][0]
    assert "model_smiles" not in upstream and upstream["valid"]
