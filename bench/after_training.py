"""Shard reads and wall time of a finetune fold's step after training (ray_app.finetune.after_training.finish_fold:
test predictions, calibration, domain index), on a fold whose splits are several shards each (issue 41).

    nice -n 19 .venv/bin/python bench/after_training.py [--molecules 2000] [--members 5] [--shard_rows 50]
        [--repeats 3] [--dump DIR]

* the run: a one-epoch finetune of the first ``--molecules`` of the demo file (data/sample/admet_demo.csv, 2 tasks)
  with the tiny fixture pretraining checkpoint, ``--members`` members, split 0.8/0.1/0.1, calibrated with
  mondrian_domain (so the domain distances of the validation and test splits are computed too); trained once and
  cached under runs/bench_after_training/.
* the fold: cut again from the data as the run cut it and written as shards of ``--shard_rows`` molecules (in a
  scratch storage), then fold 0's step runs here, in this process, on one torch thread, ``--repeats`` times into a
  copy of the run. Figures: how many times each split's shards were read (kermt.data.molecule_shards'
  read_split_shard, counted and timed by wrapping the function the shards are read with), the seconds those reads
  took, and the step's best wall time.
* ``--dump DIR``: the fold's files the step writes (test_result.csv, calibration.json, domain files), its outcome
  (score and run.json records) and what it printed, copied to DIR, for a byte comparison of two versions.

Wall-clock figures on a shared machine are noisy: every line carries the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CACHE = ROOT / "runs/bench_after_training"
DEMO = ROOT / "data/sample/admet_demo.csv"
CHECKPOINT = ROOT / "tests/data/kermt_upstream/ckpt_pretrain_vocab.pt"
FOLD_FILES = ("test_result.csv", "test_spread.csv", "calibration.json", "domain.json", "domain_embeddings.safetensors")


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores"


def flags(save_dir: Path, data: Path, members: int) -> list[str]:
    return ["--data_path", str(data), "--checkpoint_path", str(CHECKPOINT), "--save_dir", str(save_dir),
            "--epochs", "1", "--batch_size", "32", "--ffn_hidden_size", "8", "--ensemble_size", str(members),
            "--split_sizes", "0.8", "0.1", "0.1", "--calibration_method", "mondrian_domain"]


def trained_run(molecules: int, members: int) -> tuple[Path, Path]:
    """(the cached run's save_dir, its data file), trained on the first call."""
    from ray_app.finetune.config import resolve
    from ray_app.finetune.run import run_finetune

    base = CACHE / f"demo_{molecules}_{members}"
    data, run = base / "data.csv", base / "run"
    if (run / "run.json").exists():
        return run, data
    base.mkdir(parents=True, exist_ok=True)
    with open(DEMO) as f:
        data.write_text("".join(line for _, line in zip(range(molecules + 1), f)))
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        run_finetune(*resolve(flags(run, data, members)))
    print(f"trained {members} member(s) in {time.perf_counter() - started:.0f} s ({load_average()})", flush=True)
    return run, data


def counting_reads(counts: Counter) -> None:
    """Count every shard read by its split (the directory's last part), and the seconds spent reading them
    (``counts["seconds"]``), in this process."""
    import ray_app.finetune.fold_data as fold_data

    read = fold_data.read_split_shard

    def counted(directory, manifest, index):
        counts[Path(directory).name] += 1
        started = time.perf_counter()
        try:
            return read(directory, manifest, index)
        finally:
            counts["seconds"] += time.perf_counter() - started

    fold_data.read_split_shard = counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--molecules", type=int, default=2000)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--shard_rows", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dump", type=Path)
    args = parser.parse_args()

    import torch

    from ray_app.common.cluster import connect
    from ray_app.finetune.after_training import finish_fold, run_width_rule
    from ray_app.finetune.config import resolve
    from ray_app.finetune.fold_data import write_folds
    from ray_app.finetune.run import put_folds
    from ray_app.finetune.run_setup import resolve_setup

    connect(num_cpus=2)
    run, data = trained_run(args.molecules, args.members)
    scratch = Path(tempfile.mkdtemp(prefix="bench-after-training-"))
    try:
        copy = shutil.copytree(run, scratch / "run", ignore=shutil.ignore_patterns("ray_results"))
        setup = resolve_setup(*resolve(flags(copy, data, args.members)))
        refs, configs, _, _ = put_folds(setup)
        setup = replace(setup, run_id=json.loads((run / "run.json").read_text())["summary"]["run_id"])
        setup = setup.without_inputs()
        fold = write_folds(str(scratch / "storage"), setup.run_id, refs[:1], args.shard_rows)[0]
        shards = {name: len(getattr(fold, name).manifest.files) for name in ("train", "val", "test")}
        print(f"fold 0: {args.members} member(s), shards of {args.shard_rows}: " + ", ".join(
            f"{name} {sum(getattr(fold, name).manifest.rows)} molecules in {n}" for name, n in shards.items()))
        torch.set_num_threads(1)
        counts: Counter = Counter()
        counting_reads(counts)
        rule, walls = run_width_rule(setup, 1), []
        for _ in range(args.repeats):
            counts.clear()
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()) as out:
                outcome = finish_fold(setup, 0, configs[0], fold, rule=rule)
            walls.append(time.perf_counter() - started)
            print(f"  {walls[-1]:.2f} s; shard reads " + ", ".join(
                f"{name} {counts[name]} ({counts[name] / shards[name]:g} a shard)" for name in shards)
                + f" in {counts['seconds']:.2f} s; {load_average()}", flush=True)
        print(f"best of {args.repeats}: {min(walls):.2f} s ({load_average()})")
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            for name in FOLD_FILES:  # (test_spread.csv holds the test molecules' domain distances)
                shutil.copy(copy / "fold_0" / name, args.dump / name)
            (args.dump / "outcome.json").write_text(json.dumps(
                {"score": outcome.score, "calibration": outcome.calibration, "record": outcome.record}) + "\n")
            (args.dump / "printed.txt").write_text(out.getvalue())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
