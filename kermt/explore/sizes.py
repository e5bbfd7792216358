"""Batch sizes of `kermt explore` (``--init_size``, ``--acquire_size``): a share of the library or a count.

A size written with a decimal point is a share of the library and must lie strictly between 0 and 1 (``0.01``:
1 %); one without is a count of molecules (``100``). The distinction is the text's, not the number's: ``1.0`` is a
share of the whole library (refused, the count ``1`` is one molecule). A share becomes a count once the library's
size is known, rounded up so that a small share of a small library still scores a molecule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kermt.errors import UserError


@dataclass(frozen=True)
class BatchSize:
    """``share`` (0 < share < 1) or ``count`` (>= 1), as written after ``flag``."""

    flag: str
    text: str
    share: float | None = None
    count: int | None = None

    def molecules(self, library_size: int) -> int:
        """The molecules this size means in a library of ``library_size`` molecules."""
        if self.count is not None:
            return self.count
        assert self.share is not None
        return max(1, math.ceil(self.share * library_size - 1e-9))


def parse_size(text: str | int | float, flag: str) -> BatchSize:
    """``"0.01"`` -> a 1 % share, ``"100"`` -> 100 molecules; anything else is a one-line error naming ``flag``."""
    written = str(text).strip()
    try:
        value = float(written)
    except ValueError:
        raise UserError(f"{flag} {written!r} is not a size: write a share of the library with a decimal point "
                        "(0.01 for 1 %) or a count of molecules (100)") from None
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"{flag} {written}: a size must be above 0 (a share like 0.01, or a count like 100)")
    if any(mark in written for mark in ".eE"):
        if value >= 1:
            raise UserError(f"{flag} {written}: a share of the library must be below 1 (0.01 is 1 %); write a "
                            f"count without a decimal point ({int(value) if value.is_integer() else 100})")
        return BatchSize(flag, written, share=value)
    return BatchSize(flag, written, count=int(value))


def check_plan(init: BatchSize, acquire: BatchSize, iterations: int, library_size: int, scored: int = 0) -> None:
    """Every batch of the plan fits in the library: the first batch and ``iterations`` acquisitions together are at
    most its ``library_size`` molecules (rows) (``scored``: molecules already scored by an earlier run of the same
    exploration, which the next batches exclude). A one-line error before any work otherwise."""
    if library_size <= 0:
        raise UserError("the library has no molecule to explore")
    for size in (init, acquire):
        if size.count is not None and size.count > library_size:
            raise UserError(f"{size.flag} {size.text} is larger than the library ({library_size:,} "
                            "molecules); give a smaller count or a share (0.01 is 1 %)")
    planned = init.molecules(library_size) + iterations * acquire.molecules(library_size)
    if max(planned, scored) > library_size:
        raise UserError(f"{init.flag} {init.text} and {iterations} round(s) of {acquire.flag} {acquire.text} "
                        f"would score {planned:,} molecules, more than the library's {library_size:,}; lower "
                        "--iterations or the sizes")


__all__ = ["BatchSize", "check_plan", "parse_size"]
