"""The library an exploration draws from: its SMILES column, row by row (row i of the file is molecule i).

The driver never holds the library. It counts the rows once, when the exploration starts (a Parquet file's footer
says; a CSV is read through once). The molecules' graphs and features are computed once, by the first round that
predicts, into ``DIR/library/`` (:func:`featurised_library`, :mod:`ray_app.screening.shards`), which every round's
prediction reads (``ray_app.explore.surrogate``), a resumed exploration's too. A batch's SMILES
(:func:`batch_smiles`) come from those shards' SMILES column, reading only the shards that hold the batch's rows;
before they exist (round 0) or without them (--acquisition random), from the file: :meth:`Library.smiles` streams
its SMILES column once, one block at a time, keeping only the rows asked for, with the reader of the in-process
featurisation (``ray_app.screening.local.read_blocks``), whose rows are the file's data rows in order, as Ray Data's
are.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from kermt.data.formats import input_format
from kermt.errors import UserError
from kermt.explore.objective_spec import ObjectiveSpec
from kermt.explore.scorers import lookup_scorer
from kermt.run_layout import RunLayout
from ray_app.screening.files import InputTable, filesystem_of

if TYPE_CHECKING:
    from ray_app.explore.config import ExploreConfig
    from ray_app.screening.shards import Shards

READ_ROWS = 65_536  # rows of the SMILES column held at once while the file is read through
SHARD_SMILES = "smiles"  # a shard's column of the library's SMILES as written (featurize_block names it)
# Opening a shard for its SMILES costs what 2,000-20,000 rows of a pass over the library file cost (a shard of 1,024
# rows 0.4-0.5 ms, a row of a 10^6-row CSV 0.08-0.19 us at load 7; 2.3-6.6 ms and 0.3-1.3 us at load 23-27:
# bench/explore_scale.py --smiles_rows 1000000), so a batch's SMILES come from the shards only where it touches few
# of them: a fixed-size batch of a big library (1,000 rows of 10^9: 1,000 shards, not a pass over 10^9 rows), not
# 1 % of any library (every shard).
ROWS_PER_SHARD_READ = 10_000


@dataclass(frozen=True)
class Library:
    """``path``'s SMILES column (``smiles_column``): ``rows`` data rows, read from the file when asked, never held."""

    path: str
    smiles_column: str
    rows: int

    def smiles(self, rows: np.ndarray) -> list[str]:
        """The SMILES of data rows ``rows`` ("" for an empty cell), in that order: one pass over the column that
        stops after the last row asked for, holding a block and the rows asked for."""
        wanted = np.asarray(rows, dtype=np.int64)
        order = np.argsort(wanted, kind="stable")
        ascending = wanted[order]
        found = [""] * len(wanted)
        start, taken = 0, 0
        for block in self._blocks() if len(wanted) else ():
            end = start + block.num_rows
            upto = int(np.searchsorted(ascending, end))
            if upto > taken:
                cells = block.column(0).take(pa.array(ascending[taken:upto] - start)).to_pylist()
                for position, cell in zip(order[taken:upto], cells):
                    found[position] = cell or ""
                taken = upto
            if taken == len(wanted):
                break
            start = end
        return found

    def smiles_blocks(self) -> Iterator[list[str]]:
        """Every row's SMILES ("" for an empty cell), in order, one block of READ_ROWS rows at a time."""
        for block in self._blocks():
            yield ["" if s is None else s for s in block.column(0).to_pylist()]

    def _blocks(self) -> Iterator[pa.Table]:
        from ray_app.screening.local import read_blocks  # torch: imported with the reader the featurisation uses

        return read_blocks(InputTable.open(self.path), (self.smiles_column,), READ_ROWS)


def smiles_column_of(columns: tuple[str, ...], given: str | None, path: str) -> str:
    """``given``, else the column named smiles (any case), else the first."""
    if given is not None:
        if given not in columns:
            raise UserError(f"--library {path} has no column {given!r}; its columns: {', '.join(columns)}")
        return given
    return next((c for c in columns if c.lower() == "smiles"), columns[0])


