"""The summary line of `kermt reconstruct`: validity, uniqueness and novelty, against the pretraining corpus that
the record beside the checkpoint names, or against the input's molecules. Real RDKit, real corpus files."""

from __future__ import annotations

import json

import pyarrow as pa

from kermt.data.corpus_prep import prepare_corpus
from kermt.pretrain.export import save_corpus_record
from kermt.pretrain.reconstruct import score
from ray_app.screening.reconstruct import SAMPLE_COLUMNS, SAMPLE_TYPES, SCORED_FIELDS, Quality, training_reference

# input molecule -> what was generated from it (2 samples each): 6 strings, 5 parse, 3 distinct molecules
GENERATED = {"CCO": ["OCC", "C1CC"], "CCN": ["NCC", "c1ccccc1"], "CCC": ["CCC", "C(O)C"]}


def _rows() -> pa.Table:
    """Output rows as the stage writes them (plus one invalid input row, which generates nothing)."""
    rows = [(source, score(source, text)) for source, texts in GENERATED.items() for text in texts]
    columns = {"canonical_smiles": [s for s, _ in rows] + [None], "valid": [True] * len(rows) + [False]}
    for name, kind in zip(SAMPLE_COLUMNS, SAMPLE_TYPES):
        columns[name] = pa.array([getattr(s, SCORED_FIELDS.get(name, name)) for _, s in rows] + [None], kind)
    return pa.table(columns)


def _quality() -> Quality:
    quality, table = Quality(), _rows()
    quality.add(table.slice(0, 3))  # two blocks
    quality.add(table.slice(3))
    return quality


def test_without_a_corpus_record_novelty_is_against_the_inputs(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"")
    line = _quality().line(tmp_path / "model.pt")
    # valid: OCC=CCO, NCC=CCN, benzene, CCC, C(O)C=CCO -> distinct CCO, CCN, c1ccccc1, CCC = 4; benzene is no input
    assert line.startswith("6 SMILES generated: validity 83.3 % (5 of 6 parse), uniqueness 80.0 % (4 distinct "
                           "molecules), novelty 25.0 % (1 not in the input's molecules); 50.0 % are the input molecule")


def test_novelty_against_the_pretraining_corpus_named_beside_the_checkpoint(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    prepare_corpus({"train": ["OCC", "C1=CC=CC=C1", "CCCC"]}, str(corpus))  # ethanol, benzene, butane
    save_corpus_record(tmp_path, str(corpus), 3)
    keys, name = training_reference(tmp_path / "model.pt")
    assert len(keys) == 3 and name == f"the pretraining corpus {corpus} (3 molecules)"
    line = _quality().line(tmp_path / "model.pt")
    assert "uniqueness 80.0 % (4 distinct molecules), novelty 50.0 % (2 not in the pretraining corpus" in line

    (tmp_path / "pretrain_corpus.json").write_text(json.dumps({"corpus": str(tmp_path / "gone")}))
    assert training_reference(tmp_path / "model.pt") == (None, "the input's molecules")
    assert f"the pretraining corpus {tmp_path / 'gone'} cannot be read" in capsys.readouterr().err
