"""Steps of corpus preparation that do not depend on where they run: cleaning, counting, vocab building.

``kermt corpus`` runs them as Ray Data map + reduce over many files; :func:`prepare_corpus` runs them in one
process (a notebook, the tests' reference, the single-process benchmark). Both produce the same directory.

Upstream prepares pretraining data as ``clean_smiles.py`` (drop rows RDKit cannot parse, rewrite the rest as RDKit
canonical SMILES) and then ``build_vocab.py`` on the cleaned file. Here the same happens in one go: a row is kept
when it parses, has a heavy atom and can be featurised; its stored SMILES is the canonical one (``canonicalize``,
the default) or the input text. A molecule that an earlier row already holds (same canonical SMILES, whatever
the spelling: ``OCC`` and ``CCO``) is dropped and counted (``deduplicate``, the default; upstream keeps it); the
first occurrence in input order (file, then row) stays. The vocabularies count the stored SMILES of the kept rows.
So, with ``deduplicate=False``, the vocabs equal ``build_vocab.py``'s output on upstream's cleaned file.
Upstream's counts would differ only by rows it keeps and we reject (no heavy atom, an unencodable formal charge),
and for the SMILES vocab by tokens of lines it cannot parse, which it counts anyway.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from rdkit import Chem, rdBase

from kermt.chem.features import formal_charge_slot
from kermt.chem.validation import parse_smiles, reason_kind
from kermt.chem.vocab_context import ContextVocab, molecule_contexts
from kermt.chem.vocab_smiles import SMILES_SPECIALS, SmilesVocab
from kermt.data.atomic_files import join, write_text
from kermt.data.corpus import (
    INVALID_FILE,
    CorpusManifest,
    InputInfo,
    ShardInfo,
    corpus_rows,
    parsed,
    shard_path,
    write_manifest,
    write_shard,
    write_vocabs,
)
from kermt.data.featurize import UNFEATURIZABLE
from kermt.errors import UserError, user_input

NOT_ROUND_TRIPPING = "canonical SMILES does not parse"
VOCAB_KINDS = ("atom", "bond", "smiles")
_TOKENIZER = SmilesVocab(itos=SMILES_SPECIALS)  # tokenising needs only the pattern


@dataclass(frozen=True)
class VocabSettings:
    """Cut-offs of upstream's build_vocab.py (``None``: unlimited) and whether SMILES are canonicalised."""

    min_freq: int = 1
    max_size: int | None = None
    smiles_min_freq: int = 1
    smiles_max_size: int | None = None
    canonicalize: bool = True
    deduplicate: bool = True  # drop later copies of a molecule (same canonical SMILES)


def clean_one(raw: object, canonicalize: bool = True) -> tuple[str, str | None]:
    """(SMILES to store, None) for a usable row, else ('', reason)."""
    stored, reason, _ = clean_one_mol(raw, canonicalize)
    return stored, reason


def clean_one_mol(raw: object, canonicalize: bool = True) -> tuple[str, str | None, bytes | None]:
    """:func:`clean_one` plus the kept molecule as RDKit's binary pickle (None when rejected): the molecule parsed
    from the stored SMILES, so later steps rebuild it (``Chem.Mol(pickle)``, no sanitising: ~10x cheaper than
    parsing) instead of parsing the SMILES again, and get the same atoms in the same order."""
    mol, reason = parse_smiles(raw)
    if mol is None:
        return "", reason, None
    stored = str(raw)
    if canonicalize:
        stored = Chem.MolToSmiles(mol)
        with rdBase.BlockLogs():
            mol = Chem.MolFromSmiles(stored)
        if mol is None:
            return "", NOT_ROUND_TRIPPING, None
    try:  # the featuriser's own rule, so every kept row featurises (and the vocabs count only corpus molecules)
        atom = mol.GetAtomWithIdx  # not mol.GetAtoms(): RDKit's Python sequence wrapper costs more than the calls
        formal_charge_slot(np.array([atom(i).GetFormalCharge() for i in range(mol.GetNumAtoms())]))
    except ValueError as error:
        return "", f"{UNFEATURIZABLE}: {error}", None
    return stored, None, mol.ToBinary()


