"""The sweep itself: a Ray Tune Tuner over finetune's trainable (``ray_app.finetune.trainable.train_member``, with
``ray_app.tune.trial.TuneTrial``), started fresh or restored from ``--save_dir``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import optuna
import ray
import yaml
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search.optuna import OptunaSearch

from kermt.data import atomic_files
from kermt.errors import Interrupted
from kermt.run_layout import RunLayout
from ray_app.common import outputs
from ray_app.common.cluster import connect
from ray_app.common.concurrency import concurrent_runs
from ray_app.common.interrupt import stopping_on_ctrl_c
from ray_app.common.settings import Source
from kermt.train.objective import Objective
from ray_app.finetune.fold_data import FoldData, remove_folds, write_folds
from ray_app.finetune.run_setup import RunSetup, features_width, fold_splits, model_config, resolve_setup, task_line
from ray_app.finetune.trainable import train_member, trial_actor_resources
from ray_app.tune.dry_run import dry_run_tune, sweep_header
from ray_app.tune.config import EXPERIMENT, SWEEP_FILE, SweepFailedError, TuneConfig, finetune_sources, sweep_record
from ray_app.tune.search_space import SearchSpace
from ray_app.tune.results import (
    FAILED,
    UNFINISHED,
    all_trials_csv,
    best_row,
    download_trial,
    outcome,
    summary_table,
    trial_rows,
    write_best,
)
from ray_app.tune.trial import OBJECTIVE, TuneTrial

SWEEP_DATA = "sweep"  # fold 0's shards: STORAGE/sweep-data/fold_0/ (ray_app.finetune.fold_data)


class TrialLines(tune.Callback):
    """One line per finished trial (instead of Tune's tables, which repeat every few seconds); a completed
    trial's files are downloaded into ``save_dir/trials/<id>/`` as it finishes."""

    def __init__(self, objective_key: str, n_trials: int, save_dir: Path):
        self.key, self.n_trials, self.save_dir = objective_key, n_trials, save_dir

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        download_trial(self.save_dir, trial)
        last = trial.last_result or {}
        print(f"trial {trial.trial_id} {outcome(last)}: {self.key}={last.get(OBJECTIVE, float('nan')):.6f} "
              f"{self._finished(trials, trial)}", flush=True)

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        print(f"trial {trial.trial_id} FAILED (traceback: {trial.error_file}) "
              f"{self._finished(trials, trial)}", flush=True)

    def _finished(self, trials: list, current) -> str:
        # Tune calls back before it updates the finishing trial's status
        done = sum(t is current or t.status in ("TERMINATED", "ERROR") for t in trials)
        return f"[{done}/{self.n_trials} trials finished]"

def run_tune(config: TuneConfig, sources: dict[str, Source], space: SearchSpace) -> dict[str, Any]:
    """Run (or resume) the sweep; write its outputs; returns the summary (also in sweep.json)."""
    if config.dry_run:  # the plan, without Ray
        return dry_run_tune(config, sources, space)
    connect(config.address)
    base = config.finetune_base()
    workers_flag = "--num_workers_per_trial" if config.num_workers_per_trial else "--num_workers"
    setup = resolve_setup(base, finetune_sources(config, sources), workers_flag)
    objective = Objective.of(setup.metric, setup.config.select_by_loss)
    concurrency = concurrent_runs(config.max_concurrent_trials, base.min_workers, base.use_gpu, config.n_trials)
    print(task_line(setup) + "\n" + sweep_header(config, space, objective), flush=True)
    setup.save_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # Every trial trains on fold 0's split: its train and val shards, which the trials' workers read as a finetune's
    # do (ray_app.finetune.fold_data: the same batches), and one object-store copy for what a trial computes after
    # training (its test score) and the scalers it saves. As in a finetune, the driver lets go of the featurised
    # files once the fold is put, and a Ray task writes the shards from the fold's object.
    splits = fold_splits(setup, 0)[1]
    # sized by the base settings' model: a sweep's heads change it little beside the checkpoint's encoder
    resources = trial_actor_resources(model_config(setup, features_width(splits)))
    fold_zero = ray.put(splits)
    del splits
    setup = setup.without_inputs()
    data = write_folds(setup.storage, SWEEP_DATA, [fold_zero])[0]
    interrupted = _sweep(_tuner(config, setup, fold_zero, space, objective, concurrency, resources, data), setup)
    remove_folds(setup.storage, SWEEP_DATA)
    trials = tune.ExperimentAnalysis(experiment_path(setup)).trials
    for trial in trials:  # trials that finished in an earlier, interrupted session
        download_trial(setup.save_dir, trial)
    try:
        summary = _report(setup, objective, trials, time.perf_counter() - started)
    except SweepFailedError:
        if interrupted:
            raise interrupted from None
        raise
    if interrupted:  # the trials finished so far are reported and their files saved; then say how to go on
        raise interrupted
    return summary


def _sweep(tuner: tune.Tuner, setup: RunSetup) -> Interrupted | None:
    """Run the sweep; on Ctrl-C (Tune stops gracefully, ray_app/common/interrupt.py) return the interruption so the
    trials finished so far can still be reported, unless the sweep had not started."""
    advice = (f"the finished trials and the sweep's state are kept in {experiment_root(setup)}; re-run the same "
              "command to resume the sweep")
    try:
        with stopping_on_ctrl_c(advice):
            tuner.fit()
    except Interrupted as stop:
        if not tune.Tuner.can_restore(experiment_path(setup)):
            raise
        return stop
    return None


def experiment_root(setup: RunSetup) -> str:
    """Where Tune keeps the experiment: ``--storage_path`` (checked reachable by every node), else ``save_dir``."""
    return setup.config.storage_path or str(setup.save_dir)


def experiment_path(setup: RunSetup) -> str:
    return atomic_files.join(experiment_root(setup), EXPERIMENT)  # keeps a URI's ?endpoint_override=...


def _tuner(config: TuneConfig, setup: RunSetup, fold_zero: ray.ObjectRef, space: SearchSpace,
           objective: Objective, concurrency: int, resources: dict[str, float], data: FoldData) -> tune.Tuner:
    # A trial may run on any node: it writes only to the experiment storage (see ray_app.finetune.trainable).
    trainable = tune.with_resources(tune.with_parameters(
        train_member, setup=setup, fold_splits=[fold_zero], trial=TuneTrial(objective), fold_data=[data]),
        resources)
    experiment = experiment_path(setup)
    if tune.Tuner.can_restore(experiment):
        # The restored Tuner keeps its searcher (Optuna's study included), scheduler and concurrency.
        print(f"resuming the sweep in {experiment}: finished trials are kept, unfinished ones restart", flush=True)
        return tune.Tuner.restore(experiment, trainable, resume_unfinished=True, resume_errored=False,
                                  restart_errored=False)
    outputs.atomic_write_text(setup.save_dir / SWEEP_FILE, yaml.safe_dump(sweep_record(config), sort_keys=False))
    print(f"{config.n_trials} trials, at most {concurrency} at once, {setup.config.num_workers} worker(s) each",
          flush=True)
    sampler = (optuna.samplers.TPESampler(seed=config.seed) if config.search == "optuna"
               else optuna.samplers.RandomSampler(seed=config.seed))
    searcher = OptunaSearch(space=space, metric=OBJECTIVE, mode=objective.mode, sampler=sampler)
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=_scheduler(config.scheduler, objective,
                                    setup.config.epochs), num_samples=config.n_trials,
                                    max_concurrent_trials=concurrency),
        run_config=tune.RunConfig(name=EXPERIMENT, storage_path=experiment_root(setup), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0),
                                  callbacks=[TrialLines(objective.key, config.n_trials, setup.save_dir)]),
    )


