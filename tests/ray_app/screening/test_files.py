"""ray_app.screening.files: the row estimate behind screening's progress lines, and the output writer's row groups,
on real files."""

from __future__ import annotations

import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ray_app.screening import files
from ray_app.screening.files import TableWriter, row_estimate


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


def _blocks(count: int, rows: int, width: int = 1) -> list[pa.Table]:
    rng = np.random.default_rng(0)
    return [pa.table({"smiles": pa.array(["C"] * rows), "score": rng.normal(size=rows),
                      "wide": pa.FixedSizeListArray.from_arrays(rng.random(rows * width, dtype=np.float32), width)})
            for _ in range(count)]


def _write(path, blocks: list[pa.Table]) -> list[int]:
    writer = TableWriter(path)
    for block in blocks:
        writer.write(block)
    writer.commit()
    assert pq.read_table(path).equals(pa.concat_tables(blocks).combine_chunks())  # every row, in order
    metadata = pq.ParquetFile(path).metadata
    return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]


def test_a_parquet_output_gathers_blocks_into_row_groups_bounded_by_rows_and_bytes(tmp_path, monkeypatch):
    # 200 prediction blocks of 1,024 rows: three full row groups and the rest, not 200 (a footer 50 times smaller)
    assert _write(tmp_path / "p.parquet", _blocks(200, 1_024)) == [65_536, 65_536, 65_536, 8_192]
    # wide rows (embeddings) reach the bytes bound first: a 16 KiB row, a 1 MiB bound, a row group per 64 rows
    monkeypatch.setattr(files, "ROW_GROUP_BYTES", 2**20)
    assert _write(tmp_path / "e.parquet", _blocks(10, 32, width=4_096)) == [64] * 5
    # a CSV output is written block by block, as before: the same rows
    writer = TableWriter(tmp_path / "p.csv")
    for block in _blocks(3, 5):
        writer.write(block.drop_columns(["wide"]))
    writer.commit()
    assert (tmp_path / "p.csv").read_text().count("\n") == 16
