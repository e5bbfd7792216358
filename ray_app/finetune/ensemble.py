"""Ensembles and folds as one Ray Tune run: a trial per (fold, member), with the trainable `kermt tune` trials use.

Tune brings what a finetune of many models needs: how many train at once (``--max_concurrent_trials``, by default
``common.concurrency``: every member on a multi-node cluster, so the ones that do not fit are pending demand for
the autoscaler), and resuming. A failed member fails the command once the others are done (they are independent,
and kept); the re-run retries only what failed or did not finish. The experiment lives in the run's storage
(``--storage_path``, else ``save_dir/ray_results``) under the run id, so re-running the same command after the
driver died restores it: finished trials are kept, unfinished ones restart and their Ray Train runs resume from
their last epoch checkpoint. Members already in ``save_dir`` are never trained again (``resume.saved_by_run``).
A run with one model to train and no interrupted Tune run to resume trains it from the driver, without Tune
(``one_model``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ray import tune

from kermt.config import FinetuneModelConfig
from kermt.data import atomic_files
from kermt.run_layout import RunLayout
from ray_app.common.interrupt import stopping_on_ctrl_c
from ray_app.finetune.fold_data import FoldData
from ray_app.finetune.members import member_concurrency
from ray_app.finetune.one_model import train_one_model
from ray_app.finetune.resume import saved_by_run
from ray_app.finetune.run_setup import RunSetup
from ray_app.finetune.trainable import MemberTrial, download_files, train_member, trial_actor_resources

Job = tuple[int, int]  # (fold, member)


def experiment_name(setup: RunSetup) -> str:
    return f"{setup.run_id}-members"


def experiment_path(setup: RunSetup) -> str:
    return atomic_files.join(setup.storage, experiment_name(setup))  # keeps a URI's ?endpoint_override=...


class MemberFiles(tune.Callback):
    """Copies each member's files into ``save_dir/fold_F/model_M`` as its trial finishes, so a driver that dies
    later loses no finished member."""

    def __init__(self, save_dir: Path, run_id: str):
        self.save_dir, self.run_id = save_dir, run_id

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        fetch_member(self.save_dir, self.run_id, trial.config, trial.checkpoint)

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        print(f"fold {trial.config['job']['fold']} model {trial.config['job']['member']} failed "
              f"(traceback: {trial.error_file}); the other models go on", flush=True)


def fetch_member(save_dir: Path, run_id: str, config: dict[str, Any], checkpoint) -> None:
    target = RunLayout(save_dir).member(config["job"]["fold"], config["job"]["member"])
    if not saved_by_run(target, run_id):  # a member kept from an interrupted run stays as it is
        download_files(checkpoint, target, keep_result=False)


def train_members(setup: RunSetup, fold_data: Sequence[FoldData], jobs: Sequence[Job],
                  model_configs: Sequence[FinetuneModelConfig]) -> None:
    """Train every (fold, member) of ``jobs`` that ``save_dir`` does not hold yet; afterwards each one's files are in
    ``save_dir/fold_F/model_M``. ``fold_data``: each fold's shards, which the members' workers read, and its scalers
    (ray_app.finetune.fold_data); ``model_configs``: each fold's architecture (they size what a trial's coordinator
    asks for)."""
    kept = frozenset(job for job in jobs if saved_by_run(setup.layout.member(*job), setup.run_id))
    if kept:
        print(f"kept {len(kept)} of {len(jobs)} model(s) this run already saved; {len(jobs) - len(kept)} to go",
              flush=True)
    to_train = [job for job in jobs if job not in kept]
    if not to_train:
        return
    advice = (f"finished models and each member's last epoch are kept in {setup.save_dir} and {setup.storage}; "
              "re-run the same command to resume")
    restorable = tune.Tuner.can_restore(experiment_path(setup))  # an interrupted run's Tune run, resumed as such
    if len(to_train) == 1 and not restorable:
        (fold, member), = to_train
        with stopping_on_ctrl_c(advice, tune=False):
            train_one_model(setup, fold_data[fold], fold, member)
        return
    with stopping_on_ctrl_c(advice):
        grid = _tuner(setup, fold_data, to_train, kept, trial_actor_resources(*model_configs), restorable).fit()
    for result in grid:  # trials that finished while no driver was there to copy their files
        fetch_member(setup.save_dir, setup.run_id, result.config, result.checkpoint)
    failed = [result for result in grid if result.error is not None]
    if failed:
        job = failed[0].config["job"]
        raise RuntimeError(f"{len(failed)} model(s) failed, the first fold {job['fold']} model {job['member']} (the "
                           f"others are saved; re-run the same command to retry):\n{failed[0].error}"
                           ) from failed[0].error
    missing = [job for job in to_train if not saved_by_run(setup.layout.member(*job), setup.run_id)]
    if missing:
        raise RuntimeError(f"the Tune run {experiment_name(setup)} in {setup.storage} ended without model(s) "
                           f"{missing} (fold, member); re-run the same command to resume it, or remove that "
                           f"directory to train them afresh")


def _tuner(setup: RunSetup, fold_data: Sequence[FoldData], to_train: list[Job], kept: frozenset[Job],
           resources: dict[str, float], restorable: bool):
    # Each fold's FoldData (where its shards are, its manifests and scalers) travels inside one small object
    # (tune.with_parameters puts each argument once); no trial gets a fold's object.
    trainable = tune.with_resources(tune.with_parameters(
        train_member, setup=setup.without_inputs(), fold_data=list(fold_data), trial=MemberTrial(kept)), resources)
    experiment = experiment_path(setup)
    if restorable:  # its grid, concurrency and callbacks are the interrupted run's
        print(f"resuming the Tune run in {experiment}: finished trials are kept, unfinished ones restart", flush=True)
        return tune.Tuner.restore(experiment, trainable, resume_unfinished=True, resume_errored=True)
    concurrency = member_concurrency(setup, len(to_train))
    return tune.Tuner(
        trainable,
        param_space={"job": tune.grid_search([{"fold": fold, "member": member} for fold, member in to_train])},
        # reuse_actors: a trial process is kept for the next member (its torch and kermt imports take seconds);
        # a member's state is all seeded from (seed, fold, member), so what ran before in the process changes nothing.
        tune_config=tune.TuneConfig(max_concurrent_trials=concurrency, reuse_actors=True),
        run_config=tune.RunConfig(name=experiment_name(setup), storage_path=setup.storage, verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0),
                                  callbacks=[MemberFiles(setup.save_dir, setup.run_id)]),
    )
