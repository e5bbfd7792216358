"""The driver side of `kermt predict / fingerprint / embed`: plan (:mod:`ray_app.screening.plan`, before Ray
starts), stream (:mod:`ray_app.screening.stream`), write, summarise."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from kermt.checkpoint import Checkpoint, read_checkpoint
from kermt.chem.standardize import MoleculePrep
from kermt.errors import UserError, user_input
from kermt.data.formats import row_place
from kermt.inference import Embedder
from kermt.inference.attributions import OVER_BUDGET, unavailable_reason
from kermt.inference.columns import ATOMS_SUFFIX
from kermt.inputs import check_checkpoint_file
from ray_app.screening.config import (EmbedConfig, FingerprintConfig, ModelScreeningConfig, PredictConfig,
                                      ScreeningConfig, elapsed_line, log)
from ray_app.screening.files import (ArraySpool, JsonListSpool, TableWriter, write_metadata_json, write_npy,
                                     write_npz)
from ray_app.screening.engines import predict_stage_kwargs, predict_stream, resolve_engine, start_stream
from ray_app.screening.plan import PredictPlan, file_features, note_widths, plan_predict, source_columns
from ray_app.screening.shards import Shards, check_fit, predict_shards
from ray_app.screening.stream import EmbedStage, InputSpec, StreamStats, drain, input_progress
from ray_app.screening.uncertainty import calibrated_on_file


def _finish(stats: StreamStats, config: ScreeningConfig, started: float, commit, abort) -> int:
    if stats.valid == 0:
        abort()
        raise UserError(stats.all_invalid_message(config.data_path))
    commit()
    log(elapsed_line(stats.rows, stats.valid, started, config.output_path))
    return 0


# ---------------------------------------------------------------------------------------------------- predict


def run_predict(config: PredictConfig, shards: Shards | None = None) -> int:
    """``shards``: ``config.data_path`` featurised already (:mod:`ray_app.screening.shards`), read instead of it."""
    started = time.perf_counter()
    config = resolve_engine(config, (config.calibration_path,))
    checked = plan_predict(config, carry_other_columns=not config.drop_extra_columns)
    writer = TableWriter(config.output_path)
    checked = calibrated_on_file(config, checked)
    if shards is None:
        ds = predict_stream(config, checked)
    else:
        check_fit(shards, checked.features, config.max_heavy_atoms)
        ds = predict_shards(config, shards, predict_stage_kwargs(config, checked))
    unattributed = unattributed_rows(config, checked)

    def write(block: pa.Table) -> None:
        unattributed.add(block)
        writer.write(block.rename_columns([checked.source.smiles_column, *block.column_names[1:]]))

    stats = drain(ds, write, input_progress(config.data_path, "predicting"))
    unattributed.note()
    return _finish(stats, config, started, writer.commit, writer.abort)


def unattributed_rows(config: ModelScreeningConfig, checked: PredictPlan) -> UnattributedRows:
    """The counter of rows without attributions for ``config``'s stream (counting nothing when it computes none)."""
    outputs = checked.outputs(config)
    explained = outputs.attributions and not unavailable_reason([m.spec for m in checked.members],
                                                                config.upstream_batching)
    return UnattributedRows(config.data_path, outputs.tasks[0] + ATOMS_SUFFIX if explained else None)


class UnattributedRows:
    """--attributions: the valid rows whose attribution cells came back empty (more heavy atoms than the budget),
    counted as the blocks are written, for one note at the end. ``column``: the first task's atoms column (None:
    no attributions are computed, and there is nothing to count)."""

    def __init__(self, data_path: str, column: str | None) -> None:
        self.data_path, self.column = data_path, column
        self.rows: list[int] = []
        self.seen = 0

    def add(self, block: pa.Table) -> None:
        if self.column is not None:
            empty = block.column(self.column).is_null().to_numpy(zero_copy_only=False)
            valid = block.column("valid").to_numpy(zero_copy_only=False).astype(bool)
            self.rows += (self.seen + np.flatnonzero(empty & valid)).tolist()
        self.seen += block.num_rows

    def note(self) -> None:
        if self.rows:
            log(f"note: {len(self.rows)} molecule(s) of {self.data_path} have empty attribution cells: "
                f"{OVER_BUDGET} (e.g. {row_place(self.data_path, self.rows[0])}); their predictions are written")


# ------------------------------------------------------------------------------------------ fingerprint / embed


def _embedding_checkpoint(config: FingerprintConfig | EmbedConfig) -> Checkpoint:
    check_checkpoint_file(config.checkpoint_path, "--checkpoint_path")
    with user_input():
        checkpoint = read_checkpoint(config.checkpoint_path, trust_pickle=config.trust_checkpoint,
                                     dataset_type=config.dataset_type)
    log(f"{checkpoint.path}: {checkpoint.spec.kind} checkpoint")
    note_widths(config, [checkpoint.spec])
    return checkpoint


