"""Screening throughput and memory: `kermt predict` on N SMILES (CPU), next to upstream's `main.py predict`.

    python bench/predict.py [--sizes 10000 100000] [--checkpoint tests/data/kermt_upstream/ckpt_ft_cls.pt]
                            [--engines auto local ray] [--concurrency 1] [--upstream /path/to/KERMT] [--moses]
                            [--attributions]

Each size runs ``kermt predict --engine E`` for every E of ``--engines`` (auto picks local, in this process, or
ray by the input's size: ray_app/screening/local.py), cold: a new process each time, as a user's command is.

Input: upstream's sample SMILES (tests/data/kermt_upstream_splits/train_val.csv) repeated to N rows, plus an id
column. Each command runs as a child process; a sampler reads /proc every 0.2 s and records the peak RSS of the
command's own process (the driver) and of its whole process tree (for ours: driver + the local Ray cluster it
starts: GCS, raylet, workers, actors). Wall time includes start-up (Ray cluster / imports); molecules/s divides N by
it. ``--attributions``: each engine's command again with ``--attributions``, in the same run. Streaming means the
driver's peak RSS must not grow from 10k to 100k rows; upstream holds the whole dataset.
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from upstream_env import upstream_env  # bench/ is on sys.path when this script runs

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests/data/kermt_upstream_splits/train_val.csv"
FIXTURES = ROOT / "tests/data/kermt_upstream"
MOSES = ROOT / "data/moses/train.csv.gz"


def _source_smiles(n: int, moses: bool) -> list[str]:
    """The sample SMILES (repeated to N rows), or the first N of MOSES (scripts/fetch_moses.py: 1,584,663 ZINC
    molecules, every one different)."""
    if not moses:
        with open(SOURCE) as f:
            return [row["smiles"] for row in csv.DictReader(f)]
    import pandas as pd

    smiles = pd.read_csv(MOSES, nrows=n).iloc[:, 0].tolist()
    if len(smiles) < n:
        raise SystemExit(f"{MOSES} holds {len(smiles)} molecules, fewer than --sizes {n}")
    return smiles


def make_data(n: int, path: Path, ids: bool = True, moses: bool = False) -> Path:
    """N rows of SMILES; ``ids`` adds a compound column (upstream would read it as a target)."""
    smiles = _source_smiles(n, moses)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["smiles", "compound"] if ids else ["smiles"])
        writer.writerows([smiles[i % len(smiles)], f"cpd-{i}"][: 2 if ids else 1] for i in range(n))
    return path


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _tree_rss_kb(root: int) -> int:
    tree, total, stack = _children(), 0, [root]
    while stack:
        pid = stack.pop()
        total += _rss_kb(pid)
        stack += tree.get(pid, [])
    return total


@dataclass
class Measured:
    seconds: float
    driver_peak_mb: float
    tree_peak_mb: float


def measure(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> Measured:
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks = {"driver": 0, "tree": 0}

    def sample() -> None:
        while proc.poll() is None:
            peaks["driver"] = max(peaks["driver"], _rss_kb(proc.pid))
            peaks["tree"] = max(peaks["tree"], _tree_rss_kb(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed:\n{err[-3000:]}")
    return Measured(time.perf_counter() - started, peaks["driver"] / 1024, peaks["tree"] / 1024)


def run_ours(data: Path, checkpoint: Path, args: argparse.Namespace, out: Path, engine: str,
             attributions: bool = False) -> Measured:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)  # a cluster named in the environment would decide auto's engine
    concurrency = ["--concurrency", str(args.concurrency)] if args.concurrency is not None else []
    cmd = [sys.executable, "-m", "ray_app.cli", "predict", "--data_path", str(data), "--checkpoint_path",
           str(checkpoint), "--output_path", str(out / "ours.csv"), "--batch_size", str(args.batch_size),
           "--id_columns", "compound", "--engine", engine, *concurrency, *(["--attributions"] if attributions else [])]
    measured = measure(cmd, cwd=ROOT, env=env)
    with open(out / "ours.csv") as f:  # every input row has its output row, in order
        rows = sum(1 for _ in f) - 1
    with open(data) as f:
        expected = sum(1 for _ in f) - 1
    if rows != expected:
        raise RuntimeError(f"kermt predict wrote {rows} rows for {expected} input rows")
    return measured


def run_upstream(data: Path, checkpoint: Path, upstream: Path, args: argparse.Namespace, out: Path) -> Measured:
    models = out / "upstream_models"
    models.mkdir(exist_ok=True)
    shutil.copy(checkpoint, models / "model.pt")
    features = ["--features_generator", "rdkit_2d_normalized", "--no_features_scaling"] if args.features else []
    cmd = [sys.executable, "main.py", "predict", "--data_path", str(data), "--checkpoint_dir", str(models),
           "--output_path", str(out / "upstream.csv"), "--batch_size", str(args.batch_size), "--no_cuda", *features]
    return measure(cmd, cwd=upstream, env=upstream_env(upstream, out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000])
    parser.add_argument("--checkpoint", type=Path, default=FIXTURES / "ckpt_ft_cls.pt")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--engines", nargs="+", default=["auto", "ray"], choices=["auto", "local", "ray"])
    parser.add_argument("--concurrency", type=int, help="model actors (--engine ray; default: kermt's own)")
    parser.add_argument("--upstream", type=Path, help="upstream KERMT checkout to measure in the same run")
    parser.add_argument("--attributions", action="store_true", help="also run each engine's command with "
                        "--attributions (per-atom attributions of every task), next to the plain one")
    parser.add_argument("--moses", action="store_true", help="the first N MOSES molecules instead of the sample "
                        "SMILES repeated (scripts/fetch_moses.py; --sizes 1584663 is all of them)")
    args = parser.parse_args()
    args.features = "reg" in args.checkpoint.name  # the fixture regression models use rdkit_2d_normalized
    print(f"checkpoint {args.checkpoint.name}, batch {args.batch_size}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'run':<48}{'rows':>8}{'wall s':>9}{'mol/s':>9}{'driver peak MB':>16}{'tree peak MB':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for n in args.sizes:
            data = make_data(n, out / f"in_{n}.csv", moses=args.moses)
            runs = [(f"kermt predict --engine {engine}", functools.partial(run_ours, data, args.checkpoint, args, out,
                                                                            engine)) for engine in args.engines]
            runs += [(f"kermt predict --engine {engine} --attributions", functools.partial(
                run_ours, data, args.checkpoint, args, out, engine, True)) for engine in args.engines
                     if args.attributions]
            if args.upstream:
                plain = make_data(n, out / f"in_{n}_smiles_only.csv", ids=False, moses=args.moses)
                runs.append(("upstream main.py predict",
                             functools.partial(run_upstream, plain, args.checkpoint, args.upstream, args, out)))
            for name, run in runs:
                m = run()
                print(f"{name:<48}{n:>8}{m.seconds:>9.1f}{n / m.seconds:>9.0f}{m.driver_peak_mb:>16.0f}"
                      f"{m.tree_peak_mb:>14.0f}", flush=True)


if __name__ == "__main__":
    main()
