"""Calibrated uncertainty for regression: split conformal intervals from an ensemble's mean and spread, and the
metrics that say whether an uncertainty can be trusted (pure numpy/scipy; no ray).

* :mod:`kermt.uncertainty.conformal`: :class:`Calibration` (one task's nonconformity scores, fitted on labelled
  molecules the model did not train on) and :func:`intervals` (lower/upper bounds at any level, served from the same
  calibration). Normalised conformal (scores ``|y - mu| / sigma``: intervals adapt per molecule) is the default;
  plain conformal (one width for every molecule) is there for comparison and for single models (no spread).
* :mod:`kermt.uncertainty.estimators`: :func:`total_std`, the spread of an ensemble of members that may predict
  their own variance (``--loss mve``) or be sampled with MC dropout: aleatoric + epistemic.
* :mod:`kermt.uncertainty.calibration_file`: a model's calibrations as JSON (no pickle), written atomically.
* :mod:`kermt.uncertainty.classification`: Platt / isotonic recalibration of a binary task's probabilities and its
  conformal prediction sets (:class:`ClassCalibration`; a sibling JSON file, ``classification_calibration.json``).
* :mod:`kermt.uncertainty.metrics`: coverage, width, miscalibration area, ENCE, Spearman, Gaussian NLL.
* :mod:`kermt.uncertainty.domain`: the applicability domain, k-nearest-neighbour distance to the training set in the
  model's own embedding (scikit-learn), a threshold from the validation split, saved as safetensors + JSON.

What the guarantee is (and is not): docs/uncertainty.md.
"""

from kermt.uncertainty.calibration_file import CALIBRATION_FORMAT, load_calibrations, save_calibrations
from kermt.uncertainty.calibration_file import load_class_calibrations, save_class_calibrations
from kermt.uncertainty.classification import (CLASSIFICATION_METHODS, ClassCalibration, class_calibration_record,
                                              fit_class_calibration, fit_class_calibrations)
from kermt.uncertainty.conformal import (
    DEFAULT_METHOD,
    METHODS,
    MIN_CALIBRATION_ROWS,
    Calibration,
    check_level,
    fit_calibration,
    intervals,
)
from kermt.uncertainty.estimators import total_std
from kermt.uncertainty.run_calibration import run_class_calibration
from kermt.uncertainty.domain import DomainIndex, DomainSearch, fit_domain, load_domain, model_embeddings, save_domain

__all__ = [
    "CALIBRATION_FORMAT", "DEFAULT_METHOD", "METHODS", "MIN_CALIBRATION_ROWS", "Calibration", "DomainIndex",
    "DomainSearch", "check_level", "fit_calibration", "fit_domain", "intervals", "load_calibrations", "load_domain",
    "model_embeddings", "save_calibrations", "save_domain", "total_std",
    "CLASSIFICATION_METHODS", "ClassCalibration", "class_calibration_record", "fit_class_calibration",
    "fit_class_calibrations", "load_class_calibrations",
    "run_class_calibration", "save_class_calibrations",
]
