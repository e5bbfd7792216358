"""Fetch the MOSES training set (1,584,663 ZINC SMILES, MIT licence) into data/moses/ for the scale benchmark.

    .venv/bin/python scripts/fetch_moses.py [--dest data/moses]

The set ships inside the ``molsets`` 0.3.1 wheel on PyPI as ``moses/dataset/data/train.csv.gz``: the wheel is
downloaded with pip (no dependencies, nothing installed) and only that member is extracted. data/moses/ is
gitignored: the data is never committed. Labels (RDKit Crippen logP) are computed by ``bench/scale.py``, in
parallel on Ray Data, because that is where the benchmark needs them.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEEL_REQUIREMENT = "molsets==0.3.1"
MEMBER = "moses/dataset/data/train.csv.gz"
EXPECTED_ROWS = 1_584_663


def download_wheel(directory: Path) -> Path:
    """pip download the molsets wheel (no deps) into ``directory``; returns the wheel's path."""
    subprocess.run([sys.executable, "-m", "pip", "download", WHEEL_REQUIREMENT, "--no-deps", "--only-binary=:all:",
                    "-d", str(directory)], check=True)
    wheels = sorted(directory.glob("molsets-*.whl"))
    if not wheels:
        raise SystemExit(f"pip download {WHEEL_REQUIREMENT} produced no wheel in {directory}")
    return wheels[0]


def count_rows(path: Path) -> int:
    """Data rows of the gzipped CSV (header excluded)."""
    import gzip

    with gzip.open(path, "rt") as f:
        return sum(1 for _ in f) - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=ROOT / "data/moses")
    args = parser.parse_args()
    target = args.dest / "train.csv.gz"
    if target.exists():
        print(f"{target} already exists ({count_rows(target):,} molecules)")
        return
    args.dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = download_wheel(Path(tmp))
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)  # a wheel is a zip: take the one member, install nothing
    rows = count_rows(target)
    if rows != EXPECTED_ROWS:
        print(f"warning: {target} has {rows:,} rows, expected {EXPECTED_ROWS:,}", file=sys.stderr)
    print(f"{target}: {rows:,} molecules (MOSES train split, MIT licence)")


if __name__ == "__main__":
    main()
