"""Dropout whose masks are drawn per molecule, so that a molecule's masks do not depend on its batch.

Two ways to draw a dropout mask (``DROPOUT_DRAWS``):

- ``"torch"`` (the library default): ``F.dropout`` on torch's sequential RNG, in upstream's order of calls. Only this
  reproduces upstream's masks (the train-mode parity oracle), but a mask element then depends on everything drawn
  before it: on the batch's other molecules and, in a data-parallel run, on the rank.
- ``"per_molecule"``: every mask element is a pure function of (seed, global step, call, row kind, molecule id,
  row position inside the molecule, column), a counter-based hash evaluated with integer tensor ops on the
  tensor's own device. A molecule then sees the same masks on 1 worker as on N, and after an elastic restart.

Per-molecule draws are switched on for one forward with :func:`per_molecule_draws`, the way ``torch.autocast``
switches precision: every dropout site reads the active :class:`MoleculeDraws` from a context variable, so the
keys need not be threaded through ``nn.Sequential`` heads and the encoder's signatures. Each site names the kind of
its rows (``"atom"``, ``"bond"`` or ``"molecule"``); each call takes the next *stream* number, so two calls
(one shared ``Dropout`` used at two positions, an encoder's successive iterations) never share a mask. The call
order is the same on every rank (same code, same depth draws), so the streams are too.

The hash is a 32-bit integer finaliser (Wellons' "lowbias32" with multipliers below 2**31, so every product of a
32-bit value fits in int64 and nothing relies on overflow): exact and identical on CPU and CUDA. An element is
kept when its 32-bit draw is at least ``round(p · 2**32)``; the mask is built in integers and applied as one
multiply by ``keep / (1 - p)`` in the input's dtype (bf16-safe).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn
from torch.nn import functional as F

from kermt.data.batch import BatchMolGraph
from kermt.registry import DROPOUT_DRAWS

ROW_KINDS = {"atom": 1, "bond": 2, "molecule": 3}
_BITS = 0xFFFFFFFF
_MULTIPLIERS = (0x21F0AAAD, 0x735A2D97)  # both < 2**31: (2**32 - 1) * m < 2**63
_PADDING_MOLECULE = _BITS  # the key of row 0 of atom and bond tensors (zeroed by every site, but drawn anyway)


def hash32(x):
    """The lowbias32 finaliser of values in [0, 2**32): works on Python ints and on int64 tensors alike."""
    x = x ^ (x >> 16)
    x = (x * _MULTIPLIERS[0]) & _BITS
    x = x ^ (x >> 15)
    x = (x * _MULTIPLIERS[1]) & _BITS
    return x ^ (x >> 15)


def combine(*parts: int) -> int:
    """One 32-bit key of several non-negative ints (each folded to 32 bits first), on the host."""
    key = 0
    for part in parts:
        key = hash32(key ^ ((part ^ (part >> 32)) & _BITS))
    return key


def _rows_of(scope: torch.Tensor, num_rows: int, molecule_ids: torch.Tensor) -> torch.Tensor:
    """int64 [num_rows]: hash of (molecule id, position inside the molecule) of every row of an atom or bond
    tensor; row 0 (padding) gets the padding key. Molecule i owns rows ``scope[i, 0] : scope[i, 0] + scope[i, 1]``,
    consecutive from row 1. ``output_size`` keeps the owner computation free of host synchronisation."""
    device = scope.device
    owner = torch.repeat_interleave(torch.arange(scope.shape[0], device=device), scope[:, 1],
                                    output_size=num_rows - 1)
    position = torch.arange(1, num_rows, device=device) - scope[owner, 0]
    keyed = hash32(hash32(molecule_ids[owner] & _BITS) ^ position)
    padding = torch.full((1,), combine(_PADDING_MOLECULE, 0), dtype=torch.int64, device=device)
    return torch.cat([padding, keyed])


class MoleculeDraws:
    """The per-molecule draws of one forward: (seed, global step) and every row's (molecule, position) key.

    ``graph.molecule_ids`` [M] int64 names each molecule of the batch (a dataset or corpus row id: the same
    molecule must carry the same id whatever batch or worker it lands in).
    """

    def __init__(self, seed: int, step: int, graph: BatchMolGraph) -> None:
        if graph.molecule_ids is None:
            raise ValueError("per-molecule dropout needs the batch's molecule_ids (MoleculeSet.batch sets them)")
        ids = graph.molecule_ids
        self.base = combine(seed, step)
        self.next_stream = 0
        self.rows = {
            "atom": _rows_of(graph.a_scope, graph.f_atoms.shape[0], ids),
            "bond": _rows_of(graph.b_scope, graph.f_bonds.shape[0], ids),
            "molecule": hash32(hash32(ids & _BITS)),
        }

    def reserve(self, count: int) -> int:
        """The first of ``count`` consecutive fresh stream numbers."""
        first = self.next_stream
        self.next_stream += count
        return first

    def keep_scale(self, shape: torch.Size, p: float, rows: str, streams: list[int], dtype: torch.dtype,
                   device: torch.device) -> torch.Tensor:
        """``keep / (1 - p)`` in ``dtype``, [len(streams), *shape]: one mask of ``shape`` [R, ...] per stream, rows
        keyed by ``rows``, columns = the flattened trailing dimensions."""
        row_keys = self.rows[rows]
        if row_keys.shape[0] != shape[0]:
            raise ValueError(f"a dropout site over {rows} rows got {shape[0]} rows; the batch has {row_keys.shape[0]}")
        # one scalar op per stream: a tensor of call keys would be a host-to-device copy (a sync on CUDA)
        per_row = torch.stack([hash32(row_keys ^ combine(self.base, s, ROW_KINDS[rows])) for s in streams])  # [S, R]
        columns = hash32(torch.arange(shape[1:].numel(), device=device, dtype=torch.int64))  # [C]
        threshold, scale = round(p * 2**32), 1.0 / (1.0 - p)

        def keep_scale_of(keys: torch.Tensor) -> torch.Tensor:  # [..., R] -> [..., R, C] float32
            return (hash32(keys.unsqueeze(-1) ^ columns) >= threshold).to(torch.float32) * scale

        if torch.device(device).type == "cpu":
            # the same masks, one stream at a time: on CPU each hashing step of all streams at once is a fresh
            # [S, R, C] int64 temporary (100+ MB at the release size) whose page faults cost more than its
            # arithmetic; one stream's fit the allocator's reused memory. A release-size train step ran at 0.75x of
            # torch's draws with the stacked temporaries, 1.03x this way (bench/train_step.py --compare-draws).
            # On a GPU one launch for all streams is the point.
            keep = torch.stack([keep_scale_of(keys) for keys in per_row])
        else:
            keep = keep_scale_of(per_row)
        return keep.to(dtype).view(len(streams), *shape)


_ACTIVE: ContextVar[MoleculeDraws | None] = ContextVar("kermt_molecule_draws", default=None)


@contextmanager
def per_molecule_draws(seed: int, step: int, graph: BatchMolGraph) -> Iterator[MoleculeDraws]:
    """Within the block, every dropout site of the model draws per molecule (see the module docstring)."""
    token = _ACTIVE.set(MoleculeDraws(seed, step, graph))
    try:
        yield _ACTIVE.get()
    finally:
        _ACTIVE.reset(token)


@contextmanager
def dropout_draws(mode: str, seed: int, step: int, graph: BatchMolGraph) -> Iterator[None]:
    """``mode`` "per_molecule": :func:`per_molecule_draws`; "torch": nothing changes (torch's RNG)."""
    if mode not in DROPOUT_DRAWS:
        raise ValueError(f"dropout_draws must be one of {DROPOUT_DRAWS}, got {mode!r}")
    if mode == "torch":
        yield
        return
    with per_molecule_draws(seed, step, graph):
        yield


def active_draws() -> MoleculeDraws | None:
    """The draws of the enclosing :func:`per_molecule_draws` block (None: torch's RNG)."""
    return _ACTIVE.get()


def reserve_streams(count: int) -> int | None:
    """The first of ``count`` fresh stream numbers of the active draws (None: torch's RNG, nothing to reserve)."""
    draws = _ACTIVE.get()
    return None if draws is None else draws.reserve(count)


def dropout(x: torch.Tensor, p: float, training: bool, rows: str, stream: int | None = None) -> torch.Tensor:
    """``F.dropout(x, p, training)`` drawn per molecule inside :func:`per_molecule_draws`; ``x`` [R, ...] with R
    rows of kind ``rows``; ``stream``: a reserved stream (None: the next one). Outside such a block this IS
    ``F.dropout`` (the same RNG calls: upstream's masks)."""
    draws = _ACTIVE.get()
    if draws is None:
        return F.dropout(x, p, training)
    if not training or p == 0.0:
        return x
    stream = draws.reserve(1) if stream is None else stream
    return x * draws.keep_scale(x.shape, p, rows, [stream], x.dtype, x.device)[0]


def stacked_dropout(x: torch.Tensor, p: float, training: bool, rows: str, streams: list[int]) -> torch.Tensor:
    """Per-molecule dropout of ``x`` [S, R, ...], slice s drawn from ``streams[s]``: equal to :func:`dropout` of each
    slice with its stream. Only inside :func:`per_molecule_draws` (torch's RNG would draw in another order)."""
    draws = _ACTIVE.get()
    if draws is None:
        raise RuntimeError("stacked_dropout draws per molecule only: call it inside per_molecule_draws")
    if not training or p == 0.0:
        return x
    return x * draws.keep_scale(x.shape[1:], p, rows, streams, x.dtype, x.device)


class Dropout(nn.Dropout):
    """``nn.Dropout`` over rows of one kind (``"atom"``, ``"bond"`` or ``"molecule"``), per molecule when asked."""

    def __init__(self, p: float, rows: str) -> None:
        super().__init__(p)
        if rows not in ROW_KINDS:
            raise ValueError(f"rows must be one of {tuple(ROW_KINDS)}, got {rows!r}")
        self.rows = rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training, self.rows)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rows={self.rows}"


__all__ = ["DROPOUT_DRAWS", "Dropout", "MoleculeDraws", "ROW_KINDS", "active_draws", "combine", "dropout",
           "dropout_draws", "hash32", "per_molecule_draws", "reserve_streams", "stacked_dropout"]