def _prep(config: ScreeningConfig, checkpoint: Checkpoint) -> MoleculePrep:
    """The checkpoint's standardisation (a finetuned model's own; none for a pretrained one), under the limit."""
    return MoleculePrep(checkpoint.spec.features.standardize, config.max_heavy_atoms)


def run_fingerprint(config: FingerprintConfig) -> int:
    started = time.perf_counter()
    config = resolve_engine(config)
    checkpoint = _embedding_checkpoint(config)
    with user_input():
        embedder = Embedder(checkpoint)
        families = config.fingerprint_source or embedder.default_source
        embedder.check_source(families)  # fail before the cluster starts
    if config.fingerprint_source is None:
        log(f"fingerprint_source {families} (the default for a {checkpoint.spec.kind} checkpoint)")
    from_file = file_features(config.features_path)
    if config.features_generator is None and from_file is None:
        generator: tuple[str, ...] = ()  # upstream appends molecule features only when asked
    else:
        generator = tuple(config.features_generator or ())
    source = source_columns(config)
    spec = InputSpec(source.smiles_column, (), generator, file_features=from_file is not None,
                     prep=_prep(config, checkpoint))
    ds = start_stream(config, source.table, spec, EmbedStage,
                      {"checkpoint": checkpoint, "fingerprint_source": families, **config.width_kwargs()}, from_file)
    output = Path(config.output_path)
    spools: dict[str, ArraySpool] = {}

    def write(block: pa.Table) -> None:
        fps = block.column("fps")
        if not spools:
            spools["fps"] = ArraySpool(fps.type.list_size)
            spools["valid"] = ArraySpool(1, np.bool_)
        spools["fps"].append(fps.combine_chunks().flatten().to_numpy())
        spools["valid"].append(block.column("valid").to_numpy(zero_copy_only=False))

    stats = drain(ds, write, input_progress(config.data_path, "fingerprinting"))
    return _finish(stats, config, started, lambda: write_npz(output, spools), lambda: None)


def run_embed(config: EmbedConfig) -> int:
    started = time.perf_counter()
    config = resolve_engine(config)
    checkpoint = _embedding_checkpoint(config)
    source = source_columns(config)
    spec = InputSpec(source.smiles_column, source.id_columns, canonical=True, prep=_prep(config, checkpoint))
    output = Path(config.output_path)
    if output.suffix.lower() in (".csv", ".npy", ".npz"):
        raise UserError(f"output_path {output}: embed writes a .parquet file or a directory of .npy files")
    ds = start_stream(config, source.table, spec, EmbedStage,
                      {"checkpoint": checkpoint, "fingerprint_source": None, **config.width_kwargs()})
    progress = input_progress(config.data_path, "embedding")
    if output.suffix.lower() == ".parquet":
        writer = TableWriter(output)
        return _finish(drain(ds, writer.write, progress), config, started, writer.commit, writer.abort)
    writer = NpyDirectoryWriter(output, {"checkpoint": str(checkpoint.path), "kind": checkpoint.spec.kind})
    return _finish(drain(ds, writer.write, progress), config, started, writer.commit, lambda: None)


class NpyDirectoryWriter:
    """Upstream's ``extract_embeddings`` npy layout: ``<family>.npy`` [N, width] per output + ``metadata.json``."""

    LISTS = ("smiles", "canonical_smiles", "valid")

    def __init__(self, directory: Path, header: dict) -> None:
        self.directory, self.header = directory, header
        self.arrays: dict[str, ArraySpool] = {}
        self.lists = {name: JsonListSpool() for name in self.LISTS}

    def write(self, block: pa.Table) -> None:
        for name in block.column_names:
            column = block.column(name)
            if pa.types.is_fixed_size_list(column.type):
                spool = self.arrays.setdefault(name, ArraySpool(column.type.list_size))
                spool.append(column.combine_chunks().flatten().to_numpy())
        for name, spool in self.lists.items():
            spool.extend(block.column(name).to_pylist())

    def commit(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, spool in self.arrays.items():
            write_npy(self.directory / f"{name}.npy", spool)
        rows = next(iter(self.arrays.values())).rows if self.arrays else 0
        header = {**self.header, "n_molecules": rows, "embedding_types": list(self.arrays),
                  "widths": {name: spool.width for name, spool in self.arrays.items()}}
        write_metadata_json(self.directory / "metadata.json", header, self.lists)


__all__ = ["NpyDirectoryWriter", "run_embed", "run_fingerprint", "run_predict"]
