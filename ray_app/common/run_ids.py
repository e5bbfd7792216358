"""A run's id, claimed in its ``save_dir`` (``run_state.json``: the id and the settings that decide what the run
computes). The same command re-run on the same directory (same settings) gets the same id back, so the run resumes;
other settings start a new run. Used by `kermt pretrain` as is and by `kermt finetune`, which also moves an earlier
run's files aside (ray_app.finetune.resume), as `kermt tune` does with what is not its own sweep (ray_app.tune.resume):
:func:`move_aside`."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from kermt.run_layout import RunLayout
from ray_app.common import outputs


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def run_identity(settings: Mapping[str, Any], resumable: Collection[str]) -> dict[str, Any]:
    """The settings that decide what a run computes (its identity): all but ``resumable``, as JSON reads them back
    (tuples are lists), so they compare equal to the recorded ones."""
    return {k: v for k, v in json.loads(json.dumps(dict(settings))).items() if k not in resumable}


def read_run_state(save_dir: Path, resumable: Collection[str]) -> dict[str, Any] | None:
    """run_state.json, its settings filtered as the current ones are: a run recorded before a setting became
    resumable (finetune's calibration settings) still resumes."""
    path = RunLayout(save_dir).run_state
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    if isinstance(state.get("settings"), dict):
        state["settings"] = run_identity(state["settings"], resumable)
    return state


def changed_settings(settings: Mapping[str, Any], state: Mapping[str, Any]) -> list[str]:
    earlier = state.get("settings", {})
    return sorted(k for k in set(settings) | set(earlier) if settings.get(k) != earlier.get(k))


def resuming_line(save_dir: Path) -> str:
    return (f"resuming the run in {save_dir}: finished models are kept, unfinished ones resume from their last "
            f"checkpoint")


def record_new_run(save_dir: Path, settings: Mapping[str, Any]) -> str:
    run_id = new_run_id()
    outputs.atomic_write_text(RunLayout(save_dir).run_state,
                              json.dumps({"run_id": run_id, "settings": settings}, indent=1) + "\n")
    return run_id


def move_aside(save_dir: Path, leftovers: list[Path], earlier_id: str) -> Path:
    """Move ``leftovers`` (entries of ``save_dir``) to ``earlier_runs/<earlier_id>/``; returns where. Each entry is
    renamed into a hidden staging directory, then the staging directory into place: every rename is atomic and a
    crash part-way is completed by the next run, which finds the same staging directory."""
    staging = RunLayout(save_dir).earlier_runs / f".{earlier_id}.moving"
    staging.mkdir(parents=True, exist_ok=True)
    for entry in leftovers:
        os.replace(entry, staging / entry.name)
    target = RunLayout(save_dir).earlier_runs / earlier_id
    while target.exists():  # the same earlier run moved twice cannot happen; a name clash keeps both
        target = target.with_name(target.name + "-1")
    staging.rename(target)
    return target


def earlier_run_id(state: Mapping[str, Any] | None) -> str:
    """The name an earlier run's outputs get under earlier_runs/: its run id, or a new one for a run without a
    record (a sweep has none)."""
    return str(state["run_id"]) if state and state.get("run_id") else "before-" + new_run_id()


def claim_run_id(save_dir: Path, *, settings: Mapping[str, Any], resumable: Collection[str]) -> tuple[str, bool]:
    """(run id, whether an earlier run with the same settings is resumed); records the run in ``save_dir``.
    ``settings``: the run's settings as JSON (``model_dump(mode="json")``); ``resumable``: the ones a re-run may
    change and still resume. A new run leaves the earlier run's files where they are (pretraining replaces them as
    it saves)."""
    settings, state = run_identity(settings, resumable), read_run_state(save_dir, resumable)
    if state is not None:
        if state.get("settings") == settings:
            print(resuming_line(save_dir), flush=True)
            return state["run_id"], True
        print(f"{save_dir} holds an earlier run with other settings ({', '.join(changed_settings(settings, state))}): "
              f"starting a new run (its models are replaced)", flush=True)
    return record_new_run(save_dir, settings), False


__all__ = ["changed_settings", "claim_run_id", "earlier_run_id", "move_aside", "new_run_id", "read_run_state",
           "record_new_run", "resuming_line", "run_identity"]
