"""Molecule-level feature generators with upstream KERMT's names and values.

Upstream behaviour: docs/upstream-compatibility.md#molecule-features.

    rdkit_2d             200 raw descriptastorus RDKit2D descriptors (its leading success flag dropped)
    rdkit_2d_normalized  the same 200 through descriptastorus' per-column CDFs (RDKit2DNormalized)
    fgtasklabel          the 85 ``fr_*`` fragment counts of rdkit_2d, binarised (nonzero -> 1)
    morgan               Morgan bit vector, radius 2, 2048 bits
    morgan_count         hashed Morgan counts, radius 2, 2048 bits

Why this is faster than calling descriptastorus per molecule, with the same numbers:
- the raw descriptors are computed once per molecule and shared by rdkit_2d, rdkit_2d_normalized and
  fgtasklabel;
- RDKit's four E-state extrema each recompute all E-state indices; here they are computed once and reduced
  with the same max/min/abs definitions;
- normalisation calls descriptastorus' own CDF for each column ONCE on the whole batch column (a vectorised
  scipy call) instead of 200 scalar scipy calls per molecule, which is most of RDKit2DNormalized's cost.

As upstream, the descriptastorus generators see the molecule re-parsed from its canonical isomeric SMILES;
the Morgan generators see the molecule as given. Outputs keep NaN where RDKit yields NaN (upstream's
generators do too); the dataset layer replaces NaN by 0 (``kermt.data.featurize``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from descriptastorus.descriptors import dists, rdDescriptors, rdNormalizedDescriptors
from rdkit import Chem
from rdkit.Chem import rdFingerprintGenerator
from rdkit.Chem.EState import EState

from kermt.chem.validation import parse_smiles, quiet_rdkit  # quiet thread by thread, not process-wide
from kermt.registry import GENERATOR_WIDTHS

RDKIT2D_COLUMNS: tuple[str, ...] = tuple(name for name, _ in rdDescriptors.RDKit2D().columns)
FG_COLUMNS: tuple[str, ...] = tuple(name for name in RDKIT2D_COLUMNS if name.startswith("fr_"))
_FG_INDEX = np.array([RDKIT2D_COLUMNS.index(name) for name in FG_COLUMNS])

_DESCRIPTASTORUS_BASED = ("rdkit_2d", "rdkit_2d_normalized", "fgtasklabel")
_MORGAN = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)

_ESTATE_REDUCERS: dict[str, Callable[[np.ndarray], float]] = {
    "MaxEStateIndex": lambda e: max(e),
    "MinEStateIndex": lambda e: min(e),
    "MaxAbsEStateIndex": lambda e: max(abs(x) for x in e),
    "MinAbsEStateIndex": lambda e: min(abs(x) for x in e),
}
_OTHER_FUNCS = [(i, rdDescriptors.FUNCS_V1[name]) for i, name in enumerate(RDKIT2D_COLUMNS)
                if name not in _ESTATE_REDUCERS]
_ESTATE_COLUMNS = [(RDKIT2D_COLUMNS.index(name), reduce) for name, reduce in _ESTATE_REDUCERS.items()]


def raw_rdkit2d(mols: Sequence[Chem.Mol | None]) -> tuple[np.ndarray, np.ndarray]:
    """Raw descriptastorus RDKit2D values of already-prepared molecules.

    Returns (values float64 [n, 200], failed bool [n, 200]). A descriptor that raises is stored as 0.0 and
    flagged in ``failed`` (descriptastorus stores 0.0 and clears its success flag). A None molecule gives a
    NaN row.
    """
    values = np.full((len(mols), len(RDKIT2D_COLUMNS)), np.nan)
    failed = np.zeros(values.shape, dtype=bool)
    with quiet_rdkit():
        for row, mol in enumerate(mols):
            if mol is not None:
                _fill_raw_row(mol, values[row], failed[row])
    return values, failed


def _fill_raw_row(mol: Chem.Mol, out: np.ndarray, failed: np.ndarray) -> None:
    # E-state indices first: RDKit caches them on the mol, and the EState_VSA / VSA_EState descriptors
    # reuse that cache, so the O(n_atoms^2) Python computation runs once instead of three times.
    try:
        estate = EState.EStateIndices(mol)
        for column, reduce in _ESTATE_COLUMNS:
            out[column], failed[column] = _safe_call(reduce, estate)
    except Exception:  # descriptastorus: any failing descriptor is 0.0 + failure flag
        for column, _ in _ESTATE_COLUMNS:
            out[column], failed[column] = 0.0, True
    for column, func in _OTHER_FUNCS:
        out[column], failed[column] = _safe_call(func, mol)


def _safe_call(func: Callable, arg: object) -> tuple[float, bool]:
    try:
        value = func(arg)
    except Exception:  # same contract as descriptastorus' applyFunc: record failure, keep going
        return 0.0, True
    return (0.0, True) if value is None else (value, False)


def normalize_rdkit2d(values: np.ndarray, failed: np.ndarray) -> np.ndarray:
    """RDKit2DNormalized from raw values: descriptastorus' CDF of each column, applied to whole columns.

    ``values`` [n, 200] float64 from :func:`raw_rdkit2d`. Failed descriptors give 0.0 (descriptastorus'
    rule); NaN raw values stay NaN, NaN rows (missing molecules) stay NaN.
    """
    out = np.empty_like(values)
    with np.errstate(invalid="ignore"):
        for column, name in enumerate(RDKIT2D_COLUMNS):
            # Descriptor values repeat a lot (counts, small ratios): evaluate each distinct value once.
            distinct, inverse = np.unique(values[:, column], return_inverse=True)
            out[:, column] = _cdf_of_distinct(name, distinct)[inverse.reshape(-1)]
    out[failed] = 0.0
    return out


# Columns whose scipy CDF has no closed form (gausshyper: numerical integration, ~ms per value). Their values
# are memoised across batches; FractionCSP3 takes few distinct values (ratios of small integers).
_SLOW_CDF_COLUMNS = {name for name, spec in dists.dists.items() if spec[0] == "gausshyper"}
_CDF_MEMO: dict[str, dict[float, float]] = {name: {} for name in _SLOW_CDF_COLUMNS}
_CDF_MEMO_LIMIT = 200_000


def _cdf_of_distinct(name: str, distinct: np.ndarray) -> np.ndarray:
    cdf = rdNormalizedDescriptors.cdfs[name]
    memo = _CDF_MEMO.get(name)
    if memo is None:
        return cdf(distinct)
    out = np.full(distinct.shape, np.nan)  # a NaN value's CDF is NaN, as in descriptastorus
    known = ~np.isnan(distinct)
    keys = distinct[known].tolist()
    missing = [v for v in keys if v not in memo]
    if missing:
        if len(memo) + len(missing) > _CDF_MEMO_LIMIT:
            memo.clear()
        memo.update(zip(missing, np.atleast_1d(cdf(np.array(missing))).tolist()))
    out[known] = [memo[v] for v in keys]
    return out


def canonical_mol(mol: Chem.Mol) -> Chem.Mol | None:
    """The molecule upstream hands to descriptastorus: re-parsed from its canonical isomeric SMILES."""
    with quiet_rdkit():
        return Chem.MolFromSmiles(Chem.MolToSmiles(mol, isomericSmiles=True))


def morgan_bits(mols: Sequence[Chem.Mol | None]) -> np.ndarray:
    """Morgan r=2 bit vectors: float64 [n, 2048] (NaN rows for None)."""
    return _stack_rows(mols, _MORGAN.GetFingerprintAsNumPy, 2048)


def morgan_counts(mols: Sequence[Chem.Mol | None]) -> np.ndarray:
    """Hashed Morgan r=2 counts: float64 [n, 2048] (NaN rows for None)."""
    return _stack_rows(mols, _MORGAN.GetCountFingerprintAsNumPy, 2048)


def _stack_rows(mols: Sequence[Chem.Mol | None], row_of: Callable, width: int) -> np.ndarray:
    out = np.full((len(mols), width), np.nan)
    for i, mol in enumerate(mols):
        if mol is not None:
            out[i] = row_of(mol)
    return out


def molecule_features(mols: Sequence[Chem.Mol | str | None], generators: Sequence[str]) -> np.ndarray:
    """Features of ``generators`` (upstream names) concatenated in that order: float64 [n, total width].

    Entries are RDKit molecules or SMILES; ``None`` and invalid SMILES give NaN rows. The raw RDKit2D pass
    runs at most once, however many descriptastorus-based generators are asked for.
    """
    mols = [parse_smiles(m)[0] if isinstance(m, str) else m for m in mols]
    unknown = [g for g in generators if g not in GENERATOR_WIDTHS]
    if unknown:
        raise ValueError(f"unknown features generator {unknown[0]!r}; known: {sorted(GENERATOR_WIDTHS)}")
    raw: tuple[np.ndarray, np.ndarray] | None = None
    if any(g in _DESCRIPTASTORUS_BASED for g in generators):
        raw = raw_rdkit2d([None if m is None else canonical_mol(m) for m in mols])
    blocks = [_one_generator(name, mols, raw) for name in generators]
    return np.concatenate(blocks, axis=1) if blocks else np.zeros((len(mols), 0))


def feature_column_names(generators: Sequence[str]) -> list[str]:
    """``generator:column`` for every column :func:`molecule_features` returns (Morgan columns are ``bit_<i>``)."""
    names: list[str] = []
    for name in generators:
        if name in ("rdkit_2d", "rdkit_2d_normalized"):
            columns: Sequence[str] = RDKIT2D_COLUMNS
        elif name == "fgtasklabel":
            columns = FG_COLUMNS
        else:
            columns = [f"bit_{i}" for i in range(GENERATOR_WIDTHS[name])]
        names += [f"{name}:{column}" for column in columns]
    return names


def infinite_feature_reasons(features: np.ndarray, generators: Sequence[str]) -> dict[int, str]:
    """Rows of ``features`` holding ±inf -> why they cannot be used, naming the first such column.

    A raw descriptor can overflow (e.g. Ipc of a very large molecule). Upstream passes it on: its feature scaler then
    turns the whole column into -inf or NaN for every molecule, silently. Such a row is invalid instead.
    """
    rows, columns = np.nonzero(np.isinf(features))
    if rows.size == 0:
        return {}
    names = feature_column_names(generators)
    reasons: dict[int, str] = {}
    for row, column in zip(rows.tolist(), columns.tolist()):  # row-major: a row's first column comes first
        if row not in reasons:
            count = int(np.isinf(features[row]).sum())
            reasons[row] = (f"infinite feature: {names[column]} (column {column}) is {features[row, column]:+}"
                            + (f", and {count - 1} more column(s)" if count > 1 else ""))
    return reasons


def _one_generator(name: str, mols: Sequence[Chem.Mol | None], raw: tuple | None) -> np.ndarray:
    if name == "morgan":
        return morgan_bits(mols)
    if name == "morgan_count":
        return morgan_counts(mols)
    values, failed = raw
    if name == "rdkit_2d":
        return values
    if name == "rdkit_2d_normalized":
        return normalize_rdkit2d(values, failed)
    fragments = values[:, _FG_INDEX]  # fgtasklabel: nonzero count -> 1, NaN rows stay NaN
    return np.where(np.isnan(fragments), np.nan, (fragments != 0).astype(np.float64))


__all__ = ["FG_COLUMNS", "GENERATOR_WIDTHS", "RDKIT2D_COLUMNS", "canonical_mol", "feature_column_names",
           "infinite_feature_reasons", "molecule_features",
           "morgan_bits", "morgan_counts", "normalize_rdkit2d", "raw_rdkit2d"]