def _scheduler(kind: str, objective: Objective, epochs: int):
    """ASHA on the per-epoch validation value. "epoch" counts from 0, so rungs at epochs 1, 4, 16, ... judge a
    trial after 2, 5, 17, ... epochs; rungs stop before the last epoch (a trial stopped there would lose a model
    that is already trained), which leaves nothing to stop with fewer than 3 epochs: FIFO then."""
    last_rung = epochs - 2
    if kind == "fifo" or last_rung < 1:
        if kind == "asha":
            print(f"asha: {epochs} epoch(s) leave no rung before the last epoch; every trial runs to the end")
        return FIFOScheduler()
    return ASHAScheduler(time_attr="epoch", metric=objective.key, mode=objective.mode, max_t=last_rung,
                         grace_period=1, stop_last_trials=False)


def _earlier_sessions_wall_s(save_dir: Path) -> float:
    """What the sessions of this sweep before this one took, as the last of them recorded it (a sweep.json in
    save_dir is this sweep's: ray_app.tune.resume moves another sweep's aside). A killed session recorded nothing."""
    try:
        return float(json.loads(RunLayout(save_dir).sweep_record.read_text())["wall_s"])
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return 0.0


def _report(setup: RunSetup, objective: Objective, trials: list, seconds: float) -> dict:
    save_dir: Path = setup.save_dir
    rows = trial_rows(trials, setup.config, setup.metric)
    outputs.atomic_write_text(RunLayout(save_dir).all_trials, all_trials_csv(rows, setup.metric, objective))
    best = best_row(rows, objective)
    print(summary_table(rows, objective, setup.metric, best), flush=True)
    if best is None:
        failed = [r for r in rows if r.status == FAILED]
        if failed:
            raise SweepFailedError(f"no trial completed ({len(failed)} of {len(rows)} failed); the first failure, "
                                   f"trial {failed[0].trial_id}:\n{failed[0].error}")
        raise SweepFailedError(f"no trial completed ({', '.join(f'{r.trial_id}: {r.status}' for r in rows)}); "
                               f"an interrupted sweep resumes when the same command runs again")
    write_best(save_dir, best)
    if any(r.status == UNFINISHED for r in rows):  # Ctrl-C: Tune stopped the sweep and saved its state
        print("the sweep was interrupted: run the same command again to finish it", flush=True)
    counts = {status: sum(r.status == status for r in rows) for status in dict.fromkeys(r.status for r in rows)}
    summary = {"best_trial": best.trial_id, "objective": objective.key, "mode": objective.mode,
               "best_objective": best.objective, f"best_test_{setup.metric}": best.test_value,
               "best_settings": best.settings, "trials": counts,
               "wall_s": round(_earlier_sessions_wall_s(save_dir) + seconds, 1)}
    outputs.atomic_write_text(RunLayout(save_dir).sweep_record, json.dumps(summary, indent=2, default=str) + "\n")
    print(f"best trial {best.trial_id}: {objective.key}={best.objective:.6f} test_{setup.metric}="
          f"{best.test_value:.6f}; replay: kermt finetune --config {RunLayout(save_dir).best_config}", flush=True)
    return summary
