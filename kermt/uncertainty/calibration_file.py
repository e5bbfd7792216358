"""A model's calibrations as one JSON file (no pickle: a calibration is numbers a reader can check by eye).

Layout: ``{"format": "kermt-calibration", "version": 1, "source": "...", "tasks": {task: {"method", "scores", "z_scale",
"sigma_floor"}}}`` (a ``mondrian`` task also has ``"sigmas"``, a ``mondrian_domain`` task ``"distances"``, one per
score). Written atomically (a reader never sees
half a file); read with errors that name the file and the key. Classification calibrations have a sibling format (at the
end of this file).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from kermt.data import atomic_files
from kermt.errors import UserError
from kermt.uncertainty.classification import CLASSIFICATION_METHODS, PLATT, ClassCalibration
from kermt.uncertainty.conformal import METHODS, MONDRIAN, MONDRIAN_DOMAIN, Calibration

CALIBRATION_FORMAT = "kermt-calibration"
CALIBRATION_VERSION = 1


def save_calibrations(path: str, calibrations: Mapping[str, Calibration], source: str) -> None:
    """Write every task's calibration to ``path``; ``source``: what they were fitted on (e.g. "fold_0 validation
    split, 2 members")."""
    tasks = {name: {"method": c.method, "n": c.n, "scores": list(c.scores), "z_scale": c.z_scale,
                    "sigma_floor": c.sigma_floor, **({"sigmas": list(c.sigmas)} if c.sigmas is not None else {}),
                    **({"distances": list(c.distances)} if c.distances is not None else {})}
             for name, c in calibrations.items()}
    record = {"format": CALIBRATION_FORMAT, "version": CALIBRATION_VERSION, "source": source, "tasks": tasks}
    atomic_files.write_text(path, json.dumps(record, indent=1, allow_nan=False) + "\n")


def load_calibrations(path: str) -> dict[str, Calibration]:
    """Every task's calibration in ``path``; a missing, unreadable or malformed file is a :class:`UserError`."""
    tasks = _record_tasks(path, "calibration file", CALIBRATION_FORMAT, "calibration")
    return {name: _calibration(path, name, entry) for name, entry in tasks.items()}


def _record_tasks(path: str, what: str, file_format: str, kind: str) -> dict:
    """The ``tasks`` of a calibration file in ``file_format``, its format and version checked."""
    record = read_json_file(path, what)
    if not isinstance(record, dict) or record.get("format") != file_format:
        raise UserError(f"{what} {path}: key 'format' is not {file_format!r}: not a kermt {kind}")
    if record.get("version") != CALIBRATION_VERSION:
        raise UserError(f"{what} {path}: key 'version' is {record.get('version')!r}; this kermt reads "
                        f"version {CALIBRATION_VERSION}")
    tasks = record.get("tasks")
    if not isinstance(tasks, dict) or not tasks:
        raise UserError(f"{what} {path}: key 'tasks' must map each task name to its calibration")
    return tasks


def read_json_file(path: str, what: str) -> Any:
    """The JSON in ``path`` (local or URI); missing or unreadable: a UserError naming ``what`` and the file."""
    try:
        return json.loads(atomic_files.read_text(path))
    except FileNotFoundError as error:
        raise UserError(f"{what} {path} does not exist") from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{what} {path} is not readable JSON: {error}") from error


