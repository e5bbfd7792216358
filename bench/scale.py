"""Data at scale on MOSES: bytes per molecule, featurisation throughput, peak memory, epoch time; store vs today.

    .venv/bin/python scripts/fetch_moses.py                      # once: data/moses/train.csv.gz
    .venv/bin/python bench/scale.py [--n 20000 200000] [--million] [--finetune] [--workers 1 2]
                                    [--baseline REV | --no_baseline] [--timeout 900]

For each N (the first N MOSES SMILES, labelled with RDKit Crippen logP computed on Ray Data and cached under
data/moses/), in a fresh child process with its own local Ray cluster (one logical CPU per core):

* featurise + prepare as ``kermt finetune`` does (load_source: Ray Data featurisation; split; scale; ray.put of
  the three MoleculeSets) and report bytes per molecule of the graph part (and of the features part, measured on
  a 200-molecule sample with rdkit_2d_normalized: float64 while featurised, float32 in the MoleculeSet),
  molecules/s on the cluster against the single-process rate x CPUs (wall clock, and per CPU-second used by the
  driver and its Ray processes, which a loaded machine does not distort), the driver's peak RSS (VmHWM) and the
  peak PSS summed over the driver and every Ray process it started;
* the same for today's representation, i.e. the code at ``--baseline`` (default: the commit before the compact
  store), extracted with ``git archive`` and put first on PYTHONPATH for the child and its Ray workers; only up
  to ``--baseline_max_n`` molecules (it needs ~95 KB of driver memory per molecule);
* with ``--finetune``: a 1-epoch ``kermt finetune`` (hidden 32, graph only, batch 32 per worker) at each
  ``--workers`` count: training time of the epoch (metrics.csv) and the same peak memory figures.

Figures depend on the machine and on what else runs on it: print them with the load average (shown).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOSES = ROOT / "data/moses/train.csv.gz"
FEATURE_SAMPLE = 4000  # molecules for the single-process rate


# ------------------------------------------------------------------------------------------------------- data
def _logp_block(batch):
    """Ray Data map_batches: a pyarrow block of SMILES -> the same rows with Crippen logP."""
    import pyarrow as pa
    from rdkit import Chem, RDLogger
    from rdkit.Chem import Crippen

    RDLogger.DisableLog("rdApp.*")
    mols = [Chem.MolFromSmiles(s) for s in batch.column("smiles").to_pylist()]
    logp = [round(Crippen.MolLogP(m), 4) if m is not None else None for m in mols]
    return batch.append_column("logp", pa.array(logp, pa.float64()))


def labelled_csv(n: int) -> Path:
    """data/moses/moses_logp_{n}.csv (smiles, logp): the first n MOSES SMILES, logP computed in parallel."""
    path = MOSES.parent / f"moses_logp_{n}.csv"
    if path.exists():
        return path
    if not MOSES.exists():
        raise SystemExit(f"{MOSES} is missing: run .venv/bin/python scripts/fetch_moses.py first")
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import ray

    with gzip.open(MOSES, "rt") as f:
        smiles = [line.strip() for _, line in zip(range(n + 1), f)][1:]
    ray.init(num_cpus=os.cpu_count(), logging_level="WARNING")
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.from_arrow(pa.table({"smiles": smiles})).repartition(max(1, n // 2000))
    table = pa.concat_tables(ray.get(ds.map_batches(_logp_block, batch_format="pyarrow").to_arrow_refs()))
    ray.shutdown()
    pacsv.write_csv(table, path)
    return path


# ------------------------------------------------------------------------------------------- process memory
def _descendants(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parent.items() if ppid in frontier]
        found.extend(frontier)
    return found


def _status_kb(pid: int, field: str, name: str = "status") -> int:
    try:
        with open(f"/proc/{pid}/{name}") as f:
            return next((int(line.split()[1]) for line in f if line.startswith(field)), 0)
    except OSError:
        return 0


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of ``root`` and its live descendants (the driver and its Ray processes)."""
    total = 0
    for pid in _descendants(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


class TreeMemory(threading.Thread):
    """Samples a process tree: the root's peak RSS (VmHWM) twice a second; the peak of the summed PSS at most twice
    a second and no more often than keeps its cost under 2 % of a CPU."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root, self.driver_peak_kb, self.total_peak_kb = root, 0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        next_tree_sample = 0.0
        while not self.stop.is_set():
            self.driver_peak_kb = max(self.driver_peak_kb, _status_kb(self.root, "VmHWM:"))  # a kernel high-water mark
            if time.monotonic() >= next_tree_sample:
                cost = time.thread_time()
                total = sum(_status_kb(pid, "Pss:", "smaps_rollup") for pid in _descendants(self.root))
                self.total_peak_kb = max(self.total_peak_kb, total)
                # smaps_rollup walks page tables: ~0.15 CPU-s for a Ray tree of a few GB. Every 0.5 s that took a
                # third of a CPU from the run being measured; this keeps the PSS sampling under 2 % of one CPU.
                next_tree_sample = time.monotonic() + max(0.5, 50 * (time.thread_time() - cost))
            self.stop.wait(0.5)


def run_measured(cmd: list[str], code: Path | None, timeout: float) -> tuple[str, float, float]:
    """Run ``cmd`` with the code at ``code`` (None: this checkout); returns (stdout, driver GiB, total GiB)."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # always a private local cluster
    if code is not None:  # PYTHONPATH precedes the editable install in the driver; Ray workers put the driver's
        # working directory first on their sys.path, so the child also runs in ``code``
        env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=code or ROOT)
    memory = TreeMemory(proc.pid)
    memory.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise RuntimeError(f"timed out after {timeout:.0f} s: {' '.join(cmd[:4])} ...") from None
    finally:
        memory.stop.set()
        memory.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{err[-3000:]}")
    return out, memory.driver_peak_kb / 2**20, memory.total_peak_kb / 2**20