def clean_smiles(raw: Sequence[object], canonicalize: bool = True) -> tuple[list[str], list[str | None]]:
    """Per row: the SMILES to store ('' when rejected) and the reason it was rejected (None when kept)."""
    stored, reasons, _ = clean_smiles_mols(raw, canonicalize)
    return stored, reasons


def clean_smiles_mols(raw: Sequence[object], canonicalize: bool = True) -> tuple[list[str], list[str | None],
                                                                                list[bytes | None]]:
    """:func:`clean_smiles` plus each kept molecule's pickle (:func:`clean_one_mol`; None when rejected)."""
    cleaned = [clean_one_mol(r, canonicalize) for r in raw]
    return [s for s, _, _ in cleaned], [r for _, r, _ in cleaned], [m for _, _, m in cleaned]


def duplicate_keys(stored: Sequence[str], canonicalize: bool, mols: Sequence[bytes] | None = None) -> list[str]:
    """What makes two kept rows the same molecule: the canonical SMILES (the stored text itself when the corpus
    stores canonical SMILES; else computed here, from the pickles when given)."""
    if canonicalize:
        return list(stored)
    return [Chem.MolToSmiles(m) for m in parsed(stored, mols)]


def first_occurrences(keys: Sequence[str]) -> list[bool]:
    """Per key: True when no earlier key is the same (the copy a deduplicated corpus keeps)."""
    seen: set[str] = set()
    first = []
    for key in keys:
        first.append(key not in seen)
        seen.add(key)
    return first


def count_vocab_tokens(smiles: Sequence[str], mols: Sequence[bytes] | None = None) -> dict[str, Counter]:
    """Atom contexts, bond contexts and SMILES tokens of cleaned SMILES: {"atom": Counter, "bond": ..., "smiles": ...}
    (``mols``: their pickles, see :func:`kermt.data.corpus.parsed`)."""
    counts = {kind: Counter() for kind in VOCAB_KINDS}
    for smi, mol in zip(smiles, parsed(smiles, mols)):
        atoms, bonds = molecule_contexts(mol)
        counts["atom"].update(atoms)
        counts["bond"].update(bonds)
        counts["smiles"].update(_TOKENIZER.tokenize(smi))
    return counts


Vocabs = tuple[ContextVocab, ContextVocab, SmilesVocab]
NO_VOCABS: tuple[None, None, None] = (None, None, None)


def vocabs_from_counts(counts: Mapping[str, Mapping[str, int]], settings: VocabSettings,
                       given: Sequence[ContextVocab | SmilesVocab | None] = NO_VOCABS) -> Vocabs:
    """Atom, bond and SMILES vocabs, ordered and cut exactly as upstream's build_vocab.py; a ``given`` vocab (e.g.
    a released model's, see :func:`load_vocab`) is used instead of the one built from the counts."""
    built = (
        ContextVocab.from_counts(counts["atom"], "atom", settings.max_size, settings.min_freq),
        ContextVocab.from_counts(counts["bond"], "bond", settings.max_size, settings.min_freq),
        SmilesVocab.from_counts(counts["smiles"], max_size=settings.smiles_max_size,
                                min_freq=settings.smiles_min_freq),
    )
    return tuple(b if g is None else g for b, g in zip(built, given))


def load_vocab(path: str, kind: str) -> ContextVocab | SmilesVocab:
    """A vocab file given by the user: upstream's JSON or pickled ``MolVocab`` / ``SMILESVocab`` (read as data,
    no upstream code runs), or our SMILES JSON. UserError naming the file when it is unreadable or of another kind."""
    with user_input(f"--{kind}_vocab_path {path}"):
        vocab = SmilesVocab.load(path) if kind == "smiles" else ContextVocab.load(path)
        if kind != "smiles" and vocab.kind != kind:
            raise ValueError(f"it holds {vocab.kind} contexts, not {kind} contexts")
    return vocab


INVALID_COLUMNS = ("source", "row", "smiles", "reason")


