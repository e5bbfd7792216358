"""A finetune split (a :class:`~kermt.data.dataset.MoleculeSet`, scaled) as Parquet shards, and the training source a
member loop reads its global batches from.

Layout of a split's directory (local or URI)::

    shard_000000.parquet ...   one row per molecule, in the split's order: smiles, atom_counts, bond_counts, the
                               compact graph store's list columns (FlatGraphs.to_arrays), features and targets as
                               float32 lists (NaN: a missing label)
    manifest.json              written last: the shards' files and row counts, the features' and targets' widths

:class:`TrainingSource` is what the loop needs of a training split: its shards' row counts (the epoch plan,
:class:`~kermt.data.shard_plan.ShardPlan`), how to read shard i, and each molecule's largest atom degree (the
neighbour-width histogram of its planned batches, one byte a molecule). A set held in memory is the source of one
shard (:meth:`TrainingSource.whole`); both go through the same plan and the same batch code.
:class:`ValidationSource` is what it needs of a validation split: every molecule's targets, and the molecules of
the rows one rank predicts, read from their shards only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kermt.chem.molgraph import RAGGED_WIDTH, FlatGraphs
from kermt.data.atomic_files import filesystem, join, read_text, write_atomically, write_text
from kermt.data.dataset import MoleculeSet
from kermt.data.ragged import flat_values, list_column, offsets_of
from kermt.data.shard_plan import ShardPlan

MANIFEST_FILE = "manifest.json"
SHARD_ROWS = 25_000  # molecules a shard: ~12 MB of graph arrays (docs/library.md: ~495 bytes a molecule)
WINDOW = 4  # shards shuffled together: a split of up to WINDOW x SHARD_ROWS molecules is one full shuffle


def shard_name(index: int) -> str:
    return f"shard_{index:06d}.parquet"


def molecule_table(molecules: MoleculeSet) -> pa.Table:
    arrays, n = molecules.graphs.to_arrays(), len(molecules)
    columns = {"smiles": pa.array(list(molecules.smiles), pa.string()),
               "atom_counts": pa.array(molecules.graphs.atom_counts),
               "bond_counts": pa.array(molecules.graphs.bond_counts)}
    for name in RAGGED_WIDTH:
        counts = molecules.graphs.atom_counts if name.startswith("atom_") else molecules.graphs.bond_counts
        columns[name] = list_column(arrays[name], offsets_of(counts))
    features = molecules.features if molecules.features is not None else np.zeros((n, 0), np.float32)
    columns["features"] = list_column(features.astype(np.float32), offsets_of(np.ones(n, np.int64)))
    columns["targets"] = list_column(molecules.targets.astype(np.float32), offsets_of(np.ones(n, np.int64)))
    return pa.table(columns)


def molecules_from_table(table: pa.Table, features_width: int, task_count: int) -> MoleculeSet:
    n = table.num_rows
    arrays = {name: flat_values(table, name) for name in RAGGED_WIDTH}
    arrays.update({name: table.column(name).to_numpy() for name in ("atom_counts", "bond_counts")})
    features = flat_values(table, "features").astype(np.float32, copy=False).reshape(n, features_width)
    targets = flat_values(table, "targets").astype(np.float32, copy=False).reshape(n, task_count)
    return MoleculeSet(FlatGraphs.from_arrays(arrays), features if features_width else None, targets,
                       tuple(table.column("smiles").to_pylist()))


@dataclass(frozen=True)
class SplitManifest:
    """What a reader needs before reading a shard: its files and row counts, the widths of features and targets."""

    files: tuple[str, ...]
    rows: tuple[int, ...]
    features_width: int
    task_count: int

    def to_json(self) -> str:
        return json.dumps({"files": list(self.files), "rows": list(self.rows), "features_width": self.features_width,
                           "task_count": self.task_count}) + "\n"

    @classmethod
    def read(cls, directory: str) -> "SplitManifest":
        data = json.loads(read_text(join(directory, MANIFEST_FILE)))
        return cls(tuple(data["files"]), tuple(data["rows"]), data["features_width"], data["task_count"])


def write_split(directory: str, molecules: MoleculeSet, shard_rows: int = SHARD_ROWS) -> SplitManifest:
    """``molecules`` as shards of ``shard_rows`` under ``directory`` (local or URI), manifest last."""
    starts = list(range(0, len(molecules), shard_rows)) or [0]
    files, rows = [], []
    for index, start in enumerate(starts):
        part = molecules.take(np.arange(start, min(start + shard_rows, len(molecules))))
        table = molecule_table(part)
        write_atomically(join(directory, shard_name(index)),
                         lambda fs, tmp, table=table: pq.write_table(table, tmp, filesystem=fs, compression="zstd"))
        files.append(shard_name(index))
        rows.append(len(part))
    features_width = molecules.features.shape[1] if molecules.features is not None else 0
    manifest = SplitManifest(tuple(files), tuple(rows), features_width, molecules.targets.shape[1])
    write_text(join(directory, MANIFEST_FILE), manifest.to_json())
    return manifest


def read_split_shard(directory: str, manifest: SplitManifest, index: int) -> MoleculeSet:
    """Shard ``index`` of the split at ``directory``; ValueError when it does not hold the rows the manifest says."""
    fs, inner = filesystem(join(directory, manifest.files[index]))
    molecules = molecules_from_table(pq.read_table(inner, filesystem=fs), manifest.features_width,
                                     manifest.task_count)
    if len(molecules) != manifest.rows[index]:
        raise ValueError(f"{join(directory, manifest.files[index])}: {len(molecules)} rows, the manifest says "
                         f"{manifest.rows[index]}")
    return molecules


def read_split_targets(directory: str, manifest: SplitManifest, index: int) -> np.ndarray:
    """float32 [rows, tasks]: shard ``index``'s targets alone (its one column read: no graphs, no SMILES)."""
    fs, inner = filesystem(join(directory, manifest.files[index]))
    table = pq.read_table(inner, filesystem=fs, columns=["targets"])
    return flat_values(table, "targets").astype(np.float32, copy=False).reshape(table.num_rows, manifest.task_count)


