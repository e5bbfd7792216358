"""A run that trains one model (one fold, one member: the usual finetune) trains it from the driver, without Tune.

The driver coordinates the member's TorchTrainer itself, as a Tune trial would (``trainable.train_member``), and
writes the member's files straight into ``save_dir/fold_F/model_M``: a Tune run around a single model would add
nothing but a trial process (its torch, Ray Train and kermt imports: ~5.6 CPU-s on this project's 2-core machine)
and the experiment's bookkeeping. Resuming needs no Tune either: the member's Train run has the name a trial's would
(``members.run_member``), so re-running the same command after an interruption continues from its last epoch
checkpoint in the run's storage, as a restarted trial does.
"""

from __future__ import annotations

from ray_app.common import outputs
from ray_app.finetune.fold_data import FoldData
from ray_app.finetune.members import run_member, save_member
from ray_app.finetune.run_setup import RunSetup


def train_one_model(setup: RunSetup, data: FoldData, fold: int, member: int) -> None:
    """Train ``(fold, member)`` on ``data`` (its fold's shards) and write its files into ``save_dir``, staged beside
    their folder and renamed into place, so a run stopped meanwhile leaves no half-written member."""
    setup = setup.without_inputs()  # what a trial gets: the workers' plan carries no input molecules
    model, history = run_member(setup, data, fold, member)
    with outputs.replacing_directory(setup.layout.member(fold, member)) as staging:
        staging.mkdir(parents=True)
        save_member(setup, model, data, staging, history, fold, member)
