"""Train/val/test splits, index-for-index identical to upstream KERMT for the same input and seed.

Every function returns a :class:`Split` of row indices into the (already validated) molecule list. Upstream uses
Python's ``random`` module and Python ``set`` iteration order for scaffold splits; we use the same primitives (a
private ``random.Random(seed)`` behaves exactly like ``random.seed(seed)`` on the module) so indices match upstream
without touching global state.

Deliberate differences from upstream (docs/upstream-compatibility.md#splits):
- scaffold_balanced with a zero test fraction: upstream silently drops the scaffold sets that fit neither train nor
  val; here they go to val, so no molecule is lost.
- predetermined: a ``val_fold_index`` of 0 is a real fold index (upstream treats 0 as "absent").
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rdkit import Chem
from rdkit.Chem.Scaffolds import MurckoScaffold

from kermt.errors import UserError


@dataclass(frozen=True)
class Split:
    """Row indices of each part, in upstream's order (which decides batch composition downstream)."""

    train: list[int]
    val: list[int]
    test: list[int]

    def to_dict(self) -> dict[str, list[int]]:
        return {"train": self.train, "val": self.val, "test": self.test}


def check_sizes(sizes: Sequence[float]) -> tuple[float, float, float]:
    if len(sizes) != 3 or any(s < 0 for s in sizes) or abs(sum(sizes) - 1.0) > 1e-6:
        raise UserError(f"split_sizes must be three non-negative fractions summing to 1, got {list(sizes)}; pass "
                        "e.g. --split_sizes 0.8 0.1 0.1")
    return float(sizes[0]), float(sizes[1]), float(sizes[2])


def random_split(n: int, sizes: Sequence[float], seed: int) -> Split:
    """Shuffle with ``random.seed(seed)`` semantics, then cut at int(s0*n) and int((s0+s1)*n)."""
    s0, s1, _ = check_sizes(sizes)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    train_end, val_end = int(s0 * n), int((s0 + s1) * n)
    return Split(order[:train_end], order[train_end:val_end], order[val_end:])


def murcko_scaffold(smiles: str) -> str:
    """Bemis-Murcko scaffold SMILES without chirality, as upstream computes it from the input SMILES."""
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"cannot compute the scaffold of unparsable SMILES {smiles!r}")
    return MurckoScaffold.MurckoScaffoldSmiles(mol=mol, includeChirality=False)


def scaffold_balanced_split(smiles: Sequence[str], sizes: Sequence[float], seed: int) -> Split:
    """Greedy scaffold split with big sets first, each group shuffled by ``seed`` (upstream's balanced mode)."""
    s0, s1, s2 = check_sizes(sizes)
    n = len(smiles)
    train_size, val_size, test_size = s0 * n, s1 * n, s2 * n
    # dict keeps first-occurrence order of scaffolds; sets keep upstream's (hash) iteration order of members
    scaffold_sets: dict[str, set[int]] = {}
    for i, smi in enumerate(smiles):
        scaffold_sets.setdefault(murcko_scaffold(smi), set()).add(i)
    big, small = [], []
    for index_set in scaffold_sets.values():
        is_big = len(index_set) > val_size / 2 or len(index_set) > test_size / 2
        (big if is_big else small).append(index_set)
    rng = random.Random(seed)
    rng.shuffle(big)
    rng.shuffle(small)
    train: list[int] = []
    val: list[int] = []
    test: list[int] = []
    for index_set in big + small:
        if len(train) + len(index_set) <= train_size:
            train += index_set
        elif len(val) + len(index_set) <= val_size or test_size == 0:
            val += index_set
        else:
            test += index_set
    return Split(train, val, test)


def load_index_file(path: str | Path) -> list:
    """Read a JSON index file. Pickle files are refused: they can run code (convert them to JSON once)."""
    path = Path(path)
    if path.suffix in (".pkl", ".pckl", ".pickle"):
        raise UserError(
            f"{path}: pickled index files are not loaded (unpickling can run code). Convert it to JSON, e.g. "
            f"python -c \"import pickle,json; json.dump(pickle.load(open('{path}','rb')), "
            f"open('{path.with_suffix('.json')}','w'))\""
        )
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as error:
        raise UserError(f"index file {path}: cannot read it ({error.strerror or error}); check the path") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"index file {path}: not valid JSON ({error}); index files are JSON lists of row-index "
                        "lists") from error
    if not isinstance(data, list):
        raise UserError(f"index file {path}: expected a JSON list (one entry per fold), got {type(data).__name__}")
    return data