# ------------------------------------------------------------------------------------- child: featurise+prepare
def _store_bytes(graphs) -> int:
    """Bytes of the graph arrays, in either representation (today's dense FlatGraphs has no ``nbytes``)."""
    if hasattr(graphs, "nbytes"):
        return int(graphs.nbytes)
    return sum(a.nbytes for a in (graphs.f_atoms, graphs.bond_atoms, graphs.bond_feats, graphs.bond_rdkit_idx,
                                  graphs.atom_counts, graphs.bond_counts))


def prepare_child(path: str, cpus: int) -> None:
    """What ``kermt finetune`` does before training, timed; prints one JSON line."""
    import numpy as np
    import ray

    from kermt.data.featurize import featurize_smiles
    from ray_app.common.cluster import connect
    from ray_app.common.featurize import featurize_on_cluster
    from ray_app.finetune.config import FinetuneConfig
    from ray_app.finetune.prepare import load_source, scale_splits, split_for_fold, subset

    connect(num_cpus=cpus)
    config = FinetuneConfig(data_path=path, dataset_type="regression", split_type="random")
    featurize_on_cluster(["CCO"] * 4 * cpus, rows_per_task=4)  # start the workers: time the steady state
    start, cpu_start = time.perf_counter(), tree_cpu_s(os.getpid())
    data = load_source(path, config, None, None)
    featurise_s, featurise_cpu_s = time.perf_counter() - start, tree_cpu_s(os.getpid()) - cpu_start
    split = split_for_fold(config, data, 0, False, False)
    parts = {"train": subset(data, split.train), "val": subset(data, split.val), "test": subset(data, split.test)}
    splits = scale_splits(parts, "regression", False)
    refs = [ray.put(s) for s in (splits.train, splits.val, splits.test)]
    sample = list(data.featurized.smiles[:FEATURE_SAMPLE])
    featurize_smiles(list(data.featurized.smiles[-200:]))  # warm: the driver has not featurised anything yet
    start = time.process_time()
    featurize_smiles(sample)
    single_rate = len(sample) / (time.process_time() - start)
    features = featurize_smiles(sample[:200], ("rdkit_2d_normalized",)).features
    print(json.dumps({
        "n": len(data), "featurise_s": featurise_s, "featurise_cpu_s": featurise_cpu_s, "single_rate": single_rate,
        "graph_bytes": _store_bytes(data.featurized.graphs) / len(data),
        "atoms_per_mol": float(np.mean(data.featurized.graphs.atom_counts)),
        "features_bytes_featurized": features.nbytes / len(features),
        "features_bytes_set": features.astype(np.float32).nbytes / len(features), "refs": len(refs),
    }))


