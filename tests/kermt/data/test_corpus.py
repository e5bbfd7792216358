"""The pretraining corpus format: rows equal the library's own featurisation and labels, shards round-trip, a
directory without a manifest is refused, the graph store stays under 1 KB per drug-like molecule."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from rdkit import Chem

from kermt.chem.vocab_context import ContextVocab
from kermt.chem.vocab_labels import all_vocab_labels
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.data.collate import collate_graphs
from kermt.data.corpus import (
    MANIFEST_FILE,
    CorpusArrays,
    corpus_rows,
    open_corpus,
    read_shard,
    write_shard,
)
from kermt.data.corpus_prep import VocabSettings, load_vocab, prepare_corpus
from kermt.data.featurize import featurize_smiles
from kermt.errors import UserError
from tests.conftest import DATA_DIR, FIXTURE_DIR

FIXTURE_SMILES = [str(s) for s in np.load(FIXTURE_DIR / "graph.npz")["smiles"]]
PRETRAIN_ORACLE = np.load(DATA_DIR / "kermt_upstream_pretrain" / "pretrain_step.npz")
VOCAB_INPUT = DATA_DIR / "kermt_upstream_vocab" / "smis_only.csv"
SAMPLE = DATA_DIR.parent.parent / "data" / "sample" / "admet_demo.csv"


@pytest.fixture(scope="module")
def vocabs() -> tuple[ContextVocab, ContextVocab, SmilesVocab]:
    return (ContextVocab.load(FIXTURE_DIR / "tiny_atom_vocab.json"),
            ContextVocab.load(FIXTURE_DIR / "tiny_bond_vocab.json"),
            SmilesVocab.load(FIXTURE_DIR / "tiny_smiles_vocab.pkl"))


@pytest.fixture(scope="module")
def rows(vocabs) -> CorpusArrays:
    return corpus_rows(FIXTURE_SMILES, *vocabs)


def _sample_smiles(n: int) -> list[str]:
    with SAMPLE.open() as handle:
        return [row["smiles"] for _, row in zip(range(n), csv.DictReader(handle))]


def _per_molecule(values: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [values[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]


def test_labels_equal_all_vocab_labels_and_upstream(rows, vocabs) -> None:
    expected = all_vocab_labels(FIXTURE_SMILES, vocabs[0], vocabs[1])
    np.testing.assert_array_equal(rows.atom_labels, expected.atom[1:])  # the corpus has no padding row
    np.testing.assert_array_equal(rows.bond_labels, expected.bond[1:])
    outputs = np.load(FIXTURE_DIR / "outputs.npz")
    np.testing.assert_array_equal(rows.atom_labels, outputs["pt_av_labels_all"][1:])
    np.testing.assert_array_equal(rows.bond_labels, outputs["pt_bv_labels_all"][1:])


def test_fg_labels_and_tokens_equal_upstream(rows, vocabs) -> None:
    assert list(PRETRAIN_ORACLE["smiles"]) == FIXTURE_SMILES
    np.testing.assert_array_equal(rows.fg_labels, PRETRAIN_ORACLE["fg_labels"])
    assert rows.fg_labels.dtype == np.uint8
    tokens = PRETRAIN_ORACLE["cmim::tokens"]  # upstream's padded <start> ... <end> ids of these SMILES
    assert _per_molecule(rows.tokens, rows.token_offsets) == [[t for t in row if t != 0] for row in tokens.tolist()]
    assert _per_molecule(rows.tokens, rows.token_offsets) == [vocabs[2].encode(s) for s in FIXTURE_SMILES]


def test_graphs_collate_to_what_featurize_smiles_gives(rows) -> None:
    expected = collate_graphs(featurize_smiles(FIXTURE_SMILES).graphs)
    got = collate_graphs(rows.graphs)
    for name in ("f_atoms", "f_bonds", "a2b", "b2a", "b2revb", "a_scope", "b_scope", "a2a"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


def test_shard_round_trip_and_take(rows, tmp_path) -> None:
    path = str(tmp_path / "part.parquet")
    write_shard(path, rows)
    back = read_shard(path)
    _assert_same(back, rows)
    picked = [5, 0, 25, 5]
    _assert_same(back.take(picked), CorpusArrays.concat([rows.take([i]) for i in picked]))
    assert [p.name for p in tmp_path.iterdir()] == ["part.parquet"]  # no temporary file left behind


def _assert_same(a: CorpusArrays, b: CorpusArrays) -> None:
    assert a.smiles == b.smiles
    for name in ("fg_labels", "tokens", "token_offsets", "atom_labels", "atom_offsets", "bond_labels", "bond_offsets"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        assert getattr(a, name).dtype == getattr(b, name).dtype, name
    for name, value in a.graphs.to_arrays().items():
        np.testing.assert_array_equal(value, b.graphs.to_arrays()[name], err_msg=name)


def test_prepared_corpus_reproduces_upstream_vocabs_and_reads_back(tmp_path, vocabs) -> None:
    # The tiny fixture vocabs are build_vocab.py's output on smis_only.csv + the fixture SMILES, as given.
    raw = VOCAB_INPUT.read_text().splitlines()[1:] + FIXTURE_SMILES + ["not a smiles", ""]
    corpus_dir = str(tmp_path / "corpus")
    # upstream keeps duplicates, and this input holds one molecule twice
    manifest = prepare_corpus({"in.csv": raw}, corpus_dir, VocabSettings(canonicalize=False, deduplicate=False),
                              rows_per_shard=50)
    corpus = open_corpus(corpus_dir)
    for got, expected in zip((corpus.atom_vocab, corpus.bond_vocab, corpus.smiles_vocab), vocabs):
        assert got.itos == expected.itos and dict(got.freqs) == dict(expected.freqs)
    assert manifest.n_molecules == 126 and [s.rows for s in manifest.shards] == [50, 50, 26]
    assert (manifest.n_invalid, manifest.inputs[0].rows) == (2, 128)
    _assert_same(corpus.load(shards=[2]), corpus_rows(FIXTURE_SMILES, *vocabs))
    with open(tmp_path / "corpus" / "invalid.csv") as handle:
        assert list(csv.reader(handle))[1:] == [
            ["in.csv", "126", "not a smiles",
             "unparsable: syntax error while parsing: not; check for mistakes around position 3"],
            ["in.csv", "127", "", "empty"]]
    upstream_json = json.loads((tmp_path / "corpus" / "atom_vocab.json").read_text())
    assert upstream_json == json.loads((FIXTURE_DIR / "tiny_atom_vocab.json").read_text())


def test_canonical_corpus_vocabs_count_the_stored_smiles(tmp_path) -> None:
    raw = FIXTURE_SMILES + _sample_smiles(40)
    prepare_corpus({"s.csv": raw}, str(tmp_path), rows_per_shard=1000)
    corpus = open_corpus(str(tmp_path))
    stored = list(corpus.load().smiles)
    assert stored == [Chem.MolToSmiles(Chem.MolFromSmiles(s)) for s in raw] != raw
    assert corpus.atom_vocab.itos == ContextVocab.build(stored, "atom").itos
    assert corpus.bond_vocab.itos == ContextVocab.build(stored, "bond").itos
    assert corpus.smiles_vocab.itos == SmilesVocab.build(stored).itos


def test_directory_without_manifest_is_refused(tmp_path) -> None:
    prepare_corpus({"a.csv": FIXTURE_SMILES}, str(tmp_path))
    (tmp_path / MANIFEST_FILE).unlink()  # e.g. a run killed before its last write
    with pytest.raises(UserError, match=r"not a complete corpus.*kermt corpus"):
        open_corpus(str(tmp_path))
    with pytest.raises(UserError, match="does not exist"):
        open_corpus(str(tmp_path / "nowhere"))


@pytest.mark.parametrize("raw, message", [([], "no data rows"), (["xyz", "", "[H][H]"], "none of the 3 rows")])
def test_empty_or_all_invalid_input_is_refused_before_writing(tmp_path, raw, message) -> None:
    with pytest.raises(UserError, match=message):
        prepare_corpus({"a.csv": raw}, str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()


def test_graph_store_is_under_1kb_per_drug_like_molecule(vocabs) -> None:
    smiles = _sample_smiles(500)
    rows = corpus_rows(smiles, *vocabs)
    graph_bytes = rows.graphs.nbytes / len(rows)
    label_bytes = (rows.fg_labels.nbytes + rows.tokens.nbytes + rows.atom_labels.nbytes
                   + rows.bond_labels.nbytes) / len(rows)
    print(f"graph {graph_bytes:.0f} B/molecule, labels and tokens {label_bytes:.0f} B/molecule")
    assert graph_bytes <= 1024


def test_corpus_at_a_filesystem_uri(tmp_path, vocabs) -> None:
    uri = f"file://{tmp_path}/corpus"
    prepare_corpus({"a.csv": FIXTURE_SMILES}, uri, VocabSettings(canonicalize=False))
    corpus = open_corpus(uri)
    assert corpus.path == uri and len(corpus) == 26
    _assert_same(corpus.load(), corpus_rows(FIXTURE_SMILES, corpus.atom_vocab, corpus.bond_vocab, corpus.smiles_vocab))


def test_given_vocabs_replace_the_built_ones(tmp_path, vocabs) -> None:
    given = (load_vocab(str(FIXTURE_DIR / "tiny_atom_vocab.json"), "atom"),
             load_vocab(str(FIXTURE_DIR / "tiny_bond_vocab.json"), "bond"),
             load_vocab(str(FIXTURE_DIR / "tiny_smiles_vocab.pkl"), "smiles"))  # upstream's pickle, read as data
    smiles = _sample_smiles(30)
    prepare_corpus({"a.csv": smiles}, str(tmp_path), given=given)
    corpus = open_corpus(str(tmp_path))
    assert (corpus.atom_vocab, corpus.bond_vocab, corpus.smiles_vocab) == given == vocabs
    expected = all_vocab_labels(list(corpus.load().smiles), *vocabs[:2])
    np.testing.assert_array_equal(corpus.load().atom_labels, expected.atom[1:])
    np.testing.assert_array_equal(corpus.load().bond_labels, expected.bond[1:])


def test_a_given_vocab_of_the_wrong_kind_or_missing_is_a_user_error(tmp_path) -> None:
    with pytest.raises(UserError, match="--atom_vocab_path .*tiny_bond_vocab.json: it holds bond contexts"):
        load_vocab(str(FIXTURE_DIR / "tiny_bond_vocab.json"), "atom")
    with pytest.raises(UserError, match="--smiles_vocab_path .*none.pkl"):
        load_vocab(str(tmp_path / "none.pkl"), "smiles")
