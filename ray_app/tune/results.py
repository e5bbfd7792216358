"""What a finished sweep leaves in ``--save_dir``: all_trials.csv, best_config.yaml, best_model/ and a summary table.

Read from Tune's experiment state (every trial, whatever became of it), so a resumed sweep reports the trials of
every session, not just the ones it ran itself.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from kermt.run_layout import RunLayout
from ray_app.common import outputs
from ray_app.common.settings import to_yaml
from ray_app.finetune.config import FinetuneConfig
from kermt.train.objective import Objective
from ray_app.tune.search_space import trial_settings
from ray_app.finetune.trainable import RESULT_FILE, download_files
from ray_app.tune.trial import COMPLETED, OBJECTIVE, trial_directory

COMPLETED_STATUS, STOPPED, FAILED, UNFINISHED = "completed", "stopped early", "failed", "unfinished"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours actor names in its error texts


@dataclass(frozen=True)
class TrialRow:
    """One trial as reported. ``settings``: its sampled parameters plus the learning rates derived from them."""

    trial_id: str
    status: str
    objective: float
    test_value: float
    best_epoch: int | None
    epochs_run: int | None
    settings: dict[str, Any] = field(default_factory=dict)
    error: str = ""


def trial_rows(trials: Sequence[Any], base: FinetuneConfig, metric: str) -> list[TrialRow]:
    """Rows from Tune ``Trial`` objects (ray.tune.ExperimentAnalysis(...).trials), in creation order."""
    rows = []
    for trial in trials:
        last = trial.last_result or {}
        error = ""
        if trial.status == "ERROR":
            status = FAILED
            error = _error_text(trial.error_file)
        elif trial.status == "TERMINATED":
            status = COMPLETED_STATUS if last.get(COMPLETED) else STOPPED
        else:
            status = UNFINISHED
        rows.append(TrialRow(
            trial.trial_id, status, float(last.get(OBJECTIVE, math.nan)), float(last.get(f"test_{metric}", math.nan)),
            last.get("best_epoch"), epochs_run(last), {**trial.config, **trial_settings(trial.config, base)}, error))
    return rows


def epochs_run(last: dict[str, Any]) -> int | None:
    """How many epochs a trial had trained when Tune last heard from it. A completed trial says so itself; a
    stopped one's last result is its last epoch's, whose ``epoch`` is an index from 0 (as the training log
    prints it): ASHA's first rung, at ``epoch`` 1, stops a trial after 2 epochs (Tune's ``training_iteration``).
    Its training worker does not wait for Tune's verdict, so its log may show epochs after that one."""
    if "epochs_run" in last:
        return int(last["epochs_run"])
    return int(last["epoch"]) + 1 if "epoch" in last else last.get("training_iteration")


def outcome(last: dict[str, Any]) -> str:
    """A finished trial in words: "completed", or when the scheduler stopped it, after how many epochs."""
    if last.get(COMPLETED):
        return COMPLETED_STATUS
    epochs = epochs_run(last)
    if epochs is None:
        return STOPPED
    return f"{STOPPED} after {epochs} epoch{'s' if epochs != 1 else ''} (last: epoch {epochs - 1})"


def _error_text(path: str | None) -> str:
    if not path or not Path(path).exists():
        return "no error file was recorded"
    return ANSI_ESCAPE.sub("", Path(path).read_text())


def best_row(rows: Sequence[TrialRow], objective: Objective) -> TrialRow | None:
    """The completed trial (it has a saved model) with the best objective; the first one wins a tie."""
    best = None
    for row in rows:
        if row.status == COMPLETED_STATUS and objective.better(row.objective, best.objective if best else math.nan):
            best = row
    return best


def all_trials_csv(rows: Sequence[TrialRow], metric: str, objective: Objective) -> str:
    names: list[str] = []
    for row in rows:
        names += [k for k in row.settings if k not in names]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["trial_id", "status", f"objective ({objective.key}, {objective.mode})", f"test_{metric}",
                     "best_epoch", "epochs_run", *names, "error"])
    for row in rows:
        last_error_line = row.error.strip().splitlines()[-1] if row.error.strip() else ""
        writer.writerow([row.trial_id, row.status, _number(row.objective), _number(row.test_value),
                         _blank(row.best_epoch), _blank(row.epochs_run),
                         *[_blank(row.settings.get(n)) for n in names], last_error_line])
    return out.getvalue()


def summary_table(rows: Sequence[TrialRow], objective: Objective, metric: str, best: TrialRow | None) -> str:
    """Trials ranked by objective (unranked ones last), with the parameters that vary between trials."""
    sign = 1 if objective.mode == "min" else -1
    ranked = sorted(rows, key=lambda r: (math.isnan(r.objective), 0 if math.isnan(r.objective) else sign * r.objective))
    varying = [n for n in dict.fromkeys(k for r in rows for k in r.settings)
               if len({json.dumps(r.settings.get(n)) for r in rows}) > 1]
    header = ["", "trial", "status", objective.key, f"test_{metric}", *varying]
    table = [header] + [["*" if best and r.trial_id == best.trial_id else "", r.trial_id, r.status,
                         _number(r.objective, 4), _number(r.test_value, 4),
                         *[_short(r.settings.get(n)) for n in varying]] for r in ranked]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table)


def write_best(save_dir: Path, best: TrialRow) -> FinetuneConfig:
    """best_config.yaml (replays the best trial with `kermt finetune --config`) and best_model/ (native)."""
    layout, trial = RunLayout(save_dir), RunLayout(trial_directory(save_dir, best.trial_id))
    with open(trial.config) as f:
        config = FinetuneConfig(**yaml.safe_load(f))
    config = config.model_copy(update={"save_dir": str(layout.best_replay)})
    outputs.atomic_write_text(layout.best_config, to_yaml(config))
    with outputs.replacing_directory(layout.best_model) as staging:
        shutil.copytree(trial.model, staging)
    return config


def download_trial(save_dir: Path, trial: Any) -> bool:
    """Copy a finished trial's files into ``save_dir/trials/<trial_id>/``; files already there are kept. Returns
    whether the trial has files."""
    target = trial_directory(save_dir, trial.trial_id)
    return (target / RESULT_FILE).exists() or download_files(trial.checkpoint, target)


def _number(value: float, digits: int | None = None) -> str:
    if value is None or math.isnan(value):
        return ""
    return f"{value:.{digits}f}" if digits is not None else repr(float(value))


def _blank(value: Any) -> str:
    return "" if value is None else str(value)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return _blank(value)
