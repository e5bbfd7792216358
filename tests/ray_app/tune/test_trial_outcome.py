"""What `kermt tune` says of a trial ASHA stopped, from real Ray Tune trials: the epochs it trained, counted as the
training log numbers them (from 0). ASHA's first rung is at ``epoch`` 1, i.e. after 2 epochs."""

from __future__ import annotations

import pytest
from ray import tune

from kermt.train.objective import Objective
from ray_app.tune.driver import _scheduler
from ray_app.tune.results import COMPLETED_STATUS, epochs_run, outcome
from ray_app.tune.trial import COMPLETED

EPOCHS = 4  # ASHA rung at epoch 1 only (the last rung stays before the last epoch)


def _trial(config):
    """A finetune trial's reports: one per epoch (0-based ``epoch``), a final one when it trained every epoch."""
    for epoch in range(EPOCHS):
        tune.report({"epoch": epoch, "val_rmse": config["rmse"] / (epoch + 1)})
    tune.report({COMPLETED: True, "epochs_run": EPOCHS, "val_rmse": config["rmse"] / EPOCHS})


@pytest.fixture(scope="module")
def trials(ray_cluster, tmp_path_factory):
    """The first trial sets the rung's bar; the worse one after it is stopped at the rung."""
    tuner = tune.Tuner(_trial, param_space={"rmse": tune.grid_search([1.0, 3.0])},
                       tune_config=tune.TuneConfig(scheduler=_scheduler("asha", Objective("val_rmse", "min"), EPOCHS),
                                                   max_concurrent_trials=1),
                       run_config=tune.RunConfig(storage_path=str(tmp_path_factory.mktemp("asha")), name="asha",
                                                 verbose=0))
    results = tuner.fit()
    return [(result.config["rmse"], result.metrics) for result in results]


def test_a_stopped_trial_is_reported_after_the_epochs_it_trained(trials):
    by_rmse = dict(trials)
    assert by_rmse[1.0].get(COMPLETED) and outcome(by_rmse[1.0]) == COMPLETED_STATUS
    last = by_rmse[3.0]
    assert not last.get(COMPLETED)
    assert (last["epoch"], last["training_iteration"]) == (1, 2)  # judged at the rung: 2 reports, index 1
    assert epochs_run(last) == 2
    assert outcome(last) == "stopped early after 2 epochs (last: epoch 1)"


def test_epochs_run_without_an_epoch_index_falls_back_to_tunes_count():
    assert epochs_run({"training_iteration": 3}) == 3
    assert epochs_run({"epochs_run": 5, "epoch": 1}) == 5
    assert outcome({}) == "stopped early"
    assert outcome({"epoch": 0}) == "stopped early after 1 epoch (last: epoch 0)"
