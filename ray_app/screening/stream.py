"""Streaming screening on Ray Data: read -> validate + featurise (CPU tasks) -> model (actor pool) -> driver writes.

    read_csv / read_parquet (lazy; SMILES + id columns, as strings)
      -> repartition(rows_per_block, strict=True)          small raw blocks, so featurising pipelines well
      -> map_batches(featurize_block)                      CPU tasks, per molecule (order-free work)
      -> repartition(rows_per_block, strict=True)          blocks of exactly rows_per_block rows, in input order
      -> map_batches(PredictStage | EmbedStage)            actor pool (StageFromObjectStore); one model load per
                                                           actor; GPU when asked
      -> iter_batches on the driver                        appended to the output file in input order

Batch composition: a molecule's number depends on the molecule and the model only (each is computed at its
reference width, kermt.inference.widths), so neither blocks nor actors change a number. The strict repartition is
for ``--upstream_batching``, where upstream's numbers depend on which molecules share a batch (the padding row takes
part in neighbour sums, docs/numerics.md#batch-composition): ``rows_per_block`` is a multiple of ``batch_size`` and
``preserve_order`` is on (``ray_app.common.cluster.connect``), so every block starts at an input row that is a
multiple of ``batch_size`` and the model sees "the valid molecules among input rows [k·B, (k+1)·B)" whatever the
number of actors, the reader's block sizes or the cluster. With no invalid rows that is exactly upstream's batching
(upstream drops invalid rows first, so with invalid rows its batches shift; drop them beforehand to reproduce
upstream bit for bit).

Memory: the reader streams the file, Ray Data bounds the blocks in flight (backpressure) and the driver writes each
block as it arrives, so peak memory does not grow with the input size (``--features_path`` is the exception: an
``.npz`` is read whole and joined to the rows with ``Dataset.zip``, which materialises the SMILES column; zip is
deprecated from Ray 2.64, which suggests a join on a row key instead).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import torch

from kermt.checkpoint import Checkpoint
from kermt.chem.standardize import MoleculePrep
from kermt.chem.validation import reason_kind
from kermt.data.featurize import FeaturizedMolecules
from kermt.errors import UserError, find_cause
from kermt.inference import Embedder, Ensemble
from kermt.inference.attributions import Attributor, unavailable_reason
from kermt.inference.columns import MODEL_SMILES_COLUMN, OutputPlan, filled_rows, prediction_columns
from kermt.uncertainty.domain import DomainIndex, DomainScorer
from kermt.data.arrow_molecules import FeaturizeBatch, molecules_from_table
from ray_app.common.progress import Progress
from ray_app.screening.config import ScreeningConfig
from ray_app.screening.files import malformed_csv

if TYPE_CHECKING:
    from ray_app.screening.files import InputTable

ID_PREFIX = "id::"  # id columns travel under a prefix so they can never collide with our own columns
LABEL_PREFIX = "label::"  # label columns (kermt eval) keep theirs in the output, for the scorer to take
FILE_FEATURES, FILE_FEATURES_VALID = "file_features", "file_features_valid"
NO_FILE_FEATURES = "no features for this row in --features_path"
TARGET_ROWS_PER_BLOCK = 1024
FEATURIZE_CPUS = 0.5


def rows_per_block(batch_size: int, target: int = TARGET_ROWS_PER_BLOCK) -> int:
    """The multiple of ``batch_size`` nearest to ``target`` (at least one batch)."""
    return batch_size * max(1, round(target / batch_size))


def _canonical(smiles: Sequence[str]) -> list[str | None]:
    """Canonical SMILES, None where invalid (the featuriser then says why, once; RDKit's log stays quiet)."""
    from rdkit import Chem, rdBase

    out = []
    with rdBase.BlockLogs():
        for s in smiles:
            mol = Chem.MolFromSmiles(s) if s else None
            out.append(Chem.MolToSmiles(mol) if mol is not None and mol.GetNumHeavyAtoms() > 0 else None)
    return out


@dataclass(frozen=True)
class InputSpec:
    """What the featurise stage reads and computes. ``canonical``: graphs from canonical SMILES (upstream's
    extract_embeddings does this), which are also kept as a column. ``prep``: the heavy-atom limit and the model's
    standardisation (a model that standardises gets a ``model_smiles`` column)."""

    smiles_column: str
    id_columns: tuple[str, ...] = ()
    features_generator: tuple[str, ...] = ()
    canonical: bool = False
    file_features: bool = False
    label_columns: tuple[str, ...] = ()
    prep: MoleculePrep = MoleculePrep()

    @property
    def read_columns(self) -> list[str]:
        """The input columns the stream reads, each once."""
        return list(dict.fromkeys([self.smiles_column, *self.id_columns, *self.label_columns]))


def featurize_block(batch: pa.Table, spec: InputSpec) -> pa.Table:
    """map_batches function (CPU task): raw rows -> one featurised row each (invalid rows keep a reason)."""
    smiles = [s or "" for s in batch.column(spec.smiles_column).cast(pa.string()).to_pylist()]
    canonical = _canonical(smiles) if spec.canonical else None
    graph_smiles = [c or s for c, s in zip(canonical, smiles)] if canonical else smiles
    rows = pa.array(np.arange(len(smiles), dtype=np.int64))
    table = FeaturizeBatch(spec.features_generator, spec.prep)(pa.table({"row": rows, "smiles": graph_smiles}))
    table = table.drop_columns(["row"] if spec.prep.standardizes else ["row", MODEL_SMILES_COLUMN])
    table = table.set_column(table.schema.get_field_index("smiles"), "smiles", pa.array(smiles, pa.string()))
    if spec.file_features:
        table = _attach_file_features(table, batch)
    if canonical is not None:
        table = table.append_column("canonical_smiles", pa.array(canonical, pa.string()))
    for prefix, names in ((ID_PREFIX, spec.id_columns), (LABEL_PREFIX, spec.label_columns)):
        for name in names:
            table = table.append_column(prefix + name, batch.column(name).cast(pa.string()))
    return table


def _attach_file_features(table: pa.Table, batch: pa.Table) -> pa.Table:
    """Replace the (empty) generated features by the rows of ``--features_path``; rows without them are invalid."""
    has = batch.column(FILE_FEATURES_VALID).to_numpy(zero_copy_only=False).astype(bool)
    reasons = [r if r or ok else NO_FILE_FEATURES for r, ok in zip(table.column("reason").to_pylist(), has)]
    table = table.set_column(table.schema.get_field_index("features"), "features",
                             batch.column(FILE_FEATURES).cast(pa.large_list(pa.float64())))
    return table.set_column(table.schema.get_field_index("reason"), "reason", pa.array(reasons, pa.string()))


def carried_columns(table: pa.Table, molecules: FeaturizedMolecules) -> dict[str, pa.Array]:
    """Columns every output keeps: ids (their own names), labels (``label::<name>``), ``valid``, ``error`` (empty
    when valid) and, for a model that standardises, ``model_smiles`` (empty where the input is what it saw)."""
    out = {name[len(ID_PREFIX):]: table.column(name) for name in table.column_names if name.startswith(ID_PREFIX)}
    out.update({name: table.column(name) for name in table.column_names if name.startswith(LABEL_PREFIX)})
    out["valid"] = pa.array(molecules.valid)
    out["error"] = pa.array([r or "" for r in molecules.reasons], pa.string())
    if MODEL_SMILES_COLUMN in table.column_names:
        out[MODEL_SMILES_COLUMN] = table.column(MODEL_SMILES_COLUMN)
    return out


def _device(use_gpu: bool) -> str:
    if not use_gpu:
        return "cpu"
    if not torch.cuda.is_available():
        raise UserError("--use_gpu was given but this model actor sees no CUDA device; run on GPU nodes or drop "
                        "--use_gpu")
    return "cuda"


class PredictStage:
    """Actor: loads the ensemble once, then predicts block after block: the columns of ``outputs``
    (:mod:`kermt.inference.columns`: upstream's task columns first), then the carried ones.

    ``domain`` (--applicability_domain): fold 0's index, fitted here once per actor, read through member 0's
    embedding (:class:`kermt.uncertainty.domain.DomainScorer`). ``outputs.attributions`` (--attributions): per-atom
    attributions of every block (:mod:`kermt.inference.attributions`), empty where the mode cannot give them."""

    def __init__(self, members: list[Checkpoint], batch_size: int, use_gpu: bool, outputs: OutputPlan,
                 domain: DomainIndex | None = None, dropout_samples: int = 0, upstream_batching: bool = False,
                 reference_width: int | None = None) -> None:
        self.ensemble = Ensemble(members, _device(use_gpu), dropout_samples,  # MC dropout: passes per member
                                 upstream_batching=upstream_batching, reference_width=reference_width)
        self.batch_size, self.outputs = batch_size, outputs
        self.domain = (DomainScorer(domain, self.ensemble.models[0], self.ensemble.device, self.ensemble.rule)
                       if domain else None)
        explains = outputs.attributions and unavailable_reason(self.ensemble.specs, upstream_batching) is None
        self.attributor = Attributor(self.ensemble) if explains else None

    def __call__(self, table: pa.Table) -> pa.Table:
        molecules = molecules_from_table(table)
        prediction = self.ensemble.predict(molecules, self.batch_size)
        domain = self.domain(molecules, self.batch_size) if self.domain is not None else None
        attributions = self.attributor.attribute(molecules) if self.attributor is not None else None
        values = prediction_columns(self.outputs, prediction.mean, prediction.std, molecules.valid, domain,
                                    attributions)
        columns = {"smiles": table.column("smiles")}
        columns.update({name: arrow_column(column, filled_rows(self.outputs, name, column, molecules.valid))
                        for name, column in values.items()})
        return pa.table({**columns, **carried_columns(table, molecules)})


def arrow_column(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    """A prediction column as Arrow: null on the invalid rows (a set column is already None there)."""
    if values.dtype == object:
        return pa.array(values, pa.string())
    kind = pa.bool_() if values.dtype == bool else pa.float64()
    return pa.array(values, kind, mask=~valid)


def _fixed_rows(values: np.ndarray) -> pa.FixedSizeListArray:
    values = np.ascontiguousarray(values, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


class EmbedStage:
    """Actor: fingerprints (``fps`` column) or the readout embeddings (one column per family, + ``projected``).

    Invalid rows hold NaN vectors so every output has one row per input row."""

    def __init__(self, checkpoint: Checkpoint, batch_size: int, use_gpu: bool, fingerprint_source: str | None,
                 upstream_batching: bool = False, reference_width: int | None = None) -> None:
        self.embedder = Embedder(checkpoint, _device(use_gpu), upstream_batching=upstream_batching,
                                 reference_width=reference_width)
        self.batch_size, self.source = batch_size, fingerprint_source
        if fingerprint_source is not None:
            self.embedder.check_source(fingerprint_source)

    def _outputs(self, molecules: FeaturizedMolecules) -> dict[str, np.ndarray]:
        batches = self.embedder.outputs(molecules, self.batch_size, self.source)
        widths = ({"fps": fingerprint_width(self.embedder, self.source, molecules.features.shape[1])}
                  if self.source is not None else self.embedder.output_widths())
        out = {name: np.full((len(molecules), width), np.nan, np.float32) for name, width in widths.items()}
        for rows, values in batches:
            for name, array in values.items():
                out[name][rows] = array
        return out

    def __call__(self, table: pa.Table) -> pa.Table:
        molecules = molecules_from_table(table)
        columns = {"smiles": table.column("smiles")}
        if "canonical_smiles" in table.column_names:
            columns["canonical_smiles"] = table.column("canonical_smiles")
        columns.update({name: _fixed_rows(values) for name, values in self._outputs(molecules).items()})
        return pa.table({**columns, **carried_columns(table, molecules)})


def fingerprint_width(embedder: Embedder, source: str, n_features: int) -> int:
    return {"atom": 2, "bond": 2, "both": 4}[source] * embedder.hidden_size + n_features


@dataclass
class StreamStats:
    rows: int = 0
    valid: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def add(self, block: pa.Table) -> None:
        valid = block.column("valid").to_numpy(zero_copy_only=False)
        self.rows += block.num_rows
        self.valid += int(valid.sum())
        for i in np.flatnonzero(~valid):
            reason = block.column("error")[int(i)].as_py()
            kind = reason_kind(reason)
            self.reasons[kind] = self.reasons.get(kind, 0) + 1
            if len(self.examples) < 3:
                self.examples.append(f"{block.column('smiles')[int(i)].as_py()!r}: {reason}")

    def all_invalid_message(self, data_path: str) -> str:
        counts = ", ".join(f"{n} {reason}" for reason, n in sorted(self.reasons.items(), key=lambda kv: -kv[1]))
        if self.rows == 0:
            return f"{data_path} has no data rows; nothing to predict"
        return (f"none of the {self.rows} rows of {data_path} is a valid molecule ({counts}; e.g. "
                f"{'; '.join(self.examples)}); no output written")


def build_stream(table: InputTable, spec: InputSpec, batch_size: int, stage: type, stage_kwargs: dict,
                 concurrency: int, cpus_per_actor: float, gpus_per_actor: float,
                 file_features: tuple[np.ndarray, np.ndarray] | None = None):
    """The lazy dataset of output blocks (see the module docstring)."""
    ds = featurised_dataset(table, spec, batch_size, file_features)
    return model_stage(ds, stage, stage_kwargs, rows_per_block(batch_size), concurrency, cpus_per_actor,
                       gpus_per_actor)


def featurised_dataset(table: InputTable, spec: InputSpec, batch_size: int,
                       file_features: tuple[np.ndarray, np.ndarray] | None = None):
    """The lazy dataset of featurised rows (featurize_block's), in blocks of exactly rows_per_block(batch_size)
    rows, in input order."""
    from ray_app.screening.files import read_table_lazily

    ds = read_table_lazily(table, spec.read_columns)
    if file_features is not None:
        ds = ds.zip(_file_features_dataset(*file_features))
    block = rows_per_block(batch_size)
    # small raw blocks first: readers emit a few large blocks, and featurising those one by one delays the first
    # prediction and keeps the actors idle (10k rows: 4 blocks of 2,500, ~4 s each on this machine)
    ds = ds.repartition(target_num_rows_per_block=block, strict=True)
    # half a CPU per featurise task: the model actors reserve CPUs they leave idle while they wait for blocks, and
    # featurisation is the bulk of the CPU work (on 2 cores, 1-CPU tasks next to a 1-CPU actor ran one at a time)
    ds = ds.map_batches(featurize_block, fn_kwargs={"spec": spec}, batch_format="pyarrow", batch_size=None,
                        num_cpus=FEATURIZE_CPUS)
    return ds.repartition(target_num_rows_per_block=block, strict=True)


def model_stage(ds, stage: type, stage_kwargs: dict, block: int, concurrency: int, cpus_per_actor: float,
                gpus_per_actor: float):
    """``stage`` (an actor pool of ``concurrency`` actors) over the featurised rows of ``ds``."""
    import ray

    return ds.map_batches(StageFromObjectStore, fn_constructor_kwargs=stage_arguments(stage, stage_kwargs),
                          batch_format="pyarrow", batch_size=block,
                          compute=ray.data.ActorPoolStrategy(size=concurrency), num_cpus=cpus_per_actor,
                          num_gpus=gpus_per_actor or None)


def stage_arguments(stage: type, stage_kwargs: dict) -> dict:
    """StageFromObjectStore's constructor arguments for ``stage(**stage_kwargs)``: the arguments put once."""
    import ray

    return {"stage": stage, "arguments": ray.put(stage_kwargs)}


class StageFromObjectStore:
    """Actor: ``stage(**arguments)``, its arguments read from the object store. Ray Data keys an actor-pool stage by
    repr() of its constructor arguments, which for a model stage is every tensor of every member's weights (0.3 s
    for the test fixture's model, 0.34 s for each release-size member, on every command); an ObjectRef's repr is its
    id. The stage's actors read the one copy the driver put (as they read Ray Data's own copy before)."""

    def __init__(self, stage: type, arguments) -> None:
        import ray

        self.stage = stage(**ray.get(arguments))

    def __call__(self, table: pa.Table) -> pa.Table:
        return self.stage(table)


def connect_actors(config: ScreeningConfig) -> int:
    """Start/attach Ray; returns the number of model actors."""
    from ray_app.common.cluster import connect

    resources = connect(config.address)
    if config.concurrency:
        return config.concurrency
    if config.use_gpu:
        return max(1, int(resources.get("GPU", 0) // config.num_gpus_per_actor))
    return 1


def blocks_of(ds) -> Iterator[pa.Table]:
    """A Ray Dataset's blocks on the driver, in input order."""
    yield from ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=1)


def input_progress(data_path: str, verb: str) -> Progress:
    """Progress lines for streaming ``data_path`` (an ETA where its row count is cheap to know)."""
    from ray_app.screening.files import row_estimate

    return Progress(f"{verb} {data_path}", total=row_estimate(data_path), unit="rows")


def _file_features_dataset(features: np.ndarray, valid: np.ndarray):
    import ray

    return ray.data.from_arrow(pa.table(file_feature_columns(features, valid)))


def file_feature_columns(features: np.ndarray, valid: np.ndarray) -> dict[str, pa.Array]:
    """``--features_path`` rows as the featurise stage reads them beside each input row."""
    width = features.shape[1]
    values = pa.array(np.ascontiguousarray(features, dtype=np.float64).reshape(-1))
    column = pa.FixedSizeListArray.from_arrays(values, width) if width else pa.array([[]] * len(features))
    return {FILE_FEATURES: column, FILE_FEATURES_VALID: pa.array(valid)}


def drain(blocks: Iterable[pa.Table], write: Callable[[pa.Table], None],
          progress: Progress | None = None) -> StreamStats:
    """Hand the output blocks (in input order) to ``write`` one by one, counting them on ``progress``. A malformed
    CSV (found by a Ray read task) is a UserError."""
    stats = StreamStats()
    try:
        for block in blocks:
            stats.add(block)
            write(block)
            if progress is not None:
                progress.advance(block.num_rows)
        if progress is not None:
            progress.finish()
    except Exception as error:
        unreadable = _malformed_csv(error)
        if unreadable is None:
            raise
        raise unreadable from error
    return stats


def _malformed_csv(error: BaseException) -> UserError | None:
    from ray_app.common.errors import ray_causes
    from ray_app.common.ray_internals import malformed_csv_path  # Ray Data's message (pyarrow's detail is lost)

    found = find_cause(error, lambda e: malformed_csv_path(e) is not None, ray_causes)
    if found is None:
        return None
    return malformed_csv(malformed_csv_path(found))


__all__ = [
    "EmbedStage", "InputSpec", "PredictStage", "StreamStats", "arrow_column", "blocks_of", "build_stream",
    "connect_actors", "drain", "featurised_dataset", "featurize_block", "file_feature_columns", "input_progress",
    "model_stage", "rows_per_block", "StageFromObjectStore", "stage_arguments",
]
