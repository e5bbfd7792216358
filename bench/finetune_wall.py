"""Where the wall time of one `kermt finetune` goes, for two source trees side by side in the same run.

    .venv/bin/python bench/finetune_wall.py --before OLD_TREE [--after NEW_TREE] [--epochs 5] [--members 2]
        [--data runs/bench_accuracy/solubility/seed0/data] [--repeats 1]

Each tree runs the same from-scratch command (bench/accuracy.py's kermt_run: the train/val/test files of one
scaffold split, regression, its defaults, with fewer epochs) in a fresh process started in the tree with the tree
first on PYTHONPATH (so that the Ray workers it starts import it too), the two alternating ``--repeats`` times
so that a change of load hits both.
A tree is a directory holding kermt/ and ray_app/, e.g. ``git worktree add --detach /tmp/before <commit>``.
The phases are read off the run's own output lines as they arrive:
  start     process start -> "outputs:" (imports, Ray start, featurising the three files on the cluster)
  to train  -> the first "starting epoch" (Tune, the trainers' controller and worker processes, model build)
  train     -> the last epoch line (every member's epochs; members run concurrently where CPUs allow)
  after     -> "overall_..." (member files, test and calibration predictions, domain index, calibration)
  report    -> the process exits (the HTML report, Ray shutdown)
It also says whether both trees gave the same numbers: test_result.csv byte for byte and every member's
metrics.csv without its times. Load is the 1-minute load average before and after each run (a shared machine
moves every figure; compare trees within one run of this script only).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("start", "to train", "train", "after", "report")
MARKS = (("start", re.compile(r"^outputs: ")), ("to train", re.compile(r"starting epoch 0")),
         ("train", re.compile(r"\] epoch +\d+ ")), ("after", re.compile(r"^overall_")))
TIME_COLUMNS = ("train_time_s", "val_time_s")


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def command(data: Path, save_dir: Path, args: argparse.Namespace) -> list[str]:
    return [str(Path(sys.executable).parent / "kermt"), "finetune", "--data_path", str(data / "train.csv"),
            "--separate_val_path", str(data / "val.csv"), "--separate_test_path", str(data / "test.csv"),
            "--dataset_type", "regression", "--ensemble_size", str(args.members), "--epochs", str(args.epochs),
            "--save_dir", str(save_dir), "--overwrite"]


def timed_run(tree: Path, cmd: list[str]) -> dict[str, float]:
    """Seconds of each phase of one run of ``cmd`` with ``tree`` first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    seen: dict[str, float] = {}
    # from inside the tree: Ray puts the driver's working directory first on its workers' path
    process = subprocess.Popen(cmd, env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail = []
    for line in process.stdout:
        now = time.perf_counter() - started
        tail = (tail + [line])[-40:]
        for phase, pattern in MARKS:
            if pattern.search(line) and (phase == "train" or phase not in seen):  # train: the last epoch line
                seen[phase] = now
    if process.wait() != 0:
        raise RuntimeError(f"{tree}: {' '.join(cmd)} failed:\n{''.join(tail)}")
    ends = [seen.get(phase, float("nan")) for phase in PHASES[:-1]] + [time.perf_counter() - started]
    return {phase: end - begin for phase, end, begin in zip(PHASES, ends, [0.0, *ends[:-1]])} | {"total": ends[-1]}


def numbers(save_dir: Path, members: int) -> tuple[bytes, list[list[dict[str, str]]]]:
    """What a seed must reproduce: the ensemble's test predictions and each member's epoch rows without times."""
    rows = []
    for member in range(members):
        with open(save_dir / "fold_0" / f"model_{member}" / "metrics.csv") as f:
            rows.append([{k: v for k, v in row.items() if k not in TIME_COLUMNS} for row in csv.DictReader(f)])
    return (save_dir / "fold_0" / "test_result.csv").read_bytes(), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the baseline tree (holds kermt/, ray_app/)")
    parser.add_argument("--after", type=Path, default=ROOT, help="the tree measured against it (default: this one)")
    parser.add_argument("--data", type=Path, default=ROOT / "runs/bench_accuracy/solubility/seed0/data",
                        help="a directory with train.csv, val.csv, test.csv (bench/accuracy.py writes them)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--members", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    made: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory(prefix="kermt-finetune-wall-") as tmp:
        for repeat in range(args.repeats):
            for name, tree in trees.items():
                save_dir = Path(tmp) / name
                before_load = load()
                phases = timed_run(tree, command(args.data, save_dir, args))
                results[name].append(phases | {"load": (before_load + load()) / 2})
                made[name] = numbers(save_dir, args.members)
                print(f"repeat {repeat} {name}: " + "  ".join(f"{k} {v:.1f}" for k, v in results[name][-1].items()),
                      flush=True)
    print(f"\n{' '.join(command(args.data, Path('SAVE_DIR'), args)[1:])}\n{os.cpu_count()} CPUs; "
          f"before = {trees['before']}, after = {trees['after']}; mean of {args.repeats} run(s) each, seconds")
    print(f"{'phase':10s} {'before':>9s} {'after':>9s}")
    for key in (*PHASES, "total", "load"):
        mean = {name: sum(r[key] for r in runs) / len(runs) for name, runs in results.items()}
        print(f"{key:10s} {mean['before']:9.1f} {mean['after']:9.1f}")
    print("same numbers (test_result.csv, every member's metrics.csv without times):",
          made["before"] == made["after"])


if __name__ == "__main__":
    main()
