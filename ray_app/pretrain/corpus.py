"""`kermt corpus`: a pretraining corpus (format: ``kermt.data.corpus``) prepared with Ray Data.

    read (one task per file, rows numbered)  ->  clean: parse, canonicalise, validate (CPU tasks)  ->  materialise
      -> mark later copies of a molecule, across blocks (``corpus_dedupe``; unless --keep_duplicates)
      pass 1: count atom / bond contexts, SMILES tokens, rows and rejects per block -> summed in one task
              -> vocabs on the driver (a few thousand counts, exactly as upstream's build_vocab.py orders them),
                 or the vocab files given with --atom/bond/smiles_vocab_path (to continue a released model)
      pass 2: valid rows -> featurise + label (CPU tasks) -> blocks of exactly --rows_per_shard rows, in input
              order -> each written as a staged Parquet file by a task; the driver renames them part-00000...
      then vocab files, invalid.csv and, last, manifest.json

The driver handles per-block summaries, the vocab counts and the rejected rows only, never the molecules.
A re-run first removes the old manifest, so a corpus being rewritten (or left half-written by a crash) never
looks complete. An empty input, or one without a single valid SMILES, is refused before anything is written.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from kermt.chem.vocab_context import ContextVocab
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.data.atomic_files import filesystem, join, write_text
from kermt.data.corpus import (
    INVALID_FILE,
    MANIFEST_FILE,
    InputInfo,
    ShardInfo,
    corpus_rows,
    corpus_table,
    shard_path,
    write_manifest,
    write_vocabs,
)
from kermt.data.corpus_prep import (
    NO_VOCABS,
    VocabSettings,
    check_not_empty,
    clean_smiles_mols,
    count_vocab_tokens,
    invalid_report,
    load_vocab,
    manifest_for,
    vocabs_from_counts,
)
from ray_app.common.progress import Progress
from ray_app.pretrain.corpus_config import CorpusConfig
from ray_app.pretrain.corpus_dedupe import mark_duplicates

STAGED_PREFIX = "shards/.staged-"
# count kinds besides the vocab kinds: per-source rows, rejects and dropped copies
ROWS, INVALID, DUPLICATES = "rows", "invalid", "duplicates"


def clean_block(batch: pa.Table, canonicalize: bool) -> pa.Table:
    """(source, row, raw) -> (source, row, smiles, reason, mol, raw, duplicate); ``raw`` kept only for rejected
    rows, ``duplicate`` False until :func:`ray_app.pretrain.corpus_dedupe.mark_duplicates` sets it. ``mol``: the
    kept molecule as RDKit's binary pickle (~310 bytes for a MOSES molecule), so deduplication, counting and
    featurising rebuild it instead of parsing its SMILES again (each parse costs about what featurising does)."""
    raw = batch.column("raw").to_pylist()
    smiles, reasons, mols = clean_smiles_mols(raw, canonicalize)
    return pa.table({
        "source": batch.column("source"), "row": batch.column("row"),
        "smiles": pa.array(smiles, pa.string()), "reason": pa.array(reasons, pa.string()),
        "mol": pa.array(mols, pa.binary()),
        "raw": pa.array([r if reason else None for r, reason in zip(raw, reasons)], pa.string()),
        "duplicate": pa.array(np.zeros(len(raw), dtype=bool)),
    })


def _valid(batch: pa.Table) -> pa.Table:
    """The rows the corpus keeps: not rejected, not a later copy of a molecule."""
    return batch.filter(pc.and_(pc.is_null(batch.column("reason")), pc.invert(batch.column("duplicate"))))


def _per_source(sources: np.ndarray) -> Counter:
    return Counter({str(s): int(n) for s, n in zip(*np.unique(sources, return_counts=True))})


def count_block(batch: pa.Table) -> pa.Table:
    """Map side of the vocab reduce: (kind, key, count) rows for this block's contexts, tokens, rows, rejects."""
    valid = _valid(batch)
    counts = count_vocab_tokens(valid.column("smiles").to_pylist(), valid.column("mol").to_pylist())
    sources = batch.column("source").to_numpy()
    rejected = batch.column("reason").is_null().to_numpy(zero_copy_only=False) == 0
    counts[ROWS], counts[INVALID] = _per_source(sources), _per_source(sources[rejected])
    counts[DUPLICATES] = _per_source(sources[batch.column("duplicate").to_numpy(zero_copy_only=False)])
    kinds = [kind for kind, counter in counts.items() for _ in counter]
    return pa.table({"kind": pa.array(kinds, pa.string()),
                     "key": pa.array([k for c in counts.values() for k in c], pa.string()),
                     "count": pa.array([n for c in counts.values() for n in c.values()], pa.int64())})


def featurize_block(batch: pa.Table, vocabs: tuple[ContextVocab, ContextVocab, SmilesVocab]) -> pa.Table:
    """Valid cleaned rows -> shard columns, plus ``source`` and ``row`` (provenance; also the shard order key)."""
    table = corpus_table(corpus_rows(batch.column("smiles").to_pylist(), *vocabs, batch.column("mol").to_pylist()))
    return table.append_column("source", batch.column("source")).append_column("row", batch.column("row"))


