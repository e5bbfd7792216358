"""`kermt corpus` on a real local Ray cluster equals the in-process build: vocabs (and upstream's own vocab files),
shards, invalid-row report with row numbers; re-runs replace the corpus; bad input fails before writing."""

from __future__ import annotations

import csv
import gzip
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from rdkit import Chem

from kermt.chem.vocab_context import ContextVocab
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.data.corpus import open_corpus
from kermt.data.corpus_prep import VocabSettings, prepare_corpus
from kermt.errors import UserError
from ray_app.cli import main
from ray_app.pretrain.corpus import build_corpus, clean_inputs
from tests.conftest import DATA_DIR, FIXTURE_DIR

SAMPLE = DATA_DIR.parent.parent / "data" / "sample" / "admet_demo.csv"
FIXTURE_SMILES = [str(s) for s in np.load(FIXTURE_DIR / "graph.npz")["smiles"]]
BAD = ["not_a_smiles", "", "[H][H]", "C1CC"]  # unparsable, empty, no heavy atom, unclosed ring
# their reasons carry RDKit's own messages
NOT_A_SMILES = "unparsable: syntax error while parsing: not_a_smiles; check for mistakes around position 3"
UNCLOSED_RING = "unparsable: unclosed ring for input: 'C1CC'"


def _sample(n: int) -> list[str]:
    with SAMPLE.open() as handle:
        return [row["smiles"] for _, row in zip(range(n), csv.DictReader(handle))]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, list[str]]:
    """Four files in four formats: {path: raw SMILES in data-row order}."""
    root = tmp_path_factory.mktemp("inputs")
    sample, extra = _sample(200), FIXTURE_SMILES[:10] + BAD + FIXTURE_SMILES[10:]
    files = {str(root / "sample.csv"): sample[:120], str(root / "mixed.csv.gz"): extra,
             str(root / "more.smi"): sample[120:160] + ["C1CC"], str(root / "rest.parquet"): sample[160:]}
    paths = list(files)
    with open(paths[0], "w") as out:
        out.write("id,smiles\n" + "".join(f"m{i},{s}\n" for i, s in enumerate(files[paths[0]])))
    with gzip.open(paths[1], "wt") as out:
        out.write("smiles\n" + "".join(f'"{s}"\n' for s in files[paths[1]]))
    (root / "more.smi").write_text("SMILES\tname\n" + "".join(f"{s}\tn{i}\n" for i, s in enumerate(files[paths[2]])))
    pq.write_table(pa.table({"smiles": files[paths[3]]}), paths[3], row_group_size=13)
    return files


@pytest.fixture(scope="module")
def built(ray_cluster, inputs, tmp_path_factory):
    corpus_dir = str(tmp_path_factory.mktemp("ray") / "corpus")
    build_corpus(list(inputs), ["smiles"] * len(inputs), corpus_dir, VocabSettings(), rows_per_shard=96,
                 rows_per_task=40)
    return corpus_dir


def test_corpus_equals_the_in_process_build(built, inputs, tmp_path) -> None:
    reference_dir = str(tmp_path / "reference")
    prepare_corpus(inputs, reference_dir, rows_per_shard=96)
    ray_corpus, reference = open_corpus(built), open_corpus(reference_dir)
    for name in ("atom_vocab", "bond_vocab", "smiles_vocab"):
        got, expected = getattr(ray_corpus, name), getattr(reference, name)
        assert got.itos == expected.itos and dict(got.freqs) == dict(expected.freqs), name
    assert [s.rows for s in ray_corpus.manifest.shards] == [96, 96, 34] == [s.rows for s in reference.manifest.shards]
    got, expected = ray_corpus.load(), reference.load()
    assert got.smiles == expected.smiles
    for name in ("fg_labels", "tokens", "token_offsets", "atom_labels", "bond_labels", "bond_offsets"):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name), err_msg=name)
    for name, values in got.graphs.to_arrays().items():
        np.testing.assert_array_equal(values, expected.graphs.to_arrays()[name], err_msg=name)
    assert ray_corpus.manifest.max_token_length == int(got.token_lengths.max())


