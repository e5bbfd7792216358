"""How a replica batch of requests becomes forwards (no Ray): the requests' molecules share forwards, and still
each request gets the numbers `kermt predict` gives a file of its own SMILES."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kermt.data.featurize import featurize_smiles
from ray_app.serve.models import load_served_model
from ray_app.serve.predictor import Predictor
from ray_app.serve.schemas import PredictJob
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import SMILES

# small molecules next to ones with high-degree atoms: with upstream padding, sharing a forward with them naively
# would change the small ones' numbers
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


def test_upstream_padding_forbids_naive_sharing():
    """Why the shared forwards group molecules by width: the same molecules in plain shared forwards differ."""
    predictor = Predictor(_model("upstream"), BATCH_SIZE)
    merged = featurize_smiles([s for job in JOBS for s in job.smiles])
    naive = predictor.ensemble.predict(merged, 32).mean[:, 0]
    shared = np.concatenate([_values(entries) for entries in predictor.predict_smiles(JOBS)])
    assert np.nanmax(np.abs(naive - shared)) > 1e-4


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
