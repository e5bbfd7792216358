"""The library an exploration draws from: its SMILES column, row by row (row i of the file is molecule i).

The driver keeps the SMILES column only (Arrow strings: about 50 MB for a million molecules), to name the molecules
a batch acquires and to count the rows. The molecules' graphs and features are computed once, by the first round
that predicts, into ``DIR/library/`` (:func:`featurised_library`, :mod:`ray_app.screening.shards`), which every
round's prediction reads (``ray_app.explore.surrogate``), a resumed exploration's too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from kermt.data.formats import input_format
from kermt.errors import UserError
from kermt.run_layout import RunLayout
from ray_app.screening.files import InputTable

if TYPE_CHECKING:
    from ray_app.explore.config import ExploreConfig
    from ray_app.screening.shards import Shards


@dataclass(frozen=True)
class Library:
    """``path``'s SMILES (``smiles_column``), one per data row."""

    path: str
    smiles_column: str
    smiles_array: pa.Array

    @property
    def rows(self) -> int:
        return len(self.smiles_array)

    def smiles(self, rows: np.ndarray) -> list[str]:
        """The SMILES of data rows ``rows`` ("" for an empty cell), in that order."""
        taken = self.smiles_array.take(pa.array(np.asarray(rows, dtype=np.int64)))
        return ["" if s is None else s for s in taken.to_pylist()]


def smiles_column_of(columns: tuple[str, ...], given: str | None, path: str) -> str:
    """``given``, else the column named smiles (any case), else the first."""
    if given is not None:
        if given not in columns:
            raise UserError(f"--library {path} has no column {given!r}; its columns: {', '.join(columns)}")
        return given
    return next((c for c in columns if c.lower() == "smiles"), columns[0])


def open_library(path: str, smiles_column: str | None) -> Library:
    """The library's SMILES column; a one-line error for a file that is missing, empty or of another format."""
    if "://" not in path and not Path(path).is_file():
        raise UserError(f"--library {path} does not exist or is not a file")
    kind = input_format(path).kind
    if kind not in ("csv", "parquet"):
        raise UserError(f"--library {path}: a {kind} file; give a CSV or Parquet file with a SMILES column")
    table = InputTable.open(path)
    column = smiles_column_of(table.columns, smiles_column, path)
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            read = pq.read_table(path, columns=[column])
        else:
            import pyarrow.csv as pacsv

            read = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
                include_columns=[column], column_types={column: pa.string()}))
    except pa.ArrowInvalid as error:
        raise UserError(f"--library {path}: cannot read it ({' '.join(str(error).split())})") from None
    if read.num_rows == 0:
        raise UserError(f"--library {path} has no molecules (a header only)")
    return Library(path, column, read.column(column).combine_chunks())


def featurised_library(config: ExploreConfig, layout: RunLayout, library: Library,
                       batch_size: int) -> Shards:
    """The library's molecules featurised for ``config``'s surrogates (``DIR/library/``): written by the first call,
    read by every later one (each round, a resumed exploration)."""
    from kermt.chem.standardize import MoleculePrep
    from ray_app.screening.shards import read_shards, write_shards  # torch: only when a round predicts
    from ray_app.screening.stream import InputSpec

    spec = InputSpec(library.smiles_column, features_generator=tuple(config.features_generator or ()),
                     prep=MoleculePrep(config.standardize, config.max_heavy_atoms))
    shards = read_shards(layout.explore_library)
    if shards is not None and shards.spec == spec and shards.rows == library.rows:
        return shards
    return write_shards(InputTable.open(library.path), spec, layout.explore_library, config.address, batch_size)


__all__ = ["Library", "featurised_library", "open_library", "smiles_column_of"]
