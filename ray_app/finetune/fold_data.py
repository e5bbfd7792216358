"""Each fold's training data as shard files in the run's storage, which every training worker reads itself.

Ray tasks write a fold's train and val splits (scaled, as the model reads them) once, from the fold's object, under
``STORAGE/<run id>-data/fold_k/{train,val}/`` (kermt.data.molecule_shards: Parquet shards + manifest.json; the
storage is ``--storage_path``, a URI on a multi-node cluster, or save_dir/ray_results on one machine). A member's
workers then read only what their global batches need, a window of shards at a time with the next read ahead
(kermt.data.shard_stream over the member's kermt.data.shard_plan), and of the validation split every molecule's
targets and the shards that hold the chunks the rank predicts (kermt.train.loop.rank_validation). No node holds
a fold because a member trains there, and no worker receives a fold through the object store. What travels with
each member is :class:`FoldData`: the directories, the manifests and two bytes per training molecule (its largest
atom degree, for the width histogram of the planned batches).

The test split is written too (``fold_k/test/``, its labels raw as the test molecules keep them), with what the
step after training needs that the shards do not hold: the test labels in float64, which the scores read unscaled
(eight bytes per test molecule and task), and the fold's scalers. That step, one Ray task per fold
(ray_app.finetune.after_training), then reads the fold from its shards alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import ray
from pyarrow.fs import FileType
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kermt.data.atomic_files import filesystem, join
from kermt.data.dataset import MoleculeSet
from kermt.data.molecule_shards import SHARD_ROWS, WINDOW, SplitManifest, TrainingSource, ValidationSource, \
    max_degrees, read_split_shard, read_split_targets, write_split
from kermt.data.scalers import StandardScaler
from kermt.run_layout import fold_name
from ray_app.common.node_reads import NodeRead, reading_node
from ray_app.finetune.prepare import ScaledSplits


@dataclass(frozen=True)
class SplitShards:
    """One split's shards: where (``directory``, local or URI), what (``manifest``), read on ``node`` when only its
    disk has them (None: wherever the reader runs)."""

    directory: str
    manifest: SplitManifest
    node: str | None = None

    def load(self) -> NodeRead:
        return NodeRead(partial(read_split_shard, self.directory, self.manifest), self.node)

    def targets(self) -> np.ndarray:
        """float32 [n, tasks]: every molecule's targets, as written (one column of each shard)."""
        targets = NodeRead(partial(read_split_targets, self.directory, self.manifest), self.node)
        return np.concatenate([targets(i) for i in range(len(self.manifest.files))])

    def sets(self) -> Iterator[MoleculeSet]:
        """The split's shards in order, each read when the one before has been let go of by the caller."""
        load = self.load()
        return (load(i) for i in range(len(self.manifest.files)))

    def validation_source(self) -> ValidationSource:
        """The split as a validation split is read: its targets now (one column of each shard), its molecules
        when a rank takes the rows it predicts."""
        return ValidationSource(self.manifest.rows, self.load(), self.targets())


@dataclass(frozen=True)
class FoldData:
    """A fold's train and val shards, and each training molecule's largest atom degree; from ``write_folds``, its
    test shards, raw test labels and scalers too (None from :func:`write_fold_data`, which writes train and val)."""

    train: SplitShards
    val: SplitShards
    train_degrees: np.ndarray
    window: int = WINDOW  # shards shuffled together (kermt.data.molecule_shards.WINDOW)
    test: SplitShards | None = None
    test_targets_raw: np.ndarray | None = None  # float64 [n_test, tasks], as ScaledSplits.test_targets_raw
    target_scaler: StandardScaler | None = None
    features_scaler: StandardScaler | None = None

    @property
    def features_width(self) -> int:
        """Molecule-feature columns the fold's model takes (its train manifest's)."""
        return self.train.manifest.features_width

    def train_source(self) -> TrainingSource:
        return TrainingSource(self.train.manifest.rows, self.train.load(), self.train_degrees, self.window)


def run_data_dir(storage: str, run_id: str) -> str:
    """Where a run's fold shards live, beside its Tune experiments in the storage."""
    return join(storage, f"{run_id}-data")


def fold_data_dir(storage: str, run_id: str, fold: int) -> str:
    return join(run_data_dir(storage, run_id), fold_name(fold))


def write_folds(storage: str, run_id: str, fold_refs: Sequence[ray.ObjectRef],
                shard_rows: int = SHARD_ROWS) -> list[FoldData]:
    """Every fold's shards, each written by a Ray task from the fold's object (called on the driver, connected,
    which reads no fold: it gets back what each member needs, :class:`FoldData`). A local storage on a multi-node
    cluster is the driver's disk: the tasks then run on its node, at 0 CPUs (a head may have none); elsewhere Ray's
    locality-aware scheduling prefers the node that holds the fold's object (the driver's). ``shard_rows``: molecules
    a shard (smaller in tests and benches, for splits of several shards)."""
    node = reading_node([run_data_dir(storage, run_id)])
    writer = _write_fold if node is None else _write_fold.options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
    return ray.get([writer.remote(storage, run_id, fold, ref, node, shard_rows) for fold, ref in enumerate(fold_refs)])


@ray.remote(num_cpus=1)
def _write_fold(storage: str, run_id: str, fold: int, splits: ScaledSplits, node: str | None,
                shard_rows: int) -> FoldData:
    # ``splits``: the fold's object, its arrays read zero-copy from this node's object store
    data = _write_splits(fold_data_dir(storage, run_id, fold), splits.train, splits.val, shard_rows, node)
    test = join(fold_data_dir(storage, run_id, fold), "test")
    return replace(data, test=SplitShards(test, write_split(test, splits.test, shard_rows), node),
                   test_targets_raw=np.asarray(splits.test_targets_raw, dtype=np.float64),
                   target_scaler=splits.target_scaler, features_scaler=splits.features_scaler)


def remove_folds(storage: str, run_id: str) -> None:
    """Delete the run's shards once its members are trained (a re-run writes them again before training)."""
    fs, inner = filesystem(run_data_dir(storage, run_id))
    if fs.get_file_info(inner).type != FileType.NotFound:
        fs.delete_dir(inner)


def write_fold_data(storage: str, run_id: str, fold: int, train: MoleculeSet, val: MoleculeSet,
                    shard_rows: int = SHARD_ROWS) -> FoldData:
    """Write ``fold``'s train and val splits as shards in the run's storage (called on the driver, connected)."""
    directory = fold_data_dir(storage, run_id, fold)
    return _write_splits(directory, train, val, shard_rows, reading_node([directory]))


def _write_splits(directory: str, train: MoleculeSet, val: MoleculeSet, shard_rows: int,
                  node: str | None) -> FoldData:
    shards = {name: SplitShards(join(directory, name), write_split(join(directory, name), split, shard_rows), node)
              for name, split in (("train", train), ("val", val))}
    return FoldData(shards["train"], shards["val"], max_degrees(train))


__all__ = ["FoldData", "SplitShards", "fold_data_dir", "remove_folds", "write_fold_data", "write_folds"]
