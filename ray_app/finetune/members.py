"""One member of a finetune run (a (fold, member), or a `kermt tune` trial): its Ray TorchTrainer, its files, its
test predictions.

A member's seeds depend only on (seed, fold, member), so the model is the same whatever trains beside it. The
members of a run train as the trials of one Ray Tune run (``ray_app.finetune.ensemble``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig

from kermt.checkpoint import CheckpointSpec, FeatureSettings, export_upstream, save_native, unbuilt_encoder_tensors
from kermt.data.dataset import MoleculeSet
from kermt.data.scalers import StandardScaler
from kermt.nn.finetune import KermtFinetuneModel
from kermt.run_layout import RunLayout
from kermt.inference.split import predict_split
from kermt.inference.widths import WidthRule, most_frequent_width, padding_rule, training_width_histogram
from ray_app.common import outputs
from ray_app.common.concurrency import concurrent_runs
from ray_app.common.trainer import KermtTrainer
from ray_app.common.worker_loop import STATE_FILE
from ray_app.finetune.fold_data import FoldData
from ray_app.finetune.prepare import ScaledSplits, fold_count
from ray_app.finetune.run_setup import RunSetup, StartingWeights, member_seed, model_config
from ray_app.finetune.train_loop import MemberPlan, train_loop_per_worker


def run_member(setup: RunSetup, data: FoldData, fold: int, member: int, callbacks: Sequence[Any] = (),
               label: str | None = None) -> tuple[KermtFinetuneModel, list]:
    """Train one member with a TorchTrainer; returns the best-epoch model (on CPU) and the epoch history.

    ``data``: the fold's shards in the run's storage (ray_app.finetune.fold_data), which each worker reads as its
    batches need them, with the fold's scalers and feature width (so no process of the member holds the fold's
    object). ``callbacks`` go to the Train RunConfig (Tune passes its TuneReportCallback to see every epoch's
    metrics); ``label`` names the run in log lines (default "fold F model M")."""
    label = label or f"fold {fold} model {member}"
    c = setup.config
    config = model_config(setup, data.features_width)
    seed = member_seed(c.seed + fold, member)  # also the seed of save_member's width histogram
    # the workers build the starting model from the shared checkpoint: this process never holds one before the end
    plan = MemberPlan(
        model_config=config, initial_state=StartingWeights(setup.without_inputs(), seed, member), train=None, val=None,
        target_scaler=data.target_scaler, seed=seed, epochs=c.epochs, global_batch_size=c.step_batch_size,
        init_lr=c.init_lr, max_lr=c.max_lr, final_lr=c.final_lr, warmup_epochs=c.warmup_epochs,
        weight_decay=c.weight_decay, fine_tune_coff=c.fine_tune_coff, dist_coff=c.dist_coff,
        bond_drop_rate=c.bond_drop_rate, metric=setup.metric, select_by_loss=c.select_by_loss,
        early_stop_epoch=c.early_stop_epoch, label=label, precision=c.precision, dropout_draws=c.dropout_draws)
    trainer = KermtTrainer(  # ray_app.common.trainer: Ray's TorchTrainer, cheaper to start, elastic on live nodes
        train_loop_per_worker,
        train_loop_config={"plan": plan, "data": data},
        scaling_config=ScalingConfig(num_workers=c.worker_range if c.elastic else c.min_workers, use_gpu=c.use_gpu),
        run_config=RunConfig(
            name=f"{setup.run_id}-fold{fold}-model{member}",
            storage_path=setup.storage,
            failure_config=FailureConfig(max_failures=setup.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=1),
            logging_config=LoggingConfig(log_level="WARNING"),  # our loop prints one line per epoch
            callbacks=list(callbacks),
        ),
    )
    result = trainer.fit()
    model = KermtFinetuneModel(config)
    with result.checkpoint.as_directory() as directory:
        # mapped, not read: of the training state (model, best model, Adam's two moments) only the tensors loaded
        # here are paged in, so a coordinator holds one model at the end, not four
        saved = torch.load(Path(directory) / STATE_FILE, weights_only=True, map_location="cpu", mmap=True)
        model.load_state_dict(saved["best_state"] if saved["best_state"] is not None else saved["model"])
        history = saved["progress"]["history"]
    return model, history


def save_member(setup: RunSetup, model: KermtFinetuneModel, data: FoldData, directory: Path, history: list,
                fold: int, member: int) -> None:
    """Native checkpoint + upstream-compatible model.pt + metrics.csv (+ TensorBoard) of one member.

    The checkpoint records the neighbour widths of the member's training batches over its planned epochs and their
    most frequent one, the reference width its molecules are predicted at (kermt.inference.widths), which its
    validation used too (kermt.train.loop.validation_rule)."""
    c = setup.config
    features = FeatureSettings(tuple(c.features_generator or ()), data.features_scaler is not None,
                               None, False, standardize=c.standardize)
    widths = training_width_histogram(data.train_source(), member_seed(c.seed + fold, member), c.epochs,
                                      c.step_batch_size)  # over the plan its workers drew
    spec = CheckpointSpec.for_finetune_model(model.config, task_names=tuple(setup.task_names), features=features,
                                             data_scaler=data.target_scaler, features_scaler=data.features_scaler,
                                             reference_width=most_frequent_width(widths), training_widths=widths)
    passthrough = unbuilt_encoder_tensors(setup.source_checkpoint()) if setup.checkpoint else None
    started = c.member_checkpoints[member] if c.member_checkpoints else setup.checkpoint.path if setup.checkpoint \
        else None
    provenance = {"run_id": setup.run_id, "checkpoint_path": None if started is None else str(started)}
    save_native(RunLayout(directory).model, model.state_dict(), spec, passthrough=passthrough, provenance=provenance)
    if model.config.head.variance:  # upstream's heads predict one value per task: no model.pt can hold this one
        print(f"{directory.name}: no upstream model.pt: a variance head (--loss mve) has no upstream counterpart; "
              "the native checkpoint model/ is the model", flush=True)
    elif model.config.encoder.padding == "upstream":  # upstream has no other padding: model.pt would predict otherwise
        export_upstream(RunLayout(directory).upstream_model, model.state_dict(), spec, passthrough=passthrough)
    outputs.atomic_write_text(RunLayout(directory).metrics, outputs.metrics_csv(history))
    if c.tensorboard:
        outputs.write_tensorboard(directory, history, setup.metric)


def member_test_predictions(model: KermtFinetuneModel, splits: ScaledSplits, batch_size: int, use_gpu: bool = False,
                            precision: str = "fp32", rule: WidthRule | None = None) -> np.ndarray:
    """(n_test, n_tasks) predictions in label units, as `kermt predict` makes them (``rule``: the run's
    :class:`~kermt.inference.widths.WidthRule`; default: the model's padding with the default reference width);
    with ``use_gpu`` computed by a task on a GPU node (the driver usually sits on a head without one), else here on
    the CPU."""
    return predict_molecules(model, splits.test, splits.target_scaler, batch_size, use_gpu, precision, rule)[0]


def predict_molecules(model: KermtFinetuneModel, molecules: MoleculeSet, target_scaler: StandardScaler | None,
                      batch_size: int, use_gpu: bool = False, precision: str = "fp32",
                      rule: WidthRule | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """``molecules``' predictions and a variance head's predicted variances (None without), in label units
    (``target_scaler``: the fold's), made as :func:`member_test_predictions` makes them."""
    rule = rule or padding_rule(model.config.encoder.padding)
    if use_gpu and len(molecules):
        preds, variances = ray.get(_predict_on_gpu.remote(model, molecules, batch_size, precision, rule))
    else:
        preds, variances = predict_split(model, molecules, batch_size, rule, precision)
    if target_scaler is None:
        return preds, variances
    return (target_scaler.inverse_transform(preds),
            None if variances is None else target_scaler.inverse_transform_variance(variances))


@ray.remote(num_gpus=1)
def _predict_on_gpu(model: KermtFinetuneModel, molecules, batch_size: int, precision: str, rule: WidthRule) \
        -> tuple[np.ndarray, np.ndarray | None]:
    return predict_split(model.to(torch.device("cuda")), molecules, batch_size, rule, precision)


def member_concurrency(setup: RunSetup, runs: int) -> int:
    c = setup.config
    concurrency = concurrent_runs(c.max_concurrent_trials, c.min_workers, c.use_gpu, runs)
    if runs > 1:
        print(f"training {runs} models ({fold_count(c)} fold(s) x {c.ensemble_size} member(s)), "
              f"{concurrency} at a time", flush=True)
    return concurrency
