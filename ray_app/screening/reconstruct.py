"""`kermt reconstruct`: SMILES generated from each molecule's cMIM latent, streamed like `kermt predict`.

    read (SMILES + id columns) -> number the rows                     (the key of every random draw)
      -> featurise the canonical SMILES (CPU tasks)                  (upstream encodes the canonical input)
      -> repartition into blocks of a multiple of batch_size          (batches as in predict, see stream.py)
      -> ReconstructStage actors: num_samples strings per valid row   (list columns, one row per input row)
      -> driver: one row per (input row, sample), written in order

The row numbers make the output independent of batching and of the number of actors (sample k of row r draws from
(seed, r, k) only, ``kermt.pretrain.reconstruct``). Ray Data's readers do not number rows, so the input's SMILES and
id columns are read into the object store first, their blocks counted and numbered; the rest of the run streams.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kermt.checkpoint import Checkpoint, read_checkpoint
from kermt.data.corpus import open_corpus
from kermt.data.featurize import FeaturizedMolecules
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.chem.standardize import MoleculePrep
from kermt.errors import UserError, user_input
from kermt.inference import batch_starts
from kermt.inputs import check_checkpoint_file
from kermt.nn.pretrain.config import PretrainHeadsConfig
from kermt.nn.pretrain.generate import SamplingConfig
from kermt.pretrain.export import read_corpus_record
from kermt.pretrain.generation_metrics import INPUTS_REFERENCE, GenerationTally, reference_keys
from kermt.pretrain.reconstruct import (ReconstructSettings, Reconstructor, check_reconstruct_checkpoint,
                                        find_smiles_vocab, read_smiles_vocab, score)
from kermt.data.arrow_molecules import molecules_from_table
from ray_app.common.remote_files import fetch_input
from ray_app.screening.config import ReconstructConfig, log
from ray_app.screening.files import Source, TableWriter
from ray_app.screening.plan import source_columns
from ray_app.screening.stream import (FEATURIZE_CPUS, InputSpec, StreamStats, _device, blocks_of, carried_columns,
                                      connect_actors, drain, featurize_block, input_progress, model_stage)

ROW = "row::input"  # the input row number travelling with each row (prefixed: never a user column)
SAMPLE_COLUMNS = ("generated_smiles", "generated_canonical_smiles", "generated_valid", "exact_match", "edit_distance")
SAMPLE_TYPES = (pa.string(), pa.string(), pa.bool_(), pa.bool_(), pa.int64())
SCORED_FIELDS = {"generated_smiles": "smiles", "generated_canonical_smiles": "canonical", "generated_valid": "parses"}
OUTPUT_COLUMNS = ("canonical_smiles", "sample", *SAMPLE_COLUMNS, "valid", "error")
# Generating costs far more per molecule than predicting (seconds per batch on a CPU): blocks of a few batches keep
# every actor busy and the output moving.
BATCHES_PER_BLOCK = 2


@dataclass(frozen=True)
class ReconstructPlan:
    checkpoint: Checkpoint
    vocab: SmilesVocab
    settings: ReconstructSettings
    source: Source


def _max_len(config: ReconstructConfig, checkpoint: Checkpoint) -> int:
    trained = checkpoint.spec.pretrain.get("decoder_max_seq_len") or PretrainHeadsConfig.decoder_max_seq_len
    sinusoidal = checkpoint.spec.pretrain.get("decoder_positional_encoding") == "sinusoidal"
    if sinusoidal and config.max_len is not None and config.max_len > trained:
        raise UserError(f"--max_len {config.max_len}: {checkpoint.path} has a sinusoidal decoder with {trained} "
                        f"positions; use --max_len {trained} or less")
    return config.max_len or trained


def plan_reconstruct(config: ReconstructConfig) -> ReconstructPlan:
    """Everything checked before Ray starts: checkpoint kind, vocab, settings, columns."""
    check_checkpoint_file(config.checkpoint_path, "--checkpoint_path")
    with user_input():
        checkpoint = read_checkpoint(config.checkpoint_path, trust_pickle=config.trust_checkpoint)
        check_reconstruct_checkpoint(checkpoint)
        given = config.smiles_vocab_path
        vocab_path = fetch_input(given, "--smiles_vocab_path") if given else find_smiles_vocab(checkpoint.path)
        vocab = read_smiles_vocab(vocab_path, checkpoint)
        sampling = SamplingConfig(config.temperature, config.top_k, config.top_p, _max_len(config, checkpoint))
        settings = ReconstructSettings(sampling, config.use_mean, config.num_samples, config.seed)
        source = source_columns(config)
        names = [source.smiles_column, *source.id_columns]
        clash = sorted({name for name in names if name in OUTPUT_COLUMNS or names.count(name) > 1})
        if clash:
            raise UserError(f"SMILES/id columns {clash}: name each column once, and none of the output's columns "
                            f"{list(OUTPUT_COLUMNS)}")
    log(f"{checkpoint.path}: {checkpoint.spec.kind} checkpoint, SMILES vocab {vocab_path} ({len(vocab)} tokens)")
    return ReconstructPlan(checkpoint, vocab, settings, source)


class ReconstructStage:
    """Actor: loads the latent head and decoder once; per block, ``num_samples`` generated SMILES per valid row
    (list columns; invalid rows get lists of nulls, so every input row yields ``num_samples`` output rows)."""

    def __init__(self, checkpoint: Checkpoint, vocab: SmilesVocab, settings: ReconstructSettings, batch_size: int,
                 use_gpu: bool) -> None:
        self.model = Reconstructor(checkpoint, vocab, _device(use_gpu))
        self.settings, self.batch_size = settings, batch_size

    def _generate(self, table: pa.Table, molecules: FeaturizedMolecules) -> list[list[str] | None]:
        rows, valid = table.column(ROW).to_numpy(), molecules.valid
        generated: list[list[str] | None] = [None] * len(molecules)
        for start in batch_starts(len(molecules), self.batch_size):
            local = start + np.flatnonzero(valid[start:start + self.batch_size])
            if len(local):
                samples = self.model.reconstruct(molecules.select(local), rows[local], self.settings)
                for i, molecule_samples in zip(local, samples):
                    generated[i] = molecule_samples
        return generated

    def __call__(self, table: pa.Table) -> pa.Table:
        per, molecules = self.settings.num_samples, molecules_from_table(table)
        canonical = table.column("canonical_smiles").to_pylist()
        scored = [[score(c, s) for s in samples] if samples is not None else None
                  for c, samples in zip(canonical, self._generate(table, molecules))]
        columns = {"smiles": table.column("smiles"), "canonical_smiles": table.column("canonical_smiles")}
        for name, kind in zip(SAMPLE_COLUMNS, SAMPLE_TYPES):
            attribute = SCORED_FIELDS.get(name, name)
            values = [[getattr(s, attribute) for s in row] if row is not None else [None] * per for row in scored]
            columns[name] = pa.array(values, pa.list_(kind))
        return pa.table({**columns, **carried_columns(table, molecules)})


def one_row_per_sample(block: pa.Table, per: int, smiles_column: str) -> pa.Table:
    """A block of input rows with list columns -> ``per`` rows each (input columns repeated, ``sample`` 1..per)."""
    repeat = pa.array(np.repeat(np.arange(block.num_rows), per))
    columns = {smiles_column: block.column("smiles").take(repeat),
               "canonical_smiles": block.column("canonical_smiles").take(repeat),
               "sample": pa.array(np.tile(np.arange(1, per + 1, dtype=np.int64), block.num_rows))}
    columns.update({name: pc.list_flatten(block.column(name)) for name in SAMPLE_COLUMNS})
    for name in block.column_names:
        if name not in columns and name not in ("smiles", *SAMPLE_COLUMNS):
            columns[name] = block.column(name).take(repeat)
    return pa.table(columns)


@dataclass
class Quality:
    """The run's summary: validity, uniqueness and novelty of the generated molecules
    (:mod:`kermt.pretrain.generation_metrics`), then upstream's: share that reconstructs the input, edit distance."""

    exact: int = 0
    edit_distance_sum: int = 0
    tally: GenerationTally = field(default_factory=GenerationTally)

    def add(self, table: pa.Table) -> None:
        table = table.filter(table.column("valid"))  # an invalid input row generates nothing
        self.tally.add(table.column("generated_canonical_smiles").to_pylist(),
                       pc.unique(table.column("canonical_smiles")).to_pylist())
        self.exact += int(pc.sum(table.column("exact_match")).as_py() or 0)
        self.edit_distance_sum += int(pc.sum(table.column("edit_distance")).as_py() or 0)

    def line(self, checkpoint_path: Path) -> str:
        metrics = self.tally.metrics(*training_reference(checkpoint_path))
        exact = 100 * self.exact / max(metrics.generated, 1)
        return (f"{metrics.generated} SMILES generated: {metrics.line()}; {exact:.1f} % are the input molecule, mean "
                f"edit distance {self.edit_distance_sum / max(metrics.valid, 1):.2f} (parsable ones)")


