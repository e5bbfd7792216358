"""Sweep wall time of `kermt tune` with 1, 2, ... concurrent trials on CPU, and the speed-up over 1.

    python bench/tune.py [--n_trials 8] [--concurrency 1 2] [--n_molecules 200] [--epochs 3] [--num_cpus N]

Every run is the same sweep (random search with a fixed seed, so the same 8 parameter sets, FIFO scheduler, one
1-CPU worker per trial) of the fixture KERMT encoder (hidden 16) on N molecules of the bundled sample data, in
one local Ray cluster (``--num_cpus`` logical CPUs, default: the machine's). The wall time is the sweep's own
(``sweep.json``: Tuner start to results written; cluster start and featurisation excluded). A trial here is
mostly Ray Train start-up, which is exactly what running trials side by side hides. Prints a table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPACE = ("max_lr: {loguniform: [5.0e-4, 3.0e-3]}\nfinal_lr_factor: {choice: [2, 10]}\ninit_lr_factor: 10\n"
         "dropout: {choice: [0.0, 0.1]}\n")


def make_inputs(n: int, directory: Path) -> tuple[Path, Path]:
    with open(ROOT / "data/sample/admet_demo.csv") as f:
        rows = list(csv.reader(f))[: n + 1]
    data = directory / "data.csv"
    with open(data, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    space = directory / "space.yaml"
    space.write_text(SPACE)
    return data, space


def run_sweep(data: Path, space: Path, concurrent: int, args: argparse.Namespace, out: Path) -> dict:
    from ray_app.finetune.config import resolve
    from ray_app.tune.config import TuneConfig
    from ray_app.tune.driver import run_tune

    save_dir = out / f"c{concurrent}"
    config, sources = resolve([
        "--data_path", str(data), "--checkpoint_path", str(ROOT / "tests/data/kermt_upstream/ckpt_pretrain_vocab.pt"),
        "--save_dir", str(save_dir), "--epochs", str(args.epochs), "--batch_size", "16", "--ffn_hidden_size", "32",
        "--n_trials", str(args.n_trials), "--max_concurrent_trials", str(concurrent), "--search_space", str(space),
        "--search", "random", "--scheduler", "fifo", "--num_workers_per_trial", "1",
    ], TuneConfig, "kermt tune")
    summary = run_tune(config, sources, config.space())
    with open(save_dir / "all_trials.csv") as f:
        trials = list(csv.DictReader(f))
    return {"wall_s": summary["wall_s"], "completed": sum(t["status"] == "completed" for t in trials),
            "best": summary["best_objective"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n_trials", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--n_molecules", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num_cpus", type=int, default=None, help="logical CPUs of the local cluster")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from ray_app.common.cluster import connect

    resources = connect(num_cpus=args.num_cpus)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        data, space = make_inputs(args.n_molecules, Path(tmp))
        for concurrent in args.concurrency:
            results[concurrent] = run_sweep(data, space, concurrent, args, Path(tmp))
    base = results[args.concurrency[0]]["wall_s"]
    print(f"\n{args.n_trials}-trial sweep, {args.epochs} epochs x {args.n_molecules} molecules, 1 worker per trial, "
          f"cluster CPUs {resources.get('CPU')}, {os.cpu_count()} cores")
    print(f"{'concurrent trials':>18}  {'sweep wall (s)':>14}  {'speed-up':>8}  {'completed':>9}  {'best val':>9}")
    for concurrent, r in results.items():
        print(f"{concurrent:>18}  {r['wall_s']:>14.1f}  {base / r['wall_s']:>7.2f}x  {r['completed']:>9}  "
              f"{r['best']:>9.4f}")
    print(json.dumps({str(k): v for k, v in results.items()}))


if __name__ == "__main__":
    main()
