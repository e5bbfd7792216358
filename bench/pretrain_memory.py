"""Memory and speed of `kermt pretrain` reading its corpus in shards (issue 41), against the version before, which
read the whole corpus into one object-store object that every node held.

    nice -n 10 .venv/bin/python bench/pretrain_memory.py [--sizes 20000 200000] [--steps 200] [--before REV]

* corpora: from a MOSES corpus prepared by ``bench/corpus.py --keep`` (``--source``, default data/moses/corpus_50k):
  the first N molecules, or the source repeated up to N molecules (the loop's memory and speed do not depend on
  which molecules they are; the repeats are said in the output), written in shards of ``--rows_per_shard``
  molecules and cached under runs/bench_pretrain_memory/.
* before: ``git archive REV kermt ray_app`` extracted to a temporary tree, whose `kermt pretrain` runs with that tree
  first on PYTHONPATH (its Ray workers inherit it); after: this tree. Same flags, except ``--shuffle_window``.
* figures: peak RSS (VmHWM) of the driver and of each Ray Train worker (the largest; shared object-store pages a
  worker maps count in its RSS), and of the other Ray worker processes (the before version's read task); molecules/s
  is the median of the loop's own per-interval figures (metrics.csv), the first interval dropped.

Wall-clock figures on a shared machine are noisy: every line carries the load average.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "runs/bench_pretrain_memory"
MODEL = ["--pretrain_mode", "vocab", "--hidden_size", "64", "--depth", "3", "--num_attn_head", "4"]


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores"


def build_corpus(source: str, n: int, rows_per_shard: int) -> tuple[Path, str]:
    """The cached corpus of ``n`` molecules in shards (built once), and how it was made."""
    from kermt.data.corpus import (CorpusArrays, ShardInfo, open_corpus, shard_path, write_manifest, write_shard,
                                   write_vocabs)

    corpus = open_corpus(source)
    repeats = -(-n // len(corpus))
    made = f"first {n} of {source}" if repeats == 1 else f"{source} ({len(corpus)}) repeated to {n}"
    target = CACHE / f"corpus_{n}_{rows_per_shard}"
    if (target / "manifest.json").exists():
        return target, made
    arrays = corpus.load()
    whole = CorpusArrays.concat([arrays] * repeats) if repeats > 1 else arrays
    shards = []
    for i, start in enumerate(range(0, n, rows_per_shard)):
        part = whole.take(np.arange(start, min(start + rows_per_shard, n)))
        write_shard(str(target / shard_path(i)), part)
        shards.append(ShardInfo(shard_path(i), len(part)))
    write_vocabs(str(target), corpus.atom_vocab, corpus.bond_vocab, corpus.smiles_vocab)
    write_manifest(str(target), replace(corpus.manifest, n_molecules=n, shards=tuple(shards)))
    return target, made


def _peak_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(root: int) -> dict[int, str]:
    """{pid: command line} of every process below ``root``."""
    parents, names = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                names[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found[child] = names.get(child, "")
                frontier.append(child)
    return found


class PeakSampler:
    """Polls the driver's and its Ray workers' VmHWM (a per-process peak, so a poll every second loses nothing but
    the last second of a process that exits)."""

    def __init__(self, driver: int) -> None:
        self.driver, self.peaks, self.kinds = driver, {}, {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peaks[self.driver] = max(self.peaks.get(self.driver, 0), _peak_kib(self.driver))
            for pid, command in _descendants(self.driver).items():
                if command.startswith("ray::"):
                    self.kinds[pid] = "train" if "RayTrainWorker" in command else "other"
                    self.peaks[pid] = max(self.peaks.get(pid, 0), _peak_kib(pid))
            time.sleep(1.0)

    def result(self) -> tuple[float, float, float]:
        """Peak MiB of the driver, the largest train worker and the largest other Ray worker."""
        self.stop.set()
        self.thread.join()
        largest = {kind: max([self.peaks[p] for p, k in self.kinds.items() if k == kind], default=0)
                   for kind in ("train", "other")}
        return self.peaks.get(self.driver, 0) / 1024, largest["train"] / 1024, largest["other"] / 1024


def run(tree: Path, corpus: Path, save_dir: Path, args: argparse.Namespace, extra: list[str]) -> dict[str, float]:
    workers = 2
    cmd = [sys.executable, "-m", "ray_app.cli", "pretrain", "--data_path", str(corpus), "--save_dir", str(save_dir),
           *MODEL, "--epochs", "1", "--batch_size", str(args.global_batch // workers), "--num_workers", str(workers),
           "--seed", "0", "--stop_after_steps", str(args.steps), "--train_interval", str(args.interval),
           "--save_interval", str(10 * args.steps), *extra]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    for attempt in range(3):  # a loaded machine sometimes fails Ray's start ("timed out during startup"): retried
        driver = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sampler = PeakSampler(driver.pid)
        out, _ = driver.communicate()
        peaks = sampler.result()
        if not driver.returncode:
            break
        if "timed out during startup" not in out or attempt == 2:
            sys.exit(f"{' '.join(cmd)} failed:\n{out[-3000:]}")
        print(f"Ray did not start ({load_average()}): again", flush=True)
    with open(save_dir / "metrics.csv") as handle:
        rates = [float(r["molecules_per_s"]) for r in csv.DictReader(handle) if r.get("molecules_per_s")]
    return {"driver": peaks[0], "worker": peaks[1], "other": peaks[2],
            "rate": statistics.median(rates[1:] or rates)}


def before_tree(rev: str, directory: Path) -> Path:
    archive = directory / "before.tar"
    with open(archive, "wb") as handle:
        subprocess.run(["git", "archive", rev, "kermt", "ray_app"], cwd=ROOT, stdout=handle, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(directory / "before", filter="data")
    return directory / "before"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(ROOT / "data/moses/corpus_50k"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--rows_per_shard", type=int, default=2_500)
    parser.add_argument("--shuffle_window", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--interval", type=int, default=20)
    parser.add_argument("--global_batch", type=int, default=64)
    parser.add_argument("--before", default=None, help="git revision of the whole-corpus version (skip: none)")
    args = parser.parse_args()
    print(f"2 workers, global batch {args.global_batch}, {args.steps} steps, vocab mode hidden 64 depth 3; shards "
          f"of {args.rows_per_shard}, --shuffle_window {args.shuffle_window}", flush=True)
    print("version  molecules  driver MiB  worker MiB  other Ray MiB  molecules/s  (corpus; load)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        trees = [("after", ROOT, ["--shuffle_window", str(args.shuffle_window)])]
        if args.before:
            trees.insert(0, ("before", before_tree(args.before, Path(tmp)), []))
        for n in args.sizes:
            corpus, made = build_corpus(args.source, n, args.rows_per_shard)
            for name, tree, extra in trees:
                got = run(tree, corpus, Path(tmp) / f"{name}_{n}", args, extra)
                print(f"{name:7s}  {n:9d}  {got['driver']:10.0f}  {got['worker']:10.0f}  {got['other']:13.0f}  "
                      f"{got['rate']:11.0f}  ({made}; {load_average()})", flush=True)


if __name__ == "__main__":
    main()
