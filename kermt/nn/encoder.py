"""GTransEncoder and its wrapper KermtEmbedding (docs/upstream-compatibility.md#encoder).

``KermtEmbedding(config).encoders`` is the GTransEncoder, so keys read ``encoders.node_blocks.0...``; a finetune
model holds the embedding as ``kermt`` (``kermt.encoders...``), exactly as upstream.

Only the output branches that ``embedding_output_type`` asks for are built ("atom": atom_from_atom and
atom_from_bond; "bond": bond_from_atom and bond_from_bond; "both": all four), so every parameter takes part in
the forward and DDP needs no ``find_unused_parameters``.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kermt.config import EncoderConfig
from kermt.data.batch import BatchMolGraph
from kermt.data.operators import OPERATOR_NAMES, OperatorSpec
from kermt.nn.aggregate import GraphIndex
from kermt.nn.depth import draw_depths, iteration_count
from kermt.nn.layers import PositionwiseFeedForward, SublayerConnection
from kermt.nn.mtblock import MTBlock

ATOM_BRANCHES = ("atom_from_atom", "atom_from_bond")
BOND_BRANCHES = ("bond_from_atom", "bond_from_bond")
ALL_BRANCHES = ATOM_BRANCHES + BOND_BRANCHES  # upstream's order of the four families (fingerprints: aa, ab, ba, bb)
BRANCHES_BY_OUTPUT_TYPE = {"atom": ATOM_BRANCHES, "bond": BOND_BRANCHES, "both": ALL_BRANCHES}
# The neighbour sum each output branch applies to the last block's output (atoms for *_from_atom, bonds otherwise).
BRANCH_OPERATORS = {
    "atom_from_atom": "neighbour_atoms",
    "atom_from_bond": "incoming_bonds",
    "bond_from_atom": "atom_to_bond",
    "bond_from_bond": "bond_update",
}


@dataclass(frozen=True)
class EncoderOutput:
    """Encoder embeddings; branches that were not built are None.

    atom_from_atom, atom_from_bond: [A, hidden] (row 0 = padding row)
    bond_from_atom, bond_from_bond: [E, hidden]
    """

    atom_from_atom: torch.Tensor | None = None
    atom_from_bond: torch.Tensor | None = None
    bond_from_atom: torch.Tensor | None = None
    bond_from_bond: torch.Tensor | None = None


class GTransEncoder(nn.Module):
    """Node and edge MTBlock stacks followed by the output transforms (``atom_bond_transform`` upstream)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.edge_blocks = nn.ModuleList(
            MTBlock(config, config.bond_fdim if i == 0 else hidden, atom_messages=False)
            for i in range(config.num_mt_block)
        )
        self.node_blocks = nn.ModuleList(
            MTBlock(config, config.atom_fdim if i == 0 else hidden, atom_messages=True)
            for i in range(config.num_mt_block)
        )
        self.branches = BRANCHES_BY_OUTPUT_TYPE[config.embedding_output_type]
        for name in self.branches:
            rows = "atom" if name.startswith("atom") else "bond"
            raw_dim = config.atom_fdim if rows == "atom" else config.bond_fdim
            ffn = PositionwiseFeedForward(hidden + raw_dim, 4 * hidden, hidden, config.activation, config.dropout, rows)
            self.add_module(f"ffn_{name}", ffn)
        for name in self.branches:
            rows = "atom" if name.startswith("atom") else "bond"
            self.add_module(f"{name}_sublayer", SublayerConnection(hidden, config.dropout, rows))

    def aggregation_spec(self, training: bool) -> OperatorSpec:
        """The neighbour-sum operators this encoder reads (node blocks: atoms, edge blocks: the bond update, plus
        one per output branch), for the collate to build; ``training`` adds the transposes the backward needs."""
        used = {"neighbour_atoms", "bond_update"} | {BRANCH_OPERATORS[name] for name in self.branches}
        return OperatorSpec(self.config.padding, tuple(n for n in OPERATOR_NAMES if n in used), training)

    def draw_depths(self, rng: np.random.Generator | None) -> list[list[int]] | None:
        """Per block (node blocks first, then edge blocks) the sampled depth of each encoder; None in eval mode."""
        if not self.training:
            return None
        blocks = [*self.node_blocks, *self.edge_blocks]
        flat = draw_depths(self.config.depth, sum(b.num_encoders for b in blocks), rng)
        per_block, start = [], 0
        for block in blocks:
            per_block.append(flat[start : start + block.num_encoders])
            start += block.num_encoders
        return per_block

    def idle_parameters(self, draws: list[list[list[int]]]) -> list[nn.Parameter]:
        """The parameters of every encoder that ran no iteration in every one of ``draws`` (per forward, the
        per-block depths :meth:`draw_depths` gave): upstream never calls such an encoder's ``W_h`` and activation.
        Every rank runs the forward, an empty share included, and draws the same depths."""
        blocks = [*self.node_blocks, *self.edge_blocks]
        idle = []
        for index, block in enumerate(blocks):
            for position, encoder in enumerate(block.encoders()):
                if all(iteration_count(forward[index][position]) == 0 for forward in draws):
                    idle.extend(encoder.parameters())
        return idle

    def forward(self, graph: BatchMolGraph, depth_rng: np.random.Generator | None = None) -> EncoderOutput:
        """Embeddings of a batch. ``depth_rng`` seeds the train-mode depth draws (None: numpy's global RNG)."""
        index = GraphIndex.from_batch(graph, self.config.padding, graph.f_atoms.dtype)
        depths = self.draw_depths(depth_rng)
        log = _DRAW_LOG.get()
        if depths is not None and log is not None:
            log.append((self, depths))
        node_depths = depths[: len(self.node_blocks)] if depths else [None] * len(self.node_blocks)
        edge_depths = depths[len(self.node_blocks) :] if depths else [None] * len(self.edge_blocks)
        atoms, bonds = graph.f_atoms, graph.f_bonds
        for block, block_depths in zip(self.node_blocks, node_depths):
            atoms = block(atoms, index, block_depths)
        for block, block_depths in zip(self.edge_blocks, edge_depths):
            bonds = block(bonds, index, block_depths)
        outputs = {}
        for name in self.branches:
            raw = graph.f_atoms if name.startswith("atom") else graph.f_bonds
            aggregated = index.apply(BRANCH_OPERATORS[name], atoms if name.endswith("from_atom") else bonds)
            ffn_out = getattr(self, f"ffn_{name}")(torch.cat([raw, aggregated], dim=1))
            outputs[name] = index.zero_padding_row(getattr(self, f"{name}_sublayer")(ffn_out))
        return EncoderOutput(**outputs)


