"""`kermt tune`: hyperparameter search over finetune runs with Ray Tune (upstream's `main_hpo.py`, on a cluster).

Driver flow: resolve settings and the search space -> featurise the data once, put fold 0's split in the object
store once -> a Tuner whose trials (finetune's trainable with ``ray_app.tune.trial.TuneTrial``) each train one
finetune with Ray Train, Optuna (TPE or random) proposing parameters and ASHA stopping poor trials at epoch
milestones -> all_trials.csv, best_config.yaml, best_model/, a summary.

Concurrency: a trial is a 0-CPU Tune actor plus a TorchTrainer whose placement group Tune does not see
(ray#54305), so the number of trials at once is capped explicitly (``--max_concurrent_trials``, by default
``ray_app.common.concurrency``). Re-running the same command on the same ``--save_dir`` resumes the sweep; anything
else there is moved aside first (``ray_app.tune.resume``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import Field, model_validator

from kermt.errors import UserError
from kermt.run_layout import SWEEP_FILE, TUNE_EXPERIMENT_DIR
from ray_app.common.settings import Source
from ray_app.finetune.config import RESUMABLE_CHANGES, FinetuneConfig
from ray_app.tune.search_space import HpoMode, SearchSpace, load_space, preset

EXPERIMENT = TUNE_EXPERIMENT_DIR  # Tune's experiment folder inside --save_dir (or --storage_path)
# SWEEP_FILE: the sweep's settings but RESUMABLE_CHANGES, to resume only with the same ones (a sweep of others is
# moved aside: ray_app.tune.resume; predict refuses a sweep's directory by it)


class TuneConfig(FinetuneConfig):
    """Finetune settings (fixed for every trial unless the search space samples them) plus the sweep's own."""

    save_dir: str = Field("runs/tune", description="output directory (a sweep's own, apart from kermt finetune's, "
                          "so the two never mix)")
    n_trials: int = Field(ge=1, description="trials to run (as upstream, required)")
    hpo_mode: Optional[HpoMode] = Field(
        None, description="upstream's search space presets (default: all, unless --search_space is given)")
    search_space: Optional[str] = Field(None, description="YAML search space (docs/tuning.md: choice, uniform, "
                                        "loguniform, fixed values, when-conditions, lr factors)")
    search: Literal["optuna", "random"] = Field("optuna", description="Optuna TPE or random sampling (seeded)")
    scheduler: Literal["asha", "fifo"] = Field("asha", description="asha: stop poor trials early (per-epoch "
                                               "validation metric); fifo: every trial runs all epochs")
    num_workers_per_trial: Optional[int] = Field(None, ge=1, description="training workers per trial (default: "
                                                 "--num_workers)")

    @model_validator(mode="after")
    def _check_sweep(self) -> "TuneConfig":
        if self.hpo_mode and self.search_space:
            raise ValueError("hpo_mode and search_space conflict: give one of them")
        if self.num_folds > 1 or self.ensemble_size > 1:
            raise ValueError("a trial trains one model on the split of fold 0 (as upstream's HPO): num_folds and "
                             "ensemble_size apply to `kermt finetune --config best_config.yaml`")
        if self.overwrite:
            raise ValueError("overwrite is a `kermt finetune` setting: a sweep re-run in the same save_dir resumes "
                             "it; to start a sweep over, give another --save_dir or remove that one")
        return self

    def finetune_base(self) -> FinetuneConfig:
        """The finetune settings every trial starts from."""
        values = {k: v for k, v in self.model_dump().items() if k in FinetuneConfig.model_fields}
        values["num_workers"] = self.num_workers_per_trial or self.num_workers
        values["max_concurrent_trials"] = None
        return FinetuneConfig(**values)

    def space(self) -> SearchSpace:
        space = load_space(self.search_space) if self.search_space else preset(self.hpo_mode or "all")
        return space.resolved(self.finetune_base())


class SweepFailedError(RuntimeError):
    """No trial completed; the message carries the first failure's traceback."""


def sweep_record(config: TuneConfig) -> dict[str, Any]:
    data = config.model_dump(mode="json")
    return {k: v for k, v in data.items() if k not in RESUMABLE_CHANGES}


def sweep_changes(config: TuneConfig) -> list[str] | None:
    """How the sweep recorded in --save_dir differs from ``config`` ("epochs: 30 -> 31", settings that change no
    trial left out): [] resumes it, None when no sweep is recorded there."""
    path = Path(config.save_dir) / SWEEP_FILE
    if not path.exists():
        return None
    try:
        recorded = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise UserError(f"{path}: cannot read the sweep's recorded settings ({' '.join(str(error).split())}); "
                        "delete the file only if you mean to start the sweep afresh in this --save_dir") from error
    if not isinstance(recorded, dict):
        raise UserError(f"{path}: expected a mapping of the sweep's settings, got {type(recorded).__name__}")
    current = json.loads(json.dumps(sweep_record(config)))
    # RESUMABLE_CHANGES filtered on both sides: a sweep recorded before a setting joined them still resumes
    changed = sorted(k for k in set(recorded) | set(current)
                     if k not in RESUMABLE_CHANGES and recorded.get(k) != current.get(k))
    return [f"{k}: {recorded.get(k)!r} -> {current.get(k)!r}" for k in changed]


def finetune_sources(config: TuneConfig, sources: dict[str, Source]) -> dict[str, Source]:
    found = {k: v for k, v in sources.items() if k in FinetuneConfig.model_fields}
    if config.num_workers_per_trial is not None:
        found["num_workers"] = sources["num_workers_per_trial"]
    return found