def invalid_report(rows: Iterable[tuple[str, int, str, str]]) -> str:
    """invalid.csv text: source file, 0-based data row, the input text, why it was rejected."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(INVALID_COLUMNS)
    writer.writerows(rows)
    return out.getvalue()


def check_not_empty(n_rows: int, n_valid: int, sources: Sequence[str], reasons: Counter) -> None:
    """UserError before anything is written when the inputs hold no molecule to pretrain on."""
    if n_rows == 0:
        raise UserError(f"no data rows in {', '.join(sources)}: the corpus would be empty")
    if n_valid == 0:
        kinds = Counter()
        for reason, count in reasons.items():
            kinds[reason_kind(reason)] += count
        common = ", ".join(f"{reason} ({count})" for reason, count in kinds.most_common(3))
        raise UserError(f"none of the {n_rows} rows of {', '.join(sources)} holds a valid SMILES ({common}); "
                        "check --smiles_column")


def prepare_corpus(sources: Mapping[str, Sequence[object]], corpus_dir: str, settings: VocabSettings = VocabSettings(),
                   rows_per_shard: int = 50_000,
                   given: Sequence[ContextVocab | SmilesVocab | None] = NO_VOCABS) -> CorpusManifest:
    """Build a corpus in this process from {source name: raw SMILES}; the manifest is written last."""
    cleaned = {name: clean_smiles_mols(raw, settings.canonicalize) for name, raw in sources.items()}
    valid = [(name, s, m) for name, (stored, reasons, mols) in cleaned.items()
             for s, r, m in zip(stored, reasons, mols) if r is None]
    rejected = [(name, row, str(sources[name][row]), r) for name, (_, reasons, _) in cleaned.items()
                for row, r in enumerate(reasons) if r is not None]
    check_not_empty(sum(len(v) for v in sources.values()), len(valid), list(sources), Counter(r[3] for r in rejected))
    first = (first_occurrences(duplicate_keys([s for _, s, _ in valid], settings.canonicalize,
                                              [m for _, _, m in valid])) if settings.deduplicate
             else [True] * len(valid))
    kept = [s for (_, s, _), keep in zip(valid, first) if keep]
    kept_mols = [m for (_, _, m), keep in zip(valid, first) if keep]
    duplicates = Counter(name for (name, _, _), keep in zip(valid, first) if not keep)
    atom, bond, smiles_vocab = vocabs_from_counts(count_vocab_tokens(kept, kept_mols), settings, given)
    shards, max_tokens = [], 0
    for index, start in enumerate(range(0, len(kept), rows_per_shard)):
        stop = start + rows_per_shard
        arrays = corpus_rows(kept[start:stop], atom, bond, smiles_vocab, kept_mols[start:stop])
        write_shard(join(corpus_dir, shard_path(index)), arrays)
        shards.append(ShardInfo(shard_path(index), len(arrays)))
        max_tokens = max(max_tokens, int(arrays.token_lengths.max()))
    write_vocabs(corpus_dir, atom, bond, smiles_vocab)
    write_text(join(corpus_dir, INVALID_FILE), invalid_report(rejected))
    inputs = tuple(InputInfo(name, len(raw), sum(r is not None for r in cleaned[name][1]), duplicates[name])
                   for name, raw in sources.items())
    manifest = manifest_for(shards, inputs, max_tokens, (atom, bond, smiles_vocab), settings, rows_per_shard)
    write_manifest(corpus_dir, manifest)
    return manifest


def manifest_for(shards: Sequence[ShardInfo], inputs: Sequence[InputInfo], max_token_length: int,
                 vocabs: Vocabs, settings: VocabSettings,
                 rows_per_shard: int, **extra_settings: object) -> CorpusManifest:
    return CorpusManifest(
        n_molecules=sum(s.rows for s in shards),
        shards=tuple(shards),
        inputs=tuple(inputs),
        n_invalid=sum(i.invalid for i in inputs),
        n_duplicates=sum(i.duplicates for i in inputs),
        max_token_length=max_token_length,
        atom_vocab_size=len(vocabs[0]),
        bond_vocab_size=len(vocabs[1]),
        smiles_vocab_size=len(vocabs[2]),
        settings={**settings.__dict__, "rows_per_shard": rows_per_shard, **extra_settings},
    )


__all__ = ["INVALID_COLUMNS", "NOT_ROUND_TRIPPING", "VocabSettings", "check_not_empty", "clean_one", "clean_one_mol",
           "clean_smiles", "clean_smiles_mols", "count_vocab_tokens", "duplicate_keys", "first_occurrences",
           "invalid_report", "load_vocab", "manifest_for", "prepare_corpus", "vocabs_from_counts"]
