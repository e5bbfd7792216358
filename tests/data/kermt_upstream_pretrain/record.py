"""Record upstream KERMT's pretraining oracles (see README.md in this directory). Needs an upstream checkout at the
fixtures' commit; run from the repository root:

    .venv/bin/python tests/data/kermt_upstream_pretrain/record.py --upstream /path/to/KERMT

Only upstream's code runs here: its package is imported with bench/upstream_env.py's stubs, and our ``kermt`` is
never imported (both packages are called ``kermt``).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
FIXTURES = ROOT / "tests/data/kermt_upstream"
sys.path.insert(0, str(ROOT / "bench"))

from upstream_env import upstream_env  # noqa: E402

sys.path.remove(str(ROOT / "bench"))


def import_upstream(upstream: Path, scratch: Path) -> None:
    """Put upstream's checkout (and the cuik_molmaker stub) first on sys.path, with our repository off it."""
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    sys.path[:0] = upstream_env(upstream, scratch)["PYTHONPATH"].split(":")


def fixture_smiles() -> list[str]:
    with open(FIXTURES / "smiles.csv", newline="") as handle:
        return [row["smiles"] for row in csv.DictReader(handle)]


def fg_labels(smiles: list[str]) -> np.ndarray:
    """Upstream's ``fgtasklabel`` generator on each SMILES string, as scripts/save_features.py calls it: [M, 85]."""
    from kermt.data.molfeaturegenerator import get_features_generator  # noqa: PLC0415
    import kermt.data.task_labels  # noqa: F401, PLC0415  (registers fgtasklabel)

    generator = get_features_generator("fgtasklabel")
    labels = np.stack([generator(s) for s in smiles])
    assert set(np.unique(labels)) <= {0.0, 1.0}
    return labels.astype(np.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", type=Path, required=True)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        import_upstream(opts.upstream.resolve(), Path(scratch))
        smiles = fixture_smiles()
        record = {"smiles": np.array(smiles), "fg_labels": fg_labels(smiles)}
        np.savez_compressed(HERE / "pretrain_step.npz", **record)
    print(f"wrote {len(record)} arrays to {HERE / 'pretrain_step.npz'}")


if __name__ == "__main__":
    main()