def open_library(path: str, smiles_column: str | None) -> Library:
    """The library, its rows counted; a one-line error for a file that is missing, empty or of another format."""
    if "://" not in path and not Path(path).is_file():
        raise UserError(f"--library {path} does not exist or is not a file")
    kind = input_format(path).kind
    if kind not in ("csv", "parquet"):
        raise UserError(f"--library {path}: a {kind} file; give a CSV or Parquet file with a SMILES column")
    table = InputTable.open(path)
    column = smiles_column_of(table.columns, smiles_column, path)
    try:
        rows = _count_rows(table, column)
    except pa.ArrowInvalid as error:  # a CSV that cannot be split is malformed_csv's error, naming the file
        raise UserError(f"--library {path}: cannot read it ({' '.join(str(error).split())})") from None
    if rows == 0:
        raise UserError(f"--library {path} has no molecules (a header only)")
    return Library(path, column, rows)


def _count_rows(table: InputTable, column: str) -> int:
    if table.format.kind == "parquet":
        import pyarrow.parquet as pq

        filesystem, inner = filesystem_of(table.path)
        with filesystem.open_input_file(inner) as handle:
            return pq.ParquetFile(handle).metadata.num_rows
    from ray_app.screening.local import count_rows

    return count_rows(table, column)


def featurised_library(config: ExploreConfig, layout: RunLayout, library: Library, batch_size: int,
                       engine: str | None = None) -> Shards:
    """The library's molecules featurised for ``config``'s surrogates (``DIR/library/``): written by the first call
    (on ``engine``, None: --engine auto's choice), read by every later one (each round, a resumed exploration)."""
    from kermt.chem.standardize import MoleculePrep
    from ray_app.screening.shards import read_shards, write_shards  # torch: only when a round predicts
    from ray_app.screening.stream import InputSpec

    spec = InputSpec(library.smiles_column, features_generator=tuple(config.features_generator or ()),
                     prep=MoleculePrep(config.standardize, config.max_heavy_atoms))
    shards = read_shards(layout.explore_library)
    if shards is not None and shards.spec == spec and shards.rows == library.rows:
        return shards
    return write_shards(InputTable.open(library.path), spec, layout.explore_library, config.address, batch_size,
                        engine)


def batch_smiles(layout: RunLayout, library: Library, rows: np.ndarray,
                 rows_per_shard_read: int = ROWS_PER_SHARD_READ) -> list[str]:
    """The SMILES of library rows ``rows`` ("" for an empty cell), in that order: from the featurised library
    (``DIR/library/``, the SMILES column of only the shards that hold those rows) when it exists and the batch
    touches at most one shard per ``rows_per_shard_read`` library rows; else from the library file
    (:meth:`Library.smiles`: round 0, --acquisition random, a batch spread over most shards, shards whose manifest
    predates its rows per shard)."""
    from ray_app.screening.shards import read_shards  # torch: as every round that trains a surrogate

    shards = read_shards(layout.explore_library)
    if shards is None or shards.rows != library.rows or len(shards.shard_rows) != len(shards.files) or \
            len(np.unique(shards.holding(rows))) * rows_per_shard_read > library.rows:
        return library.smiles(rows)
    return [cell or "" for cell in shards.take(rows, SHARD_SMILES)]


__all__ = ["Library", "batch_smiles", "featurised_library", "open_library", "smiles_column_of",
           "write_lookup_scores"]


def write_lookup_scores(spec: ObjectiveSpec, layout: RunLayout, library: Library) -> None:
    """For a lookup objective (a retrospective study: every library row's score is known), the score of every row
    (NaN: none) in ``DIR/library_lookup_scores.npy``, once: the report's exact random baseline reads it
    (ray_app.report.explore), so neither the report nor a rebuild reads the library and the lookup file again."""
    target = layout.explore_lookup_scores
    if spec.kind != "lookup" or target.exists():
        return
    # the lookup file's scores are held (a dict of its SMILES), the library's SMILES one block at a time: each
    # block's scores go straight to the file, after np.save's header for library.rows float64s (the same bytes)
    known = lookup_scorer(spec).known_scores()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    written = 0
    with open(partial, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float64)),
                                                      "fortran_order": False, "shape": (library.rows,)})
        for block in library.smiles_blocks():
            handle.write(np.array([known.get(s, math.nan) for s in block], dtype=np.float64).tobytes())
            written += len(block)
    if written != library.rows:
        raise UserError(f"--library {library.path} changed while it was read ({written:,} rows, "
                        f"{library.rows:,} when the exploration started)")
    partial.replace(target)
