"""The sweep itself: a Ray Tune Tuner over ``tune_trial.run_trial``, started fresh or restored from ``--save_dir``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import optuna
import yaml
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search.optuna import OptunaSearch

from ray_app import outputs
from ray_app.cluster import connect
from ray_app.concurrency import concurrent_runs
from ray_app.config import Source
from ray_app.finetune import RunSetup, resolve_setup
from ray_app.search_space import SearchSpace
from ray_app.tune import EXPERIMENT, SWEEP_FILE, SweepFailedError, TuneConfig, finetune_sources, sweep_record
from ray_app.tune_results import FAILED, all_trials_csv, best_row, summary_table, trial_rows, write_best
from ray_app.tune_trial import OBJECTIVE, Objective, run_trial

TRIAL_ACTOR_CPU = 0.01  # the trial function only waits on its TorchTrainer; 0 is refused by Tune


def run_tune(config: TuneConfig, sources: dict[str, Source], space: SearchSpace) -> dict[str, Any]:
    """Run (or resume) the sweep; write its outputs; returns the summary (also in sweep.json)."""
    connect(config.address)
    base = config.finetune_base()
    setup = resolve_setup(base, finetune_sources(config, sources))
    objective = Objective.of(setup)
    save_dir = setup.save_dir
    print(f"dataset_type={setup.dataset_type} metric={setup.metric} objective={objective.key} ({objective.mode}); "
          f"search space: {', '.join(space.names)}", flush=True)
    if config.dry_run:
        return {"dry_run": True, "objective": objective.key, "parameters": space.names}
    save_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    tuner = _tuner(config, setup, space, objective)
    tuner.fit()
    trials = tune.ExperimentAnalysis(str(save_dir / EXPERIMENT)).trials
    return _report(config, setup, objective, trials, time.perf_counter() - started)


def _tuner(config: TuneConfig, setup: RunSetup, space: SearchSpace, objective: Objective) -> tune.Tuner:
    trainable = tune.with_resources(tune.with_parameters(run_trial, setup=setup, objective=objective),
                                    {"CPU": TRIAL_ACTOR_CPU})
    experiment = setup.save_dir / EXPERIMENT
    if tune.Tuner.can_restore(str(experiment)):
        print(f"resuming the sweep in {experiment}: finished trials are kept, unfinished ones restart", flush=True)
        return tune.Tuner.restore(str(experiment), trainable, resume_unfinished=True, resume_errored=False,
                                  restart_errored=False)
    outputs.atomic_write_text(setup.save_dir / SWEEP_FILE, yaml.safe_dump(sweep_record(config), sort_keys=False))
    base = setup.config
    concurrency = concurrent_runs(config.max_concurrent_trials, base.num_workers, base.use_gpu, config.n_trials)
    print(f"{config.n_trials} trials, at most {concurrency} at once, {base.num_workers} worker(s) each", flush=True)
    sampler = (optuna.samplers.TPESampler(seed=config.seed) if config.search == "optuna"
               else optuna.samplers.RandomSampler(seed=config.seed))
    searcher = OptunaSearch(space=space, metric=OBJECTIVE, mode=objective.mode, sampler=sampler)
    # "epoch" counts from 0: with grace_period 1 the first rung judges a trial after its second epoch.
    scheduler = (ASHAScheduler(time_attr="epoch", metric=objective.key, mode=objective.mode, max_t=base.epochs,
                               grace_period=1) if config.scheduler == "asha" else FIFOScheduler())
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=config.n_trials,
                                    max_concurrent_trials=concurrency),
        run_config=tune.RunConfig(name=EXPERIMENT, storage_path=str(setup.save_dir), verbose=1,
                                  failure_config=tune.FailureConfig(max_failures=0)),
    )


def _report(config: TuneConfig, setup: RunSetup, objective: Objective, trials: list, seconds: float) -> dict:
    save_dir: Path = setup.save_dir
    rows = trial_rows(trials, setup.config, setup.metric)
    outputs.atomic_write_text(save_dir / "all_trials.csv", all_trials_csv(rows, setup.metric, objective))
    best = best_row(rows, objective)
    print(summary_table(rows, objective, setup.metric, best), flush=True)
    if best is None:
        failed = [r for r in rows if r.status == FAILED]
        if failed:
            raise SweepFailedError(f"no trial completed ({len(failed)} of {len(rows)} failed); the first failure, "
                                   f"trial {failed[0].trial_id}:\n{failed[0].error}")
        raise SweepFailedError(f"no trial completed: {[(r.trial_id, r.status) for r in rows]}")
    write_best(save_dir, best)
    counts = {status: sum(r.status == status for r in rows) for status in dict.fromkeys(r.status for r in rows)}
    summary = {"best_trial": best.trial_id, "objective": objective.key, "mode": objective.mode,
               "best_objective": best.objective, f"best_test_{setup.metric}": best.test_value,
               "best_settings": best.settings, "trials": counts, "wall_s": round(seconds, 1)}
    outputs.atomic_write_text(save_dir / "sweep.json", json.dumps(summary, indent=2, default=str) + "\n")
    print(f"best trial {best.trial_id}: {objective.key}={best.objective:.6f} test_{setup.metric}="
          f"{best.test_value:.6f}; replay: kermt finetune --config {save_dir / 'best_config.yaml'}", flush=True)
    return summary
