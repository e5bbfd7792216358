"""Vectorised readout vs a per-molecule loop written the way upstream's Readout computes it."""

from __future__ import annotations

import pytest
import torch

from kermt.config import ReadoutConfig
from kermt.nn.readout import Readout

SCOPE = torch.tensor([[1, 3], [4, 1], [5, 0], [5, 7]])  # includes an empty molecule


def _loop_reference(readout: Readout, rows: torch.Tensor, scope: torch.Tensor) -> torch.Tensor:
    vectors = []
    for start, size in scope.tolist():
        if size == 0:
            vectors.append(torch.zeros(readout.output_size))
            continue
        x = rows.narrow(0, start, size)
        if readout.config.self_attention:
            weights = torch.softmax(readout.attn.w2 @ torch.tanh(readout.attn.w1 @ x.t()), dim=-1)
            vectors.append((weights @ x).flatten())
        else:
            vectors.append(x.sum(0) / size)
    return torch.stack(vectors)


def test_mean_readout_equals_loop():
    torch.manual_seed(0)
    rows = torch.randn(12, 6)
    readout = Readout(6, ReadoutConfig(self_attention=False))
    torch.testing.assert_close(readout(rows, SCOPE), _loop_reference(readout, rows, SCOPE), rtol=0, atol=1e-6)


def test_self_attention_readout_equals_loop_and_backpropagates():
    torch.manual_seed(0)
    rows = torch.randn(12, 6, requires_grad=True)
    readout = Readout(6, ReadoutConfig(self_attention=True, attn_hidden=3, attn_out=4))
    result = readout(rows, SCOPE)
    assert result.shape == (4, 24)
    torch.testing.assert_close(result, _loop_reference(readout, rows, SCOPE), rtol=0, atol=1e-6)
    result.sum().backward()
    assert torch.isfinite(rows.grad).all() and torch.isfinite(readout.attn.w1.grad).all()
    assert rows.grad[0].abs().sum() == 0  # the padding row is never read


@pytest.mark.parametrize("self_attention", [False, True])
def test_a_stack_of_views_is_read_out_as_each_view_alone(self_attention):
    """The finetune model reads out its two views as one stack [2, R, h]: each slice equals the loop reference."""
    torch.manual_seed(0)
    views = torch.randn(2, 12, 6)
    readout = Readout(6, ReadoutConfig(self_attention=self_attention, attn_hidden=3, attn_out=4))
    stacked = readout(views, SCOPE, width=7)
    assert stacked.shape == (2, 4, readout.output_size)
    for view, result in zip(views, stacked):
        torch.testing.assert_close(result, _loop_reference(readout, view, SCOPE), rtol=0, atol=1e-6)


def test_parameter_names():
    readout = Readout(6, ReadoutConfig(self_attention=True, attn_hidden=3, attn_out=4))
    shapes = {key: tuple(v.shape) for key, v in readout.state_dict().items()}
    assert shapes == {"cached_zero_vector": (6,), "attn.w1": (3, 6), "attn.w2": (4, 3)}
