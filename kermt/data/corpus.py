"""The pretraining corpus on disk: prepared once by ``kermt corpus``, read by every pretraining run.

Layout of ``CORPUS_DIR`` (a local directory or a pyarrow filesystem URI such as ``s3://bucket/corpus``)::

    atom_vocab.json, bond_vocab.json   context vocabularies in upstream's JSON layout (upstream loads them)
    smiles_vocab.json                  SMILES token vocabulary (SmilesVocab's JSON; upstream's is a pickle)
    shards/part-00000.parquet ...      one row per molecule, columns below
    invalid.csv                        source,row,smiles,reason of every rejected input row (row: 0-based data row)
    manifest.json                      written last: a directory without it is not a corpus

Shard columns (all labels of every molecule are stored; a trainer samples which ones it uses per step):

    smiles                  string         the SMILES every other column was computed from
    atom_counts, bond_counts  int32        atoms, chemical bonds
    atom_codes ... bond_rdkit_idx  large_list  the compact graph store (FlatGraphs.to_arrays, flattened rows)
    fg_labels               fixed_size_list<uint8>[85]  functional groups present (kermt.chem.fg_labels)
    tokens                  large_list<uint16>  SMILES token ids, <start> ... <end>
    atom_labels             large_list<uint16>  atom-vocab id of every atom, graph atom order
    bond_labels             large_list<uint16>  bond-vocab id of every chemical bond, (a1 < a2) pair order
    source, row             int32, int64   (written by ``kermt corpus``) input file index in the manifest's
                                           ``inputs`` and 0-based data row there: where the molecule came from

Ids are uint16 while a vocab has at most 65,536 entries, int32 beyond.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from rdkit import Chem, rdBase

from kermt import __version__
from kermt.chem.codes import CodedRows, index_dtype
from kermt.chem.fg_labels import FG_SIZE, fg_labels
from kermt.chem.molgraph import RAGGED_WIDTH, FlatGraphs, build_graphs
from kermt.chem.vocab_context import OTHER_INDEX, ContextVocab, molecule_contexts
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.data.atomic_files import exists, filesystem, join, read_text, write_atomically, write_text
from kermt.data.ragged import flat_values, list_column, offsets_of
from kermt.errors import UserError

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
ATOM_VOCAB_FILE, BOND_VOCAB_FILE, SMILES_VOCAB_FILE = "atom_vocab.json", "bond_vocab.json", "smiles_vocab.json"
INVALID_FILE = "invalid.csv"
FEATURIZE_CHUNK = 2048  # molecules featurised at once: bounds the dense float rows built on the way to the codes


def shard_path(index: int) -> str:
    """Relative path of shard ``index`` inside the corpus directory."""
    return f"shards/part-{index:05d}.parquet"


@dataclass(frozen=True)
class CorpusArrays:
    """n molecules of a corpus; ragged arrays are concatenated, molecule i owning ``x[x_offsets[i]:x_offsets[i+1]]``.

    smiles         tuple[str] [n]
    graphs         FlatGraphs with n molecules (compact codes; collate_graphs builds the batch graph)
    fg_labels      uint8 [n, 85]       functional-group labels
    tokens         uint16/int32 [T]    SMILES token ids incl. <start>/<end>;  token_offsets int64 [n + 1]
    atom_labels    uint16/int32 [A]    atom-vocab ids, graph atom order;      atom_offsets  int64 [n + 1]
    bond_labels    uint16/int32 [B]    bond-vocab ids, graph bond order;      bond_offsets  int64 [n + 1]

    A = graphs.atom_counts.sum(), B = graphs.bond_counts.sum() (chemical bonds, not directed edges).
    """

    smiles: tuple[str, ...]
    graphs: FlatGraphs
    fg_labels: np.ndarray
    tokens: np.ndarray
    token_offsets: np.ndarray
    atom_labels: np.ndarray
    atom_offsets: np.ndarray
    bond_labels: np.ndarray
    bond_offsets: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.smiles)
        checks = {
            "graphs": len(self.graphs) == n,
            "fg_labels": self.fg_labels.shape == (n, FG_SIZE),
            "token_offsets": len(self.token_offsets) == n + 1 and self.token_offsets[-1] == len(self.tokens),
            "atom_offsets": np.array_equal(np.diff(self.atom_offsets), self.graphs.atom_counts)
            and self.atom_offsets[-1] == len(self.atom_labels),
            "bond_offsets": np.array_equal(np.diff(self.bond_offsets), self.graphs.bond_counts)
            and self.bond_offsets[-1] == len(self.bond_labels),
        }
        wrong = [name for name, ok in checks.items() if not ok]
        if wrong:
            raise ValueError(f"corpus arrays of {n} molecules are inconsistent: {', '.join(wrong)}")

    def __len__(self) -> int:
        return len(self.smiles)

    @property
    def token_lengths(self) -> np.ndarray:
        """int64 [n]: tokens per molecule, <start> and <end> included."""
        return np.diff(self.token_offsets)

    def take(self, rows: Sequence[int] | np.ndarray) -> "CorpusArrays":
        """The molecules at ``rows``, in that order (a vectorised gather)."""
        rows = np.asarray(rows, dtype=np.int64)
        tokens, token_offsets = _take_ragged(self.tokens, self.token_offsets, rows)
        atom_labels, atom_offsets = _take_ragged(self.atom_labels, self.atom_offsets, rows)
        bond_labels, bond_offsets = _take_ragged(self.bond_labels, self.bond_offsets, rows)
        return CorpusArrays(tuple(self.smiles[i] for i in rows), self.graphs.select(rows), self.fg_labels[rows],
                            tokens, token_offsets, atom_labels, atom_offsets, bond_labels, bond_offsets)

    @staticmethod
    def concat(parts: Sequence["CorpusArrays"]) -> "CorpusArrays":
        if not parts:
            raise ValueError("cannot concatenate zero parts")
        ragged = {}
        for name in ("tokens", "atom_labels", "bond_labels"):
            offsets_name = "token_offsets" if name == "tokens" else name.replace("labels", "offsets")
            values = [getattr(p, name) for p in parts]
            lengths = [np.diff(getattr(p, offsets_name)) for p in parts]
            ragged[name] = np.concatenate(values)
            ragged[offsets_name] = offsets_of(np.concatenate(lengths))
        return CorpusArrays(
            smiles=tuple(s for p in parts for s in p.smiles),
            graphs=_concat_graphs([p.graphs for p in parts]),
            fg_labels=np.concatenate([p.fg_labels for p in parts]),
            **ragged,
        )


def _take_ragged(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = offsets[rows + 1] - offsets[rows]
    new_offsets = offsets_of(counts)
    within = np.arange(int(new_offsets[-1]), dtype=np.int64) - np.repeat(new_offsets[:-1], counts)
    return values[np.repeat(offsets[rows], counts) + within], new_offsets


def _concat_graphs(parts: Sequence[FlatGraphs]) -> FlatGraphs:
    return FlatGraphs(
        atoms=CodedRows.concat([p.atoms for p in parts]),
        bond_atoms=np.concatenate([p.bond_atoms for p in parts]),
        bonds=CodedRows.concat([p.bonds for p in parts]),
        bond_rdkit_idx=np.concatenate([p.bond_rdkit_idx for p in parts]),
        atom_counts=np.concatenate([p.atom_counts for p in parts]),
        bond_counts=np.concatenate([p.bond_counts for p in parts]),
    )


def parsed(smiles: Sequence[str], mols: Sequence[bytes] | None = None) -> Iterator[Chem.Mol | None]:
    """The molecules of cleaned SMILES, one at a time: rebuilt from their pickles when given (as
    :func:`kermt.data.corpus_prep.clean_smiles_mols` returns them), else parsed."""
    if mols is not None:
        yield from map(Chem.Mol, mols)
        return
    with rdBase.BlockLogs():
        yield from map(Chem.MolFromSmiles, smiles)


def corpus_rows(smiles: Sequence[str], atom_vocab: ContextVocab, bond_vocab: ContextVocab,
                smiles_vocab: SmilesVocab, mols: Sequence[bytes] | None = None) -> CorpusArrays:
    """Featurise valid SMILES (as ``kermt.data.corpus_prep.clean_smiles`` keeps them) into corpus rows.

    Each molecule is parsed from its SMILES as given (no canonicalisation here), so graphs, labels and tokens all
    follow that string's atom order; ``mols``: the molecules' pickles from cleaning (the same molecules, rebuilt
    without parsing). ValueError naming the row if one does not parse or cannot be featurised.
    """
    def chunk(start: int) -> CorpusArrays:
        stop = start + FEATURIZE_CHUNK
        molecules = list(parsed(smiles[start:stop], None if mols is None else mols[start:stop]))
        return _featurize_chunk(smiles[start:stop], molecules, start, atom_vocab, bond_vocab, smiles_vocab)

    parts = [chunk(start) for start in range(0, len(smiles), FEATURIZE_CHUNK)]
    return CorpusArrays.concat(parts) if parts else chunk(0)


def _featurize_chunk(smiles: Sequence[str], mols: list[Chem.Mol | None], first_row: int, atom_vocab: ContextVocab,
                     bond_vocab: ContextVocab, smiles_vocab: SmilesVocab) -> CorpusArrays:
    graphs, errors = build_graphs(mols)
    bad = next((i for i, (m, e) in enumerate(zip(mols, errors)) if m is None or e is not None), None)
    if bad is not None:
        raise ValueError(f"row {first_row + bad}: cannot featurise {smiles[bad]!r}: {errors[bad] or 'unparsable'}")
    tokens = [smiles_vocab.encode(s) for s in smiles]
    atom_ids, bond_ids = [], []
    atom_index, bond_index = atom_vocab.stoi.get, bond_vocab.stoi.get
    for atoms, bonds in map(molecule_contexts, mols):
        atom_ids += [atom_index(c, OTHER_INDEX) for c in atoms]
        bond_ids += [bond_index(c, OTHER_INDEX) for c in bonds]
    return CorpusArrays(
        smiles=tuple(smiles),
        graphs=graphs,
        fg_labels=fg_labels(mols),
        tokens=np.fromiter((t for ids in tokens for t in ids), dtype=index_dtype(len(smiles_vocab))),
        token_offsets=offsets_of(np.array([len(ids) for ids in tokens], dtype=np.int64)),
        atom_labels=np.array(atom_ids, dtype=index_dtype(len(atom_vocab))),
        atom_offsets=offsets_of(graphs.atom_counts),
        bond_labels=np.array(bond_ids, dtype=index_dtype(len(bond_vocab))),
        bond_offsets=offsets_of(graphs.bond_counts),
    )


# --- shards -------------------------------------------------------------------------------------------------------

def corpus_table(arrays: CorpusArrays) -> pa.Table:
    """The shard columns (see the module docstring) of ``arrays``."""
    graphs = arrays.graphs.to_arrays()
    atom_offsets, bond_offsets = arrays.atom_offsets, arrays.bond_offsets
    columns = {
        "smiles": pa.array(arrays.smiles, pa.string()),
        "atom_counts": pa.array(graphs["atom_counts"]),
        "bond_counts": pa.array(graphs["bond_counts"]),
    }
    for name in RAGGED_WIDTH:
        columns[name] = list_column(graphs[name], atom_offsets if name.startswith("atom_") else bond_offsets)
    columns["fg_labels"] = pa.FixedSizeListArray.from_arrays(pa.array(arrays.fg_labels.reshape(-1)), FG_SIZE)
    columns["tokens"] = list_column(arrays.tokens, arrays.token_offsets)
    columns["atom_labels"] = list_column(arrays.atom_labels, atom_offsets)
    columns["bond_labels"] = list_column(arrays.bond_labels, bond_offsets)
    return pa.table(columns)


def arrays_from_table(table: pa.Table) -> CorpusArrays:
    """Inverse of :func:`corpus_table`."""
    graph_arrays = {name: flat_values(table, name) for name in RAGGED_WIDTH}
    graph_arrays.update({name: table.column(name).to_numpy() for name in ("atom_counts", "bond_counts")})
    graphs = FlatGraphs.from_arrays(graph_arrays)
    fg = flat_values(table, "fg_labels")
    lengths = pc.list_value_length(table.column("tokens").combine_chunks()).to_numpy(zero_copy_only=False)
    return CorpusArrays(
        smiles=tuple(table.column("smiles").to_pylist()),
        graphs=graphs,
        fg_labels=fg.reshape(table.num_rows, FG_SIZE).astype(np.uint8, copy=False),
        tokens=flat_values(table, "tokens"),
        token_offsets=offsets_of(lengths.astype(np.int64)),
        atom_labels=flat_values(table, "atom_labels"),
        atom_offsets=offsets_of(graphs.atom_counts),
        bond_labels=flat_values(table, "bond_labels"),
        bond_offsets=offsets_of(graphs.bond_counts),
    )


def write_shard(path: str, arrays: CorpusArrays) -> None:
    """Write one shard (Parquet, zstd) atomically."""
    table = corpus_table(arrays)
    write_atomically(path, lambda fs, tmp: pq.write_table(table, tmp, filesystem=fs, compression="zstd"))


def read_shard(path: str) -> CorpusArrays:
    fs, inner = filesystem(path)
    return arrays_from_table(pq.read_table(inner, filesystem=fs))




# --- manifest and reading ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShardInfo:
    path: str  # relative to the corpus directory
    rows: int


@dataclass(frozen=True)
class InputInfo:
    path: str  # as given to ``kermt corpus``
    rows: int  # data rows read
    invalid: int  # of which rejected (listed in invalid.csv)
    duplicates: int = 0  # of which dropped: a molecule an earlier row holds (corpora before 0 counted none)


@dataclass(frozen=True)
class CorpusManifest:
    """What ``manifest.json`` records. ``settings``: how the vocabs and SMILES were made (min_freq, max_size,
    canonicalize, smiles_column, ...), kept for the record."""

    n_molecules: int
    shards: tuple[ShardInfo, ...]
    inputs: tuple[InputInfo, ...]
    n_invalid: int
    max_token_length: int
    atom_vocab_size: int
    bond_vocab_size: int
    smiles_vocab_size: int
    settings: dict = field(default_factory=dict)
    n_duplicates: int = 0  # valid rows dropped as later copies of a molecule (settings["deduplicate"])
    atom_vocab: str = ATOM_VOCAB_FILE
    bond_vocab: str = BOND_VOCAB_FILE
    smiles_vocab: str = SMILES_VOCAB_FILE
    invalid_report: str = INVALID_FILE
    fg_size: int = FG_SIZE
    format_version: int = FORMAT_VERSION
    created_by: str = f"kermt {__version__}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> "CorpusManifest":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["shards"] = tuple(ShardInfo(**s) for s in data["shards"])
        values["inputs"] = tuple(InputInfo(**i) for i in data["inputs"])
        return cls(**values)


def write_vocabs(corpus_dir: str, atom_vocab: ContextVocab, bond_vocab: ContextVocab,
                 smiles_vocab: SmilesVocab) -> None:
    write_text(join(corpus_dir, ATOM_VOCAB_FILE), json.dumps(atom_vocab.to_dict()))
    write_text(join(corpus_dir, BOND_VOCAB_FILE), json.dumps(bond_vocab.to_dict()))
    write_text(join(corpus_dir, SMILES_VOCAB_FILE), json.dumps(smiles_vocab.to_dict()))


def write_manifest(corpus_dir: str, manifest: CorpusManifest) -> None:
    """Write ``manifest.json`` atomically: call it last, once every shard, vocab and the report are in place."""
    write_text(join(corpus_dir, MANIFEST_FILE), manifest.to_json())


def _rerun_hint(corpus_dir: str) -> str:
    return f"prepare it with `kermt corpus --data_path FILE [FILE ...] --save_dir {corpus_dir}`"


@dataclass(frozen=True)
class Corpus:
    """An opened corpus directory: its manifest and vocabularies; :meth:`load` reads shards."""

    path: str
    manifest: CorpusManifest
    atom_vocab: ContextVocab
    bond_vocab: ContextVocab
    smiles_vocab: SmilesVocab

    def __len__(self) -> int:
        return self.manifest.n_molecules

    def load(self, shards: Sequence[int] | None = None) -> CorpusArrays:
        """The molecules of the given shard indices (default: all), in shard order."""
        indices = range(len(self.manifest.shards)) if shards is None else shards
        parts = [read_listed_shard(self.path, self.manifest.shards[index]) for index in indices]
        if not parts:
            raise ValueError("no shards selected")
        return CorpusArrays.concat(parts)

    def smiles(self) -> list[str]:
        """The stored SMILES of every molecule, in shard order (only that column is read)."""
        strings: list[str] = []
        for info in self.manifest.shards:
            fs, inner = filesystem(join(self.path, info.path))
            strings += pq.read_table(inner, columns=["smiles"], filesystem=fs).column("smiles").to_pylist()
        return strings

    @property
    def canonical(self) -> bool:
        """Whether the stored SMILES are RDKit canonical (``kermt corpus``'s default)."""
        return bool(self.manifest.settings.get("canonicalize", True))


def read_listed_shard(corpus_dir: str, info: ShardInfo) -> CorpusArrays:
    """One shard the manifest lists; UserError when it does not hold the rows the manifest says."""
    part = read_shard(join(corpus_dir, info.path))
    if len(part) != info.rows:
        raise UserError(f"{join(corpus_dir, info.path)}: {len(part)} rows, the manifest says {info.rows}; "
                        f"the corpus is damaged, {_rerun_hint(corpus_dir)}")
    return part


def open_corpus(path: str) -> Corpus:
    """Open ``path`` (local or URI). UserError when it is no complete corpus (no manifest: never finished)."""
    path = str(path)
    manifest_path = join(path, MANIFEST_FILE)
    if not exists(manifest_path):
        what = "does not exist" if not exists(path) else f"is not a complete corpus (no {MANIFEST_FILE})"
        raise UserError(f"{path} {what}; {_rerun_hint(path)}")
    try:
        manifest = CorpusManifest.from_dict(json.loads(read_text(manifest_path)))
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{manifest_path}: unreadable manifest ({error}); {_rerun_hint(path)}") from error
    if manifest.format_version != FORMAT_VERSION:
        raise UserError(f"{manifest_path}: corpus format {manifest.format_version}, this kermt reads "
                        f"{FORMAT_VERSION}; {_rerun_hint(path)}")
    atom = ContextVocab.from_dict(json.loads(read_text(join(path, manifest.atom_vocab))))
    bond = ContextVocab.from_dict(json.loads(read_text(join(path, manifest.bond_vocab))))
    smiles = SmilesVocab.from_dict(json.loads(read_text(join(path, manifest.smiles_vocab))))
    sizes = (len(atom), len(bond), len(smiles))
    if sizes != (manifest.atom_vocab_size, manifest.bond_vocab_size, manifest.smiles_vocab_size):
        raise UserError(f"{path}: vocab files do not match the manifest (sizes {sizes}); {_rerun_hint(path)}")
    return Corpus(path, manifest, atom, bond, smiles)


__all__ = ["ATOM_VOCAB_FILE", "BOND_VOCAB_FILE", "FORMAT_VERSION", "INVALID_FILE", "MANIFEST_FILE",
           "SMILES_VOCAB_FILE", "Corpus", "CorpusArrays", "CorpusManifest", "InputInfo", "ShardInfo",
           "arrays_from_table", "corpus_rows", "corpus_table", "open_corpus", "parsed", "read_listed_shard",
           "read_shard", "shard_path", "write_manifest", "write_shard", "write_vocabs"]
