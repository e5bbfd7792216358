"""KermtFinetuneModel: encoder + shared readout + one FFN per view (docs/upstream-compatibility.md#finetune-heads).

The "atom view" reads out ``atom_from_atom``, the "bond view" ``atom_from_bond`` (both atom-level). Training uses
both views' raw outputs (logits for classification); prediction is their mean (mean of sigmoids for
classification). The encoder is built with ``embedding_output_type="atom"``: the bond-output branches that a
pretrained checkpoint may hold are never used by finetuning, so they are not built (their keys are reported as
ignored by the checkpoint loader) and every parameter gets a gradient — no ``find_unused_parameters`` under DDP.

A variance head (``head.variance``, ``kermt finetune --loss mve``) makes each view's last layer twice as wide: per
task a mean and a raw variance, the variance ``softplus(raw) + VARIANCE_FLOOR`` in scaled target units. Softplus
rather than ``exp`` of a log-variance: it grows linearly, so a large raw output neither overflows (bf16 included) nor
gives the NLL exploding gradients early in training, and the floor keeps ``1/variance`` finite when a molecule is
fitted exactly. Such a model has no upstream counterpart (its last layers have other shapes).

A features FFN (``head.features_ffn``, from scratch by default) is a descriptor model beside the graph: an FFN on
the molecule features alone whose per-task output is added to each view's (to the means of a variance head). The
views' FFNs still read [readout, features], so the graph part learns a correction to the descriptor model, and with
the graph part at zero the model is that descriptor model: descriptors can carry the prediction on their own, as a
descriptor MLP does, where concatenated to a 64-wide readout they are one input among many. Upstream has no such
layer; no upstream checkpoint builds it.

``use_mtl_loss`` adds ``mtl_log_sigma`` [num_tasks] (upstream keeps it in a separate ``MTLLoss`` module; inside the
model it is reduced by DDP like any other parameter and lands in the heads' parameter group).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from kermt.config import FinetuneModelConfig
from kermt.data.batch import BatchMolGraph
from kermt.nn.encoder import EncoderOutput, KermtEmbedding
from kermt.nn.heads import build_ffn, build_task_head
from kermt.nn.readout import Readout

VARIANCE_FLOOR = 1e-6  # scaled units: a std of 0.001 target standard deviations


@dataclass(frozen=True)
class FinetuneOutput:
    """Everything one forward computes. Shapes: M molecules, T tasks, F = FFN output width.

    encoder                        EncoderOutput (atom_from_atom, atom_from_bond: [A, hidden])
    readout_atom_view/_bond_view   [M, readout size]  molecule vectors before the extra features are appended
    ffn_atom_view/_bond_view       [M, F]             output of the shared FFN
    atom_view, bond_view           [M, T]             per-view outputs (logits for classification); the means of a
                                                      variance head
    atom_variance, bond_variance   [M, T] or None     per-view variances (scaled units) of a variance head
    from_features                  [M, T] or None     the features FFN's output, already in atom_view and bond_view
    """

    encoder: EncoderOutput
    readout_atom_view: torch.Tensor
    readout_bond_view: torch.Tensor
    ffn_atom_view: torch.Tensor
    ffn_bond_view: torch.Tensor
    atom_view: torch.Tensor
    bond_view: torch.Tensor
    classification: bool
    atom_variance: torch.Tensor | None = None
    bond_variance: torch.Tensor | None = None
    from_features: torch.Tensor | None = None

    @property
    def view_predictions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-view predictions: probabilities for classification, raw values for regression."""
        if self.classification:
            return torch.sigmoid(self.atom_view), torch.sigmoid(self.bond_view)
        return self.atom_view, self.bond_view

    @property
    def prediction(self) -> torch.Tensor:
        """Upstream's eval-mode output [M, T]: the mean of the two views' predictions."""
        atom, bond = self.view_predictions
        return (atom + bond) / 2

    @property
    def variance(self) -> torch.Tensor | None:
        """A variance head's predictive variance [M, T] of :attr:`prediction` (scaled units; None without one): the
        variance of the equal mixture of the two views' Gaussians, their mean variance plus their means' spread."""
        if self.atom_variance is None or self.bond_variance is None:
            return None
        return (self.atom_variance + self.bond_variance) / 2 + ((self.atom_view - self.bond_view) / 2) ** 2


