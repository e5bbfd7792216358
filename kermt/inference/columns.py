"""What a prediction outputs, as columns: the one place that turns an ensemble's numbers into `kermt predict`'s
columns, for every writer and reader of them (the screening actors, the service's replicas, a finetune's test files,
the reports).

A prediction's columns, in order: the SMILES, each task (the ensemble mean: a value, or a classifier's probability of
class 1), then, when asked, ``<task>_std`` (the members' total spread), ``<task>_lower``/``<task>_upper`` (a
regression's conformal interval), ``<task>_calibrated`` (a classifier's recalibrated probability), ``<task>_set``
(its conformal prediction set), ``<task>_atoms``/``<task>_baseline`` and, for a model with molecule descriptors,
``<task>_descriptors`` (per-atom attributions, :mod:`kermt.inference.attributions`: a JSON list with one value per
heavy atom, the value they start from, the descriptor vector's share), ``domain_distance``/``in_domain`` (the
applicability domain); the runners then add the input's carried columns, ``valid``, ``error`` and, for a model that
standardises its molecules, ``model_smiles``. Every column of an invalid molecule is null, and so are the
attribution columns of a molecule that got none (over the budget, or a mode that cannot give them).

Pure numpy: :func:`prediction_columns` returns arrays, and each runner only changes their container (Arrow
arrays for a file, JSON values for a response).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kermt.uncertainty.classification import ClassCalibration
from kermt.uncertainty.conformal import Calibration, intervals

if TYPE_CHECKING:
    from kermt.inference.attributions import Attributions

SMILES_COLUMN, VALID_COLUMN, ERROR_COLUMN = "smiles", "valid", "error"
# the SMILES of the molecule the model saw where its standardisation changed the input's ("" where unchanged); only
# for a model that standardises (kermt.chem.standardize), after ``error``
MODEL_SMILES_COLUMN = "model_smiles"
STD_SUFFIX = "_std"  # --uncertainty: <task>_std, the members' (total) standard deviation
LOWER_SUFFIX, UPPER_SUFFIX = "_lower", "_upper"  # --interval: <task>_lower / <task>_upper, conformal bounds
CALIBRATED_SUFFIX = "_calibrated"  # classification with a calibration: the recalibrated probability
SET_SUFFIX = "_set"  # classification with --interval: the conformal prediction set ("0", "1", "0,1", "")
# --attributions: <task>_atoms (a JSON list, one value per heavy atom), <task>_baseline (the value they start from),
# <task>_descriptors (the molecule descriptors' share, for a model that takes them)
ATOMS_SUFFIX, BASELINE_SUFFIX, DESCRIPTORS_SUFFIX = "_atoms", "_baseline", "_descriptors"
ATTRIBUTION_SUFFIXES = (ATOMS_SUFFIX, BASELINE_SUFFIX, DESCRIPTORS_SUFFIX)
TASK_SUFFIXES = (STD_SUFFIX, LOWER_SUFFIX, UPPER_SUFFIX, CALIBRATED_SUFFIX, SET_SUFFIX, *ATTRIBUTION_SUFFIXES)
ATOM_DIGITS = 4  # significant digits of an atom's value: far below the integral's own error (about 1 %)
DISTANCE_COLUMN, IN_DOMAIN_COLUMN = "domain_distance", "in_domain"  # --applicability_domain
DOMAIN_COLUMNS = (DISTANCE_COLUMN, IN_DOMAIN_COLUMN)


def ensemble_mean(member_preds: Sequence[np.ndarray]) -> np.ndarray:
    """The members' mean, summed in member order as upstream sums it (so a fold's test predictions are upstream's
    to the last bit): float64, the members' shape."""
    total = np.zeros_like(np.asarray(member_preds[0], dtype=np.float64))
    for preds in member_preds:
        total += preds
    return total / len(member_preds)


def ensemble_spread(member_preds: Sequence[np.ndarray]) -> np.ndarray:
    """The members' population standard deviation (the sigma a fold's calibration is fitted on): float64."""
    return np.stack([np.asarray(p, dtype=np.float64) for p in member_preds]).std(axis=0)


@dataclass(frozen=True)
class OutputPlan:
    """Which columns a prediction has. ``calibrations``: a regression's per-task conformal calibrations (bounds at
    ``interval``, which both need); ``class_calibrations``: a classifier's (``<task>_calibrated``, and the sets at
    ``interval``). ``calibrated``: a calibration is on its way (``--calibration_path`` is fitted once Ray is up),
    so its columns are named before it exists. ``attributions``: per-atom attributions; ``descriptors``: the model
    takes molecule descriptors, whose share gets a column too."""

    tasks: tuple[str, ...]
    regression: bool
    uncertainty: bool = False
    interval: float | None = None
    calibrations: Mapping[str, Calibration] | None = None
    class_calibrations: Mapping[str, ClassCalibration] | None = None
    domain: bool = False
    calibrated: bool = False
    attributions: bool = False
    descriptors: bool = False

    @property
    def needs_distance(self) -> bool:
        """Whether the intervals need each molecule's applicability-domain distance (a ``mondrian_domain``
        calibration), whether or not the ``domain`` columns are written."""
        return bool(self.regression and self.interval is not None and self.calibrations
                    and any(c.needs_distance for c in self.calibrations.values()))

    @property
    def suffix_groups(self) -> tuple[tuple[str, ...], ...]:
        """The per-task suffixes this plan writes, in column order after the tasks: a group's columns of one task
        sit together (``t1_lower, t1_upper, t2_lower, ...``), each group after the previous one's."""
        groups: tuple[tuple[str, ...], ...] = ((STD_SUFFIX,),) if self.uncertainty else ()
        has_calibration = self.calibrated or (self.calibrations if self.regression else self.class_calibrations)
        if has_calibration and self.regression and self.interval is not None:
            groups += ((LOWER_SUFFIX, UPPER_SUFFIX),)
        if has_calibration and not self.regression:
            groups += ((CALIBRATED_SUFFIX,),) + (((SET_SUFFIX,),) if self.interval is not None else ())
        if self.attributions:
            groups += ((ATOMS_SUFFIX, BASELINE_SUFFIX, *((DESCRIPTORS_SUFFIX,) if self.descriptors else ())),)
        return groups

    @property
    def suffixes(self) -> tuple[str, ...]:
        return tuple(suffix for group in self.suffix_groups for suffix in group)

    def names(self) -> list[str]:
        """The columns after the SMILES, before the carried ones, in order."""
        per_task = [task + suffix for group in self.suffix_groups for task in self.tasks for suffix in group]
        return [*self.tasks, *per_task, *(DOMAIN_COLUMNS if self.domain else ())]


