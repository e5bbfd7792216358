"""`kermt pretrain`: vocab / cMIM / hybrid pretraining of one model by a Ray TorchTrainer.

Driver flow: check the corpus and vocabularies (before Ray starts) -> connect -> claim the run id (the same command
re-run after the driver died resumes the run from its last checkpoint) -> train: each worker reads the corpus shards
its global batches need, a window of shards at a time (the driver reads only the manifest) -> ``save_dir/model/``
(native), ``save_dir/model.pt`` (upstream's layout), ``metrics.csv`` (+ TensorBoard), and
beside the model the vocabularies its heads use and a record of the corpus (``kermt.pretrain.export``), so that the
directory is all ``kermt reconstruct`` / ``finetune`` need.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
import torch
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig

from kermt.checkpoint import load_into_model, load_native, merge_encoder
from kermt.config import ENCODER_ARCHITECTURE_KEYS as ENCODER_KEYS, EncoderConfig
from kermt.data.shard_plan import ShardPlan
from kermt.errors import Interrupted
from kermt.nn.pretrain.config import PretrainHeadsConfig, PretrainLossConfig
from kermt.nn.pretrain.model import KermtPretrainModel
from kermt.pretrain.export import (export_pretrain_upstream, save_corpus_record, save_model_vocabs,
                                   save_pretrain_native)
from kermt.run_layout import RunLayout
from ray_app.common import outputs
from ray_app.common.cluster import connect
from ray_app.common.concurrency import check_workers_fit
from ray_app.common.trainer import KermtTrainer
from ray_app.common.interrupt import stopping_on_ctrl_c
from ray_app.common.remote_files import publish
from ray_app.common.run_ids import claim_run_id
from ray_app.common.settings import Source, to_yaml
from ray_app.common.storage import check_gpus, is_uri, resolve_max_failures, resolve_storage
from ray_app.common.worker_loop import STATE_FILE
from ray_app.pretrain.config import PretrainConfig
from ray_app.pretrain.inputs import PretrainInputs
from ray_app.pretrain.shard_reads import CorpusShards
from ray_app.pretrain.train_loop import MODEL_DIR, PretrainPlan, train_loop_per_worker
from ray_app.report import announce_report, start_line

DECODER_KEYS = ("latent_dim", "decoder_num_layers", "decoder_num_attention_heads", "decoder_ffn_hidden_size",
                "decoder_positional_encoding", "decoder_gate_self_attn", "decoder_gate_cross_attn")
# Heads of the checkpoint that a continued model does not have yet (vocab -> hybrid).
NEW_HEAD_PREFIXES = ("latent_dist.readout.", "latent_dist.fc_mean_logscale.", "decoder.")


# What a re-run may change and still continue the run (where to run, how to store and log it).
RESUMABLE_CHANGES = ("address", "storage_path", "max_failures", "tensorboard", "trust_checkpoint")


def run_identity(config: PretrainConfig) -> PretrainConfig:
    """The settings that decide what a run computes: a re-run of the same command continues the run even with
    another stopping point, log interval or number of workers (the global batch, not its split, is what counts)."""
    return config.model_copy(update={"stop_after_steps": None, "train_interval": 0, "num_workers": 1,
                                     "batch_size": config.step_batch_size, "global_batch_size": None})


def model_configs(config: PretrainConfig, sources: dict[str, Source],
                  inputs: PretrainInputs) -> tuple[EncoderConfig, PretrainHeadsConfig, PretrainLossConfig]:
    """Architecture from the flags, or from ``--continue_from`` (a flag the user set must agree with it)."""
    c, checkpoint = config, inputs.continue_from
    heads = {k: getattr(c, k) for k in DECODER_KEYS}
    if checkpoint is None:
        encoder = EncoderConfig(**{k: getattr(c, k) for k in ENCODER_KEYS}, dropout=c.dropout,
                                embedding_output_type="both")
    else:
        user = {k: getattr(c, k) for k in ENCODER_KEYS if sources.get(k, "default") != "default"}
        encoder = merge_encoder(checkpoint.spec.encoder, {**user, "dropout": c.dropout,
                                                          "embedding_output_type": "both"}, str(checkpoint.path))
        heads.update({k: v for k, v in checkpoint.spec.pretrain.items() if k in DECODER_KEYS})
    head_config = PretrainHeadsConfig(
        pretrain_mode=c.pretrain_mode, **inputs.vocab_sizes, **heads, decoder_dropout=c.decoder_dropout,
        decoder_max_seq_len=c.decoder_max_seq_len, contrastive_temperature=c.contrastive_temperature)
    loss = PretrainLossConfig(c.dist_coff, c.reconstruction_loss_weight, c.vocab_loss_weight, c.normalize_loss,
                              c.normalize_gradient)
    return encoder, head_config, loss


def _with_encoder_aliases(source: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> dict:
    """``source`` plus the encoder under the other name the model may use: a model whose latent head shares the
    encoder lists it as ``kermt.*`` AND ``latent_dist.kermt.*``; a vocab checkpoint has only the first."""
    completed = dict(source)
    for key in target:
        alias = key.removeprefix("latent_dist.") if key.startswith("latent_dist.kermt.") else f"latent_dist.{key}"
        if key not in completed and alias in source:
            completed[key] = source[alias]
    return completed


def pretrain_initial_state(encoder: EncoderConfig, heads: PretrainHeadsConfig, inputs: PretrainInputs,
                           seed: int) -> dict[str, torch.Tensor]:
    """Seeded fresh weights, or the checkpoint's (strict: every tensor used or a known new head)."""
    torch.manual_seed(seed)
    model = KermtPretrainModel(encoder, heads)
    if inputs.continue_from is not None:
        source = _with_encoder_aliases(inputs.continue_from.state_dict, model.state_dict())
        report = load_into_model(model, source, NEW_HEAD_PREFIXES, inputs.continue_from.ignored_entries())
        print(f"continuing from {inputs.continue_from.path}: {report.summary()}", flush=True)
    return model.state_dict()


