"""What a train step reports, against values computed by hand: the label loss (without MTL weights) and the
objective, also when split over ranks."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from kermt.data.dataset import MoleculeBatch
from kermt.data.featurize import featurize_smiles
from kermt.train.step import FinetuneStepSettings, train_step

NAN = float("nan")
ATOM = [[1.0, 2.0], [0.0, 1.0]]
BOND = [[0.0, 2.0], [1.0, 3.0]]
TARGETS = [[0.0, NAN], [2.0, 1.0]]
DIST = 0.5
# ℓ = (a−y)² + (b−y)² + 0.5·(a−b)² per label: (0,0) 1 + 0 + 0.5 = 1.5; (1,0) 4 + 1 + 0.5 = 5.5; (1,1) 0 + 4 + 2 = 6
LABEL_LOSS = (1.5 + 5.5 + 6.0) / 3
LOG_SIGMA = [0.0, math.log(2.0)]
# Σ_t ½e^{−2s_t}·L_t + s_t with L_0 = (1.5 + 5.5)/2, L_1 = 6/1
OBJECTIVE = 0.5 * 3.5 + 0.0 + 0.5 * 0.25 * 6.0 + math.log(2.0)


class FixedViews(nn.Module):
    """A model whose two views are its parameters, so every loss is a hand computation."""

    def __init__(self, rows: slice) -> None:
        super().__init__()
        self.rows = rows
        self.atom = nn.Parameter(torch.tensor(ATOM))
        self.bond = nn.Parameter(torch.tensor(BOND))
        self.mtl_log_sigma = nn.Parameter(torch.tensor(LOG_SIGMA))

    def forward(self, graph, features, depth_rng):
        return SimpleNamespace(atom_view=self.atom[self.rows], bond_view=self.bond[self.rows])


def _step(rows: slice, mtl: bool, world_size: int = 1, global_counts: torch.Tensor | None = None):
    model = FixedViews(rows)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    selected = np.arange(2)[rows]
    graph = featurize_smiles(["CO", "CCO"]).select(selected).batch_graph()
    batch = MoleculeBatch(graph, None, torch.tensor(TARGETS)[rows], selected)
    all_reduce = (lambda _: global_counts.clone()) if global_counts is not None else (lambda t: t)
    settings = FinetuneStepSettings("regression", DIST, mtl)
    return train_step(model, optimizer, scheduler, batch, settings, None, world_size, all_reduce)


@pytest.mark.parametrize("mtl", [False, True])
def test_step_reports_the_label_loss_and_the_objective(mtl):
    step = _step(slice(0, 2), mtl)
    assert step.label_count.item() == 3
    assert step.label_loss_sum.item() / step.label_count.item() == pytest.approx(LABEL_LOSS)
    assert step.objective_share.item() == pytest.approx(OBJECTIVE if mtl else LABEL_LOSS)


@pytest.mark.parametrize("mtl", [False, True])
def test_rank_shares_add_up_to_the_whole_step(mtl):
    # Two ranks, one molecule each; the all-reduce hands each rank the global label count(s).
    counts = torch.tensor([2.0, 1.0]) if mtl else torch.tensor([3.0])
    first = _step(slice(0, 1), mtl, world_size=2, global_counts=counts)
    second = _step(slice(1, 2), mtl, world_size=2, global_counts=counts)
    assert first.label_count.item() == second.label_count.item() == 3
    label_loss = (first.label_loss_sum + second.label_loss_sum).item() / 3
    assert label_loss == pytest.approx(LABEL_LOSS)
    objective = (first.objective_share + second.objective_share).item()
    assert objective == pytest.approx(OBJECTIVE if mtl else LABEL_LOSS)