class KermtFinetuneModel(nn.Module):
    """Finetune model with upstream's state_dict keys (``kermt.*``, ``readout.*``, ``mol_atom_from_*_ffn*``)."""

    def __init__(self, config: FinetuneModelConfig) -> None:
        super().__init__()
        head = config.head
        encoder_config = dataclasses.replace(config.encoder, embedding_output_type="atom")
        self.config = dataclasses.replace(config, encoder=encoder_config)
        hidden = encoder_config.hidden_size
        self.kermt = KermtEmbedding(encoder_config)
        self.readout = Readout(hidden, config.readout)
        task_layers = head.ffn_num_task_specific_layers
        if task_layers > 0 and head.ffn_task_specific_hidden_size is None:
            raise ValueError("ffn_task_specific_hidden_size is required when ffn_num_task_specific_layers > 0")
        self.outputs_per_task = 2 if head.variance else 1  # a variance head: a mean and a raw variance per task
        ffn_out = head.ffn_task_specific_hidden_size if task_layers > 0 else head.num_tasks * self.outputs_per_task
        ffn_in = self.readout.output_size + head.features_size
        ffn_hidden = head.ffn_hidden_size if head.ffn_hidden_size is not None else hidden
        for view in ("atom", "bond"):
            ffn = build_ffn(ffn_in, ffn_hidden, ffn_out, head.ffn_num_layers, head.dropout, head.activation)
            self.add_module(f"mol_atom_from_{view}_ffn", ffn)
        if task_layers > 0:
            for view in ("atom", "bond"):
                tasks = nn.ModuleList(
                    build_task_head(ffn_out, task_layers, head.dropout, head.activation, self.outputs_per_task)
                    for _ in range(head.num_tasks)
                )
                self.add_module(f"mol_atom_from_{view}_ffn_task_specific", tasks)
        if config.use_mtl_loss:
            if head.num_tasks < 2:
                raise ValueError("use_mtl_loss needs at least 2 tasks")
            self.mtl_log_sigma = nn.Parameter(torch.zeros(head.num_tasks))
        # built last, so that a model without it draws its initial weights exactly as before
        self.features_ffn = build_ffn(head.features_size, ffn_hidden, head.num_tasks, head.ffn_num_layers,
                                      head.dropout, head.activation) if head.features_ffn else None

    @property
    def classification(self) -> bool:
        return self.config.head.dataset_type == "classification"

    def _task_outputs(self, view: str, shared: torch.Tensor) -> torch.Tensor:
        """Per-task outputs [M, T] of one view from its shared FFN output ([M, 2T] with a variance head: the T means,
        then the T raw variances)."""
        task_heads = getattr(self, f"mol_atom_from_{view}_ffn_task_specific", None)
        if task_heads is None:
            return shared
        outputs = [task_head(shared) for task_head in task_heads]
        return torch.cat([out[:, k : k + 1] for k in range(self.outputs_per_task) for out in outputs], dim=1)

    def _mean_and_variance(self, outputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A view's means [M, T] and, with a variance head, its variances [M, T] (float32, see the module doc)."""
        if self.outputs_per_task == 1:
            return outputs, None
        tasks = self.config.head.num_tasks
        return outputs[:, :tasks], F.softplus(outputs[:, tasks:].float()) + VARIANCE_FLOOR

    def _plus_features(self, outputs: torch.Tensor, from_features: torch.Tensor | None) -> torch.Tensor:
        """A view's outputs with the features FFN's per-task output added to its means (the first T columns)."""
        if from_features is None:
            return outputs
        tasks = self.config.head.num_tasks
        return torch.cat([outputs[:, :tasks] + from_features, outputs[:, tasks:]], dim=1)

    def forward(
        self,
        graph: BatchMolGraph,
        features: torch.Tensor | None = None,
        depth_rng: np.random.Generator | None = None,
    ) -> FinetuneOutput:
        """graph: a batch of M molecules; features: [M, features_size] or None. ``depth_rng``: see
        :func:`kermt.nn.depth.draw_depths` (train mode only)."""
        encoded = self.kermt(graph, depth_rng)
        # both views share the atom scope: one readout over the stack [2, A, hidden] -> [2, M, readout size]
        views = torch.stack([encoded.atom_from_atom, encoded.atom_from_bond])
        readouts = self.readout(views, graph.a_scope, graph.max_atoms)
        readout_atom, readout_bond = readouts[0], readouts[1]
        inputs = readouts
        if self.features_ffn is not None and features is None:
            raise ValueError("this model has a features FFN (features_ffn): it needs the molecule features")
        if features is not None:
            # explicit width: reshape(M, -1) is ambiguous (an error) for a worker's empty share (M = 0)
            width = self.config.head.features_size
            features = features.to(readouts.dtype).reshape(readouts.shape[1], width)
            inputs = torch.cat([readouts, features.expand(2, -1, -1)], dim=2)
        # upstream's order, hence its order of dropout draws: both shared FFNs, then each view's task layers
        ffn_atom = self.mol_atom_from_atom_ffn(inputs[0])
        ffn_bond = self.mol_atom_from_bond_ffn(inputs[1])
        from_features = self.features_ffn(features) if self.features_ffn is not None else None
        atom_out = self._plus_features(self._task_outputs("atom", ffn_atom), from_features)
        bond_out = self._plus_features(self._task_outputs("bond", ffn_bond), from_features)
        atom_view, atom_variance = self._mean_and_variance(atom_out)
        bond_view, bond_variance = self._mean_and_variance(bond_out)
        return FinetuneOutput(
            encoder=encoded,
            readout_atom_view=readout_atom,
            readout_bond_view=readout_bond,
            ffn_atom_view=ffn_atom,
            ffn_bond_view=ffn_bond,
            atom_view=atom_view,
            bond_view=bond_view,
            classification=self.classification,
            atom_variance=atom_variance,
            bond_variance=bond_variance,
            from_features=from_features,
        )
