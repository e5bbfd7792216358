"""ray_app.screening.first_rows: the first rows of a screening input (every format) name a likely mistake before Ray
starts, and a file they cannot judge is left to the stream."""

from __future__ import annotations

import gzip

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kermt.errors import UserError
from ray_app.screening.files import InputTable
from ray_app.screening.first_rows import check_first_rows, first_rows


def test_first_rows_of_each_format_are_text_columns_where_smiles_can_be(tmp_path):
    csv = tmp_path / "lib.csv"
    csv.write_text('smiles,id\nCCO,a\n"CCN",b\nc1ccccc1\n')  # a short row: its missing cells are empty
    packed = tmp_path / "lib.csv.gz"
    packed.write_bytes(gzip.compress(csv.read_bytes()))
    smi = tmp_path / "lib.smi"
    smi.write_text("SMILES Name\nCCO ethanol\n\nCCN ethylamine\n")
    parquet = tmp_path / "lib.parquet"
    pq.write_table(pa.table({"smiles": ["CCO", "CCN", None], "y": [1.0, 2.0, 3.0]}), parquet, row_group_size=2)
    expected = {"smiles": ["CCO", "CCN", "c1ccccc1"], "id": ["a", "b", ""]}
    assert first_rows(InputTable.open(str(csv)), 5) == first_rows(InputTable.open(str(packed)), 5) == expected
    assert first_rows(InputTable.open(str(csv)), 1) == {"smiles": ["CCO"], "id": ["a"]}
    assert first_rows(InputTable.open(str(smi)), 5) == {"SMILES": ["CCO", "CCN"], "Name": ["ethanol", "ethylamine"]}
    assert first_rows(InputTable.open(str(parquet)), 5) == {"smiles": ["CCO", "CCN", None]}  # text columns only


def test_a_parquet_file_whose_first_column_is_a_name_points_at_its_smiles(tmp_path):
    parquet = tmp_path / "lib.parquet"
    pq.write_table(pa.table({"name": ["ethanol", "benzene"], "smiles": ["CCO", "c1ccccc1"], "y": [1, 2]}), parquet)
    with pytest.raises(UserError, match=r"lib.parquet: the first column, 'name', is read as SMILES but holds no "
                       r"valid SMILES in its first 2 filled rows \(e.g. 'ethanol'\); did you mean `--smiles_column "
                       r"smiles`\?$"):
        check_first_rows(InputTable.open(str(parquet)), None)
    check_first_rows(InputTable.open(str(parquet)), "smiles")
    check_first_rows(InputTable.open(str(parquet)), "nowhere")  # left to pick_columns, which names the columns


def test_a_file_its_first_rows_cannot_be_read_from_is_left_to_the_stream(tmp_path):
    """Not UTF-8 at row 900 (past the block the header is read from): no verdict here, though its first column
    holds no SMILES; the stream reports the file when it reads that row."""
    path = tmp_path / "lib.csv"
    path.write_bytes(b"name,smiles\n" + b"ethanol,CCO\n" * 900 + b"\xff,C\n")
    table = InputTable.open(str(path))
    assert table.columns == ("name", "smiles")
    check_first_rows(table, None)
    path.write_bytes(path.read_bytes()[:-5])  # without that row it is judged
    with pytest.raises(UserError, match="did you mean `--smiles_column smiles`"):
        check_first_rows(InputTable.open(str(path)), None)