def stage_shard(batch: pa.Table, corpus_dir: str) -> pa.Table:
    """Write one shard block under a staged name; report where it starts (for the driver to order the shards)."""
    import uuid

    staged = join(corpus_dir, f"{STAGED_PREFIX}{uuid.uuid4().hex}.parquet")
    fs, inner = filesystem(staged)
    pq.write_table(batch, inner, filesystem=fs, compression="zstd")
    lengths = pc.list_value_length(batch.column("tokens")).to_numpy(zero_copy_only=False)
    return pa.table({"staged": [staged], "rows": [batch.num_rows], "source": [batch.column("source")[0].as_py()],
                     "row": [batch.column("row")[0].as_py()], "max_tokens": [int(lengths.max())]})


def sum_counts(batch: pa.Table) -> pa.Table:
    """Reduce side: (kind, key, count) rows -> one row per (kind, key) with the summed count."""
    summed = batch.group_by(["kind", "key"]).aggregate([("count", "sum")])
    return pa.table({"kind": summed.column("kind"), "key": summed.column("key"), "count": summed.column("count_sum")})


def _reduce_counts(cleaned, rows_per_task: int) -> dict[str, Counter]:
    # Every block's counts are already summed, so the reduce reads a few hundred rows per block: one task does it
    # (a hash-shuffle groupby would start aggregator actors for what is a few MB even for millions of molecules).
    per_block = cleaned.map_batches(count_block, batch_format="pyarrow", batch_size=rows_per_task)
    total = per_block.repartition(1).map_batches(sum_counts, batch_format="pyarrow", batch_size=None)
    totals: dict[str, Counter] = {}
    for batch in total.iter_batches(batch_format="pyarrow", batch_size=None):
        for kind, key, count in zip(*(batch.column(n).to_pylist() for n in ("kind", "key", "count"))):
            totals.setdefault(kind, Counter())[key] += count
    return totals


def _rejected_rows(cleaned, paths: Sequence[str]) -> list[tuple[str, int, str, str]]:
    def rejected(batch: pa.Table) -> pa.Table:
        return batch.filter(pc.is_valid(batch.column("reason")))

    rows = []
    for batch in cleaned.map_batches(rejected, batch_format="pyarrow").iter_batches(batch_format="pyarrow"):
        rows += zip(*(batch.column(n).to_pylist() for n in ("source", "row", "raw", "reason")))
    return [(paths[s], r, raw or "", reason) for s, r, raw, reason in sorted(rows, key=lambda x: (x[0], x[1]))]


def _write_shards(cleaned, corpus_dir: str, vocabs: tuple, rows_per_shard: int, rows_per_task: int,
                  expected: int) -> tuple[list[ShardInfo], int]:
    """Featurise the valid molecules into shards of ``rows_per_shard`` (a progress line toward ``expected``)."""
    valid = cleaned.map_batches(_valid, batch_format="pyarrow")
    rows = valid.map_batches(featurize_block, fn_kwargs={"vocabs": vocabs}, batch_format="pyarrow",
                             batch_size=rows_per_task)
    shards = rows.repartition(target_num_rows_per_block=rows_per_shard, strict=True)
    progress, staged = Progress(f"featurising the corpus into {corpus_dir}", total=expected), []
    for shard in shards.map_batches(stage_shard, fn_kwargs={"corpus_dir": corpus_dir}, batch_format="pyarrow",
                                    batch_size=None).iter_rows():
        staged.append(dict(shard))
        progress.advance(int(shard["rows"]))
    progress.finish()
    staged.sort(key=lambda s: (s["source"], s["row"]))
    fs, _ = filesystem(corpus_dir)
    for index, shard in enumerate(staged):
        fs.move(filesystem(shard["staged"])[1], filesystem(join(corpus_dir, shard_path(index)))[1])
    _remove_stale_shards(corpus_dir, keep=len(staged))
    return [ShardInfo(shard_path(i), s["rows"]) for i, s in enumerate(staged)], max(s["max_tokens"] for s in staged)


def _remove_stale_shards(corpus_dir: str, keep: int) -> None:
    """Shards of an earlier, larger corpus in the same directory (part-N for N >= keep) and staged leftovers."""
    fs, shards = filesystem(join(corpus_dir, "shards"))
    wanted = {filesystem(join(corpus_dir, shard_path(i)))[1] for i in range(keep)}
    for info in fs.get_file_info(pafs.FileSelector(shards, allow_not_found=True)):
        if info.type == pafs.FileType.File and info.path not in wanted:
            fs.delete_file(info.path)


def _start_rewrite(corpus_dir: str) -> None:
    """From here on the directory is not a complete corpus: its manifest goes first."""
    fs, manifest = filesystem(join(corpus_dir, MANIFEST_FILE))
    if fs.get_file_info(manifest).type == pafs.FileType.File:
        fs.delete_file(manifest)
    fs.create_dir(filesystem(join(corpus_dir, "shards"))[1], recursive=True)