# ---------------------------------------------------------------------------------------------------- parent
def baseline_tree(rev: str, directory: Path) -> Path:
    """``git archive`` of kermt/ and ray_app/ at ``rev`` into ``directory``."""
    archive = subprocess.run(["git", "archive", rev, "kermt", "ray_app"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive.stdout, check=True)
    return directory


def default_baseline() -> str | None:
    """The commit before the one that added the compact store (kermt/chem/codes.py)."""
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", "kermt/chem/codes.py"], cwd=ROOT,
                           capture_output=True, text=True).stdout.split()
    if not added:
        return None
    return subprocess.run(["git", "rev-parse", "--short", f"{added[-1]}^"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()


def measure_prepare(path: Path, code: Path | None, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child_prepare", str(path)]
    out, driver, total = run_measured(cmd, code, args.timeout)
    result = json.loads(out.strip().splitlines()[-1])
    result.update(driver_gb=driver, total_gb=total, cluster_rate=result["n"] / result["featurise_s"])
    return result


def measure_finetune(path: Path, workers: int, code: Path | None, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(Path(sys.executable).parent / "kermt"), "finetune", "--data_path", str(path), "--save_dir", tmp,
               "--dataset_type", "regression", "--split_type", "random", "--epochs", "1", "--batch_size", "32",
               "--hidden_size", "32", "--ffn_hidden_size", "32", "--num_workers", str(workers), "--seed", "0"]
        _, driver, total = run_measured(cmd, code, args.timeout)
        with open(Path(tmp) / "fold_0/model_0/metrics.csv") as f:
            epoch_s = float(next(csv.DictReader(f))["train_time_s"])
    return {"epoch_s": epoch_s, "driver_gb": driver, "total_gb": total}


def _row(label: str, values: list[str]) -> str:
    return f"  {label:44s}" + "".join(f"{v:>16s}" for v in values)


def report_prepare(n: int, runs: dict[str, dict]) -> None:
    names = list(runs)
    print(f"\nN = {n:,} MOSES molecules: featurise + prepare ({', '.join(names)})")
    print(_row("", names))
    print(_row("graph bytes / molecule", [f"{r['graph_bytes']:,.0f}" for r in runs.values()]))
    print(_row("features bytes / molecule (rdkit_2d_norm.)",
               [f"{r['features_bytes_featurized']:,.0f} -> {r['features_bytes_set']:,.0f}" for r in runs.values()]))
    print(_row("featurise molecules/s on the cluster", [f"{r['cluster_rate']:,.0f}" for r in runs.values()]))
    print(_row("single process x CPUs", [f"{r['single_rate'] * CPUS:,.0f}" for r in runs.values()]))
    print(_row("cluster / (single x CPUs), wall clock", [f"{r['cluster_rate'] / (r['single_rate'] * CPUS):.0%}"
                                                          for r in runs.values()]))
    # Under load the wall clock mostly measures the other work; per CPU-second the cluster's own overhead shows.
    print(_row("molecules per CPU-s: cluster / single", [f"{r['n'] / r['featurise_cpu_s']:,.0f} / "
                                                          f"{r['single_rate']:,.0f}" for r in runs.values()]))
    print(_row("driver peak RSS GiB", [f"{r['driver_gb']:.2f}" for r in runs.values()]))
    print(_row("total peak PSS GiB (driver + Ray)", [f"{r['total_gb']:.2f}" for r in runs.values()]), flush=True)


def report_finetunes(n: int, path: Path, codes: dict[str, Path | None], args: argparse.Namespace) -> None:
    """One line per run as it finishes (a slow machine still shows the runs that fit in the time)."""
    print(f"\nN = {n:,}: 1-epoch finetune, hidden 32, graph only, batch 32 per worker")
    print(f"  {'run':44s}{'epoch train s':>16s}{'driver peak GiB':>16s}{'total PSS GiB':>16s}", flush=True)
    for name, code in codes.items():
        for workers in args.workers:
            r = measure_finetune(path, workers, code, args)
            print(_row(f"{name}, {workers} worker(s)", [f"{r['epoch_s']:.1f}", f"{r['driver_gb']:.2f}",
                                                        f"{r['total_gb']:.2f}"]), flush=True)


CPUS = os.cpu_count() or 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--million", action="store_true", help="add N = 1,000,000")
    parser.add_argument("--finetune", action="store_true", help="also time a 1-epoch finetune")
    parser.add_argument("--no_prepare", action="store_true", help="skip the featurise + prepare measurements")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--baseline", help="git revision of today's representation (default: before the store)")
    parser.add_argument("--no_baseline", action="store_true", help="measure the current code only")
    parser.add_argument("--baseline_max_n", type=int, default=50_000, help="largest N measured for today's code")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per measured child process")
    parser.add_argument("--child_prepare", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_prepare:
        return prepare_child(args.child_prepare, CPUS)
    sizes = args.n + ([1_000_000] if args.million else [])
    print(f"{CPUS} CPUs, load average {os.getloadavg()[0]:.1f} at start (other work on the machine skews timings)")
    with tempfile.TemporaryDirectory() as tmp:
        rev = None if args.no_baseline else args.baseline or default_baseline()
        codes = {"store": None, **({f"today {rev}": baseline_tree(rev, Path(tmp))} if rev else {})}
        for n in sizes:
            path = labelled_csv(n)
            # today's representation needs ~95 KB of driver memory per molecule: beyond --baseline_max_n it
            # would push a shared machine out of memory, so only the store is measured there
            measured = {name: code for name, code in codes.items() if code is None or n <= args.baseline_max_n}
            if not args.no_prepare:
                report_prepare(n, {name: measure_prepare(path, code, args) for name, code in measured.items()})
            if args.finetune:
                report_finetunes(n, path, measured, args)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
