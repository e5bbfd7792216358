"""Head memory of a many-member finetune at the release architecture: what the member coordinators hold.

    python bench/head_memory.py [--folds 5] [--members 5] [--baseline_actors 5] [--molecules 40]

Every (fold, member) of `kermt finetune` is a Ray Tune trial whose coordinator runs on the head (0 CPU); on a
multi-node cluster all of them start at once. The source checkpoint here has the release's encoder (hidden 800,
depth 6, 4 heads, vocab pretraining heads) with random weights, saved as a native checkpoint; the data is the first
``--molecules`` rows of the bundled sample (one task, no molecule features), one epoch, ``--max_concurrent_trials``
= every member, so every coordinator is alive at once as on a cluster.

Printed side by side, per coordinator and for all of them:
- baseline: what a coordinator held before the source weights were shared: its own unpickled copy of the run's
  setup with the checkpoint's tensors plus the starting model it built (``--baseline_actors`` such actors, each
  holding that state, measured the same way);
- this run: the coordinators of the real finetune (peak over the run, sampled every 0.5 s), and the driver.
RSS counts the object store's shared pages in every process that maps them; PSS divides shared pages among their
users, so the PSS sum is what the head's memory actually holds. Sampling reads /proc (no psutil needed).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/data/kermt_upstream/ckpt_pretrain_vocab.pt"
RELEASE_ENCODER = dict(hidden_size=800, depth=6, num_attn_head=4)
MB = 2**20


def release_shaped_checkpoint(directory: Path) -> Path:
    """A vocab-pretraining checkpoint of the release's encoder shapes (random weights; the vocab sizes are the
    fixture's), saved natively: what the members finetune from."""
    import torch

    from kermt.checkpoint import read_checkpoint
    from kermt.nn.pretrain.config import PretrainHeadsConfig, PretrainLossConfig
    from kermt.nn.pretrain.model import KermtPretrainModel
    from kermt.pretrain.export import save_pretrain_native

    spec = read_checkpoint(FIXTURE).spec
    heads_fields = set(PretrainHeadsConfig.__dataclass_fields__)
    heads = PretrainHeadsConfig(**{k: v for k, v in spec.pretrain.items() if k in heads_fields})
    torch.manual_seed(0)
    model = KermtPretrainModel(replace(spec.encoder, **RELEASE_ENCODER), heads)
    return save_pretrain_native(directory / "release_shaped", model, PretrainLossConfig())


def small_data(n: int, directory: Path) -> Path:
    with open(ROOT / "data/sample/admet_demo.csv") as f:
        rows = [row[:2] for row in list(csv.reader(f))[: n + 1]]  # smiles, logp
    path = directory / "data.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def memory_of(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in bytes, 0 for a process that has gone."""
    try:
        rss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))
        pss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/smaps_rollup") if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0, 0
    return rss * 1024, pss * 1024


