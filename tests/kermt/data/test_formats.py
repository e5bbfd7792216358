"""Input formats as libraries are distributed: compressed CSV, SMILES files, Parquet; unknown names refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from kermt.data.formats import InputFormat, SmiLayout, input_format
from kermt.data.tables import load_molecule_table, read_table
from kermt.errors import UserError
from tests.conftest import FIXTURE_DIR


def _compressed(path: Path, data: bytes, codec: str) -> Path:
    with pa.output_stream(str(path), compression=codec) as out:
        out.write(data)
    return path


def write_formats(frame: pd.DataFrame, directory: Path) -> dict[str, Path]:
    """``frame`` (columns smiles, name, then labels) in every accepted format; SMILES files hold smiles + name.

    Keys: csv, csv.gz, csv.zst, csv.bz2, parquet, smi (space separated, header), smi.gz (tab separated, no header),
    cxsmiles (tab separated, header)."""
    text = frame.to_csv(index=False).encode()
    paths = {"csv": directory / "lib.csv", "parquet": directory / "lib.parquet"}
    paths["csv"].write_bytes(text)
    frame.astype(str).to_parquet(paths["parquet"])
    for suffix, codec in ((".gz", "gzip"), (".zst", "zstd"), (".bz2", "bz2")):
        paths[f"csv{suffix}"] = _compressed(directory / f"lib.csv{suffix}", text, codec)
    pairs = list(zip(frame["smiles"], frame["name"]))
    paths["smi"] = directory / "lib.smi"
    paths["smi"].write_text("SMILES Name\n" + "".join(f"{s} {n}\n" for s, n in pairs))
    tab_lines = "".join(f"{s}\t{n}\n" for s, n in pairs)
    paths["smi.gz"] = _compressed(directory / "lib.smi.gz", tab_lines.encode(), "gzip")
    paths["cxsmiles"] = directory / "lib.cxsmiles"
    paths["cxsmiles"].write_text("smiles\tname\n" + tab_lines)
    return paths


def fixture_frame() -> pd.DataFrame:
    """The fixture molecules (26, with two labels) and a name with a space in it for every row."""
    frame = pd.read_csv(FIXTURE_DIR / "smiles.csv", dtype=str, keep_default_na=False)
    frame.insert(1, "name", [f"cpd {i:03d}" for i in range(len(frame))])
    return frame


@pytest.mark.parametrize("name,expected", [
    ("a.csv", InputFormat("csv")), ("a.CSV.GZ", InputFormat("csv", "gzip")), ("a.csv.zst", InputFormat("csv", "zstd")),
    ("a.csv.bz2", InputFormat("csv", "bz2")), ("s3://b/a.parquet?v=1", InputFormat("parquet")),
    ("a.pq", InputFormat("parquet")), ("lib.v2.smi", InputFormat("smi")),
    ("a.cxsmiles.zst", InputFormat("smi", "zstd")),
])
def test_format_comes_from_the_name(name, expected):
    assert input_format(name) == expected


@pytest.mark.parametrize("name", ["lib.sdf", "lib.txt", "lib", "lib.gz", "lib.tsv.gz"])
def test_unknown_format_is_a_user_error_listing_the_accepted_ones(name):
    with pytest.raises(UserError, match=rf"{name}: unknown input format .*accepted: .csv, .smi or .cxsmiles"):
        input_format(name)


def test_smi_lines_tabs_spaces_header_cxsmiles_comments():
    spaces = SmiLayout.from_first_line("\ufeffSMILES  Compound ID\n")
    assert spaces == SmiLayout(tabs=False, header=True, columns=("SMILES", "Compound"))
    assert spaces.parse(["CCO  ethanol 96%\r\n", "\n", "# a comment\n", "c1ccccc1\n",
                         "C[C@H](F)Cl |&1:1| chiral one\n"]) == (
        ["CCO", "c1ccccc1", "C[C@H](F)Cl |&1:1|"], ["ethanol 96%", "", "chiral one"])
    tabs = SmiLayout.from_first_line("CCO\tethanol\textra\n")  # no header: default names, first line is data
    assert tabs == SmiLayout(tabs=True, header=False, columns=("smiles", "name"))
    assert tabs.parse(["CCO\tethanol 2\textra\n", "C[C@H](F)Cl |&1:1|\tx\n", "CC\n"]) == (
        ["CCO", "C[C@H](F)Cl |&1:1|", "CC"], ["ethanol 2", "x", ""])
    assert SmiLayout.from_first_line("cxsmiles\n").columns == ("cxsmiles", "name")


def test_every_format_reads_the_same_rows(tmp_path):
    frame = fixture_frame()
    paths = write_formats(frame, tmp_path)
    for key in ("csv.gz", "csv.zst", "csv.bz2", "parquet"):
        pd.testing.assert_frame_equal(read_table(paths[key]), frame, check_dtype=False)
    for key in ("smi", "smi.gz", "cxsmiles"):
        table = read_table(paths[key])
        assert table.iloc[:, 0].tolist() == frame["smiles"].tolist()
        assert table.iloc[:, 1].tolist() == frame["name"].tolist()
    assert read_table(paths["smi.gz"], max_rows=3).iloc[:, 1].tolist() == ["cpd 000", "cpd 001", "cpd 002"]
    labelled = load_molecule_table(paths["csv.zst"], keep_columns=["name"])
    np.testing.assert_array_equal(labelled.targets, load_molecule_table(FIXTURE_DIR / "smiles.csv").targets)


def test_smiles_file_has_no_labels_and_bad_files_are_user_errors(tmp_path):
    paths = write_formats(fixture_frame(), tmp_path)
    blinded = load_molecule_table(paths["smi"], require_targets=False)
    assert blinded.target_names == [] and len(blinded) == 26
    with pytest.raises(UserError, match="lib.smi: no target columns .a SMILES file holds no labels"):
        load_molecule_table(paths["smi"])
    with pytest.raises(UserError, match="data file not found: .*missing.csv.gz"):
        read_table(tmp_path / "missing.csv.gz")
    (tmp_path / "broken.csv.gz").write_bytes(b"not gzip at all")
    with pytest.raises(UserError, match=r"broken.csv.gz: cannot read it as CSV \(gzip-compressed\)"):
        read_table(tmp_path / "broken.csv.gz")
