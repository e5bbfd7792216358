"""`kermt explore` at scale: rounds on the first N MOSES molecules, and where their time and memory go.

    .venv/bin/python scripts/fetch_moses.py                      # once: data/moses/train.csv.gz
    nice -n 19 .venv/bin/python bench/explore_scale.py --n 100000 300000 1000000 [--iterations 2] [--epochs 5]

For each N: the library is data/moses/moses_logp_{N}.csv (bench/scale.py's labelled_csv: the first N MOSES SMILES
with their RDKit Crippen logP, computed on Ray Data and cached; the time is printed when it is computed), and the
objective is ``lookup:`` on the same file (maximise logP). The surrogate is bench/explore.py's SURROGATE (the fixture
encoder with rdkit_2d_normalized descriptors) for ``--epochs`` epochs; each batch is ``--batch`` molecules (a count,
so the finetune costs the same at every N and what grows with N stands out).

`kermt explore` runs as a child process with its own local Ray cluster, watched twice a second: the driver's peak
RSS (VmHWM), the peak PSS summed over the driver and every Ray process it started (bench/scale.py's TreeMemory), and
the moment each of the exploration's files is written, which splits a round into its steps:

* round 0 and the start: counting the library's rows, the lookup scores of every row
  (DIR/library_lookup_scores.npy), the random first batch read from the library and scored;
* per later round k: the surrogate's finetune (round_k/scored.csv to the run record), featurising the library once
  (round 1 only: to DIR/library/manifest.json), predicting the library (to library_predictions.parquet), and the
  acquisition (reading the predictions, choosing, reading the batch's SMILES from the library, scoring, writing
  explored.csv).

``--acquisition_rows R`` (with ``--n`` and no sizes: only this) also measures the driver's part of a round alone on
R predictions (``--acquisitions``, default greedy and ucb), each in a fresh process, two ways: ``whole`` (the way
before kermt.explore.blocks: the file's mean and std read whole, acquisition_values and top_batch on whole-library
arrays) and ``blocks`` (the driver's way now: prediction_blocks into acquire_in_blocks); their time, peak RSS a
molecule, and a digest of the rows chosen (the two ways must print the same).

``--smiles_rows R`` times reading a batch's SMILES (1 % of R rows, then 1,000, drawn at random) two ways: from
the library file (Library.smiles: one pass over its SMILES column, the way round 0 and --acquisition random still
read them) and from the featurised library's shards (Shards.take: the SMILES column of the shards holding the rows;
here shards of 1,024 rows holding only that column). The library is the first R MOSES SMILES as a CSV.

Figures depend on the machine and what else runs on it: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from explore import SURROGATE
from scale import TreeMemory, _descendants, labelled_csv

from kermt.run_layout import RunLayout


def cpu_s_by_pid(root: int) -> dict[int, float]:
    """User + system CPU seconds of ``root`` and each live descendant (the driver and its local Ray cluster)."""
    found = {}
    for pid in _descendants(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            found[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            continue
    return found


class FileClock(threading.Thread):
    """When each watched file is first seen (with the tree's CPU seconds then), and every new modification time of
    explored.csv's record that counts one more round (the csv is also touched when it is made and while a round is
    appended; the record is also written when the file is made)."""

    def __init__(self, layout: RunLayout, iterations: int, root: int) -> None:
        super().__init__(daemon=True)
        self.layout, self.stop, self.root = layout, threading.Event(), root
        self.cpu: dict[str, float] = {}
        # every process's CPU seconds when last seen: one that ended (a finetune's workers) keeps what it used, up
        # to half a second short
        self.last_cpu: dict[int, float] = {}
        self.watched = {"lookup scores": layout.explore_lookup_scores,
                        "featurised": layout.explore_library / "manifest.json"}
        for k in range(1, iterations + 1):
            self.watched |= {f"r{k} training": layout.round_training(k),
                             f"r{k} finetuned": RunLayout(layout.round(k)).run_record,
                             f"r{k} predicted": layout.round_predictions(k)}
        self.seen: dict[str, float] = {}
        self.rounds: list[float] = []  # explored.rounds.json's modification times: each round's end
        self.load = [os.getloadavg()[0]] * 2

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.last_cpu |= cpu_s_by_pid(self.root)
            for name, path in self.watched.items():
                if name not in self.seen and path.exists():
                    self.seen[name] = path.stat().st_mtime
                    self.cpu[name] = sum(self.last_cpu.values())  # up to half a second late
            self.note_round()
            load = os.getloadavg()[0]
            self.load = [min(self.load[0], load), max(self.load[1], load)]

    def note_round(self) -> None:
        record = self.layout.explored_record
        try:
            modified, rounds = record.stat().st_mtime, json.loads(record.read_text())["rounds"]
        except (OSError, ValueError):  # not there yet (it is replaced whole, never half written)
            return
        if rounds > len(self.rounds):
            self.rounds.append(modified)


CPU_STEPS = {"featurise the library once": ("r1 finetuned", "featurised"),
             "round 1 predict": ("featurised", "r1 predicted"), "round 2 predict": ("r2 finetuned", "r2 predicted")}


def steps(clock: FileClock, started: float, iterations: int) -> list[tuple[str, float]]:
    """(step, seconds), from the moments the files were written."""
    seen, ends = clock.seen, clock.rounds
    out = [("start + round 0 (lookup scores of every row at +%.0f s)" % (seen["lookup scores"] - started),
            ends[0] - started)]
    for k in range(1, iterations + 1):
        finetuned = seen[f"r{k} finetuned"]
        out.append((f"round {k}: finetune", finetuned - seen[f"r{k} training"]))
        if k == 1:
            out.append(("round 1: featurise the library once", seen["featurised"] - finetuned))
        ready = seen["featurised"] if k == 1 else finetuned
        out.append((f"round {k}: predict the library", seen[f"r{k} predicted"] - ready))
        out.append((f"round {k}: acquire, read SMILES, score, record", ends[k] - seen[f"r{k} predicted"]))
    return out


def explore(n: int, args: argparse.Namespace) -> None:
    made = time.perf_counter()
    library = labelled_csv(n)
    if time.perf_counter() - made > 5:
        print(f"N={n:,}: logP of every molecule computed on Ray Data in {time.perf_counter() - made:.0f} s "
              f"({n / (time.perf_counter() - made):,.0f} molecules/s)", flush=True)
    save_dir = Path(args.save_dir) / f"n{n}"
    if save_dir.exists():
        raise SystemExit(f"{save_dir} exists: give another --save_dir (the bench times a fresh exploration)")
    cmd = [sys.executable, "-m", "ray_app.cli", "explore", "--library", str(library), "--objective",
           f"lookup:{library}:logp", "--init_size", str(args.batch), "--acquire_size", str(args.batch),
           "--iterations", str(args.iterations), "--acquisition", "greedy", "--seed", "0", "--save_dir",
           str(save_dir), *SURROGATE, "--epochs", str(args.epochs)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a private local cluster
    started = time.time()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    memory, clock = TreeMemory(proc.pid), FileClock(RunLayout(save_dir), args.iterations, proc.pid)
    memory.start()
    clock.start()
    out, _ = proc.communicate(timeout=args.timeout)
    memory.stop.set()
    clock.stop.set()
    memory.join()
    clock.join()
    if proc.returncode:
        raise SystemExit(f"kermt explore failed (status {proc.returncode}):\n{out[-3000:]}")
    print("".join(line + "\n" for line in out.splitlines() if line.startswith("round ")), end="")
    total = clock.rounds[-1] - started
    print(f"N={n:,}: {total:.0f} s in all, driver peak RSS {memory.driver_peak_kb / 2**20:.2f} GiB, every Ray "
          f"process (PSS) {memory.total_peak_kb / 2**20:.2f} GiB, load average {clock.load[0]:.1f}-"
          f"{clock.load[1]:.1f}")
    for name, seconds in steps(clock, started, args.iterations):
        rate = f"  ({n / seconds:,.0f} molecules/s)" if "featurise" in name or "predict" in name else ""
        print(f"  {name:55s} {seconds:8.1f} s{rate}", flush=True)
    for name, (begin, end) in CPU_STEPS.items():  # per CPU-second: what a cluster's CPUs would do, load aside
        if begin in clock.cpu and end in clock.cpu:
            used = clock.cpu[end] - clock.cpu[begin]
            print(f"  {name}: {used:.0f} CPU-s ({n / used:,.0f} molecules per CPU-second)")
    size = sum(f.stat().st_size for f in (save_dir / "library").rglob("*") if f.is_file())
    print(f"  DIR/library/: {size / 2**20:,.0f} MiB ({size / n:,.0f} bytes a molecule); a round's predictions "
          f"{RunLayout(save_dir).round_predictions(1).stat().st_size / n:.1f} bytes a molecule", flush=True)


def acquisition_memory(n: int, acquisition: str, way: str, save_dir: Path) -> None:
    """The driver's part of a round at ``n`` library rows, alone: a predictions file (mean, std), 1 % of its rows
    explored, a batch of 1 % chosen ``way`` (whole or blocks); its peak RSS over the process's before it (the file
    is written by another process, so its high-water mark is not counted)."""
    path = save_dir / f"predictions_{n}_in_blocks.parquet"
    if not path.exists():
        subprocess.run([sys.executable, __file__, "--child_write", str(n), str(path)], check=True)
    subprocess.run([sys.executable, __file__, "--child_acquire", acquisition, way, str(path)], check=True)


def _child_write(n: int, path: str) -> None:
    """A predictions file of ``n`` rows written as run_predict writes a round's (its TableWriter, given blocks of
    rows_per_block(PREDICT_BATCH_SIZE) rows)."""
    import pyarrow as pa

    from kermt.presets import PREDICT_BATCH_SIZE
    from ray_app.screening.files import TableWriter
    from ray_app.screening.stream import rows_per_block

    rng = np.random.default_rng(0)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    writer, block = TableWriter(path), rows_per_block(PREDICT_BATCH_SIZE)
    for start in range(0, n, block):
        rows = min(block, n - start)
        writer.write(pa.table({"smiles": pa.array(["C"] * rows), "score": rng.normal(size=rows),
                               "score_std": rng.random(rows)}))
    writer.commit()


def _chosen_whole(acquisition: str, path: str, explored: np.ndarray, size: int, rng: np.random.Generator):
    import pyarrow.parquet as pq

    from kermt.explore.acquisition import Surrogate, acquisition_values, top_batch

    table = pq.read_table(path, columns=["score", "score_std"])
    surrogate = Surrogate(*(table.column(i).to_numpy().astype(np.float64) for i in range(2)))
    del table
    excluded = np.zeros(len(surrogate.mean), dtype=bool)
    excluded[explored] = True
    return top_batch(acquisition_values(acquisition, surrogate, 3.0, rng), excluded, size)


def _chosen_blocks(acquisition: str, path: str, explored: np.ndarray, size: int, rng: np.random.Generator):
    import pyarrow.parquet as pq

    from kermt.explore.blocks import acquire_in_blocks
    from ray_app.explore.surrogate import prediction_blocks

    rows = pq.ParquetFile(path).metadata.num_rows
    return acquire_in_blocks(acquisition, prediction_blocks(Path(path), rows), explored, size, 3.0, rng).rows


def _child_acquire(acquisition: str, way: str, path: str) -> None:
    import hashlib

    import pyarrow.parquet as pq

    from kermt.explore.acquisition import round_rng
    from ray_app.explore.surrogate import prediction_blocks  # noqa: F401 - its imports before the baseline

    n = pq.ParquetFile(path).metadata.num_rows
    explored = np.random.default_rng(1).choice(n, n // 100, replace=False)
    before, started = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    chosen = (_chosen_whole if way == "whole" else _chosen_blocks)(acquisition, path, explored, n // 100,
                                                                   round_rng(0, 1))
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    digest = hashlib.sha256(np.asarray(chosen, np.int64).tobytes()).hexdigest()[:12]
    print(f"acquisition {acquisition:8s} {way:6s} on {n:,} predictions: {time.perf_counter() - started:5.1f} s, "
          f"peak RSS {grown / 2**20:,.0f} MiB over the process's before ({grown / n:.1f} bytes a molecule), "
          f"{len(chosen):,} rows chosen (sha256 {digest}), load average {os.getloadavg()[0]:.1f}", flush=True)


def smiles_reads(n: int, save_dir: Path) -> None:
    """A 1 % batch's SMILES from an ``n``-row library CSV and from its shards: seconds each, the same list."""
    import gzip
    import json

    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from ray_app.explore.library import open_library
    from ray_app.screening.shards import Shards
    from ray_app.screening.stream import InputSpec

    folder = save_dir / f"smiles_{n}"
    if not (folder / "library.csv").exists():
        with gzip.open(ROOT / "data" / "moses" / "train.csv.gz", "rt") as f:
            smiles = [line.strip() for _, line in zip(range(n + 1), f)][1:]
        (folder / "shards").mkdir(parents=True, exist_ok=True)
        pacsv.write_csv(pa.table({"smiles": smiles}), folder / "library.csv")
        files = [f"shard_{i:06d}.parquet" for i in range(0, (n + 1023) // 1024)]
        for i, name in enumerate(files):
            pq.write_table(pa.table({"smiles": smiles[i * 1024:(i + 1) * 1024]}), folder / "shards" / name)
        (folder / "shards" / "files.json").write_text(json.dumps(files))
    files = json.loads((folder / "shards" / "files.json").read_text())
    shards = Shards(folder / "shards", n, tuple(files), InputSpec("smiles"),
                    tuple(min(1024, n - i * 1024) for i in range(len(files))))
    library = open_library(str(folder / "library.csv"), None)
    for size in (n // 100, 1000):
        rows = np.random.default_rng(0).choice(n, size, replace=False)
        started = time.perf_counter()
        from_file = library.smiles(rows)
        middle = time.perf_counter()
        from_shards = shards.take(rows, "smiles")
        ended = time.perf_counter()
        assert from_file == from_shards, "the two reads disagree"
        touched = len(np.unique(rows // 1024))
        print(f"SMILES of {size:,} rows of {n:,}: from the library CSV {middle - started:.2f} s, from {touched:,} of "
              f"{len(files):,} shards {ended - middle:.2f} s (the same SMILES), load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="*", default=[100_000],
                        help="library sizes to explore (none: only --acquisition_rows)")
    parser.add_argument("--batch", type=int, default=1000, help="molecules per batch (round 0 and each round)")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--save_dir", default="runs/bench_explore_scale")
    parser.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per exploration")
    parser.add_argument("--acquisition_rows", type=int, help="also measure the acquisition alone on this many "
                        "predictions, e.g. 10000000")
    parser.add_argument("--acquisitions", nargs="+", default=["greedy", "ucb"],
                        help="the acquisitions --acquisition_rows measures")
    parser.add_argument("--ways", nargs="+", default=["whole", "blocks"], choices=["whole", "blocks"],
                        help="--acquisition_rows: the whole-array way (before) and the blocks (now)")
    parser.add_argument("--smiles_rows", type=int, help="also time a 1 %% batch's SMILES read from a library CSV of "
                        "this many rows and from its shards, e.g. 1000000")
    parser.add_argument("--child_write", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--child_acquire", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_write:
        return _child_write(int(args.child_write[0]), args.child_write[1])
    if args.child_acquire:
        return _child_acquire(*args.child_acquire)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    for n in args.n:
        explore(n, args)
    if args.smiles_rows:
        smiles_reads(args.smiles_rows, Path(args.save_dir))
    for acquisition in args.acquisitions if args.acquisition_rows else ():
        for way in args.ways:
            acquisition_memory(args.acquisition_rows, acquisition, way, Path(args.save_dir))


if __name__ == "__main__":
    main()
