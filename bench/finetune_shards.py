"""Memory and speed of a finetune worker's data path (issue 41): one epoch of global batches from a training split
held whole in memory (what a worker held when each fold travelled as one object) against the same split read from
its shards a window at a time (kermt.data.molecule_shards + kermt.data.shard_stream, what a worker does now).

    nice -n 10 .venv/bin/python bench/finetune_shards.py [--sizes 20000 100000] [--shard_rows 5000] [--window 4]

* splits: the first N molecules of MOSES (data/moses/train.csv.gz, scripts/fetch_moses.py), featurised once and
  cached as shards of ``--shard_rows`` under runs/bench_finetune_shards/ (random targets: labels do not change
  the data path).
* each (mode, N) runs in a fresh process: "before" is the data path as it was (the set whole, each rank's share
  collated straight from it); "whole" reads every shard into one set first (a set held in memory: one shard of the
  plan), "shards" reads them as the epoch plan needs. Both then build each global batch of ``--batch`` molecules and
  rank 0's share of 2 ranks, as the member loop does, without the model's forward (the data path only).
* figures: peak RSS (VmHWM) of the process, and global batches/s. With production settings (25,000-molecule
  shards, windows of 4) a split up to 100,000 molecules is one window, so the bound shows only above that; the
  default here uses smaller shards to show it at sizes this machine featurises quickly.

Wall-clock figures on a shared machine are noisy: every line carries the load average.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CACHE = ROOT / "runs/bench_finetune_shards"
MOSES = ROOT / "data/moses/train.csv.gz"


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores"


def split_dir(n: int, shard_rows: int) -> Path:
    """The cached split of the first ``n`` MOSES molecules in shards (featurised once)."""
    from kermt.data.dataset import MoleculeSet
    from kermt.data.featurize import featurize_smiles
    from kermt.data.molecule_shards import write_split

    target = CACHE / f"moses_{n}_{shard_rows}"
    if (target / "manifest.json").exists():
        return target
    with gzip.open(MOSES, "rt") as f:
        next(f)
        smiles = [next(f).split(",")[0].strip() for _ in range(n)]
    started = time.perf_counter()
    done = featurize_smiles(smiles)
    assert done.valid.all()
    targets = np.random.default_rng(0).normal(size=(n, 1)).astype(np.float32)
    write_split(str(target), MoleculeSet(done.graphs, None, targets, done.smiles), shard_rows)
    print(f"featurised {n} molecules in {time.perf_counter() - started:.0f} s ({load_average()})", flush=True)
    return target


def one_epoch(directory: str, mode: str, window: int, batch: int) -> None:
    """Child process: one epoch of the data path; prints 'peak_mib batches_per_s'."""
    from kermt.data.molecule_shards import SplitManifest, TrainingSource, read_split, read_split_shard
    from kermt.data.sampling import worker_share
    from kermt.data.shard_stream import epoch_views

    manifest = SplitManifest.read(directory)
    if mode == "before":
        before_epoch(read_split(directory, manifest), batch)
        return
    if mode == "whole":
        source = TrainingSource.whole(read_split(directory, manifest))
    else:
        source = TrainingSource(manifest.rows, partial(read_split_shard, directory, manifest), window=window)
    started, count = time.perf_counter(), 0
    for view in epoch_views(source.plan(0), 0, batch, 0, source.load):  # as kermt.train.loop._rank_batches
        share = worker_share(np.arange(len(view.ids)), 0, 2)
        view.molecules.batch(view.positions[share], global_rows=view.positions,
                             neighbour_width=view.molecules.neighbour_width(view.positions), ids=view.ids[share])
        count += 1
    _print_figures(started, count)


def _print_figures(started: float, batches: int) -> None:
    seconds = time.perf_counter() - started
    peak = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM"))
    print(int(peak.split()[1]) // 1024, batches / seconds)


def before_epoch(train, batch: int) -> None:
    """The data path before the shards (as of 114c1f0): the set whole, the epoch a permutation of its rows, each
    share collated straight from the set."""
    from kermt.data.sampling import epoch_order, global_batches, worker_share

    started, count = time.perf_counter(), 0
    for rows in global_batches(epoch_order(len(train), 0, 0), batch):
        train.batch(worker_share(rows, 0, 2), global_rows=rows, neighbour_width=train.neighbour_width(rows))
        count += 1
    _print_figures(started, count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--shard_rows", type=int, default=5000)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--child", nargs=2, metavar=("DIR", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        one_epoch(args.child[0], args.child[1], args.window, args.batch)
        return
    print(f"shards of {args.shard_rows}, windows of {args.window}, global batch {args.batch}; {load_average()}")
    print(f"{'molecules':>10} {'mode':>7} {'peak RSS MiB':>13} {'batches/s':>10}  load")
    for n in args.sizes:
        directory = split_dir(n, args.shard_rows)
        for mode in ("before", "whole", "shards"):
            out = subprocess.run([sys.executable, __file__, "--child", str(directory), mode, "--window",
                                  str(args.window), "--batch", str(args.batch)], capture_output=True, text=True,
                                 check=True).stdout.split()
            print(f"{n:>10} {mode:>7} {int(out[0]):>13} {float(out[1]):>10.1f}  {load_average()}", flush=True)


if __name__ == "__main__":
    main()
