"""Training the members of a finetune run: one Ray TorchTrainer per (fold, member), several at once.

A member's seeds depend only on (seed, fold, member), so the models are the same whatever trains beside them;
coordinators stay on the driver's node so that losing a worker node never loses a run's coordinator.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kermt.checkpoint import CheckpointSpec, FeatureSettings, export_upstream, save_native, unbuilt_encoder_tensors
from kermt.nn.finetune import KermtFinetuneModel
from kermt.training import predict
from ray_app.common import outputs
from ray_app.common.concurrency import concurrent_runs
from ray_app.finetune.prepare import ScaledSplits, fold_count
from ray_app.finetune.resume import finished_member
from ray_app.finetune.setup import RunSetup, features_width, initial_state, member_seed, model_config
from ray_app.finetune.train_loop import STATE_FILE, MemberPlan, train_loop_per_worker


def run_member(setup: RunSetup, splits: ScaledSplits, fold: int, member: int,
               callbacks: Sequence[Any] = (), label: str | None = None,
               splits_ref: ray.ObjectRef | None = None) -> tuple[KermtFinetuneModel, list]:
    """Train one member with a TorchTrainer; returns the best-epoch model (on CPU) and the epoch history.

    ``callbacks`` go to the Train RunConfig (Tune passes its TuneReportCallback to see every epoch's metrics);
    ``label`` names the run in log lines (default "fold F model M"); ``splits_ref``: ``splits`` already in the
    object store (put once per fold), which the workers then read instead of a copy inside the member's plan."""
    label = label or f"fold {fold} model {member}"
    c = setup.config
    config = model_config(setup, features_width(splits))
    seed = member_seed(c.seed + fold, member)
    state, load_summary = initial_state(setup, config, seed)
    print(f"{label}: {load_summary}", flush=True)
    shipped = (None, None) if splits_ref is not None else (splits.train, splits.val)
    plan = MemberPlan(config, state, *shipped, splits.target_scaler, seed, c.epochs, c.step_batch_size,
                      c.init_lr, c.max_lr, c.final_lr, c.warmup_epochs, c.weight_decay, c.fine_tune_coff,
                      c.dist_coff, c.bond_drop_rate, setup.metric, c.select_by_loss, c.early_stop_epoch,
                      label=label, precision=c.precision)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"plan": ray.put(plan), **({"splits": splits_ref} if splits_ref is not None else {})},
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
    with result.checkpoint.as_directory() as directory:
        saved = torch.load(Path(directory) / STATE_FILE, weights_only=True, map_location="cpu")
    model = KermtFinetuneModel(config)
    model.load_state_dict(saved["best_state"] if saved["best_state"] is not None else saved["model"])
    return model, saved["progress"]["history"]


def save_member(setup: RunSetup, model: KermtFinetuneModel, splits: ScaledSplits, directory: Path,
                history: list) -> None:
    """Native checkpoint + upstream-compatible model.pt + metrics.csv (+ TensorBoard) of one member."""
    c = setup.config
    features = FeatureSettings(tuple(c.features_generator or ()), splits.features_scaler is not None,
                               None, False)
    spec = CheckpointSpec.for_finetune_model(model.config, task_names=tuple(setup.task_names), features=features,
                                             data_scaler=splits.target_scaler, features_scaler=splits.features_scaler)
    passthrough = unbuilt_encoder_tensors(setup.checkpoint) if setup.checkpoint else None
    provenance = {"run_id": setup.run_id, "checkpoint_path": str(setup.checkpoint.path) if setup.checkpoint else None}
    save_native(directory / "model", model.state_dict(), spec, passthrough=passthrough, provenance=provenance)
    if model.config.encoder.padding == "upstream":  # upstream has no other padding: model.pt would predict otherwise
        export_upstream(directory / "model.pt", model.state_dict(), spec, passthrough=passthrough)
    outputs.atomic_write_text(directory / "metrics.csv", outputs.metrics_csv(history))
    if c.tensorboard:
        outputs.write_tensorboard(directory, history, setup.metric)


