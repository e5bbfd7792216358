"""Precomputed molecule features as ``.npz`` files, upstream-compatible (array key ``features``, shape [N, F]).

Alignment rule (fixes an upstream bug, docs/upstream-compatibility.md#deliberate-differences: save_features drops
invalid rows): a file written here has exactly one row per CSV data row. Invalid rows are NaN rows, and the file also
holds a ``valid`` bool array; upstream readers only look at ``features`` and ignore it. Loading checks the row count
against the CSV, so a misaligned file (for example one written by upstream's save_features from a CSV with invalid rows)
fails loudly instead of shifting features onto the wrong molecules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import zipfile

import numpy as np

from kermt.errors import UserError


def save_features(path: str | Path, features: np.ndarray, valid: np.ndarray | None = None) -> None:
    """Write ``features`` [N, F] (and the optional ``valid`` [N] mask) to a compressed ``.npz``."""
    features = np.asarray(features)
    if features.ndim != 2:
        raise ValueError(f"features must be 2-D [rows, width], got shape {features.shape}")
    arrays = {"features": features}
    if valid is not None:
        valid = np.asarray(valid, dtype=bool)
        if valid.shape != (features.shape[0],):
            raise ValueError(f"valid has shape {valid.shape}, expected ({features.shape[0]},)")
        arrays["valid"] = valid
    np.savez_compressed(path, **arrays)


def load_features(path: str | Path, expected_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read one features file. Returns (features [N, F] float64, valid [N] bool).

    Files without a ``valid`` array (upstream's) count every row that is not all-NaN as valid. NaN inside
    valid rows becomes 0, as upstream does when it attaches loaded features to a datapoint; ±inf in a valid row is
    an error naming the row and column (upstream lets it reach the scaler, which turns the column into garbage).
    ``expected_rows``: the CSV's data-row count; a mismatch is an error.
    """
    features, valid = _read_npz(Path(path))
    if features.ndim == 1:  # a single-feature file saved as a vector
        features = features[:, None]
    if valid is None:
        valid = ~np.isnan(features).all(axis=1) if features.shape[1] else np.ones(len(features), dtype=bool)
    if valid.shape != (features.shape[0],):
        raise UserError(f"{path}: 'valid' has shape {valid.shape} but 'features' has {features.shape[0]} rows; "
                        "rewrite the file with save_features")
    _refuse_infinite(path, features, valid)
    features[valid] = np.nan_to_num(features[valid], nan=0.0, posinf=np.inf, neginf=-np.inf)
    if expected_rows is not None and features.shape[0] != expected_rows:
        raise UserError(
            f"{path}: {features.shape[0]} feature rows but the data has {expected_rows} rows; features must "
            "have one row per CSV row (upstream's save_features drops invalid rows, which misaligns them)"
        )
    return features, valid


def _refuse_infinite(path: str | Path, features: np.ndarray, valid: np.ndarray) -> None:
    infinite = np.isinf(features) & valid[:, None]
    if infinite.any():
        row, column = (int(i) for i in np.argwhere(infinite)[0])
        raise UserError(
            f"{path}: row {row} (data row {row}, counted from 0), column {column} is {features[row, column]:+}; "
            f"{int(infinite.sum())} infinite value(s) in all. Features must be finite: recompute them, or write NaN "
            "for a value that is missing (it becomes 0, as upstream)")


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """(features, valid or None) of a features file; a missing or malformed file is a UserError naming it."""
    if not path.is_file():
        raise UserError(f"features file not found: {path}")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise UserError(f"{path}: cannot read it as an .npz features file ({error})") from error
    if not isinstance(data, np.lib.npyio.NpzFile) or "features" not in data.files:
        raise UserError(f"{path}: not a features file (an .npz with a 'features' array, as save_features writes)")
    with data:
        return (np.asarray(data["features"], dtype=np.float64),
                np.asarray(data["valid"], dtype=bool) if "valid" in data.files else None)


def load_features_files(paths: Sequence[str | Path], expected_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Several files concatenated on the feature axis (upstream's repeated ``--features_path``).

    A row is valid only if it is valid in every file.
    """
    if not paths:
        raise UserError("no feature files given")
    loaded = [load_features(p, expected_rows) for p in paths]
    rows = {f.shape[0] for f, _ in loaded}
    if len(rows) > 1:
        raise UserError(f"feature files have different row counts {sorted(rows)}: {list(map(str, paths))}")
    features = np.concatenate([f for f, _ in loaded], axis=1)
    valid = np.logical_and.reduce([v for _, v in loaded])
    return features, valid


__all__ = ["load_features", "load_features_files", "save_features"]
