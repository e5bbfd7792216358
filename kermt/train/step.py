"""Finetuning steps shared by every runner (Ray Train workers, notebooks): one optimizer step, prediction, scoring.

Distribution is injected, not assumed: ``train_step`` takes ``world_size`` and an ``all_reduce`` for the label
count (identity in a single process), so N workers with batch b compute exactly the gradients of one process with
batch N*b (loss normalised by the GLOBAL label count; see :mod:`kermt.train.losses`). A batch built with its global
batch's rows (``MoleculeSet.batch(..., global_rows=...)``) brings that count, counted on the host, and the step
runs no collective of its own.

Dropout masks are drawn from torch's RNG (``FinetuneStepSettings.dropout_draws="torch"``, upstream's masks) or per
molecule from (seed, global step, molecule) (``"per_molecule"``, :mod:`kermt.nn.keyed_dropout`): only the latter makes a
molecule's masks independent of the batch it shares and of the rank it lands on, so that N workers equal one
process with dropout on.

Nothing in a step waits for the device: results stay on it as 0-d tensors (the caller reads them once per epoch),
and the step's ops need no value or shape from it (``tests/kermt/train/test_step.py`` audits the dispatched ops).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kermt.data.dataset import MoleculeBatch, MoleculeSet
from kermt.data.prefetch import prefetch, read_behind
from kermt.data.scalers import StandardScaler
from kermt.train.losses import LabelledTargets, eval_task_loss, mve_two_view_terms, reduce_terms, two_view_terms
from kermt.metrics import nanmean, task_scores
from kermt.nn.encoder import DepthDrawLog
from kermt.nn.keyed_dropout import DROPOUT_DRAWS, dropout_draws
from kermt.nn.precision import autocast
from kermt.nn.reached import touch_unreached

AllReduce = Callable[[torch.Tensor], torch.Tensor]


def no_reduce(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@dataclass(frozen=True)
class FinetuneStepSettings:
    """``precision``: "fp32", or "bf16" for the forward under autocast (see :mod:`kermt.nn.precision`).
    ``dropout_draws``: "torch" (torch's RNG, upstream's masks) or "per_molecule" (keyed by ``seed``, the step's
    global step and each molecule's id: the batch must carry ``graph.molecule_ids``)."""

    dataset_type: str
    dist_coff: float
    use_mtl_loss: bool = False
    precision: str = "fp32"
    dropout_draws: str = "torch"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dropout_draws not in DROPOUT_DRAWS:
            raise ValueError(f"dropout_draws must be one of {DROPOUT_DRAWS}, got {self.dropout_draws!r}")


@dataclass(frozen=True)
class StepResult:
    """What one step contributes to the epoch's logs (detached 0-d tensors: no host sync inside the step).

    label_loss_sum   this rank's Σ of the two-view label loss ℓ over its labels, without MTL weights; summed over
                     ranks and steps and divided by the summed ``label_count`` it is the epoch's label loss (the
                     number upstream logs as the train loss without MTL, and comparable with or without it)
    label_count      the GLOBAL number of labels of the step (already summed over ranks)
    objective_share  this rank's loss ÷ world size; summed over ranks it is exactly the step's objective (with MTL
                     ``Σ_t ½e^{−2s_t}L_t + s_t``, whose ``s_t`` each rank carries once)
    """

    label_loss_sum: torch.Tensor
    label_count: torch.Tensor
    objective_share: torch.Tensor


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: MoleculeBatch,
    settings: FinetuneStepSettings,
    depth_rng: np.random.Generator | None = None,
    world_size: int = 1,
    all_reduce: AllReduce = no_reduce,
    global_step: int = 0,
) -> StepResult:
    """One optimizer step on this worker's part of a global batch (see :class:`StepResult` for what it returns).

    ``model`` may be DDP-wrapped; its forward must accept (graph, features, depth_rng). Every rank must call
    this for every global batch, even with an empty share, so collectives stay matched. ``global_step`` keys the
    per-molecule dropout draws (``settings.dropout_draws``).
    """
    targets = LabelledTargets.from_nan(batch.targets)
    if batch.global_label_counts is not None:  # counted on the host: the sum over ranks, without a collective
        counts = batch.global_label_counts
        global_counts = counts if settings.use_mtl_loss else counts.sum().reshape(1)
    else:
        counts = targets.task_counts() if settings.use_mtl_loss else targets.mask.sum().reshape(1)
        global_counts = all_reduce(counts.clone())
    with DepthDrawLog() as draws, autocast(settings.precision, batch.targets.device), \
            dropout_draws(settings.dropout_draws, settings.seed, global_step, batch.graph):
        output = model(batch.graph, batch.features, depth_rng)
    core = getattr(model, "module", model)
    atom_view, bond_view = output.atom_view.float(), output.bond_view.float()  # the loss in float32 always
    if getattr(output, "atom_variance", None) is None:  # (stand-in models in tests return the two views only)
        terms = two_view_terms(atom_view, bond_view, targets, settings.dataset_type, settings.dist_coff)
    else:  # a variance head (--loss mve): the Gaussian NLL of each view, the same reduction
        terms = mve_two_view_terms(atom_view, bond_view, output.atom_variance.float(), output.bond_variance.float(),
                                   targets, settings.dist_coff)
    loss = reduce_terms(
        terms,
        global_counts if settings.use_mtl_loss else global_counts[0],
        world_size=world_size,
        log_sigma=core.mtl_log_sigma if settings.use_mtl_loss else None,
    )
    loss = touch_unreached(loss, core)  # every parameter gets a gradient (DDP), unreached ones a zero
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    draws.skip_idle()  # as upstream's Adam: no update of an encoder that ran no iteration
    optimizer.step()
    scheduler.step()
    return StepResult(terms.detach().sum(), global_counts.sum(), loss.detach() / world_size)


