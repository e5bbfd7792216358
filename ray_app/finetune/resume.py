"""Re-running `kermt finetune` on the same ``--save_dir`` after the driver died: finished models are kept, the
others resume from their last epoch checkpoint.

``save_dir/run_state.json`` holds the run id and the settings that decide what is computed. The same command (same
settings) reuses the run id, so
- a member whose ``fold_k/model_m/`` was completely written (``metrics.csv`` is written last) by this run is loaded
  instead of trained; its files are left as they are;
- the run's Ray Tune experiment (named after the run id, ``ensemble``) is restored: a trial that finished is not
  run again (its files are copied from its checkpoint), one that was training restarts with the same Ray Train run
  name and storage, and Ray Train resumes it from its last reported checkpoint.
Different settings start a new run in the same directory (its models are replaced), as upstream does.
"""

from __future__ import annotations

import csv
import json
import time
import uuid
from pathlib import Path
from typing import Any

from kermt.checkpoint.native import CONFIG_FILE, is_native_checkpoint, load_native
from kermt.nn.finetune import KermtFinetuneModel
from ray_app.common import outputs
from ray_app.finetune.config import FinetuneConfig

RUN_STATE = "run_state.json"
# Settings that may change between the interrupted run and its re-run: they do not change what a member computes.
RESUMABLE_CHANGES = ("address", "max_concurrent_trials", "dry_run", "storage_path", "max_failures",
                     "tensorboard", "show_individual_scores", "trust_checkpoint")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def _settings(config: FinetuneConfig) -> dict[str, Any]:
    data = json.loads(json.dumps(config.model_dump(mode="json")))
    return {k: v for k, v in data.items() if k not in RESUMABLE_CHANGES}


def claim_run_id(save_dir: Path, config: FinetuneConfig) -> tuple[str, bool]:
    """(run id, whether an earlier run with the same settings is resumed); records the run in ``save_dir``."""
    path = save_dir / RUN_STATE
    settings = _settings(config)
    if path.exists():
        state = json.loads(path.read_text())
        if state.get("settings") == settings:
            print(f"resuming the run in {save_dir}: finished models are kept, unfinished ones resume from their last "
                  f"checkpoint", flush=True)
            return state["run_id"], True
        changed = sorted(k for k in set(settings) | set(state.get("settings", {}))
                         if settings.get(k) != state.get("settings", {}).get(k))
        print(f"{save_dir} holds an earlier run with other settings ({', '.join(changed)}): starting a new run "
              f"(its models are replaced)", flush=True)
    run_id = new_run_id()
    outputs.atomic_write_text(path, json.dumps({"run_id": run_id, "settings": settings}, indent=1) + "\n")
    return run_id, False


def saved_by_run(directory: Path, run_id: str) -> bool:
    """Whether ``directory`` (fold_k/model_m) holds a member completely written by run ``run_id`` (``metrics.csv``
    is the last file of a member; the model's provenance names the run)."""
    if not (directory / "metrics.csv").exists() or not is_native_checkpoint(directory / "model"):
        return False
    config = json.loads((directory / "model" / CONFIG_FILE).read_text())
    return config.get("provenance", {}).get("run_id") == run_id


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