def make_plan(config: PretrainConfig, sources: dict[str, Source], inputs: PretrainInputs) -> PretrainPlan:
    encoder, heads, loss = model_configs(config, sources, inputs)
    c = config
    shards = ShardPlan(tuple(s.rows for s in inputs.corpus.manifest.shards), c.seed, c.val_fraction, c.shuffle_window)
    return PretrainPlan(
        encoder=encoder, heads=heads, loss=loss, initial_state=pretrain_initial_state(encoder, heads, inputs, c.seed),
        shards=shards, seed=c.seed, epochs=c.epochs, global_batch_size=c.step_batch_size,
        init_lr=c.init_lr, max_lr=c.max_lr, final_lr=c.final_lr, warmup_epochs=c.warmup_epochs,
        weight_decay=c.weight_decay, save_interval=c.save_interval, val_interval=c.val_interval,
        train_interval=c.train_interval, max_val_batches=c.max_val_batches, stop_after_steps=c.stop_after_steps,
        per_rank_loss=c.per_rank_loss, dropout_draws=c.dropout_draws, precision=c.precision)


def train(config: PretrainConfig, plan: PretrainPlan, inputs: PretrainInputs, run_id: str,
          storage: str) -> ray.train.Result:
    low, high = config.worker_range
    trainer = KermtTrainer(  # ray_app.common.trainer: Ray's TorchTrainer, cheaper to start, elastic on live nodes
        train_loop_per_worker,
        train_loop_config={"plan": plan, "corpus": CorpusShards.of(inputs.corpus)},
        scaling_config=ScalingConfig(num_workers=(low, high) if low != high else low, use_gpu=config.use_gpu),
        run_config=RunConfig(
            name=f"{run_id}-pretrain",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=resolve_max_failures(config.max_failures)),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            logging_config=LoggingConfig(log_level="WARNING"),  # the loop prints one line per interval
        ),
    )
    with stopping_on_ctrl_c(f"the last step checkpoint is kept in {storage}; re-run the same command to resume "
                            "from it", tune=False):
        return trainer.fit()


def write_outputs(save_dir: Path, result: ray.train.Result, plan: PretrainPlan, run_id: str,
                  tensorboard: bool) -> dict:
    """model/ (native), model.pt (upstream layout), metrics.csv (+ TensorBoard) from the run's last checkpoint."""
    with result.checkpoint.as_directory() as directory:
        native = load_native(Path(directory) / MODEL_DIR)
        state = torch.load(Path(directory) / STATE_FILE, weights_only=True, map_location="cpu")
        model = KermtPretrainModel(plan.encoder, plan.heads)
        model.load_state_dict(native.state_dict)
    progress, layout = state["progress"], RunLayout(save_dir)
    save_pretrain_native(layout.model, model, plan.loss, provenance={"run_id": run_id})
    export_pretrain_upstream(layout.upstream_model, model, plan.loss, {
        "epoch": progress["epoch"], "batch_idx": progress["batch_idx"], "scheduler_step": progress["global_step"]})
    outputs.atomic_write_text(layout.metrics, outputs.metrics_csv(progress["history"]))
    if tensorboard:
        write_tensorboard(save_dir, progress["history"])
    return progress


