"""Per-column standardisation of targets and molecule features, fit on the training split only.

Same statistics as upstream (nan-mean and population nan-std per column; a column with no values gets mean 0,
a constant or empty column gets std 1), kept as float64 numpy arrays and serialised as plain JSON lists.
Missing values are NaN throughout (upstream used None for targets).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from kermt.errors import UserError


@dataclass(frozen=True)
class StandardScaler:
    """means, stds: float64 [C]."""

    means: np.ndarray
    stds: np.ndarray

    @classmethod
    def fit(cls, values: np.ndarray) -> "StandardScaler":
        """Fit on ``values`` [N, C] (NaN = missing; ±inf is an error naming the row and column)."""
        values = _finite_or_missing(values, "fit a scaler on")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns are handled just below
            means = np.nanmean(values, axis=0)
            stds = np.nanstd(values, axis=0)
        means = np.where(np.isnan(means), 0.0, means)
        stds = np.where(np.isnan(stds) | (stds == 0), 1.0, stds)
        return cls(means, stds)

    def transform(self, values: np.ndarray) -> np.ndarray:
        """(x - mean) / std; NaN stays NaN, ±inf is an error naming the row and column."""
        return (_finite_or_missing(values, "scale") - self.means) / self.stds

    def inverse_transform(self, values: np.ndarray) -> np.ndarray:
        """x * std + mean, computed in float64 as upstream does."""
        return np.asarray(values, dtype=np.float64) * self.stds + self.means

    def inverse_transform_variance(self, variances: np.ndarray) -> np.ndarray:
        """Variances in scaled units -> target units (times std²; the mean does not enter)."""
        return np.asarray(variances, dtype=np.float64) * self.stds**2

    def to_dict(self) -> dict[str, list[float]]:
        return {"means": self.means.tolist(), "stds": self.stds.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "StandardScaler | None":
        """Accepts our JSON dict or upstream's ``{'means': ndarray, 'stds': ndarray}``; None stays None."""
        if data is None:
            return None
        means = np.asarray(data["means"], dtype=np.float64)
        stds = np.asarray(data["stds"], dtype=np.float64)
        if means.shape != stds.shape or means.ndim != 1:
            raise ValueError(f"scaler means {means.shape} and stds {stds.shape} must be equal-length 1-D arrays")
        return cls(means, stds)


def _finite_or_missing(values: np.ndarray, action: str) -> np.ndarray:
    """``values`` as float64 [N, C]; ±inf raises. Upstream's scaler lets it through: the column's mean becomes ±inf
    and every molecule's scaled value in that column -inf or NaN, so the model trains on garbage without a word."""
    values = np.asarray(values, dtype=np.float64)
    infinite = np.isinf(values)
    if infinite.any():
        first = tuple(int(i) for i in np.argwhere(infinite)[0])
        row, column = (first + (0,))[:2]  # a 1-D input is one column
        raise UserError(
            f"cannot {action} infinite values: row {row}, column {column} is {values[first]:+} "
            f"({int(infinite.sum())} infinite value(s) in all; rows counted from 0 in the {len(values)} rows "
            "given); remove or fix those rows (a missing value must be empty/NaN, not inf)"
        )
    return values
