"""Each figure is a PNG data URI that decodes to an image of the size matplotlib drew, from real demo values."""

from __future__ import annotations

import base64
import io

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from ray_app.report import figures
from tests.ray_app.finetune.tiny_runs import DEMO


def _image(uri: str) -> Image.Image:
    assert uri.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))


@pytest.fixture(scope="module")
def logp() -> np.ndarray:
    values = pd.read_csv(DEMO)["logp"].dropna().to_numpy()[:300]
    return values


def test_parity_with_interval_and_residuals(logp):
    predicted = logp + np.random.default_rng(0).normal(0, 0.3, len(logp))
    image = _image(figures.parity(logp, predicted, "logp", predicted - 0.5, predicted + 0.5))
    assert image.format == "PNG" and image.width > 250 and image.height > 250
    assert _image(figures.residuals(logp, predicted, "logp")).width > image.width  # two panels


def test_learning_curves_leave_out_what_is_not_recorded():
    history = {"epoch": [0, 1, 2], "train_loss": [3.0, 2.0, 1.5], "val_loss": [2.0, 1.8, 1.7], "val_rmse": [1, .9, .8]}
    three = _image(figures.learning_curves({"model 0": {**history, "lr": [1e-4, 1e-3, 1e-4]}}, "rmse"))
    two = _image(figures.learning_curves({"model 0": history}, "rmse"))  # no lr column: no lr panel
    assert three.width > two.width * 1.3


def test_classification_figures(logp):
    measured = (logp > 2).astype(float)
    probability = 1 / (1 + np.exp(-(logp - 2)))
    assert _image(figures.roc_and_pr(measured, probability, "logp_high")).width > 400
    assert _image(figures.confusion(measured, probability, "logp_high")).height > 150
