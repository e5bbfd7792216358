"""Pretraining throughput on CPU: molecules/s of `kermt pretrain` with 1 and 2 workers (same global batch), next to
upstream's pretraining step loop on the same corpus slice and model size.

    nice -n 5 .venv/bin/python bench/pretrain_throughput.py [--corpus data/moses/corpus_100k] [--steps 120]
        [--workers 1 2] [--upstream /path/to/KERMT]

* ours: ``kermt pretrain --pretrain_mode vocab`` on the corpus (``bench/corpus.py --keep``), global batch
  ``--global_batch`` split over the workers, stopped after ``--steps`` steps; molecules/s are the loop's own
  per-interval figures (``metrics.csv``: training time only, cluster start and checkpoints excluded), the first
  interval (warm-up) dropped.
* upstream (``--upstream``): ``pretrain_ddp.py`` itself cannot run on a CPU machine (its process group is NCCL and
  its trainer moves the model to ``cuda:rank``), so its vocab-mode step is timed as ``KERMTTrainer.iter`` runs it:
  a ``DataLoader`` with ``KermtCollator`` (upstream featurises and masks each batch in the loop, ``num_workers``
  0, its default), ``KermtTask`` forward, the task's loss, ``zero_grad`` / ``backward`` / Adam ``step`` / NoamLR
  ``step``, in one process with one torch thread (a Ray worker's share), on the corpus's first molecules with the
  corpus's vocabularies and functional-group labels. Upstream's package is imported in a child process with
  ``bench/upstream_env.py``'s stubs; the model's CUDA profiler labels are made no-ops.

Wall-clock figures on a shared machine are noisy: every line carries the load average.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERMT = str(Path(sys.executable).parent / "kermt")
MODEL = dict(hidden_size=64, depth=3, num_attn_head=4)


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores"


def run_ours(args: argparse.Namespace, workers: int, save_dir: Path) -> list[float]:
    """Molecules/s per logged interval of one ``kermt pretrain`` run, the first interval dropped."""
    if args.global_batch % workers:
        sys.exit(f"--global_batch {args.global_batch} does not split over {workers} workers")
    cmd = [KERMT, "pretrain", "--data_path", str(args.corpus), "--pretrain_mode", "vocab", "--save_dir",
           str(save_dir), *[f for k, v in MODEL.items() for f in (f"--{k}", str(v))], "--epochs", "1",
           "--batch_size", str(args.global_batch // workers), "--num_workers", str(workers), "--seed", "0",
           "--stop_after_steps", str(args.steps), "--train_interval", str(args.interval), "--save_interval",
           str(10 * args.steps)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    with open(save_dir / "metrics.csv") as handle:
        rates = [float(row["molecules_per_s"]) for row in csv.DictReader(handle) if row.get("molecules_per_s")]
    return rates[1:] or rates


UPSTREAM_CHILD = r'''
import sys, time
import numpy as np, pyarrow.parquet as pq, torch
from torch.utils.data import DataLoader

corpus, n_steps, batch_size, hidden, depth, heads = sys.argv[1], *map(int, sys.argv[2:7])
torch.set_num_threads(1)
torch.cuda.nvtx.range_push = torch.cuda.nvtx.range_pop = lambda *a, **k: None  # profiler labels; CPU torch refuses
from argparse import ArgumentParser
from kermt.data.moldataset import MoleculeDatapoint
from kermt.data.kermtdataset import KermtCollator
from kermt.data.torchvocab import MolVocab
from kermt.model.models import KERMTEmbedding, KermtTask
from kermt.util.parsing import add_pretrain_args, modify_pretrain_args
from kermt.util.scheduler import NoamLR

parser = ArgumentParser()
add_pretrain_args(parser)
args = parser.parse_args(["--train_data_path", corpus, "--save_dir", "unused", "--pretrain_mode", "vocab",
                          "--hidden_size", str(hidden), "--depth", str(depth), "--num_attn_head", str(heads),
                          "--batch_size", str(batch_size), "--epochs", "1", "--atom_vocab_path",
                          f"{corpus}/atom_vocab.json", "--bond_vocab_path", f"{corpus}/bond_vocab.json"])
modify_pretrain_args(args)
args.cuda = False
n = (n_steps + 1) * batch_size
table = pq.read_table(f"{corpus}/shards/part-00000.parquet", columns=["smiles", "fg_labels"]).slice(0, n)
labels = np.asarray(table.column("fg_labels").combine_chunks().flatten()).reshape(n, -1).astype(np.float64)
data = [(MoleculeDatapoint([s], features=labels[i]), i) for i, s in enumerate(table.column("smiles").to_pylist())]
atom_vocab, bond_vocab = MolVocab.load_vocab(args.atom_vocab_path), MolVocab.load_vocab(args.bond_vocab_path)
torch.manual_seed(0)
model = KermtTask(args, KERMTEmbedding(args), len(atom_vocab), len(bond_vocab), fg_size=85).train()
loss_func = model.get_loss_func(args)
optimizer = torch.optim.Adam(model.parameters(), lr=args.init_lr, weight_decay=args.weight_decay)
scheduler = NoamLR(optimizer=optimizer, warmup_epochs=args.warmup_epochs, total_epochs=args.epochs,
                   steps_per_epoch=n_steps + 1, init_lr=args.init_lr, max_lr=args.max_lr, final_lr=args.final_lr,
                   fine_tune_coff=args.fine_tune_coff)
loader = DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=args.num_dataloader_workers,
                    collate_fn=KermtCollator({}, atom_vocab, bond_vocab, args), drop_last=True)
start = None
for step, item in enumerate(loader):
    if step == 1:
        start = time.perf_counter()  # the first step (allocations, caches) is warm-up
    preds = model(item["graph_input"])
    loss, *terms = loss_func(preds, item["targets"])
    loss.item()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
print(f"RESULT {n_steps * batch_size / (time.perf_counter() - start):.3f}")
'''


def run_upstream(args: argparse.Namespace, scratch: Path) -> float:
    """Molecules/s of upstream's vocab pretraining step loop (see the module docstring)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from upstream_env import upstream_env

    script = scratch / "upstream_pretrain_steps.py"
    script.write_text(UPSTREAM_CHILD)
    cmd = [sys.executable, str(script), str(args.corpus.resolve()), str(args.steps), str(args.global_batch),
           *map(str, MODEL.values())]
    done = subprocess.run(cmd, cwd=scratch, env=upstream_env(args.upstream.resolve(), scratch), capture_output=True,
                          text=True)
    results = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not results:
        sys.exit(f"upstream step loop failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return float(results[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=ROOT / "data/moses/corpus_100k")
    parser.add_argument("--steps", type=int, default=120, help="training steps per run")
    parser.add_argument("--interval", type=int, default=20, help="steps per molecules/s reading")
    parser.add_argument("--global_batch", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2], help="worker counts (none: upstream only)")
    parser.add_argument("--upstream", type=Path, help="upstream KERMT checkout")
    args = parser.parse_args()
    print(f"vocab pretraining, hidden {MODEL['hidden_size']}, depth {MODEL['depth']}, {MODEL['num_attn_head']} heads,"
          f" global batch {args.global_batch}, {args.steps} steps, corpus {args.corpus}", flush=True)
    print(f"{'run':58s} {'molecules/s':>12s}  (mean ± sd over intervals)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for workers in args.workers:
            start = time.perf_counter()
            rates = run_ours(args, workers, Path(tmp) / f"ours_w{workers}")
            sd = statistics.stdev(rates) if len(rates) > 1 else 0.0
            name = f"kermt pretrain, {workers} worker(s) x batch {args.global_batch // workers}"
            print(f"{name:58s} {statistics.mean(rates):12.1f}  ± {sd:.1f}; run {time.perf_counter() - start:.0f} s "
                  f"incl. cluster start; {load_average()}", flush=True)
        if args.upstream:
            rate = run_upstream(args, Path(tmp))
            name = f"upstream KermtTask step loop, 1 process x batch {args.global_batch}"
            print(f"{name:58s} {rate:12.1f}  {load_average()}", flush=True)


if __name__ == "__main__":
    main()
