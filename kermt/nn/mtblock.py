"""MTBlock: multi-head message passing plus attention across the heads (docs/upstream-compatibility.md#encoder).

Keys (upstream order): ``heads.{h}.mpn_{q,k,v}.*``, ``act_func``, ``layernorm``, ``W_i``, ``attn.*``, ``W_o``,
``sublayer.norm``. A node block passes atom messages (neighbours via a2a), an edge block directed-bond messages.
"""

from __future__ import annotations

import torch
from torch import nn

from kermt.config import EncoderConfig
from kermt.nn.aggregate import GraphIndex
from kermt.nn.depth import iteration_count
from kermt.nn import keyed_dropout
from kermt.nn.layers import MultiHeadedAttention, SublayerConnection, make_activation
from kermt.nn.mpn import MPNEncoder, PassingMode, can_stack, dropout_streams, run_encoders, run_encoders_stacked


class Head(nn.Module):
    """Three independent MPN encoders producing one head's query, key and value."""

    def __init__(self, hidden_size: int, bias: bool, activation: str) -> None:
        super().__init__()
        self.mpn_q = MPNEncoder(hidden_size, bias, activation)
        self.mpn_k = MPNEncoder(hidden_size, bias, activation)
        self.mpn_v = MPNEncoder(hidden_size, bias, activation)

    def encoders(self) -> list[MPNEncoder]:
        return [self.mpn_q, self.mpn_k, self.mpn_v]


class MTBlock(nn.Module):
    """One block of the node (``atom_messages``) or edge stack.

    ``W_i`` (then ``act_func``, ``layernorm``) projects raw features ([R, input_dim]) to ``hidden``; it is only
    applied when the input width differs from ``hidden``. Blocks after the first hold that projection unused, as
    upstream's checkpoints do; here it is frozen (requires_grad False).
    """

    def __init__(self, config: EncoderConfig, input_dim: int, atom_messages: bool) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.atom_messages = atom_messages
        self.hidden_size = hidden
        self.depth = config.depth
        self.dropout = config.dropout
        self.heads = nn.ModuleList(
            Head(hidden, config.bias, config.activation) for _ in range(config.num_attn_head)
        )
        self.act_func = make_activation(config.activation)
        self.layernorm = nn.LayerNorm(hidden, elementwise_affine=True)
        self.W_i = nn.Linear(input_dim, hidden, bias=config.bias)
        self.rows = "atom" if atom_messages else "bond"
        self.attn = MultiHeadedAttention(config.num_attn_head, hidden, config.dropout, config.bias, self.rows)
        self.W_o = nn.Linear(hidden * config.num_attn_head, hidden, bias=config.bias)
        self.sublayer = SublayerConnection(hidden, config.dropout, self.rows)
        if input_dim == hidden:
            # The input projection only runs when the input width differs from hidden (blocks after the first).
            # Upstream still holds its parameters (checkpoints list them); freezing them keeps every trainable
            # parameter in the autograd graph, so DDP needs no find_unused_parameters.
            for module in (self.W_i, self.act_func, self.layernorm):
                module.requires_grad_(False)

    @property
    def num_encoders(self) -> int:
        return 3 * len(self.heads)

    def encoders(self) -> list[MPNEncoder]:
        """Every encoder of the block in draw order: head 0's q, k, v, then head 1's, ..."""
        return [enc for head in self.heads for enc in head.encoders()]

    def forward(self, x: torch.Tensor, index: GraphIndex, depths: list[int] | None) -> torch.Tensor:
        """x: [R, input_dim or hidden] -> [R, hidden].

        ``depths``: one sampled depth per encoder (head 0's q, k, v, head 1's, ...) or None for the nominal depth.
        """
        if x.shape[1] != self.hidden_size:
            x = self.W_i(x)
            x = keyed_dropout.dropout(self.layernorm(self.act_func(x)), self.dropout, self.training, self.rows)
            x = index.zero_padding_row(x)
        encoders = self.encoders()
        depths = depths if depths is not None else [self.depth] * len(encoders)
        iterations = [iteration_count(d) for d in depths]
        mode = PassingMode(self.atom_messages, self.dropout, self.training)
        streams = dropout_streams(iterations)  # per-molecule draws: the same masks whichever way runs
        if can_stack(encoders, mode):  # no torch RNG draws: the query encoders of every head, then keys, values
            by_role = [i + role for role in range(3) for i in range(0, len(encoders), 3)]
            stacked = run_encoders_stacked([encoders[i] for i in by_role], x, [iterations[i] for i in by_role],
                                           index, mode, None if streams is None else [streams[i] for i in by_role])
            mixed = self.attn.forward_stacked(stacked.view(3, len(self.heads), *x.shape[:1], self.hidden_size))
        else:  # q, k, v of head 0, then head 1, ...: upstream's order of dropout draws
            outputs = run_encoders(encoders, x, iterations, index, mode, streams)
            mixed = self.attn(*(torch.stack(outputs[i::3], dim=1) for i in range(3)))  # each [R, H, h]
        return index.zero_padding_row(self.sublayer(self.W_o(mixed.reshape(x.shape[0], -1))))
