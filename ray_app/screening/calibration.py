"""`kermt predict / eval --interval LEVEL`: the ensemble's calibration, found and checked before Ray starts."""

from __future__ import annotations

from kermt.checkpoint import Checkpoint
from kermt.errors import UserError
from kermt.inference import task_names
from kermt.run_layout import CALIBRATION_FILE
from kermt.uncertainty import Calibration
from kermt.uncertainty.run_calibration import HOW_TO_CALIBRATE, calibration_files, run_calibration
from ray_app.screening.config import ModelScreeningConfig, log


def plan_intervals(config: ModelScreeningConfig, members: list[Checkpoint]) -> dict[str, Calibration] | None:
    """Each task's calibration when ``--interval`` is given (an error if the model has none), else None."""
    if config.interval is None:
        if config.uncertainty and (config.checkpoint_path or calibration_files(config.checkpoint_dir) is None):
            log("note: this model has no calibration: <task>_std is the members' raw spread, not a calibrated "
                "uncertainty")
        return None
    level = config.interval
    if members[0].spec.head.dataset_type != "regression":
        raise UserError(f"--interval {level}: intervals are for regression models; this one is "
                        f"{members[0].spec.head.dataset_type} (calibrated probabilities are not implemented yet)")
    if config.checkpoint_dir is None:
        raise UserError(f"--interval {level} needs the calibrated ensemble: pass --checkpoint_dir with the "
                        f"--save_dir of a `kermt finetune` run (its folds hold {CALIBRATION_FILE}), not "
                        "--checkpoint_path of one member")
    calibrations = run_calibration(config.checkpoint_dir, task_names(members[0].spec))
    if calibrations is None:
        raise UserError(f"--interval {level}: --checkpoint_dir {config.checkpoint_dir} has no calibration (no "
                        f"{CALIBRATION_FILE} in it or in each fold_k/): it was trained before calibration existed "
                        f"or its validation split was too small; {HOW_TO_CALIBRATE}")
    for calibration in calibrations.values():
        calibration.quantile(level)  # a level the calibration set is too small for fails here, not in an actor
    first = next(iter(calibrations.values()))
    log(f"{level:.0%} intervals: {first.method} conformal, calibrated on {first.n} validation molecule(s) per task")
    return calibrations