def read_split(directory: str, manifest: SplitManifest | None = None) -> MoleculeSet:
    """Every shard of a split, joined."""
    manifest = manifest or SplitManifest.read(directory)
    return MoleculeSet.concat([read_split_shard(directory, manifest, i) for i in range(len(manifest.files))])


def max_degrees(molecules: MoleculeSet) -> np.ndarray:
    """uint16 [n]: each molecule's largest atom in-degree, at least 1 (its own neighbour width)."""
    return np.maximum(molecules.graphs.max_in_degrees(), 1).astype(np.uint16)


@dataclass(frozen=True)
class _Whole:
    """The load of a set held in memory: its one shard is itself."""

    molecules: MoleculeSet

    def __call__(self, index: int) -> MoleculeSet:
        return self.molecules


@dataclass(frozen=True)
class TrainingSource:
    """A member's training split as the loop reads it: ``load(i)`` gives shard i (``shard_rows[i]`` molecules, in
    the split's order); ``degrees`` each molecule's largest atom degree."""

    shard_rows: tuple[int, ...]
    load: Callable[[int], MoleculeSet]
    known_degrees: np.ndarray | None = None  # None: a set in memory, whose degrees are computed when asked
    window: int = WINDOW

    @classmethod
    def whole(cls, molecules: MoleculeSet) -> "TrainingSource":
        return cls((len(molecules),), _Whole(molecules))

    @property
    def degrees(self) -> np.ndarray:
        return self.known_degrees if self.known_degrees is not None else max_degrees(self.load(0))

    def __len__(self) -> int:
        return int(sum(self.shard_rows))

    def plan(self, seed: int) -> ShardPlan:
        """The epoch plan of a member seeded ``seed`` (every molecule trains: the validation split is its own)."""
        return ShardPlan(self.shard_rows, seed, 0.0, self.window)


@dataclass(frozen=True)
class ValidationSource:
    """A validation split as the loop reads it: every molecule's targets (each rank scores all of them, a few bytes
    a molecule) and, read from the shards that hold them, the molecules of the rows one rank predicts (``take``).
    A set held in memory serves the loop the same way (it has ``targets``, ``take`` and ``len``)."""

    shard_rows: tuple[int, ...]
    load: Callable[[int], MoleculeSet]
    targets: np.ndarray

    def __len__(self) -> int:
        return len(self.targets)

    def take(self, rows: np.ndarray) -> MoleculeSet:
        """The molecules at ``rows`` (ascending): each shard holding some of them read once, one at a time, and
        only its rows among them kept."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0 or np.any(np.diff(rows) < 0):
            raise ValueError("a validation source takes a non-empty, ascending set of rows")
        offsets = np.concatenate([[0], np.cumsum(np.asarray(self.shard_rows, dtype=np.int64))])
        shard_of = np.searchsorted(offsets, rows, side="right") - 1
        return MoleculeSet.concat([self.load(int(s)).take(rows[shard_of == s] - offsets[s])
                                   for s in np.unique(shard_of)])


def training_source(train: MoleculeSet | TrainingSource) -> TrainingSource:
    """The one rule: a set held in memory trains as a one-shard source."""
    return train if isinstance(train, TrainingSource) else TrainingSource.whole(train)


__all__ = ["MANIFEST_FILE", "SHARD_ROWS", "WINDOW", "SplitManifest", "TrainingSource", "ValidationSource",
           "max_degrees", "molecule_table", "molecules_from_table", "read_split", "read_split_shard",
           "read_split_targets", "training_source", "write_split"]
