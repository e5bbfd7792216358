"""SMILES validation with a reason per row; never raises for bad input (docs/upstream-compatibility.md#invalid-smiles).

Upstream drops a row when its SMILES is '', does not parse, or has no heavy atoms. Here every row is kept and
classified, so callers can report invalid rows by row number and keep outputs aligned with the input.

A rejected SMILES carries RDKit's own message, e.g. "unparsable: extra open parentheses while parsing: CC(C; check
for mistakes around position 3" or "unparsable: Explicit valence for atom # 1 C, 5, is greater than permitted", so a
chemist can fix the row. RDKit writes those messages to its log only, so the log is routed through Python's
``logging`` (logger "rdkit", whose own handler prints to stderr as RDKit's C++ log did) and a filter keeps the lines
logged by the thread re-parsing a rejected row. Valid rows are parsed with this thread's log dropped
(:func:`quiet_rdkit`, thread by thread, so a service's threads cannot silence each other): a valid row costs nothing
more; a rejected one costs a second parse.

A molecule with more heavy atoms than ``max_heavy_atoms`` is rejected from the SMILES text and an unsanitised parse
alone: sanitising a 5,000-atom chain takes RDKit seconds, and featurising and predicting it much longer.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

from rdkit import Chem, rdBase

EMPTY = "empty"
UNPARSABLE = "unparsable"
NO_HEAVY_ATOMS = "no heavy atoms"
TOO_LARGE = "too large"
MAX_HEAVY_ATOMS_FLAG = "--max_heavy_atoms"

_CAPTURE = threading.local()
_TIMESTAMP = re.compile(r"^\[\d\d:\d\d:\d\d\] ")
_PARSE_ERROR = "SMILES Parse Error: "


@dataclass(frozen=True)
class InvalidSmiles:
    """One rejected input row: 0-based ``row`` in the input sequence, the text, and why."""

    row: int
    smiles: str
    reason: str

    def __str__(self) -> str:
        return f"row {self.row}: {self.reason}: {self.smiles!r}"


def parse_smiles(smiles: object, max_heavy_atoms: int | None = None) -> tuple[Chem.Mol | None, str | None]:
    """Parse one SMILES. Returns (mol, None) when usable, else (None, reason).

    Non-strings (None, NaN from a CSV reader) and whitespace-only text count as empty. ``max_heavy_atoms``: a
    molecule with more is rejected before RDKit sanitises it (None: no limit).
    """
    if not isinstance(smiles, str) or not smiles.strip():
        return None, EMPTY
    if max_heavy_atoms is not None:
        too_large = _too_large(smiles, max_heavy_atoms)
        if too_large is not None:
            return None, too_large
    with quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None, _why_unparsable(smiles)
    if mol.GetNumHeavyAtoms() == 0:
        return None, NO_HEAVY_ATOMS
    return mol, None


def reason_kind(reason: str) -> str:
    """The category of a reason (``EMPTY``, ``UNPARSABLE``, ``NO_HEAVY_ATOMS``, ``TOO_LARGE``, or a featuriser's),
    without RDKit's detail: what summaries count by."""
    return reason.partition(":")[0]


def too_large_reason(heavy_atoms: int, limit: int) -> str:
    return f"{TOO_LARGE}: {heavy_atoms} heavy atoms, more than {MAX_HEAVY_ATOMS_FLAG} {limit}"


def _too_large(smiles: str, limit: int) -> str | None:
    """The reason when ``smiles`` has more than ``limit`` heavy atoms, else None. Every heavy atom takes at least one
    character, so a SMILES no longer than the limit is within it without parsing (nearly every drug-like row); a
    longer one is counted on an unsanitised parse (milliseconds at 5,000 atoms)."""
    if len(smiles) <= limit:
        return None
    with quiet_rdkit():
        raw = Chem.MolFromSmiles(smiles, sanitize=False)
    if raw is None or raw.GetNumHeavyAtoms() <= limit:
        return None  # a syntax error is reported by the full parse, with RDKit's message
    return too_large_reason(raw.GetNumHeavyAtoms(), limit)


class _ThreadCapture(logging.Filter):
    """On RDKit's logger: a record logged while this thread captures goes to its list instead of stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        lines = getattr(_CAPTURE, "lines", None)
        if lines is None or record.thread != threading.get_ident():
            return True
        lines.append(_TIMESTAMP.sub("", record.getMessage()).strip())
        return False


@contextmanager
def quiet_rdkit() -> Iterator[None]:
    """RDKit's messages of this thread are dropped while the block runs. Not ``rdBase.BlockLogs``: that silences
    RDKit in the whole process, so a thread of a service featurising valid molecules would take the message from
    another thread that is re-parsing a rejected row for its reason (seen as a bare "unparsable")."""
    previous = getattr(_CAPTURE, "lines", None)
    _CAPTURE.lines = []
    try:
        yield
    finally:
        _CAPTURE.lines = previous


def _route_rdkit_log() -> None:
    rdBase.LogToPythonLogger()
    logging.getLogger("rdkit").addFilter(_ThreadCapture())


_route_rdkit_log()


def rdkit_messages(smiles: str) -> list[str]:
    """What RDKit logs while parsing ``smiles``, one message a line, without its echo of the SMILES, the caret
    line under it and the closing "Failed parsing SMILES" line."""
    previous, _CAPTURE.lines = getattr(_CAPTURE, "lines", None), []
    lines = _CAPTURE.lines
    try:
        Chem.MolFromSmiles(smiles)
    finally:
        _CAPTURE.lines = previous
    kept, skip = [], 0
    for line in lines:
        line = line.removeprefix(_PARSE_ERROR)
        if skip or line.startswith("Failed parsing SMILES"):
            skip = max(skip - 1, 0)
            continue
        kept.append(" ".join(line.rstrip(":").split()))
        if line.startswith("check for mistakes"):
            skip = 2  # RDKit's echo of (a window of) the SMILES and the caret line under it
    return kept


def _why_unparsable(smiles: str) -> str:
    """The reason a SMILES that ``MolFromSmiles`` rejected is unusable: ``UNPARSABLE`` with RDKit's messages (a
    syntax error, or the valence or aromaticity sanitisation rejected). Only called for rejected rows, so the
    second parse costs nothing on valid input."""
    messages = rdkit_messages(smiles)
    return f"{UNPARSABLE}: {'; '.join(messages)}" if messages else UNPARSABLE


def parse_many(smiles: Sequence[object], max_heavy_atoms: int | None = None
               ) -> tuple[list[Chem.Mol | None], list[InvalidSmiles]]:
    """Parse every row. Returns (mols with None at invalid rows, the invalid rows in input order)."""
    mols: list[Chem.Mol | None] = []
    invalid: list[InvalidSmiles] = []
    for row, text in enumerate(smiles):
        mol, reason = parse_smiles(text, max_heavy_atoms)
        mols.append(mol)
        if reason is not None:
            invalid.append(InvalidSmiles(row, str(text), reason))
    return mols, invalid


__all__ = ["EMPTY", "MAX_HEAVY_ATOMS_FLAG", "NO_HEAVY_ATOMS", "TOO_LARGE", "UNPARSABLE", "InvalidSmiles",
           "parse_many", "parse_smiles", "rdkit_messages", "reason_kind", "too_large_reason"]