def _fold(path: str | Path, folds: list, fold: int, flag: str | None = None) -> list:
    """Entry ``fold`` of an index file's list of folds (a list itself), or a UserError naming the file and what
    to change: ``flag`` (e.g. --test_fold_index) when the user named the fold, else --num_folds."""
    if not 0 <= fold < len(folds):
        remedy = (f"use a {flag} in [0, {len(folds)})" if flag else f"run with --num_folds {len(folds)} or fewer")
        raise UserError(f"index file {path}: {flag or 'fold'} {fold} requested but the file holds {len(folds)} "
                        f"folds; {remedy}")
    if not isinstance(folds[fold], list):
        raise UserError(f"index file {path}: fold {fold} is a {type(folds[fold]).__name__}, expected a list")
    return folds[fold]


def index_predetermined_split(index_file: str | Path, fold: int, n: int) -> Split:
    """Fold ``fold`` of a JSON list ``[[train_idx, val_idx, test_idx], ...]`` (row indices after validation)."""
    parts = _fold(index_file, load_index_file(index_file), fold)
    return _checked_split(parts, n, f"index file {index_file} fold {fold}")


def crossval_split(index_dir: str | Path, index_file: str | Path, fold: int, n: int) -> Split:
    """Fold ``fold`` lists file ids per part; each id names ``{index_dir}/{id}.json`` holding row indices."""
    ids_per_part = _fold(index_file, load_index_file(index_file), fold)
    if not all(isinstance(ids, list) for ids in ids_per_part):
        raise UserError(f"index file {index_file}: fold {fold} must hold [train, val, test] lists of file ids")
    parts = [[i for file_id in ids for i in load_index_file(Path(index_dir) / f"{file_id}.json")]
             for ids in ids_per_part]
    return _checked_split(parts, n, f"index file {index_file} fold {fold}")


def predetermined_split(
    folds_file: str | Path,
    test_fold_index: int,
    val_fold_index: int | None,
    sizes: Sequence[float],
    seed: int,
    n: int,
) -> Split:
    """Test = one fold; val = another fold or a seeded cut of the remaining rows at int(s0 * len)."""
    folds = load_index_file(folds_file)
    test = list(_fold(folds_file, folds, test_fold_index, "--test_fold_index"))
    if val_fold_index is not None:
        val = list(_fold(folds_file, folds, val_fold_index, "--val_fold_index"))
        used = {test_fold_index, val_fold_index}
        train = [i for k in range(len(folds)) if k not in used for i in _fold(folds_file, folds, k)]
    else:
        rest = [i for k in range(len(folds)) if k != test_fold_index for i in _fold(folds_file, folds, k)]
        random.Random(seed).shuffle(rest)
        cut = int(check_sizes(sizes)[0] * len(rest))
        train, val = rest[:cut], rest[cut:]
    return _checked_split([train, val, test], n, f"folds file {folds_file}")


def _checked_split(parts: Sequence[Sequence[int]], n: int, source: str) -> Split:
    if len(parts) != 3 or not all(isinstance(part, list) for part in parts):
        raise UserError(f"{source}: expected [train, val, test] index lists, got {len(parts)} entries")
    for name, part in zip(("train", "val", "test"), parts):
        bad = [i for i in part if not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n)]
        if bad:
            raise UserError(f"{source}: {name} index {bad[0]!r} is not a row index in [0, {n}) (the data has {n} "
                            "valid molecules); regenerate the index file for this data")
    return Split(*(list(p) for p in parts))


SIZED_SPLITS = ("random", "scaffold_balanced")  # the split types that cut data_path by --split_sizes


def split_description(split_type: str, val_path: str | None = None, test_path: str | None = None) -> str:
    """The split a finetune ran, in words: ``split_type`` alone, or which parts came from separate files and what
    became of data_path. (Upstream's summary line ``overall_<split_type>_test_<metric>`` names the split type
    whatever the files, so run.json, the report and the service page say this instead.)"""
    given = [(part, path) for part, path in (("val", val_path), ("test", test_path)) if path]
    if not given:
        return split_type
    files = f"given file{'s' if len(given) > 1 else ''}: " + ", ".join(f"{part} {path}" for part, path in given)
    if split_type not in SIZED_SPLITS:
        return f"{files}; data_path: {split_type}, its {' and '.join(p for p, _ in given)} part unused"
    if len(given) > 1:
        return f"{files}; data_path: all for training"
    return f"{files}; data_path: train/{'test' if val_path else 'val'} by {split_type}"
