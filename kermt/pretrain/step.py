"""One pretraining optimizer step (and its no-grad evaluation twin), exact under data parallelism.

Distribution is injected (:class:`Distribution`), as in :mod:`kermt.train.step`: a single process uses the identity,
a data-parallel runner passes an autograd-aware all-gather (the cMIM negatives); the global batch's counts come with
the batch, counted on the host, so the step itself runs no other collective. Each rank's loss is
``world_size ×`` its share of the global batch's loss (:mod:`kermt.pretrain.loss`), so DDP's gradient average equals
the single-process gradient of the global batch. Dynamic depth is drawn from (seed, global step), identical on every
rank. Dropout masks come from torch's RNG (``PretrainStepSettings.dropout_draws="torch"``, the library default: exact
equality across world sizes then needs dropout 0) or per molecule from (seed, global step, molecule)
(``"per_molecule"``, :mod:`kermt.nn.keyed_dropout`): every encoder dropout and, with the RoPE decoder, every decoder
dropout; the sinusoidal decoder's PyTorch layers still draw from torch's RNG (use decoder_dropout 0 there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from kermt.random_streams import depth_rng
from kermt.nn.encoder import DepthDrawLog
from kermt.nn.keyed_dropout import DROPOUT_DRAWS, dropout_draws
from kermt.nn.precision import PRECISIONS, autocast
from kermt.nn.pretrain.config import PretrainLossConfig
from kermt.nn.pretrain.model import PretrainOutput
from kermt.nn.reached import touch_unreached
from kermt.pretrain.batch import StepBatch
from kermt.pretrain.loss import GlobalView, pretrain_shares

AllGather = Callable[[torch.Tensor], list[torch.Tensor]]


def no_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    return [tensor]


@dataclass(frozen=True)
class Distribution:
    """How this process takes part in a data-parallel step. ``all_gather``: equal-shape tensors of every rank, in
    rank order, WITH gradient (:func:`all_gather_with_grad`). The global batch's counts need no collective: they
    come with the batch (:class:`~kermt.pretrain.batch.StepBatch`)."""

    world_size: int = 1
    rank: int = 0
    all_gather: AllGather = field(default=no_gather)


class _AllGather(torch.autograd.Function):
    """All-gather whose backward hands each rank the SUM over ranks of the gradient of its slice (every rank's loss
    reads every slice). The backward is an all-reduce, which every backend offers."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: object) -> tuple[torch.Tensor, ...]:
        ctx.group = group
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        return tuple(parts)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor, None]:
        summed = torch.stack(grads).contiguous()
        dist.all_reduce(summed, group=ctx.group)
        return summed[dist.get_rank(ctx.group)], None


def all_gather_with_grad(group: object = None) -> AllGather:
    """An :data:`AllGather` over torch.distributed ``group`` (None: the default group). A runner may give the
    gather its own group so that its backward never interleaves with DDP's gradient all-reduces."""
    return lambda tensor: list(_AllGather.apply(tensor, group))


def gather_rows(z: torch.Tensor, share_sizes: tuple[int, ...], all_gather: AllGather) -> torch.Tensor:
    """Every rank's rows of ``z`` [m, ...], concatenated in rank order (the global batch order). Shares may differ
    in size by one (or be empty), so each is padded to the largest before the equal-shape gather."""
    if len(share_sizes) == 1:
        return z
    width = max(share_sizes)
    padded = torch.cat([z, z.new_zeros((width - z.shape[0], *z.shape[1:]))]) if z.shape[0] < width else z
    parts = all_gather(padded)
    return torch.cat([part[:size] for part, size in zip(parts, share_sizes)])


@dataclass(frozen=True)
class PretrainStepSettings:
    """``per_rank_means``: upstream's DDP semantics instead of the global batch's: every term a mean over the
    rank's own molecules, cMIM negatives from the rank's own batch, gradients averaged over ranks (the result then
    depends on the number of workers). ``dropout_draws``: "torch" or "per_molecule" (see the module docstring).
    ``precision``: "fp32", or "bf16" for the forward under autocast (:mod:`kermt.nn.precision`; losses, weights
    and optimizer state stay float32)."""

    seed: int
    loss: PretrainLossConfig = PretrainLossConfig()
    per_rank_means: bool = False
    dropout_draws: str = "torch"
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.dropout_draws not in DROPOUT_DRAWS:
            raise ValueError(f"dropout_draws must be one of {DROPOUT_DRAWS}, got {self.dropout_draws!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")


class PretrainStep:
    """Trains ``model`` (KermtPretrainModel, possibly DDP-wrapped) one global batch at a time.

    Each call returns this rank's detached per-term shares (0-d tensors on the model's device; summed over ranks
    they are the global batch's terms): no host synchronisation inside the step.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, settings: PretrainStepSettings,
                 distribution: Distribution = Distribution()) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.settings, self.distribution = settings, distribution
        self.core = getattr(model, "module", model)

    def _forward(self, step: StepBatch, global_step: int) -> PretrainOutput:
        seed, precision = self.settings.seed, self.settings.precision
        with dropout_draws(self.settings.dropout_draws, seed, global_step, step.batch.graph), \
                autocast(precision, step.batch.graph.f_atoms.device):
            output = self.model(step.batch, depth_rng=depth_rng(seed, global_step))
        return output if precision == "fp32" else output.in_float32()  # the losses in float32 always

    def _shares(self, step: StepBatch, global_step: int) -> dict[str, torch.Tensor]:
        dist = self.distribution
        heads = self.core.heads_config
        if self.settings.per_rank_means:  # the rank's own means ÷ world: DDP's average of world × share is their mean
            output = self._forward(step, global_step)
            # an empty share scores nothing, not its padding row alone (as kermt.nn.pretrain.vocab_heads.vocab_loss)
            view = GlobalView(step.counts.to(torch.float32), step.share_sizes[dist.rank] > 0, output.z, 0)
            shares = pretrain_shares(output, step.batch.vocab_targets, view, heads, self.settings.loss)
            return {name: value / dist.world_size for name, value in shares.items()}
        counts = step.global_counts  # counted on the host when the batch was built: no collective
        output = self._forward(step, global_step)
        all_z = gather_rows(output.z, step.share_sizes, dist.all_gather) if heads.uses_decoder else None
        view = GlobalView(counts.to(torch.float32), dist.rank == 0, all_z, step.offset)
        return pretrain_shares(output, step.batch.vocab_targets, view, heads, self.settings.loss)

    def train(self, step: StepBatch, global_step: int) -> dict[str, torch.Tensor]:
        """One optimizer and scheduler step on this rank's share of global batch number ``global_step``. Every rank
        must call it for every global batch (an empty share included) so collectives stay matched."""
        self.model.train()
        with DepthDrawLog() as draws:
            shares = self._shares(step, global_step)
        loss = touch_unreached(self.distribution.world_size * shares["loss"], self.core)  # a gradient for each (DDP)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        draws.skip_idle()  # as upstream's Adam: no update of an encoder that ran no iteration in the step
        self.optimizer.step()
        self.scheduler.step()
        return {name: value.detach() for name, value in shares.items()}

    @torch.no_grad()
    def evaluate(self, step: StepBatch, global_step: int) -> dict[str, torch.Tensor]:
        """The same shares in eval mode (no dropout, nominal depth), without a parameter update."""
        was_training = self.core.training
        self.model.eval()
        try:
            return {name: value.detach() for name, value in self._shares(step, global_step).items()}
        finally:
            self.model.train(was_training)


__all__ = ["AllGather", "Distribution", "PretrainStep", "PretrainStepSettings", "all_gather_with_grad", "gather_rows",
           "no_gather"]
