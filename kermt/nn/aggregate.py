"""Neighbour sums over a :class:`~kermt.data.batch.BatchMolGraph` as sparse matrix products.

The operators themselves (what they sum, the two padding modes) are described in :mod:`kermt.data.operators`. A
batch collated with the model's :class:`~kermt.data.operators.OperatorSpec` brings them ready, transposes included,
so a forward and its backward only multiply: no sort, coalesce or other host round trip on the device. A batch
without them (built by hand, or collated for prediction and then trained on) gets them built here from its index
arrays, on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kermt.config import PADDING_MODES, PaddingMode
from kermt.data.batch import BatchMolGraph, SparseOperator
from kermt.data.operators import OperatorSpec, operators_of


class _ConstantSparseProduct(torch.autograd.Function):
    """``operator @ x`` for a constant sparse ``operator``, differentiating with a precomputed transpose.

    torch's own backward transposes the CSR matrix (a sort) at every call; the operators are fixed for a batch.
    """

    @staticmethod
    def forward(ctx, operator: torch.Tensor, transposed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.transposed = transposed
        return torch.sparse.mm(operator, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, None, torch.sparse.mm(ctx.transposed, grad)


def _block_diagonal(operator: SparseOperator, copies: int) -> SparseOperator:
    """``copies`` copies of ``operator`` along the diagonal, from its CSR arrays (no host round trip: nnz and the
    shape are host values)."""
    nnz = operator.col.shape[0]
    rows, cols = operator.shape
    offsets = torch.arange(copies, device=operator.col.device)
    crow = (operator.crow[:-1].unsqueeze(0) + (offsets * nnz).unsqueeze(1)).reshape(-1)
    crow = torch.cat([crow, operator.crow.new_full((1,), copies * nnz)])
    col = (operator.col.unsqueeze(0) + (offsets * cols).unsqueeze(1)).reshape(-1)
    return SparseOperator(crow, col, operator.values.repeat(copies), (copies * rows, copies * cols))


def _leading_blocks(diagonal: SparseOperator, copies: int, block_shape: tuple[int, int]) -> SparseOperator:
    """The first ``copies`` blocks of a block-diagonal operator: leading CSR rows, which only reach the leading
    columns (views of its arrays, nothing copied)."""
    rows, cols = block_shape[0] * copies, block_shape[1] * copies
    nnz = diagonal.col.shape[0] * rows // diagonal.shape[0]  # every block holds the same number of entries
    return SparseOperator(diagonal.crow[: rows + 1], diagonal.col[:nnz], diagonal.values[:nnz], (rows, cols))


@dataclass
class GraphIndex:
    """The batch's neighbour-sum operators for one padding mode, as torch CSR tensors made on first use."""

    graph: BatchMolGraph
    padding: PaddingMode
    dtype: torch.dtype
    _matrices: dict = field(default_factory=dict, repr=False)
    _diagonals: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_batch(cls, graph: BatchMolGraph, padding: PaddingMode, dtype: torch.dtype) -> "GraphIndex":
        if padding not in PADDING_MODES:
            raise ValueError(f"padding {padding!r} is not one of {PADDING_MODES}")
        return cls(graph, padding, dtype)

    def _parts(self, name: str, transposed: bool) -> SparseOperator:
        operators = self.graph.operators
        ready = operators is not None and operators.padding == self.padding
        found = (operators.transposes if transposed else operators.matrices).get(name) if ready else None
        if found is None:  # not collated with this operator: build it from the index arrays (host round trip)
            built = operators_of(self.graph, OperatorSpec(self.padding, (name,), transposes=transposed))
            found = (built.transposes if transposed else built.matrices)[name]
        return found

    def matrix(self, name: str, transposed: bool = False, copies: int = 1) -> torch.Tensor:
        """Operator ``name`` (or its transpose) as a CSR tensor, repeated ``copies`` times along the diagonal."""
        key = (name, transposed, copies)
        if key not in self._matrices:
            parts = self._parts(name, transposed)
            if copies > 1:  # one block-diagonal operator per name, the widest asked for; fewer copies are its prefix
                widest = self._diagonals.get((name, transposed))
                if widest is None or widest.shape[0] < copies * parts.shape[0]:
                    widest = self._diagonals[(name, transposed)] = _block_diagonal(parts, copies)
                parts = widest if widest.shape[0] == copies * parts.shape[0] else _leading_blocks(widest, copies,
                                                                                                     parts.shape)
            self._matrices[key] = parts.matrix(self.dtype)
        return self._matrices[key]

    def apply(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Operator ``name`` applied to the rows of ``x``: [R_in, h] -> [R_out, h], in the operator's dtype."""
        return self._product(self.matrix(name), lambda: self.matrix(name, transposed=True), x)

    def apply_stacked(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Operator ``name`` applied to each of K stacked inputs at once: [K, R_in, h] -> [K, R_out, h]
        (one product with the block-diagonal operator instead of K products)."""
        copies, rows, width = x.shape
        operator = self.matrix(name, copies=copies)
        out = self._product(operator, lambda: self.matrix(name, transposed=True, copies=copies),
                            x.reshape(copies * rows, width))
        return out.view(copies, -1, width)

    def _product(self, operator: torch.Tensor, transposed, x: torch.Tensor) -> torch.Tensor:
        """``operator @ x`` in the operator's dtype, also under autocast: sums of many rows stay in float32
        (an fp32 island in a bf16 forward; the sparse kernels have no bf16 variant everywhere either)."""
        with torch.autocast(x.device.type, enabled=False):
            x = x.to(self.dtype)
            if not torch.is_grad_enabled() or not x.requires_grad:
                return torch.sparse.mm(operator, x)
            return _ConstantSparseProduct.apply(operator, transposed(), x)

    def zero_padding_row(self, x: torch.Tensor) -> torch.Tensor:
        """In "zero" mode, return ``x`` with row 0 (dimension -2) set to zero; in "upstream" mode, ``x`` itself."""
        if self.padding != "zero":  # the same test as the operators': "zero" is the one mode that changes sums
            return x
        keep = torch.ones(x.shape[-2], 1, dtype=x.dtype, device=x.device)
        keep[0] = 0
        return x * keep
