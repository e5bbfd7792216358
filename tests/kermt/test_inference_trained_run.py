"""kermt.load_run without Ray: a checkpoint's predictions equal upstream's, the columns follow kermt predict's, and
asking for what a run does not have is a one-line error naming it. (Equality with `kermt predict` on a calibrated run
with a domain: tests/ray_app/screening/test_load_run.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import kermt
from kermt.errors import UserError
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import OUTPUTS, PARITY, SMILES


@pytest.mark.parametrize("name", ["ft_reg", "ft_cls"])
def test_a_checkpoints_predictions_equal_upstreams(name):
    run = kermt.load_run(FIXTURE_DIR / f"ckpt_{name}.pt", upstream_batching=True)  # upstream's batch of 26
    frame = run.predict([*SMILES, "not a smiles"], uncertainty=True)
    tasks = list(run.tasks)
    assert list(frame.columns) == ["smiles", *tasks, *(t + "_std" for t in tasks), "valid", "error"]
    expected = OUTPUTS[f"{name}_final_prediction" if name != "ft_cls" else f"{name}_model_output"]
    np.testing.assert_allclose(frame[tasks].to_numpy()[:-1], expected, rtol=0, atol=PARITY)
    assert (frame[[t + "_std" for t in tasks]].to_numpy()[:-1] == 0).all()  # one model: no spread
    assert frame["valid"].tolist() == [True] * len(SMILES) + [False]
    assert frame[tasks].iloc[-1].isna().all() and frame["error"].iloc[-1] and not frame["error"].iloc[0]
    assert frame["smiles"].tolist() == [*SMILES, "not a smiles"]


def test_a_molecules_number_is_the_same_alone_and_among_others():
    run = kermt.load_run(FIXTURE_DIR / "ckpt_ft_reg.pt")
    together = run.predict(SMILES)
    for i in (0, 7, 25):
        alone = run.predict(SMILES[i])  # one SMILES: a one-row frame
        assert len(alone) == 1 and alone["smiles"].iloc[0] == SMILES[i] and bool(alone["valid"].iloc[0])
        np.testing.assert_allclose(alone[list(run.tasks)].to_numpy()[0], together[list(run.tasks)].to_numpy()[i],
                                   rtol=0, atol=1e-6)


def test_what_a_checkpoint_has_not_is_a_one_line_error(tmp_path):
    run = kermt.load_run(FIXTURE_DIR / "ckpt_ft_reg.pt")
    with pytest.raises(UserError, match="has no calibration"):
        run.predict(SMILES[:2], interval=0.9)
    with pytest.raises(UserError, match=r"interval=90 is a percentage.*did you mean 0.9\?"):
        run.predict(SMILES[:2], interval=90)
    with pytest.raises(UserError, match=r"interval=1.5: a level is a fraction in \(0, 1\)"):
        run.predict(SMILES[:2], interval=1.5)
    with pytest.raises(UserError, match="needs a finetune run's directory"):
        run.predict(SMILES[:2], domain=True)
    with pytest.raises(UserError, match="does not exist"):
        kermt.load_run(tmp_path / "nowhere")