@ray.remote(num_cpus=0)  # a coordinator only: its TorchTrainer's workers hold the resources
def _train_member_task(setup: RunSetup, wrapped_ref: list[ray.ObjectRef], fold: int, member: int):
    # The fold's data arrives as a reference (wrapped in a list so that Ray passes it unresolved): the workers
    # read that one object instead of a copy per member.
    return run_member(setup, ray.get(wrapped_ref[0]), fold, member, splits_ref=wrapped_ref[0])


def train_members(setup: RunSetup, fold_parts: list[ScaledSplits], concurrency: int,
                  jobs: list[tuple[int, int]]) -> Iterator[tuple[int, int, KermtFinetuneModel, list]]:
    """Train each (fold, member) of ``jobs``, ``concurrency`` TorchTrainers at a time; yields them as they finish.

    Each fold's data is put in the object store once and shared by its members' workers. Each member's seeds
    depend only on (seed, fold, member), so the models are the same whatever runs beside them. With concurrency 1
    the members train one after another in this process, as upstream does."""
    part_refs = {fold: ray.put(fold_parts[fold]) for fold in sorted({fold for fold, _ in jobs})}
    if concurrency == 1:
        for fold, member in jobs:
            yield fold, member, *run_member(setup, fold_parts[fold], fold, member, splits_ref=part_refs[fold])
        return
    setup_ref = ray.put(setup)
    waiting, running = iter(jobs), {}
    # Coordinators stay on the driver's node (the head on a cluster): a lost or preempted worker node then takes
    # training workers with it, which Ray Train recovers, never the coordinator of a run.
    coordinator = _train_member_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=True))

    def launch_next() -> None:
        job = next(waiting, None)
        if job is not None:
            running[coordinator.remote(setup_ref, [part_refs[job[0]]], *job)] = job

    for _ in range(concurrency):
        launch_next()
    while running:
        (done,), _ = ray.wait(list(running), num_returns=1)
        fold, member = running.pop(done)
        try:
            model, history = ray.get(done)
        except ray.exceptions.RayTaskError as error:
            for ref in running:
                ray.cancel(ref)
            raise RuntimeError(f"fold {fold} model {member} failed; the other runs were cancelled:\n{error}") from None
        launch_next()
        yield fold, member, model, history


def member_test_predictions(model: KermtFinetuneModel, splits: ScaledSplits, batch_size: int,
                            use_gpu: bool = False, precision: str = "fp32") -> np.ndarray:
    """(n_test, n_tasks) predictions in label units; with ``use_gpu`` computed by a task on a GPU node (the driver
    usually sits on a head without one), else here on the CPU."""
    if use_gpu and len(splits.test):
        preds = ray.get(_predict_on_gpu.remote(model, splits.test, batch_size, precision))
    else:
        preds = predict(model, splits.test, np.arange(len(splits.test)), batch_size, precision)
    return splits.target_scaler.inverse_transform(preds) if splits.target_scaler else preds


@ray.remote(num_gpus=1)
def _predict_on_gpu(model: KermtFinetuneModel, molecules, batch_size: int, precision: str) -> np.ndarray:
    model = model.to(torch.device("cuda"))
    return predict(model, molecules, np.arange(len(molecules)), batch_size, precision)


def kept_members(setup: RunSetup, parts: list[ScaledSplits], jobs: list[tuple[int, int]]) -> dict:
    """(fold, member) -> (model, history) of the members an interrupted run of these settings already saved."""
    kept = {}
    for fold, member in jobs:
        found = finished_member(setup.save_dir / f"fold_{fold}" / f"model_{member}", setup.run_id,
                                model_config(setup, features_width(parts[fold])))
        if found is not None:
            kept[fold, member] = found
    if kept:
        print(f"kept {len(kept)} of {len(jobs)} model(s) finished by the interrupted run", flush=True)
    return kept


def member_concurrency(setup: RunSetup, runs: int) -> int:
    c = setup.config
    concurrency = concurrent_runs(c.max_concurrent_trials, c.min_workers, c.use_gpu, runs)
    if runs > 1:
        print(f"training {runs} models ({fold_count(c)} fold(s) x {c.ensemble_size} member(s)), "
              f"{concurrency} at a time", flush=True)
    return concurrency
