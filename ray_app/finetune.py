"""`kermt finetune`: upstream's `main.py finetune`, each ensemble member of each fold trained by a Ray TorchTrainer.

Driver flow: resolve settings -> featurise every file once on the cluster -> per fold: split, scale, then per
member: build the initial model here (pretrained encoder + fresh head), train it data-parallel, keep the best
epoch -> ensemble-average test predictions -> upstream's outputs and summary lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kermt.checkpoint import (
    Checkpoint,
    CheckpointSpec,
    FeatureSettings,
    export_upstream,
    load_into_model,
    merge_finetune_config,
    read_checkpoint,
    save_native,
    unbuilt_encoder_tensors,
)
from kermt.checkpoint.reader import FRESH_HEAD_PREFIXES
from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.splits import Split
from kermt.errors import UserError
from kermt.data.tables import check_classification_labels, infer_dataset_type
from kermt.metrics import nanmean
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.heads import initialize_weights
from kermt.training import predict, score
from ray_app import outputs
from ray_app.cluster import connect
from ray_app.concurrency import concurrent_runs
from ray_app.config import FinetuneConfig, Source, to_yaml
from ray_app.prepare import (
    ScaledSplits,
    SourceData,
    fold_count,
    load_source,
    scale_splits,
    split_for_fold,
    subset,
    wants_feature_scaling,
    write_invalid,
)
from ray_app.resume import claim_run_id, finished_member, new_run_id
from ray_app.storage import check_gpus, resolve_max_failures, resolve_storage
from ray_app.train_loop import STATE_FILE, MemberPlan, train_loop_per_worker

# Upstream finetune parser defaults for an encoder trained from scratch (no checkpoint).
SCRATCH_ENCODER = {"hidden_size": 800, "depth": 6, "num_attn_head": 4, "num_mt_block": 1, "activation": "ReLU",
                   "bias": False}
ENCODER_KEYS = tuple(SCRATCH_ENCODER)
READOUT_KEYS = ("self_attention", "attn_hidden", "attn_out")
HEAD_KEYS = ("ffn_hidden_size", "ffn_num_layers", "ffn_num_task_specific_layers", "ffn_task_specific_hidden_size")


@dataclass(frozen=True)
class RunSetup:
    config: FinetuneConfig
    sources: dict[str, Source]
    save_dir: Path
    run_id: str
    dataset_type: str
    metric: str
    task_names: list[str]
    checkpoint: Checkpoint | None
    data: SourceData
    val: SourceData | None
    test: SourceData | None
    storage: str  # Ray Train storage: --storage_path, or save_dir/ray_results on a single-node cluster
    max_failures: int  # --max_failures, or the cluster's default (storage.resolve_max_failures)


def _user_set(setup_sources: dict[str, Source], key: str) -> bool:
    return setup_sources.get(key, "default") != "default"


def features_width(splits: ScaledSplits) -> int:
    """Molecule-feature columns the head takes (0 without features)."""
    return splits.train.features.shape[1] if splits.train.features is not None else 0


def model_config(setup: RunSetup, features_size: int) -> FinetuneModelConfig:
    """Architecture from the checkpoint (a contradicting flag is an error); training settings from the user."""
    c, ckpt = setup.config, setup.checkpoint
    head = {"num_tasks": len(setup.task_names), "dataset_type": setup.dataset_type, "features_size": features_size,
            "dropout": c.dropout, **{k: getattr(c, k) for k in HEAD_KEYS}}
    readout = {k: getattr(c, k) for k in READOUT_KEYS}
    encoder = {k: getattr(c, k) for k in ENCODER_KEYS if getattr(c, k) is not None}
    encoder.update(dropout=c.dropout, padding=c.padding)
    if ckpt is None:
        enc = EncoderConfig(**{**SCRATCH_ENCODER, **encoder, "embedding_output_type": "atom"})
        return FinetuneModelConfig(enc, ReadoutConfig(**readout), HeadConfig(**{"activation": enc.activation, **head}),
                                   c.use_mtl_loss)
    if ckpt.spec.kind == "finetuned":  # only what the user actually set may (and must) agree with the checkpoint
        readout = {k: v for k, v in readout.items() if _user_set(setup.sources, k)}
        head = {k: v for k, v in head.items() if k in ("num_tasks", "dataset_type", "features_size", "dropout")
                or _user_set(setup.sources, k)}
    return merge_finetune_config(ckpt.spec, encoder=encoder, readout=readout, head=head,
                                 use_mtl_loss=c.use_mtl_loss, source=str(ckpt.path))


def initial_state(setup: RunSetup, config: FinetuneModelConfig, seed: int) -> tuple[dict[str, torch.Tensor], str]:
    """The member's starting weights: head initialised as upstream (seeded), encoder from the checkpoint."""
    torch.manual_seed(seed)
    model = KermtFinetuneModel(config)
    # Upstream's init (1-D -> 0, else xavier) for the head only; a from-scratch encoder keeps PyTorch's init,
    # since upstream's would zero every LayerNorm gain (docs/upstream-compatibility.md#initialisation).
    for name, module in model.named_children():
        if name != "kermt":
            initialize_weights(module)
    if setup.checkpoint is None:
        return model.state_dict(), "trained from scratch (no checkpoint)"
    ckpt = setup.checkpoint
    fresh = FRESH_HEAD_PREFIXES if ckpt.spec.kind != "finetuned" else ("mtl_log_sigma",)
    report = load_into_model(model, ckpt.state_dict, fresh, ckpt.ignored_entries())
    return model.state_dict(), report.summary()