def test_one_file_is_cleaned_into_blocks_of_rows_per_task(ray_cluster, inputs) -> None:
    # Counting and featurising run one task per block: one block per file would leave all but one CPU idle.
    path = list(inputs)[0]  # 120 rows, read by one task
    cleaned = clean_inputs([path], ["smiles"], canonicalize=True, rows_per_task=40)
    blocks = [ray.get(ref) for ref in cleaned.to_arrow_refs()]
    assert [b.num_rows for b in blocks] == [40, 40, 40]
    assert [r for b in blocks for r in b.column("row").to_pylist()] == list(range(120))


def test_vocabs_count_exactly_the_kept_molecules(built) -> None:
    corpus = open_corpus(built)
    smiles = list(corpus.load().smiles)
    assert len(smiles) == 226 == corpus.manifest.n_molecules
    assert corpus.atom_vocab.itos == ContextVocab.build(smiles, "atom").itos
    assert corpus.bond_vocab.itos == ContextVocab.build(smiles, "bond").itos
    assert corpus.smiles_vocab.itos == SmilesVocab.build(smiles).itos


def test_invalid_rows_are_reported_with_source_and_row(built, inputs) -> None:
    paths = list(inputs)
    with open(f"{built}/invalid.csv") as handle:
        rows = list(csv.reader(handle))
    assert rows == [["source", "row", "smiles", "reason"],
                    [paths[1], "10", "not_a_smiles", NOT_A_SMILES], [paths[1], "11", "", "empty"],
                    [paths[1], "12", "[H][H]", "no heavy atoms"], [paths[1], "13", "C1CC", UNCLOSED_RING],
                    [paths[2], "40", "C1CC", UNCLOSED_RING]]
    manifest = json.loads(open(f"{built}/manifest.json").read())
    assert [(i["rows"], i["invalid"]) for i in manifest["inputs"]] == [(120, 0), (30, 4), (41, 1), (40, 0)]
    assert manifest["n_invalid"] == 5


def test_upstream_tiny_vocab_files_are_reproduced(ray_cluster, tmp_path) -> None:
    source = tmp_path / "vocab_input.csv"
    raw = (DATA_DIR / "kermt_upstream_vocab" / "smis_only.csv").read_text().splitlines()[1:] + FIXTURE_SMILES
    source.write_text("smiles\n" + "\n".join(raw) + "\n")
    assert main(["corpus", "--data_path", str(source), "--save_dir", str(tmp_path / "c"), "--no-canonicalize",
                 "--keep_duplicates"]) == 0  # as upstream, which counts the molecule this input holds twice
    for kind in ("atom", "bond"):
        got = json.loads((tmp_path / "c" / f"{kind}_vocab.json").read_text())
        assert got == json.loads((FIXTURE_DIR / f"tiny_{kind}_vocab.json").read_text())  # upstream's own file
    expected = SmilesVocab.load(FIXTURE_DIR / "tiny_smiles_vocab.pkl")
    got = open_corpus(str(tmp_path / "c")).smiles_vocab
    assert got.itos == expected.itos and dict(got.freqs) == dict(expected.freqs)


