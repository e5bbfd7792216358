"""What a finetune's driver holds of the data set, phase by phase (issue 41): featurise, split/scale/put each fold,
write the folds' shards, then what it holds after training (test predictions, calibration, domain).

    nice -n 15 .venv/bin/python bench/finetune_driver.py [--n 20000 100000] [--folds 2] [--modes driver tasks]

* data: the first N MOSES molecules labelled with RDKit logP (bench/scale.py's cached CSV, data/moses/), random
  split, graph only, in a fresh child process per mode with its own local Ray cluster; ``kermt finetune``'s own
  driver functions (resolve_setup, put_folds, write_folds), without training.
* modes, the write of the folds' shards: "driver" is how it was (each fold read back into the driver, then its
  shards written there, the inputs released after); "tasks" is what ``kermt finetune`` does now (the inputs
  released first, each fold's shards written by a Ray task that reads the fold from the object store).
* after training, without the predictions themselves (no model is trained): "driver" reads each fold's object back
  and touches every array, as the driver did before; "readback" is "tasks" up to there, then reads the folds back
  as "driver" does (the run between the two changes); "tasks" lets go of the folds and, as ``kermt finetune`` does
  now (ray_app.finetune.after_training), a task per fold on the driver's node reads the fold's shards one at a
  time (its highest RSS while it holds a shard is printed as well).
* figures per phase: the driver's RSS at the phase's end and its peak within the phase (sampled every 20 ms), split
  into the process's own memory (RssAnon) and object-store pages it mapped (RssShmem), in bytes per molecule of
  the data file: what two sizes differ by, per molecule more (a fixed cost, such as the modules a phase imports
  or the memory pools it leaves allocated, cancels out).

Figures on a shared machine: each line carries the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIELDS = ("VmRSS", "RssAnon", "RssShmem")


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores"


def _status_kb() -> dict[str, int]:
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in FIELDS:
            values[name] = int(rest.split()[0])
    return values


class PhaseSampler(threading.Thread):
    """The driver's memory every 20 ms; ``mark(name)`` closes a phase with its end and its peak (by VmRSS)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.lock, self.peak, self.phases = threading.Lock(), _status_kb(), {}

    def run(self) -> None:
        while True:
            now = _status_kb()
            with self.lock:
                if now["VmRSS"] > self.peak["VmRSS"]:
                    self.peak = now
            threading.Event().wait(0.02)

    def mark(self, name: str) -> None:
        end = _status_kb()
        with self.lock:
            peak = end if end["VmRSS"] > self.peak["VmRSS"] else self.peak
            self.phases[name] = {"end": end, "peak": peak}
            self.peak = end


def child(path: str, mode: str, folds: int) -> None:
    """One driver run of ``mode``; prints the phases as one JSON line."""
    import gc
    from dataclasses import replace

    import ray

    from ray_app.common.cluster import connect
    from ray_app.finetune.config import resolve
    from ray_app.finetune.fold_data import write_fold_data, write_folds
    from ray_app.finetune.run import put_folds
    from ray_app.finetune.run_setup import resolve_setup
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    sampler = PhaseSampler()
    sampler.start()
    connect()
    save_dir = tempfile.mkdtemp(prefix="bench_finetune_driver_")
    config, sources = resolve(["--data_path", path, "--save_dir", save_dir, "--dataset_type", "regression",
                               "--split_type", "random", "--num_folds", str(folds), "--epochs", "1"])
    sampler.mark("connected")
    setup = resolve_setup(config, sources)
    n = len(setup.data)
    sampler.mark("featurised")
    refs = put_folds(setup)[0]
    sampler.mark("split, scaled, put")
    setup = replace(setup, run_id="bench")
    if mode == "driver":  # as run_finetune was: each fold read back here and written, the inputs released after
        for fold, ref in enumerate(refs):
            splits = ray.get(ref)
            write_fold_data(setup.storage, setup.run_id, fold, splits.train, splits.val)
            del splits
        setup = setup.without_inputs()
    else:
        setup = setup.without_inputs()
        data = write_folds(setup.storage, setup.run_id, refs)
    gc.collect()
    sampler.mark("shards written, inputs released")
    task_kb = None
    if mode in ("driver", "readback"):  # as train_folds did after training: each fold read back, arrays touched
        for ref in refs:
            parts = ray.get(ref)
            touched = sum(float(part.targets.sum()) + int(part.graphs.atom_counts.sum()) + len(part.smiles)
                          for part in (parts.train, parts.val, parts.test))
            del parts, touched
    else:  # as finish_folds does: the driver lets go of the folds, a task per fold on its node reads the shards
        del refs
        gc.collect()
        reader = ray.remote(num_cpus=0)(_read_fold_shards).options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False))
        task_kb = max(ray.get(reader.remote(fold)) for fold in data)
    sampler.mark("after training")
    print(json.dumps({"n": n, "phases": sampler.phases, "task_peak_kb": task_kb}))


