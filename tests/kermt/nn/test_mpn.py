"""run_encoders against a literal transcription of upstream's MPNEncoder loop: padded index lists

Upstream behaviour: docs/upstream-compatibility.md#message-passing.
gathered and summed, one encoder at a time, for per-encoder iteration counts as dynamic depth draws them.

The fixture parity tests only cover eval mode, where every encoder runs the same depth; here the counts differ
(including 0 and 1), and outputs and every gradient are compared. With dropout, the same torch seed must give the
same masks: upstream draws them encoder by encoder (heads in order, q, k, v), iteration by iteration.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from kermt.nn.aggregate import GraphIndex
from kermt.nn.mpn import MPNEncoder, PassingMode, can_stack, run_encoders, run_encoders_stacked
from tests.kermt.nn.upstream_fixtures import fixture_batch

HIDDEN = 6
ITERATIONS = [3, 0, 1, 5, 2, 3]


def _upstream_loop(encoder: MPNEncoder, inp: torch.Tensor, count: int, graph, mode: PassingMode) -> torch.Tensor:
    message = inp
    for _ in range(count):
        if mode.atom_messages:
            summed = message[graph.a2a].sum(dim=1)
        else:
            summed = message[graph.a2b].sum(dim=1)[graph.b2a] - message[graph.b2revb]
        message = encoder.act_func(inp + encoder.W_h(summed))
        message = F.dropout(message, mode.dropout, mode.training)
    return message


# (upstream's undirected averaging is refused by EncoderConfig: see tests/kermt/test_config.py)
@pytest.mark.parametrize(
    ("atom_messages", "bias"), [(True, False), (True, True), (False, False), (False, True)],
    ids=["node", "node_bias", "edge", "edge_bias"],
)
@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["no_dropout", "dropout"])
def test_dynamic_depth_equals_upstreams_loop(atom_messages, bias, dropout):
    graph = fixture_batch()
    rows = graph.f_atoms.shape[0] if atom_messages else graph.f_bonds.shape[0]
    torch.manual_seed(0)
    encoders = [MPNEncoder(HIDDEN, bias, "PReLU") for _ in ITERATIONS]
    for k, encoder in enumerate(encoders):  # distinct slopes, so a mixed-up activation shows
        encoder.act_func.weight.data.fill_(0.1 + 0.05 * k)
    inp = torch.randn(rows, HIDDEN, dtype=torch.float64, requires_grad=True)
    encoders = [encoder.double() for encoder in encoders]
    mode = PassingMode(atom_messages, dropout=dropout, training=True)
    index = GraphIndex.from_batch(graph, "upstream", torch.float64)
    weights = torch.randn(len(ITERATIONS), rows, HIDDEN, dtype=torch.float64)

    torch.manual_seed(1)
    ours = run_encoders(encoders, inp, ITERATIONS, index, mode)
    torch.manual_seed(1)
    reference = [_upstream_loop(e, inp, n, graph, mode) for e, n in zip(encoders, ITERATIONS)]

    parameters = [inp, *(p for e in encoders for p in e.parameters())]
    grads = []
    for outputs in (ours, reference):
        loss = sum((w * out).sum() for w, out in zip(weights, outputs))
        grads.append(torch.autograd.grad(loss, parameters, allow_unused=True, materialize_grads=True))
    for ours_out, ref_out in zip(ours, reference):
        torch.testing.assert_close(ours_out, ref_out, rtol=1e-10, atol=1e-10)
    for ours_grad, ref_grad in zip(*grads):
        torch.testing.assert_close(ours_grad, ref_grad, rtol=1e-10, atol=1e-10)
    assert ours[1] is inp  # 0 iterations: the input itself, as upstream
    assert grads[0][0].abs().sum() > 0


@pytest.mark.parametrize(
    ("atom_messages", "bias"), [(True, False), (True, True), (False, False), (False, True)],
    ids=["node", "node_bias", "edge", "edge_bias"],
)
@pytest.mark.parametrize("iterations", [ITERATIONS, [4] * 6, [0] * 6], ids=["dynamic", "eval", "none"])
def test_stacked_encoders_equal_the_loop(atom_messages, bias, iterations):
    # Without dropout the encoders run as one [K, R, h] computation (sorted by iteration count when they differ):
    # the same outputs and every gradient as one encoder at a time.
    graph = fixture_batch()
    rows = graph.f_atoms.shape[0] if atom_messages else graph.f_bonds.shape[0]
    torch.manual_seed(0)
    encoders = [MPNEncoder(HIDDEN, bias, "PReLU").double() for _ in iterations]
    for k, encoder in enumerate(encoders):  # distinct slopes, so a mixed-up activation shows
        encoder.act_func.weight.data.fill_(0.1 + 0.05 * k)
    inp = torch.randn(rows, HIDDEN, dtype=torch.float64, requires_grad=True)
    mode = PassingMode(atom_messages, dropout=0.0, training=True)
    index = GraphIndex.from_batch(graph, "upstream", torch.float64)
    weights = torch.randn(len(iterations), rows, HIDDEN, dtype=torch.float64)
    assert can_stack(encoders, mode) and not can_stack(encoders, PassingMode(atom_messages, 0.1, True))

    stacked = run_encoders_stacked(encoders, inp, iterations, index, mode)
    loop = torch.stack(run_encoders(encoders, inp, iterations, index, mode))
    parameters = [inp, *(p for e in encoders for p in e.parameters())]
    grads = [torch.autograd.grad((weights * out).sum(), parameters, allow_unused=True, materialize_grads=True)
             for out in (stacked, loop)]
    torch.testing.assert_close(stacked, loop, rtol=1e-10, atol=1e-10)
    for stacked_grad, loop_grad in zip(*grads):
        torch.testing.assert_close(stacked_grad, loop_grad, rtol=1e-10, atol=1e-10)