def training_reference(checkpoint_path: Path) -> tuple[np.ndarray | None, str]:
    """The keys of the corpus the model was pretrained on, when the record beside it names one that can be read;
    else (None, ...): novelty is measured against the input's molecules."""
    corpus_path = read_corpus_record(checkpoint_path)
    if corpus_path is None:
        return None, INPUTS_REFERENCE
    try:
        corpus = open_corpus(corpus_path)
        keys = reference_keys(corpus.smiles(), corpus.canonical)
    except (UserError, OSError) as error:
        log(f"novelty against {INPUTS_REFERENCE}: the pretraining corpus {corpus_path} cannot be read ({error})")
        return None, INPUTS_REFERENCE
    return keys, f"the pretraining corpus {corpus_path} ({len(keys)} molecules)"


def reconstruct_stream(config: ReconstructConfig, plan: ReconstructPlan):
    """The lazy dataset of output blocks, one row per input row (see the module docstring); starts Ray."""
    from ray_app.screening.files import read_table_lazily

    concurrency = connect_actors(config)
    source = plan.source
    ds = numbered(read_table_lazily(source.table, [source.smiles_column, *source.id_columns]))
    spec = InputSpec(source.smiles_column, source.id_columns, canonical=True,
                     prep=MoleculePrep(max_heavy_atoms=config.max_heavy_atoms))
    block = BATCHES_PER_BLOCK * config.batch_size
    ds = ds.repartition(target_num_rows_per_block=block, strict=True)
    ds = ds.map_batches(_featurize_numbered, fn_kwargs={"spec": spec}, batch_format="pyarrow", batch_size=None,
                        num_cpus=FEATURIZE_CPUS)
    ds = ds.repartition(target_num_rows_per_block=block, strict=True)
    stage_kwargs = {"checkpoint": plan.checkpoint, "vocab": plan.vocab, "settings": plan.settings,
                    "batch_size": config.batch_size, "use_gpu": config.use_gpu}
    return model_stage(ds, ReconstructStage, stage_kwargs, block, concurrency, config.cpus_per_actor,
                       config.num_gpus_per_actor if config.use_gpu else 0)


