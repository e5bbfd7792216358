"""`kermt reconstruct` end to end on the local Ray cluster with upstream's hybrid fixture checkpoint."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from rdkit import Chem

from kermt.checkpoint import read_checkpoint
from kermt.data.featurize import featurize_smiles
from kermt.nn.pretrain.generate import SamplingConfig
from kermt.pretrain.reconstruct import ReconstructSettings, Reconstructor, read_smiles_vocab, score
from ray_app.screening.commands import main_reconstruct
from tests.conftest import FIXTURE_DIR

SMILES = pd.read_csv(FIXTURE_DIR / "smiles.csv").iloc[:, 0].tolist()  # 26 molecules
INVALID = {3: "not_a_smiles", 11: "", 20: "C1CC"}  # inserted before these rows
CHECKPOINT = FIXTURE_DIR / "ckpt_pretrain_hybrid.pt"
BATCH, SAMPLES = 4, 2
FLAGS = ["--checkpoint_path", str(CHECKPOINT), "--num_samples", str(SAMPLES), "--temperature", "1.0", "--top_k", "12",
         "--max_len", "32", "--seed", "3", "--batch_size", str(BATCH), "--id_columns", "compound"]
COLUMNS = ["smiles", "canonical_smiles", "sample", "generated_smiles", "generated_canonical_smiles", "generated_valid",
           "exact_match", "edit_distance", "compound", "valid", "error"]


def _input(path) -> pd.DataFrame:
    smiles = list(SMILES)
    for row, text in sorted(INVALID.items()):
        smiles.insert(row, text)
    frame = pd.DataFrame({"smiles": smiles, "compound": [f"cpd-{i:02d}" for i in range(len(smiles))]})
    frame.to_csv(path, index=False)
    return frame


def _text(column: pd.Series) -> list[str]:
    """Values as CSV text (null and "" alike, booleans in lower case)."""
    return ["" if pd.isna(v) else str(v).lower() for v in column]


def _canonical(smiles: str) -> str:
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    return Chem.MolToSmiles(mol) if mol is not None else smiles


def _in_process(smiles: list[str]) -> list[list[str] | None]:
    """What one process generates with the same batches (valid rows among each run of BATCH input rows) and row
    keys, one torch thread as in the 1-CPU actors."""
    checkpoint = read_checkpoint(CHECKPOINT)
    model = Reconstructor(checkpoint, read_smiles_vocab(FIXTURE_DIR / "tiny_smiles_vocab.pkl", checkpoint))
    settings = ReconstructSettings(SamplingConfig(1.0, 12, None, 32), num_samples=SAMPLES, seed=3)
    molecules = featurize_smiles([_canonical(s) for s in smiles])  # upstream encodes the canonical SMILES
    out: list[list[str] | None] = [None] * len(smiles)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for start in range(0, len(smiles), BATCH):
            rows = start + np.flatnonzero(molecules.valid[start:start + BATCH])
            for row, samples in zip(rows, model.reconstruct(molecules.select(rows), rows, settings)):
                out[row] = samples
    finally:
        torch.set_num_threads(threads)
    return out


def test_one_row_per_input_row_and_sample_in_order_for_any_concurrency(ray_cluster, tmp_path, capsys):
    data = _input(tmp_path / "in.csv")
    common = ["--data_path", str(tmp_path / "in.csv"), *FLAGS]
    assert main_reconstruct([*common, "--output_path", str(tmp_path / "a.parquet"), "--concurrency", "1"]) == 0
    summary = capsys.readouterr().err
    assert main_reconstruct([*common, "--output_path", str(tmp_path / "b.csv"), "--concurrency", "2"]) == 0
    one, two = pd.read_parquet(tmp_path / "a.parquet"), pd.read_csv(tmp_path / "b.csv")
    assert list(one.columns) == list(two.columns) == COLUMNS
    assert len(one) == len(data) * SAMPLES
    assert one["compound"].tolist() == np.repeat(data["compound"], SAMPLES).tolist()
    assert one["smiles"].fillna("").tolist() == np.repeat(data["smiles"].fillna(""), SAMPLES).tolist()
    assert one["sample"].tolist() == [1, 2] * len(data)
    for name in ("compound", "sample", "generated_smiles", "generated_valid", "exact_match", "valid"):
        assert _text(one[name]) == _text(two[name]), name  # 1 vs 2 actors, Parquet vs CSV

    invalid = ~one["valid"].to_numpy()
    assert one.loc[invalid, "compound"].tolist() == np.repeat([f"cpd-{i:02d}" for i in INVALID], SAMPLES).tolist()
    assert (one.loc[invalid, "error"] != "").all() and one.loc[invalid, "generated_smiles"].isna().all()
    assert (one.loc[~invalid, "error"] == "").all()

    expected = _in_process(data["smiles"].fillna("").tolist())
    flat = [s for samples in expected for s in (samples or [None] * SAMPLES)]
    assert [None if pd.isna(s) else s for s in one["generated_smiles"]] == flat
    for _, row in one[~invalid].iterrows():
        scored = score(row["canonical_smiles"], row["generated_smiles"])
        assert (row["generated_valid"], row["exact_match"]) == (scored.parses, scored.exact_match)
        assert (None if pd.isna(row["generated_canonical_smiles"]) else row["generated_canonical_smiles"]) == \
            scored.canonical
        assert pd.isna(row["edit_distance"]) if scored.edit_distance is None else \
            row["edit_distance"] == scored.edit_distance
    _assert_summary_counts(one[~invalid], summary)


def _assert_summary_counts(rows: pd.DataFrame, summary: str) -> None:
    """The summary's figures, counted from the output file (the fixture has no corpus record: novelty is against
    the input's molecules)."""
    valid = rows["generated_canonical_smiles"].dropna()
    unique = set(valid)
    novel = unique - set(rows["canonical_smiles"])
    assert f"({len(valid)} of {len(rows)} parse)" in summary
    assert f"uniqueness {100 * len(unique) / len(valid):.1f} % ({len(unique)} distinct molecules)" in summary
    assert f"novelty {100 * len(novel) / len(unique):.1f} % ({len(novel)} not in the input's molecules)" in summary


def test_vocab_mode_checkpoint_is_refused_before_ray_starts(tmp_path, capsys):
    code = main_reconstruct(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(tmp_path / "r.csv"),
                             "--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not (tmp_path / "r.csv").exists()
    assert err[-1] == (f"kermt reconstruct: error: reconstruct needs a cmim or hybrid checkpoint; "
                       f"{FIXTURE_DIR / 'ckpt_pretrain_vocab.pt'} is vocab")


def test_an_input_without_valid_molecules_writes_nothing(ray_cluster, tmp_path, capsys):
    # a file with no SMILES RDKit reads is refused before the stream (kermt.data.sniff); molecules it reads that the
    # run refuses (here: over --max_heavy_atoms) reach the stream's own message
    cases = {"empty.csv": ("smiles,id\n", "has no data rows"),
             "bad.csv": ("smiles,id\nCCO,1\n,2\n", "none of the 2 rows of")}
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        out = tmp_path / f"{name}.parquet"
        code = main_reconstruct(["--data_path", str(tmp_path / name), "--output_path", str(out),
                                 "--checkpoint_path", str(CHECKPOINT), "--max_heavy_atoms", "1"])
        assert code == 2 and message in capsys.readouterr().err
        assert not out.exists() and not list(tmp_path.glob(f".{out.name}*"))