def test_rerun_replaces_the_corpus(ray_cluster, inputs, tmp_path) -> None:
    corpus_dir = tmp_path / "c"
    first, second = list(inputs)[0], list(inputs)[3]
    assert main(["corpus", "--data_path", first, "--save_dir", str(corpus_dir), "--rows_per_shard", "25",
                 "--smiles_column", "smiles"]) == 0
    assert len(open_corpus(str(corpus_dir)).manifest.shards) == 5
    assert main(["corpus", "--data_path", second, "--save_dir", str(corpus_dir), "--rows_per_shard", "25"]) == 0
    corpus = open_corpus(str(corpus_dir))
    assert sorted(p.name for p in (corpus_dir / "shards").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    assert list(corpus.load().smiles) == inputs[second]  # already canonical sample SMILES
    assert [i.path for i in corpus.manifest.inputs] == [second]


@pytest.mark.parametrize("content, message", [
    ("smiles\n", "no data rows"),
    ("smiles\nxyz\n\n[H][H]\n", "none of the 2 rows"),
])
def test_empty_or_invalid_input_is_one_line_error_before_writing(ray_cluster, tmp_path, capsys, content,
                                                                  message) -> None:
    source = tmp_path / "in.csv"
    source.write_text(content)
    assert main(["corpus", "--data_path", str(source), "--save_dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kermt corpus: error: ") and message in err[0]
    assert not (tmp_path / "c").exists()


def test_missing_file_or_column_is_refused_before_ray(tmp_path, capsys) -> None:
    assert main(["corpus", "--data_path", str(tmp_path / "none.csv"), "--save_dir", str(tmp_path / "c")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "a.csv").write_text("smile,x\nCCO,1\n")
    assert main(["corpus", "--data_path", str(tmp_path / "a.csv"), "--save_dir", str(tmp_path / "c"),
                 "--smiles_column", "smiles"]) == 2
    assert "did you mean 'smile'" in capsys.readouterr().err


def test_malformed_csv_is_one_line_error_naming_file_and_row(ray_cluster, tmp_path, capsys) -> None:
    source = tmp_path / "bad.csv"
    source.write_text("smiles,x\nCCO,1\nCCN,2,3\n")
    assert main(["corpus", "--data_path", str(source), "--save_dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{source}: cannot read it" in err[0] and "Expected 2 columns" in err[0], err
    assert not (tmp_path / "c").exists()


def test_given_vocab_files_label_the_corpus(ray_cluster, inputs, tmp_path) -> None:
    source = list(inputs)[3]
    vocab_flags = ["--atom_vocab_path", str(FIXTURE_DIR / "tiny_atom_vocab.json"),
                   "--bond_vocab_path", str(FIXTURE_DIR / "tiny_bond_vocab.json"),
                   "--smiles_vocab_path", str(FIXTURE_DIR / "tiny_smiles_vocab.pkl")]
    assert main(["corpus", "--data_path", source, "--save_dir", str(tmp_path / "c"), *vocab_flags]) == 0
    corpus = open_corpus(str(tmp_path / "c"))
    tiny_atom = ContextVocab.load(FIXTURE_DIR / "tiny_atom_vocab.json")
    assert (len(corpus.atom_vocab), len(corpus.bond_vocab), len(corpus.smiles_vocab)) == (126, 101, 41)
    assert corpus.atom_vocab == tiny_atom
    arrays = corpus.load()
    np.testing.assert_array_equal(arrays.atom_labels, np.concatenate(
        [tiny_atom.labels(Chem.MolFromSmiles(s)) for s in arrays.smiles]))
    assert corpus.manifest.settings["vocab_paths"]["smiles"].endswith("tiny_smiles_vocab.pkl")


def test_given_vocab_of_the_wrong_kind_is_refused_before_ray(tmp_path, capsys) -> None:
    (tmp_path / "a.csv").write_text("smiles\nCCO\n")
    assert main(["corpus", "--data_path", str(tmp_path / "a.csv"), "--save_dir", str(tmp_path / "c"),
                 "--atom_vocab_path", str(FIXTURE_DIR / "tiny_bond_vocab.json")]) == 2
    assert "it holds bond contexts, not atom contexts" in capsys.readouterr().err


def test_a_rewrite_that_fails_leaves_no_complete_corpus(ray_cluster, inputs, tmp_path) -> None:
    corpus_dir, source = tmp_path / "c", list(inputs)[3]
    assert main(["corpus", "--data_path", source, "--save_dir", str(corpus_dir)]) == 0
    shutil.rmtree(corpus_dir / "shards")
    (corpus_dir / "shards").write_text("in the way")  # the re-run cannot write its shards
    with pytest.raises(OSError):
        main(["corpus", "--data_path", source, "--save_dir", str(corpus_dir)])
    with pytest.raises(UserError, match="not a complete corpus"):
        open_corpus(str(corpus_dir))
