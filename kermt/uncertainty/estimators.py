"""The spread an estimator gives a prediction: one formula for ensembles, mean-variance heads and MC dropout.

Every member (or every dropout pass of every member) is a Gaussian ``N(mu_k, var_k)``: ``var_k`` is what a variance
head (``--loss mve``) predicts, the aleatoric part, and 0 for a plain model. The prediction is the equal mixture of
them, whose standard deviation is the **total** std ``sqrt(mean_k var_k + var_k mu_k)``: aleatoric (mean of the
predicted variances) plus epistemic (variance of the means, population form). Without variance heads it is exactly
the members' population spread, what ``<task>_std`` always was; with one variance-head model it is its own std.
"""

from __future__ import annotations

import numpy as np


def total_std(means: np.ndarray, variances: np.ndarray | None) -> np.ndarray:
    """means, variances: [K, N, T] (target units; variances None = plain models) -> std [N, T]."""
    spread = means.std(axis=0)
    if variances is None:
        return spread
    return np.sqrt(variances.mean(axis=0) + spread**2)


__all__ = ["total_std"]
