"""Bad `kermt pretrain` input: one-line errors (exit status 2) from the checks that run before Ray starts."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from kermt.data.corpus_prep import prepare_corpus
from ray_app.cli import main as kermt
from tests.conftest import FIXTURE_DIR


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    with open(FIXTURE_DIR / "smiles.csv", newline="") as f:
        smiles = [row["smiles"] for row in csv.DictReader(f)]
    path = tmp_path_factory.mktemp("corpus") / "corpus"
    prepare_corpus({"fixture": smiles}, str(path))
    return path


def _error(capsys, *argv: str) -> str:
    assert kermt(["pretrain", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kermt pretrain: error: "), lines
    return lines[0]


def test_corpus_without_manifest(corpus, tmp_path, capsys):
    half_written = tmp_path / "half"
    shutil.copytree(corpus, half_written, ignore=shutil.ignore_patterns("manifest.json"))
    message = _error(capsys, "--data_path", str(half_written))
    assert "is not a complete corpus (no manifest.json)" in message and "kermt corpus" in message


def test_vocab_that_is_not_the_corpus_vocab(corpus, capsys):
    message = _error(capsys, "--data_path", str(corpus), "--atom_vocab_path", str(FIXTURE_DIR / "tiny_atom_vocab.json"))
    assert "tiny_atom_vocab.json: differs from the atom vocabulary of the corpus" in message


def test_continue_from_a_finetuned_checkpoint(corpus, capsys):
    message = _error(capsys, "--data_path", str(corpus), "--continue_from", str(FIXTURE_DIR / "ckpt_ft_reg.pt"))
    assert "a finetuned checkpoint cannot continue as --pretrain_mode vocab" in message


def test_continue_from_a_vocab_checkpoint_as_cmim(corpus, capsys):
    message = _error(capsys, "--data_path", str(corpus), "--pretrain_mode", "cmim", "--continue_from",
                     str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"))
    assert "a vocab checkpoint cannot continue as --pretrain_mode cmim" in message


def test_continue_from_heads_of_another_vocabulary(corpus, capsys):
    message = _error(capsys, "--data_path", str(corpus), "--continue_from", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"))
    assert "its heads have atom_vocab_size=126 but the corpus's vocabulary has" in message