def member_seed(fold_seed: int, member: int) -> int:
    return int(np.random.default_rng([fold_seed, member]).integers(2**31 - 1))


def resolve_setup(config: FinetuneConfig, sources: dict[str, Source]) -> RunSetup:
    """Check the storage, read the checkpoint and every data file (featurised on the cluster), settle dataset type
    and metric."""
    save_dir = Path(config.save_dir).resolve()
    storage = resolve_storage(config.storage_path, save_dir / "ray_results")  # refused before any work starts
    check_gpus(config.use_gpu)
    checkpoint = read_checkpoint(checkpoint_path(config), trust_pickle=config.trust_checkpoint,
                                 dataset_type=config.dataset_type) if (
        config.checkpoint_path or config.pretrained_release) else None
    data = load_source(config.data_path, config, None, config.features_path)
    task_names = data.target_names
    val = load_source(config.separate_val_path, config, task_names, config.separate_val_features_path) if (
        config.separate_val_path) else None
    test = load_source(config.separate_test_path, config, task_names, config.separate_test_features_path,
                       blinded_ok=True) if config.separate_test_path else None
    dataset_type = config.dataset_type or infer_dataset_type(data.targets)
    if dataset_type == "classification":
        for source in (data, val, test):
            if source is not None:
                check_classification_labels(source.path, source.targets, task_names)
    metric = config.metric or ("auc" if dataset_type == "classification" else "rmse")
    run_id = new_run_id()  # a fresh run; run_finetune reuses an interrupted run's id (ray_app/resume.py)
    return RunSetup(config, sources, save_dir, run_id, dataset_type, metric, task_names,
                    checkpoint, data, val, test, storage, resolve_max_failures(config.max_failures))


def checkpoint_path(config: FinetuneConfig) -> str:
    if config.pretrained_release:
        from ray_app.release import fetch_release

        return str(fetch_release(config.model_dir))
    assert config.checkpoint_path is not None
    return config.checkpoint_path


def fold_splits(setup: RunSetup, fold: int) -> tuple[Split, ScaledSplits]:
    config = setup.config
    split = split_for_fold(config, setup.data, fold, setup.val is not None, setup.test is not None)
    parts = {"train": subset(setup.data, split.train)}
    parts["val"] = subset(setup.val, list(range(len(setup.val)))) if setup.val else subset(setup.data, split.val)
    parts["test"] = subset(setup.test, list(range(len(setup.test)))) if setup.test else subset(setup.data, split.test)
    for name, (molecules, _) in parts.items():
        if len(molecules) == 0 and name != "test":
            raise UserError(f"fold {fold}: the {name} split is empty; check --split_sizes or the separate files")
    return split, scale_splits(parts, setup.dataset_type, wants_feature_scaling(config))


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
    plan = MemberPlan(config, state, *shipped, splits.target_scaler, seed, c.epochs, c.batch_size,
                      c.init_lr, c.max_lr, c.final_lr, c.warmup_epochs, c.weight_decay, c.fine_tune_coff,
                      c.dist_coff, c.bond_drop_rate, setup.metric, c.select_by_loss, c.early_stop_epoch,
                      label=label)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"plan": ray.put(plan), **({"splits": splits_ref} if splits_ref is not None else {})},
        scaling_config=ScalingConfig(num_workers=c.num_workers, use_gpu=c.use_gpu),
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
                            use_gpu: bool = False) -> np.ndarray:
    """(n_test, n_tasks) predictions in label units; with ``use_gpu`` computed by a task on a GPU node (the driver
    usually sits on a head without one), else here on the CPU."""
    if use_gpu and len(splits.test):
        preds = ray.get(_predict_on_gpu.remote(model, splits.test, batch_size))
    else:
        preds = predict(model, splits.test, np.arange(len(splits.test)), batch_size)
    return splits.target_scaler.inverse_transform(preds) if splits.target_scaler else preds