def _calibration(path: str, task: str, entry: Any) -> Calibration:
    where = f"calibration file {path}: key 'tasks.{task}"
    if not isinstance(entry, dict):
        raise UserError(f"{where}' must be an object")
    method, scores = entry.get("method"), entry.get("scores")
    if method not in METHODS:
        raise UserError(f"{where}.method' is {method!r}, not one of {', '.join(METHODS)}")
    if not isinstance(scores, list) or not scores or not all(_number(s) and s >= 0 for s in scores):
        raise UserError(f"{where}.scores' must be a non-empty list of non-negative numbers")
    if scores != sorted(scores):
        raise UserError(f"{where}.scores' must be sorted ascending")
    for key in ("z_scale", "sigma_floor"):
        if entry.get(key) is not None and not (_number(entry[key]) and entry[key] > 0):
            raise UserError(f"{where}.{key}' must be a positive number or null")
    if method != "plain" and entry.get("sigma_floor") is None:
        raise UserError(f"{where}.sigma_floor' is missing: a {method} calibration needs it")
    if method == "zscaling" and entry.get("z_scale") is None:
        raise UserError(f"{where}.z_scale' is missing: a zscaling calibration needs it")
    sigmas = entry.get("sigmas")
    if method == MONDRIAN and not (isinstance(sigmas, list) and len(sigmas) == len(scores)
                                   and all(_number(v) and v > 0 for v in sigmas)):
        raise UserError(f"{where}.sigmas' must list one positive sigma per score: a mondrian calibration needs them")
    distances = entry.get("distances")
    if method == MONDRIAN_DOMAIN and not (isinstance(distances, list) and len(distances) == len(scores)
                                          and all(_number(v) and math.isfinite(v) and v >= 0 for v in distances)):
        raise UserError(f"{where}.distances' must list one non-negative distance per score: a mondrian_domain "
                        "calibration needs them")
    return Calibration(task=task, method=method, scores=tuple(float(s) for s in scores),
                       z_scale=entry.get("z_scale"), sigma_floor=entry.get("sigma_floor"),
                       sigmas=tuple(float(v) for v in sigmas) if method == MONDRIAN else None,
                       distances=tuple(float(v) for v in distances) if method == MONDRIAN_DOMAIN else None)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Classification (kermt.uncertainty.classification): a sibling file, run_layout.CLASS_CALIBRATION_FILE beside the
# regression one, so that a reader of regression calibrations never meets a classification entry. Layout:
# ``{"format": "kermt-classification-calibration", "version": 1, "source": "...", "tasks": {task: {"method":
# "platt", "n", "a", "b", "scores"} or {"method": "isotonic", "n", "x", "y", "scores"}}}``.

CLASS_CALIBRATION_FORMAT = "kermt-classification-calibration"


def save_class_calibrations(path: str, calibrations: Mapping[str, ClassCalibration], source: str) -> None:
    """Write every binary task's calibration to ``path`` (atomically); ``source``: what they were fitted on."""
    tasks = {}
    for name, c in calibrations.items():
        params = dict(zip("ab", c.params[0])) if c.method == PLATT else {"x": list(c.params[0]),
                                                                           "y": list(c.params[1])}
        tasks[name] = {"method": c.method, "n": c.n, **params, "scores": list(c.scores)}
    record = {"format": CLASS_CALIBRATION_FORMAT, "version": CALIBRATION_VERSION, "source": source, "tasks": tasks}
    atomic_files.write_text(path, json.dumps(record, indent=1, allow_nan=False) + "\n")


def load_class_calibrations(path: str) -> dict[str, ClassCalibration]:
    """Every task's classification calibration in ``path``; a malformed file is a UserError naming the key."""
    what = "classification calibration file"
    tasks = _record_tasks(path, what, CLASS_CALIBRATION_FORMAT, "classification calibration")
    return {name: _class_calibration(f"{what} {path}: key 'tasks.{name}", name, entry)
            for name, entry in tasks.items()}


def _class_calibration(where: str, task: str, entry: Any) -> ClassCalibration:
    if not isinstance(entry, dict):
        raise UserError(f"{where}' must be an object")
    method, scores = entry.get("method"), entry.get("scores")
    if method not in CLASSIFICATION_METHODS:
        raise UserError(f"{where}.method' is {method!r}, not one of {', '.join(CLASSIFICATION_METHODS)}")
    if not isinstance(scores, list) or not scores or not all(_number(s) and 0 <= s <= 1 for s in scores):
        raise UserError(f"{where}.scores' must be a non-empty list of numbers in [0, 1]")
    if scores != sorted(scores):
        raise UserError(f"{where}.scores' must be sorted ascending")
    if method == PLATT:
        for key in "ab":
            if not (_number(entry.get(key)) and math.isfinite(entry[key])):
                raise UserError(f"{where}.{key}' must be a finite number: a platt calibration needs a and b")
        params = ((float(entry["a"]), float(entry["b"])),)
    else:
        x, y = entry.get("x"), entry.get("y")
        if not (isinstance(x, list) and x and x == sorted(x) and all(_number(v) and 0 <= v <= 1 for v in x)):
            raise UserError(f"{where}.x' must be a non-empty ascending list of probabilities")
        if not (isinstance(y, list) and len(y) == len(x) and y == sorted(y)
                and all(_number(v) and 0 <= v <= 1 for v in y)):
            raise UserError(f"{where}.y' must list one probability per x, non-decreasing")
        params = (tuple(float(v) for v in x), tuple(float(v) for v in y))
    return ClassCalibration(task=task, method=method, params=params, scores=tuple(float(s) for s in scores))