def write_model_files(save_dir: Path, corpus_path: str, inputs: PretrainInputs) -> None:
    """The vocabularies the model's heads were trained with, and the corpus it saw, beside model.pt and model/."""
    save_model_vocabs(save_dir, inputs.vocabs)
    located = corpus_path if "://" in corpus_path else str(Path(corpus_path).resolve())  # valid from any cwd
    save_corpus_record(save_dir, located, len(inputs.corpus))


def write_tensorboard(directory: Path, history: list[dict[str, float]]) -> None:
    """Upstream's scalar names: train/<term>, val/<term>, train/lr, at the global step."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(directory)) as writer:
        for row in history:
            for name, value in row.items():
                split, _, term = name.partition("_")
                if split in ("train", "val"):
                    writer.add_scalar(f"{split}/{term}", value, int(row["step"]))
            writer.add_scalar("train/lr", row["lr"], int(row["step"]))


def run_pretrain(config: PretrainConfig, sources: dict[str, Source], inputs: PretrainInputs,
                 recorded: PretrainConfig | None = None) -> dict[str, Any]:
    """The whole run; returns the final progress (epoch, batch_idx, global_step, history). ``recorded``: the
    settings as the user gave them (URIs) when ``config`` names local copies: they identify the run (a re-run with
    a mirrored --save_dir resumes) and are what config.yaml and run.json replay."""
    recorded = recorded or config
    plan = make_plan(config, sources, inputs)  # a checkpoint that contradicts a flag fails here, before Ray starts
    resources = connect(config.address)
    print(start_line(str(recorded.save_dir), of_file=False), flush=True)
    save_dir = Path(config.save_dir).resolve()
    layout = RunLayout(save_dir)
    storage = resolve_storage(config.storage_path, layout.storage)
    check_gpus(config.use_gpu)
    check_workers_fit(config.min_workers, config.use_gpu)
    save_dir.mkdir(parents=True, exist_ok=True)
    run_id, _ = claim_run_id(save_dir, settings=run_identity(recorded).model_dump(mode="json"),
                             resumable=RESUMABLE_CHANGES)
    if is_uri(recorded.save_dir):  # a killed driver uploads nothing; a re-run must still find this run's id
        publish(layout.run_state, recorded.save_dir, "--save_dir")
    outputs.atomic_write_text(layout.config, to_yaml(recorded))
    print(f"pretraining {config.pretrain_mode}: {plan.shards.n_train} train / {plan.shards.n_val} validation "
          f"molecules in {len(plan.shards.shard_rows)} shard(s), global batch {plan.global_batch_size}, "
          f"{config.num_workers} worker(s); "
          f"{sum(p.numel() for p in KermtPretrainModel(plan.encoder, plan.heads).parameters()):,} parameters",
          flush=True)
    try:
        result = train(config, plan, inputs, run_id, storage)
        progress = write_outputs(save_dir, result, plan, run_id, config.tensorboard)
    except Interrupted:  # stopped: the report shows the steps its last step checkpoint logged
        announce_report(save_dir, recorded.save_dir)
        raise
    write_model_files(save_dir, recorded.data_path, inputs)
    finished = progress["epoch"] >= config.epochs
    print(f"{'finished' if finished else 'stopped'} at step {progress['global_step']} (epoch {progress['epoch']}); "
          f"model: {layout.model}, {layout.upstream_model}"
          + ("" if finished else "; run the same command again to continue"), flush=True)
    outputs.atomic_write_text(layout.run_record, outputs.run_record(
        recorded.model_dump(mode="json"), dict(sources), resources,
        {"run_id": run_id, "finished": finished, "replay": f"kermt pretrain --config {layout.config}"}))
    announce_report(save_dir, recorded.save_dir)
    return progress


__all__ = ["make_plan", "model_configs", "run_pretrain"]
