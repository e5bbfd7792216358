"""Which reference width W reproduces upstream's batch-32 predictions best, for checkpoints that record none.

    python bench/reference_width.py [--widths 1 2 3 4 5 6] [--batch_size 32] [--rows N]

Upstream's own predict collates each batch of 32 consecutive rows at its largest atom degree; here a model with
upstream padding computes each molecule at max(its own largest degree, W) (kermt.inference.widths). For each
upstream fixture checkpoint (tests/data/kermt_upstream: two regression models, one classifier) and each W, this
prints how far the batch-independent predictions are from upstream's batch-32 ones (``--upstream_batching``, which
the parity tests hold to upstream's outputs), on the sample SMILES (tests/data/kermt_upstream_splits/train_val.csv)
and on the demo set (data/sample/admet_demo.csv), each in file order: the mean and largest absolute difference, as a
fraction of the spread (std) of upstream's predictions, and the share of batches collated at each width. These are
tiny fixture models; the released models were not measured.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from kermt.data.featurize import featurize_smiles
from kermt.inference import Ensemble, plan_features, read_members

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ("ckpt_ft_reg.pt", "ckpt_ft_reg_ts.pt", "ckpt_ft_cls.pt")
SETS = {"upstream sample": ROOT / "tests/data/kermt_upstream_splits/train_val.csv",
        "admet demo": ROOT / "data/sample/admet_demo.csv"}


def batch_width_shares(molecules, batch_size: int) -> str:
    """How many of upstream's batches are collated at each width (their valid molecules' largest degree)."""
    degrees, valid = molecules.graphs.max_in_degrees(), molecules.valid
    widths = Counter(max(1, int(degrees[start:start + batch_size][valid[start:start + batch_size]].max(initial=0)))
                     for start in range(0, len(molecules), batch_size))
    total = sum(widths.values())
    return ", ".join(f"{w}: {n / total:.0%}" for w, n in sorted(widths.items()))


def measure(name: str, smiles: list[str], widths: list[int], batch_size: int) -> None:
    members = read_members([ROOT / "tests/data/kermt_upstream" / name])
    molecules = featurize_smiles(smiles, plan_features([m.spec for m in members]).generator)
    upstream = Ensemble(members, upstream_batching=True).predict(molecules, batch_size).mean
    spread = float(np.nanstd(upstream))
    rows = []
    for width in widths:
        ours = Ensemble(members, reference_width=width).predict(molecules, batch_size).mean
        gap = np.abs(ours - upstream)[molecules.valid]
        rows.append((width, np.mean(gap) / spread, np.max(gap) / spread, np.mean(gap < 1e-5)))
    print(f"  {name} (upstream's batch widths: {batch_width_shares(molecules, batch_size)})")
    print("    W   mean |diff| / std   max |diff| / std   rows within 1e-5")
    for width, mean, worst, exact in rows:
        print(f"    {width}   {mean:17.2e}   {worst:16.2e}   {exact:16.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--rows", type=int, default=None, help="the first ROWS molecules of each set (default: all)")
    opts = parser.parse_args()
    for label, path in SETS.items():
        smiles = pd.read_csv(path).iloc[:opts.rows, 0].astype(str).tolist()
        print(f"{label}: {path.relative_to(ROOT)}, {len(smiles)} molecules, batch {opts.batch_size}")
        for name in CHECKPOINTS:
            measure(name, smiles, opts.widths, opts.batch_size)


if __name__ == "__main__":
    main()
