"""touch_unreached: every trainable parameter gets a gradient (DDP without find_unused_parameters), unreached ones
exactly zero, reached ones untouched, and a loss that reaches every parameter is returned as it is (no op)."""

from __future__ import annotations

import torch
from torch import nn

from bench.dispatch_audit import DispatchAudit
from kermt.nn.reached import graph_leaves, touch_unreached


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.ModuleDict({"used": nn.Linear(3, 2), "skipped": nn.Linear(3, 2), "frozen": nn.Linear(3, 2)})
    model["frozen"].requires_grad_(False)
    return model


def test_a_loss_that_reaches_every_parameter_is_left_as_it_is():
    model = _model()
    x = torch.randn(4, 3)
    loss = (model["used"](x) + model["skipped"](x)).sum()
    with DispatchAudit() as audit:
        touched = touch_unreached(loss, model)
    assert touched is loss and audit.op_count == 0
    assert graph_leaves(loss) >= {model["used"].weight, model["skipped"].bias}


def test_unreached_parameters_get_a_zero_gradient_and_reached_ones_their_own():
    model, x = _model(), torch.randn(4, 3)
    model["used"](x).pow(2).sum().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    loss = model["used"](x).pow(2).sum()
    touched = touch_unreached(loss, model)
    assert float(touched.detach()) == float(loss.detach())
    touched.backward()
    for name, param in model.named_parameters():
        if name.startswith("frozen"):
            assert param.grad is None  # not trainable: no gradient needed
        elif name.startswith("skipped"):
            assert torch.equal(param.grad, torch.zeros_like(param))
        else:
            assert torch.equal(param.grad, expected[name])