def _read_fold_shards(data) -> int:
    """What a fold's task after training reads (ray_app.finetune.after_training), every array touched; returns
    the process's highest VmRSS (KB) seen after each shard, while it holds that shard and the targets."""
    peak, targets = 0, [data.train.targets(), data.val.targets()]
    for split in (data.test, data.val, data.train):
        for part in split.sets():
            touched = float(part.targets.sum()) + int(part.graphs.atom_counts.sum()) + len(part.smiles)
            peak = max(peak, _status_kb()["VmRSS"])
            del part, touched
    del targets
    return peak


def report(n: int, mode: str, result: dict, smaller: tuple[int, dict] | None) -> None:
    """One line per phase: RSS at its end and its peak; in brackets, bytes per molecule of own memory (RssAnon) +
    mapped object-store pages (RssShmem) above the connected driver, or, with a smaller run of the same mode, the
    difference between the two runs per molecule more (what grows with the data, without fixed costs)."""
    for name, figures in result["phases"].items():
        cells = []
        for when in ("end", "peak"):
            kb = figures[when]
            if smaller is None:
                base, extra = result["phases"]["connected"]["end"], n
            else:
                base, extra = smaller[1]["phases"][name][when], n - smaller[0]
            per = {f: (kb[f] - base[f]) * 1024 / extra for f in FIELDS}
            cells.append(f"{kb['VmRSS'] / 1024:6.0f} MiB ({per['RssAnon']:5.0f} + {per['RssShmem']:5.0f})")
        print(f"{n:>8} {mode:>7} {name:32s} {cells[0]}  {cells[1]}  {load_average()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--folds", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=["driver", "tasks"])
    parser.add_argument("--child", nargs=2, metavar=("CSV", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.folds)
        return
    from bench.scale import labelled_csv

    print(f"MOSES molecules, {args.folds} fold(s), random split; {load_average()}")
    print("driver RSS at each phase's end and its peak in it (MiB); in brackets, bytes per molecule of own memory "
          "(RssAnon) + object-store pages mapped (RssShmem): above the connected driver at the smallest N, and "
          "from the next smaller N to this one at the others")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # always a private local cluster
    previous: dict[str, tuple[int, dict]] = {}
    for n in sorted(args.n):
        path = labelled_csv(n)
        for mode in args.modes:
            out = subprocess.run([sys.executable, __file__, "--child", str(path), mode, "--folds", str(args.folds)],
                                 capture_output=True, text=True, check=True, cwd=ROOT, env=env).stdout
            result = json.loads(out.strip().splitlines()[-1])
            report(n, mode, result, previous.get(mode))
            if result.get("task_peak_kb"):
                print(f"{n:>8} {mode:>7} the fold task's RSS, highest after a shard: "
                      f"{result['task_peak_kb'] / 1024:.0f} MiB  {load_average()}", flush=True)
            previous[mode] = (n, result)


if __name__ == "__main__":
    main()
