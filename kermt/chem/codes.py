"""Compact feature rows: one small integer per one-hot block, a bit word for 0/1 columns, real values verbatim.

An atom row is 151 float32 (604 bytes) but carries 7 one-hot blocks, 11 flags and one real value (mass / 100);
kept as 7 uint8 codes + a uint16 flag word + one float32 it is 13 bytes. A bond row (14 float32, 56 bytes) is
2 uint8 codes + a uint8 flag word: 3 bytes. :meth:`RowLayout.expand` writes the float rows back, bit for bit:
ones and zeros are exact in float32, and real-valued columns are stored as the float32 they were.

:meth:`RowLayout.encode` refuses rows it cannot give back exactly (a value other than 0/1 in a one-hot or flag
column, two ones in a block), so the store is lossless by construction, not by assumption.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kermt.chem.features import (
    ATOM_FDIM,
    ATOM_FLAG_COLUMNS,
    ATOM_ONE_HOT_BLOCKS,
    ATOM_VALUE_COLUMNS,
    BOND_FLAG_COLUMNS,
    BOND_ONE_HOT_BLOCKS,
    BOND_ONLY_FDIM,
)


@dataclass(frozen=True)
class CodedRows:
    """n feature rows of a :class:`RowLayout` with G one-hot blocks, F flags and V real-valued columns.

    codes   uint8 [n, G]    0: no column of the block is set; k >= 1: the block's k-th column (1-based) is 1
    flags   uint8 or uint16 [n]   bit i set: flag column i is 1
    values  float32 [n, V]  the real-valued columns, verbatim
    """

    codes: np.ndarray
    flags: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.flags.nbytes + self.values.nbytes

    def take(self, index: np.ndarray) -> "CodedRows":
        """The rows at ``index`` (a gather)."""
        return CodedRows(self.codes[index], self.flags[index], self.values[index])

    @staticmethod
    def concat(parts: Sequence["CodedRows"]) -> "CodedRows":
        return CodedRows(*(np.concatenate([getattr(p, name) for p in parts]) for name in ("codes", "flags", "values")))


@dataclass(frozen=True)
class RowLayout:
    """Which columns of a ``width``-wide feature row are one-hot blocks, 0/1 flags and real values.

    blocks: (first column, number of columns) per one-hot block. Every column belongs to exactly one group.
    """

    width: int
    blocks: tuple[tuple[int, int], ...]
    flag_columns: tuple[int, ...]
    value_columns: tuple[int, ...]

    def __post_init__(self) -> None:
        columns = [c for start, n in self.blocks for c in range(start, start + n)]
        columns += [*self.flag_columns, *self.value_columns]
        if sorted(columns) != list(range(self.width)) or max(n for _, n in self.blocks) > 255:
            raise ValueError(f"layout does not cover columns 0..{self.width - 1} exactly once")

    @property
    def flag_dtype(self) -> type:
        return np.uint8 if len(self.flag_columns) <= 8 else np.uint16

    def empty(self) -> CodedRows:
        return CodedRows(np.zeros((0, len(self.blocks)), np.uint8), np.zeros(0, self.flag_dtype),
                         np.zeros((0, len(self.value_columns)), np.float32))

    def expand(self, rows: CodedRows) -> np.ndarray:
        """The float rows: float32 [n, width]."""
        n = len(rows)
        out = np.zeros((n, self.width), dtype=np.float32)
        starts = np.array([start for start, _ in self.blocks], dtype=np.int64)
        row, block = np.nonzero(rows.codes)
        out[row, starts[block] + rows.codes[row, block].astype(np.int64) - 1] = 1.0
        bits = (rows.flags[:, None] >> np.arange(len(self.flag_columns), dtype=rows.flags.dtype)) & 1
        out[:, list(self.flag_columns)] = bits
        out[:, list(self.value_columns)] = rows.values
        return out

    def encode(self, dense: np.ndarray) -> CodedRows:
        """float32 [n, width] -> CodedRows; ValueError if the rows cannot be given back bit for bit."""
        dense = np.asarray(dense, dtype=np.float32).reshape(-1, self.width)
        codes = np.zeros((len(dense), len(self.blocks)), dtype=np.uint8)
        for g, (start, n) in enumerate(self.blocks):
            block = dense[:, start:start + n]
            codes[:, g] = np.where(block.any(axis=1), block.argmax(axis=1) + 1, 0)
        flags = np.zeros(len(dense), dtype=self.flag_dtype)
        for bit, column in enumerate(self.flag_columns):
            flags |= (dense[:, column] != 0).astype(self.flag_dtype) << bit
        coded = CodedRows(codes, flags, np.ascontiguousarray(dense[:, list(self.value_columns)]))
        # The definitive check: bits of the expansion equal the input's (catches 0.5, -0.0, two ones, NaN).
        if not np.array_equal(self.expand(coded).view(np.uint32), dense.view(np.uint32)):
            raise ValueError("feature rows are not one-hot/flag/value rows of this layout; cannot store them exactly")
        return coded


ATOM_LAYOUT = RowLayout(ATOM_FDIM, ATOM_ONE_HOT_BLOCKS, ATOM_FLAG_COLUMNS, ATOM_VALUE_COLUMNS)
BOND_LAYOUT = RowLayout(BOND_ONLY_FDIM, BOND_ONE_HOT_BLOCKS, BOND_FLAG_COLUMNS, ())


def index_dtype(largest: int) -> type:
    """Smallest dtype for local indices below ``largest`` (atoms or bonds of one molecule): uint16, else int32."""
    return np.uint16 if largest <= np.iinfo(np.uint16).max + 1 else np.int32


__all__ = ["ATOM_LAYOUT", "BOND_LAYOUT", "CodedRows", "RowLayout", "index_dtype"]
