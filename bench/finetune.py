"""Finetune throughput: epoch time and molecules/s for `kermt finetune` with 1 and 2 workers, next to upstream.

    python bench/finetune.py [--n_molecules 1000] [--epochs 2] [--workers 1 2] [--upstream /path/to/KERMT]

Default model = the release architecture (hidden 800, depth 6, 4 heads, self-attention readout, FFN 700 x 3,
rdkit_2d_normalized features), trained from scratch on N molecules of upstream's sample SMILES with an RDKit logP
label. Epoch time is the training part of each epoch after the first (featurisation, cluster start and
validation excluded), read from metrics.csv (ours) and from upstream's `t_time` log lines. Prints a table.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from upstream_env import upstream_env  # bench/ is on sys.path when this script runs

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests/data/kermt_upstream_splits/train_val.csv"


def make_data(n: int, directory: Path) -> Path:
    from rdkit import Chem
    from rdkit.Chem import Crippen

    with open(SOURCE) as f:
        smiles = [row[0] for row in list(csv.reader(f))[1 : n + 1]]
    path = directory / "bench.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["smiles", "logp"])
        writer.writerows([s, f"{Crippen.MolLogP(Chem.MolFromSmiles(s)):.4f}"] for s in smiles)
    return path


def model_flags(args: argparse.Namespace) -> list[str]:
    return ["--hidden_size", str(args.hidden_size), "--depth", "6", "--num_attn_head", "4", "--activation", "PReLU",
            "--self_attention", "--attn_hidden", "4", "--attn_out", "8", "--ffn_hidden_size", str(args.ffn_hidden_size),
            "--ffn_num_layers", "3", "--features_generator", "rdkit_2d_normalized", "--no_features_scaling",
            "--dataset_type", "regression", "--epochs", str(args.epochs), "--batch_size", str(args.batch_size),
            "--split_sizes", "0.8", "0.1", "0.1", "--seed", "0"]


def run_ours(data: Path, workers: int, args: argparse.Namespace, out: Path) -> list[float]:
    save_dir = out / f"ours_w{workers}"
    cmd = [str(Path(sys.executable).parent / "kermt"), "finetune", "--data_path", str(data), "--save_dir",
           str(save_dir), "--num_workers", str(workers), *model_flags(args)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(save_dir / "fold_0/model_0/metrics.csv") as f:
        return [float(row["train_time_s"]) for row in csv.DictReader(f)]


def run_upstream(data: Path, upstream: Path, args: argparse.Namespace, out: Path) -> list[float]:
    env = upstream_env(upstream, out)
    cmd = [sys.executable, "main.py", "finetune", "--data_path", str(data), "--save_dir", str(out / "upstream"),
           "--no_cuda", "--embedding_output_type", "atom", *model_flags(args)]
    done = subprocess.run(cmd, cwd=upstream, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"upstream finetune failed:\n{done.stderr[-2000:]}")
    return [float(t) for t in re.findall(r"t_time: ([0-9.]+)s", done.stdout + done.stderr)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n_molecules", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=32, help="per worker")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--hidden_size", type=int, default=800)
    parser.add_argument("--ffn_hidden_size", type=int, default=700)
    parser.add_argument("--upstream", type=Path, help="upstream KERMT checkout to measure in the same run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        data = make_data(args.n_molecules, out)
        n_train = int(0.8 * args.n_molecules)
        rows = []
        for workers in args.workers:
            times = run_ours(data, workers, args, out)
            rows.append((f"kermt-ray, {workers} worker(s), global batch {workers * args.batch_size}", times))
        if args.upstream:
            rows.append((f"upstream main.py finetune, batch {args.batch_size}", run_upstream(data, args.upstream,
                                                                                            args, out)))
    print(f"{n_train} training molecules, hidden {args.hidden_size}, {os.cpu_count()} CPUs")
    print(f"{'run':55s} {'epoch train s':>14s} {'molecules/s':>12s}")
    for name, times in rows:
        steady = times[1:] or times  # the first epoch includes warm-up
        epoch = sum(steady) / len(steady)
        print(f"{name:55s} {epoch:14.1f} {n_train / epoch:12.2f}")


if __name__ == "__main__":
    main()
