"""Build data/sample/admet_demo.csv: a multitask regression demo whose labels a model can visibly learn.

Molecules: the first 2,000 SMILES of upstream KERMT's tests/data/train_val.csv (Apache-2.0, see
tests/data/kermt_upstream_splits/README.md). Labels are computed by RDKit, so they are exact functions of the
structure: Crippen logP, topological polar surface area (TPSA / 100) and the fraction of sp3 carbons. 20 % of the
labels are removed at random (seed 0) to exercise missing-label handling. Run: python scripts/make_sample_data.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from rdkit import Chem
from rdkit.Chem import Crippen, rdMolDescriptors

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests/data/kermt_upstream_splits/train_val.csv"
TARGET = ROOT / "data/sample/admet_demo.csv"
N_MOLECULES = 2000
MISSING_FRACTION = 0.2


def labels(smiles: str) -> list[float]:
    mol = Chem.MolFromSmiles(smiles)
    return [
        round(Crippen.MolLogP(mol), 4),
        round(rdMolDescriptors.CalcTPSA(mol) / 100.0, 4),
        round(rdMolDescriptors.CalcFractionCSP3(mol), 4),
    ]


def main() -> None:
    with open(SOURCE) as f:
        smiles = [row[0] for row in list(csv.reader(f))[1 : N_MOLECULES + 1]]
    values = np.array([labels(s) for s in smiles])
    missing = np.random.default_rng(0).random(values.shape) < MISSING_FRACTION
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    with open(TARGET, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["smiles", "logp", "tpsa_100", "fsp3"])
        for smi, row, gone in zip(smiles, values, missing):
            writer.writerow([smi] + ["" if g else f"{v:g}" for v, g in zip(row, gone)])


if __name__ == "__main__":
    main()
