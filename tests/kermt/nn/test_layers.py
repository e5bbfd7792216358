"""MultiHeadedAttention.forward_stacked (the three input projections as one batched matmul) against forward."""

from __future__ import annotations

import torch

from kermt.nn.layers import MultiHeadedAttention


def test_stacked_attention_equals_the_three_projections():
    torch.manual_seed(0)
    attention = MultiHeadedAttention(num_heads=2, d_model=6, dropout=0.0, bias=True).double()
    qkv = torch.randn(3, 4, 5, 6, dtype=torch.float64, requires_grad=True)  # [q/k/v, L, R, d]
    stacked = attention.forward_stacked(qkv)
    separate = attention(*(qkv[i].transpose(0, 1) for i in range(3)))  # each [R, L, d]
    torch.testing.assert_close(stacked, separate, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(stacked)
    grads = [torch.autograd.grad((weights * out).sum(), [qkv, *attention.parameters()]) for out in (stacked, separate)]
    for ours, reference in zip(*grads):
        torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