def clean_inputs(paths: Sequence[str], columns: Sequence[str], canonicalize: bool, rows_per_task: int):
    """The cleaned rows of every file (:func:`clean_block`), materialised in blocks of ``rows_per_task`` rows."""
    from ray_app.pretrain.corpus_read import read_inputs

    # A file is read by one task. Without the repartition Ray Data fuses the cleaning into that task and merges its
    # chunks into one block, so cleaning and every later stage (count, featurise: one task per block) ran on one
    # CPU per file, whatever the cluster's size.
    raw = read_inputs(paths, columns).repartition(target_num_rows_per_block=rows_per_task)
    return raw.map_batches(clean_block, fn_kwargs={"canonicalize": canonicalize}, batch_format="pyarrow",
                           batch_size=rows_per_task).materialize()


def build_corpus(paths: Sequence[str], columns: Sequence[str], corpus_dir: str, settings: VocabSettings,
                 rows_per_shard: int, rows_per_task: int, given: Sequence = NO_VOCABS, **recorded: object):
    """The whole flow on the connected Ray cluster; returns the manifest (written last). ``given``: vocabs to use
    instead of building them; ``recorded``: further settings for the manifest."""
    cleaned = clean_inputs(paths, columns, settings.canonicalize, rows_per_task)
    if settings.deduplicate:
        cleaned = mark_duplicates(cleaned, settings.canonicalize)
    counts = _reduce_counts(cleaned, rows_per_task)
    rows, invalid, copies = (counts.get(kind, Counter()) for kind in (ROWS, INVALID, DUPLICATES))
    n_rows, n_invalid, n_copies = sum(rows.values()), sum(invalid.values()), sum(copies.values())
    rejected = _rejected_rows(cleaned, paths) if n_invalid else []
    check_not_empty(n_rows, n_rows - n_invalid, list(paths), Counter(r[3] for r in rejected))
    vocabs = vocabs_from_counts({kind: counts.get(kind, Counter()) for kind in ("atom", "bond", "smiles")},
                                settings, given)
    _start_rewrite(corpus_dir)
    shards, max_tokens = _write_shards(cleaned, corpus_dir, vocabs, rows_per_shard, rows_per_task,
                                       expected=n_rows - n_invalid - n_copies)
    if sum(s.rows for s in shards) != n_rows - n_invalid - n_copies:
        raise RuntimeError(f"wrote {sum(s.rows for s in shards)} molecules, expected {n_rows - n_invalid - n_copies}")
    write_vocabs(corpus_dir, *vocabs)
    write_text(join(corpus_dir, INVALID_FILE), invalid_report(rejected))
    inputs = [InputInfo(path, rows[str(i)], invalid[str(i)], copies[str(i)]) for i, path in enumerate(paths)]
    manifest = manifest_for(shards, inputs, max_tokens, vocabs, settings, rows_per_shard, smiles_columns=list(columns),
                            **recorded)
    write_manifest(corpus_dir, manifest)
    return manifest


def run_corpus(config: CorpusConfig) -> None:
    from ray_app.common.cluster import connect
    from ray_app.common.remote_files import fetch_input
    from ray_app.common.storage import resolve_storage
    from ray_app.pretrain.corpus_read import check_corpus_files

    columns = check_corpus_files(config.data_path, config.smiles_column)
    paths = dict(zip(("atom", "bond", "smiles"), config.vocab_paths))
    # given vocab files may be URIs (s3://, hf://nvidia/NV-KERMT-70M-v2/pretrain_atom_vocab.json): read local copies
    given = [None if path is None else load_vocab(fetch_input(path, f"--{kind}_vocab_path"), kind)
             for kind, path in paths.items()]
    connect(config.address, num_cpus=config.num_cpus)
    corpus_dir = resolve_storage(config.save_dir, default_dir=None, flag="--save_dir")
    start = time.perf_counter()
    manifest = build_corpus(config.data_path, columns, corpus_dir, config.vocab_settings, config.rows_per_shard,
                            config.rows_per_task, given, vocab_paths={k: p for k, p in paths.items() if p})
    seconds = time.perf_counter() - start
    print(f"kermt corpus: {manifest.n_molecules} molecules in {len(manifest.shards)} shard(s), "
          f"{manifest.n_invalid} invalid row(s) (see {INVALID_FILE}), {_duplicates_note(manifest)}; vocab sizes "
          f"atom {manifest.atom_vocab_size}, bond {manifest.bond_vocab_size}, smiles {manifest.smiles_vocab_size}; "
          f"{seconds:.1f} s "
          f"({manifest.n_molecules / seconds:.0f} molecules/s) -> {corpus_dir}", flush=True)


def _duplicates_note(manifest) -> str:
    if not manifest.settings.get("deduplicate", True):
        return "duplicates kept (--keep_duplicates)"
    return f"{manifest.n_duplicates} duplicate molecule(s) dropped"


__all__ = ["build_corpus", "clean_block", "clean_inputs", "count_block", "featurize_block", "run_corpus", "stage_shard",
           "sum_counts"]
