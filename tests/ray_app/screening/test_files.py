"""ray_app.screening.files: the row estimate behind screening's progress lines, on real files."""

from __future__ import annotations

import gzip

import pyarrow as pa
import pyarrow.parquet as pq

from ray_app.screening.files import row_estimate


def test_row_estimate_counts_data_rows_where_that_is_cheap(tmp_path):
    csv = tmp_path / "lib.csv"
    csv.write_text("smiles,id\nCCO,a\nCCN,b\nc1ccccc1,c\n")
    smi_header, smi_plain = tmp_path / "h.smi", tmp_path / "p.smi"
    smi_header.write_text("smiles\tname\nCCO\ta\nCCN\tb\n")
    smi_plain.write_text("CCO a\nCCN b\nCCC c\nCCCC d\n")
    parquet = tmp_path / "lib.parquet"
    pq.write_table(pa.table({"smiles": ["C"] * 7}), parquet, row_group_size=3)
    packed = tmp_path / "lib.csv.gz"
    packed.write_bytes(gzip.compress(csv.read_bytes()))
    assert [row_estimate(str(p)) for p in (csv, smi_header, smi_plain, parquet, packed)] == [3, 2, 4, 7, None]
    assert row_estimate(str(tmp_path / "missing.parquet")) is None