@ray.remote(num_gpus=1)
def _predict_on_gpu(model: KermtFinetuneModel, molecules, batch_size: int) -> np.ndarray:
    model = model.to(torch.device("cuda"))
    return predict(model, molecules, np.arange(len(molecules)), batch_size)


def finish_fold(setup: RunSetup, fold: int, splits: ScaledSplits, member_preds: list[np.ndarray]) -> float:
    """Ensemble mean (summed in member order, as upstream) -> fold_k/test_result.csv; returns the fold's score."""
    c = setup.config
    summed = np.zeros((len(splits.test), len(setup.task_names)))
    for preds in member_preds:
        summed += preds
    ensemble = summed / c.ensemble_size
    blinded = len(setup.task_names) == 0 or bool(np.isnan(splits.test_targets_raw).all())
    outputs.atomic_write_text(setup.save_dir / f"fold_{fold}" / "test_result.csv", outputs.test_result_csv(
        splits.test.smiles, setup.task_names, ensemble, None if blinded else splits.test_targets_raw))
    if blinded or len(splits.test) == 0:
        return float("nan")
    value, per_task = score(ensemble, splits.test_targets_raw, setup.metric, setup.dataset_type, None)
    print(f"Seed {c.seed + fold} ==> test {setup.metric} = {value:.6f}", flush=True)
    if c.show_individual_scores:
        for name, task_score in zip(setup.task_names, per_task):
            print(f"Seed {c.seed + fold} ==> test {name} {setup.metric} = {task_score:.6f}", flush=True)
    return value


def member_concurrency(setup: RunSetup, runs: int) -> int:
    c = setup.config
    concurrency = concurrent_runs(c.max_concurrent_trials, c.num_workers, c.use_gpu, runs)
    if runs > 1:
        print(f"training {runs} models ({fold_count(c)} fold(s) x {c.ensemble_size} member(s)), "
              f"{concurrency} at a time", flush=True)
    return concurrency


def run_folds(setup: RunSetup) -> list[float]:
    """Train every member of every fold (concurrently where resources allow), write fold_k/ and splits.json;
    returns each fold's task-averaged test score."""
    c = setup.config
    folds = [fold_splits(setup, fold) for fold in range(fold_count(c))]
    record = {f"fold_{fold}": _split_record(setup, split) for fold, (split, _) in enumerate(folds)}
    outputs.atomic_write_text(setup.save_dir / "splits.json", json.dumps(record) + "\n")
    parts = [splits for _, splits in folds]
    member_preds: list[list[np.ndarray | None]] = [[None] * c.ensemble_size for _ in folds]
    scores = [float("nan")] * len(folds)
    jobs = [(fold, member) for fold in range(len(folds)) for member in range(c.ensemble_size)]
    kept = kept_members(setup, parts, jobs)
    to_train = [job for job in jobs if job not in kept]
    concurrency = member_concurrency(setup, len(to_train)) if to_train else 1
    finished = chain(((fold, member, *kept[fold, member]) for fold, member in kept),
                     train_members(setup, parts, concurrency, to_train))
    for fold, member, model, history in finished:
        if (fold, member) not in kept:
            save_member(setup, model, parts[fold], setup.save_dir / f"fold_{fold}" / f"model_{member}", history)
        member_preds[fold][member] = member_test_predictions(model, parts[fold], c.batch_size * c.num_workers,
                                                             c.use_gpu)
        if all(p is not None for p in member_preds[fold]):
            scores[fold] = finish_fold(setup, fold, parts[fold], member_preds[fold])  # type: ignore[arg-type]
    return scores


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


