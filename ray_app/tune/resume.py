"""A `kermt tune` ``--save_dir`` holds one sweep: the same command (settings that change no trial aside) resumes it;
anything else a run left there, a `kermt finetune` run or a sweep of other settings, is moved to
``save_dir/earlier_runs/<its id>/`` before the sweep starts, as finetune does with an earlier run of its own
(``ray_app.common.run_ids.move_aside``). So a sweep never overwrites a finetune's report.html, and `kermt predict`
on the directory finds one kind of run.

Two things are refused instead, in one line before Ray starts: a sweep of other settings whose Tune experiment is
under ``--storage_path`` (moving save_dir would not move it, and the new sweep would resume it), and an input of this
sweep inside what would be moved (a --checkpoint_path in a finetune's fold_0/).
"""

from __future__ import annotations

from pathlib import Path

from kermt.errors import UserError
from kermt.run_layout import RunLayout
from ray_app.common.remote_files import INPUT_SETTINGS
from ray_app.common.run_ids import earlier_run_id, move_aside, read_run_state
from ray_app.common.storage import is_uri
from ray_app.finetune.config import RESUMABLE_CHANGES
from ray_app.tune.config import EXPERIMENT, TuneConfig, sweep_changes


def claim_sweep_dir(config: TuneConfig) -> None:
    """Make ``config.save_dir`` this sweep's (``--dry_run``: say what a sweep would do, and do nothing)."""
    save_dir = Path(config.save_dir)
    changes = sweep_changes(config)
    if changes == []:
        return  # the same sweep: the driver resumes it
    layout = RunLayout(save_dir)
    leftovers = layout.earlier_run_outputs()
    if not leftovers:
        return
    if changes and config.storage_path:
        raise UserError(f"{save_dir} holds a sweep with other settings ({', '.join(changes)}) whose Tune experiment "
                        f"is under --storage_path ({config.storage_path}/{EXPERIMENT}), which a new sweep would "
                        "resume: resume it with the same settings, or give another --save_dir and --storage_path")
    _check_inputs_outside(config, leftovers)
    what = (f"a sweep with other settings ({', '.join(changes)})" if changes else
            "a kermt finetune run" if layout.folds() else "an earlier run's outputs")
    if config.dry_run:
        print(f"{save_dir} holds {what}: a sweep moves them to {layout.earlier_runs}/ first", flush=True)
        return
    moved = move_aside(save_dir, leftovers, earlier_run_id(read_run_state(save_dir, RESUMABLE_CHANGES)))
    print(f"{save_dir} holds {what}: moved its outputs to {moved} (delete that when you no longer need it)",
          flush=True)


def _check_inputs_outside(config: TuneConfig, leftovers: list[Path]) -> None:
    """Refuse to move an input of this sweep (its checkpoint, data or split files) away from under it."""
    for name in INPUT_SETTINGS:
        value = getattr(config, name, None)
        for path in [value] if isinstance(value, str) else value if isinstance(value, list) else ():
            if is_uri(path):
                continue
            inside = next((e for e in leftovers if Path(path).resolve().is_relative_to(e.resolve())), None)
            if inside is not None:
                raise UserError(f"--{name} {path} is inside {inside}, which this sweep would move to "
                                f"{RunLayout(Path(config.save_dir)).earlier_runs}/ as an earlier run's output; give "
                                "the sweep another --save_dir")


__all__ = ["claim_sweep_dir"]
