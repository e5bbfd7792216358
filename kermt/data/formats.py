"""Molecule input files as they are distributed: CSV (plain or compressed), Parquet, and SMILES files.

The format comes from the file name: ``.csv``, ``.smi`` or ``.cxsmiles``, each optionally compressed (``.gz``,
``.bz2``, ``.zst``), or ``.parquet`` / ``.pq``. Anything else is a :class:`~kermt.errors.UserError` naming the
file and the accepted formats (a wrong guess would read garbage).

SMILES files (``.smi``, ``.cxsmiles``): one molecule per line, the SMILES then a name, separated by a tab or by
spaces. With tabs, the first field is the SMILES and the second the name (further fields are ignored); with
spaces, the first token is the SMILES (plus a following CXSMILES extension block ``|...|``) and the rest of the
line is the name. The separator is the first line's (a tab anywhere in it: tabs). The first line is a header when
its first field contains "smi" in any case ("SMILES", "smiles", "CXSMILES", "smi"; text no valid SMILES can
contain); the header names the two columns, otherwise they are ``smiles`` and ``name``. Blank lines and lines
starting with ``#`` (never a SMILES) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kermt.errors import UserError

COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}
TEXT_KINDS: dict[str, Literal["csv", "smi"]] = {".csv": "csv", ".smi": "smi", ".cxsmiles": "smi"}
PARQUET_SUFFIXES = (".parquet", ".pq")
ACCEPTED = ".csv, .smi or .cxsmiles (each also as .gz, .bz2 or .zst), .parquet"
SMI_COLUMNS = ("smiles", "name")


@dataclass(frozen=True)
class InputFormat:
    """``kind``: how rows are read; ``compression``: pyarrow's codec name, or None."""

    kind: Literal["csv", "parquet", "smi"]
    compression: str | None = None


def input_format(path: str | Path) -> InputFormat:
    """The format of ``path`` (a local path or URI; a query string is ignored) from its name."""
    suffixes = [s.lower() for s in Path(str(path).split("?")[0]).suffixes]
    last = suffixes[-1] if suffixes else ""
    if last in PARQUET_SUFFIXES:
        return InputFormat("parquet")
    compression = COMPRESSIONS.get(last)
    base = suffixes[-2] if compression and len(suffixes) > 1 else last
    if base in TEXT_KINDS:
        return InputFormat(TEXT_KINDS[base], compression)
    raise UserError(f"{path}: unknown input format {''.join(suffixes[-2:]) or '(no extension)'!r}; "
                    f"accepted: {ACCEPTED}")


def row_place(path: str | Path, data_row: int) -> str:
    """How a message names data row ``data_row`` of ``path`` (0-based: the index files such as invalid_smiles.csv
    and splits.json keep). In a CSV it is the line an editor shows: the header is line 1, so data row i is line
    i + 2 (a quoted field spanning lines would shift it). A Parquet file has no lines and a SMILES file's blank and
    ``#`` lines are not rows, so there it is the data row counted from 0."""
    if input_format(path).kind == "csv":
        return f"line {data_row + 2}"
    return f"data row {data_row} (counted from 0)"


def is_smi_header(line: str) -> bool:
    fields = line.split("\t") if "\t" in line else line.split()
    return bool(fields) and "smi" in fields[0].lower()


@dataclass(frozen=True)
class SmiLayout:
    """How a SMILES file's lines split (from its first line): ``tabs`` or spaces, header or not, column names."""

    tabs: bool
    header: bool
    columns: tuple[str, str]

    @classmethod
    def from_first_line(cls, line: str) -> "SmiLayout":
        line = line.lstrip("\ufeff").rstrip("\r\n")
        tabs = "\t" in line
        if not is_smi_header(line):
            return cls(tabs, False, SMI_COLUMNS)
        names = [n.strip() for n in (line.split("\t") if tabs else line.split())]
        smiles_name = names[0]
        name = names[1] if len(names) > 1 and names[1] and names[1] != smiles_name else SMI_COLUMNS[1]
        return cls(tabs, True, (smiles_name, name))

    def split(self, line: str) -> tuple[str, str]:
        """One data line -> (SMILES, name); the name is '' when the line has none."""
        line = line.rstrip("\r\n")
        if self.tabs:
            fields = line.split("\t")
            return fields[0].strip(), fields[1].strip() if len(fields) > 1 else ""
        parts = line.strip().split(None, 1)
        if not parts:
            return "", ""
        smiles, rest = parts[0], parts[1] if len(parts) > 1 else ""
        if rest.startswith("|") and "|" in rest[1:]:  # CXSMILES: "SMILES |extension| name"
            end = rest.index("|", 1) + 1
            smiles, rest = f"{smiles} {rest[:end]}", rest[end:]
        return smiles, rest.strip()

    def parse(self, lines: Iterable[str]) -> tuple[list[str], list[str]]:
        """Data lines (no header) -> (SMILES, names); blank and ``#`` lines are skipped."""
        smiles, names = [], []
        for line in lines:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            s, n = self.split(line)
            smiles.append(s)
            names.append(n)
        return smiles, names


__all__ = ["ACCEPTED", "InputFormat", "SmiLayout", "input_format", "is_smi_header", "row_place"]
