"""Corpus preparation on MOSES: `kermt corpus` throughput on Ray Data next to the single-process rate; bytes per
molecule.

    .venv/bin/python scripts/fetch_moses.py                 # once: data/moses/train.csv.gz
    .venv/bin/python bench/corpus.py [--n 100000] [--num_cpus 2] [--single_n 3000] [--keep DIR]
    .venv/bin/python bench/corpus.py --single_only [--kermt_from OLD_TREE]   # one process, 1 thread, no Ray

``--single_only`` measures the single-process rate alone with torch/OpenMP at one thread; ``--kermt_from`` imports
``kermt`` from another tree (e.g. ``git archive REV kermt | tar -x -C OLD_TREE``), so a change's before and after
are measured by the same script, taken in turn on the same machine.

* single process: the same steps in this process (clean + canonicalise, count contexts and tokens, featurise and
  label, write one shard) on the first ``--single_n`` molecules: molecules per CPU-second (and per wall second);
* Ray: ``kermt corpus`` on the first ``--n`` MOSES SMILES (one CSV) on a local cluster of ``--num_cpus`` CPUs:
  wall clock from reading to the manifest, molecules per second, and molecules per CPU-second used by the driver
  and every Ray process (workers, raylet, GCS), next to the single-process figure: their ratio is the share of the
  cluster's CPU time spent on the work itself, which a loaded machine does not distort as it does wall clocks;
* bytes per molecule of the written corpus: the graph store in memory (FlatGraphs), labels and tokens in memory,
  and the Parquet shards on disk (zstd).

Figures depend on the machine and on what else runs on it: they are printed with the load average.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from scale import tree_cpu_s  # CPU seconds of this process and its Ray processes

MOSES = ROOT / "data/moses/train.csv.gz"


def moses_smiles(n: int) -> list[str]:
    if not MOSES.exists():
        sys.exit(f"{MOSES} is missing: run .venv/bin/python scripts/fetch_moses.py first")
    with gzip.open(MOSES, "rt") as handle:
        next(handle)  # header: SMILES
        return [line.strip() for line in itertools.islice(handle, n)]


def single_process_rates(smiles: list[str], directory: str) -> tuple[float, float]:
    """(molecules per CPU-second, per wall second) of one process doing every step of a corpus build."""
    from kermt.data.corpus_prep import prepare_corpus

    prepare_corpus({"warm-up": smiles[:50]}, os.path.join(directory, "warm"))  # imports, RDKit pattern caches
    start, cpu_start = time.perf_counter(), time.process_time()
    prepare_corpus({"moses": smiles}, os.path.join(directory, "single"))
    return len(smiles) / (time.process_time() - cpu_start), len(smiles) / (time.perf_counter() - start)


def single_only(smiles: list[str]) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch loads: spinning OpenMP threads distort a loaded machine
    import torch

    import kermt

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cpu, wall = single_process_rates(smiles, tmp)
    print(f"single process (kermt from {Path(kermt.__file__).parent}): {cpu:.0f} molecules per CPU-second, "
          f"{wall:.0f} molecules/s wall ({len(smiles)} molecules; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores)", flush=True)


def bytes_per_molecule(corpus_dir: str) -> dict[str, float]:
    from kermt.data.corpus import open_corpus

    corpus = open_corpus(corpus_dir)
    arrays = corpus.load()
    n = len(arrays)
    labels = arrays.fg_labels.nbytes + arrays.tokens.nbytes + arrays.atom_labels.nbytes + arrays.bond_labels.nbytes
    on_disk = sum(os.path.getsize(os.path.join(corpus_dir, s.path)) for s in corpus.manifest.shards)
    return {"graph in memory": arrays.graphs.nbytes / n, "labels + tokens in memory": labels / n,
            "shards on disk (Parquet zstd)": on_disk / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="MOSES molecules for the Ray build")
    parser.add_argument("--num_cpus", type=int, default=os.cpu_count(), help="CPUs of the local Ray cluster")
    parser.add_argument("--single_n", type=int, default=3000, help="molecules for the single-process rate")
    parser.add_argument("--rows_per_shard", type=int, default=50_000)
    parser.add_argument("--keep", help="write the Ray-built corpus here (default: a temporary directory)")
    parser.add_argument("--single_only", action="store_true", help="the single-process rate only (1 thread)")
    parser.add_argument("--kermt_from", help="import kermt from this directory (a tree holding kermt/)")
    args = parser.parse_args()
    if args.kermt_from:
        sys.path.insert(0, str(Path(args.kermt_from).resolve()))
    if args.single_only:
        single_only(moses_smiles(args.single_n))
        return

    smiles = moses_smiles(max(args.n, args.single_n))
    with tempfile.TemporaryDirectory() as tmp:
        single_cpu, single_wall = single_process_rates(smiles[:args.single_n], tmp)
        print(f"single process: {single_cpu:.0f} molecules per CPU-second, {single_wall:.0f} molecules/s wall "
              f"({args.single_n} molecules; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)",
              flush=True)
        source = os.path.join(tmp, f"moses_{args.n}.csv")
        Path(source).write_text("smiles\n" + "\n".join(smiles[:args.n]) + "\n")
        corpus_dir = args.keep or os.path.join(tmp, "corpus")

        from ray_app.common.cluster import connect
        from ray_app.pretrain.corpus_config import CorpusConfig
        from ray_app.pretrain.corpus import build_corpus

        connect(num_cpus=args.num_cpus)
        config = CorpusConfig(data_path=[source], save_dir=corpus_dir, rows_per_shard=args.rows_per_shard)
        start, cpu_start = time.perf_counter(), tree_cpu_s(os.getpid())
        manifest = build_corpus([source], ["smiles"], corpus_dir, config.vocab_settings, config.rows_per_shard,
                                config.rows_per_task)
        seconds, cpu_seconds = time.perf_counter() - start, tree_cpu_s(os.getpid()) - cpu_start
        rate, cpu_rate = manifest.n_molecules / seconds, manifest.n_molecules / cpu_seconds
        print(f"kermt corpus on Ray ({args.num_cpus} CPUs): {manifest.n_molecules} molecules "
              f"({manifest.n_invalid} invalid) in {seconds:.1f} s = {rate:.0f} molecules/s wall "
              f"({rate / (args.num_cpus * single_wall):.2f} x {args.num_cpus} x the single-process wall rate); "
              f"{cpu_rate:.0f} molecules per CPU-second ({cpu_rate / single_cpu:.2f} x single process); vocab "
              f"sizes atom {manifest.atom_vocab_size}, bond {manifest.bond_vocab_size}, smiles "
              f"{manifest.smiles_vocab_size}; {len(manifest.shards)} shards; load average {os.getloadavg()[0]:.1f}",
              flush=True)
        for name, value in bytes_per_molecule(corpus_dir).items():
            print(f"bytes per molecule, {name}: {value:.0f}")


if __name__ == "__main__":
    main()