def run_finetune(config: FinetuneConfig, sources: dict[str, Source]) -> dict[str, Any]:
    """The whole run; returns the summary (also written to run.json)."""
    resources = connect(config.address)
    setup = resolve_setup(config, sources)
    print(f"dataset_type={setup.dataset_type}{' (inferred from the labels)' if config.dataset_type is None else ''} "
          f"metric={setup.metric} tasks={setup.task_names}", flush=True)
    n_invalid = sum(len(s.invalid) for s in (setup.data, setup.val, setup.test) if s is not None)
    if n_invalid:
        print(f"skipping {n_invalid} invalid SMILES (listed in invalid_smiles.csv)", flush=True)
    if config.dry_run:
        return dry_run_report(setup, resources)
    setup.save_dir.mkdir(parents=True, exist_ok=True)
    setup = replace(setup, run_id=claim_run_id(setup.save_dir, config)[0])
    outputs.atomic_write_text(setup.save_dir / "config.yaml", to_yaml(config))
    write_invalid(setup.save_dir / "invalid_smiles.csv", [s for s in (setup.data, setup.val, setup.test) if s is not None])
    scores = run_folds(setup)
    mean = nanmean(scores)
    std = float(np.nanstd(scores)) if not np.isnan(mean) else float("nan")
    summary = {"dataset_type": setup.dataset_type, "metric": setup.metric, "fold_scores": scores,
               f"overall_{config.split_type}_test_{setup.metric}": mean, "std": std, "run_id": setup.run_id}
    extra = {"summary": summary, "config_yaml": str(setup.save_dir / "config.yaml")}
    settings, setting_sources = _settings_with_checkpoint_values(setup)
    outputs.atomic_write_text(setup.save_dir / "run.json", outputs.run_record(
        settings, setting_sources, resources, extra))
    print(f"overall_{config.split_type}_test_{setup.metric}={mean:.6f}", flush=True)
    print(f"std={std:.6f}", flush=True)
    return summary


def _settings_with_checkpoint_values(setup: RunSetup) -> tuple[dict[str, Any], dict[str, str]]:
    """Every setting and its source; architecture values the checkpoint decided are marked "checkpoint"."""
    settings: dict[str, Any] = setup.config.model_dump(mode="json")
    sources: dict[str, str] = dict(setup.sources)
    if setup.checkpoint is not None:
        for key in ENCODER_KEYS:
            if not _user_set(setup.sources, key):
                settings[key], sources[key] = getattr(setup.checkpoint.spec.encoder, key), "checkpoint"
    return settings, sources


def _split_record(setup: RunSetup, split: Split) -> dict[str, list[int]]:
    """Data-row numbers (in the data file) of each part; separate val/test files are marked as such."""
    to_rows = lambda positions: setup.data.rows[np.asarray(positions, dtype=np.int64)].tolist()  # noqa: E731
    record = {"train": to_rows(split.train)}
    record["val"] = "separate_val_path" if setup.val else to_rows(split.val)  # type: ignore[assignment]
    record["test"] = "separate_test_path" if setup.test else to_rows(split.test)  # type: ignore[assignment]
    return record


def dry_run_report(setup: RunSetup, resources: dict[str, Any]) -> dict[str, Any]:
    """--dry_run: print the resolved settings (marking defaults), split sizes, model and cluster use; no training."""
    c = setup.config
    print("resolved configuration (* = default):")
    for name, value in c.model_dump(mode="json").items():
        print(f"  {'*' if setup.sources.get(name, 'default') == 'default' else ' '} {name}: {value}")
    folds = {}
    for fold in range(fold_count(c)):
        split, splits = fold_splits(setup, fold)
        folds[f"fold_{fold}"] = {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)}
        model = KermtFinetuneModel(model_config(setup, features_width(splits)))
        print(f"fold {fold}: train {len(splits.train)}, val {len(splits.val)}, test {len(splits.test)}; "
              f"model parameters {sum(p.numel() for p in model.parameters()):,}")
    if setup.checkpoint is not None:
        _, load_summary = initial_state(setup, model.config, c.seed)
        print(f"checkpoint {setup.checkpoint.path} ({setup.checkpoint.spec.kind}):\n  " +
              load_summary.replace("\n", "\n  "))
    wanted = {"CPU": c.num_workers, **({"GPU": c.num_workers} if c.use_gpu else {})}
    runs = c.ensemble_size * len(folds)
    at_once = concurrent_runs(c.max_concurrent_trials, c.num_workers, c.use_gpu, runs)
    print(f"would train {c.ensemble_size} model(s) x {len(folds)} fold(s), {at_once} at a time, each with "
          f"{c.num_workers} worker(s) ({wanted}) on a cluster with {resources}")
    return {"dry_run": True, "folds": folds, "dataset_type": setup.dataset_type, "metric": setup.metric,
            "resources_per_run": wanted, "concurrent_runs": at_once, "cluster_resources": resources}
