"""``"attributions": true`` over real HTTP (the package's running `kermt serve`): per task the atom lists, baseline
and descriptor share that `kermt predict --attributions` writes for the same molecules and model; a molecule over the
attributions' budget keeps its prediction with a note; more molecules than the cap is a 413; with ``depict`` each
entry's atoms are drawn coloured by their shares."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rdkit import Chem

from kermt.inference import Ensemble, read_members
from kermt.inference.attributions import MAX_HEAVY_ATOMS
from ray_app.serve.attributions import ServedAttributions
from ray_app.common.atom_colours import share_colour
from ray_app.serve.depict import depict_attributions
from ray_app.serve.models import load_served_model
from ray_app.serve.predictor import Predictor
from ray_app.serve.schemas import PredictJob
from tests.conftest import FIXTURE_DIR
from tests.ray_app.serve.conftest import MAX_ATTRIBUTION_MOLECULES
from tests.ray_app.serve.test_serve import REQUEST, _column, _post, kermt_predict

LONG_CHAIN = "C" * (MAX_HEAVY_ATOMS + 20)  # over the attributions' budget, under --max_heavy_atoms
ATTRIBUTED = [*REQUEST, LONG_CHAIN]  # 11 molecules: one invalid, one over the budget
REGRESSION = FIXTURE_DIR / "ckpt_ft_reg.pt"


def _atoms_of_file(cells) -> list:
    return [json.loads(cell) if isinstance(cell, str) else None for cell in cells]


@pytest.mark.parametrize("model, tasks, descriptors", [("reg", ("t1", "t2"), True), ("cls", ("c1", "c2"), False)])
def test_attributions_equal_kermt_predict_attributions(served, tmp_path, model, tasks, descriptors):
    source = served.reg_dir if model == "reg" else served.config.checkpoint_dir
    predictions = _post(served.client, f"/models/{model}/predict", ATTRIBUTED, attributions=True)["predictions"]
    expected = kermt_predict(tmp_path, ["--checkpoint_dir", source], ATTRIBUTED, "--attributions")
    for task in tasks:
        assert [p[f"{task}_atoms"] for p in predictions] == _atoms_of_file(expected[f"{task}_atoms"])
        for suffix in ("", "_baseline", *(("_descriptors",) if descriptors else ())):
            np.testing.assert_allclose(_column(predictions, task + suffix), expected[task + suffix].to_numpy(),
                                       rtol=0, atol=1e-6)
        assert (f"{task}_descriptors" in predictions[0]) == descriptors
        atoms = predictions[0][f"{task}_atoms"]
        assert len(atoms) == Chem.MolFromSmiles(ATTRIBUTED[0]).GetNumAtoms() and np.ptp(atoms) > 0
    notes = [p["attributions_note"] for p in predictions]
    assert notes[:-1] == [None] * 10
    assert predictions[5]["valid"] is False and predictions[5][f"{tasks[0]}_atoms"] is None
    chain = predictions[-1]  # its prediction is kept, its attribution values are null, a note says why
    assert chain["valid"] and isinstance(chain[tasks[0]], float) and chain[f"{tasks[0]}_atoms"] is None
    assert chain[f"{tasks[0]}_baseline"] is None
    assert notes[-1] == f"no attributions: more than {MAX_HEAVY_ATOMS} heavy atoms, the attributions' budget; " \
                        "the prediction is kept"


def test_a_molecules_attributions_do_not_depend_on_what_shares_its_request(served):
    together = _post(served.client, "/models/reg/predict", ATTRIBUTED, attributions=True)["predictions"]
    alone = _post(served.client, "/models/reg/predict", [ATTRIBUTED[3]], attributions=True)["predictions"][0]
    # 4 significant digits, as kermt predict writes them; the sum of floats may round the last one either way
    np.testing.assert_allclose(alone["t1_atoms"], together[3]["t1_atoms"], rtol=1e-3, atol=1e-6)
    assert alone["t1_baseline"] == pytest.approx(together[3]["t1_baseline"], abs=1e-6)


def test_more_molecules_than_the_cap_is_413_and_none_asked_adds_no_keys(served):
    response = served.client.post("/predict", json={"smiles": ["CCO"] * (MAX_ATTRIBUTION_MOLECULES + 1),
                                                    "attributions": True})
    assert response.status_code == 413, response.text
    assert response.json()["detail"] == (f"attributions: {MAX_ATTRIBUTION_MOLECULES + 1} molecules in one request "
                                         f"with \"attributions\": true, at most {MAX_ATTRIBUTION_MOLECULES} "
                                         "(--max_attribution_molecules); split the request")
    plain = _post(served.client, "/predict", ["CCO"], depict=True)["predictions"][0]
    assert not {"c1_atoms", "c1_baseline", "attributions_note", "attribution_svg"} & set(plain)


def test_depict_colours_each_tasks_atoms_by_their_shares(served):
    entry = _post(served.client, "/models/reg/predict", ["c1ccccc1Cl", "not_a_smiles"], attributions=True,
                  depict=True)["predictions"]
    drawings = entry[0]["attribution_svg"]
    assert set(drawings) == {"t1", "t2"} and entry[1]["attribution_svg"] == {"t1": None, "t2": None}
    for task, svg in drawings.items():
        values = entry[0][f"{task}_atoms"]
        assert svg == depict_attributions("c1ccccc1Cl", values)
        largest = int(np.argmax(np.abs(values)))  # the deepest disc: red if it raises the prediction, else blue
        colour = share_colour(float(np.sign(values[largest])))
        assert "#" + "".join(f"{int(c * 255):02X}" for c in colour) in svg
        assert colour[0] > colour[2] if values[largest] > 0 else colour[2] > colour[0]
    assert drawings["t1"] != drawings["t2"] and entry[0]["svg"] != drawings["t1"]


def test_a_model_that_cannot_give_attributions_notes_it_on_each_valid_entry():
    """The one reason today (upstream batching, which serve never uses) put on a replica's model directly (no Ray):
    each valid entry keeps its prediction, gets null attribution values and the reason."""
    predictor = Predictor(load_served_model("reg", REGRESSION, default=True, trust_checkpoint=False), 32)
    predictor.attributions = ServedAttributions(Ensemble(read_members([REGRESSION]), upstream_batching=True))
    entries = predictor.predict_smiles([PredictJob(("CCO", "not_a_smiles"), attributions=True)])[0]
    assert isinstance(entries[0]["t1"], float) and entries[0]["t1_atoms"] is None and entries[0]["t1_baseline"] is None
    assert entries[0]["attributions_note"].startswith("no attributions: --upstream_batching makes each prediction")
    assert entries[1]["attributions_note"] is None  # invalid: its error says why