def predict(
    model: nn.Module, data: MoleculeSet, rows: Sequence[int] | np.ndarray, batch_size: int, precision: str = "fp32"
) -> np.ndarray:
    """Eval-mode predictions [len(rows), T] float64 (scaled space for regression, probabilities for classification).

    Batches are consecutive chunks of ``rows``: upstream numerics depend on batch composition (padding row), so
    callers that want reproducible numbers must use the same rows and batch size.
    """
    return _predict_outputs(model, data, rows, batch_size, precision, lambda output: output.prediction.double(), 1)


def predict_with_variance(
    model: nn.Module, data: MoleculeSet, rows: Sequence[int] | np.ndarray, batch_size: int, precision: str = "fp32"
) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`predict` and, for a variance head (``--loss mve``), its predictive variance [len(rows), T] float64 in
    scaled units (None for a plain model), from the same forwards."""
    core = getattr(model, "module", model)
    if not core.config.head.variance:
        return predict(model, data, rows, batch_size, precision), None

    def both(output) -> torch.Tensor:
        return torch.cat([output.prediction.double(), output.variance.double()], dim=1)

    joined = _predict_outputs(model, data, rows, batch_size, precision, both, 2)
    tasks = joined.shape[1] // 2
    return joined[:, :tasks], joined[:, tasks:]


@torch.no_grad()
def _predict_outputs(model: nn.Module, data: MoleculeSet, rows: Sequence[int] | np.ndarray, batch_size: int,
                     precision: str, take: Callable[..., torch.Tensor], per_task: int) -> np.ndarray:
    """``take(output)`` [M, per_task·T] of every eval-mode forward over consecutive chunks of ``rows``, joined."""
    core = getattr(model, "module", model)
    was_training = core.training
    core.eval()
    rows = np.asarray(rows, dtype=np.int64)
    device = next(core.parameters()).device  # batches follow the model, wherever the caller put it
    spec = core.kermt.aggregation_spec(training=False) if hasattr(core, "kermt") else None
    starts = range(0, len(rows), batch_size)
    batches = (data.batch(rows[start : start + batch_size], operators=spec) for start in starts)

    def launched():
        for batch in prefetch(batches, device):  # collated ahead, in prefetch's thread
            with autocast(precision, device):
                yield take(core(batch.graph, batch.features))

    out = list(read_behind(launched(), lambda values: values.cpu().numpy()))
    core.train(was_training)
    return np.concatenate(out) if out else np.zeros((0, data.targets.shape[1] * per_task))


def validation_loss(preds: np.ndarray, targets: np.ndarray, batch_size: int, dataset_type: str) -> float:
    """Upstream's validation loss: per batch a masked per-task mean, averaged over batches, then nan-mean of tasks.

    preds, targets: [N, T] in the model's (scaled) space, NaN = missing label; batches = consecutive chunks.
    """
    per_batch = []
    for start in range(0, len(preds), batch_size):
        labelled = LabelledTargets.from_nan(torch.from_numpy(targets[start : start + batch_size]).double())
        pred = torch.from_numpy(preds[start : start + batch_size]).double()
        per_batch.append(eval_task_loss(pred, labelled, dataset_type).numpy())
    if not per_batch:
        return float("nan")
    return float(np.nanmean(np.mean(per_batch, axis=0)))


def score(
    preds: np.ndarray,
    targets: np.ndarray,
    metric: str,
    dataset_type: str,
    scaler: StandardScaler | None,
) -> tuple[float, list[float]]:
    """(task nan-mean, per-task scores) on de-standardised predictions and targets."""
    if scaler is not None:
        preds, targets = scaler.inverse_transform(preds), scaler.inverse_transform(targets)
    scores = task_scores(preds, targets, metric, dataset_type)
    return nanmean(scores), scores


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of the (unwrapped) model's state, e.g. the best epoch's weights."""
    core = getattr(model, "module", model)
    return {name: value.detach().clone() for name, value in core.state_dict().items()}
