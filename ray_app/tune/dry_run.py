"""`kermt tune --dry_run`: the sweep's settings, its data checks (``ray_app.finetune.dry_run``: every trial trains on
fold 0's split of the same files) and its plan, in seconds and without Ray; nothing is written."""

from __future__ import annotations

from typing import Any

from kermt.train.objective import Objective
from ray_app.common.concurrency import worker_demand
from ray_app.common.settings import Source
from ray_app.finetune.dry_run import checked_setup, data_lines, not_checked_line, plan_folds, print_settings, \
    runs_at_once, workers_asked
from ray_app.tune.config import TuneConfig, finetune_sources, sweep_changes
from ray_app.tune.search_space import SearchSpace


def sweep_header(config: TuneConfig, space: SearchSpace, objective: Objective) -> str:
    """The objective and the search space, as a sweep (and its dry run) prints them."""
    return (f"objective={objective.key} ({objective.mode})\n"
            f"search space ({config.search_space or 'hpo_mode ' + (config.hpo_mode or 'all')}):\n  "
            + space.describe().replace("\n", "\n  "))


def dry_run_tune(config: TuneConfig, sources: dict[str, Source], space: SearchSpace) -> dict[str, Any]:
    """Print the settings, the data checks and the plan of `kermt tune`; returns the plan. Everything is checked
    before anything is printed."""
    base = config.finetune_base()
    setup = checked_setup(base, finetune_sources(config, sources))
    objective = Objective.of(setup.metric, base.select_by_loss)
    folds, parameters, fold_lines = plan_folds(setup, 1, model="model (base settings; sampled head settings "
                                               "change it)")
    resumed = sweep_changes(config) == []  # a sweep of other settings is moved aside (tune.resume says so)
    print_settings(config.model_dump(mode="json"), sources)
    print("\n".join([*data_lines(setup), sweep_header(config, space, objective), *fold_lines,
                     f"would run {config.n_trials} trials ({config.search} search, {config.scheduler} scheduler) "
                     f"of {base.epochs} epoch(s), {runs_at_once(config.max_concurrent_trials, config.n_trials)}, "
                     f"each with {workers_asked(base)}",
                     f"the sweep in {setup.save_dir} has these settings: a run resumes it, keeping its finished "
                     f"trials" if resumed else f"a run starts the sweep in {setup.save_dir}",
                     not_checked_line(config)]), flush=True)
    return {"dry_run": True, "dataset_type": setup.dataset_type, "metric": setup.metric, "objective": objective.key,
            "parameters": space.names, "folds": folds, "model_parameters": parameters, "resumes": resumed,
            "resources_per_trial": worker_demand(base.min_workers, base.use_gpu)}
