"""Duplicate molecules in `kermt corpus`: later copies (same canonical SMILES, any spelling) are dropped and counted,
also when they lie in other files and other Ray Data blocks than the first copy; --keep_duplicates keeps them."""

from __future__ import annotations

import json

import pytest

from kermt.chem.vocab_context import ContextVocab
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.data.corpus import open_corpus
from kermt.data.corpus_prep import VocabSettings, prepare_corpus
from ray_app.cli import main
from ray_app.pretrain.corpus import build_corpus

# ethanol three times (OCC, CCO, C(O)C), benzene twice (aromatic, Kekulé), ethylamine twice (same text)
FIRST = ["OCC", "c1ccccc1", "CCN", "CC(=O)O", "CCO", "not_a_smiles"]
SECOND = ["C(O)C", "C1=CC=CC=C1", "CCCC", "CCN"]
KEPT = ["CCO", "c1ccccc1", "CCN", "CC(=O)O", "CCCC"]  # canonical, first copies in input order
KEPT_AS_WRITTEN = ["OCC", "c1ccccc1", "CCN", "CC(=O)O", "CCCC"]  # --no-canonicalize stores the first copy's text


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("duplicates")
    (root / "first.csv").write_text("smiles\n" + "".join(f"{s}\n" for s in FIRST))
    (root / "second.smi").write_text("".join(f"{s}\tm{i}\n" for i, s in enumerate(SECOND)))
    return {str(root / "first.csv"): FIRST, str(root / "second.smi"): SECOND}


@pytest.mark.parametrize("canonicalize, kept", [(True, KEPT), (False, KEPT_AS_WRITTEN)])
def test_copies_in_other_blocks_and_files_are_dropped_as_in_process(ray_cluster, inputs, tmp_path, canonicalize,
                                                                    kept) -> None:
    settings = VocabSettings(canonicalize=canonicalize)
    # 2 rows per task: the copies of ethanol are in blocks 1, 3 and 4 (2 files), benzene's in blocks 1 and 4
    manifest = build_corpus(list(inputs), ["smiles"] * 2, str(tmp_path / "ray"), settings, rows_per_shard=3,
                            rows_per_task=2)
    reference = prepare_corpus(inputs, str(tmp_path / "local"), settings, rows_per_shard=3)
    corpus = open_corpus(str(tmp_path / "ray"))
    assert list(corpus.load().smiles) == kept == list(open_corpus(str(tmp_path / "local")).load().smiles)
    assert (manifest.n_molecules, manifest.n_invalid, manifest.n_duplicates) == (5, 1, 4)
    assert [(i.rows, i.invalid, i.duplicates) for i in manifest.inputs] == [(6, 1, 1), (4, 0, 3)]
    assert manifest.inputs == reference.inputs and manifest.n_duplicates == reference.n_duplicates
    assert manifest.settings["deduplicate"] is True
    assert corpus.atom_vocab.freqs == ContextVocab.build(kept, "atom").freqs  # the vocabs count each molecule once
    assert corpus.smiles_vocab.freqs == SmilesVocab.build(kept).freqs


def test_the_summary_counts_the_dropped_copies_and_keep_duplicates_keeps_them(ray_cluster, inputs, tmp_path,
                                                                               capsys) -> None:
    common = ["corpus", "--data_path", *inputs, "--rows_per_task", "2"]
    assert main([*common, "--save_dir", str(tmp_path / "dedup")]) == 0
    assert "5 molecules in 1 shard(s), 1 invalid row(s) (see invalid.csv), 4 duplicate molecule(s) dropped;" in \
        capsys.readouterr().out
    assert main([*common, "--save_dir", str(tmp_path / "all"), "--keep_duplicates"]) == 0
    assert "9 molecules in 1 shard(s), 1 invalid row(s) (see invalid.csv), duplicates kept (--keep_duplicates);" in \
        capsys.readouterr().out
    manifest = json.loads((tmp_path / "all" / "manifest.json").read_text())
    assert (manifest["n_duplicates"], manifest["settings"]["deduplicate"]) == (0, False)
    assert len(open_corpus(str(tmp_path / "all")).load()) == 9