# The draws of the enclosing DepthDrawLog block (None: nothing records them), as keyed_dropout scopes its draws.
_DRAW_LOG: ContextVar[list[tuple[GTransEncoder, list[list[int]]]] | None] = ContextVar("kermt_depth_draws",
                                                                                       default=None)


class DepthDrawLog:
    """Records the train-mode depth draws of every GTransEncoder that runs inside the block, to name afterwards the
    parameters that the step never used (docs/numerics.md#random-draws).

    An encoder that draws depth 1 or less runs no iteration: upstream's forward never touches its ``W_h`` and
    activation, so they have no gradient and upstream's Adam skips them for that step (no moment decay, no update,
    no step count). Here they get a zero gradient (every parameter must have one under DDP without
    find_unused_parameters, and stacked encoders share one weight stack); clearing those gradients after the
    backward, before the optimizer step, makes Adam skip them exactly as upstream's does. The draws come from
    (seed, global step), the same on every rank, so every rank skips the same parameters.

        with DepthDrawLog() as draws:
            output = model(...)
        loss.backward()
        draws.skip_idle()
        optimizer.step()
    """

    def __init__(self) -> None:
        self.draws: list[tuple[GTransEncoder, list[list[int]]]] = []  # (encoder, one forward's per-block depths)
        self._token = None

    def __enter__(self) -> "DepthDrawLog":
        self._token = _DRAW_LOG.set(self.draws)
        return self

    def __exit__(self, *exc_info: object) -> None:
        _DRAW_LOG.reset(self._token)

    def idle_parameters(self) -> list[nn.Parameter]:
        """Parameters of encoders that ran no iteration in every train forward of the block (eval forwards draw
        nothing, and an encoder that did not run in train mode is not named)."""
        by_encoder: dict[GTransEncoder, list[list[list[int]]]] = {}
        for encoder, depths in self.draws:
            by_encoder.setdefault(encoder, []).append(depths)
        return [p for encoder, draws in by_encoder.items() for p in encoder.idle_parameters(draws)]

    def skip_idle(self) -> None:
        """Clear the gradients of :meth:`idle_parameters` (call after the backward, before the optimizer step)."""
        for parameter in self.idle_parameters():
            parameter.grad = None


class KermtEmbedding(nn.Module):
    """Upstream's ``KERMTEmbedding``: holds the GTransEncoder as ``encoders``."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.encoders = GTransEncoder(config)

    def aggregation_spec(self, training: bool) -> OperatorSpec:
        """What to collate batches with (see :meth:`GTransEncoder.aggregation_spec`)."""
        return self.encoders.aggregation_spec(training)

    def forward(self, graph: BatchMolGraph, depth_rng: np.random.Generator | None = None) -> EncoderOutput:
        return self.encoders(graph, depth_rng)