def numbered(ds):
    """``ds`` with each row's 0-based input number in column ROW. Reads ``ds`` into the object store first: the
    number of a row is known only once the blocks before it have been counted."""
    import ray

    blocks = ds.to_arrow_refs()  # in input order (preserve_order, ray_app.common.cluster.connect)
    if not blocks:
        return ds  # no rows: nothing downstream runs, and the driver reports the empty input
    counts = ray.get([ray.remote(_row_count).options(num_cpus=0).remote(block) for block in blocks])
    starts = np.cumsum([0, *counts[:-1]], dtype=np.int64)
    number = ray.remote(_with_row_numbers).options(num_cpus=0)
    return ray.data.from_arrow_refs([number.remote(block, int(start)) for block, start in zip(blocks, starts)])


def _row_count(block: pa.Table) -> int:
    return block.num_rows


def _with_row_numbers(block: pa.Table, start: int) -> pa.Table:
    return block.append_column(ROW, pa.array(np.arange(start, start + block.num_rows, dtype=np.int64)))


def _featurize_numbered(batch: pa.Table, spec: InputSpec) -> pa.Table:
    return featurize_block(batch, spec).append_column(ROW, batch.column(ROW))


def run_reconstruct(config: ReconstructConfig) -> int:
    started = time.perf_counter()
    plan = plan_reconstruct(config)
    writer, quality = TableWriter(config.output_path), Quality()

    def write(block: pa.Table) -> None:
        rows = one_row_per_sample(block, config.num_samples, plan.source.smiles_column)
        quality.add(rows)
        writer.write(rows)

    progress = input_progress(config.data_path, "reconstructing")
    stats = drain(blocks_of(reconstruct_stream(config, plan)), write, progress)
    _finish(stats, config, started, writer)
    log(quality.line(plan.checkpoint.path))
    return 0


def _finish(stats: StreamStats, config: ReconstructConfig, started: float, writer: TableWriter) -> None:
    if stats.valid == 0:
        writer.abort()
        raise UserError(stats.all_invalid_message(config.data_path))
    writer.commit()
    seconds = time.perf_counter() - started
    log(f"wrote {stats.rows} input rows x {config.num_samples} sample(s) ({stats.valid} valid, "
        f"{stats.rows - stats.valid} invalid) to {config.output_path} in {seconds:.1f} s "
        f"({stats.valid / max(seconds, 1e-9):.1f} molecules/s)")


__all__ = ["Quality", "ReconstructPlan", "ReconstructStage", "one_row_per_sample", "plan_reconstruct",
           "reconstruct_stream", "run_reconstruct", "training_reference"]