def processes_titled(titles: tuple[str, ...]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                title = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if title in titles:
                found.append(int(entry))
    return found


class PeakSampler(threading.Thread):
    """Every 0.5 s: the summed RSS/PSS of the processes each title names; keeps, per group, the sample with the
    largest PSS sum (its RSS sum and its number of processes) and the most processes seen at once."""

    def __init__(self, groups: dict[str, tuple[str, ...]], extra_pids: dict[str, int]):
        super().__init__(daemon=True)
        self.groups, self.extra_pids, self.stop = groups, extra_pids, threading.Event()
        self.peaks = {name: [0, 0, 0, 0] for name in [*groups, *extra_pids]}  # rss, pss, processes, most processes

    def run(self) -> None:
        while not self.stop.wait(0.5):
            samples = {name: processes_titled(titles) for name, titles in self.groups.items()}
            samples.update({name: [pid] for name, pid in self.extra_pids.items()})
            for name, pids in samples.items():
                rss, pss = map(sum, zip(*[memory_of(pid) for pid in pids])) if pids else (0, 0)
                peak = self.peaks[name]
                if pss > peak[1]:
                    peak[:3] = [rss, pss, len(pids)]
                peak[3] = max(peak[3], len(pids))


def baseline(checkpoint: Path, data: Path, actors: int) -> tuple[int, int]:
    """Per coordinator, as before: its own copy of the setup with the checkpoint's tensors, and the starting model
    it built. Returns the mean (RSS, PSS) of ``actors`` such actors holding that state at once."""
    import ray

    from ray_app.common.cluster import connect
    from ray_app.finetune.config import resolve
    from ray_app.finetune.run import put_folds
    from ray_app.finetune.run_setup import member_initial_state, resolve_setup

    connect()
    config, sources = resolve(["--data_path", str(data), "--checkpoint_path", str(checkpoint), "--epochs", "1"])
    setup = resolve_setup(config, sources)
    full = replace(setup.without_inputs(), checkpoint=setup.source_checkpoint(), checkpoint_tensors=None)
    model_config = put_folds(setup)[1][0]

    @ray.remote(num_cpus=0)
    class OldCoordinator:
        def hold(self, setup_copy, seed: int) -> int:
            self.state = member_initial_state(setup_copy, model_config, seed)
            return os.getpid()

    holders = [OldCoordinator.remote() for _ in range(actors)]
    full_ref = ray.put(full)
    pids = ray.get([h.hold.remote(full_ref, seed) for seed, h in enumerate(holders)])
    measured = [memory_of(pid) for pid in pids]
    ray.shutdown()
    return sum(m[0] for m in measured) // actors, sum(m[1] for m in measured) // actors


def finetune(checkpoint: Path, data: Path, opts: argparse.Namespace, save_dir: Path) -> PeakSampler:
    runs = opts.folds * opts.members
    command = [str(Path(sys.executable).parent / "kermt"), "finetune", "--data_path", str(data), "--checkpoint_path",
               str(checkpoint), "--num_folds", str(opts.folds), "--ensemble_size", str(opts.members),
               "--max_concurrent_trials", str(runs), "--epochs", "1", "--batch_size", "32",
               "--save_dir", str(save_dir)]
    driver = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # a process's title names the task it runs now: a trial's coordinator is busy in train(), a Train controller
    # in run(); idle pooled workers ("ray::IDLE") are not counted
    sampler = PeakSampler({"coordinators": ("ray::ImplicitFunc.train",),
                           "train controllers": ("ray::TrainController.run", "ray::TrainController.__init__")},
                          {"driver": driver.pid})
    sampler.start()
    out, _ = driver.communicate()
    sampler.stop.set()
    sampler.join()
    if driver.returncode != 0:
        raise SystemExit(f"the finetune failed ({driver.returncode}):\n{out[-4000:]}")
    return sampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--baseline_actors", type=int, default=5)
    parser.add_argument("--molecules", type=int, default=40)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kermt-head-memory-") as tmp:
        work = Path(tmp)
        checkpoint, data = release_shaped_checkpoint(work), small_data(opts.molecules, work)
        weights = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors"))
        print(f"source checkpoint: release-shaped encoder, {weights / MB:.0f} MB of weights; "
              f"{opts.folds} folds x {opts.members} members, all at once; {os.cpu_count()} CPUs")
        old_rss, old_pss = baseline(checkpoint, data, opts.baseline_actors)
        sampler = finetune(checkpoint, data, opts, work / "run")
    runs = opts.folds * opts.members
    print(f"\n{'':44} {'RSS MB':>9} {'PSS MB':>9}")
    print(f"{'baseline: one coordinator':44} {old_rss / MB:9.0f} {old_pss / MB:9.0f}")
    print(f"{f'baseline x {runs} (extrapolated)':44} {runs * old_rss / MB:9.0f} {runs * old_pss / MB:9.0f}")
    for name in ("coordinators", "train controllers"):
        rss, pss, count, most = sampler.peaks[name]
        print(f"{f'this run: {name}, peak ({count} then, {most} at most)':44} {rss / MB:9.0f} {pss / MB:9.0f}")
        print(f"{'  per process at that peak':44} {rss / max(count, 1) / MB:9.0f} {pss / max(count, 1) / MB:9.0f}")
    rss, pss = sampler.peaks["driver"][:2]
    print(f"{'this run: driver':44} {rss / MB:9.0f} {pss / MB:9.0f}")


if __name__ == "__main__":
    main()
