"""The member loop: one ensemble member trained over its epochs (epoch plan, steps, validation, best epoch, early
stopping) by every rank of a group, whatever runs the ranks. :func:`fit` runs it in this process (a notebook; with
:class:`~kermt.train.communicator.TorchDistributed`, plain ``torch.distributed`` processes); Ray Train's workers run
:func:`fit_member` through ``ray_app/finetune/train_loop.py``, which adds Ray's checkpoints and reports as the
``epoch_done`` hook.

What makes N ranks equal to one process (docs/architecture.md, "Distributed math equals single-process math"):
- the epoch's batch plan depends only on (the training shards' row counts, global batch, seed, epoch:
  kermt.data.shard_plan; a set in memory is one shard); each rank takes a slice of global batch k
  (the global batch is fixed by the plan, so an elastic run that resizes between restarts keeps it);
- the loss is normalised by the GLOBAL label count, the LR schedule counts global steps;
- dynamic depth is drawn from (seed, global step), identically on every rank; bond dropout and (by default,
  ``dropout_draws="per_molecule"``) every dropout mask from (seed, global step, molecule), so a molecule sees the
  same masks whichever rank trains it;
- validation predicts fixed chunks of the global batch size, spread over ranks and gathered, so every rank scores
  the same predictions and takes the same best-model and early-stopping decisions; within a chunk each molecule is
  computed as `kermt predict` will compute it from the saved model (:func:`validation_rule`), so the best epoch is
  chosen on the numbers the model will give.
Resuming: :func:`member_checkpoint` holds the model, optimizer, scheduler, progress and best-so-far; a group
restored from it (of any size) draws what the lost one would have drawn, so it changes no result. With
``dropout_draws="torch"`` (upstream's masks) torch's RNG is seeded per (seed, epoch, rank): a restart of the same
size still changes nothing, but the masks follow the ranks, so another world size differs by that draw.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from kermt.config import FinetuneModelConfig
from kermt.data.dataset import MoleculeBatch, MoleculeSet, keyed_bond_keep
from kermt.data.molecule_shards import TrainingSource, ValidationSource, training_source
from kermt.data.prefetch import prefetch
from kermt.data.sampling import global_batches, worker_share
from kermt.data.shard_stream import BatchView, epoch_views
from kermt.data.scalers import StandardScaler
from kermt.inference.split import predict_split
from kermt.inference.widths import WidthRule, most_frequent_width, padding_rule, training_width_histogram
from kermt.nn.finetune import KermtFinetuneModel
from kermt.random_streams import Stream, depth_rng, stream_seed
from kermt.train.communicator import Communicator, SingleProcess
from kermt.train.objective import Objective
from kermt.train.optim import NoamLR, optimizer_and_scheduler
from kermt.train.state import LoopProgress, TrainingState, checkpoint_state, restore
from kermt.train.step import FinetuneStepSettings, score, snapshot, train_step, validation_loss


class StartingState(Protocol):
    """Starting weights each rank builds itself (``ray_app.finetune.run_setup.StartingWeights``: from the run's
    shared checkpoint): the state dict and a summary of what was loaded."""

    def build(self, config: FinetuneModelConfig) -> tuple[dict[str, torch.Tensor], str]: ...


@dataclass(frozen=True, kw_only=True)  # by name: eight floats in a row must not be swappable by position
class MemberPlan:
    """Everything a rank needs to train one member (Ray ships it once through the object store).

    ``train``/``val`` are None when the fold's data travels separately (Ray: ``train_loop_config``, the fold's
    shards or its one object). ``train`` may be a :class:`~kermt.data.molecule_shards.TrainingSource` whose
    shards each rank reads as its batches need them; a set in memory trains as its one shard."""

    model_config: FinetuneModelConfig
    initial_state: dict[str, torch.Tensor] | StartingState
    train: MoleculeSet | TrainingSource | None
    val: MoleculeSet | ValidationSource | None
    target_scaler: StandardScaler | None
    seed: int
    epochs: int
    global_batch_size: int  # molecules per optimizer step, split over whoever runs
    init_lr: float
    max_lr: float
    final_lr: float
    warmup_epochs: float
    weight_decay: float
    fine_tune_coff: float
    dist_coff: float
    bond_drop_rate: float
    metric: str
    select_by_loss: bool
    early_stop_epoch: int
    label: str  # names the member in log lines
    precision: str  # "bf16": forward under autocast (kermt.nn.precision)
    dropout_draws: str  # "torch": upstream's masks from torch's RNG (kermt.nn.keyed_dropout)

    @property
    def objective(self) -> Objective:
        """What the best epoch is chosen by (and early stopping counts epochs without improvement of)."""
        return Objective.of(self.metric, self.select_by_loss)


@dataclass
class MemberProgress(LoopProgress):
    """Also the best epoch so far (by the plan's objective) and the epochs since it (early stopping)."""

    best_value: float = float("nan")
    best_epoch: int = -1
    bad_epochs: int = 0


@dataclass
class BestWeights:
    """The best epoch's weights so far. A checkpoint holds None for them when that epoch is its own (its model)."""

    weights: dict[str, torch.Tensor] | None = None

    def restore(self, model: torch.nn.Module, state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        self.weights = state["best_state"] if state["best_state"] is not None else snapshot(model)

    def saved(self, training: TrainingState[MemberProgress]) -> dict[str, Any]:
        progress = training.progress
        is_best_now = progress.best_epoch == progress.epoch - 1
        return {"model": training.core.state_dict(), "best_state": None if is_best_now else self.weights}


def member_checkpoint(training: TrainingState[MemberProgress], best: BestWeights) -> dict[str, Any]:
    """Everything a member resumes from (what :func:`fit` takes as ``checkpoint``)."""
    return checkpoint_state(training, best.saved(training))


def build_member(plan: MemberPlan, device: torch.device, rank: int, fresh: bool) \
        -> tuple[KermtFinetuneModel, torch.optim.Optimizer, NoamLR]:
    """The member's model on ``device`` (with the plan's starting weights when ``fresh``; a resumed one takes its
    weights from its checkpoint), its optimizer and scheduler."""
    model = KermtFinetuneModel(plan.model_config)
    if fresh:
        model.load_state_dict(_starting_state(plan, rank))
    model.to(device)
    optimizer, scheduler = optimizer_and_scheduler(model, plan, len(plan.train) // plan.global_batch_size,
                                                   plan.fine_tune_coff)
    return model, optimizer, scheduler


def _starting_state(plan: MemberPlan, rank: int) -> dict[str, torch.Tensor]:
    """The given state dict, or the one a :class:`StartingState` builds here (every rank builds the same one; rank
    0 says what was loaded)."""
    if isinstance(plan.initial_state, dict):
        return plan.initial_state
    state, summary = plan.initial_state.build(plan.model_config)
    if rank == 0:
        print("\n".join(f"{plan.label}: {line}" for line in summary.splitlines()), flush=True)  # each line its own
    return state


def _rank_batches(plan: MemberPlan, model: KermtFinetuneModel, steps: Iterator[BatchView], rank: int, world: int,
                  first_step: int) -> Iterator[MoleculeBatch]:
    """This rank's batch of every global batch of the epoch (``steps``: where each one's molecules are), on
    the CPU: its neighbour-sum operators built here (numpy, no host-device sync in the step), the global batch's
    label counts counted here (no collective), its bond dropout drawn per molecule from (seed, global step,
    molecule id, bond), and its neighbour tables as wide as the global batch's (with upstream's padding the width
    enters every sum: N ranks then equal one process)."""
    operators = model.kermt.aggregation_spec(training=True)
    for index, view in enumerate(steps):
        molecules, everyone, ids = view.molecules, view.positions, view.ids
        share = worker_share(np.arange(len(ids)), rank, world)  # empty on some ranks when the last batch is short
        rows = everyone[share]
        keep = global_keep = None
        if plan.bond_drop_rate > 0:  # keyed per (molecule, bond): the share's flags are its part of the global ones
            keep, global_keep = (keyed_bond_keep(ids[part], molecules.graphs.bond_counts[everyone[part]],
                                                 plan.bond_drop_rate, plan.seed, first_step + index)
                                 for part in (share, slice(None)))
        width = molecules.neighbour_width(everyone, global_keep)
        yield molecules.batch(rows, keep, operators=operators, global_rows=everyone, neighbour_width=width,
                              ids=ids[share])


def train_epoch(plan: MemberPlan, training: TrainingState[MemberProgress]) -> dict[str, float]:
    """Train one epoch; returns ``train_loss`` (the label loss over every label of the epoch, without MTL weights)
    and, with MTL, ``train_objective`` (the mean over steps of the loss the optimiser minimised)."""
    model, progress, rank, world = training.model, training.progress, training.rank, training.world
    settings = FinetuneStepSettings(plan.model_config.head.dataset_type, plan.dist_coff, plan.model_config.use_mtl_loss,
                                    precision=plan.precision, dropout_draws=plan.dropout_draws, seed=plan.seed)
    # used by dropout_draws="torch" only: a restarted group of the same size draws what the lost one drew
    torch.manual_seed(stream_seed(plan.seed, Stream.FINETUNE_TORCH, progress.epoch, rank))
    model.train()
    source = training_source(plan.train)
    epoch_plan = source.plan(plan.seed)  # kermt.data.shard_plan: the same global batches for every world size
    # [local label-loss sum, local objective share, global label count]: summed on the device, read once per epoch
    sums = torch.zeros(3, dtype=torch.float64, device=training.device)
    steps = epoch_views(epoch_plan, progress.epoch, plan.global_batch_size, 0, source.load)
    batches = _rank_batches(plan, training.core, steps, rank, world, progress.global_step)
    all_reduce = training.communicator.all_reduce
    for batch in prefetch(batches, training.device):  # the next batches are collated while this step computes
        step = train_step(model, training.optimizer, training.scheduler, batch, settings,
                          depth_rng(plan.seed, progress.global_step), world, all_reduce, progress.global_step)
        sums += torch.stack([step.label_loss_sum, step.objective_share, step.label_count]).to(sums)
        progress.global_step += 1
    label_count = float(sums[2])  # already global: every rank holds the same value
    total = all_reduce(sums[:2].clone())
    metrics = {"train_loss": float(total[0]) / max(label_count, 1.0)}
    if settings.use_mtl_loss:
        metrics["train_objective"] = float(total[1]) / max(epoch_plan.batch_count(plan.global_batch_size), 1)
    return metrics


def validation_rule(plan: MemberPlan) -> WidthRule:
    """The width rule `kermt predict` applies to the model this member saves: with upstream padding, the most
    frequent neighbour width of its planned training batches (``save_member`` records the same histogram)."""
    padding = plan.model_config.encoder.padding
    if padding != "upstream":
        return padding_rule(padding)
    widths = training_width_histogram(plan.train, plan.seed, plan.epochs, plan.global_batch_size)
    return padding_rule(padding, most_frequent_width(widths))


@dataclass(frozen=True)
class RankValidation:
    """What one rank validates on, read once for the member: the validation split cut into fixed chunks of the
    global batch size, chunk i predicted by rank ``i % world``; ``held``: this rank's chunks' molecules one after
    the other (None when it has none), ``chunks[i]``: chunk i's rows in ``held`` (its own chunks only);
    ``targets``: every molecule's, since every rank scores the gathered predictions."""

    count: int
    held: MoleculeSet | None
    chunks: dict[int, np.ndarray]
    targets: np.ndarray


def rank_validation(val: MoleculeSet | ValidationSource, chunk: int, rank: int, world: int) -> RankValidation:
    """The chunks of ``val`` that ``rank`` of ``world`` predicts, read from ``val`` (a set in memory, or shards of
    which only those holding these chunks are read)."""
    chunks = global_batches(np.arange(len(val)), chunk)
    mine = [i for i in range(len(chunks)) if i % world == rank]
    ends = np.cumsum([len(chunks[i]) for i in mine], dtype=np.int64)
    held = val.take(np.concatenate([chunks[i] for i in mine])) if mine else None
    return RankValidation(len(chunks), held, {i: np.arange(end - len(chunks[i]), end) for i, end in zip(mine, ends)},
                          np.asarray(val.targets))


def validate(plan: MemberPlan, training: TrainingState[MemberProgress], rule: WidthRule,
             val: RankValidation) -> dict[str, float]:
    """Val loss and metric over every val molecule exactly once, identical on every rank, each molecule computed
    under ``rule`` (:func:`validation_rule`)."""
    chunk = plan.global_batch_size
    local = {i: predict_split(training.model, val.held, chunk, rule, plan.precision, rows=rows)[0]
             for i, rows in val.chunks.items()}
    merged: dict[int, np.ndarray] = {}
    for part in training.communicator.all_gather(local):
        merged.update(part)
    width = val.targets.shape[1]
    preds = np.concatenate([merged[i] for i in range(val.count)]) if val.count else np.zeros((0, width))
    targets = val.targets.astype(np.float64)
    value, _ = score(preds, targets, plan.metric, plan.model_config.head.dataset_type, plan.target_scaler)
    loss = validation_loss(preds, targets, chunk, plan.model_config.head.dataset_type)
    return {"val_loss": loss, f"val_{plan.metric}": value}


def run_epoch(plan: MemberPlan, training: TrainingState[MemberProgress], rule: WidthRule,
              val: RankValidation) -> dict[str, Any]:
    """Train one epoch and validate under ``rule``: the epoch's row of the history (without its best epoch yet)."""
    started = time.perf_counter()
    train_metrics = train_epoch(plan, training)
    trained = time.perf_counter()
    return {"epoch": training.progress.epoch, **train_metrics, **validate(plan, training, rule, val),
            "lr": training.scheduler.get_last_lr()[-1], "train_time_s": trained - started,
            "val_time_s": time.perf_counter() - trained}


# called on every rank after each epoch with the epoch's row and what builds the member's checkpoint now
EpochDone = Callable[[dict[str, Any], Callable[[], dict[str, Any]]], None]


def fit_member(plan: MemberPlan, training: TrainingState[MemberProgress], best: BestWeights,
               epoch_done: EpochDone) -> None:
    """Train from where ``training.progress`` stands until the plan's last epoch or early stopping, keeping the
    best epoch's weights in ``best`` (by the plan's objective; a fresh start's best so far is its starting model).
    Every row of the history gets the best epoch so far; ``epoch_done`` then sees it (report, checkpoint, log)."""
    if best.weights is None:
        best.weights = snapshot(training.model)
    progress, objective, rule = training.progress, plan.objective, validation_rule(plan)
    val = rank_validation(plan.val, plan.global_batch_size, training.rank, training.world)
    while progress.epoch < plan.epochs and progress.bad_epochs < plan.early_stop_epoch:
        metrics = run_epoch(plan, training, rule, val)
        if objective.better(metrics[objective.key], progress.best_value):
            progress.best_value, progress.best_epoch, progress.bad_epochs = metrics[objective.key], progress.epoch, 0
            best.weights = snapshot(training.model)
        else:
            progress.bad_epochs += 1
        metrics["best_epoch"] = progress.best_epoch
        progress.history.append(metrics)
        progress.epoch += 1
        epoch_done(metrics, lambda: member_checkpoint(training, best))


@dataclass
class MemberFit:
    """A member trained by :func:`fit`: its training state (the last epoch's model) and its best epoch's weights."""

    training: TrainingState[MemberProgress]
    best: BestWeights

    @property
    def history(self) -> list[dict[str, float]]:
        return self.training.progress.history

    def best_model(self) -> KermtFinetuneModel:
        """A copy of the member's model with the best epoch's weights."""
        model = KermtFinetuneModel(self.training.core.config)
        model.load_state_dict(self.best.weights)
        return model

    def checkpoint(self) -> dict[str, Any]:
        """What :func:`fit` resumes from (``torch.save`` it)."""
        return member_checkpoint(self.training, self.best)


def fit(plan: MemberPlan, communicator: Communicator = SingleProcess(), device: torch.device | None = None,
        checkpoint: dict[str, Any] | None = None, epoch_done: EpochDone | None = None) -> MemberFit:
    """Train one member in this process, as rank ``communicator.rank`` of its group (every rank calls it with the
    same plan), from the plan's starting weights or from ``checkpoint`` (a :meth:`MemberFit.checkpoint`)."""
    device = device or torch.device("cpu")
    model, optimizer, scheduler = build_member(plan, device, communicator.rank, fresh=checkpoint is None)
    best, progress = BestWeights(), MemberProgress()
    if checkpoint is not None:
        best.restore(model, checkpoint)
        progress = restore(optimizer, scheduler, checkpoint, MemberProgress)
    training = TrainingState(communicator.wrap(model), optimizer, scheduler, progress, communicator, device)
    fit_member(plan, training, best, epoch_done or (lambda metrics, checkpoint: None))
    return MemberFit(training, best)


__all__ = ["BestWeights", "EpochDone", "MemberFit", "MemberPlan", "MemberProgress", "RankValidation", "StartingState",
           "build_member", "fit", "fit_member", "member_checkpoint", "rank_validation", "run_epoch", "train_epoch",
           "validate", "validation_rule"]
