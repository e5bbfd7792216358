"""Featurisation throughput in molecules per CPU-second: ours vs upstream KERMT's Python path.

    python bench/featurize.py [--n 10000] [--csv PATH] [--upstream /work/upstream_kermt] [--standardize none parent]

Three workloads on the same SMILES: the molecular graph only, rdkit_2d_normalized only, and both (what a
finetune with ``--features_generator rdkit_2d_normalized`` computes per molecule). CPU time is
``time.process_time()`` of the process doing the work (the upstream side runs in a child process, which
reports its own CPU time). With ``--upstream`` the upstream path is measured in the same run and our values
are compared with upstream's (max abs difference printed). ``--standardize none parent`` times ours without and
with a model's standardisation (kermt.chem.standardize; upstream has none), before and after in one run.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CSV = REPO / "tests/data/kermt_upstream_splits/train_val.csv"
WORKLOADS = ("graph", "rdkit_2d_normalized", "both")


def read_smiles(path: Path, n: int) -> list[str]:
    with open(path) as handle:
        rows = list(csv.reader(handle))[1:]
    return [row[0] for row in rows[:n]]


# ----------------------------------------------------------------------------------------------- ours
def ours(smiles: list[str], workload: str, standardize: str = "none") -> dict[str, np.ndarray]:
    """Featurise with kermt in batches of 1,000 (how a Ray Data block would call it)."""
    from kermt.chem.descriptors import molecule_features
    from kermt.chem.standardize import MoleculePrep
    from kermt.chem.validation import parse_many
    from kermt.data.featurize import featurize_smiles

    parts = []
    for start in range(0, len(smiles), 1000):
        chunk = smiles[start:start + 1000]
        if workload == "rdkit_2d_normalized":
            mols, _ = parse_many(chunk)
            features = np.nan_to_num(molecule_features(mols, ("rdkit_2d_normalized",)), nan=0.0)
            parts.append({"features": features})
        else:
            generators = ("rdkit_2d_normalized",) if workload == "both" else ()
            parts.append(featurize_smiles(chunk, generators, prep=MoleculePrep(standardize)).to_arrays())
    compared = ("features", "f_atoms", "bond_feats", "bond_atoms")
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0] if key in compared}


def timed(func, *args) -> tuple[float, object]:
    start = time.process_time()
    result = func(*args)
    return time.process_time() - start, result


# ------------------------------------------------------------------------------------------- upstream
def install_cuik_stub() -> None:
    """Upstream's molgraph.py imports cuik_molmaker (NVIDIA's C++/GPU featuriser) at module import, and a
    compatibility shim resolves some of its functions then. The Python path measured here never calls it,
    and the package is not installable offline, so an empty module stands in; any attribute is a function
    that raises if it is ever called."""
    import types

    def unavailable(*_args, **_kwargs):
        raise RuntimeError("cuik_molmaker stub: not available in this benchmark")

    stub = types.ModuleType("cuik_molmaker")
    features = types.ModuleType("cuik_molmaker.mol_features")
    def any_public_name(name: str):
        if name.startswith("_"):  # keep import machinery probes (__file__, __path__, ...) honest
            raise AttributeError(name)
        return unavailable

    stub.__getattr__ = features.__getattr__ = any_public_name
    stub.mol_features = features
    sys.modules.update({"cuik_molmaker": stub, "cuik_molmaker.mol_features": features})


def upstream_worker(upstream: str, smiles_file: str, workload: str, out_file: str) -> None:
    """Runs in a child process: upstream's package is also named ``kermt``, so it must not meet ours."""
    sys.path.insert(0, upstream)
    install_cuik_stub()
    from argparse import Namespace

    from descriptastorus.descriptors import rdNormalizedDescriptors
    from rdkit import Chem
    from kermt.data.molgraph import MolGraph  # upstream's

    assert MolGraph.__module__ == "kermt.data.molgraph" and upstream in sys.modules["kermt.data.molgraph"].__file__
    smiles = Path(smiles_file).read_text().splitlines()
    args = Namespace(bond_drop_rate=0, use_cuikmolmaker_featurization=False, no_cache=True)
    start = time.process_time()
    f_atoms, bond_feats, bond_atoms, features = [], [], [], []
    for s in smiles:  # what MoleculeDatapoint + MolCollator do per molecule
        if workload != "rdkit_2d_normalized":
            graph = MolGraph(s, args)
            f_atoms.extend(graph.f_atoms)
            bond_feats.extend(row[151:] for row in graph.f_bonds[::2])
            bond_atoms.extend(graph.b2a)
        if workload != "graph":
            canonical = Chem.MolToSmiles(Chem.MolFromSmiles(s), isomericSmiles=True)
            features.append(rdNormalizedDescriptors.RDKit2DNormalized().process(canonical)[1:])
    cpu = time.process_time() - start
    arrays = {"cpu": np.array(cpu)}
    if f_atoms:
        arrays.update(f_atoms=np.array(f_atoms, dtype=np.float32), bond_feats=np.array(bond_feats, dtype=np.float32),
                      bond_atoms=np.array(bond_atoms, dtype=np.int64).reshape(-1, 2))
    if features:
        arrays["features"] = np.nan_to_num(np.array(features, dtype=np.float64), nan=0.0)
    np.savez(out_file, **arrays)


def upstream(upstream_path: str, smiles: list[str], workload: str) -> tuple[float, dict[str, np.ndarray]]:
    with tempfile.TemporaryDirectory() as tmp:
        smiles_file, out_file = os.path.join(tmp, "smiles.txt"), os.path.join(tmp, "out.npz")
        Path(smiles_file).write_text("\n".join(smiles))
        subprocess.run([sys.executable, __file__, "--_worker", upstream_path, smiles_file, workload, out_file],
                       check=True, cwd=tmp)
        with np.load(out_file) as data:
            arrays = dict(data)
    return float(arrays.pop("cpu")), arrays


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> str:
    parts = []
    for key in sorted(set(a) & set(b)):
        if a[key].shape != b[key].shape:
            parts.append(f"{key}: SHAPE {a[key].shape} vs {b[key].shape}")
        else:
            parts.append(f"{key}: {np.abs(a[key].astype(np.float64) - b[key]).max():.2e}")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--upstream", help="upstream KERMT checkout (e.g. /work/upstream_kermt)")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--standardize", nargs="+", choices=("none", "parent"), default=["none"],
                        help="time ours with each (the rdkit_2d_normalized workload parses only: none)")
    parser.add_argument("--_worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        upstream_worker(*args._worker)
        return
    smiles = read_smiles(args.csv, args.n)
    print(f"{len(smiles)} SMILES from {args.csv}")
    ours(smiles[:5], "both")  # imports and one-off setup outside the timings, as on the upstream side
    for workload, standardize in [(w, s) for w in args.workloads for s in args.standardize]:
        cpu, ours_arrays = timed(ours, smiles, workload, standardize)
        line = f"{workload:>20} standardize {standardize:>6}: ours {len(smiles) / cpu:8.1f} mol/CPU-s"
        if args.upstream:
            up_cpu, up_arrays = upstream(args.upstream, smiles, workload)
            line += (f" | upstream {len(smiles) / up_cpu:8.1f} mol/CPU-s | speed-up x{up_cpu / cpu:.2f}"
                     f" | max|diff| {max_abs_diff(ours_arrays, up_arrays)}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
