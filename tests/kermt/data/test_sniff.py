"""The first rows of a data file name a likely mistake (a ';'- or tab-separated .csv, a SMILES column with no
SMILES) and never refuse a file a run could use."""

from __future__ import annotations

import pytest

from kermt.data.sniff import SAMPLE_ROWS, check_separator, check_smiles_column, likely_smiles_column
from kermt.data.tables import load_molecule_table
from kermt.errors import UserError


@pytest.mark.parametrize("separator, name", [(";", "';'"), ("\t", "tab")])
def test_a_csv_saved_with_another_separator_says_which(tmp_path, separator, name):
    path = tmp_path / "sol.csv"
    path.write_text(f"smiles{separator}SOL\nCCO{separator}1.2\nCCC{separator}\n")
    with pytest.raises(UserError, match=rf"sol.csv: looks {name}-separated \(its header reads as the one column "
                       r"'smiles(;|\\t)SOL'\); a .csv is read comma-separated: save it with commas$"):
        load_molecule_table(path)


def test_a_one_column_file_is_refused_only_when_its_rows_hold_the_separator_too():
    check_separator("a.csv", ["smiles"], ["CCO", "CCC"])  # a SMILES-only file
    check_separator("a.csv", ["smiles;canonical"], ["CCO", "CCC"])  # an odd name, but its rows are one column
    check_separator("a.csv", ["smiles", "y;z"], ["CCO"])  # two columns: read as a CSV
    with pytest.raises(UserError, match="looks ';'-separated"):
        check_separator("a.csv", ["smiles;y"], ["CCO;1", "", "CCC;2"])  # an empty row says nothing


def test_a_smiles_column_that_is_not_first_is_named(tmp_path):
    path = tmp_path / "named.csv"
    path.write_text("name,smiles,y\nethanol,CCO,1\npropane,CCC,2\nbutane,CCCC,3\n")
    with pytest.raises(UserError, match=r"^\S+named.csv: the first column, 'name', is read as SMILES but holds no "
                       r"valid SMILES in its first 3 filled rows \(e.g. 'ethanol'\); did you mean `--smiles_column "
                       r"smiles`\?$"):
        load_molecule_table(path)
    assert load_molecule_table(path, smiles_column="smiles", target_columns=["y"]).smiles == ["CCO", "CCC", "CCCC"]
    with pytest.raises(UserError, match=r"column 'y' holds no valid SMILES .*`--smiles_column smiles`\?$"):
        load_molecule_table(path, smiles_column="y", target_columns=[])  # named, and wrong


def test_a_file_with_no_smiles_column_says_why_its_first_value_is_none():
    columns = {"id": ["A1", "A2"], "y": ["1", "2"]}
    with pytest.raises(UserError, match=r"^d.csv: the first column, 'id', is read as SMILES but holds no valid SMILES "
                       r"in its first 2 filled rows \(e.g. 'A1': unparsable: syntax error while parsing: A1; .*\); "
                       r"fix them, or name the SMILES column with --smiles_column$"):
        check_smiles_column("d.csv", columns, "id", named=False)


def test_a_column_with_one_valid_smiles_or_none_filled_is_never_refused():
    check_smiles_column("d.csv", {"smiles": ["", "not_a_smiles"] * 400 + ["CCO"]}, "smiles", named=False)
    check_smiles_column("d.csv", {"smiles": ["", None, float("nan")]}, "smiles", named=False)  # nothing to judge
    with pytest.raises(UserError, match=f"in its first {SAMPLE_ROWS} filled rows"):
        check_smiles_column("d.csv", {"smiles": ["xyz"] * (SAMPLE_ROWS + 5) + ["CCO"]}, "smiles", named=False)


def test_the_likely_smiles_column_parses_at_least_half_the_time():
    columns = {"name": ["ethanol", "C"], "smi": ["CCO", "c1ccccc1", "bad"], "n": [1.5, None, 2]}
    assert likely_smiles_column(columns, "name") == "smi"
    assert likely_smiles_column({"a": ["x", "y"], "b": ["C", "q", "r"]}, "a") is None  # 'b': 1 of 3
