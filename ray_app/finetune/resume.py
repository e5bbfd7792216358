"""Re-running `kermt finetune` on the same ``--save_dir`` after the driver died: finished models are kept, the
others resume from their last epoch checkpoint.

``save_dir/run_state.json`` holds the run id and the settings that decide what is computed. The same command (same
settings) reuses the run id, so
- a member whose ``fold_k/model_m/`` was completely written (``metrics.csv`` is written last) by this run is loaded
  instead of trained; its files are left as they are;
- the run's Ray Tune experiment (named after the run id, ``ensemble``) is restored: a trial that finished is not
  run again (its files are copied from its checkpoint), one that was training restarts with the same Ray Train run
  name and storage, and Ray Train resumes it from its last reported checkpoint.
Different settings start a new run, which owns the directory: what the earlier run left there is moved to
``save_dir/earlier_runs/<its run id>/`` first (``--overwrite``: deleted, and the same settings start over too), so
no stale member is ever averaged into the new run's ensemble (:func:`start_finetune_run`); a `kermt tune` sweep left
there is moved aside too (``RunLayout.earlier_run_outputs``).
"""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path
from typing import Any

from kermt.checkpoint.native import is_native_checkpoint, load_native, saved_run_id
from kermt.nn.finetune import KermtFinetuneModel
from kermt.inference.members import finished_run_id
from kermt.run_layout import RunLayout
from ray_app.common.run_ids import (changed_settings, earlier_run_id, move_aside, read_run_state, record_new_run,
                                    resuming_line, run_identity)
from ray_app.finetune.config import RESUMABLE_CHANGES, FinetuneConfig


def _settings(config: FinetuneConfig) -> dict[str, Any]:
    return run_identity(config.model_dump(mode="json"), RESUMABLE_CHANGES)


def start_finetune_run(save_dir: Path, config: FinetuneConfig) -> tuple[str, bool]:
    """(run id, whether the earlier run with the same settings is resumed). A new run owns ``save_dir``: what an
    earlier run left there is moved to ``earlier_runs/<its id>/`` (``--overwrite``: deleted) before the new run
    is recorded, so none of its members can be taken for the new run's."""
    settings, state = _settings(config), read_run_state(save_dir, RESUMABLE_CHANGES)
    if _resumes(config, settings, state):
        finished = finished_run_id(save_dir) == state["run_id"]
        print(f"the run in {save_dir} finished before with these settings: the models it saved are kept and "
              f"calibrated again (--overwrite trains anew)" if finished else resuming_line(save_dir), flush=True)
        return state["run_id"], True
    leftovers = _run_outputs(save_dir)
    earlier_id = earlier_run_id(state)
    if leftovers and config.overwrite:
        _delete(save_dir, leftovers, earlier_id)
        print(f"--overwrite: deleted the earlier run's outputs in {save_dir}", flush=True)
    elif leftovers:
        why = f"other settings ({', '.join(changed_settings(settings, state))})" if state else "no run record"
        moved = move_aside(save_dir, leftovers, earlier_id)
        print(f"{save_dir} holds an earlier run with {why}: moved its outputs to {moved} (delete that when you no "
              f"longer need it; --overwrite deletes instead)", flush=True)
    return record_new_run(save_dir, settings), False


def _resumes(config: FinetuneConfig, settings: dict[str, Any], state: dict[str, Any] | None) -> bool:
    return state is not None and state.get("settings") == settings and not config.overwrite


def save_dir_outlook(save_dir: Path, config: FinetuneConfig) -> str:
    """What :func:`start_finetune_run` will do with ``save_dir``, said without doing it (``--dry_run``)."""
    settings, state = _settings(config), read_run_state(save_dir, RESUMABLE_CHANGES)
    if _resumes(config, settings, state):
        return f"the run in {save_dir} has these settings: a run resumes it, keeping the models it finished"
    if not _run_outputs(save_dir):
        return f"a run starts anew in {save_dir}"
    if config.overwrite:
        return f"{save_dir} holds an earlier run: a run deletes its outputs first (--overwrite)"
    return (f"{save_dir} holds an earlier run with other settings or no run record: a run moves its outputs to "
            f"{RunLayout(save_dir).earlier_runs}/ first")


def _run_outputs(save_dir: Path) -> list[Path]:
    """What an earlier run (a finetune's, or a sweep's) left in ``save_dir``, run_state.json last."""
    return RunLayout(save_dir).earlier_run_outputs()


def _delete(save_dir: Path, leftovers: list[Path], earlier_id: str) -> None:
    """Move the entries out of sight first (atomic renames), then delete them: a crash never leaves half a run."""
    trash = save_dir / f".deleting-{earlier_id}"
    trash.mkdir(exist_ok=True)
    for entry in leftovers:
        os.replace(entry, trash / entry.name)
    shutil.rmtree(trash)


def saved_by_run(directory: Path, run_id: str) -> bool:
    """Whether ``directory`` (fold_k/model_m) holds a member completely written by run ``run_id`` (``metrics.csv``
    is the last file of a member; the model's provenance names the run)."""
    member = RunLayout(directory)  # a member's directory names its files as a run does
    if not member.metrics.exists() or not is_native_checkpoint(member.model):
        return False
    return saved_run_id(member.model) == run_id


def finished_member(directory: Path, run_id: str,
                    model_config) -> tuple[KermtFinetuneModel, list[dict[str, float]]] | None:
    """The model and epoch history this run saved in ``directory`` (fold_k/model_m), or None if it is not there
    complete or belongs to another run (see :func:`saved_by_run`)."""
    if not saved_by_run(directory, run_id):
        return None
    model = KermtFinetuneModel(model_config)
    model.load_state_dict(load_native(RunLayout(directory).model).state_dict)
    with open(RunLayout(directory).metrics, newline="") as f:
        history = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    return model, history
