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
no stale member is ever averaged into the new run's ensemble (:func:`start_finetune_run`).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from kermt.checkpoint.native import is_native_checkpoint, load_native, saved_run_id
from kermt.nn.finetune import KermtFinetuneModel
from kermt.inference.members import finished_run_id
from kermt.run_layout import COMPLETE_MEMBER_FILE, REPORT_FILE, RUN_RECORD_FILE, RUN_STATE_FILE
from ray_app.common import outputs
from ray_app.finetune.config import RESUMABLE_CHANGES, FinetuneConfig

EARLIER_RUNS = "earlier_runs"
# What a finetune writes into save_dir besides run_state.json (and its fold_k/ directories): an earlier run's
# outputs, which a new run moves aside or deletes. ray_results is the default storage of its Tune experiment.
RUN_OUTPUTS = ("config.yaml", "splits.json", "invalid_smiles.csv", RUN_RECORD_FILE, REPORT_FILE, "ray_results")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def _settings(config: FinetuneConfig) -> dict[str, Any]:
    return _identity(json.loads(json.dumps(config.model_dump(mode="json"))))


def _identity(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide what a run trains (its identity): all but RESUMABLE_CHANGES."""
    return {k: v for k, v in settings.items() if k not in RESUMABLE_CHANGES}


def _read_state(save_dir: Path) -> dict[str, Any] | None:
    """run_state.json, its settings filtered as the current ones are: a run recorded before a setting joined
    RESUMABLE_CHANGES (the calibration settings) still resumes."""
    path = save_dir / RUN_STATE_FILE
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    if isinstance(state.get("settings"), dict):
        state["settings"] = _identity(state["settings"])
    return state


def _changed(settings: dict[str, Any], state: dict[str, Any]) -> list[str]:
    earlier = state.get("settings", {})
    return sorted(k for k in set(settings) | set(earlier) if settings.get(k) != earlier.get(k))


def _resuming(save_dir: Path) -> str:
    return (f"resuming the run in {save_dir}: finished models are kept, unfinished ones resume from their last "
            f"checkpoint")


def _record_new_run(save_dir: Path, settings: dict[str, Any]) -> str:
    run_id = new_run_id()
    outputs.atomic_write_text(save_dir / RUN_STATE_FILE, json.dumps({"run_id": run_id, "settings": settings}, indent=1)
                              + "\n")
    return run_id


def claim_run_id(save_dir: Path, config: FinetuneConfig) -> tuple[str, bool]:
    """(run id, whether an earlier run with the same settings is resumed); records the run in ``save_dir``. A new
    run leaves the earlier run's files where they are (pretraining replaces them as it saves); a finetune moves
    them aside first (:func:`start_finetune_run`)."""
    settings, state = _settings(config), _read_state(save_dir)
    if state is not None:
        if state.get("settings") == settings:
            print(_resuming(save_dir), flush=True)
            return state["run_id"], True
        print(f"{save_dir} holds an earlier run with other settings ({', '.join(_changed(settings, state))}): "
              f"starting a new run (its models are replaced)", flush=True)
    return _record_new_run(save_dir, settings), False


def start_finetune_run(save_dir: Path, config: FinetuneConfig) -> tuple[str, bool]:
    """(run id, whether the earlier run with the same settings is resumed). A new run owns ``save_dir``: what an
    earlier run left there is moved to ``earlier_runs/<its id>/`` (``--overwrite``: deleted) before the new run
    is recorded, so none of its members can be taken for the new run's."""
    settings, state = _settings(config), _read_state(save_dir)
    if state is not None and state.get("settings") == settings and not config.overwrite:
        finished = finished_run_id(save_dir) == state["run_id"]
        print(f"the run in {save_dir} finished before with these settings: the models it saved are kept and "
              f"calibrated again (--overwrite trains anew)" if finished else _resuming(save_dir), flush=True)
        return state["run_id"], True
    leftovers = _run_outputs(save_dir)
    earlier_id = state["run_id"] if state else "before-" + new_run_id()
    if leftovers and config.overwrite:
        _delete(save_dir, leftovers, earlier_id)
        print(f"--overwrite: deleted the earlier run's outputs in {save_dir}", flush=True)
    elif leftovers:
        why = f"other settings ({', '.join(_changed(settings, state))})" if state else "no run record"
        moved = _move_aside(save_dir, leftovers, earlier_id)
        print(f"{save_dir} holds an earlier run with {why}: moved its outputs to {moved} (delete that when you no "
              f"longer need it; --overwrite deletes instead)", flush=True)
    return _record_new_run(save_dir, settings), False


def _run_outputs(save_dir: Path) -> list[Path]:
    """The earlier run's entries in ``save_dir``: its fold_k/ directories and :data:`RUN_OUTPUTS`; run_state.json
    comes last, so an interrupted move is finished by the next run (it still finds the earlier run's id)."""
    folds = sorted(p for p in save_dir.glob("fold_*") if p.is_dir())
    named = [save_dir / name for name in RUN_OUTPUTS if (save_dir / name).exists()]
    state = [save_dir / RUN_STATE_FILE] if (save_dir / RUN_STATE_FILE).exists() else []
    return folds + named + state if folds or named else []


def _move_aside(save_dir: Path, leftovers: list[Path], earlier_id: str) -> Path:
    """Rename each entry into a hidden staging directory, then the staging directory into place: every rename is
    atomic and a crash part-way is completed by the next run, which finds the same staging directory."""
    staging = save_dir / EARLIER_RUNS / f".{earlier_id}.moving"
    staging.mkdir(parents=True, exist_ok=True)
    for entry in leftovers:
        os.replace(entry, staging / entry.name)
    target = save_dir / EARLIER_RUNS / earlier_id
    while target.exists():  # the same earlier run moved twice cannot happen; a name clash keeps both
        target = target.with_name(target.name + "-1")
    staging.rename(target)
    return target


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
    if not (directory / COMPLETE_MEMBER_FILE).exists() or not is_native_checkpoint(directory / "model"):
        return False
    return saved_run_id(directory / "model") == run_id


def finished_member(directory: Path, run_id: str,
                    model_config) -> tuple[KermtFinetuneModel, list[dict[str, float]]] | None:
    """The model and epoch history this run saved in ``directory`` (fold_k/model_m), or None if it is not there
    complete or belongs to another run (see :func:`saved_by_run`)."""
    if not saved_by_run(directory, run_id):
        return None
    model = KermtFinetuneModel(model_config)
    model.load_state_dict(load_native(directory / "model").state_dict)
    with open(directory / "metrics.csv", newline="") as f:
        history = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    return model, history