def prediction_columns(plan: OutputPlan, mean: np.ndarray, std: np.ndarray, valid: np.ndarray,
                       domain: tuple[np.ndarray, np.ndarray] | None = None,
                       attributions: Attributions | None = None) -> dict[str, np.ndarray]:
    """``plan.names()`` -> values for ``n`` molecules: float64 [n] (NaN where invalid), a set or atoms column as an
    object array (None where invalid), ``in_domain`` as bool [n] (its invalid rows are the runner's to mask with
    ``valid``). ``mean``, ``std``: float64 [n, T] (:class:`kermt.inference.EnsemblePrediction`, NaN rows where
    invalid); ``domain``: (distances float64 [n], in_domain bool [n]) when ``plan.domain`` or
    ``plan.needs_distance`` (the intervals read the distances); ``attributions``: when
    ``plan.attributions`` (None: every row's attribution columns empty; NaN and None mark a row without them)."""
    mean = np.where(valid[:, None], mean, np.nan)
    columns: dict[str, np.ndarray] = {task: mean[:, t] for t, task in enumerate(plan.tasks)}
    suffixes = plan.suffixes
    for t, task in enumerate(plan.tasks):
        if STD_SUFFIX in suffixes:
            columns[task + STD_SUFFIX] = np.where(valid, std[:, t], np.nan)
        if LOWER_SUFFIX in suffixes:
            columns[task + LOWER_SUFFIX], columns[task + UPPER_SUFFIX] = intervals(
                plan.calibrations[task], mean[:, t], std[:, t], plan.interval,
                None if domain is None else domain[0])
        if CALIBRATED_SUFFIX in suffixes:
            columns[task + CALIBRATED_SUFFIX] = plan.class_calibrations[task].calibrated(mean[:, t])
        if SET_SUFFIX in suffixes:
            columns[task + SET_SUFFIX] = np.array(plan.class_calibrations[task].sets(mean[:, t], plan.interval),
                                                  dtype=object)
        if plan.attributions:
            columns.update(attribution_columns(task, t, attributions, len(valid)))
    if plan.domain:
        columns[DISTANCE_COLUMN], columns[IN_DOMAIN_COLUMN] = domain
    return {name: columns[name] for name in plan.names()}


def attribution_columns(task: str, t: int, attributions: Attributions | None, n: int) -> dict[str, np.ndarray]:
    """Task ``t``'s attribution columns for ``n`` rows: ``<task>_atoms`` (JSON lists, None where a row has none),
    ``<task>_baseline`` and ``<task>_descriptors`` (float64, NaN where a row has none)."""
    if attributions is None:
        return {task + ATOMS_SUFFIX: np.full(n, None, dtype=object), task + BASELINE_SUFFIX: np.full(n, np.nan),
                task + DESCRIPTORS_SUFFIX: np.full(n, np.nan)}
    atoms = np.array([None if values is None else atom_list(values[:, t]) for values in attributions.atoms],
                     dtype=object)
    return {task + ATOMS_SUFFIX: atoms, task + BASELINE_SUFFIX: attributions.baseline[:, t],
            task + DESCRIPTORS_SUFFIX: attributions.descriptors[:, t]}


def atom_list(values: np.ndarray) -> str:
    """One molecule's atom values as a JSON list, each to :data:`ATOM_DIGITS` significant digits."""
    return json.dumps([float(f"{value:.{ATOM_DIGITS}g}") for value in values.tolist()])


def filled_rows(plan: OutputPlan, name: str, values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """bool [n]: the rows of column ``name`` of ``plan`` that hold a value: the valid ones, less a float attribution
    column's rows without attributions (NaN there, which a file gets as an empty cell)."""
    named = {task + suffix for task in plan.tasks for suffix in ATTRIBUTION_SUFFIXES}
    if plan.attributions and name in named and values.dtype != object:
        return valid & ~np.isnan(values)
    return valid


__all__ = [
    "ATOMS_SUFFIX", "ATTRIBUTION_SUFFIXES", "BASELINE_SUFFIX", "DESCRIPTORS_SUFFIX", "attribution_columns",
    "atom_list", "filled_rows",
    "CALIBRATED_SUFFIX", "DISTANCE_COLUMN", "DOMAIN_COLUMNS", "ERROR_COLUMN", "IN_DOMAIN_COLUMN", "LOWER_SUFFIX",
    "MODEL_SMILES_COLUMN",
    "OutputPlan", "SET_SUFFIX", "SMILES_COLUMN", "STD_SUFFIX", "TASK_SUFFIXES", "UPPER_SUFFIX", "VALID_COLUMN",
    "ensemble_mean", "ensemble_spread", "prediction_columns",
]
